//! Driver-side helpers for tests, benchmarks and fuzzing: build split
//! queues and descriptor chains in guest memory the way a guest driver
//! would (including malformed ones). Not used by the VMM itself.

use virtio_queue::Queue;
use vm_memory::GuestAddress;

use crate::vstate::memory::GuestMemoryMmap;

use virtio_queue::QueueT;
use vm_memory::Bytes;

pub const F_NEXT: u16 = 1;
pub const F_WRITE: u16 = 2;
pub const F_INDIRECT: u16 = 4;

/// Where one split queue's descriptor table, available ring and used ring lie in guest memory,
/// and a driver's raw reads and writes of them: the one driver-side ring code of the unit tests
/// ([`TestQueue`]), the KVM integration tests and the fuzz targets, each of which keeps its own
/// books (next free descriptor, last used index seen) on top.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rings {
    pub size: u16,
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
}

impl Rings {
    /// The three parts back to back from `base`: descriptor table, available ring right after
    /// it, used ring after that (4-byte aligned).
    pub fn packed(base: u64, size: u16) -> Self {
        let avail = base + 16 * u64::from(size);
        Self {
            size,
            desc: base,
            avail,
            used: (avail + 6 + 2 * u64::from(size) + 3) & !3,
        }
    }

    /// The guest-memory range `[start, end)` of the used ring (what a device may write).
    pub fn used_range(&self) -> (u64, u64) {
        (self.used, self.used + 6 + 8 * u64::from(self.size))
    }

    /// Zero `[self.desc, end)`: a fresh queue's memory.
    pub fn zero(&self, mem: &GuestMemoryMmap, end: u64) {
        mem.write_slice(
            &vec![0u8; (end - self.desc) as usize],
            GuestAddress(self.desc),
        )
        .expect("queue memory");
    }

    /// The device-side queue (maximum size `max`), configured with these addresses and ready:
    /// what the transport hands a device.
    pub fn device_queue(&self, max: u16) -> Queue {
        let mut q = Queue::new(max).expect("a valid maximum queue size");
        q.set_size(self.size);
        q.set_desc_table_address(Some(self.desc as u32), Some((self.desc >> 32) as u32));
        q.set_avail_ring_address(Some(self.avail as u32), Some((self.avail >> 32) as u32));
        q.set_used_ring_address(Some(self.used as u32), Some((self.used >> 32) as u32));
        q.set_ready(true);
        q
    }

    /// Store one raw descriptor at `idx` (also used to build broken chains).
    pub fn write_desc(
        &self,
        mem: &GuestMemoryMmap,
        idx: u16,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) {
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..16].copy_from_slice(&next.to_le_bytes());
        mem.write_slice(&d, GuestAddress(self.desc + 16 * u64::from(idx)))
            .expect("descriptor table");
    }

    /// Write a well-linked chain of `(addr, len, device_writable)` into the descriptors
    /// `first, first + 1, ...` (wrapping at the table's end). Returns the descriptor after it.
    pub fn write_chain(
        &self,
        mem: &GuestMemoryMmap,
        first: u16,
        descs: &[(u64, u32, bool)],
    ) -> u16 {
        for (i, &(addr, len, w)) in descs.iter().enumerate() {
            let idx = (first + i as u16) % self.size;
            let last = i + 1 == descs.len();
            let flags = if w { F_WRITE } else { 0 } | if last { 0 } else { F_NEXT };
            self.write_desc(mem, idx, addr, len, flags, (idx + 1) % self.size);
        }
        (first + descs.len() as u16) % self.size
    }

    /// The available ring's index.
    pub fn avail_idx(&self, mem: &GuestMemoryMmap) -> u16 {
        mem.read_obj(GuestAddress(self.avail + 2))
            .expect("avail idx")
    }

    /// Overwrite the available ring's index (publishes what was put in the ring before it).
    pub fn set_avail_idx(&self, mem: &GuestMemoryMmap, idx: u16) {
        mem.write_obj(idx, GuestAddress(self.avail + 2))
            .expect("avail idx");
    }

    /// Put `head` in the available ring at position `pos` (modulo the size), not published.
    pub fn set_avail_entry(&self, mem: &GuestMemoryMmap, pos: u16, head: u16) {
        let slot = self.avail + 4 + 2 * u64::from(pos % self.size);
        mem.write_obj(head, GuestAddress(slot)).expect("avail ring");
    }

    /// Put `head` in the next available slot and publish it (a fence between the two, as a
    /// driver on another CPU needs).
    pub fn push_avail(&self, mem: &GuestMemoryMmap, head: u16) {
        let idx = self.avail_idx(mem);
        self.set_avail_entry(mem, idx, head);
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        self.set_avail_idx(mem, idx.wrapping_add(1));
    }

    /// The used ring's index.
    pub fn used_idx(&self, mem: &GuestMemoryMmap) -> u16 {
        mem.read_obj(GuestAddress(self.used + 2)).expect("used idx")
    }

    /// Used element at position `pos` (modulo the size): (chain head, length).
    pub fn used_elem(&self, mem: &GuestMemoryMmap, pos: u16) -> (u32, u32) {
        let e = self.used + 4 + 8 * u64::from(pos % self.size);
        (
            mem.read_obj(GuestAddress(e)).expect("used elem"),
            mem.read_obj(GuestAddress(e + 4)).expect("used elem"),
        )
    }
}

