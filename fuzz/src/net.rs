//! `net_rxtx`: a real [`NetDevice`] over a fake TAP (a socket pair, see [`crate::backend`]),
//! receive and transmit queues driven by a driver model, with frame accounting.
//!
//! Operations: the host sends a frame (any length, also shorter than the virtio-net header),
//! the driver posts receive buffers (one to three descriptors, sometimes device-readable or
//! outside guest memory, sometimes a broken chain), posts a frame to transmit (split over
//! descriptors, sometimes malformed), notifies either queue, resets the device, or scribbles
//! over guest memory.
//!
//! Checked:
//! - every frame the host sent is delivered to the guest exactly once, intact (apart from the
//!   `num_buffers` field the device sets to 1) and in order, or counted in a drop counter of the
//!   device's statistics: frames are never silently lost. At the end, with ample buffers, every
//!   frame is accounted for: `sent = delivered + dropped`, nothing left pending;
//! - receive buffers come back with a length only when a frame was written into them, malformed
//!   ones come back empty;
//! - every transmit chain completes with length 0, in order; a well-formed one reaches the host
//!   byte for byte unless the backend was full (then it is counted as dropped), a malformed one
//!   never reaches it and is counted as dropped;
//! - a broken chain stops the queue and sets NEEDS_RESET; the device writes guest memory only in
//!   the receive buffers it returned and the used rings; completions raise the used-buffer
//!   interrupt.

use std::collections::VecDeque;

use vm_memory::{Bytes, GuestAddress};
use vmm::devices::interrupt::IrqLine;
use vmm::devices::virtio::net::frames::NetStats;
use vmm::devices::virtio::net::tap::VNET_HDR_LEN;
use vmm::devices::virtio::net::{MacAddr, NetDevice};
use vmm::devices::virtio::{VirtioDevice, INT_CONFIG, INT_VRING, VIRTIO_F_VERSION_1};
use vmm::vstate::memory::GuestMemoryMmap;

use crate::backend::{pair, HostEnd};
use crate::driver::{
    assert_writes_within, bad_address, guest_memory, slot_area, writable_ranges, Buf, MemSnapshot,
    SplitQueue, SLOT,
};
use crate::input::Input;

const MAX_OPS: usize = 300;
const RX: u16 = 0;
const TX: u16 = 1;
/// Largest frame the host sends (header included).
const MAX_HOST_FRAME: usize = VNET_HDR_LEN + 2000;

/// Frames the device dropped on receive, by every counter that counts them.
pub fn rx_dropped(s: &NetStats) -> u64 {
    s.rx_dropped()
}

