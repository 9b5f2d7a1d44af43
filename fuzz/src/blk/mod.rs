//! `blk_raw` and `blk_overlay`: a real [`BlockDevice`] over a raw image file (read-write or
//! read-only) or a base image plus copy-on-write overlay, in temporary files, driven through its
//! request queue by a driver model.
//!
//! The input is a sequence of operations: build a request (read, write, flush, get-id, discard,
//! write-zeroes, an unknown type; sectors near and past the end; data split over several
//! descriptors; at most one deliberate mistake such as a writable header, a short header, a
//! data buffer with the wrong direction or outside guest memory, or a missing status
//! descriptor), kick the queue, reset the device, reopen the backend, or scribble over guest
//! memory.
//!
//! Checked after every kick (the "oracle"):
//! - each chain completes once (in any order: malformed ones are answered at once, the others
//!   by the device's I/O thread), with the status the virtio-blk rules give for it (OK,
//!   IOERR or UNSUPP) and the used length (data read + status byte); chains with no usable status
//!   byte stop the queue and set NEEDS_RESET, and nothing completes afterwards until a reset;
//! - reads return exactly what a byte model of the disk holds (the image's initial pattern,
//!   then every successful write, discard and write-zeroes);
//! - the device writes guest memory only inside the writable buffers of the chains it completed
//!   and the used ring, and raises the used-buffer interrupt when it completed chains.
//!
//! At the end: a read-write image file holds the model, bytes past the last whole sector are
//! untouched, a read-only image is byte-for-byte unchanged; for overlays the base is unchanged
//! and, after the overlay is closed and reopened, every sector reads back as the model says.
//! After a scribble the model only keeps these end checks (and forgets sector contents) until
//! the next reset.

use std::collections::{HashMap, VecDeque};
use std::fs;
use std::path::PathBuf;

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};
use vmm::devices::interrupt::IrqLine;
use vmm::devices::virtio::block::disk::{DiskBackend, RawFile, SECTOR_SIZE};
use vmm::devices::virtio::block::overlay::Overlay;
use vmm::devices::virtio::block::request::{
    MAX_DISCARD_SECTORS, MAX_DISCARD_SEG, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP,
    VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN,
    VIRTIO_BLK_T_OUT, VIRTIO_BLK_T_WRITE_ZEROES,
};
use vmm::devices::virtio::block::BlockDevice;
use vmm::devices::virtio::{VirtioDevice, INT_CONFIG, INT_VRING, VIRTIO_F_VERSION_1};
use vmm::vstate::memory::GuestMemoryMmap;

use crate::driver::{
    assert_writes_within, bad_address, guest_memory, slot_area, writable_ranges, Buf, MemSnapshot,
    SplitQueue, SLOT,
};
use crate::input::Input;
use crate::scratch;

/// Which backend the target runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Raw,
    Overlay,
}

const MAX_OPS: usize = 160;
const SECTOR: u64 = SECTOR_SIZE;
/// GET_ID answer of the device under test.
pub const SERIAL: [u8; 20] = *b"fuzz-serial-0123456\0";

/// Request kinds the builder makes (op byte values, see `seeds.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    In,
    Out,
    Flush,
    GetId,
    Discard,
    WriteZeroes,
    Other(u32),
}

impl Kind {
    pub fn from_sel(sel: u8, other: u32) -> Self {
        match sel % 7 {
            0 => Kind::In,
            1 => Kind::Out,
            2 => Kind::Flush,
            3 => Kind::GetId,
            4 => Kind::Discard,
            5 => Kind::WriteZeroes,
            _ => Kind::Other(match other {
                VIRTIO_BLK_T_IN
                | VIRTIO_BLK_T_OUT
                | VIRTIO_BLK_T_FLUSH
                | VIRTIO_BLK_T_GET_ID
                | VIRTIO_BLK_T_DISCARD
                | VIRTIO_BLK_T_WRITE_ZEROES => 2, // reserved, unsupported
                t => t,
            }),
        }
    }

    fn code(self) -> u32 {
        match self {
            Kind::In => VIRTIO_BLK_T_IN,
            Kind::Out => VIRTIO_BLK_T_OUT,
            Kind::Flush => VIRTIO_BLK_T_FLUSH,
            Kind::GetId => VIRTIO_BLK_T_GET_ID,
            Kind::Discard => VIRTIO_BLK_T_DISCARD,
            Kind::WriteZeroes => VIRTIO_BLK_T_WRITE_ZEROES,
            Kind::Other(t) => t,
        }
    }

