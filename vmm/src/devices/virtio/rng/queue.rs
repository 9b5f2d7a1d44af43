//! Pure virtio-rng queue handling: every available chain is a set of device-writable buffers
//! the device fills with random bytes; the used length says how many. No KVM, no event loop:
//! the entropy source and the clock are passed in, so this is unit-tested on hand-built rings.
//!
//! Guest mistakes never panic: a chain with a device-readable buffer or a buffer outside guest
//! memory is completed with length 0 (nothing written); a chain that cannot be walked (loop,
//! too long, bad index) or unusable rings stop the queue and the device marks itself
//! NEEDS_RESET ([`RngOutcome::fatal`]).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestMemoryBackend};

use crate::devices::virtio::collect_chain;
use crate::vstate::memory::GuestMemoryMmap;

/// Most bytes one chain gets (the bucket may allow fewer).
pub const MAX_CHAIN_BYTES: u64 = 64 << 10;

/// A token bucket: `capacity` bytes, refilled at `rate` bytes per second.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    capacity: u64,
    rate: u64,
    tokens: u64,
    /// Refill time not yet turned into whole tokens is kept by advancing `last` only by the
    /// time the added tokens account for.
    last: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(capacity: u64, rate: u64, now: Instant) -> Self {
        Self {
            capacity,
            rate: rate.max(1),
            tokens: capacity,
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last);
        let add = (elapsed.as_nanos() * u128::from(self.rate) / 1_000_000_000) as u64;
        if add == 0 {
            return;
        }
        if self.tokens + add >= self.capacity {
            self.tokens = self.capacity;
            self.last = now;
        } else {
            self.tokens += add;
            let used = Duration::from_nanos(
                (u128::from(add) * 1_000_000_000 / u128::from(self.rate)) as u64,
            );
            self.last += used;
        }
    }

    /// Takes up to `want` tokens; returns how many were taken.
    pub fn take(&mut self, want: u64, now: Instant) -> u64 {
        self.refill(now);
        let n = want.min(self.tokens);
        self.tokens -= n;
        n
    }

    /// Tokens available at `now`.
    pub fn available(&mut self, now: Instant) -> u64 {
        self.refill(now);
        self.tokens
    }

    /// How long until `want` tokens (at most the capacity) are available, from `now`.
    pub fn wait_for(&mut self, want: u64, now: Instant) -> Duration {
        self.refill(now);
        let want = want.min(self.capacity);
        if self.tokens >= want {
            return Duration::ZERO;
        }
        let missing = want - self.tokens;
        let since = now.saturating_duration_since(self.last);
        let ns = (u128::from(missing) * 1_000_000_000).div_ceil(u128::from(self.rate));
        Duration::from_nanos(ns as u64).saturating_sub(since)
    }
}

/// What one pass over the queue did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct RngOutcome {
    /// Chains put in the used ring.
    pub used: u32,
    /// Random bytes written into guest memory.
    pub bytes: u64,
    /// Chains are still available but the bucket is empty.
    pub throttled: bool,
    /// Processing stopped on a guest error that needs a device reset.
    pub fatal: Option<String>,
}

/// Fills every available chain of `queue` (as far as `bucket` allows at `now`) with bytes from
/// `source`. A failing source completes the chain with length 0.
pub fn process_queue(
    queue: &mut Queue,
    mem: &GuestMemoryMmap,
    bucket: &mut TokenBucket,
    now: Instant,
    source: &mut dyn FnMut(&mut [u8]) -> std::io::Result<()>,
) -> RngOutcome {
    let mut out = RngOutcome::default();
    let mut buf = Vec::new();
    loop {
        if bucket.available(now) == 0 {
            match queue.avail_idx(mem, Ordering::Acquire) {
                Ok(idx) => out.throttled = idx.0 != queue.next_avail(),
                Err(e) => out.fatal = Some(format!("available ring: {e}")),
            }
            break;
        }
        let chain = match queue.iter(mem) {
            Ok(mut it) => match it.next() {
                Some(c) => c,
                None => break,
            },
            Err(e) => {
                out.fatal = Some(format!("available ring: {e}"));
                break;
            }
        };
        let head = chain.head_index();
        let descs = match collect_chain(chain) {
            Ok(d) => d,
            Err(e) => {
                out.fatal = Some(format!("chain {head}: {e}"));
                break;
            }
        };
        let mut len = 0u32;
        let usable = descs.iter().all(|d| {
            d.is_write_only() && (d.len() == 0 || mem.check_range(d.addr(), d.len() as usize))
        });
        if !usable {
            log::warn!("virtio-rng: chain {head} has a device-readable buffer or one outside guest memory; completed empty");
        } else {
            let room: u64 = descs.iter().map(|d| u64::from(d.len())).sum();
            let n = bucket.take(room.min(MAX_CHAIN_BYTES), now);
            buf.resize(n as usize, 0);
            match source(&mut buf) {
                Ok(()) => {
                    let mut done = 0usize;
                    for d in &descs {
                        if done == buf.len() {
                            break;
                        }
                        let k = (d.len() as usize).min(buf.len() - done);
                        if mem.write_slice(&buf[done..done + k], d.addr()).is_err() {
                            break;
                        }
                        done += k;
                    }
                    len = done as u32;
                    out.bytes += done as u64;
                }
                Err(e) => log::error!("virtio-rng: the host's entropy source failed: {e}"),
            }
        }
        if let Err(e) = queue.add_used(mem, head, len) {
            out.fatal = Some(format!("cannot complete chain {head}: {e}"));
            break;
        }
        out.used += 1;
    }
    if let Some(f) = &out.fatal {
        log::error!("virtio-rng: {f}; device needs reset");
    }
    out
}

