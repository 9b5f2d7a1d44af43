//! Pure virtio-blk request handling over `virtio_queue` descriptor chains.
//!
//! Layout accepted (what Linux and our test guest produce): the first
//! descriptor is device-readable and holds the 16-byte header
//! (`type: u32, reserved: u32, sector: u64`); the descriptors between the
//! first and the last carry data; the last descriptor is device-writable and
//! its last byte receives the status.
//!
//! Guest mistakes never panic. Two classes:
//! - the status byte is usable → the request completes with
//!   `VIRTIO_BLK_S_IOERR` (bad header, data outside guest memory, wrong
//!   descriptor direction, size not a multiple of 512, beyond the disk, write
//!   to a read-only disk, too many discard segments, ...) or
//!   `VIRTIO_BLK_S_UNSUPP` (unknown request type, unknown discard flags);
//! - it is not (descriptor loop, chain longer than the queue, next index out
//!   of the table, last descriptor not writable, status outside guest
//!   memory, head index out of range, available index running ahead by more
//!   than the queue size) → [`QueueOutcome::fatal`] is set and the device
//!   marks itself NEEDS_RESET.
//!
//! Every error produces one log line.

use virtio_queue::desc::split::Descriptor;
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend};

use super::disk::{DiskBackend, SECTOR_SIZE};
use crate::devices::virtio::{collect_chain, ChainError};
use crate::vstate::memory::GuestMemoryMmap;

pub const VIRTIO_BLK_T_IN: u32 = 0;
pub const VIRTIO_BLK_T_OUT: u32 = 1;
pub const VIRTIO_BLK_T_FLUSH: u32 = 4;
pub const VIRTIO_BLK_T_GET_ID: u32 = 8;
pub const VIRTIO_BLK_T_DISCARD: u32 = 11;
pub const VIRTIO_BLK_T_WRITE_ZEROES: u32 = 13;

pub const VIRTIO_BLK_S_OK: u8 = 0;
pub const VIRTIO_BLK_S_IOERR: u8 = 1;
pub const VIRTIO_BLK_S_UNSUPP: u8 = 2;

/// Length of the serial returned by GET_ID.
pub const VIRTIO_BLK_ID_BYTES: usize = 20;
/// `virtio_blk_discard_write_zeroes` segment size.
pub const SEGMENT_SIZE: usize = 16;
/// Discard / write-zeroes segments accepted per request (config space).
pub const MAX_DISCARD_SEG: u32 = 32;
/// Sectors per discard / write-zeroes segment (config space).
pub const MAX_DISCARD_SECTORS: u32 = 1 << 22; // 2 GiB
/// Flag of a write-zeroes segment: the device may unmap.
pub const WRITE_ZEROES_FLAG_UNMAP: u32 = 1;
/// Header size.
pub const HEADER_SIZE: u32 = 16;

/// Request type from the header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestType {
    In,
    Out,
    Flush,
    GetId,
    Discard,
    WriteZeroes,
    Unsupported(u32),
}

impl From<u32> for RequestType {
    fn from(t: u32) -> Self {
        match t {
            VIRTIO_BLK_T_IN => Self::In,
            VIRTIO_BLK_T_OUT => Self::Out,
            VIRTIO_BLK_T_FLUSH => Self::Flush,
            VIRTIO_BLK_T_GET_ID => Self::GetId,
            VIRTIO_BLK_T_DISCARD => Self::Discard,
            VIRTIO_BLK_T_WRITE_ZEROES => Self::WriteZeroes,
            t => Self::Unsupported(t),
        }
    }
}