    fn device_writes_data(self) -> bool {
        matches!(self, Kind::In | Kind::GetId)
    }
}

/// The one deliberate mistake a request may carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mistake {
    None,
    HeaderWritable,
    HeaderShort(u32),
    /// One data buffer (not the one holding the status) has the wrong direction.
    WrongDirection,
    /// One data buffer is outside guest memory (selector for [`bad_address`]).
    DataOutside(u8),
    /// The last descriptor is device-readable: no status byte can be written.
    StatusReadOnly,
    /// The status byte is outside guest memory.
    StatusOutside,
}

impl Mistake {
    pub fn from_sel(sel: u8, arg: u8) -> Self {
        match sel {
            0..=191 => Mistake::None,
            192..=199 => Mistake::HeaderWritable,
            200..=207 => Mistake::HeaderShort(u32::from(arg % 16)),
            208..=223 => Mistake::WrongDirection,
            224..=239 => Mistake::DataOutside(arg),
            240..=247 => Mistake::StatusReadOnly,
            _ => Mistake::StatusOutside,
        }
    }
}

/// A request the driver made available.
#[derive(Clone, Debug)]
struct Pending {
    kind: Kind,
    sector: u64,
    /// Data buffers (including the data part of a status descriptor that carries data).
    data: Vec<Buf>,
    /// Bytes written for OUT (concatenated data).
    out_data: Vec<u8>,
    /// Discard / write-zeroes segments `(sector, sectors, flags)` as sent.
    segments: Vec<(u64, u32, u32)>,
    /// Discard / write-zeroes payload length in bytes (may be malformed).
    payload_len: u64,
    status_addr: u64,
    mistake: Mistake,
}

impl Pending {
    fn data_len(&self) -> u64 {
        self.data.iter().map(|b| u64::from(b.len)).sum()
    }
}

/// What the model says a request must do.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Expect {
    /// No usable status byte: the queue stops, the device needs a reset.
    Fatal,
    /// One of these statuses (more than one only where a mistake makes the outcome depend on how
    /// guest memory is mapped).
    Status(Vec<u8>),
}

/// Sector-granular model of the disk contents.
struct Model {
    data: Vec<u8>,
    known: Vec<bool>,
}

impl Model {
    fn capacity(&self) -> u64 {
        self.data.len() as u64
    }

    fn sectors(&self, off: u64, len: u64) -> std::ops::Range<usize> {
        let first = (off / SECTOR) as usize;
        let end = (off.saturating_add(len).min(self.capacity())).div_ceil(SECTOR) as usize;
        first.min(end)..end
    }

    /// Compare `got`, read at `off`, with the model; learn sectors the model had forgotten.
    fn check_read(&mut self, off: u64, got: &[u8], what: &str) {
        for s in self.sectors(off, got.len() as u64) {
            let a = s * SECTOR as usize;
            let g = &got[a - off as usize..a - off as usize + SECTOR as usize];
            if self.known[s] {
                if g != &self.data[a..a + SECTOR as usize] {
                    let i = g
                        .iter()
                        .zip(&self.data[a..])
                        .position(|(x, y)| x != y)
                        .unwrap_or(0);
                    panic!(
                        "{what}: sector {s} byte {i} reads {:#04x}, but the disk model holds {:#04x}",
                        g[i],
                        self.data[a + i]
                    );
                }
            } else {
                self.data[a..a + SECTOR as usize].copy_from_slice(g);
                self.known[s] = true;
            }
        }
    }

    fn write(&mut self, off: u64, bytes: &[u8]) {
        let off = off as usize;
        self.data[off..off + bytes.len()].copy_from_slice(bytes);
        for s in self.sectors(off as u64, bytes.len() as u64) {
            self.known[s] = true;
        }
    }

    fn zero(&mut self, off: u64, len: u64) {
        let (o, l) = (off as usize, len as usize);
        self.data[o..o + l].fill(0);
        for s in self.sectors(off, len) {
            self.known[s] = true;
        }
    }

    fn forget(&mut self, off: u64, len: u64) {
        for s in self.sectors(off, len) {
            self.known[s] = false;
        }
    }

