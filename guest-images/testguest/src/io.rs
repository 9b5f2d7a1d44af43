//! Port I/O, MMIO and a few privileged instructions.

use core::arch::asm;

/// Reads a byte from an I/O port.
pub fn inb(port: u16) -> u8 {
    let v: u8;
    // SAFETY: port reads have no memory effects; the guest runs at CPL 0 with no other
    // software that could rely on device state.
    unsafe {
        asm!("in al, dx", out("al") v, in("dx") port, options(nomem, nostack, preserves_flags))
    };
    v
}

/// Reads a 32-bit value from an I/O port.
pub fn inl(port: u16) -> u32 {
    let v: u32;
    // SAFETY: as for `inb`.
    unsafe {
        asm!("in eax, dx", out("eax") v, in("dx") port, options(nomem, nostack, preserves_flags))
    };
    v
}

/// Writes a byte to an I/O port.
pub fn outb(port: u16, v: u8) {
    // SAFETY: port writes have no memory effects visible to Rust.
    unsafe {
        asm!("out dx, al", in("dx") port, in("al") v, options(nomem, nostack, preserves_flags))
    };
}

/// Writes a 32-bit value to an I/O port.
pub fn outl(port: u16, v: u32) {
    // SAFETY: as for `outb`.
    unsafe {
        asm!("out dx, eax", in("dx") port, in("eax") v, options(nomem, nostack, preserves_flags))
    };
}

/// Reads the time-stamp counter.
pub fn rdtsc() -> u64 {
    let lo: u32;
    let hi: u32;
    // SAFETY: rdtsc only reads the TSC.
    unsafe {
        asm!("rdtsc", out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags))
    };
    (u64::from(hi) << 32) | u64::from(lo)
}

/// CPUID `leaf` (sub-leaf 0) as EAX, EBX, ECX, EDX.
pub fn cpuid(leaf: u32) -> [u32; 4] {
    let (a, c, d): (u32, u32, u32);
    let b: u64;
    // SAFETY: CPUID has no side effects (a leaf above the maximum returns another leaf's data,
    // which callers check); rbx is saved and restored around it (LLVM reserves it).
    unsafe {
        asm!(
            "mov {tmp:r}, rbx",
            "cpuid",
            "xchg {tmp:r}, rbx",
            tmp = out(reg) b,
            inout("eax") leaf => a,
            inout("ecx") 0u32 => c,
            out("edx") d,
            options(nostack, preserves_flags)
        );
    }
    [a, b as u32, c, d]
}

/// Writes model-specific register `msr`. Callers only write MSRs the CPU (CPUID) offers, with
/// values whose effects they own (a timer deadline, the kvm-clock area).
pub fn wrmsr(msr: u32, v: u64) {
    // SAFETY: WRMSR changes no memory Rust knows of; an MSR the CPU lacks raises #GP, which
    // the callers rule out through CPUID first.
    unsafe {
        asm!("wrmsr", in("ecx") msr, in("eax") v as u32, in("edx") (v >> 32) as u32, options(nostack, preserves_flags))
    };
}

/// Spin-loop hint.
pub fn pause() {
    core::hint::spin_loop();
}

/// Halts this CPU forever with interrupts off.
pub fn halt_forever() -> ! {
    loop {
        // SAFETY: cli/hlt only stop this CPU; nothing is left to run.
        unsafe { asm!("cli", "hlt", options(nomem, nostack)) };
    }
}

/// Everything the guest touches through raw physical addresses: the identity map covers the low
/// 4 GiB, so any address in `[0x1000, 4 GiB)` can be read without faulting (RAM, or all-ones
/// from unbacked MMIO).
pub const MAPPED_END: u64 = 0x1_0000_0000;
const MAPPED_START: u64 = 0x1000;

/// Returns whether `[addr, addr + len)` lies inside the guest's identity map.
pub fn phys_range_ok(addr: u64, len: u64) -> bool {
    addr >= MAPPED_START && addr.checked_add(len).is_some_and(|end| end <= MAPPED_END)
}

/// Reads `buf.len()` bytes of guest-physical memory at `addr`, or returns false (nothing read)
/// when the range is outside the identity map.
pub fn phys_read(addr: u64, buf: &mut [u8]) -> bool {
    if !phys_range_ok(addr, buf.len() as u64) {
        return false;
    }
    for (i, b) in buf.iter_mut().enumerate() {
        // SAFETY: the range was checked to lie in the identity-mapped low 4 GiB above the null
        // page; volatile byte reads of RAM or MMIO cannot fault there.
        *b = unsafe { core::ptr::read_volatile((addr as usize + i) as *const u8) };
    }
    true
}

/// Reads one byte of guest-physical memory (0xff when outside the map).
pub fn phys_u8(addr: u64) -> u8 {
    let mut b = [0xffu8; 1];
    phys_read(addr, &mut b);
    b[0]
}

macro_rules! phys_int {
    ($name:ident, $t:ty) => {
        #[doc = concat!("Reads a little-endian `", stringify!($t), "` (all-ones when outside the map).")]
        pub fn $name(addr: u64) -> $t {
            if !phys_range_ok(addr, core::mem::size_of::<$t>() as u64) {
                return <$t>::MAX;
            }
            // SAFETY: inside the identity map above the null page (see `phys_read`); the
            // unaligned read is a single load on x86.
            unsafe { core::ptr::read_unaligned(addr as usize as *const $t) }
        }
    };
}
phys_int!(phys_u16, u16);
phys_int!(phys_u32, u32);
phys_int!(phys_u64, u64);

/// 32-bit MMIO read. Returns all-ones when `addr` is outside the map or unaligned.
pub fn mmio_read32(addr: u64) -> u32 {
    if !addr.is_multiple_of(4) || !phys_range_ok(addr, 4) {
        return u32::MAX;
    }
    // SAFETY: aligned, inside the identity map (uncached from 3 GiB up); an MMIO read.
    unsafe { core::ptr::read_volatile(addr as usize as *const u32) }
}

/// 32-bit MMIO write; ignored when `addr` is outside the map or unaligned.
pub fn mmio_write32(addr: u64, v: u32) {
    if !addr.is_multiple_of(4) || !phys_range_ok(addr, 4) {
        return;
    }
    // SAFETY: aligned, inside the identity map; the guest owns all of physical memory and only
    // points this at device registers or its own buffers.
    unsafe { core::ptr::write_volatile(addr as usize as *mut u32, v) }
}

/// 8-bit MMIO read (all-ones when outside the map).
pub fn mmio_read8(addr: u64) -> u8 {
    phys_u8(addr)
}

/// 8-bit MMIO write; ignored when outside the map.
pub fn mmio_write8(addr: u64, v: u8) {
    if !phys_range_ok(addr, 1) {
        return;
    }
    // SAFETY: inside the identity map; see `mmio_write32`.
    unsafe { core::ptr::write_volatile(addr as usize as *mut u8, v) }
}
