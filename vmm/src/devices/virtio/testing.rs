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

/// Driver-side view of a split queue in test guest memory, with full
/// control over descriptors (to build malformed chains). Layout: descriptor
/// table at `base`, available ring right after it, used ring after that
/// (4-byte aligned). (virtio-queue's `MockSplitQueue` is not used: its ring
/// layout lets the used ring overlap the available ring.)
pub struct TestQueue<'a> {
    pub mem: &'a GuestMemoryMmap,
    pub size: u16,
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
    next_desc: u16,
}

impl<'a> TestQueue<'a> {
    /// A queue of `size` at `base`; rings zeroed.
    pub fn new(mem: &'a GuestMemoryMmap, base: u64, size: u16) -> Self {
        let desc = base;
        let avail = desc + 16 * u64::from(size);
        let used = (avail + 6 + 2 * u64::from(size) + 3) & !3;
        let end = used + 6 + 8 * u64::from(size);
        mem.write_slice(&vec![0u8; (end - base) as usize], GuestAddress(base))
            .unwrap();
        Self {
            mem,
            size,
            desc,
            avail,
            used,
            next_desc: 0,
        }
    }

    /// The device-side queue, ready.
    pub fn queue(&self) -> Queue {
        let mut q = Queue::new(self.size).unwrap();
        q.set_size(self.size);
        q.set_desc_table_address(Some(self.desc as u32), Some((self.desc >> 32) as u32));
        q.set_avail_ring_address(Some(self.avail as u32), Some((self.avail >> 32) as u32));
        q.set_used_ring_address(Some(self.used as u32), Some((self.used >> 32) as u32));
        q.set_ready(true);
        q
    }

    /// Store one raw descriptor at `idx`.
    pub fn set_desc(&self, idx: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..16].copy_from_slice(&next.to_le_bytes());
        self.mem
            .write_slice(&d, GuestAddress(self.desc + 16 * u64::from(idx)))
            .unwrap();
    }

    /// Address of descriptor `idx`'s buffer.
    pub fn desc_addr(&self, idx: u16) -> u64 {
        self.mem
            .read_obj(GuestAddress(self.desc + 16 * u64::from(idx)))
            .unwrap()
    }

    pub fn avail_idx(&self) -> u16 {
        self.mem.read_obj(GuestAddress(self.avail + 2)).unwrap()
    }

    /// Make `head` available.
    pub fn push_avail(&self, head: u16) {
        let idx = self.avail_idx();
        let slot = self.avail + 4 + 2 * u64::from(idx % self.size);
        self.mem.write_obj(head, GuestAddress(slot)).unwrap();
        self.set_avail_idx(idx.wrapping_add(1));
    }

    /// Overwrite the available index (to make it run ahead).
    pub fn set_avail_idx(&self, idx: u16) {
        self.mem
            .write_obj(idx, GuestAddress(self.avail + 2))
            .unwrap();
    }

    /// Add a well-linked chain of `(addr, len, device_writable)` and make it
    /// available. Returns the head index.
    pub fn add_chain(&mut self, descs: &[(u64, u32, bool)]) -> u16 {
        let head = self.next_desc;
        for (i, &(addr, len, w)) in descs.iter().enumerate() {
            let idx = (self.next_desc + i as u16) % self.size;
            let last = i + 1 == descs.len();
            let flags = if w { F_WRITE } else { 0 } | if last { 0 } else { F_NEXT };
            self.set_desc(idx, addr, len, flags, (idx + 1) % self.size);
        }
        self.next_desc = (self.next_desc + descs.len() as u16) % self.size;
        self.push_avail(head);
        head
    }

    pub fn used_idx(&self) -> u16 {
        self.mem.read_obj(GuestAddress(self.used + 2)).unwrap()
    }

    /// Used element `i`: (chain head, length).
    pub fn used(&self, i: u16) -> (u32, u32) {
        let e = self.used + 4 + 8 * u64::from(i % self.size);
        (
            self.mem.read_obj(GuestAddress(e)).unwrap(),
            self.mem.read_obj(GuestAddress(e + 4)).unwrap(),
        )
    }
}