    fn forget_all(&mut self) {
        self.known.fill(false);
    }
}

/// Initial image contents: every sector distinct, so a read of the wrong sector shows.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ ((i >> 9) as u8).wrapping_mul(7) ^ seed)
        .collect()
}

fn write_pattern(len: usize, seed: u8, salt: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i + salt) as u8).wrapping_mul(13) ^ seed ^ 0x5a)
        .collect()
}

struct Files {
    image: PathBuf,
    overlay: PathBuf,
    original: Vec<u8>,
}

fn open_backend(backend: Backend, ro: bool, f: &Files) -> Box<dyn DiskBackend> {
    match backend {
        Backend::Raw => Box::new(RawFile::open(&f.image, ro).expect("open the raw image")),
        Backend::Overlay => {
            Box::new(Overlay::open(&f.image, &f.overlay).expect("open the overlay"))
        }
    }
}

fn new_device(disk: Box<dyn DiskBackend>) -> BlockDevice {
    BlockDevice::new(disk, SERIAL, IrqLine::new(5).expect("eventfd")).expect("block device")
}

fn activate(dev: &mut BlockDevice, mem: &GuestMemoryMmap, q: &SplitQueue) {
    dev.set_acked_features(1 << VIRTIO_F_VERSION_1);
    dev.activate(mem.clone(), vec![q.device_queue()])
        .expect("activation with a valid queue");
}

/// The whole run state of one input.
struct Run {
    backend: Backend,
    ro: bool,
    files: Files,
    mem: GuestMemoryMmap,
    dev: Option<BlockDevice>,
    q: SplitQueue,
    qsize: u16,
    model: Model,
    pending: HashMap<u16, Pending>,
    /// Heads in the order they were made available.
    order: VecDeque<u16>,
    /// The device hit a chain without a usable status byte and waits for a reset.
    broken: bool,
    /// Guest memory was scribbled over since the last reset.
    tainted: bool,
    salt: usize,
}

pub fn run(data: &[u8], backend: Backend) {
    let mut inp = Input::new(data);
    let cfg = inp.u8();
    let ro = backend == Backend::Raw && cfg & 1 == 1;
    let sectors = 1 + inp.below(96) as usize;
    let tail = if cfg & 2 != 0 {
        inp.below(512) as usize
    } else {
        0
    };
    let seed = inp.u8();
    let qsize = 4u16 << inp.below(5);
    let dir = scratch::dir(usize::from(cfg >> 2 & 1));
    let files = Files {
        image: dir.join(scratch::file_name(if backend == Backend::Raw {
            "raw.img"
        } else {
            "base.img"
        })),
        overlay: dir.join(scratch::file_name("overlay.img")),
        original: pattern(sectors * SECTOR as usize + tail, seed),
    };
    fs::write(&files.image, &files.original).expect("write the image");
    if backend == Backend::Overlay {
        let _ = fs::remove_file(&files.overlay);
    }
    let mem = guest_memory();
    let q = SplitQueue::new(&mem, 0, qsize);
    let mut dev = new_device(open_backend(backend, ro, &files));
    activate(&mut dev, &mem, &q);
    let cap = sectors * SECTOR as usize;
    let mut run = Run {
        backend,
        ro,
        model: Model {
            data: files.original[..cap].to_vec(),
            known: vec![true; sectors],
        },
        files,
        mem,
        dev: Some(dev),
        q,
        qsize,
        pending: HashMap::new(),
        order: VecDeque::new(),
        broken: false,
        tainted: false,
        salt: 0,
    };
    for _ in 0..MAX_OPS {
        if inp.is_empty() {
            break;
        }
        match inp.u8() % 8 {
            0..=2 => run.request(&mut inp),
            3 | 4 => run.kick(),
            5 => run.reset(),
            6 => run.reopen(),
            _ => run.scribble(&mut inp),
        }
    }
    run.kick();
    run.finish();
}

impl Run {
    fn dev(&mut self) -> &mut BlockDevice {
        self.dev.as_mut().expect("device present")
    }

    fn sector(&mut self, inp: &mut Input) -> u64 {
        let cap = self.model.capacity() / SECTOR;
        match inp.u8() % 8 {
            0..=3 => u64::from(inp.u8()) % (cap + 1),
            4 => cap.saturating_sub(u64::from(inp.u8() % 4)),
            5 => cap + u64::from(inp.u8() % 4),
            6 => u64::MAX - u64::from(inp.u8() % 4),
            _ => inp.u64(),
        }
    }