/// Why a request cannot be completed (or cannot even be answered).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
    // --- fatal: no trustworthy status byte ---
    #[error("broken chain: {0}")]
    Chain(#[from] ChainError),
    #[error("last descriptor is not device-writable or empty")]
    NoStatusDescriptor,
    #[error("status byte at {0:#x} is outside guest memory")]
    StatusOutOfMemory(u64),
    // --- answered with a status ---
    #[error("header descriptor is device-writable")]
    HeaderWriteOnly,
    #[error("header descriptor has {0} bytes, need 16")]
    HeaderTooShort(u32),
    #[error("header at {0:#x} is outside guest memory")]
    HeaderOutOfMemory(u64),
    #[error("unsupported request type {0}")]
    UnsupportedType(u32),
    #[error("data descriptor has the wrong direction for this request")]
    DataDirection,
    #[error("data buffer {addr:#x}+{len:#x} is outside guest memory")]
    DataOutOfMemory { addr: u64, len: u32 },
    #[error("data length {0} is not a multiple of 512")]
    UnalignedLength(u64),
    #[error("sectors {sector}+{len} bytes are beyond the disk end {capacity:#x}")]
    OutOfDisk {
        sector: u64,
        len: u64,
        capacity: u64,
    },
    #[error("write to a read-only disk")]
    ReadOnly,
    #[error("bad discard/write-zeroes payload: {0}")]
    BadSegments(String),
    #[error("unsupported discard/write-zeroes flags {0:#x}")]
    UnsupportedFlags(u32),
    #[error("GET_ID needs one writable data descriptor")]
    BadGetId,
    #[error("disk I/O: {0}")]
    Io(String),
    #[error("{0} is not supported by the file system holding the disk")]
    BackendUnsupported(&'static str),
}

impl From<super::disk::DiskError> for RequestError {
    fn from(e: super::disk::DiskError) -> Self {
        match e {
            super::disk::DiskError::Unsupported(what) => Self::BackendUnsupported(what),
            e => Self::Io(e.to_string()),
        }
    }
}

impl RequestError {
    /// Status byte for an error the guest can be told about; `None` for fatal ones.
    pub fn status(&self) -> Option<u8> {
        match self {
            Self::Chain(_) | Self::NoStatusDescriptor | Self::StatusOutOfMemory(_) => None,
            Self::UnsupportedType(_) | Self::UnsupportedFlags(_) | Self::BackendUnsupported(_) => {
                Some(VIRTIO_BLK_S_UNSUPP)
            }
            _ => Some(VIRTIO_BLK_S_IOERR),
        }
    }
}

/// A parsed request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub req_type: RequestType,
    pub sector: u64,
    /// Data descriptors (between header and status), in order.
    pub data: Vec<(GuestAddress, u32, bool)>,
    /// Where the status byte goes.
    pub status_addr: GuestAddress,
}

/// Per-device facts request processing needs.
#[derive(Clone, Debug)]
pub struct BlockContext {
    /// GET_ID answer, zero-padded.
    pub id: [u8; VIRTIO_BLK_ID_BYTES],
}

fn in_memory(mem: &GuestMemoryMmap, addr: GuestAddress, len: u32) -> bool {
    len == 0 || mem.check_range(addr, len as usize)
}

/// Find the status byte; errors here are fatal.
fn status_of(mem: &GuestMemoryMmap, descs: &[Descriptor]) -> Result<GuestAddress, RequestError> {
    let last = descs.last().ok_or(RequestError::Chain(ChainError::Empty))?;
    if descs.len() < 2 || !last.is_write_only() || last.len() == 0 {
        return Err(RequestError::NoStatusDescriptor);
    }
    let addr = last
        .addr()
        .checked_add(u64::from(last.len()) - 1)
        .ok_or(RequestError::StatusOutOfMemory(last.addr().0))?;
    if !mem.check_range(addr, 1) {
        return Err(RequestError::StatusOutOfMemory(addr.0));
    }
    Ok(addr)
}

impl Request {
    /// Parse a chain's descriptors (already walked by [`collect_chain`]).
    /// `Err` with a `status()` means "answer with that status at
    /// `status_addr`", which `parse` also returns in that case.
    pub fn parse(
        mem: &GuestMemoryMmap,
        descs: &[Descriptor],
    ) -> Result<Request, (Option<GuestAddress>, RequestError)> {
        let status_addr = status_of(mem, descs).map_err(|e| (None, e))?;
        let fail = |e| (Some(status_addr), e);
        let hdr = descs[0];
        if hdr.is_write_only() {
            return Err(fail(RequestError::HeaderWriteOnly));
        }
        if hdr.len() < HEADER_SIZE {
            return Err(fail(RequestError::HeaderTooShort(hdr.len())));
        }
        let mut raw = [0u8; HEADER_SIZE as usize];
        mem.read_slice(&mut raw, hdr.addr())
            .map_err(|_| fail(RequestError::HeaderOutOfMemory(hdr.addr().0)))?;
        let t = u32::from_le_bytes(raw[0..4].try_into().expect("4 bytes"));
        let sector = u64::from_le_bytes(raw[8..16].try_into().expect("8 bytes"));
        let req_type = RequestType::from(t);
        let last = descs.len() - 1;
        let mut data = Vec::with_capacity(last.saturating_sub(1));
        for d in &descs[1..last] {
            if !in_memory(mem, d.addr(), d.len()) {
                return Err(fail(RequestError::DataOutOfMemory {
                    addr: d.addr().0,
                    len: d.len(),
                }));
            }
            data.push((d.addr(), d.len(), d.is_write_only()));
        }
        // The status descriptor may carry data before the status byte.
        let sd = descs[last];
        if sd.len() > 1 {
            if !in_memory(mem, sd.addr(), sd.len() - 1) {
                return Err(fail(RequestError::DataOutOfMemory {
                    addr: sd.addr().0,
                    len: sd.len(),
                }));
            }
            data.push((sd.addr(), sd.len() - 1, true));
        }
        let want_writable = match req_type {
            RequestType::In | RequestType::GetId => Some(true),
            RequestType::Out | RequestType::Discard | RequestType::WriteZeroes => Some(false),
            RequestType::Flush | RequestType::Unsupported(_) => None,
        };
        if let Some(w) = want_writable {
            if data.iter().any(|&(_, _, wr)| wr != w) {
                return Err(fail(RequestError::DataDirection));
            }
        }
        Ok(Request {
            req_type,
            sector,
            data,
            status_addr,
        })
    }

