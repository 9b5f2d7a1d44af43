//! Images made by `qemu-img` (Debian qemu-utils) read byte-identically to their raw source;
//! damaged and unsupported images are refused or fail their reads, without a panic.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::header::MAGIC;
use super::table::Mapping;
use super::*;
use crate::devices::virtio::block::disk::read_into;
use crate::devices::virtio::block::open::open_disk;
use crate::devices::virtio::test_utils::{qemu_img, TempDir};

/// 9 MiB + 3 sectors: random data, compressible runs and holes (zeroes), in 20 KiB pieces that
/// straddle cluster boundaries of every size.
fn source_data() -> Vec<u8> {
    let len = (9 << 20) + 3 * 512;
    let mut v = vec![0u8; len];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for (i, chunk) in v.chunks_mut(20 * 1024).enumerate() {
        match i % 5 {
            0 | 3 => {
                for b in chunk.iter_mut() {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    *b = x as u8;
                }
            }
            1 => {
                for (j, b) in chunk.iter_mut().enumerate() {
                    *b = (j / 64 + i) as u8;
                }
            }
            _ => {} // a hole
        }
    }
    // A long hole: whole 2 MiB clusters unallocated.
    v[(4 << 20)..(8 << 20)].fill(0);
    v
}

fn path(d: &TempDir, name: &str) -> PathBuf {
    d.join(name)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `raw` converted to qcow2 with `opts` (`compat`, `cluster_size`, ...), compressed if `c`.
fn convert(d: &TempDir, raw: &Path, name: &str, opts: &str, c: bool) -> PathBuf {
    let out = path(d, name);
    let mut args = vec!["convert", "-q", "-f", "raw", "-O", "qcow2", "-o", opts];
    if c {
        args.push("-c");
    }
    args.extend([s(raw), s(&out)]);
    qemu_img(&args);
    out
}

fn open(p: &Path) -> Result<Qcow2, DiskError> {
    Qcow2::from_file(std::fs::File::open(p).unwrap(), p)
}

fn read(q: &mut Qcow2, off: u64, len: usize) -> Result<Vec<u8>, DiskError> {
    let mut v = vec![0u8; len];
    read_into(q, off, &mut v).map(|()| v)
}

fn raw_source(d: &TempDir) -> (PathBuf, Vec<u8>) {
    let data = source_data();
    let raw = path(d, "src.raw");
    std::fs::write(&raw, &data).unwrap();
    (raw, data)
}

/// Every combination of version, compression and cluster size reads as the raw source, in
/// reads of uneven sizes at uneven (sector) offsets, and whole.
#[test]
fn qemu_img_images_read_byte_identically() {
    let d = TempDir::new("qcow2-identical");
    let (raw, data) = raw_source(&d);
    for compat in ["0.10", "1.1"] {
        for cluster in [4096u64, 65536, 2 << 20] {
            for c in [false, true] {
                let name = format!("c{compat}-{cluster}-{c}.qcow2");
                let opts = format!("compat={compat},cluster_size={cluster}");
                let img = convert(&d, &raw, &name, &opts, c);
                let mut q = open(&img).unwrap();
                assert_eq!(q.capacity(), data.len() as u64, "{name}");
                assert_eq!(q.header().version, if compat == "0.10" { 2 } else { 3 });
                assert_eq!(q.header().cluster_size(), cluster);
                // Compressed images hold compressed clusters (the reader inflates them).
                let clusters = data.len() as u64 / cluster;
                let compressed = (0..clusters)
                    .filter(|&k| {
                        matches!(q.tables.lookup(&q.file, k), Ok(Mapping::Compressed { .. }))
                    })
                    .count();
                assert_eq!(
                    compressed > 0,
                    c,
                    "{name}: {compressed} compressed clusters"
                );
                assert_eq!(read(&mut q, 0, data.len()).unwrap(), data, "{name} whole");
                let mut off = 0usize;
                let mut step = 1usize;
                while off < data.len() {
                    let len = (step * 512 % (300 * 1024) + 512).min(data.len() - off);
                    let got = read(&mut q, off as u64, len).unwrap();
                    assert!(got == data[off..off + len], "{name} at {off:#x}+{len:#x}");
                    off += len;
                    step = (step * 7 + 3) % 1009;
                }
                // Random 4 KiB reads, backwards.
                for k in (0..data.len() / 4096).rev().step_by(37) {
                    let got = read(&mut q, (k * 4096) as u64, 4096).unwrap();
                    assert!(got == data[k * 4096..(k + 1) * 4096], "{name} page {k}");
                }
                assert!(matches!(
                    read(&mut q, data.len() as u64 - 512, 1024),
                    Err(DiskError::OutOfRange { .. })
                ));
                let _ = std::fs::remove_file(&img);
            }
        }
    }
}

/// A read-only qcow2 disk opens as qcow2 by its magic (whatever its name); a raw file stays
/// raw; a writable qcow2 disk without an overlay is refused.
#[test]
fn the_format_comes_from_the_magic_number() {
    let d = TempDir::new("qcow2-magic");
    let (raw, data) = raw_source(&d);
    let img = convert(&d, &raw, "disk.raw", "compat=1.1", true);
    let mut disk = open_disk(&img, true).unwrap();
    assert_eq!(disk.capacity(), data.len() as u64);
    assert!(disk.read_only());
    let mut v = vec![0u8; 65536];
    read_into(disk.as_mut(), 1 << 20, &mut v).unwrap();
    assert!(v == data[1 << 20..(1 << 20) + 65536]);
    drop(disk);
    let e = open_disk(&img, false).err().expect("refused").to_string();
    assert!(e.contains("qcow2: a qcow2 image is only read"), "{e}");
    // The raw file named .qcow2 is raw.
    let named = path(&d, "named.qcow2");
    std::fs::copy(&raw, &named).unwrap();
    let mut disk = open_disk(&named, true).unwrap();
    assert_eq!(disk.capacity(), data.len() as u64);
    read_into(disk.as_mut(), 0, &mut v).unwrap();
    assert!(v == data[..65536]);
}

fn refused(p: &Path) -> String {
    match open(p) {
        Err(e @ DiskError::Qcow2 { .. }) => {
            let m = e.to_string();
            assert!(!m.contains('\n'), "one line: {m}");
            m
        }
        Err(e) => panic!("other error: {e}"),
        Ok(q) => panic!("accepted: {q:?}"),
    }
}

#[test]
fn backing_files_and_zstd_are_refused_with_what_to_do() {
    let d = TempDir::new("qcow2-refused");
    let base = path(&d, "base.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", s(&base), "1M"]);
    let top = path(&d, "top.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-b",
        s(&base),
        "-F",
        "qcow2",
        s(&top),
    ]);
    let e = refused(&top);
    assert!(
        e.contains(&format!(
            "backing file '{}' is not supported",
            base.display()
        )) && e.contains("qemu-img convert"),
        "{e}"
    );
    let (raw, _) = raw_source(&d);
    let z = convert(
        &d,
        &raw,
        "z.qcow2",
        "compat=1.1,compression_type=zstd",
        true,
    );
    let e = refused(&z);
    assert!(
        e.contains("zstd") && e.contains("qemu-img convert -O qcow2 -c -o compression_type=zlib"),
        "{e}"
    );
}