    /// Build one request and make it available (not yet published).
    fn request(&mut self, inp: &mut Input) {
        let kind = Kind::from_sel(inp.u8(), inp.u32());
        let sel = inp.u8();
        let mistake = Mistake::from_sel(sel, inp.u8());
        let sector = self.sector(inp);
        // Data buffers (lengths), before placement.
        let mut lens: Vec<u32> = Vec::new();
        let mut segments = Vec::new();
        let mut payload: Vec<u8> = Vec::new();
        match kind {
            Kind::In | Kind::Out | Kind::Other(_) | Kind::Flush => {
                let nsec = u32::from(inp.u8() % 9);
                let mut total = nsec * SECTOR as u32;
                if inp.u8() >= 240 {
                    total += 1 + u32::from(inp.u8()); // not a whole number of sectors
                }
                if kind == Kind::Flush && inp.u8() >= 32 {
                    total = 0;
                }
                split(inp, total, &mut lens);
            }
            Kind::GetId => {
                let n = 1 + inp.u8() % 4;
                let n = if n > 2 { 1 } else { n }; // mostly one buffer, sometimes two or none
                let n = if inp.u8() >= 248 { 0 } else { n };
                for _ in 0..n {
                    lens.push(u32::from(inp.u8() % 40));
                }
            }
            Kind::Discard | Kind::WriteZeroes => {
                let b = inp.u8();
                let nseg = match b {
                    0..=239 => 1 + u32::from(b % 4),
                    240..=247 => MAX_DISCARD_SEG + 1,
                    _ => 0,
                };
                let cap = self.model.capacity() / SECTOR;
                for _ in 0..nseg {
                    let s = match inp.u8() % 4 {
                        0..=2 => u64::from(inp.u8()) % (cap + 1),
                        _ => self.sector(inp),
                    };
                    let num = match inp.u8() {
                        0..=239 => u32::from(inp.u8() % 9),
                        240..=247 => MAX_DISCARD_SECTORS + 1,
                        _ => inp.u32(),
                    };
                    let flags = match inp.u8() {
                        0..=191 => 0,
                        192..=239 => 1,
                        _ => inp.u32(),
                    };
                    segments.push((s, num, flags));
                    payload.extend_from_slice(&s.to_le_bytes());
                    payload.extend_from_slice(&num.to_le_bytes());
                    payload.extend_from_slice(&flags.to_le_bytes());
                }
                if inp.u8() >= 248 {
                    payload.push(0); // not a whole number of segments
                }
                split(inp, payload.len() as u32, &mut lens);
            }
        }
        let status_shared = kind.device_writes_data() && !lens.is_empty() && inp.u8() & 1 == 1;
        let hdr_len = match mistake {
            Mistake::HeaderShort(n) => n,
            _ if inp.u8() >= 240 => 16 + u32::from(inp.u8() % 48),
            _ => 16,
        };
        let ndesc = 1 + lens.len() + usize::from(!status_shared);
        let Some(slots) = self.q.peek_slots(ndesc) else {
            return; // queue full: a driver would wait
        };
        let area = |i: usize| slot_area(self.q.index, slots[i]);
        // Header.
        let mut hdr = [0u8; 16];
        hdr[0..4].copy_from_slice(&kind.code().to_le_bytes());
        hdr[8..16].copy_from_slice(&sector.to_le_bytes());
        self.mem
            .write_slice(&hdr, GuestAddress(area(0)))
            .expect("slot area");
        let mut bufs = vec![Buf {
            addr: area(0),
            len: hdr_len,
            write: mistake == Mistake::HeaderWritable,
        }];
        // Data.
        let mut data = Vec::new();
        let mut out_data = Vec::new();
        let mut payload_off = 0usize;
        for (i, &len) in lens.iter().enumerate() {
            let addr = area(1 + i);
            let last = i + 1 == lens.len();
            let write = kind.device_writes_data();
            if write {
                self.mem
                    .write_slice(&vec![0xa5; len as usize], GuestAddress(addr))
                    .expect("slot area");
            } else {
                let bytes = if matches!(kind, Kind::Discard | Kind::WriteZeroes) {
                    payload[payload_off..payload_off + len as usize].to_vec()
                } else {
                    self.salt += 1;
                    write_pattern(len as usize, sector as u8, self.salt)
                };
                payload_off += len as usize;
                self.mem
                    .write_slice(&bytes, GuestAddress(addr))
                    .expect("slot area");
                out_data.extend_from_slice(&bytes);
            }
            let mut b = Buf { addr, len, write };
            if last && status_shared {
                b.len += 1;
            }
            bufs.push(b);
            data.push(Buf { addr, len, write });
        }
        // Status.
        if status_shared && data.last().is_some_and(|b| b.len == 0) {
            data.pop(); // a 1-byte descriptor is only the status byte
        }
        let status_addr = if status_shared {
            let last = bufs.last().expect("data buffer");
            last.addr + u64::from(last.len) - 1
        } else {
            let addr = area(ndesc - 1);
            bufs.push(Buf {
                addr,
                len: 1,
                write: true,
            });
            addr
        };
        // Apply the mistake.
        let mut mistake = mistake;
        match mistake {
            Mistake::WrongDirection => {
                // Only buffers strictly between the header and the status descriptor.
                let n = bufs.len() - 2;
                if n == 0 {
                    mistake = Mistake::None;
                } else {
                    let i = 1 + usize::from(inp.u8()) % n;
                    bufs[i].write = !bufs[i].write;
                }
            }
            Mistake::DataOutside(sel) => {
                let n = bufs.len() - 2;
                let i = 1 + usize::from(inp.u8()) % n.max(1);
                if n == 0 || bufs[i].len == 0 {
                    mistake = Mistake::None;
                } else {
                    let addr = bad_address(sel, bufs[i].len);
                    // Where the moved buffer is guest memory after all, give it the same bytes.
                    let mut content = vec![0u8; bufs[i].len as usize];
                    self.mem
                        .read_slice(&mut content, GuestAddress(bufs[i].addr))
                        .expect("slot area");
                    let _ = self.mem.write_slice(&content, GuestAddress(addr));
                    bufs[i].addr = addr;
                    data[i - 1].addr = addr;
                }
            }
            Mistake::StatusReadOnly => {
                bufs.last_mut().expect("status").write = false;
            }
            Mistake::StatusOutside => {
                let last = bufs.last_mut().expect("status");
                last.addr = crate::driver::HOLE + 0x800;
            }
            _ => {}
        }
        if !matches!(mistake, Mistake::StatusOutside) {
            self.mem
                .write_obj(0xeeu8, GuestAddress(status_addr))
                .expect("status byte");
        }
        let Some(head) = self.q.add_chain(&self.mem, &bufs) else {
            return;
        };
        self.order.push_back(head);
        self.pending.insert(
            head,
            Pending {
                kind,
                sector,
                data,
                out_data,
                segments,
                payload_len: payload.len() as u64,
                status_addr,
                mistake,
            },
        );
    }

