//! Pure virtio-net frame handling over descriptor chains (no KVM, no TAP:
//! frames move through the [`FrameIo`] trait).
//!
//! RX back-pressure: a frame read from the backend stays in
//! [`RxState::pending`] until a receive chain takes it. With no chain
//! available we stop reading the backend (the kernel keeps the following
//! frames queued in the TAP) and resume when the driver adds buffers and
//! notifies the RX queue. No frame is dropped or duplicated for lack of
//! buffers. A frame larger than the chain offered is dropped (the chain is
//! handed back unused) because waiting would never help.
//!
//! Guest errors: a chain with a device-readable descriptor (RX) or a
//! device-writable one (TX), buffers outside guest memory, or absurd sizes
//! is completed with length 0 and logged; broken chains (loops, too long,
//! bad next index), head indices out of range or an available index running
//! ahead are fatal (`fatal` set; the device goes NEEDS_RESET).

use std::io;

use virtio_queue::desc::split::Descriptor;
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestMemoryBackend};

use super::tap::{FrameIo, VNET_HDR_LEN};
use crate::devices::virtio::collect_chain;
use crate::vstate::memory::GuestMemoryMmap;

/// Largest frame (header + 64 KiB GSO packet + Ethernet header + VLAN).
pub const MAX_FRAME_LEN: usize = VNET_HDR_LEN + 65535 + 14 + 4;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("descriptor has the wrong direction")]
    Direction,
    #[error("buffer {addr:#x}+{len:#x} outside guest memory")]
    OutOfMemory { addr: u64, len: u32 },
    #[error("frame of {0} bytes is shorter than the virtio-net header")]
    TooShort(usize),
    #[error("frame of {0} bytes or more exceeds the maximum {MAX_FRAME_LEN}")]
    TooLong(usize),
    #[error("frame of {frame} bytes does not fit the {buffer}-byte receive chain")]
    DoesNotFit { frame: usize, buffer: u64 },
}

/// Gather a TX chain into `out` (header + frame).
pub fn read_tx_frame(
    mem: &GuestMemoryMmap,
    descs: &[Descriptor],
    out: &mut Vec<u8>,
) -> Result<(), FrameError> {
    out.clear();
    for d in descs {
        if d.is_write_only() {
            return Err(FrameError::Direction);
        }
        let len = d.len() as usize;
        if out.len() + len > MAX_FRAME_LEN {
            return Err(FrameError::TooLong(out.len() + len));
        }
        let start = out.len();
        out.resize(start + len, 0);
        mem.read_slice(&mut out[start..], d.addr())
            .map_err(|_| FrameError::OutOfMemory {
                addr: d.addr().0,
                len: d.len(),
            })?;
    }
    if out.len() < VNET_HDR_LEN {
        return Err(FrameError::TooShort(out.len()));
    }
    Ok(())
}

/// Scatter `frame` (header + frame) into an RX chain. Returns bytes written.
pub fn write_rx_frame(
    mem: &GuestMemoryMmap,
    descs: &[Descriptor],
    frame: &[u8],
) -> Result<u32, FrameError> {
    let mut cap = 0u64;
    for d in descs {
        if !d.is_write_only() {
            return Err(FrameError::Direction);
        }
        if d.len() > 0 && !mem.check_range(d.addr(), d.len() as usize) {
            return Err(FrameError::OutOfMemory {
                addr: d.addr().0,
                len: d.len(),
            });
        }
        cap += u64::from(d.len());
    }
    if (frame.len() as u64) > cap {
        return Err(FrameError::DoesNotFit {
            frame: frame.len(),
            buffer: cap,
        });
    }
    let mut done = 0usize;
    for d in descs {
        if done == frame.len() {
            break;
        }
        let n = (d.len() as usize).min(frame.len() - done);
        mem.write_slice(&frame[done..done + n], d.addr())
            .map_err(|_| FrameError::OutOfMemory {
                addr: d.addr().0,
                len: d.len(),
            })?;
        done += n;
    }
    Ok(done as u32)
}

/// Receive-side state that survives between events.
#[derive(Debug)]
pub struct RxState {
    buf: Vec<u8>,
    /// Length of the frame in `buf` waiting for a receive chain.
    pub pending: Option<usize>,
}

impl Default for RxState {
    fn default() -> Self {
        Self {
            buf: vec![0; MAX_FRAME_LEN],
            pending: None,
        }
    }
}

impl RxState {
    /// Forget a pending frame (device reset).
    pub fn clear(&mut self) {
        self.pending = None;
    }

