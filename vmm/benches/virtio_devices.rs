//! Device-level benchmarks (no guest): the virtio-blk and virtio-net queue
//! processing code driven directly with chains built in guest memory, over
//! a real image file (page cache, no O_DIRECT) and a real TAP.
//!
//! Run: `cargo bench -p vmm --bench virtio_devices` (root: creates a TAP).
//! Prints: blk sequential write/read MB/s at 4 KiB and 64 KiB requests;
//! net frames/s guest->TAP (TX) and TAP->guest (RX).

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress};
use vmm::devices::virtio::block::disk::RawFile;
use vmm::devices::virtio::block::request::{self, BlockContext};
use vmm::devices::virtio::net::frames::{self, NetStats, RxState};
use vmm::devices::virtio::net::tap::Tap;
use vmm::devices::virtio::testing::TestQueue;
use vmm::vstate::memory::GuestMemoryMmap;

const FILE_SIZE: u64 = 256 << 20;
const BATCH: u16 = 64;

fn blk(req: u32, write: bool, path: &std::path::Path) -> f64 {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 16 << 20)]).unwrap();
    let mut disk = RawFile::open(path, false).unwrap();
    let ctx = BlockContext { id: [0; 20] };
    let mut tq = TestQueue::new(&mem, 0x1000, 256);
    let mut q = tq.queue();
    let data = 0x10_0000u64;
    let hdrs = 0x8_0000u64;
    mem.write_slice(
        &vec![0x5au8; (BATCH as usize) * req as usize],
        GuestAddress(data),
    )
    .unwrap();
    let sectors_per_req = u64::from(req) / 512;
    let total_reqs = FILE_SIZE / u64::from(req);
    let mut sector = 0u64;
    let t = Instant::now();
    let mut done = 0u64;
    while done < total_reqs {
        let n = (total_reqs - done).min(u64::from(BATCH)) as u16;
        for i in 0..n {
            let h = hdrs + u64::from(i) * 32;
            let mut hdr = [0u8; 16];
            hdr[0..4].copy_from_slice(&(if write { 1u32 } else { 0 }).to_le_bytes());
            hdr[8..16].copy_from_slice(&sector.to_le_bytes());
            mem.write_slice(&hdr, GuestAddress(h)).unwrap();
            let buf = data + u64::from(i) * u64::from(req);
            tq.add_chain(&[(h, 16, false), (buf, req, !write), (h + 16, 1, true)]);
            sector += sectors_per_req;
        }
        let out = request::process_queue(&mut q, &mem, &mut disk, &ctx);
        assert_eq!(out.used, u32::from(n));
        done += u64::from(n);
    }
    if write {
        // Count the FLUSH (fdatasync) in the write figure.
        vmm::devices::virtio::block::disk::DiskBackend::flush(&mut disk).unwrap();
    }
    FILE_SIZE as f64 / t.elapsed().as_secs_f64() / 1e6
}

fn tap_up(name: &str) -> Tap {
    let tap = Tap::open(name).expect("TAP (needs root)");
    // No IPv6 neighbour discovery noise on the bench interfaces.
    let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6"), "1");
    assert!(std::process::Command::new("ip")
        .args(["link", "set", name, "up"])
        .status()
        .unwrap()
        .success());
    tap
}

fn net_tx(frame_len: usize, secs: f64) -> f64 {
    let mut tap = tap_up("mvbench0");
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 16 << 20)]).unwrap();
    let mut tq = TestQueue::new(&mem, 0x1000, 256);
    let mut q = tq.queue();
    let mut f = vec![0u8; 12 + frame_len];
    f[12..18].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
    f[18..24].copy_from_slice(&[0x52, 0x54, 0, 0x12, 0x34, 0x56]);
    f[24..26].copy_from_slice(&[0x88, 0xb5]);
    for i in 0..u64::from(BATCH) {
        mem.write_slice(&f, GuestAddress(0x10_0000 + i * 0x1000))
            .unwrap();
    }
    let mut stats = NetStats::default();
    let mut buf = Vec::new();
    let t = Instant::now();
    while t.elapsed().as_secs_f64() < secs {
        for i in 0..u64::from(BATCH) {
            tq.add_chain(&[(0x10_0000 + i * 0x1000, f.len() as u32, false)]);
        }
        let out = frames::process_tx(&mut q, &mem, &mut tap, &mut buf, &mut stats);
        assert_eq!(out.used, u32::from(BATCH));
    }
    assert_eq!(stats.tx_dropped, 0);
    stats.tx_frames as f64 / t.elapsed().as_secs_f64()
}

