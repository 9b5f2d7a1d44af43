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

mod oracle;
mod request;

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