/// A small valid image to damage: version 3, 64 KiB clusters, one compressed cluster at
/// least.
fn sample(d: &TempDir, c: bool) -> (PathBuf, Vec<u8>) {
    let (raw, data) = raw_source(d);
    let img = convert(d, &raw, &format!("sample-{c}.qcow2"), "compat=1.1", c);
    (img, data)
}

fn patch(p: &Path, off: u64, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
    f.write_all_at(bytes, off).unwrap();
}

fn be64_at(p: &Path, off: u64) -> u64 {
    let mut b = [0u8; 8];
    std::fs::File::open(p)
        .unwrap()
        .read_exact_at(&mut b, off)
        .unwrap();
    u64::from_be_bytes(b)
}

#[test]
fn damaged_headers_are_refused() {
    let d = TempDir::new("qcow2-headers");
    let (img, _) = sample(&d, false);
    let good = std::fs::read(&img).unwrap();
    let case = |what: &str, f: &dyn Fn(&Path), want: &str| {
        std::fs::write(&img, &good).unwrap();
        f(&img);
        let e = refused(&img);
        assert!(e.contains(want), "{what}: {e}");
    };
    let trunc = |n: u64| {
        move |p: &Path| {
            std::fs::File::options()
                .write(true)
                .open(p)
                .unwrap()
                .set_len(n)
                .unwrap()
        }
    };
    case("truncated header", &trunc(50), "too short for a header");
    case(
        "truncated v3 header",
        &trunc(80),
        "too short for a version 3 header",
    );
    let l1 = be64_at(&img, 40);
    case("truncated L1", &trunc(l1 + 4), "beyond the end of the file");
    case(
        "version",
        &|p| patch(p, 4, &7u32.to_be_bytes()),
        "version 7",
    );
    case(
        "cluster_bits 8",
        &|p| patch(p, 20, &8u32.to_be_bytes()),
        "cluster_bits 8 is out of range",
    );
    case(
        "cluster_bits 31",
        &|p| patch(p, 20, &31u32.to_be_bytes()),
        "cluster_bits 31",
    );
    case(
        "cluster_bits huge",
        &|p| patch(p, 20, &u32::MAX.to_be_bytes()),
        "out of range",
    );
    case(
        "unaligned L1",
        &|p| patch(p, 40, &(l1 + 8).to_be_bytes()),
        "L1 table offset",
    );
    case(
        "L1 at 0",
        &|p| patch(p, 40, &0u64.to_be_bytes()),
        "L1 table offset",
    );
    case(
        "L1 beyond EOF",
        &|p| patch(p, 40, &(1u64 << 40).to_be_bytes()),
        "beyond the end",
    );
    case(
        "L1 at the top",
        &|p| patch(p, 40, &(u64::MAX << 16).to_be_bytes()),
        "beyond the end",
    );
    case(
        "L1 size huge",
        &|p| patch(p, 36, &u32::MAX.to_be_bytes()),
        "larger than",
    );
    case(
        "L1 too small",
        &|p| patch(p, 36, &0u32.to_be_bytes()),
        "too small",
    );
    case(
        "virtual size huge",
        &|p| patch(p, 24, &u64::MAX.to_be_bytes()),
        "virtual size",
    );
    case(
        "encrypted",
        &|p| patch(p, 32, &2u32.to_be_bytes()),
        "encrypted",
    );
    case(
        "corrupt bit",
        &|p| patch(p, 72, &2u64.to_be_bytes()),
        "marked corrupt",
    );
    case(
        "data file",
        &|p| patch(p, 72, &4u64.to_be_bytes()),
        "external data file",
    );
    case(
        "extended L2",
        &|p| patch(p, 72, &16u64.to_be_bytes()),
        "extended L2",
    );
    case(
        "unknown bits",
        &|p| patch(p, 72, &((1u64 << 40) | (1 << 9)).to_be_bytes()),
        "bit(s) 9, 40",
    );
    case(
        "header length",
        &|p| patch(p, 100, &20u32.to_be_bytes()),
        "header length 20",
    );
    case(
        "compression type",
        &|p| {
            patch(p, 72, &8u64.to_be_bytes());
            patch(p, 104, &[7]);
        },
        "unknown compression type 7",
    );
    case(
        "backing name outside",
        &|p| {
            patch(p, 8, &(1u64 << 50).to_be_bytes());
            patch(p, 16, &10u32.to_be_bytes());
        },
        "backing file (name outside the file) is not supported",
    );
    // The dirty bit only concerns refcounts, which are not read.
    std::fs::write(&img, &good).unwrap();
    patch(&img, 72, &1u64.to_be_bytes());
    assert!(open(&img).is_ok());
    // Not the magic.
    std::fs::write(&img, &good).unwrap();
    patch(&img, 0, b"QFI\0");
    assert!(refused(&img).contains("bad magic"));
    assert_eq!(&good[..4], &MAGIC);
}