    fn data_len(&self) -> u64 {
        self.data.iter().map(|&(_, l, _)| u64::from(l)).sum()
    }

    fn check_disk_range(&self, disk: &dyn DiskBackend) -> Result<u64, RequestError> {
        let len = self.data_len();
        if !len.is_multiple_of(SECTOR_SIZE) {
            return Err(RequestError::UnalignedLength(len));
        }
        let cap = disk.capacity();
        let off = self.sector.checked_mul(SECTOR_SIZE);
        match off.and_then(|o| o.checked_add(len)) {
            Some(end) if end <= cap => Ok(off.expect("checked above")),
            _ => Err(RequestError::OutOfDisk {
                sector: self.sector,
                len,
                capacity: cap,
            }),
        }
    }

    /// Execute the request. Returns the number of bytes written into guest
    /// buffers (not counting the status byte).
    pub fn execute(
        &self,
        mem: &GuestMemoryMmap,
        disk: &mut dyn DiskBackend,
        ctx: &BlockContext,
    ) -> Result<u32, RequestError> {
        let io = RequestError::from;
        match self.req_type {
            RequestType::In => {
                let mut off = self.check_disk_range(disk)?;
                for &(addr, len, _) in &self.data {
                    let s = guest_slice(mem, addr, len)?;
                    disk.read_at(off, &s).map_err(io)?;
                    off += u64::from(len);
                }
                Ok(u32::try_from(self.data_len()).unwrap_or(u32::MAX))
            }
            RequestType::Out => {
                if disk.read_only() {
                    return Err(RequestError::ReadOnly);
                }
                let mut off = self.check_disk_range(disk)?;
                for &(addr, len, _) in &self.data {
                    let s = guest_slice(mem, addr, len)?;
                    disk.write_at(off, &s).map_err(io)?;
                    off += u64::from(len);
                }
                Ok(0)
            }
            RequestType::Flush => {
                disk.flush().map_err(io)?;
                Ok(0)
            }
            RequestType::GetId => {
                let &[(addr, len, _)] = self.data.as_slice() else {
                    return Err(RequestError::BadGetId);
                };
                let n = (len as usize).min(VIRTIO_BLK_ID_BYTES);
                mem.write_slice(&ctx.id[..n], addr)
                    .map_err(|_| RequestError::DataOutOfMemory { addr: addr.0, len })?;
                Ok(n as u32)
            }
            RequestType::Discard | RequestType::WriteZeroes => {
                if disk.read_only() {
                    return Err(RequestError::ReadOnly);
                }
                let segs = self.segments(mem, disk.capacity())?;
                for (sector, num, flags) in segs {
                    let (o, l) = (sector * SECTOR_SIZE, u64::from(num) * SECTOR_SIZE);
                    if self.req_type == RequestType::Discard {
                        if flags != 0 {
                            return Err(RequestError::UnsupportedFlags(flags));
                        }
                        disk.discard(o, l).map_err(io)?;
                    } else {
                        if flags & !WRITE_ZEROES_FLAG_UNMAP != 0 {
                            return Err(RequestError::UnsupportedFlags(flags));
                        }
                        disk.write_zeroes(o, l).map_err(io)?;
                    }
                }
                Ok(0)
            }
            RequestType::Unsupported(t) => Err(RequestError::UnsupportedType(t)),
        }
    }

    /// Read and validate every discard/write-zeroes segment before acting.
    fn segments(
        &self,
        mem: &GuestMemoryMmap,
        capacity: u64,
    ) -> Result<Vec<(u64, u32, u32)>, RequestError> {
        let len = self.data_len();
        let bad = |s: String| RequestError::BadSegments(s);
        if len == 0 || !len.is_multiple_of(SEGMENT_SIZE as u64) {
            return Err(bad(format!("payload of {len} bytes")));
        }
        let n = len / SEGMENT_SIZE as u64;
        if n > u64::from(MAX_DISCARD_SEG) {
            return Err(bad(format!("{n} segments, max {MAX_DISCARD_SEG}")));
        }
        let mut payload = Vec::with_capacity(len as usize);
        for &(addr, l, _) in &self.data {
            let start = payload.len();
            payload.resize(start + l as usize, 0);
            mem.read_slice(&mut payload[start..], addr).map_err(|_| {
                RequestError::DataOutOfMemory {
                    addr: addr.0,
                    len: l,
                }
            })?;
        }
        let mut out = Vec::with_capacity(n as usize);
        for seg in payload.chunks_exact(SEGMENT_SIZE) {
            let sector = u64::from_le_bytes(seg[0..8].try_into().expect("8 bytes"));
            let num = u32::from_le_bytes(seg[8..12].try_into().expect("4 bytes"));
            let flags = u32::from_le_bytes(seg[12..16].try_into().expect("4 bytes"));
            if num > MAX_DISCARD_SECTORS {
                return Err(bad(format!("{num} sectors, max {MAX_DISCARD_SECTORS}")));
            }
            let end = sector
                .checked_add(u64::from(num))
                .and_then(|e| e.checked_mul(SECTOR_SIZE));
            if end.is_none_or(|e| e > capacity) {
                return Err(RequestError::OutOfDisk {
                    sector,
                    len: u64::from(num) * SECTOR_SIZE,
                    capacity,
                });
            }
            out.push((sector, num, flags));
        }
        Ok(out)
    }
}

