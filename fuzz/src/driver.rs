//! The guest side of the virtio targets: guest memory with awkward region boundaries, and a
//! split-queue driver that keeps its own books, so the device is checked against what a driver
//! actually handed it.
//!
//! Memory: `R0 = [0, 0xa0000)`, `R1 = [0xa0000, 0xb0000)` right after it (a separate mapping, so a
//! buffer crossing `0xa0000` is contiguous in guest-physical space but not in one host mapping),
//! a hole `[0xb0000, 0xc0000)`, and `R2 = [0xc0000, 0xd0000)`. Queue `q` lives at `q * 0x2000`
//! (descriptor table, available ring at +0x1000, used ring at +0x1400); descriptor slot `i` of
//! queue `q` owns the 4 KiB buffer area [`slot_area`].

use std::collections::BTreeMap;

use virtio_queue::Queue;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};
use vmm::devices::virtio::testing::Rings;
use vmm::vstate::memory::GuestMemoryMmap;

pub const R0_END: u64 = 0xa_0000;
pub const R1_END: u64 = 0xb_0000;
pub const HOLE: u64 = 0xb_0000;
pub const R2: u64 = 0xc_0000;
pub const R2_END: u64 = 0xd_0000;
/// Largest queue the targets use (slot areas are sized for it).
pub const MAX_QUEUE: u16 = 64;
/// Size of one descriptor slot's buffer area.
pub const SLOT: u64 = 0x1000;
const AREAS: u64 = 0x1_0000;

pub const F_NEXT: u16 = 1;
pub const F_WRITE: u16 = 2;