/// The L2 entry (file offset) of guest cluster 0..: L1 entry 0's table.
fn l2_entry_off(p: &Path, cluster: u64) -> u64 {
    let l1 = be64_at(p, 40);
    let l2 = be64_at(p, l1) & 0x00ff_ffff_ffff_fe00;
    assert_ne!(l2, 0);
    l2 + 8 * cluster
}

/// Damage inside the tables or clusters fails the reads that meet it, with a reason; other
/// reads still work.
#[test]
fn damaged_tables_and_clusters_fail_their_reads() {
    let d = TempDir::new("qcow2-damaged");
    for c in [false, true] {
        let (img, data) = sample(&d, c);
        let good = std::fs::read(&img).unwrap();
        let len = good.len() as u64;
        let reset = || std::fs::write(&img, &good).unwrap();
        let bad_read = |what: &str, off: u64, want: &str| {
            let mut q = open(&img).unwrap();
            let e = read(&mut q, off, 65536).unwrap_err().to_string();
            assert!(e.contains(want), "{c} {what}: {e}");
            // The damage is local: a cluster elsewhere still reads (cluster 130 is untouched).
            let ok = read(&mut q, 130 * 65536, 4096).unwrap();
            assert!(ok == data[130 * 65536..130 * 65536 + 4096], "{what}");
        };
        let e0 = l2_entry_off(&img, 0);
        // L1 entry 0 unaligned / beyond the end.
        let l1 = be64_at(&img, 40);
        reset();
        patch(&img, l1, &(be64_at(&img, l1) + 512).to_be_bytes());
        let mut q = open(&img).unwrap();
        let e = read(&mut q, 0, 4096).unwrap_err().to_string();
        assert!(e.contains("not cluster-aligned"), "{e}");
        reset();
        patch(&img, l1, &((1u64 << 40) | (1 << 63)).to_be_bytes());
        let mut q = open(&img).unwrap();
        let e = read(&mut q, 0, 4096).unwrap_err().to_string();
        assert!(e.contains("beyond the end of the file"), "{e}");
        // A data cluster beyond the end, unaligned.
        reset();
        patch(&img, e0, &((1u64 << 63) | (1 << 45)).to_be_bytes());
        bad_read("data beyond EOF", 0, "beyond the end of the file");
        reset();
        patch(&img, e0, &((1u64 << 63) | 0x10200).to_be_bytes());
        bad_read("unaligned data", 0, "not cluster-aligned");
        // A compressed cluster beyond the end of the file.
        reset();
        patch(&img, e0, &((1u64 << 62) | (len + 4096)).to_be_bytes());
        bad_read("compressed beyond EOF", 0, "beyond the end of the file");
        // A compressed cluster pointing at data that is not deflate (the header), or at the last
        // bytes of the file (short input).
        reset();
        patch(&img, e0, &((1u64 << 62) | (3 << 54) | 16).to_be_bytes());
        bad_read("garbage compressed", 0, "does not inflate");
        reset();
        patch(
            &img,
            e0,
            &((1u64 << 62) | (255 << 54) | (len - 100)).to_be_bytes(),
        );
        bad_read("short compressed", 0, "does not inflate");
        // A truncated file: clusters past the end fail; those before it read.
        reset();
        std::fs::File::options()
            .write(true)
            .open(&img)
            .unwrap()
            .set_len(len / 2)
            .unwrap();
        let mut q = open(&img).unwrap();
        let mut failed = 0;
        for k in 0..data.len() as u64 / 65536 {
            match read(&mut q, k * 65536, 65536) {
                Ok(v) => {
                    // Bytes past the end read as zero only inside a cluster that starts before it.
                    let want = &data[(k * 65536) as usize..((k + 1) * 65536) as usize];
                    if v != want {
                        assert!(
                            v.iter().zip(want).all(|(a, b)| a == b || *a == 0),
                            "cluster {k}"
                        );
                    }
                }
                Err(e) => {
                    assert!(matches!(e, DiskError::Qcow2 { .. }), "{e}");
                    failed += 1;
                }
            }
        }
        assert!(failed > 0, "{c}: truncation noticed");
    }
}

