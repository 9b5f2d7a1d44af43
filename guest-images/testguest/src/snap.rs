//! Scenarios for snapshot/restore tests: state that lives only in guest memory and vCPU
//! registers, so a restored VM shows whether it continued or started over.
//!
//! * `counter`: every CPU counts (the BSP in Rust, the APs in the trampoline's loop, see
//!   [`crate::boot::CPU_COUNTERS`]); the BSP prints `counter: seq=<n> cpu0=<c0> cpu1=<c1> ...`
//!   every `testguest.counter_every` (default 2000) of its own increments. First it prints
//!   `counter: addr=<address of the counters> cpus=<n>`. With `testguest.touch_mib=N` it first
//!   writes one word into every 4 KiB page of N MiB from 16 MiB (`touch: N MiB`), so the guest
//!   has a known working set; with `testguest.reread=1` as well, every line ends with
//!   ` mem=<hex sum of those words>` read back from memory.
//! * `stream`: requests numbered 0..K-1 (`testguest.stream_count`, default 300) on the first
//!   virtio-blk and the first virtio-net device (either may be absent): request i writes sector
//!   i with a pattern, then sends `microvirt req <i> <try>` and waits up to 300 ms for
//!   `microvirt ack <i> <try'>` (any try), resending with the next try number otherwise. Each
//!   completed block request must have moved the used ring by exactly one (a request may take
//!   `testguest.blk_timeout_ms`, default 2000, before it counts as failed). Prints `stream: <i>`
//!   every 10 requests and at the end reads every sector back and prints
//!   `stream: done K blk=ok|none|MISMATCH@<i>|ERR@<i> net=ok|none|FAIL@<i> resent=<n>
//!   dup_rx=<n> stale_rx=<n>` (dup_rx: an ack with the same numbers seen twice; stale_rx: an
//!   ack for an earlier request), then resets.

use core::sync::atomic::Ordering;

use crate::blk::{self, Blk, Done};
use crate::boot::{AP_COUNT, CPU_COUNTERS};
use crate::bootinfo::BootInfo;
use crate::net::{self, Net};
use crate::parse::{parse_num, two_numbers};
use crate::smp::tsc_per_ms;
use crate::virtio::{self, read64, write64, Buf, DmaArena, Mmio, DEVICE_BLK, DEVICE_NET};
use crate::{print, println};

const TOUCH_BASE: u64 = 16 << 20;
const ACK_WAIT_MS: u64 = 300;
const MAX_TRIES: u64 = 50;

fn param(bi: &BootInfo, key: &str, default: u64) -> u64 {
    bi.param(key).and_then(parse_num).unwrap_or(default)
}

/// Writes one non-zero word (its own address | 1) per page of `testguest.touch_mib` MiB;
/// returns the bytes touched.
fn touch(bi: &BootInfo) -> u64 {
    let mib = param(bi, "testguest.touch_mib", 0);
    if mib == 0 {
        return 0;
    }
    let len = mib << 20;
    if !bi.in_ram(TOUCH_BASE, len) || TOUCH_BASE + len > crate::io::MAPPED_END {
        println!("touch: {} MiB does not fit in RAM", mib);
        return 0;
    }
    let mut a = TOUCH_BASE;
    while a < TOUCH_BASE + len {
        // SAFETY: [TOUCH_BASE, +len) is RAM inside the identity map (checked above) that
        // nothing else of the guest uses.
        unsafe { core::ptr::write_volatile(a as usize as *mut u64, a | 1) };
        a += 4096;
    }
    println!("touch: {} MiB", mib);
    len
}

/// Sum of the words [`touch`] wrote, read back from memory.
fn touched_sum(len: u64) -> u64 {
    let mut sum = 0u64;
    let mut a = TOUCH_BASE;
    while a < TOUCH_BASE + len {
        // SAFETY: the range [`touch`] checked and wrote.
        sum = sum.wrapping_add(unsafe { core::ptr::read_volatile(a as usize as *const u64) });
        a += 4096;
    }
    sum
}