thread_local! {
    /// Guest memory is mapped once per thread and zeroed for every input (mapping and faulting
    /// in fresh pages for every input costs more than most inputs).
    static MEMORY: GuestMemoryMmap = GuestMemoryMmap::from_ranges(&[
        (GuestAddress(0), R0_END as usize),
        (GuestAddress(R0_END), (R1_END - R0_END) as usize),
        (GuestAddress(R2), (R2_END - R2) as usize),
    ])
    .expect("guest memory");
    /// Buffers for [`MemSnapshot`], reused for the same reason.
    static SNAPSHOT_BUFFERS: std::cell::RefCell<Vec<Vec<u8>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Zeroed guest memory with the layout above (the same mapping every time on one thread;
/// targets drop their devices before returning, so nothing else uses it by then).
pub fn guest_memory() -> GuestMemoryMmap {
    let mem = MEMORY.with(Clone::clone);
    for r in mem.iter() {
        let s = r.as_volatile_slice().expect("region slice");
        let guard = s.ptr_guard_mut();
        // SAFETY: the guard's pointer covers the whole mapped region (`s.len()` bytes) and
        // stays valid while `guard` lives; no device of a previous input is left to access it.
        unsafe { std::ptr::write_bytes(guard.as_ptr(), 0, s.len()) };
    }
    mem
}

/// Buffer area of descriptor slot `i` of queue `q` (inside R0).
pub fn slot_area(q: u16, i: u16) -> u64 {
    AREAS + u64::from(q) * u64::from(MAX_QUEUE) * SLOT + u64::from(i) * SLOT
}

/// An address that is not guest memory, or a range that crosses a mapping boundary, picked by
/// `sel`; `len` is the buffer length that will be used with it.
pub fn bad_address(sel: u8, len: u32) -> u64 {
    match sel % 4 {
        0 => HOLE + 0x100,                                  // the hole between R1 and R2
        1 => R0_END - u64::from(len / 2),                   // contiguous across R0/R1: two mappings
        2 => R2_END - u64::from(len.saturating_sub(1) / 2), // runs off the end of R2
        _ => 0xffff_ffff_ffff_f000,                         // nowhere; +len overflows
    }
}

/// Copy of all guest memory, to find bytes the device changed.
pub struct MemSnapshot(Vec<(u64, Vec<u8>)>);

impl MemSnapshot {
    pub fn take(mem: &GuestMemoryMmap) -> Self {
        let mut v = Vec::new();
        for r in mem.iter() {
            let mut b = SNAPSHOT_BUFFERS
                .with(|p| p.borrow_mut().pop())
                .unwrap_or_default();
            b.resize(r.len() as usize, 0);
            mem.read_slice(&mut b, r.start_addr())
                .expect("whole region");
            v.push((r.start_addr().0, b));
        }
        Self(v)
    }

    /// Addresses whose bytes differ between `self` and now (compared a page at a time, byte
    /// by byte only where a page differs).
    pub fn changed(&self, mem: &GuestMemoryMmap) -> Vec<u64> {
        const PAGE: usize = 4096;
        let mut out = Vec::new();
        let mut now = [0u8; PAGE];
        for (base, old) in &self.0 {
            for (i, page) in old.chunks(PAGE).enumerate() {
                let addr = base + (i * PAGE) as u64;
                let now = &mut now[..page.len()];
                mem.read_slice(now, GuestAddress(addr))
                    .expect("whole region");
                if page != now {
                    out.extend(
                        page.iter()
                            .zip(now.iter())
                            .enumerate()
                            .filter(|(_, (x, y))| x != y)
                            .map(|(k, _)| addr + k as u64),
                    );
                }
            }
        }
        out
    }
}

impl Drop for MemSnapshot {
    fn drop(&mut self) {
        SNAPSHOT_BUFFERS.with(|p| p.borrow_mut().extend(self.0.drain(..).map(|(_, b)| b)));
    }
}

/// One buffer of a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buf {
    pub addr: u64,
    pub len: u32,
    pub write: bool,
}

/// A chain the driver made available and the device has not returned yet.
#[derive(Clone, Debug)]
pub struct InFlight {
    pub descs: Vec<u16>,
    pub bufs: Vec<Buf>,
}

/// The driver's side of one split queue: the VMM's driver-side ring code (`Rings`) and this
/// driver's books.
pub struct SplitQueue {
    pub index: u16,
    pub rings: Rings,
    free: Vec<u16>,
    avail_idx: u16,
    published: u16,
    last_used: u16,
    pub inflight: BTreeMap<u16, InFlight>,
    /// Set when the target scribbled over guest memory: the rings may no longer say what this
    /// driver wrote, so the used-ring bookkeeping is not checked.
    pub tainted: bool,
}

impl SplitQueue {
    /// Queue number `index` (0 or 1) of `size` entries (a power of two up to [`MAX_QUEUE`]);
    /// its rings are zeroed.
    pub fn new(mem: &GuestMemoryMmap, index: u16, size: u16) -> Self {
        assert!(size.is_power_of_two() && size <= MAX_QUEUE);
        let desc = u64::from(index) * 0x2000;
        let q = Self {
            index,
            rings: Rings {
                size,
                desc,
                avail: desc + 0x1000,
                used: desc + 0x1400,
            },
            free: (0..size).rev().collect(),
            avail_idx: 0,
            published: 0,
            last_used: 0,
            inflight: BTreeMap::new(),
            tainted: false,
        };
        q.rings.zero(mem, desc + 0x2000);
        q
    }

    /// The device-side queue, configured and ready (what the transport would hand over).
    pub fn device_queue(&self) -> Queue {
        self.rings.device_queue(256)
    }

    /// Free descriptors.
    pub fn free(&self) -> usize {
        self.free.len()
    }

    /// The descriptor slot the next buffer of a chain would get (its buffer area is
    /// `slot_area(index, slot)`); `None` when the table is full.
    pub fn peek_slots(&self, n: usize) -> Option<Vec<u16>> {
        (n <= self.free.len()).then(|| self.free.iter().rev().take(n).copied().collect())
    }

    /// Write a chain of `bufs` into free descriptors (linked with NEXT) and put its head in the
    /// available ring (not yet published). `None` when there are not enough descriptors.
    pub fn add_chain(&mut self, mem: &GuestMemoryMmap, bufs: &[Buf]) -> Option<u16> {
        if bufs.is_empty() || bufs.len() > self.free.len() {
            return None;
        }
        let ids: Vec<u16> = (0..bufs.len())
            .map(|_| self.free.pop().expect("checked"))
            .collect();
        for (i, (b, &id)) in bufs.iter().zip(&ids).enumerate() {
            let next = ids.get(i + 1).copied();
            let flags = if b.write { F_WRITE } else { 0 } | if next.is_some() { F_NEXT } else { 0 };
            self.rings
                .write_desc(mem, id, b.addr, b.len, flags, next.unwrap_or(0));
        }
        let head = ids[0];
        self.rings.set_avail_entry(mem, self.avail_idx, head);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.inflight.insert(
            head,
            InFlight {
                descs: ids,
                bufs: bufs.to_vec(),
            },
        );
        Some(head)
    }

    /// Make every added chain visible to the device.
    pub fn publish(&mut self, mem: &GuestMemoryMmap) {
        self.rings.set_avail_idx(mem, self.avail_idx);
        self.published = self.avail_idx;
    }

    /// Chains made available but not returned yet.
    pub fn outstanding(&self) -> usize {
        self.inflight.len()
    }

    /// Collect what the device put in the used ring since the last call, checking that it only
    /// returns chains it was given, each once, and never moves the used index back or past the
    /// chains published. Returns `(head, len, chain)` in used-ring order.
    pub fn take_used(&mut self, mem: &GuestMemoryMmap) -> Vec<(u16, u32, InFlight)> {
        let idx = self.rings.used_idx(mem);
        let new = idx.wrapping_sub(self.last_used);
        let published_outstanding = self.published.wrapping_sub(self.last_used);
        if !self.tainted {
            assert!(
                new <= published_outstanding,
                "used index moved from {} to {idx}, but only {published_outstanding} chains were published and not returned",
                self.last_used
            );
        }
        let mut out = Vec::new();
        for k in 0..new {
            let (id, len) = self.rings.used_elem(mem, self.last_used.wrapping_add(k));
            let chain = u16::try_from(id)
                .ok()
                .and_then(|h| self.inflight.remove(&h));
            match chain {
                Some(c) => {
                    self.free.extend(c.descs.iter().copied());
                    out.push((id as u16, len, c));
                }
                None => assert!(
                    self.tainted,
                    "device returned chain {id}, which is not outstanding (outstanding: {:?})",
                    self.inflight.keys().collect::<Vec<_>>()
                ),
            }
        }
        self.last_used = idx;
        out
    }

    /// Bytes of a chain's device-writable buffers, in chain order, up to `len` bytes.
    pub fn read_written(mem: &GuestMemoryMmap, chain: &InFlight, len: u32) -> Vec<u8> {
        let mut out = Vec::new();
        let mut left = len as usize;
        for b in chain.bufs.iter().filter(|b| b.write) {
            if left == 0 {
                break;
            }
            let n = (b.len as usize).min(left);
            let mut v = vec![0u8; n];
            mem.read_slice(&mut v, GuestAddress(b.addr))
                .expect("writable buffers of well-formed chains are in memory");
            out.extend_from_slice(&v);
            left -= n;
        }
        out
    }
}

/// Guest-memory ranges the device may legitimately write while it completes `chains`: their
/// device-writable buffers, plus the used rings of `queues`.
pub fn writable_ranges(chains: &[&InFlight], queues: &[&SplitQueue]) -> Vec<(u64, u64)> {
    let mut r: Vec<(u64, u64)> = chains
        .iter()
        .flat_map(|c| c.bufs.iter())
        .filter(|b| b.write)
        .map(|b| (b.addr, b.addr.saturating_add(u64::from(b.len))))
        .collect();
    r.extend(queues.iter().map(|q| q.rings.used_range()));
    r
}

/// Assert that every address in `changed` lies in one of `ranges`.
pub fn assert_writes_within(changed: &[u64], ranges: &[(u64, u64)], what: &str) {
    for &a in changed {
        assert!(
            ranges.iter().any(|&(s, e)| a >= s && a < e),
            "{what}: the device wrote guest memory at {a:#x}, outside every device-writable buffer \
             it was given and the used ring"
        );
    }
}

/// What the event loop does for a virtio-blk notification, run to the end: take the queue, then
/// put every completion of the device's I/O thread in the used ring as it arrives, until no
/// request is in flight.
pub fn blk_process(d: &mut vmm::devices::virtio::block::BlockDevice) {
    use std::os::fd::AsRawFd;
    d.process_queue();
    while d.in_flight() > 0 {
        let mut p = libc::pollfd {
            fd: d.completion_event().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `p` is one valid pollfd that outlives the call.
        let r = unsafe { libc::poll(&mut p, 1, 10_000) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            // libFuzzer's timeout timer (SIGALRM) interrupts waits: try again.
            assert!(e.kind() == std::io::ErrorKind::Interrupted, "poll: {e}");
            continue;
        }
        assert!(
            r > 0,
            "the I/O thread did not complete a request within 10 s"
        );
        let _ = d.completion_event().read();
        d.process_completions();
    }
}