/// Driver-side view of a split queue in test guest memory, with full
/// control over descriptors (to build malformed chains), laid out by
/// [`Rings::packed`]. (virtio-queue's `MockSplitQueue` is not used: its ring
/// layout lets the used ring overlap the available ring.) Its [`Rings`] fields
/// (`size`, `desc`, `avail`, `used`) read through it.
pub struct TestQueue<'a> {
    pub mem: &'a GuestMemoryMmap,
    rings: Rings,
    next_desc: u16,
}

impl std::ops::Deref for TestQueue<'_> {
    type Target = Rings;
    fn deref(&self) -> &Rings {
        &self.rings
    }
}

impl<'a> TestQueue<'a> {
    /// A queue of `size` at `base`; rings zeroed.
    pub fn new(mem: &'a GuestMemoryMmap, base: u64, size: u16) -> Self {
        let rings = Rings::packed(base, size);
        rings.zero(mem, rings.used_range().1);
        Self {
            mem,
            rings,
            next_desc: 0,
        }
    }

    /// The device-side queue, ready.
    pub fn queue(&self) -> Queue {
        self.rings.device_queue(self.size)
    }

    /// Store one raw descriptor at `idx`.
    pub fn set_desc(&self, idx: u16, addr: u64, len: u32, flags: u16, next: u16) {
        self.rings.write_desc(self.mem, idx, addr, len, flags, next);
    }

    /// Address of descriptor `idx`'s buffer.
    pub fn desc_addr(&self, idx: u16) -> u64 {
        self.mem
            .read_obj(GuestAddress(self.desc + 16 * u64::from(idx)))
            .unwrap()
    }

    pub fn avail_idx(&self) -> u16 {
        self.rings.avail_idx(self.mem)
    }

    /// Make `head` available.
    pub fn push_avail(&self, head: u16) {
        let idx = self.avail_idx();
        self.rings.set_avail_entry(self.mem, idx, head);
        self.set_avail_idx(idx.wrapping_add(1));
    }

    /// Overwrite the available index (to make it run ahead).
    pub fn set_avail_idx(&self, idx: u16) {
        self.rings.set_avail_idx(self.mem, idx);
    }

    /// Add a well-linked chain of `(addr, len, device_writable)` and make it
    /// available. Returns the head index.
    pub fn add_chain(&mut self, descs: &[(u64, u32, bool)]) -> u16 {
        let head = self.next_desc;
        self.next_desc = self.rings.write_chain(self.mem, head, descs);
        self.push_avail(head);
        head
    }

    pub fn used_idx(&self) -> u16 {
        self.rings.used_idx(self.mem)
    }

    /// Used element `i`: (chain head, length).
    pub fn used(&self, i: u16) -> (u32, u32) {
        self.rings.used_elem(self.mem, i)
    }
}
