//! virtio-mmio (version 2) transport and split virtqueues, polled (no interrupts).
//!
//! Device memory (rings and buffers) comes from a bump allocator over a fixed RAM window
//! ([`DmaArena`]) so the image's `.bss` stays small: the entry code zeroes `.bss`, and under an
//! instruction emulator every byte of that costs time.

use crate::bootinfo::BootInfo;
use crate::io::{mmio_read32, mmio_write32, pause, phys_range_ok, rdtsc};
pub use crate::parse::parse_num;
use crate::parse::parse_virtio_mmio;
use core::sync::atomic::{fence, Ordering};

pub const MAGIC: u32 = 0x7472_6976; // "virt"

pub const REG_MAGIC: u64 = 0x000;
pub const REG_VERSION: u64 = 0x004;
pub const REG_DEVICE_ID: u64 = 0x008;
const REG_DEVICE_FEATURES: u64 = 0x010;
const REG_DEVICE_FEATURES_SEL: u64 = 0x014;
const REG_DRIVER_FEATURES: u64 = 0x020;
const REG_DRIVER_FEATURES_SEL: u64 = 0x024;
const REG_QUEUE_SEL: u64 = 0x030;
const REG_QUEUE_NUM_MAX: u64 = 0x034;
const REG_QUEUE_NUM: u64 = 0x038;
const REG_QUEUE_READY: u64 = 0x044;
const REG_QUEUE_NOTIFY: u64 = 0x050;
const REG_INTERRUPT_STATUS: u64 = 0x060;
const REG_INTERRUPT_ACK: u64 = 0x064;
pub const REG_STATUS: u64 = 0x070;
const REG_QUEUE_DESC_LO: u64 = 0x080;
const REG_QUEUE_DESC_HI: u64 = 0x084;
const REG_QUEUE_DRIVER_LO: u64 = 0x090;
const REG_QUEUE_DRIVER_HI: u64 = 0x094;
const REG_QUEUE_DEVICE_LO: u64 = 0x0a0;
const REG_QUEUE_DEVICE_HI: u64 = 0x0a4;
const REG_CONFIG: u64 = 0x100;

pub const STATUS_ACKNOWLEDGE: u32 = 1;
pub const STATUS_DRIVER: u32 = 2;
pub const STATUS_DRIVER_OK: u32 = 4;
pub const STATUS_FEATURES_OK: u32 = 8;
pub const STATUS_NEEDS_RESET: u32 = 64;
pub const STATUS_FAILED: u32 = 128;

pub const F_VERSION_1: u64 = 1 << 32;

pub const DEVICE_NET: u32 = 1;
pub const DEVICE_BLK: u32 = 2;

pub const DESC_F_NEXT: u16 = 1;
pub const DESC_F_WRITE: u16 = 2;

/// Most virtio-mmio devices taken from the command line.
pub const MAX_DEVICES: usize = 16;
/// Queue size the driver asks for (capped by QueueNumMax).
pub const QUEUE_SIZE: u16 = 8;

/// Why a device could not be brought up.
#[derive(Clone, Copy, Debug)]
pub enum InitError {
    /// FEATURES_OK did not stick.
    FeaturesRejected,
    /// The device lacks VIRTIO_F_VERSION_1.
    NoVersion1,
    /// QueueNumMax is 0 for a queue we need.
    NoQueue(u16),
    /// The queue is already live (QueueReady reads 1 after reset).
    QueueBusy(u16),
    /// Out of DMA memory.
    NoMemory,
}

/// `virtio_mmio.device=<size>@<addr>:<irq>` entries from the command line.
pub fn devices_from_cmdline(bi: &BootInfo) -> ([u64; MAX_DEVICES], usize) {
    let mut out = [0u64; MAX_DEVICES];
    let mut n = 0;
    for v in bi.params("virtio_mmio.device") {
        if n == MAX_DEVICES {
            break;
        }
        if let Some(addr) = parse_device_param(v) {
            out[n] = addr;
            n += 1;
        }
    }
    (out, n)
}