/// Through the virtio-blk device (its I/O thread and request code): a qcow2 base under an
/// overlay reads as the raw source and takes writes into the overlay, the base unchanged; a
/// read of a damaged cluster completes with IOERR and the next request works.
#[test]
fn a_qcow2_base_under_an_overlay_through_the_device() {
    use crate::devices::interrupt::IrqLine;
    use crate::devices::virtio::block::request::{
        VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
    };
    use crate::devices::virtio::block::{BlockConfig, BlockDevice, IoThreadOptions};
    use crate::devices::virtio::test_utils::{mem, TestQueue};
    use crate::devices::virtio::VirtioDevice;
    use vm_memory::{Bytes, GuestAddress};

    let d = TempDir::new("qcow2-device");
    let (img, data) = sample(&d, true);
    let before = std::fs::read(&img).unwrap();
    let ovl = path(&d, "vm.ovl");
    let cfg: BlockConfig = format!("path={},overlay={}", s(&img), s(&ovl))
        .parse()
        .unwrap();
    let m = mem();
    let mut dev =
        BlockDevice::from_config(&cfg, IrqLine::new(5).unwrap(), IoThreadOptions::default())
            .unwrap();
    let mut cap = [0u8; 8];
    dev.read_config(0, &mut cap);
    assert_eq!(u64::from_le_bytes(cap), data.len() as u64 / 512);
    let mut tq = TestQueue::new(&m, 0x1000, 16);
    dev.set_acked_features(1 << crate::devices::virtio::VIRTIO_F_VERSION_1);
    dev.activate(m.clone(), vec![tq.queue()]).unwrap();
    // One request at a time: header at 0x10000, data at 0x100000 (1 MiB), status at 0x30000.
    let mut request = |ty: u32, sector: u64, len: u32| -> u8 {
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&ty.to_le_bytes());
        h[8..16].copy_from_slice(&sector.to_le_bytes());
        m.write_slice(&h, GuestAddress(0x10000)).unwrap();
        m.write_obj(0xeeu8, GuestAddress(0x30000)).unwrap();
        let used = tq.used_idx();
        tq.add_chain(&[
            (0x10000, 16, false),
            (0x10_0000, len, ty == VIRTIO_BLK_T_IN),
            (0x30000, 1, true),
        ]);
        dev.process_queue();
        let t = std::time::Instant::now();
        while tq.used_idx() == used {
            assert!(t.elapsed().as_secs() < 10, "request not completed");
            std::thread::sleep(std::time::Duration::from_millis(1));
            dev.process_completions();
        }
        m.read_obj(GuestAddress(0x30000)).unwrap()
    };
    let guest = |len: usize| {
        let mut v = vec![0u8; len];
        m.read_slice(&mut v, GuestAddress(0x10_0000)).unwrap();
        v
    };
    // The whole disk in 1 MiB reads (the last one shorter).
    for off in (0..data.len()).step_by(1 << 20) {
        let len = (1 << 20).min(data.len() - off);
        assert_eq!(
            request(VIRTIO_BLK_T_IN, off as u64 / 512, len as u32),
            VIRTIO_BLK_S_OK
        );
        assert!(guest(len) == data[off..off + len], "at {off:#x}");
    }
    // Writes go to the overlay.
    m.write_slice(&[0x5au8; 8192], GuestAddress(0x10_0000))
        .unwrap();
    assert_eq!(request(VIRTIO_BLK_T_OUT, 7, 8192), VIRTIO_BLK_S_OK);
    assert_eq!(request(VIRTIO_BLK_T_IN, 0, 16384), VIRTIO_BLK_S_OK);
    let got = guest(16384);
    assert!(got[..3584] == data[..3584]);
    assert!(got[3584..3584 + 8192].iter().all(|&b| b == 0x5a));
    assert!(got[3584 + 8192..] == data[3584 + 8192..16384]);
    drop(dev);
    assert!(std::fs::read(&img).unwrap() == before, "base modified");

    // A read-only qcow2 disk whose cluster 3 is damaged: IOERR for that read only.
    let e3 = l2_entry_off(&img, 3);
    patch(&img, e3, &((1u64 << 62) | (3 << 54) | 16).to_be_bytes());
    let cfg: BlockConfig = format!("path={},ro", s(&img)).parse().unwrap();
    let mut dev =
        BlockDevice::from_config(&cfg, IrqLine::new(6).unwrap(), IoThreadOptions::default())
            .unwrap();
    let mut tq = TestQueue::new(&m, 0x1000, 16);
    dev.set_acked_features(1 << crate::devices::virtio::VIRTIO_F_VERSION_1);
    dev.activate(m.clone(), vec![tq.queue()]).unwrap();
    let mut request = |sector: u64, len: u32| -> u8 {
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&VIRTIO_BLK_T_IN.to_le_bytes());
        h[8..16].copy_from_slice(&sector.to_le_bytes());
        m.write_slice(&h, GuestAddress(0x10000)).unwrap();
        let used = tq.used_idx();
        tq.add_chain(&[
            (0x10000, 16, false),
            (0x10_0000, len, true),
            (0x30000, 1, true),
        ]);
        dev.process_queue();
        let t = std::time::Instant::now();
        while tq.used_idx() == used {
            assert!(t.elapsed().as_secs() < 10, "request not completed");
            std::thread::sleep(std::time::Duration::from_millis(1));
            dev.process_completions();
        }
        m.read_obj(GuestAddress(0x30000)).unwrap()
    };
    assert_eq!(request(3 * 128, 4096), VIRTIO_BLK_S_IOERR);
    assert_eq!(request(0, 65536), VIRTIO_BLK_S_OK);
    assert!(guest(65536) == data[..65536]);
    assert!(!dev.is_broken());
}