    /// What the virtio-blk rules say about `p`.
    fn expect(&self, p: &Pending) -> Expect {
        match (p.mistake, self.expect_clean(p)) {
            // Contiguous in guest-physical space across two mappings: the device may process the
            // request normally or refuse the buffer.
            // A discard/write-zeroes payload moved there is not this request's own: the bytes
            // at that fixed address may be rewritten by requests submitted after it (their
            // slots can overlap it) before the device reads them, so the device may see other
            // segments and answer anything a payload can get.
            (Mistake::DataOutside(sel), Expect::Status(_))
                if sel % 4 == 1 && matches!(p.kind, Kind::Discard | Kind::WriteZeroes) =>
            {
                Expect::Status(vec![
                    VIRTIO_BLK_S_OK,
                    VIRTIO_BLK_S_IOERR,
                    VIRTIO_BLK_S_UNSUPP,
                ])
            }
            (Mistake::DataOutside(sel), Expect::Status(mut v)) if sel % 4 == 1 => {
                if !v.contains(&VIRTIO_BLK_S_IOERR) {
                    v.push(VIRTIO_BLK_S_IOERR);
                }
                Expect::Status(v)
            }
            (_, e) => e,
        }
    }

    fn expect_clean(&self, p: &Pending) -> Expect {
        use Mistake::*;
        let ioerr = Expect::Status(vec![VIRTIO_BLK_S_IOERR]);
        let ok = Expect::Status(vec![VIRTIO_BLK_S_OK]);
        let unsupp = Expect::Status(vec![VIRTIO_BLK_S_UNSUPP]);
        match p.mistake {
            StatusReadOnly | StatusOutside => return Expect::Fatal,
            HeaderWritable | HeaderShort(_) => return ioerr,
            WrongDirection => {
                return match p.kind {
                    Kind::Flush => ok,
                    Kind::Other(_) => unsupp,
                    _ => ioerr,
                }
            }
            DataOutside(sel) if sel % 4 != 1 => return ioerr,
            DataOutside(_) | None => {}
        }
        let cap = self.model.capacity();
        let in_range = |sector: u64, len: u64| {
            sector
                .checked_mul(SECTOR)
                .and_then(|o| o.checked_add(len))
                .is_some_and(|end| end <= cap)
        };
        match p.kind {
            Kind::In | Kind::Out => {
                let len = p.data_len();
                if (p.kind == Kind::Out && self.ro)
                    || !len.is_multiple_of(SECTOR)
                    || !in_range(p.sector, len)
                {
                    ioerr
                } else {
                    ok
                }
            }
            Kind::Flush => ok,
            Kind::GetId => {
                if p.data.len() == 1 {
                    ok
                } else {
                    ioerr
                }
            }
            Kind::Discard | Kind::WriteZeroes => {
                let n = p.payload_len / 16;
                if self.ro
                    || p.payload_len == 0
                    || !p.payload_len.is_multiple_of(16)
                    || n > u64::from(MAX_DISCARD_SEG)
                    || p.segments.iter().any(|&(s, num, _)| {
                        num > MAX_DISCARD_SECTORS || !in_range(s, u64::from(num) * SECTOR)
                    })
                {
                    return ioerr;
                }
                let allowed = if p.kind == Kind::Discard { 0 } else { 1 };
                if p.segments.iter().any(|&(_, _, f)| f & !allowed != 0) {
                    unsupp
                } else {
                    ok
                }
            }
            Kind::Other(_) => unsupp,
        }
    }