/// Parses a `virtio_mmio.device=` value and returns the base address when the window is at
/// least 512 bytes, 4 KiB aligned and inside the identity map.
pub fn parse_device_param(v: &[u8]) -> Option<u64> {
    let (size, addr, _irq) = parse_virtio_mmio(v)?;
    (size >= 0x200 && addr.is_multiple_of(0x1000) && phys_range_ok(addr, 0x1000)).then_some(addr)
}

/// Bump allocator of zeroed, 4 KiB-aligned guest-physical pages for rings and buffers.
pub struct DmaArena {
    next: u64,
    end: u64,
}

/// Where the DMA window starts (2 MiB, above the guest image) and its size.
const DMA_BASE: u64 = 0x20_0000;
const DMA_SIZE: u64 = 0x10_0000;

impl DmaArena {
    /// The window, if the VMM gave us RAM there.
    pub fn new(bi: &BootInfo) -> Option<Self> {
        bi.in_ram(DMA_BASE, DMA_SIZE).then_some(DmaArena {
            next: DMA_BASE,
            end: DMA_BASE + DMA_SIZE,
        })
    }

    /// `pages` zeroed pages.
    pub fn alloc(&mut self, pages: u64) -> Option<u64> {
        let len = pages.checked_mul(4096)?;
        let a = self.next;
        let end = a.checked_add(len)?;
        if end > self.end {
            return None;
        }
        self.next = end;
        zero(a, len);
        Some(a)
    }
}

/// Zeroes `[addr, addr + len)` (8-byte aligned, inside the DMA window).
fn zero(addr: u64, len: u64) {
    let mut p = addr;
    while p + 8 <= addr + len {
        write64(p, 0);
        p += 8;
    }
}

pub fn write8(addr: u64, v: u8) {
    crate::io::mmio_write8(addr, v);
}
pub fn read8(addr: u64) -> u8 {
    crate::io::mmio_read8(addr)
}
pub fn write16(addr: u64, v: u16) {
    if addr.is_multiple_of(2) && phys_range_ok(addr, 2) {
        // SAFETY: aligned, inside the identity map, in memory the driver owns (ring/buffer).
        unsafe { core::ptr::write_volatile(addr as usize as *mut u16, v) }
    }
}
pub fn read16(addr: u64) -> u16 {
    if addr.is_multiple_of(2) && phys_range_ok(addr, 2) {
        // SAFETY: aligned, inside the identity map.
        unsafe { core::ptr::read_volatile(addr as usize as *const u16) }
    } else {
        u16::MAX
    }
}
pub fn write32(addr: u64, v: u32) {
    mmio_write32(addr, v);
}
pub fn read32(addr: u64) -> u32 {
    mmio_read32(addr)
}
pub fn write64(addr: u64, v: u64) {
    if addr.is_multiple_of(8) && phys_range_ok(addr, 8) {
        // SAFETY: aligned, inside the identity map, in memory the driver owns.
        unsafe { core::ptr::write_volatile(addr as usize as *mut u64, v) }
    }
}
pub fn read64(addr: u64) -> u64 {
    if addr.is_multiple_of(8) && phys_range_ok(addr, 8) {
        // SAFETY: aligned, inside the identity map.
        unsafe { core::ptr::read_volatile(addr as usize as *const u64) }
    } else {
        u64::MAX
    }
}

/// A virtio-mmio register window.
#[derive(Clone, Copy)]
pub struct Mmio {
    pub base: u64,
}

