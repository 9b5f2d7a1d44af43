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
}

/// Outcome of one processing pass.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PassOutcome {
    pub used: u32,
    pub fatal: Option<String>,
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
                    log::error!("virtio-net: backend read failed: {e}");
                    break;
                }
            },
        };
        if len < VNET_HDR_LEN {
            log::warn!("virtio-net: backend gave a {len}-byte frame; dropped");
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
                log::warn!("virtio-net: {e}; frame dropped");
                stats.rx_dropped_too_big += 1;
                rx.pending = None;
                q.go_to_previous_position();
                continue;
            }
            Err(e) => {
                log::warn!("virtio-net: bad rx chain {head}: {e}; returned empty");
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
        log::error!("virtio-net: {f}; device needs reset");
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
                    log::warn!(
                        "virtio-net: backend write of {} bytes failed: {e}",
                        buf.len()
                    );
                    stats.tx_dropped += 1;
                }
            },
            Err(e) => {
                log::warn!("virtio-net: bad tx chain {head}: {e}; dropped");
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
        log::error!("virtio-net: {f}; device needs reset");
    }
    out
}