/// Inject frames into the TAP from the host side (AF_PACKET), then time the
/// device moving them into guest buffers.
fn net_rx(frame_len: usize, rounds: u32) -> f64 {
    let mut tap = tap_up("mvbench1");
    let name = std::ffi::CString::new("mvbench1").unwrap();
    // SAFETY: NUL-terminated name.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) } as i32;
    // SAFETY: plain socket syscall.
    let s = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
    assert!(s >= 0);
    // SAFETY: zeroed sockaddr_ll is valid.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_ifindex = ifindex;
    let mut f = vec![0u8; frame_len];
    f[0..6].copy_from_slice(&[0x52, 0x54, 0, 0x12, 0x34, 0x56]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
    f[12..14].copy_from_slice(&[0x88, 0xb5]);
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 16 << 20)]).unwrap();
    let mut tq = TestQueue::new(&mem, 0x1000, 256);
    let mut q = tq.queue();
    let mut rx = RxState::default();
    let mut stats = NetStats::default();
    let mut busy = Duration::ZERO;
    let mut delivered = 0u64;
    let mut lost = 0u64;
    let mut outstanding = 0u64;
    const PER_ROUND: u32 = 256;
    for _ in 0..rounds {
        for i in 0..PER_ROUND {
            f[14..18].copy_from_slice(&i.to_le_bytes());
            // SAFETY: f is valid for its length; sll is a valid address.
            let w = unsafe {
                libc::sendto(
                    s,
                    f.as_ptr().cast(),
                    f.len(),
                    0,
                    &sll as *const _ as *const libc::sockaddr,
                    std::mem::size_of::<libc::sockaddr_ll>() as u32,
                )
            };
            assert_eq!(w as usize, f.len());
        }
        // Top the RX ring up to 256 buffers.
        while outstanding < 256 {
            tq.add_chain(&[(0x10_0000 + (outstanding % 256) * 0x800, 2048, true)]);
            outstanding += 1;
        }
        // sendto() queued the frames on the TAP synchronously: drain until empty.
        let t = Instant::now();
        while frames::process_rx(&mut q, &mem, &mut tap, &mut rx, &mut stats).used > 0 {}
        busy += t.elapsed();
        let got = stats.rx_frames - delivered;
        delivered = stats.rx_frames;
        outstanding -= got;
        assert_eq!(stats.rx_bad_chains, 0);
        lost += u64::from(PER_ROUND).saturating_sub(got);
    }
    // SAFETY: closing our socket.
    unsafe { libc::close(s) };
    let _ = tap.as_raw_fd();
    if lost > 0 {
        println!("  (host side: {lost} injected frames never reached the TAP queue)");
    }
    stats.rx_frames as f64 / busy.as_secs_f64()
}

fn main() {
    let path = std::env::temp_dir().join(format!("microvirt-bench-{}.img", std::process::id()));
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(FILE_SIZE).unwrap();
    drop(f);
    println!(
        "virtio-blk (device-level, raw file in {}, page cache):",
        std::env::temp_dir().display()
    );
    for req in [4096u32, 65536] {
        let w = blk(req, true, &path);
        let r = blk(req, false, &path);
        println!(
            "  {:>2} KiB requests: sequential write {w:8.0} MB/s, sequential read {r:8.0} MB/s",
            req / 1024
        );
    }
    let _ = std::fs::remove_file(&path);
    println!("virtio-net (device-level, real TAP):");
    for len in [60usize, 1514] {
        let tx = net_tx(len, 2.0);
        let rx = net_rx(len, 100);
        println!(
            "  {len:>4}-byte frames: guest->TAP {tx:9.0} frames/s, TAP->guest {rx:9.0} frames/s"
        );
    }
}