fn guest_slice(
    mem: &GuestMemoryMmap,
    addr: GuestAddress,
    len: u32,
) -> Result<vm_memory::VolatileSlice<'_, ()>, RequestError> {
    mem.get_slice(addr, len as usize)
        .map_err(|_| RequestError::DataOutOfMemory { addr: addr.0, len })
}

/// What processing one chain produced.
#[derive(Debug, PartialEq, Eq)]
pub enum ChainOutcome {
    /// Status written; put `len` (bytes written to the guest incl. status) in the used ring.
    Done { status: u8, len: u32 },
    /// The chain cannot be answered; the device needs a reset.
    Fatal(RequestError),
}

/// Executes a parsed request and writes its status byte (the I/O thread's part).
pub fn execute_and_answer(
    req: &Request,
    mem: &GuestMemoryMmap,
    disk: &mut dyn DiskBackend,
    ctx: &BlockContext,
) -> ChainOutcome {
    answer(mem, req.status_addr, req.execute(mem, disk, ctx))
}

/// Writes the status byte for `result` at `status_addr`.
fn answer(
    mem: &GuestMemoryMmap,
    status_addr: GuestAddress,
    result: Result<u32, RequestError>,
) -> ChainOutcome {
    let (status, written) = match result {
        Ok(n) => (VIRTIO_BLK_S_OK, n),
        Err(e) => {
            crate::guest_log!(log::Level::Warn, "virtio-blk: request failed: {e}");
            (e.status().unwrap_or(VIRTIO_BLK_S_IOERR), 0)
        }
    };
    if mem.write_obj(status, status_addr).is_err() {
        // Checked in parse; only reachable if memory vanished.
        return ChainOutcome::Fatal(RequestError::StatusOutOfMemory(status_addr.0));
    }
    ChainOutcome::Done {
        status,
        len: written.saturating_add(1),
    }
}

/// One chain taken from the available ring by [`pop_request`].
#[derive(Debug, PartialEq, Eq)]
pub enum Popped {
    /// A well-formed request, to be executed (on the I/O thread) and completed as `head`.
    Request { head: u16, req: Request },
    /// A malformed request already answered with an error status: complete `head` with `len`.
    Answered { head: u16, len: u32 },
    /// A chain without a usable status byte, or unusable rings: the device needs a reset.
    Fatal(String),
}

/// Takes the next available chain of `queue` and parses it; `None` when none is available.
/// Requests that parse are returned for execution; malformed ones with a usable status byte
/// are answered here (nothing touches the disk).
pub fn pop_request(queue: &mut Queue, mem: &GuestMemoryMmap) -> Option<Popped> {
    let chain = match queue.iter(mem) {
        Ok(mut it) => it.next()?,
        Err(e) => return Some(Popped::Fatal(format!("available ring: {e}"))),
    };
    let head = chain.head_index();
    let descs = match collect_chain(chain) {
        Ok(d) => d,
        Err(e) => return Some(Popped::Fatal(format!("chain {head}: {e}"))),
    };
    Some(match Request::parse(mem, &descs) {
        Ok(req) => Popped::Request { head, req },
        Err((Some(addr), e)) => match answer(mem, addr, Err(e)) {
            ChainOutcome::Done { len, .. } => Popped::Answered { head, len },
            ChainOutcome::Fatal(e) => Popped::Fatal(format!("chain {head}: {e}")),
        },
        Err((None, e)) => Popped::Fatal(format!("chain {head}: {e}")),
    })
}

/// Result of draining a queue.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct QueueOutcome {
    /// Chains put in the used ring.
    pub used: u32,
    /// Set when processing stopped on a guest error that needs a device reset.
    pub fatal: Option<String>,
}

impl std::ops::AddAssign for QueueOutcome {
    fn add_assign(&mut self, o: Self) {
        self.used += o.used;
        if self.fatal.is_none() {
            self.fatal = o.fatal;
        }
    }
}

impl crate::devices::virtio::notify::PassResult for QueueOutcome {
    fn stop(&self) -> bool {
        self.fatal.is_some()
    }
}

