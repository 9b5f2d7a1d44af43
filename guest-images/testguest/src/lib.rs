//! microvirt's test guest: a tiny `no_std` x86_64 program that reports what the VMM gave it
//! (boot protocol, command line, memory, initrd, CPUs) on COM1 and then runs one scenario
//! selected by `testguest.scenario=NAME` on the command line.
//!
//! This crate is built by `testguest-build` for the host triple with a linker script (see
//! `build.rs`); it is not a workspace member.
#![no_std]

pub mod acpi;
pub mod blk;
pub mod boot;
pub mod bootinfo;
pub mod i8042;
pub mod io;
pub mod mem;
pub mod mptable;
pub mod net;
pub mod netserve;
pub mod packet;
pub mod parse;
pub mod pvclock;
pub mod reboot;
pub mod rng;
pub mod serial;
pub mod slowdisk;
pub mod smp;
pub mod snap;
pub mod ticker;
pub mod virtio;
pub mod vmgenid;

mod scenarios;

use bootinfo::{BootInfo, Entry};
use core::panic::PanicInfo;

/// Boot-timer device (byte 123 marks "booted").
const BOOT_TIMER: u64 = 0xc000_0000;
const BOOT_TIMER_MAGIC: u8 = 123;
/// How long the BSP waits at most for APs to check in. It stops waiting as soon as all have; the
/// bound only matters for an AP that never starts. Generous, as Linux's 10 s: each vCPU is a host
/// thread, and on a busy host one may not run for a while (300 ms here once left `cpus: 3/4` in
/// `vmm --test boot` on a machine with load ~10).
const AP_TIMEOUT_MS: u64 = 10_000;

/// The single boot-info copy (the BSP writes it once, before anything reads it).
static mut BOOT_INFO: BootInfo = BootInfo::EMPTY;

/// Called by the entry assembly on the guest's stack with its page tables and GDT loaded.
#[no_mangle]
pub extern "C" fn rust_entry(kind: u64, info: u64) -> ! {
    // SAFETY: single-threaded here (APs are started later and never touch BOOT_INFO); this is
    // the only mutable access, and it happens before any shared reference is created.
    let bi: &'static BootInfo = unsafe {
        let slot = &mut *core::ptr::addr_of_mut!(BOOT_INFO);
        if kind == boot::BOOT_PVH {
            slot.load_pvh(info);
        } else {
            slot.load_boot_params(info);
        }
        &*slot
    };
    if bi.param("testguest.scenario") == Some(b"counter") {
        // The APs count instead of halting (they read this once, when they start).
        boot::AP_SPIN.store(1, core::sync::atomic::Ordering::Release);
    }
    report(bi);
    scenarios::run(bi)
}

fn report(bi: &BootInfo) {
    println!("microvirt-testguest: entry={}", bi.entry.name());
    if !bi.valid {
        println!("warning: boot info signature missing");
    }
    print!("cmdline: ");
    serial::write_bytes_escaped(bi.cmdline());
    println!();
    println!("mem: {} MiB", bi.ram_bytes >> 20);
    match bi.initrd {
        None => println!("initrd: none"),
        Some(r) if bi.in_ram(r.start, r.len) => {
            let sum = initrd_sum(r.start, r.len);
            println!("initrd: {} bytes sum={:08x}", r.len, sum);
        }
        Some(r) => println!("initrd: {} bytes at {:#x} outside RAM", r.len, r.start),
    }
    let (started, total) = match mptable::parse() {
        Some(mp) => {
            let r = smp::start_aps(&mp, AP_TIMEOUT_MS);
            if r.started as usize != mp.cpus {
                println!(
                    "smp: bsp apic id {} svr {:#x} waited {} ms for {} APs, {} checked in",
                    r.bsp_apic_id,
                    r.lapic_svr,
                    r.waited_ms,
                    mp.cpus.saturating_sub(1),
                    r.started.saturating_sub(1)
                );
            }
            (r.started as usize, mp.cpus)
        }
        None => {
            println!("smp: no MP table");
            (1, 0)
        }
    };
    println!("cpus: {}/{}", started, total);
    if bi.param("testguest.scenario") == Some(b"no-boot-timer") {
        // A stock guest's view: nothing ever writes microvirt's boot timer.
        println!("boot-timer: not written");
        return;
    }
    io::mmio_write8(BOOT_TIMER, BOOT_TIMER_MAGIC);
    println!("boot-timer: written");
}