    /// The frame waiting for a receive chain.
    pub fn pending_frame(&self) -> Option<&[u8]> {
        self.pending.map(|n| &self.buf[..n])
    }

    /// Makes `frame` (cut to [`MAX_FRAME_LEN`]) the frame waiting for a receive chain.
    pub fn set_pending(&mut self, frame: &[u8]) {
        let n = frame.len().min(self.buf.len());
        self.buf[..n].copy_from_slice(&frame[..n]);
        self.pending = Some(n);
    }
}

/// Counters (monotonic).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NetStats {
    pub rx_frames: u64,
    pub rx_bytes: u64,
    pub tx_frames: u64,
    pub tx_bytes: u64,
    /// RX processing stopped because the guest had no buffers.
    pub rx_blocked: u64,
    /// Frames larger than the receive chain offered.
    pub rx_dropped_too_big: u64,
    /// Receive chains returned empty because they were malformed.
    pub rx_bad_chains: u64,
    /// TX chains that were malformed or that the backend refused.
    pub tx_dropped: u64,
    /// Frames from the backend shorter than the virtio-net header.
    #[serde(default)]
    pub rx_dropped_short: u64,
    /// A frame waiting for a receive chain when the driver reset the device.
    #[serde(default)]
    pub rx_dropped_reset: u64,
}

impl NetStats {
    /// Every frame read from the backend and not delivered to the guest.
    pub fn rx_dropped(&self) -> u64 {
        self.rx_dropped_too_big + self.rx_dropped_short + self.rx_dropped_reset
    }
}

/// Outcome of one processing pass.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PassOutcome {
    pub used: u32,
    pub fatal: Option<String>,
}

impl std::ops::AddAssign for PassOutcome {
    fn add_assign(&mut self, o: Self) {
        self.used += o.used;
        if self.fatal.is_none() {
            self.fatal = o.fatal;
        }
    }
}

impl crate::devices::virtio::notify::PassResult for PassOutcome {
    fn stop(&self) -> bool {
        self.fatal.is_some()
    }
}

enum Next<C> {
    Chain(C),
    Empty,
    Fatal(String),
}

fn next_chain<'a>(
    q: &mut Queue,
    mem: &'a GuestMemoryMmap,
) -> Next<virtio_queue::DescriptorChain<&'a GuestMemoryMmap>> {
    match q.iter(mem) {
        Ok(mut it) => match it.next() {
            Some(c) => Next::Chain(c),
            None => Next::Empty,
        },
        Err(e) => Next::Fatal(format!("available ring: {e}")),
    }
}

/// Move frames from `io` into the RX queue until the backend is empty or
/// the guest has no buffers left (then the pending frame is kept).
pub fn process_rx(
    q: &mut Queue,
    mem: &GuestMemoryMmap,
    io: &mut dyn FrameIo,
    rx: &mut RxState,
    stats: &mut NetStats,
) -> PassOutcome {
    let mut out = PassOutcome::default();
    loop {
        let len = match rx.pending {
            Some(l) => l,
            None => match io.read_frame(&mut rx.buf) {
                Ok(n) => {
                    rx.pending = Some(n);
                    n
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    crate::guest_log!(log::Level::Error, "virtio-net: backend read failed: {e}");
                    break;
                }
            },
        };
        if len < VNET_HDR_LEN {
            crate::guest_log!(
                log::Level::Warn,
                "virtio-net: backend gave a {len}-byte frame; dropped"
            );
            stats.rx_dropped_short += 1;
            rx.pending = None;
            continue;
        }
        // virtio 1.x: num_buffers is 1 without VIRTIO_NET_F_MRG_RXBUF.
        rx.buf[10..12].copy_from_slice(&1u16.to_le_bytes());
        let chain = match next_chain(q, mem) {
            Next::Chain(c) => c,
            Next::Empty => {
                stats.rx_blocked += 1;
                break;
            }
            Next::Fatal(f) => {
                out.fatal = Some(f);
                break;
            }
        };
        let head = chain.head_index();
        let descs = match collect_chain(chain) {
            Ok(d) => d,
            Err(e) => {
                out.fatal = Some(format!("rx chain {head}: {e}"));
                break;
            }
        };
        let written = match write_rx_frame(mem, &descs, &rx.buf[..len]) {
            Ok(n) => {
                rx.pending = None;
                stats.rx_frames += 1;
                stats.rx_bytes += (len - VNET_HDR_LEN) as u64;
                n
            }
            Err(e @ FrameError::DoesNotFit { .. }) => {
                // Waiting would not help: drop the frame, hand the chain back unused.
                crate::guest_log!(log::Level::Warn, "virtio-net: {e}; frame dropped");
                stats.rx_dropped_too_big += 1;
                rx.pending = None;
                q.go_to_previous_position();
                continue;
            }
            Err(e) => {
                crate::guest_log!(
                    log::Level::Warn,
                    "virtio-net: bad rx chain {head}: {e}; returned empty"
                );
                stats.rx_bad_chains += 1;
                0
            }
        };
        if let Err(e) = q.add_used(mem, head, written) {
            out.fatal = Some(format!("cannot complete rx chain {head}: {e}"));
            break;
        }
        out.used += 1;
    }
    if let Some(f) = &out.fatal {
        crate::guest_log!(log::Level::Error, "virtio-net: {f}; device needs reset");
    }
    out
}