    /// Publish, let the device process the queue, check every completion.
    fn kick(&mut self) {
        self.q.publish(&self.mem);
        let before = MemSnapshot::take(&self.mem);
        let was_broken = self.broken;
        crate::driver::blk_process(self.dev());
        let done = self.q.take_used(&self.mem);
        let irq = self.dev().interrupt().status();
        self.dev().interrupt().ack(INT_VRING | INT_CONFIG);
        if self.tainted {
            self.pending.clear();
            self.order.clear();
            self.broken |= self.dev().is_broken();
            return;
        }
        if was_broken {
            assert!(
                done.is_empty(),
                "a device that needs a reset completed chains"
            );
            assert!(
                before.changed(&self.mem).is_empty(),
                "a device that needs a reset wrote guest memory"
            );
            return;
        }
        let changed = before.changed(&self.mem);
        let chains: Vec<_> = done.iter().map(|(_, _, c)| c).collect();
        assert_writes_within(
            &changed,
            &writable_ranges(&chains, &[&self.q]),
            "virtio-blk",
        );
        if !done.is_empty() {
            assert_ne!(
                irq & INT_VRING,
                0,
                "chains completed without a used-buffer interrupt"
            );
        }
        let mut fatal_seen = false;
        for (head, len, _) in &done {
            // Malformed requests are answered at once, the others when the device's I/O
            // thread finishes them, so completions need not follow the available order
            // (virtio allows any order); each must be of a chain made available and not yet
            // completed.
            let at = self.order.iter().position(|h| h == head);
            assert!(
                at.is_some(),
                "chain {head} completed but was not outstanding ({:?})",
                self.order
            );
            self.order.remove(at.expect("checked"));
            let p = self.pending.remove(head).expect("pending request");
            trace!(
                "blk: {:?} sector {} {:?} completed, used length {len}",
                p.kind,
                p.sector,
                p.mistake
            );
            self.complete(&p, *len);
        }
        // What did not complete: nothing, or everything from a chain without a status byte on.
        if let Some(&head) = self.order.front() {
            let p = &self.pending[&head];
            assert_eq!(
                self.expect(p),
                Expect::Fatal,
                "request {:?} at sector {} ({:?}) was made available but did not complete",
                p.kind,
                p.sector,
                p.mistake
            );
            fatal_seen = true;
        }
        assert_eq!(
            self.dev().is_broken(),
            fatal_seen,
            "device broken state after a chain {} a usable status byte",
            if fatal_seen { "without" } else { "with" }
        );
        if fatal_seen {
            assert!(
                self.dev().interrupt().needs_reset(),
                "a chain without a status byte must set NEEDS_RESET"
            );
            assert_ne!(
                irq & INT_CONFIG,
                0,
                "NEEDS_RESET without a configuration interrupt"
            );
            self.broken = true;
        }
    }