pub fn counter(bi: &BootInfo) -> ! {
    let touched = touch(bi);
    let reread = touched > 0 && param(bi, "testguest.reread", 0) == 1;
    let cpus = (1 + AP_COUNT.load(Ordering::Acquire) as usize).min(CPU_COUNTERS.len());
    println!(
        "counter: addr={:#x} cpus={}",
        CPU_COUNTERS.as_ptr() as u64,
        cpus
    );
    let every = param(bi, "testguest.counter_every", 2000).max(1);
    let mut seq = 0u64;
    loop {
        for _ in 0..every {
            let v = CPU_COUNTERS[0].load(Ordering::Relaxed);
            CPU_COUNTERS[0].store(v + 1, Ordering::Relaxed);
        }
        seq += 1;
        print!("counter: seq={}", seq);
        for (i, c) in CPU_COUNTERS[..cpus].iter().enumerate() {
            print!(" cpu{}={}", i, c.load(Ordering::Relaxed));
        }
        if reread {
            print!(" mem={:x}", touched_sum(touched));
        }
        println!();
    }
}

/// Acks seen recently, to notice one delivered twice.
struct Seen {
    ring: [(u64, u64); 64],
    n: usize,
}

impl Seen {
    /// Records `v`; true when it was already there.
    fn check(&mut self, v: (u64, u64)) -> bool {
        let len = self.n.min(self.ring.len());
        if self.ring[..len].contains(&v) {
            return true;
        }
        self.ring[self.n % self.ring.len()] = v;
        self.n += 1;
        false
    }
}

fn find(bi: &BootInfo, kind: u32) -> Option<Mmio> {
    let (addrs, n) = virtio::devices_from_cmdline(bi);
    addrs[..n]
        .iter()
        .map(|&base| Mmio { base })
        .find(|m| m.probe() == Some(kind))
}

fn sector_buf(data: u64, i: u64) {
    for w in 0..blk::WORDS {
        write64(data + w * 8, blk::pattern(i, w));
    }
}

fn ok_status(d: &Done) -> bool {
    matches!(d, Done::Status(0))
}