/// Process every available chain of `queue` against `disk` synchronously, on the calling
/// thread (the device does the same in two halves: [`pop_request`] on the event loop,
/// [`execute_and_answer`] on its I/O thread). Stops at the first fatal error (the caller marks
/// the device NEEDS_RESET).
pub fn process_queue(
    queue: &mut Queue,
    mem: &GuestMemoryMmap,
    disk: &mut dyn DiskBackend,
    ctx: &BlockContext,
) -> QueueOutcome {
    let mut out = QueueOutcome::default();
    while let Some(p) = pop_request(queue, mem) {
        let (head, len) = match p {
            Popped::Request { head, req } => match execute_and_answer(&req, mem, disk, ctx) {
                ChainOutcome::Done { len, .. } => (head, len),
                ChainOutcome::Fatal(e) => {
                    out.fatal = Some(format!("chain {head}: {e}"));
                    break;
                }
            },
            Popped::Answered { head, len } => (head, len),
            Popped::Fatal(f) => {
                out.fatal = Some(f);
                break;
            }
        };
        if let Err(e) = queue.add_used(mem, head, len) {
            out.fatal = Some(format!("cannot complete chain {head}: {e}"));
            break;
        }
        out.used += 1;
    }
    if let Some(f) = &out.fatal {
        crate::guest_log!(log::Level::Error, "virtio-blk: {f}; device needs reset");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::block::disk::MemDisk;
    use crate::devices::virtio::test_utils::{mem, TestQueue, F_INDIRECT, F_NEXT, F_WRITE};

    const HDR: u64 = 0x10000;
    const DATA: u64 = 0x20000;
    const STATUS: u64 = 0x30000;
    const OOB: u64 = 0x7_0000_0000;

    struct Env {
        mem: GuestMemoryMmap,
        disk: MemDisk,
        ctx: BlockContext,
    }

    impl Env {
        fn new(ro: bool) -> Self {
            let mut id = [0u8; 20];
            id[..6].copy_from_slice(b"disk-7");
            Env {
                mem: mem(),
                disk: MemDisk::new(1 << 20, ro),
                ctx: BlockContext { id },
            }
        }
        fn header(&self, addr: u64, t: u32, sector: u64) {
            let mut h = [0u8; 16];
            h[0..4].copy_from_slice(&t.to_le_bytes());
            h[8..16].copy_from_slice(&sector.to_le_bytes());
            self.mem.write_slice(&h, GuestAddress(addr)).unwrap();
        }
        fn status(&self) -> u8 {
            self.mem.read_obj(GuestAddress(STATUS)).unwrap()
        }
        /// Run the queue; return (outcome, status byte).
        fn run(&mut self, tq: &TestQueue, q: &mut Queue) -> QueueOutcome {
            self.mem.write_obj(0xeeu8, GuestAddress(STATUS)).unwrap();
            let _ = tq;
            process_queue(q, &self.mem, &mut self.disk, &self.ctx)
        }
        /// One request: header, data descriptors, status. Returns (outcome, status, used len).
        fn one(
            &mut self,
            t: u32,
            sector: u64,
            data: &[(u64, u32, bool)],
        ) -> (QueueOutcome, u8, u32) {
            let m = self.mem.clone();
            let mut tq = TestQueue::new(&m, 0x1000, 16);
            self.header(HDR, t, sector);
            let mut descs = vec![(HDR, 16, false)];
            descs.extend_from_slice(data);
            descs.push((STATUS, 1, true));
            tq.add_chain(&descs);
            let mut q = tq.queue();
            let out = self.run(&tq, &mut q);
            let len = if tq.used_idx() > 0 {
                tq.used(0).1
            } else {
                u32::MAX
            };
            (out, self.status(), len)
        }
    }

    fn done(used: u32) -> QueueOutcome {
        QueueOutcome { used, fatal: None }
    }

    #[test]
    fn write_flush_read_back() {
        let mut e = Env::new(false);
        let pattern: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
        e.mem.write_slice(&pattern, GuestAddress(DATA)).unwrap();
        // Write split over two descriptors, one of them not sector-sized.
        let r = e.one(
            VIRTIO_BLK_T_OUT,
            3,
            &[(DATA, 4000, false), (DATA + 4000, 4192, false)],
        );
        assert_eq!(r, (done(1), VIRTIO_BLK_S_OK, 1));
        assert_eq!(&e.disk.data[3 * 512..3 * 512 + 8192], &pattern[..]);
        assert_eq!(
            e.one(VIRTIO_BLK_T_FLUSH, 0, &[]),
            (done(1), VIRTIO_BLK_S_OK, 1)
        );
        assert_eq!(e.disk.flushes, 1);
        let r = e.one(VIRTIO_BLK_T_IN, 3, &[(DATA + 0x10000, 8192, true)]);
        assert_eq!(r, (done(1), VIRTIO_BLK_S_OK, 8193));
        let mut back = vec![0u8; 8192];
        e.mem
            .read_slice(&mut back, GuestAddress(DATA + 0x10000))
            .unwrap();
        assert_eq!(back, pattern);
    }

    #[test]
    fn get_id_returns_the_serial() {
        let mut e = Env::new(true);
        let r = e.one(VIRTIO_BLK_T_GET_ID, 0, &[(DATA, 20, true)]);
        assert_eq!(r, (done(1), VIRTIO_BLK_S_OK, 21));
        let mut id = [0u8; 20];
        e.mem.read_slice(&mut id, GuestAddress(DATA)).unwrap();
        assert_eq!(&id[..7], b"disk-7\0");
        // Shorter buffer gets a truncated id; two buffers are refused.
        assert_eq!(e.one(VIRTIO_BLK_T_GET_ID, 0, &[(DATA, 4, true)]).2, 5);
        let r = e.one(
            VIRTIO_BLK_T_GET_ID,
            0,
            &[(DATA, 10, true), (DATA + 10, 10, true)],
        );
        assert_eq!(r.1, VIRTIO_BLK_S_IOERR);
    }

    #[test]
    fn read_only_disk_refuses_writes_discard_and_zeroes() {
        let mut e = Env::new(true);
        e.disk.data.fill(0x33);
        e.mem.write_slice(&[0u8; 512], GuestAddress(DATA)).unwrap();
        assert_eq!(
            e.one(VIRTIO_BLK_T_OUT, 0, &[(DATA, 512, false)]),
            (done(1), VIRTIO_BLK_S_IOERR, 1)
        );
        let seg = [0u8, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0];
        e.mem.write_slice(&seg, GuestAddress(DATA)).unwrap();
        assert_eq!(
            e.one(VIRTIO_BLK_T_DISCARD, 0, &[(DATA, 16, false)]).1,
            VIRTIO_BLK_S_IOERR
        );
        assert_eq!(
            e.one(VIRTIO_BLK_T_WRITE_ZEROES, 0, &[(DATA, 16, false)]).1,
            VIRTIO_BLK_S_IOERR
        );
        assert!(e.disk.data.iter().all(|&b| b == 0x33));
        // Reads and flushes still work.
        assert_eq!(
            e.one(VIRTIO_BLK_T_IN, 0, &[(DATA, 512, true)]).1,
            VIRTIO_BLK_S_OK
        );
        assert_eq!(e.one(VIRTIO_BLK_T_FLUSH, 0, &[]).1, VIRTIO_BLK_S_OK);
    }

    #[test]
    fn discard_and_write_zeroes() {
        let mut e = Env::new(false);
        e.disk.data.fill(0x44);
        let mut segs = Vec::new();
        for (sector, num, flags) in [(2u64, 2u32, 0u32), (10, 1, 0)] {
            segs.extend_from_slice(&sector.to_le_bytes());
            segs.extend_from_slice(&num.to_le_bytes());
            segs.extend_from_slice(&flags.to_le_bytes());
        }
        e.mem.write_slice(&segs, GuestAddress(DATA)).unwrap();
        assert_eq!(
            e.one(VIRTIO_BLK_T_DISCARD, 0, &[(DATA, 32, false)]).1,
            VIRTIO_BLK_S_OK
        );
        assert!(e.disk.data[1024..2048].iter().all(|&b| b == 0));
        assert!(e.disk.data[2048..5120].iter().all(|&b| b == 0x44));
        assert!(e.disk.data[5120..5632].iter().all(|&b| b == 0));
        e.mem.write_slice(&[0u8; 32], GuestAddress(DATA)).unwrap();
        let unmap = [0u8, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0];
        e.mem.write_slice(&unmap, GuestAddress(DATA)).unwrap();
        assert_eq!(
            e.one(VIRTIO_BLK_T_WRITE_ZEROES, 0, &[(DATA, 16, false)]).1,
            VIRTIO_BLK_S_OK
        );
        assert!(e.disk.data[..512].iter().all(|&b| b == 0));
        // The UNMAP flag is not valid for discard.
        assert_eq!(
            e.one(VIRTIO_BLK_T_DISCARD, 0, &[(DATA, 16, false)]).1,
            VIRTIO_BLK_S_UNSUPP
        );
    }

    #[test]
    fn bad_discard_payloads_get_ioerr() {
        let mut e = Env::new(false);
        // Not a multiple of 16 bytes.
        assert_eq!(
            e.one(VIRTIO_BLK_T_DISCARD, 0, &[(DATA, 15, false)]).1,
            VIRTIO_BLK_S_IOERR
        );
        // Empty.
        assert_eq!(e.one(VIRTIO_BLK_T_DISCARD, 0, &[]).1, VIRTIO_BLK_S_IOERR);
        // Too many segments.
        e.mem
            .write_slice(&vec![0u8; 16 * 33], GuestAddress(DATA))
            .unwrap();
        assert_eq!(
            e.one(VIRTIO_BLK_T_DISCARD, 0, &[(DATA, 16 * 33, false)]).1,
            VIRTIO_BLK_S_IOERR
        );
        // Beyond the disk, overflowing, too many sectors.
        for (sector, num) in [(2047u64, 2u32), (u64::MAX, 1), (0, MAX_DISCARD_SECTORS + 1)] {
            let mut seg = sector.to_le_bytes().to_vec();
            seg.extend_from_slice(&num.to_le_bytes());
            seg.extend_from_slice(&0u32.to_le_bytes());
            e.mem.write_slice(&seg, GuestAddress(DATA)).unwrap();
            assert_eq!(
                e.one(VIRTIO_BLK_T_WRITE_ZEROES, 0, &[(DATA, 16, false)]).1,
                VIRTIO_BLK_S_IOERR
            );
        }
    }

    #[test]
    fn malformed_requests_get_an_error_status() {
        let mut e = Env::new(false);
        // Unknown type.
        assert_eq!(e.one(77, 0, &[]), (done(1), VIRTIO_BLK_S_UNSUPP, 1));
        // Data outside guest memory (the "hostile" request).
        assert_eq!(
            e.one(VIRTIO_BLK_T_IN, 0, &[(OOB, 512, true)]),
            (done(1), VIRTIO_BLK_S_IOERR, 1)
        );
        assert_eq!(
            e.one(VIRTIO_BLK_T_OUT, 0, &[(OOB, 512, false)]).1,
            VIRTIO_BLK_S_IOERR
        );
        // Buffer straddling the end of guest memory.
        assert_eq!(
            e.one(VIRTIO_BLK_T_IN, 0, &[((16 << 20) - 256, 512, true)])
                .1,
            VIRTIO_BLK_S_IOERR
        );
        // Wrong directions.
        assert_eq!(
            e.one(VIRTIO_BLK_T_IN, 0, &[(DATA, 512, false)]).1,
            VIRTIO_BLK_S_IOERR
        );
        assert_eq!(
            e.one(VIRTIO_BLK_T_OUT, 0, &[(DATA, 512, true)]).1,
            VIRTIO_BLK_S_IOERR
        );
        assert_eq!(
            e.one(VIRTIO_BLK_T_GET_ID, 0, &[(DATA, 20, false)]).1,
            VIRTIO_BLK_S_IOERR
        );
        // Absurd sizes: not sector multiples, beyond the disk, sector overflow, 4 GiB.
        assert_eq!(
            e.one(VIRTIO_BLK_T_IN, 0, &[(DATA, 100, true)]).1,
            VIRTIO_BLK_S_IOERR
        );
        assert_eq!(
            e.one(VIRTIO_BLK_T_IN, 2047, &[(DATA, 1024, true)]).1,
            VIRTIO_BLK_S_IOERR
        );
        assert_eq!(
            e.one(VIRTIO_BLK_T_OUT, u64::MAX / 256, &[(DATA, 512, false)])
                .1,
            VIRTIO_BLK_S_IOERR
        );
        assert_eq!(
            e.one(VIRTIO_BLK_T_IN, 0, &[(0, u32::MAX - 511, true)]).1,
            VIRTIO_BLK_S_IOERR
        );
        assert!(e.disk.data.iter().all(|&b| b == 0));
    }

    #[test]
    fn malformed_headers_get_ioerr() {
        let e = Env::new(false);
        let m = e.mem.clone();
        let mut e = e;
        for (hdr_addr, hdr_len, hdr_w) in [
            (HDR, 8u32, false),
            (HDR, 16, true),
            (OOB, 16, false),
            (u64::MAX - 4, 16, false),
        ] {
            let mut tq = TestQueue::new(&m, 0x1000, 16);
            e.header(HDR, VIRTIO_BLK_T_IN, 0);
            tq.add_chain(&[
                (hdr_addr, hdr_len, hdr_w),
                (DATA, 512, true),
                (STATUS, 1, true),
            ]);
            let mut q = tq.queue();
            assert_eq!(e.run(&tq, &mut q), done(1));
            assert_eq!(
                e.status(),
                VIRTIO_BLK_S_IOERR,
                "{hdr_addr:#x} {hdr_len} {hdr_w}"
            );
        }
    }

    fn fatal(e: &mut Env, tq: &TestQueue) {
        let mut q = tq.queue();
        let out = e.run(tq, &mut q);
        assert_eq!(out.used, 0);
        assert!(out.fatal.is_some());
        assert_eq!(tq.used_idx(), 0);
        assert_eq!(e.status(), 0xee, "status must not be written");
    }

    #[test]
    fn broken_chains_are_fatal() {
        let mut e = Env::new(false);
        let m = e.mem.clone();
        e.header(HDR, VIRTIO_BLK_T_IN, 0);
        // Descriptor loop: 0 -> 1 -> 0.
        let tq = TestQueue::new(&m, 0x1000, 16);
        tq.set_desc(0, HDR, 16, F_NEXT, 1);
        tq.set_desc(1, DATA, 512, F_NEXT | F_WRITE, 0);
        tq.push_avail(0);
        fatal(&mut e, &tq);
        // Self loop.
        let tq = TestQueue::new(&m, 0x1000, 16);
        tq.set_desc(0, HDR, 16, F_NEXT, 0);
        tq.push_avail(0);
        fatal(&mut e, &tq);
        // Chain longer than the queue: all 4 descriptors used and the last still says NEXT.
        let tq = TestQueue::new(&m, 0x1000, 4);
        for i in 0..4 {
            tq.set_desc(i, DATA, 512, F_NEXT | F_WRITE, i + 1);
        }
        tq.push_avail(0);
        fatal(&mut e, &tq);
        // Next index outside the table.
        let tq = TestQueue::new(&m, 0x1000, 16);
        tq.set_desc(0, HDR, 16, F_NEXT, 200);
        tq.push_avail(0);
        fatal(&mut e, &tq);
        // Head index outside the table.
        let tq = TestQueue::new(&m, 0x1000, 16);
        tq.push_avail(300);
        fatal(&mut e, &tq);
        // Available index runs ahead by more than the queue size.
        let tq = TestQueue::new(&m, 0x1000, 16);
        tq.set_avail_idx(17);
        fatal(&mut e, &tq);
        // Indirect table outside guest memory.
        let tq = TestQueue::new(&m, 0x1000, 16);
        tq.set_desc(0, OOB, 64, F_INDIRECT, 0);
        tq.push_avail(0);
        fatal(&mut e, &tq);
    }

    #[test]
    fn missing_or_unusable_status_is_fatal() {
        let mut e = Env::new(false);
        let m = e.mem.clone();
        e.header(HDR, VIRTIO_BLK_T_FLUSH, 0);
        // Single descriptor (header only).
        let mut tq = TestQueue::new(&m, 0x1000, 16);
        tq.add_chain(&[(HDR, 16, false)]);
        fatal(&mut e, &tq);
        // Last descriptor device-readable.
        let mut tq = TestQueue::new(&m, 0x1000, 16);
        tq.add_chain(&[(HDR, 16, false), (STATUS, 1, false)]);
        fatal(&mut e, &tq);
        // Zero-length status.
        let mut tq = TestQueue::new(&m, 0x1000, 16);
        tq.add_chain(&[(HDR, 16, false), (STATUS, 0, true)]);
        fatal(&mut e, &tq);
        // Status outside guest memory.
        let mut tq = TestQueue::new(&m, 0x1000, 16);
        tq.add_chain(&[(HDR, 16, false), (OOB, 1, true)]);
        fatal(&mut e, &tq);
        let mut tq = TestQueue::new(&m, 0x1000, 16);
        tq.add_chain(&[(HDR, 16, false), (u64::MAX, 2, true)]);
        fatal(&mut e, &tq);
    }

    #[test]
    fn several_requests_in_order_and_fatal_stops_the_pass() {
        let mut e = Env::new(false);
        let m = e.mem.clone();
        e.header(HDR, VIRTIO_BLK_T_FLUSH, 0);
        e.header(HDR + 16, 99, 0);
        let mut tq = TestQueue::new(&m, 0x1000, 16);
        let a = tq.add_chain(&[(HDR, 16, false), (STATUS, 1, true)]);
        let b = tq.add_chain(&[(HDR + 16, 16, false), (STATUS + 1, 1, true)]);
        tq.add_chain(&[(HDR, 16, false)]); // fatal
        tq.add_chain(&[(HDR, 16, false), (STATUS + 2, 1, true)]); // never reached
        let mut q = tq.queue();
        let out = e.run(&tq, &mut q);
        assert_eq!(out.used, 2);
        assert!(out.fatal.is_some());
        assert_eq!(tq.used(0), (u32::from(a), 1));
        assert_eq!(tq.used(1), (u32::from(b), 1));
        assert_eq!(
            m.read_obj::<u8>(GuestAddress(STATUS + 1)).unwrap(),
            VIRTIO_BLK_S_UNSUPP
        );
    }

    #[test]
    fn status_descriptor_may_carry_read_data() {
        let mut e = Env::new(false);
        e.disk.data[..512].fill(0x61);
        let m = e.mem.clone();
        e.header(HDR, VIRTIO_BLK_T_IN, 0);
        let mut tq = TestQueue::new(&m, 0x1000, 16);
        tq.add_chain(&[(HDR, 16, false), (DATA, 513, true)]);
        let mut q = tq.queue();
        assert_eq!(e.run(&tq, &mut q), done(1));
        assert_eq!(tq.used(0).1, 513);
        assert_eq!(m.read_obj::<u8>(GuestAddress(DATA + 511)).unwrap(), 0x61);
        assert_eq!(
            m.read_obj::<u8>(GuestAddress(DATA + 512)).unwrap(),
            VIRTIO_BLK_S_OK
        );
    }
}