    /// Check one completed request against the model and apply its effects.
    fn complete(&mut self, p: &Pending, used_len: u32) {
        let status: u8 = self
            .mem
            .read_obj(GuestAddress(p.status_addr))
            .expect("status byte");
        let what = format!(
            "{:?} sector {} data {:?} mistake {:?}",
            p.kind,
            p.sector,
            p.data.iter().map(|b| b.len).collect::<Vec<_>>(),
            p.mistake
        );
        let allowed = match self.expect(p) {
            Expect::Fatal => panic!("{what}: completed, but it has no usable status byte"),
            Expect::Status(s) => s,
        };
        assert!(
            allowed.contains(&status),
            "{what}: status {status:#x}, expected one of {allowed:?}"
        );
        let off = p.sector.wrapping_mul(SECTOR);
        let exact = p.mistake == Mistake::None;
        match (p.kind, status) {
            (Kind::In, VIRTIO_BLK_S_OK) => {
                let len = p.data_len() as u32;
                assert_eq!(used_len, len + 1, "{what}: used length of a read");
                if !exact {
                    return; // another request may share the misplaced buffer
                }
                let mut got = Vec::new();
                for b in &p.data {
                    let mut v = vec![0u8; b.len as usize];
                    self.mem
                        .read_slice(&mut v, GuestAddress(b.addr))
                        .expect("data buffer");
                    got.extend_from_slice(&v);
                }
                self.model.check_read(off, &got, &what);
            }
            (Kind::Out, VIRTIO_BLK_S_OK) => {
                assert_eq!(used_len, 1, "{what}: used length of a write");
                if exact {
                    self.model.write(off, &p.out_data);
                } else {
                    self.model.forget(off, p.data_len());
                }
            }
            (Kind::GetId, VIRTIO_BLK_S_OK) => {
                let b = p.data[0];
                let n = (b.len as usize).min(SERIAL.len());
                assert_eq!(used_len, n as u32 + 1, "{what}: used length of GET_ID");
                if !exact {
                    return;
                }
                let mut v = vec![0u8; n];
                self.mem
                    .read_slice(&mut v, GuestAddress(b.addr))
                    .expect("id buffer");
                assert_eq!(v, SERIAL[..n], "{what}: GET_ID answer");
            }
            (Kind::Discard | Kind::WriteZeroes, VIRTIO_BLK_S_OK) if exact => {
                assert_eq!(used_len, 1, "{what}: used length");
                for &(s, num, _) in &p.segments {
                    self.model.zero(s * SECTOR, u64::from(num) * SECTOR);
                }
            }
            (Kind::Discard | Kind::WriteZeroes, VIRTIO_BLK_S_OK | VIRTIO_BLK_S_UNSUPP) if matches!(p.mistake, Mistake::DataOutside(sel) if sel % 4 == 1) =>
            {
                // The device acted on whatever segments it found there (see `expect`).
                assert_eq!(used_len, 1, "{what}: used length");
                self.model.forget_all();
            }
            (Kind::Discard | Kind::WriteZeroes, VIRTIO_BLK_S_OK | VIRTIO_BLK_S_UNSUPP) => {
                assert_eq!(used_len, 1, "{what}: used length");
                // Segments before the one with unsupported flags may have been applied.
                for &(s, num, _) in &p.segments {
                    if let Some(o) = s.checked_mul(SECTOR) {
                        self.model.forget(o, u64::from(num) * SECTOR);
                    }
                }
            }
            (Kind::Out, VIRTIO_BLK_S_IOERR) if matches!(p.mistake, Mistake::DataOutside(_)) => {
                // A buffer the device could not reach: part of the write may have happened.
                assert_eq!(used_len, 1, "{what}: used length");
                self.model.forget(off, p.data_len());
            }
            _ => assert_eq!(
                used_len, 1,
                "{what}: used length of a request without data read"
            ),
        }
    }