impl Mmio {
    pub fn read(&self, reg: u64) -> u32 {
        mmio_read32(self.base + reg)
    }
    pub fn write(&self, reg: u64, v: u32) {
        mmio_write32(self.base + reg, v)
    }
    pub fn config8(&self, off: u64) -> u8 {
        crate::io::mmio_read8(self.base + REG_CONFIG + off)
    }
    pub fn config32(&self, off: u64) -> u32 {
        self.read(REG_CONFIG + off)
    }
    pub fn config64(&self, off: u64) -> u64 {
        u64::from(self.config32(off)) | (u64::from(self.config32(off + 4)) << 32)
    }
    /// Whether a modern virtio-mmio device is there.
    pub fn probe(&self) -> Option<u32> {
        (self.read(REG_MAGIC) == MAGIC && self.read(REG_VERSION) == 2)
            .then(|| self.read(REG_DEVICE_ID))
    }
    pub fn status(&self) -> u32 {
        self.read(REG_STATUS)
    }
    pub fn device_features(&self) -> u64 {
        self.write(REG_DEVICE_FEATURES_SEL, 0);
        let lo = self.read(REG_DEVICE_FEATURES);
        self.write(REG_DEVICE_FEATURES_SEL, 1);
        let hi = self.read(REG_DEVICE_FEATURES);
        u64::from(lo) | (u64::from(hi) << 32)
    }

    /// Reset, ACKNOWLEDGE, DRIVER, feature negotiation (`wanted` ∩ offered, VERSION_1 required),
    /// FEATURES_OK. Returns the negotiated features.
    pub fn begin_init(&self, wanted: u64) -> Result<u64, InitError> {
        self.write(REG_STATUS, 0);
        self.write(REG_STATUS, STATUS_ACKNOWLEDGE);
        self.write(REG_STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
        let offered = self.device_features();
        if offered & F_VERSION_1 == 0 {
            self.write(REG_STATUS, STATUS_FAILED);
            return Err(InitError::NoVersion1);
        }
        let features = offered & (wanted | F_VERSION_1);
        self.write(REG_DRIVER_FEATURES_SEL, 0);
        self.write(REG_DRIVER_FEATURES, features as u32);
        self.write(REG_DRIVER_FEATURES_SEL, 1);
        self.write(REG_DRIVER_FEATURES, (features >> 32) as u32);
        self.write(
            REG_STATUS,
            STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK,
        );
        if self.status() & STATUS_FEATURES_OK == 0 {
            self.write(REG_STATUS, STATUS_FAILED);
            return Err(InitError::FeaturesRejected);
        }
        Ok(features)
    }

    /// Sets DRIVER_OK.
    pub fn finish_init(&self) {
        self.write(
            REG_STATUS,
            STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK | STATUS_DRIVER_OK,
        );
    }

    /// Sets up queue `index` with up to [`QUEUE_SIZE`] entries in one fresh page.
    pub fn setup_queue(&self, index: u16, arena: &mut DmaArena) -> Result<Virtqueue, InitError> {
        self.write(REG_QUEUE_SEL, u32::from(index));
        if self.read(REG_QUEUE_READY) != 0 {
            return Err(InitError::QueueBusy(index));
        }
        let max = self.read(REG_QUEUE_NUM_MAX);
        if max == 0 {
            return Err(InitError::NoQueue(index));
        }
        let size = QUEUE_SIZE.min(u16::try_from(max).unwrap_or(u16::MAX));
        // Descriptors at 0 (16 * 8 = 128 bytes), avail at 0x400, used at 0x800: one page.
        let page = arena.alloc(1).ok_or(InitError::NoMemory)?;
        let q = Virtqueue {
            index,
            size,
            desc: page,
            avail: page + 0x400,
            used: page + 0x800,
            avail_idx: 0,
            used_idx: 0,
            notify: self.base + REG_QUEUE_NOTIFY,
        };
        self.write(REG_QUEUE_NUM, u32::from(size));
        for (lo, hi, addr) in [
            (REG_QUEUE_DESC_LO, REG_QUEUE_DESC_HI, q.desc),
            (REG_QUEUE_DRIVER_LO, REG_QUEUE_DRIVER_HI, q.avail),
            (REG_QUEUE_DEVICE_LO, REG_QUEUE_DEVICE_HI, q.used),
        ] {
            self.write(lo, addr as u32);
            self.write(hi, (addr >> 32) as u32);
        }
        self.write(REG_QUEUE_READY, 1);
        Ok(q)
    }

    /// Acknowledges whatever interrupt the device raised (we poll, but keep the line quiet).
    pub fn ack_interrupt(&self) {
        let st = self.read(REG_INTERRUPT_STATUS);
        if st != 0 && st != u32::MAX {
            self.write(REG_INTERRUPT_ACK, st);
        }
    }
}

/// One buffer of a descriptor chain.
#[derive(Clone, Copy)]
pub struct Buf {
    pub addr: u64,
    pub len: u32,
    /// Device-writable.
    pub write: bool,
}

/// A split virtqueue driven by polling.
pub struct Virtqueue {
    pub index: u16,
    pub size: u16,
    desc: u64,
    avail: u64,
    used: u64,
    avail_idx: u16,
    used_idx: u16,
    notify: u64,
}

impl Virtqueue {
    /// Writes descriptor `i`.
    fn set_desc(&self, i: u16, b: Buf, next: Option<u16>) {
        let d = self.desc + u64::from(i) * 16;
        write64(d, b.addr);
        write32(d + 8, b.len);
        let mut flags = if b.write { DESC_F_WRITE } else { 0 };
        if next.is_some() {
            flags |= DESC_F_NEXT;
        }
        write16(d + 12, flags);
        write16(d + 14, next.unwrap_or(0));
    }