/// 32-bit wrapping sum of the bytes in `[start, start + len)`, which the caller checked lies in
/// RAM inside the identity map. Sums eight bytes per load (the guest may be emulated, so the
/// instruction count matters).
fn initrd_sum(start: u64, len: u64) -> u32 {
    const LO: u64 = 0x00ff_00ff_00ff_00ff;
    let mut sum = 0u32;
    let mut addr = start;
    let end = start + len;
    while addr < end && !addr.is_multiple_of(8) {
        sum = sum.wrapping_add(u32::from(io::phys_u8(addr)));
        addr += 1;
    }
    while end - addr >= 8 {
        // Four 16-bit lanes; each word adds at most 2 * 255 per lane, so 128 words fit.
        let words = ((end - addr) / 8).min(128);
        let mut lanes = 0u64;
        for i in 0..words {
            // SAFETY: `addr + 8 * i + 8 <= end`, inside RAM the caller validated; aligned.
            let w = unsafe { core::ptr::read_volatile((addr + i * 8) as usize as *const u64) };
            lanes += (w & LO) + ((w >> 8) & LO);
        }
        let folded =
            (lanes & 0xffff) + ((lanes >> 16) & 0xffff) + ((lanes >> 32) & 0xffff) + (lanes >> 48);
        sum = sum.wrapping_add(folded as u32);
        addr += words * 8;
    }
    while addr < end {
        sum = sum.wrapping_add(u32::from(io::phys_u8(addr)));
        addr += 1;
    }
    sum
}

/// The boot information (written once by [`rust_entry`] before anything reads it).
pub fn boot_info() -> &'static BootInfo {
    // SAFETY: BOOT_INFO is written only in `rust_entry`, before any scenario runs.
    unsafe { &*core::ptr::addr_of!(BOOT_INFO) }
}

/// Ends the run: powers off through ACPI (the FADT's sleep control register with `\_S5_`'s
/// sleep type) when the VM has ACPI tables, else resets through the i8042 (a VM without ACPI
/// has no power-off). A VMM that reboots in place keeps a resetting guest running, so the
/// scenarios end with a power-off where there is one.
pub fn finish() -> ! {
    if let Some((port, typ)) = acpi::discover(boot_info()).and_then(|p| p.sleep) {
        acpi::power_off(port, typ)
    }
    reset()
}

/// Resets through the i8042; halts if the VMM ignores it.
pub fn reset() -> ! {
    i8042::reset();
    io::halt_forever()
}

/// How [`triple_fault`] raises its first exception.
#[derive(Clone, Copy)]
pub enum Fault {
    /// `int3` (#BP).
    Breakpoint,
    /// `ud2` (#UD).
    InvalidOpcode,
    /// Divide by zero (#DE).
    DivideError,
    /// Load through a non-canonical address (#GP).
    GeneralProtection,
}

/// Forces a triple fault: zero-limit IDT, then an exception.
pub fn triple_fault(fault: Fault) -> ! {
    let idtr = [0u8; 10];
    // SAFETY: deliberately makes every exception unhandleable so the first one escalates to a
    // triple fault (shutdown); nothing runs afterwards.
    unsafe {
        core::arch::asm!("lidt [{}]", in(reg) idtr.as_ptr(), options(nostack));
        match fault {
            Fault::Breakpoint => core::arch::asm!("int3", options(nostack)),
            Fault::InvalidOpcode => core::arch::asm!("ud2", options(nostack)),
            Fault::DivideError => core::arch::asm!(
                "xor edx, edx", "xor ecx, ecx", "div ecx",
                out("eax") _, out("ecx") _, out("edx") _, options(nostack)
            ),
            Fault::GeneralProtection => core::arch::asm!(
                "mov rax, 0x8000000000000000", "mov rax, [rax]",
                out("rax") _, options(nostack)
            ),
        }
    }
    io::halt_forever()
}

#[panic_handler]
fn panic(info: &PanicInfo) -> ! {
    println!("testguest: panic: {}", info);
    triple_fault(Fault::Breakpoint)
}

impl Entry {
    /// Whether this is the PVH entry.
    pub fn is_pvh(self) -> bool {
        self == Entry::Pvh
    }
}