    /// Device reset and re-initialisation with fresh rings (what a driver does after
    /// NEEDS_RESET); requests not completed are gone.
    fn reset(&mut self) {
        let dev = self.dev.as_mut().expect("device present");
        // What the transport does when the driver writes 0 to Status.
        dev.reset();
        dev.interrupt().reset();
        assert!(!dev.is_activated(), "reset leaves the device active");
        assert!(!dev.is_broken(), "reset leaves the device broken");
        self.reinit();
        self.tainted = false;
    }

    /// Fresh rings and activation; requests not completed are forgotten.
    fn reinit(&mut self) {
        let q = SplitQueue::new(&self.mem, 0, self.qsize);
        activate(self.dev.as_mut().expect("device present"), &self.mem, &q);
        self.q = q;
        self.pending.clear();
        self.order.clear();
        self.broken = false;
    }

    /// Close the device and its backend, open them again (overlays persist their bitmap on
    /// close), and re-initialise.
    fn reopen(&mut self) {
        if self.tainted {
            // A scribbled queue may still be processed by a reopened device; reset first.
            self.reset();
        }
        self.dev = None;
        self.dev = Some(new_device(open_backend(self.backend, self.ro, &self.files)));
        self.reinit();
    }

    /// Overwrite guest memory (rings, descriptors, buffers) with input bytes.
    fn scribble(&mut self, inp: &mut Input) {
        let addr = match inp.u8() % 4 {
            0 => u64::from(inp.u16()) % 0x2000,
            _ => slot_area(0, u16::from(inp.u8()) % self.qsize) + u64::from(inp.u16()) % SLOT,
        };
        let n = 1 + usize::from(inp.u8() % 16);
        let bytes = inp.bytes(n).to_vec();
        let _ = self.mem.write_slice(&bytes, GuestAddress(addr));
        self.q.tainted = true;
        self.tainted = true;
        self.model.forget_all();
    }

    fn finish(mut self) {
        let cap = self.model.capacity() as usize;
        // Close the device (overlays persist their bitmap).
        self.dev = None;
        match self.backend {
            Backend::Raw => {
                let now = fs::read(&self.files.image).expect("read the image");
                assert_eq!(
                    now.len(),
                    self.files.original.len(),
                    "the image changed size"
                );
                if self.ro {
                    assert!(now == self.files.original, "a read-only image was modified");
                }
                assert!(
                    now[cap..] == self.files.original[cap..],
                    "bytes after the last whole sector were modified"
                );
                self.model
                    .check_read(0, &now[..cap], "image file at the end");
            }
            Backend::Overlay => {
                let now = fs::read(&self.files.image).expect("read the base");
                assert!(
                    now == self.files.original,
                    "the base image under an overlay was modified"
                );
                let mut disk = Overlay::open(&self.files.image, &self.files.overlay)
                    .expect("reopen the overlay");
                assert_eq!(disk.capacity(), cap as u64, "overlay capacity");
                let mem = &self.mem;
                let slice = mem
                    .get_slice(GuestAddress(0), cap)
                    .expect("a whole disk fits R0");
                disk.read_at(0, &slice).expect("read the whole disk");
                let mut got = vec![0u8; cap];
                mem.read_slice(&mut got, GuestAddress(0)).expect("R0");
                self.model
                    .check_read(0, &got, "overlay reopened at the end");
            }
        }
    }
}

/// Split `total` bytes over 1..=4 buffers that fit a slot (more when needed); `total`
/// 0 gives no buffer or, sometimes, one empty buffer.
fn split(inp: &mut Input, total: u32, lens: &mut Vec<u32>) {
    if total == 0 {
        if inp.u8() >= 224 {
            lens.push(0);
        }
        return;
    }
    let want = 1 + u32::from(inp.u8() % 4);
    let mut left = total;
    let mut parts = want;
    while left > 0 {
        // One byte short of a slot: the status byte may follow the last buffer.
        let max = (SLOT as u32 - 1).min(left);
        let n = if parts <= 1 {
            max
        } else {
            let cut = 1 + (inp.u16() as u32 % max);
            cut.min(max)
        };
        lens.push(n);
        left -= n;
        parts = parts.saturating_sub(1);
    }
}