    /// Puts `bufs` in descriptors `first..first+len` as one chain and makes it available
    /// (without notifying). Returns the head index, or None if it does not fit.
    pub fn push_chain(&mut self, first: u16, bufs: &[Buf]) -> Option<u16> {
        let n = u16::try_from(bufs.len()).ok()?;
        if n == 0 || first.checked_add(n)? > self.size {
            return None;
        }
        for (k, b) in bufs.iter().enumerate() {
            let i = first + k as u16;
            let next = (k + 1 < bufs.len()).then_some(i + 1);
            self.set_desc(i, *b, next);
        }
        self.make_available(first);
        Some(first)
    }

    /// Re-offers an existing descriptor chain whose head is `head`.
    pub fn make_available(&mut self, head: u16) {
        let slot = self.avail_idx % self.size;
        write16(self.avail + 4 + u64::from(slot) * 2, head);
        fence(Ordering::SeqCst);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        write16(self.avail + 2, self.avail_idx);
        fence(Ordering::SeqCst);
    }

    pub fn notify(&self) {
        fence(Ordering::SeqCst);
        mmio_write32(self.notify, u32::from(self.index));
    }

    /// The next used element (head id, written length), if the device returned one.
    pub fn pop_used(&mut self) -> Option<(u32, u32)> {
        let idx = read16(self.used + 2);
        if idx == self.used_idx {
            return None;
        }
        fence(Ordering::SeqCst);
        let slot = self.used_idx % self.size;
        let e = self.used + 4 + u64::from(slot) * 8;
        let id = read32(e);
        let len = read32(e + 4);
        self.used_idx = self.used_idx.wrapping_add(1);
        Some((id, len))
    }

    /// The device's used index and the driver's count of used elements taken: equal when
    /// the device returned exactly what the driver consumed.
    pub fn used_indices(&self) -> (u16, u16) {
        (read16(self.used + 2), self.used_idx)
    }

    /// Polls for a used element for at most `timeout_ticks` TSC ticks.
    pub fn wait_used(&mut self, timeout_ticks: u64) -> Option<(u32, u32)> {
        let t0 = rdtsc();
        loop {
            if let Some(u) = self.pop_used() {
                return Some(u);
            }
            if rdtsc().wrapping_sub(t0) > timeout_ticks {
                return None;
            }
            pause();
        }
    }
}