/// A [`bad_address`] selector that is really outside guest memory (the one that straddles two
/// adjacent mappings is valid guest-physical memory, and two chains would share it).
fn not_straddling(sel: u8) -> u8 {
    if sel % 4 == 1 {
        sel.wrapping_add(1)
    } else {
        sel
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mistake {
    None,
    /// A descriptor with the wrong direction.
    Direction,
    /// A buffer outside guest memory.
    Outside(u8),
    /// The last descriptor says NEXT, to an index past the table: the chain cannot be walked.
    Broken,
}

fn mistake(inp: &mut Input) -> Mistake {
    match inp.u8() {
        0..=215 => Mistake::None,
        216..=231 => Mistake::Direction,
        232..=247 => Mistake::Outside(inp.u8()),
        _ => Mistake::Broken,
    }
}

/// A receive chain the driver posted.
#[derive(Clone, Debug)]
struct RxPost {
    capacity: u64,
    mistake: Mistake,
}

/// A transmit chain the driver posted: the bytes it carries when well-formed.
#[derive(Clone, Debug)]
struct TxPost {
    bytes: Option<Vec<u8>>,
    mistake: Mistake,
}

struct Run {
    mem: GuestMemoryMmap,
    dev: NetDevice,
    host: HostEnd,
    rxq: SplitQueue,
    txq: SplitQueue,
    qsize: [u16; 2],
    acked: u64,
    /// Frames sent by the host and not yet delivered or known dropped, oldest first.
    in_flight: VecDeque<Vec<u8>>,
    sent: u64,
    delivered: u64,
    /// Frames found missing between delivered ones (so dropped).
    skipped: u64,
    /// Frame contents and order are tracked (false once guest memory was scribbled over:
    /// then frames may have gone into chains nobody can check, and only the totals count).
    fifo: bool,
    rx_posts: std::collections::HashMap<u16, RxPost>,
    tx_posts: std::collections::HashMap<u16, TxPost>,
    tx_order: VecDeque<u16>,
    rx_order: VecDeque<u16>,
    broken: bool,
    tainted: bool,
    seq: u32,
    /// Receive-queue limit of the host end (frames); `/proc/sys/net/unix/max_dgram_qlen`.
    host_qlen: usize,
}

pub fn run(data: &[u8]) {
    let mut inp = Input::new(data);
    let cfg = inp.u8();
    let offloads = u32::from(cfg & 7);
    let qsize = [4u16 << inp.below(5), 4u16 << inp.below(5)];
    let mem = guest_memory();
    let (backend, host) = pair(offloads);
    let mac = (cfg & 8 != 0).then_some(MacAddr([0x52, 0x54, 0, 0xab, 0xcd, 0xef]));
    let dev = NetDevice::new(Box::new(backend), mac, IrqLine::new(5).expect("eventfd"))
        .expect("net device");
    // Features: VERSION_1 plus a subset of the rest (no EVENT_IDX: interrupts are checked
    // per completion).
    let acked =
        (dev.avail_features() & u64::from(inp.u32()) & !(1 << 29)) | (1 << VIRTIO_F_VERSION_1);
    let host_qlen = std::fs::read_to_string("/proc/sys/net/unix/max_dgram_qlen")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(10);
    let mut run = Run {
        rxq: SplitQueue::new(&mem, RX, qsize[0]),
        txq: SplitQueue::new(&mem, TX, qsize[1]),
        mem,
        dev,
        host,
        qsize,
        acked,
        in_flight: VecDeque::new(),
        sent: 0,
        delivered: 0,
        skipped: 0,
        fifo: true,
        rx_posts: Default::default(),
        tx_posts: Default::default(),
        tx_order: VecDeque::new(),
        rx_order: VecDeque::new(),
        broken: false,
        tainted: false,
        seq: 0,
        host_qlen,
    };
    run.activate();
    for _ in 0..MAX_OPS {
        if inp.is_empty() {
            break;
        }
        let op = inp.u8() % 10;
        trace!(
            "net op {op}: stats {:?} pending {} rx outstanding {} broken {}",
            run.dev.stats(),
            run.dev.rx_pending(),
            run.rxq.outstanding(),
            run.dev.is_broken()
        );
        match op {
            0 | 1 => run.host_send(&mut inp),
            2 | 3 => run.rx_post(&mut inp),
            4 => run.rx_kick(),
            5 | 6 => run.tx_post(&mut inp),
            7 => run.tx_kick(),
            8 => run.reset(),
            _ => run.scribble(&mut inp),
        }
    }
    run.finish();
}

impl Run {
    fn activate(&mut self) {
        self.dev.set_acked_features(self.acked);
        self.dev
            .activate(
                self.mem.clone(),
                vec![self.rxq.device_queue(), self.txq.device_queue()],
            )
            .expect("activation");
    }

    fn host_send(&mut self, inp: &mut Input) {
        let len = match inp.u8() {
            0..=15 => usize::from(inp.u8()) % VNET_HDR_LEN,
            16..=31 => MAX_HOST_FRAME - usize::from(inp.u8() % 8),
            _ => VNET_HDR_LEN + usize::from(inp.u16()) % (MAX_HOST_FRAME - VNET_HDR_LEN + 1),
        };
        let hdr = inp.bytes(VNET_HDR_LEN).to_vec();
        self.seq += 1;
        let mut f = Vec::with_capacity(len);
        f.extend_from_slice(&hdr);
        f.resize(VNET_HDR_LEN, 0);
        f.extend_from_slice(&self.seq.to_le_bytes());
        let seq = self.seq;
        while f.len() < len {
            f.push((f.len() as u32 ^ seq) as u8);
        }
        f.truncate(len);
        trace!("host sends {} bytes", f.len());
        if self.host.send(&f) {
            self.sent += 1;
            self.in_flight.push_back(f);
        }
    }

    fn rx_post(&mut self, inp: &mut Input) {
        let n = 1 + usize::from(inp.u8() % 3);
        let m = mistake(inp);
        let Some(slots) = self.rxq.peek_slots(n) else {
            return;
        };
        let mut bufs = Vec::new();
        for (i, &slot) in slots.iter().enumerate() {
            let len = match inp.u8() % 8 {
                0 => 12,
                1 => 64,
                2 => 1526,
                3 => 2048,
                4 | 5 => SLOT as u32,
                _ => 1 + u32::from(inp.u16()) % SLOT as u32,
            };
            let _ = i;
            bufs.push(Buf {
                addr: slot_area(RX, slot),
                len,
                write: true,
            });
        }
        let capacity = bufs.iter().map(|b| u64::from(b.len)).sum();
        let pick = usize::from(inp.u8()) % bufs.len();
        match m {
            Mistake::Direction => bufs[pick].write = false,
            Mistake::Outside(sel) => {
                bufs[pick].addr = bad_address(not_straddling(sel), bufs[pick].len)
            }
            _ => {}
        }
        for b in bufs.iter().filter(|b| b.write) {
            let _ = self
                .mem
                .write_slice(&vec![0xa5u8; b.len as usize], GuestAddress(b.addr));
        }
        self.add(RX, &bufs, m, None, capacity);
    }

    fn tx_post(&mut self, inp: &mut Input) {
        let len = match inp.u8() % 8 {
            0 => usize::from(inp.u8()) % VNET_HDR_LEN,
            1 => VNET_HDR_LEN,
            _ => VNET_HDR_LEN + usize::from(inp.u16()) % 3000,
        };
        let m = mistake(inp);
        let mut frame: Vec<u8> = inp.bytes(VNET_HDR_LEN).to_vec();
        frame.resize(VNET_HDR_LEN, 0);
        self.seq += 1;
        let seq = self.seq;
        frame.extend_from_slice(&seq.to_le_bytes());
        while frame.len() < len {
            frame.push((frame.len() as u32).wrapping_mul(3) as u8 ^ seq as u8);
        }
        frame.truncate(len);
        let parts = 1 + usize::from(inp.u8() % 3);
        let mut lens = Vec::new();
        let mut left = frame.len();
        for p in 0..parts {
            let n = if p + 1 == parts {
                left
            } else {
                usize::from(inp.u16()) % (left + 1)
            };
            lens.push(n);
            left -= n;
        }
        if lens.iter().any(|&l| l > SLOT as usize) {
            // Keep every buffer within its slot: re-split evenly.
            let k = frame.len().div_ceil(SLOT as usize).max(1);
            lens = (0..k)
                .map(|i| (frame.len() - i * SLOT as usize).min(SLOT as usize))
                .collect();
        }
        let Some(slots) = self.txq.peek_slots(lens.len()) else {
            return;
        };
        let mut bufs = Vec::new();
        let mut off = 0;
        for (i, &l) in lens.iter().enumerate() {
            let addr = slot_area(TX, slots[i]);
            self.mem
                .write_slice(&frame[off..off + l], GuestAddress(addr))
                .expect("slot area");
            off += l;
            bufs.push(Buf {
                addr,
                len: l as u32,
                write: false,
            });
        }
        let pick = usize::from(inp.u8()) % bufs.len();
        let m = match m {
            Mistake::Direction => {
                bufs[pick].write = true;
                m
            }
            Mistake::Outside(sel) if bufs[pick].len > 0 => {
                bufs[pick].addr = bad_address(not_straddling(sel), bufs[pick].len);
                m
            }
            Mistake::Outside(_) => Mistake::None,
            other => other,
        };
        let well_formed = m == Mistake::None && frame.len() >= VNET_HDR_LEN;
        self.add(TX, &bufs, m, Some(well_formed.then_some(frame)), 0);
    }

    fn add(
        &mut self,
        q: u16,
        bufs: &[Buf],
        m: Mistake,
        tx: Option<Option<Vec<u8>>>,
        capacity: u64,
    ) {
        let queue = if q == RX {
            &mut self.rxq
        } else {
            &mut self.txq
        };
        let Some(head) = queue.add_chain(&self.mem, bufs) else {
            return;
        };
        if m == Mistake::Broken {
            // Point the last descriptor's NEXT past the table.
            let last = queue.inflight[&head]
                .descs
                .last()
                .copied()
                .expect("descriptor");
            let b = bufs.last().expect("buffer");
            let flags = if b.write { 2 } else { 0 } | 1;
            queue
                .rings
                .write_desc(&self.mem, last, b.addr, b.len, flags, queue.rings.size + 3);
        }
        queue.publish(&self.mem);
        if q == RX {
            self.rx_order.push_back(head);
            self.rx_posts.insert(
                head,
                RxPost {
                    capacity,
                    mistake: m,
                },
            );
        } else {
            self.tx_order.push_back(head);
            self.tx_posts.insert(
                head,
                TxPost {
                    bytes: tx.flatten(),
                    mistake: m,
                },
            );
        }
    }

    /// Checks common to both queues after the device ran; returns whether the device is
    /// stopped (a broken chain).
    fn after(
        &mut self,
        before: &MemSnapshot,
        completed: &[crate::driver::InFlight],
        q: u16,
        irq: u32,
    ) -> bool {
        let changed = before.changed(&self.mem);
        let refs: Vec<_> = completed.iter().collect();
        assert_writes_within(
            &changed,
            &writable_ranges(&refs, &[&self.rxq, &self.txq]),
            "virtio-net",
        );
        if !completed.is_empty() {
            assert_ne!(
                irq & INT_VRING,
                0,
                "completions without a used-buffer interrupt"
            );
        }
        let next_is_broken = if q == RX {
            self.rx_order
                .front()
                .map(|h| self.rx_posts[h].mistake == Mistake::Broken)
        } else {
            self.tx_order
                .front()
                .map(|h| self.tx_posts[h].mistake == Mistake::Broken)
        };
        let broken_now = self.dev.is_broken();
        if broken_now && !self.broken {
            assert_eq!(
                next_is_broken,
                Some(true),
                "the device stopped, but the next chain on queue {q} is not broken"
            );
            assert!(
                self.dev.interrupt().needs_reset(),
                "stopped without NEEDS_RESET"
            );
            assert_ne!(
                irq & INT_CONFIG,
                0,
                "NEEDS_RESET without a configuration interrupt"
            );
        }
        broken_now
    }

    fn rx_kick(&mut self) {
        let before = MemSnapshot::take(&self.mem);
        let was_broken = self.broken;
        let stats_before = self.dev.stats();
        self.dev.process_rx();
        let done = self.rxq.take_used(&self.mem);
        let irq = self.dev.interrupt().status();
        self.dev.interrupt().ack(INT_VRING | INT_CONFIG);
        let stats = self.dev.stats();
        if self.tainted {
            self.broken |= self.dev.is_broken();
            return;
        }
        if was_broken {
            assert!(done.is_empty(), "a stopped device completed receive chains");
            assert_eq!(
                stats, stats_before,
                "a stopped device received or dropped frames"
            );
            return;
        }
        let chains: Vec<_> = done.iter().map(|(_, _, c)| c.clone()).collect();
        let mut frames = 0;
        for (head, len, chain) in &done {
            assert_eq!(
                self.rx_order.pop_front(),
                Some(*head),
                "receive chains complete in order"
            );
            let post = self.rx_posts.remove(head).expect("posted");
            if *len == 0 {
                assert_ne!(
                    post.mistake,
                    Mistake::None,
                    "a well-formed receive chain came back empty"
                );
                continue;
            }
            assert_eq!(
                post.mistake,
                Mistake::None,
                "a malformed receive chain got a frame"
            );
            assert!(
                u64::from(*len) <= post.capacity,
                "frame of {len} bytes in a {}-byte chain",
                post.capacity
            );
            frames += 1;
            if self.fifo {
                let got = SplitQueue::read_written(&self.mem, chain, *len);
                self.deliver(&got);
            }
        }
        assert_eq!(
            stats.rx_frames - stats_before.rx_frames,
            frames,
            "receive chains filled vs. frames the device counted as received"
        );
        if self.fifo {
            assert!(
                self.skipped <= rx_dropped(&stats),
                "{} frames sent by the host were passed over, but the device counted only {} drops",
                self.skipped,
                rx_dropped(&stats)
            );
        }
        self.broken = self.after(&before, &chains, RX, irq);
    }

    /// A frame reached the guest: it must be the oldest one not yet delivered or dropped.
    fn deliver(&mut self, got: &[u8]) {
        assert!(
            got.len() >= VNET_HDR_LEN,
            "delivered a {}-byte frame",
            got.len()
        );
        assert_eq!(&got[10..12], &[1, 0], "num_buffers must be 1");
        loop {
            let Some(f) = self.in_flight.pop_front() else {
                panic!(
                    "the guest received a frame ({} bytes) that the host never sent, or twice",
                    got.len()
                );
            };
            let same = f.len() == got.len() && f[..10] == got[..10] && f[12..] == got[12..];
            if same {
                self.delivered += 1;
                return;
            }
            // Skipped: this one was dropped (or the order is wrong: then the accounting below
            // runs out).
            self.skipped += 1;
        }
    }

    fn tx_kick(&mut self) {
        let before = MemSnapshot::take(&self.mem);
        let was_broken = self.broken;
        let stats_before = self.dev.stats();
        self.dev.process_tx();
        let done = self.txq.take_used(&self.mem);
        let irq = self.dev.interrupt().status();
        self.dev.interrupt().ack(INT_VRING | INT_CONFIG);
        let mut got = VecDeque::new();
        while let Some(f) = self.host.recv() {
            got.push_back(f);
        }
        let stats = self.dev.stats();
        assert_eq!(
            stats.tx_frames - stats_before.tx_frames,
            got.len() as u64,
            "frames the host received vs. frames the device counted as sent"
        );
        if self.tainted {
            self.broken |= self.dev.is_broken();
            return;
        }
        if was_broken {
            assert!(
                done.is_empty() && got.is_empty(),
                "a stopped device transmitted"
            );
            return;
        }
        let chains: Vec<_> = done.iter().map(|(_, _, c)| c.clone()).collect();
        let mut dropped = 0u64;
        let mut delivered_now = 0usize;
        for (head, len, _) in &done {
            assert_eq!(
                self.tx_order.pop_front(),
                Some(*head),
                "transmit chains complete in order"
            );
            assert_eq!(*len, 0, "transmit chains complete with length 0");
            let post = self.tx_posts.remove(head).expect("posted");
            match &post.bytes {
                Some(b) if got.front() == Some(b) => {
                    got.pop_front();
                    delivered_now += 1;
                }
                Some(b) => {
                    assert!(
                        delivered_now >= self.host_qlen,
                        "a well-formed {}-byte frame was not sent although the backend had room \
                         ({delivered_now} frames queued)",
                        b.len()
                    );
                    dropped += 1;
                }
                None => dropped += 1,
            }
        }
        assert!(
            got.is_empty(),
            "the host received {} frames the guest did not send",
            got.len()
        );
        assert_eq!(
            stats.tx_dropped - stats_before.tx_dropped,
            dropped,
            "transmit drops counted"
        );
        self.broken = self.after(&before, &chains, TX, irq);
    }

    fn reset(&mut self) {
        // What the transport does when the driver writes 0 to Status.
        self.dev.reset();
        self.dev.interrupt().reset();
        assert!(!self.dev.is_activated() && !self.dev.is_broken(), "reset");
        self.rxq = SplitQueue::new(&self.mem, RX, self.qsize[0]);
        self.txq = SplitQueue::new(&self.mem, TX, self.qsize[1]);
        self.rx_posts.clear();
        self.tx_posts.clear();
        self.rx_order.clear();
        self.tx_order.clear();
        self.broken = false;
        self.tainted = false;
        self.activate();
    }

    fn scribble(&mut self, inp: &mut Input) {
        // Descriptor tables, available rings and buffers; never the used rings (only the device
        // writes those, and the books are kept from them).
        let addr = match inp.u8() % 4 {
            0 => u64::from(inp.u16() % 2) * 0x2000 + u64::from(inp.u16()) % 0x400,
            1 => u64::from(inp.u16() % 2) * 0x2000 + 0x1000 + u64::from(inp.u8()) % 0x84,
            2 => slot_area(RX, u16::from(inp.u8()) % self.qsize[0]) + u64::from(inp.u16()) % SLOT,
            _ => slot_area(TX, u16::from(inp.u8()) % self.qsize[1]) + u64::from(inp.u16()) % SLOT,
        };
        let n = 1 + usize::from(inp.u8() % 16);
        let b = inp.bytes(n).to_vec();
        let _ = self.mem.write_slice(&b, GuestAddress(addr));
        self.tainted = true;
        self.fifo = false;
        self.rxq.tainted = true;
        self.txq.tainted = true;
    }

    /// Give the device ample buffers until every frame the host sent is accounted for.
    fn finish(mut self) {
        for _ in 0..64 {
            if self.tainted || self.broken {
                // What a driver does on NEEDS_RESET (a frame waiting for a buffer is dropped
                // and counted).
                self.reset();
            }
            while self.rxq.free() > 0 {
                let slot = self.rxq.peek_slots(1).expect("free")[0];
                let b = Buf {
                    addr: slot_area(RX, slot),
                    len: SLOT as u32,
                    write: true,
                };
                self.add(RX, &[b], Mistake::None, None, SLOT);
            }
            let before = self.dev.stats();
            trace!(
                "drain: {} receive chains outstanding, broken {}",
                self.rxq.outstanding(),
                self.dev.is_broken()
            );
            self.rx_kick();
            if self.dev.stats() == before && !self.broken {
                break;
            }
        }
        let stats = self.dev.stats();
        let dropped = rx_dropped(&stats);
        assert!(
            !self.dev.rx_pending(),
            "a frame is still pending with free receive buffers"
        );
        assert_eq!(
            self.sent,
            stats.rx_frames + dropped,
            "frames sent by the host ({}) != received by the guest ({}) + counted as dropped \
             ({dropped}): a frame was lost without being counted",
            self.sent,
            stats.rx_frames
        );
        if self.fifo {
            assert_eq!(
                self.delivered, stats.rx_frames,
                "frames checked on delivery"
            );
        }
    }
}