pub fn stream(bi: &BootInfo) {
    let k = param(bi, "testguest.stream_count", 300);
    let Some(mut arena) = DmaArena::new(bi) else {
        println!("stream: no RAM for DMA buffers");
        return;
    };
    let tsc_ms = tsc_per_ms().max(1);
    let mut disk = None;
    if let Some(mmio) = find(bi, DEVICE_BLK) {
        let set_up = (|| {
            let features = mmio.begin_init(blk::F_FLUSH).ok()?;
            let q = mmio.setup_queue(0, &mut arena).ok()?;
            let req = arena.alloc(1)?;
            let data = arena.alloc(1)?;
            mmio.finish_init();
            Some((
                Blk {
                    mmio,
                    q,
                    req,
                    tsc_ms,
                    timeout_ms: param(bi, "testguest.blk_timeout_ms", blk::REQUEST_TIMEOUT_MS),
                },
                data,
                features & blk::F_FLUSH != 0,
            ))
        })();
        match set_up {
            Some(d) => disk = Some(d),
            None => println!("stream: blk init failed"),
        }
    }
    let mut nic: Option<Net> = match find(bi, DEVICE_NET) {
        Some(mmio) => match net::init(mmio, &mut arena, tsc_ms) {
            Ok(n) => Some(n),
            Err(e) => {
                println!("stream: net init failed: {:?}", e);
                None
            }
        },
        None => None,
    };
    println!(
        "stream: start count={} blk={} net={}",
        k,
        u8::from(disk.is_some()),
        u8::from(nic.is_some())
    );
    let mut blk_err: Option<(&str, u64)> = None;
    let mut net_fail: Option<u64> = None;
    let (mut resent, mut dup_rx, mut stale_rx) = (0u64, 0u64, 0u64);
    let mut seen = Seen {
        ring: [(u64::MAX, u64::MAX); 64],
        n: 0,
    };
    let mut msg = [0u8; 48];
    for i in 0..k {
        if let (Some((b, data, _)), None) = (disk.as_mut(), blk_err) {
            sector_buf(*data, i);
            let buf = Buf {
                addr: *data,
                len: blk::SECTOR as u32,
                write: false,
            };
            let d = b.request(blk::T_OUT, i, Some(buf));
            let (dev, drv) = b.q.used_indices();
            if !ok_status(&d) {
                blk_err = Some(("ERR", i));
            } else if dev != drv {
                blk_err = Some(("USED", i));
            }
        }
        if let (Some(n), None) = (nic.as_mut(), net_fail) {
            let mut acked = false;
            let mut t = 0;
            while !acked && t < MAX_TRIES {
                if t > 0 {
                    resent += 1;
                }
                let m = format_req(&mut msg, i, t);
                if !n.send(m) {
                    break;
                }
                let t0 = crate::io::rdtsc();
                while crate::io::rdtsc().wrapping_sub(t0) < n.tsc_ms * ACK_WAIT_MS {
                    let Some(f) = n.recv(ACK_WAIT_MS) else { break };
                    let Some((a, at)) = two_numbers(f.bytes(), b"microvirt ack ") else {
                        continue;
                    };
                    if seen.check((a, at)) {
                        dup_rx += 1;
                    }
                    if a == i {
                        acked = true;
                        break;
                    }
                    if a < i {
                        stale_rx += 1;
                    }
                }
                t += 1;
            }
            if !acked {
                net_fail = Some(i);
            }
        }
        if i % 10 == 0 {
            println!("stream: {}", i);
        }
    }
    // Read everything back: what was written before a snapshot must still be there.
    let blk_result = match (disk.as_mut(), blk_err) {
        (None, _) => "none",
        (Some(_), Some((e, _))) => e,
        (Some((b, data, flush)), None) => {
            if *flush && !ok_status(&b.request(blk::T_FLUSH, 0, None)) {
                blk_err = Some(("ERR", k));
            }
            for i in 0..k {
                if blk_err.is_some() {
                    break;
                }
                let buf = Buf {
                    addr: *data,
                    len: blk::SECTOR as u32,
                    write: true,
                };
                if !ok_status(&b.request(blk::T_IN, i, Some(buf))) {
                    blk_err = Some(("ERR", i));
                    break;
                }
                if (0..blk::WORDS).any(|w| read64(*data + w * 8) != blk::pattern(i, w)) {
                    blk_err = Some(("MISMATCH", i));
                }
            }
            match blk_err {
                Some((e, _)) => e,
                None => "ok",
            }
        }
    };
    print!("stream: done {} blk={}", k, blk_result);
    if let Some((_, at)) = blk_err {
        print!("@{}", at);
    }
    match (nic.is_some(), net_fail) {
        (false, _) => print!(" net=none"),
        (true, None) => print!(" net=ok"),
        (true, Some(i)) => print!(" net=FAIL@{}", i),
    }
    println!(
        " resent={} dup_rx={} stale_rx={}",
        resent, dup_rx, stale_rx
    );
}

/// `microvirt req <i> <t>`.
fn format_req(buf: &mut [u8; 48], i: u64, t: u64) -> &[u8] {
    let prefix = b"microvirt req ";
    let mut len = prefix.len();
    buf[..len].copy_from_slice(prefix);
    for (n, sep) in [(i, true), (t, false)] {
        let mut digits = [0u8; 20];
        let mut d = 0;
        let mut v = n;
        loop {
            digits[d] = b'0' + (v % 10) as u8;
            d += 1;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        while d > 0 {
            d -= 1;
            buf[len] = digits[d];
            len += 1;
        }
        if sep {
            buf[len] = b' ';
            len += 1;
        }
    }
    &buf[..len]
}
