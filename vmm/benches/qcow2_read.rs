//! qcow2 base vs raw base, through the disk backends (no guest, page cache warm, no O_DIRECT):
//! sequential 1 MiB reads of the whole disk and 4 KiB reads at random sector-aligned offsets,
//! into a buffer in (host) memory, as the I/O thread does into guest memory.
//!
//! Run: `cargo bench -p vmm --bench qcow2_read` (needs Debian's qemu-utils for `qemu-img`).
//! Prints MiB/s (best of 3) for raw, qcow2 and qcow2 with zlib-compressed clusters (`-c`), 64 KiB
//! clusters.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use vmm::devices::virtio::block::disk::{read_into, DiskBackend};
use vmm::devices::virtio::block::open::open_disk;

/// 256 MiB: the host's own programs and libraries (`/usr/bin`, `/usr/lib`: data that compresses
/// about as a system disk does), with every fourth 256 KiB stripe a hole, as a file system
/// leaves free space.
const SIZE: usize = 256 << 20;
const RANDOM_READS: usize = 20_000;
const RUNS: usize = 3;

fn fill_from(dir: &Path, v: &mut Vec<u8>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if v.len() >= SIZE {
            return;
        }
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if m.is_dir() {
            fill_from(&p, v);
        } else if m.is_file() {
            if let Ok(b) = std::fs::read(&p) {
                v.extend_from_slice(&b[..b.len().min(SIZE - v.len())]);
            }
        }
    }
}

fn image(dir: &Path) -> PathBuf {
    let mut v = Vec::with_capacity(SIZE);
    fill_from(Path::new("/usr/bin"), &mut v);
    fill_from(Path::new("/usr/lib"), &mut v);
    v.resize(SIZE, 0);
    for (i, c) in v.chunks_mut(256 << 10).enumerate() {
        if i % 4 == 3 {
            c.fill(0);
        }
    }
    let p = dir.join("bench.raw");
    std::fs::write(&p, &v).unwrap();
    p
}

fn convert(raw: &Path, out: &Path, compressed: bool) {
    let mut c = Command::new("qemu-img");
    c.args(["convert", "-q", "-f", "raw", "-O", "qcow2"]);
    if compressed {
        c.arg("-c");
    }
    let st = c
        .arg(raw)
        .arg(out)
        .status()
        .expect("qemu-img (apt-get install qemu-utils)");
    assert!(st.success());
}

fn sequential(d: &mut dyn DiskBackend) -> f64 {
    let mut buf = vec![0u8; 1 << 20];
    let t = Instant::now();
    let mut off = 0;
    while off < d.capacity() {
        read_into(d, off, &mut buf).unwrap();
        off += buf.len() as u64;
    }
    d.capacity() as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64()
}

fn random(d: &mut dyn DiskBackend) -> f64 {
    let mut buf = vec![0u8; 4096];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let pages = d.capacity() / 4096;
    let t = Instant::now();
    for _ in 0..RANDOM_READS {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        read_into(d, (x % pages) * 4096, &mut buf).unwrap();
    }
    (RANDOM_READS * 4096) as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64()
}

fn main() {
    let dir = std::env::temp_dir().join(format!("microvirt-qcow2-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let raw = image(&dir);
    let plain = dir.join("plain.qcow2");
    let zlib = dir.join("zlib.qcow2");
    convert(&raw, &plain, false);
    convert(&raw, &zlib, true);
    println!(
        "qcow2_read: {} MiB disk, 64 KiB clusters, page cache warm",
        SIZE >> 20
    );
    for (name, p) in [("raw", &raw), ("qcow2", &plain), ("qcow2 -c (zlib)", &zlib)] {
        let mut d = open_disk(p, true).unwrap();
        let file = std::fs::metadata(p).unwrap().len() >> 20;
        sequential(d.as_mut()); // warm the page cache
                                // Best of RUNS (the machine is shared).
        let seq = (0..RUNS)
            .map(|_| sequential(d.as_mut()))
            .fold(0.0, f64::max);
        let rnd = (0..RUNS).map(|_| random(d.as_mut())).fold(0.0, f64::max);
        println!(
            "{name:>16}: file {file:>4} MiB  sequential 1 MiB {seq:>8.0} MiB/s  random 4 KiB {rnd:>7.0} MiB/s"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