/// Version 3 zero clusters (`qemu-io write -z`) read as zeroes, with or without a host cluster
/// behind them; in version 2 the flag does not exist and is an error.
#[test]
fn zero_clusters_read_as_zeroes() {
    let d = TempDir::new("qcow2-zero");
    let img = path(&d, "z.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-o",
        "compat=1.1",
        s(&img),
        "1M",
    ]);
    let io = |cmd: &str| {
        let out = std::process::Command::new("qemu-io")
            .args(["-f", "qcow2", "-c", cmd])
            .arg(&img)
            .output()
            .expect("qemu-io (Debian qemu-utils)");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    io("write -P 0xaa 0 256k");
    io("write -z 64k 64k");
    io("write -z -u 128k 64k");
    let mut q = open(&img).unwrap();
    let v = read(&mut q, 0, 1 << 20).unwrap();
    assert!(v[..64 << 10].iter().all(|&b| b == 0xaa));
    assert!(v[64 << 10..192 << 10].iter().all(|&b| b == 0));
    assert!(v[192 << 10..256 << 10].iter().all(|&b| b == 0xaa));
    assert!(v[256 << 10..].iter().all(|&b| b == 0));
    // The same entry in a version 2 image is damage.
    patch(&img, 4, &2u32.to_be_bytes());
    let mut q = open(&img).unwrap();
    assert!(read(&mut q, 0, 4096).is_ok());
    let e = read(&mut q, 64 << 10, 4096).unwrap_err().to_string();
    assert!(e.contains("zero flag, which version 2"), "{e}");
}