/// The host's entropy: `getrandom(2)` (blocks only until the kernel's pool is initialised,
/// long before a VM starts).
pub fn getrandom(buf: &mut [u8]) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: writes at most `buf.len() - done` bytes into `buf` at `done`.
        let r = unsafe { libc::getrandom(buf[done..].as_mut_ptr().cast(), buf.len() - done, 0) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        done += r as usize;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::test_utils::{mem, TestQueue, F_NEXT, F_WRITE};
    use vm_memory::GuestAddress;

    const BUF: u64 = 0x20000;
    const OOB: u64 = 0x7_0000_0000;

    /// A source that counts: byte i of the whole stream is i % 251 + 1 (never 0).
    fn counting() -> impl FnMut(&mut [u8]) -> std::io::Result<()> {
        let mut n = 0u64;
        move |b: &mut [u8]| {
            for x in b.iter_mut() {
                *x = (n % 251) as u8 + 1;
                n += 1;
            }
            Ok(())
        }
    }

    fn big_bucket(now: Instant) -> TokenBucket {
        TokenBucket::new(1 << 30, 1 << 30, now)
    }

    fn read(m: &GuestMemoryMmap, a: u64, n: usize) -> Vec<u8> {
        let mut v = vec![0; n];
        m.read_slice(&mut v, GuestAddress(a)).unwrap();
        v
    }

    #[test]
    fn fills_writable_buffers_and_reports_the_length() {
        let m = mem();
        let mut tq = TestQueue::new(&m, 0x1000, 16);
        tq.add_chain(&[(BUF, 16, true)]);
        tq.add_chain(&[(BUF + 0x100, 3, true), (BUF + 0x200, 5, true)]);
        let now = Instant::now();
        let mut q = tq.queue();
        let out = process_queue(&mut q, &m, &mut big_bucket(now), now, &mut counting());
        assert_eq!(
            out,
            RngOutcome {
                used: 2,
                bytes: 24,
                throttled: false,
                fatal: None
            }
        );
        assert_eq!(tq.used(0).1, 16);
        assert_eq!(tq.used(1).1, 8);
        assert_eq!(read(&m, BUF, 16), (1..=16).collect::<Vec<u8>>());
        assert_eq!(read(&m, BUF + 0x100, 4), vec![17, 18, 19, 0]);
        assert_eq!(read(&m, BUF + 0x200, 6), vec![20, 21, 22, 23, 24, 0]);
    }

    #[test]
    fn malformed_chains_complete_empty_and_broken_ones_are_fatal() {
        let m = mem();
        let now = Instant::now();
        // A device-readable buffer, one outside guest memory, one straddling its end, an
        // empty one: each completed with length 0, nothing written.
        let mut tq = TestQueue::new(&m, 0x1000, 16);
        tq.add_chain(&[(BUF, 16, false)]);
        tq.add_chain(&[(BUF, 8, true), (BUF + 8, 8, false)]);
        tq.add_chain(&[(OOB, 16, true)]);
        tq.add_chain(&[((16 << 20) - 8, 16, true)]);
        tq.add_chain(&[(BUF, 0, true)]);
        let mut q = tq.queue();
        let out = process_queue(&mut q, &m, &mut big_bucket(now), now, &mut counting());
        assert_eq!((out.used, out.bytes, out.fatal), (5, 0, None));
        for i in 0..5 {
            assert_eq!(tq.used(i).1, 0, "chain {i}");
        }
        assert_eq!(read(&m, BUF, 16), vec![0; 16]);
        // A failing entropy source: completed empty too.
        let mut tq = TestQueue::new(&m, 0x1000, 16);
        tq.add_chain(&[(BUF, 16, true)]);
        let mut q = tq.queue();
        let mut failing = |_: &mut [u8]| Err(std::io::Error::other("no entropy"));
        let out = process_queue(&mut q, &m, &mut big_bucket(now), now, &mut failing);
        assert_eq!((out.used, out.bytes), (1, 0));
        assert_eq!(tq.used(0).1, 0);
        // A descriptor loop, a head outside the table, an available index far ahead: fatal.
        let tq = TestQueue::new(&m, 0x1000, 16);
        tq.set_desc(0, BUF, 16, F_NEXT | F_WRITE, 1);
        tq.set_desc(1, BUF, 16, F_NEXT | F_WRITE, 0);
        tq.push_avail(0);
        let out = process_queue(
            &mut tq.queue(),
            &m,
            &mut big_bucket(now),
            now,
            &mut counting(),
        );
        assert_eq!(out.used, 0);
        assert!(out.fatal.is_some());
        let tq = TestQueue::new(&m, 0x1000, 16);
        tq.push_avail(300);
        let out = process_queue(
            &mut tq.queue(),
            &m,
            &mut big_bucket(now),
            now,
            &mut counting(),
        );
        assert!(out.fatal.is_some());
        let tq = TestQueue::new(&m, 0x1000, 16);
        tq.set_avail_idx(40);
        let out = process_queue(
            &mut tq.queue(),
            &m,
            &mut big_bucket(now),
            now,
            &mut counting(),
        );
        assert!(out.fatal.is_some());
        assert_eq!(read(&m, BUF, 16), vec![0; 16]);
    }

    #[test]
    fn the_bucket_limits_what_the_guest_gets() {
        let m = mem();
        let t0 = Instant::now();
        // 1000 bytes of burst, 1000 bytes per second.
        let mut b = TokenBucket::new(1000, 1000, t0);
        let mut tq = TestQueue::new(&m, 0x1000, 16);
        for i in 0..3 {
            tq.add_chain(&[(BUF + i * 0x1000, 600, true)]);
        }
        let mut q = tq.queue();
        let mut src = counting();
        let out = process_queue(&mut q, &m, &mut b, t0, &mut src);
        // 600, then the 400 left (a short answer), then nothing: the third chain waits.
        assert_eq!((out.used, out.bytes, out.throttled), (2, 1000, true));
        assert_eq!((tq.used(0).1, tq.used(1).1), (600, 400));
        assert_eq!(tq.used_idx(), 2);
        assert_eq!(b.wait_for(500, t0), Duration::from_millis(500));
        // 250 ms later: 250 bytes.
        let t1 = t0 + Duration::from_millis(250);
        assert_eq!(b.wait_for(500, t1), Duration::from_millis(250));
        let out = process_queue(&mut q, &m, &mut b, t1, &mut src);
        assert_eq!((out.used, out.bytes, out.throttled), (1, 250, false));
        assert_eq!(tq.used(2).1, 250);
        // Idle for long: never more than the burst.
        let t2 = t1 + Duration::from_secs(3600);
        assert_eq!(b.available(t2), 1000);
        assert_eq!(b.take(5000, t2), 1000);
        assert_eq!(b.take(1, t2), 0);
        // Refill keeps fractions: 1 ms at a time adds up to one byte per ms.
        let mut t = t2;
        let mut got = 0;
        for _ in 0..100 {
            t += Duration::from_micros(1500);
            got += b.take(u64::MAX, t);
        }
        assert_eq!(got, 150);
        // A chain never gets more than MAX_CHAIN_BYTES.
        let mut tq = TestQueue::new(&m, 0x1000, 16);
        tq.add_chain(&[(0x100000, 1 << 20, true)]);
        let out = process_queue(&mut tq.queue(), &m, &mut big_bucket(t0), t0, &mut src);
        assert_eq!(out.bytes, MAX_CHAIN_BYTES);
        assert_eq!(tq.used(0).1 as u64, MAX_CHAIN_BYTES);
    }

    #[test]
    fn host_getrandom_fills_the_buffer() {
        let mut a = [0u8; 512];
        let mut b = [0u8; 512];
        getrandom(&mut a).unwrap();
        getrandom(&mut b).unwrap();
        assert_ne!(a, b);
        assert!(a.iter().any(|&x| x != 0));
    }
}