/// Send every available TX chain to `io`.
pub fn process_tx(
    q: &mut Queue,
    mem: &GuestMemoryMmap,
    io: &mut dyn FrameIo,
    buf: &mut Vec<u8>,
    stats: &mut NetStats,
) -> PassOutcome {
    let mut out = PassOutcome::default();
    loop {
        let chain = match next_chain(q, mem) {
            Next::Chain(c) => c,
            Next::Empty => break,
            Next::Fatal(f) => {
                out.fatal = Some(f);
                break;
            }
        };
        let head = chain.head_index();
        let descs = match collect_chain(chain) {
            Ok(d) => d,
            Err(e) => {
                out.fatal = Some(format!("tx chain {head}: {e}"));
                break;
            }
        };
        match read_tx_frame(mem, &descs, buf) {
            Ok(()) => match io.write_frame(buf) {
                Ok(_) => {
                    stats.tx_frames += 1;
                    stats.tx_bytes += (buf.len() - VNET_HDR_LEN) as u64;
                }
                Err(e) => {
                    crate::guest_log!(
                        log::Level::Warn,
                        "virtio-net: backend write of {} bytes failed: {e}",
                        buf.len()
                    );
                    stats.tx_dropped += 1;
                }
            },
            Err(e) => {
                crate::guest_log!(
                    log::Level::Warn,
                    "virtio-net: bad tx chain {head}: {e}; dropped"
                );
                stats.tx_dropped += 1;
            }
        }
        if let Err(e) = q.add_used(mem, head, 0) {
            out.fatal = Some(format!("cannot complete tx chain {head}: {e}"));
            break;
        }
        out.used += 1;
    }
    if let Some(f) = &out.fatal {
        crate::guest_log!(log::Level::Error, "virtio-net: {f}; device needs reset");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::test_utils::{mem, TestQueue, F_NEXT, F_WRITE};
    use std::collections::VecDeque;
    use vm_memory::GuestAddress;

    const OOB: u64 = 0x7_0000_0000;

    #[derive(Default)]
    struct MockIo {
        rx: VecDeque<Vec<u8>>,
        sent: Vec<Vec<u8>>,
        fail_writes: bool,
    }

    impl FrameIo for MockIo {
        fn read_frame(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let f = self.rx.pop_front().ok_or(io::ErrorKind::WouldBlock)?;
            buf[..f.len()].copy_from_slice(&f);
            Ok(f.len())
        }
        fn write_frame(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.fail_writes {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
            self.sent.push(buf.to_vec());
            Ok(buf.len())
        }
    }

    fn frame(n: u32, payload_len: usize) -> Vec<u8> {
        let mut f = vec![0u8; VNET_HDR_LEN];
        f.extend_from_slice(&[
            0x52, 0x54, 0, 0x12, 0x34, 0x56, 2, 0, 0, 0, 0, 1, 0x88, 0xb5,
        ]);
        let p = format!("microvirt pong {n}");
        f.extend_from_slice(p.as_bytes());
        f.resize(VNET_HDR_LEN + 14 + payload_len.max(p.len()), 0);
        f
    }

    #[test]
    fn tx_gathers_header_and_frame_across_descriptors() {
        let m = mem();
        let f = frame(1, 60);
        m.write_slice(&f[..VNET_HDR_LEN], GuestAddress(0x10000))
            .unwrap();
        m.write_slice(&f[VNET_HDR_LEN..], GuestAddress(0x20000))
            .unwrap();
        let mut tq = TestQueue::new(&m, 0x1000, 16);
        let h = tq.add_chain(&[
            (0x10000, VNET_HDR_LEN as u32, false),
            (0x20000, (f.len() - VNET_HDR_LEN) as u32, false),
        ]);
        let mut q = tq.queue();
        let mut io = MockIo::default();
        let mut st = NetStats::default();
        let out = process_tx(&mut q, &m, &mut io, &mut Vec::new(), &mut st);
        assert_eq!(
            out,
            PassOutcome {
                used: 1,
                fatal: None
            }
        );
        assert_eq!(io.sent, vec![f.clone()]);
        assert_eq!(tq.used(0), (u32::from(h), 0));
        assert_eq!(st.tx_frames, 1);
        assert_eq!(st.tx_bytes, (f.len() - VNET_HDR_LEN) as u64);
    }

    #[test]
    fn bad_tx_chains_are_completed_and_dropped() {
        let m = mem();
        let mut tq = TestQueue::new(&m, 0x1000, 16);
        tq.add_chain(&[(0x10000, 60, true)]); // device-writable
        tq.add_chain(&[(OOB, 60, false)]); // outside memory
        tq.add_chain(&[(0x10000, 4, false)]); // shorter than the header
        tq.add_chain(&[(0x10000, 40000, false), (0x20000, 40000, false)]); // too long
        tq.add_chain(&[(0x10000, 60, false)]); // fine
        let mut q = tq.queue();
        let mut io = MockIo::default();
        let mut st = NetStats::default();
        let out = process_tx(&mut q, &m, &mut io, &mut Vec::new(), &mut st);
        assert_eq!(
            out,
            PassOutcome {
                used: 5,
                fatal: None
            }
        );
        assert_eq!(io.sent.len(), 1);
        assert_eq!(st.tx_dropped, 4);
        // A backend failure drops the frame but completes the chain.
        tq.add_chain(&[(0x10000, 60, false)]);
        io.fail_writes = true;
        let out = process_tx(&mut q, &m, &mut io, &mut Vec::new(), &mut st);
        assert_eq!(out.used, 1);
        assert_eq!(st.tx_dropped, 5);
    }

    #[test]
    fn tx_descriptor_loop_is_fatal() {
        let m = mem();
        let tq = TestQueue::new(&m, 0x1000, 16);
        tq.set_desc(0, 0x10000, 60, F_NEXT, 1);
        tq.set_desc(1, 0x10000, 60, F_NEXT, 0);
        tq.push_avail(0);
        let mut q = tq.queue();
        let mut io = MockIo::default();
        let out = process_tx(
            &mut q,
            &m,
            &mut io,
            &mut Vec::new(),
            &mut NetStats::default(),
        );
        assert_eq!(out.used, 0);
        assert!(out.fatal.is_some());
        assert!(io.sent.is_empty());
    }

    fn rx_buffers(tq: &mut TestQueue, n: usize, len: u32) -> Vec<u16> {
        (0..n)
            .map(|i| tq.add_chain(&[(0x100000 + (i as u64 % 16) * 0x10000, len, true)]))
            .collect()
    }

    fn delivered(m: &GuestMemoryMmap, tq: &TestQueue, i: u16) -> Vec<u8> {
        let (id, len) = tq.used(i);
        let mut v = vec![0u8; len as usize];
        m.read_slice(&mut v, GuestAddress(tq.desc_addr(id as u16)))
            .unwrap();
        v
    }

    #[test]
    fn rx_back_pressure_loses_and_duplicates_nothing() {
        let m = mem();
        let mut tq = TestQueue::new(&m, 0x1000, 4);
        let mut q = tq.queue();
        let mut io = MockIo::default();
        for n in 0..10 {
            io.rx.push_back(frame(n, 46));
        }
        let mut rx = RxState::default();
        let mut st = NetStats::default();
        let mut got = Vec::new();
        let mut used_seen = 0u16;
        // The guest offers at most 3 buffers at a time.
        for _round in 0..10 {
            rx_buffers(&mut tq, 3, 2048);
            let out = process_rx(&mut q, &m, &mut io, &mut rx, &mut st);
            assert!(out.fatal.is_none(), "{:?}", out.fatal);
            while used_seen != tq.used_idx() {
                got.push(delivered(&m, &tq, used_seen));
                used_seen = used_seen.wrapping_add(1);
            }
            if io.rx.is_empty() && rx.pending.is_none() {
                break;
            }
            // Out of buffers: one frame waits, the rest stays in the backend.
            assert!(rx.pending.is_some());
        }
        assert_eq!(got.len(), 10);
        for (n, f) in got.iter().enumerate() {
            let mut want = frame(n as u32, 46);
            want[10] = 1; // num_buffers
            assert_eq!(f, &want, "frame {n}");
        }
        assert_eq!(st.rx_frames, 10);
        assert!(st.rx_blocked >= 3);
    }

    /// Found by the `net_rxtx` fuzz target: a frame shorter than the header vanished without
    /// a trace in the counters.
    #[test]
    fn rx_short_frames_are_counted_as_dropped() {
        let m = mem();
        let mut tq = TestQueue::new(&m, 0x1000, 16);
        tq.add_chain(&[(0x10000, 2048, true)]);
        let mut q = tq.queue();
        let mut io = MockIo::default();
        io.rx.push_back(vec![0u8; VNET_HDR_LEN - 1]);
        io.rx.push_back(Vec::new());
        io.rx.push_back(frame(1, 60));
        let mut rx = RxState::default();
        let mut st = NetStats::default();
        let out = process_rx(&mut q, &m, &mut io, &mut rx, &mut st);
        assert_eq!(out.used, 1);
        assert_eq!((st.rx_frames, st.rx_dropped_short), (1, 2));
        assert_eq!(st.rx_dropped(), 2);
    }

    #[test]
    fn rx_frame_too_big_for_the_chain_is_dropped_and_chain_reused() {
        let m = mem();
        let mut tq = TestQueue::new(&m, 0x1000, 16);
        let mut q = tq.queue();
        let mut io = MockIo::default();
        io.rx.push_back(frame(0, 3000));
        io.rx.push_back(frame(1, 46));
        let h = rx_buffers(&mut tq, 1, 1526)[0];
        let mut rx = RxState::default();
        let mut st = NetStats::default();
        let out = process_rx(&mut q, &m, &mut io, &mut rx, &mut st);
        assert_eq!(out.used, 1);
        assert_eq!(st.rx_dropped_too_big, 1);
        assert_eq!(tq.used(0).0, u32::from(h));
        assert!(delivered(&m, &tq, 0).ends_with(&frame(1, 46)[VNET_HDR_LEN..]));
    }

    #[test]
    fn bad_rx_chains_are_returned_empty_and_the_frame_waits() {
        let m = mem();
        let mut tq = TestQueue::new(&m, 0x1000, 16);
        let mut q = tq.queue();
        let mut io = MockIo::default();
        io.rx.push_back(frame(7, 46));
        tq.add_chain(&[(0x100000, 2048, false)]); // device-readable
        tq.add_chain(&[(OOB, 2048, true)]); // outside memory
        tq.add_chain(&[((16 << 20) - 100, 2048, true)]); // straddles the end
        let good = tq.add_chain(&[(0x100000, 10, true), (0x110000, 2048, true)]); // split buffer
        let mut rx = RxState::default();
        let mut st = NetStats::default();
        let out = process_rx(&mut q, &m, &mut io, &mut rx, &mut st);
        assert_eq!(
            out,
            PassOutcome {
                used: 4,
                fatal: None
            }
        );
        assert_eq!(st.rx_bad_chains, 3);
        assert_eq!(tq.used(0).1, 0);
        assert_eq!(tq.used(3), (u32::from(good), frame(7, 46).len() as u32));
        let mut head = [0u8; 10];
        m.read_slice(&mut head, GuestAddress(0x100000)).unwrap();
        assert_eq!(head, [0u8; 10]);
        let mut want = frame(7, 46);
        want[10] = 1; // num_buffers
        let mut rest = vec![0u8; want.len() - 10];
        m.read_slice(&mut rest, GuestAddress(0x110000)).unwrap();
        assert_eq!(&rest[..], &want[10..]);
    }

    #[test]
    fn rx_broken_chain_and_runaway_avail_index_are_fatal() {
        let m = mem();
        let tq = TestQueue::new(&m, 0x1000, 16);
        tq.set_desc(0, 0x100000, 100, F_NEXT | F_WRITE, 0);
        tq.push_avail(0);
        let mut q = tq.queue();
        let mut io = MockIo::default();
        io.rx.push_back(frame(1, 46));
        let mut rx = RxState::default();
        let out = process_rx(&mut q, &m, &mut io, &mut rx, &mut NetStats::default());
        assert!(out.fatal.is_some());
        assert!(rx.pending.is_some(), "the frame is kept, not lost");
        let tq = TestQueue::new(&m, 0x1000, 16);
        tq.set_avail_idx(40);
        let mut q = tq.queue();
        let out = process_rx(&mut q, &m, &mut io, &mut rx, &mut NetStats::default());
        assert!(out.fatal.is_some());
    }
}
