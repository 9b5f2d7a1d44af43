//! `ticker` scenario: an idle guest that shows it is alive, for VM pool tests. Every
//! `testguest.tick_ms` (default 1000) it prints
//!
//! ```text
//! tick n=<count> uptime-ms=<ms since the ticker started> boot-id=<hex> rng=<hex>
//! ```
//!
//! and sleeps in `hlt` in between, woken by the local APIC's TSC-deadline timer (so an idle
//! ticker costs no host CPU; without that timer it falls back to spinning). `boot-id` is drawn
//! once at boot (RDRAND, else the TSC); `rng` is the next value of a generator seeded with it.
//!
//! A restored clone continues the count and the uptime where the snapshot left them (the VMM
//! advances the TSC by the time that passed) and keeps the boot id: clones of one snapshot share
//! it, as they share any state drawn before the snapshot. When a tick finds that much more time
//! passed than one period (the VM was paused, snapshotted and restored), the ticker reseeds its
//! generator from RDRAND (else the TSC) and prints
//!
//! ```text
//! ticker: resumed after <ms> ms: rng reseeded
//! ```
//!
//! so clones diverge from then on — the guest-side reseed a Linux guest can do too (a jump of
//! its clock, then `RNDRESEEDCRNG`), as there is no VM generation ID device without ACPI.

use core::arch::{asm, global_asm};

use crate::bootinfo::BootInfo;
use crate::io::{cpuid, mmio_read32, mmio_write32, outb, pause, rdtsc, wrmsr};
use crate::parse::parse_num;
use crate::println;
use crate::smp::tsc_per_ms;

const LAPIC_SVR: u64 = 0xfee0_00f0;
const LAPIC_LVT_TIMER: u64 = 0xfee0_0320;
const MSR_TSC_DEADLINE: u32 = 0x6e0;
const TIMER_VECTOR: u32 = 0x40;
const LVT_TSC_DEADLINE: u32 = 0b10 << 17;
/// A tick this many periods late means the VM did not run in between.
const GAP_PERIODS: u64 = 3;

/// One 64-bit interrupt gate.
#[derive(Clone, Copy)]
#[repr(C)]
struct Gate {
    offset_lo: u16,
    selector: u16,
    ist: u8,
    attr: u8,
    offset_mid: u16,
    offset_hi: u32,
    reserved: u32,
}

impl Gate {
    const EMPTY: Gate = Gate {
        offset_lo: 0,
        selector: 0,
        ist: 0,
        attr: 0,
        offset_mid: 0,
        offset_hi: 0,
        reserved: 0,
    };

    fn to(handler: u64) -> Gate {
        Gate {
            offset_lo: handler as u16,
            // The guest GDT's 64-bit code segment (boot.rs).
            selector: 0x08,
            ist: 0,
            // Present, DPL 0, 64-bit interrupt gate.
            attr: 0x8e,
            offset_mid: (handler >> 16) as u16,
            offset_hi: (handler >> 32) as u32,
            reserved: 0,
        }
    }
}

#[repr(C, align(16))]
struct Idt([Gate; 256]);

static mut IDT: Idt = Idt([Gate::EMPTY; 256]);

extern "C" {
    fn ticker_irq();
    fn ticker_fault();
}

// `ticker_irq`: acknowledge the local APIC (EOI) and return; the main loop looks at the TSC.
// `ticker_fault`: an exception — stop this CPU (the test sees the ticks stop).
global_asm!(
    r#"
    .global ticker_irq
ticker_irq:
    push %rax
    push %rdx
    mov $0xfee000b0, %edx
    movl $0, (%rdx)
    pop %rdx
    pop %rax
    iretq

    .global ticker_fault
ticker_fault:
    cli
    hlt
    jmp ticker_fault
"#,
    options(att_syntax)
);

fn cpuid1_ecx() -> u32 {
    cpuid(1)[2]
}

/// A hardware random number (RDRAND), if the CPU has one and it delivers.
fn rdrand() -> Option<u64> {
    if cpuid1_ecx() & (1 << 30) == 0 {
        return None;
    }
    for _ in 0..10 {
        let v: u64;
        let ok: u8;
        // SAFETY: RDRAND is present (CPUID.1:ECX[30]); it only writes the two outputs.
        unsafe { asm!("rdrand {v}", "setc {ok}", v = out(reg) v, ok = out(reg_byte) ok, options(nomem, nostack)) };
        if ok == 1 {
            return Some(v);
        }
    }
    None
}

/// A seed: RDRAND, else the TSC mixed.
fn seed() -> u64 {
    rdrand().unwrap_or_else(|| {
        let t = rdtsc();
        t ^ t.rotate_left(29) ^ 0x9e37_79b9_7f4a_7c15
    })
}

/// xorshift64*.
fn next(state: &mut u64) -> u64 {
    if *state == 0 {
        *state = 0x2545_f491_4f6c_dd1d;
    }
    let mut x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    x.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// Loads an IDT whose vectors 32..255 acknowledge and return (0..31: stop), masks the legacy
/// PICs, enables the local APIC and puts its timer in TSC-deadline mode. Returns false when the
/// CPU has no TSC-deadline timer.
fn setup_timer() -> bool {
    if cpuid1_ecx() & (1 << 24) == 0 {
        return false;
    }
    // SAFETY: single CPU here (APs halt), interrupts are off; the IDT is a static that lives
    // for the whole run and is written before `lidt` loads it.
    unsafe {
        let idt = &mut *core::ptr::addr_of_mut!(IDT);
        for (v, g) in idt.0.iter_mut().enumerate() {
            *g = Gate::to(if v < 32 {
                ticker_fault as *const () as usize as u64
            } else {
                ticker_irq as *const () as usize as u64
            });
        }
        let base = idt as *const Idt as u64;
        let mut desc = [0u8; 10];
        desc[..2].copy_from_slice(&((core::mem::size_of::<Idt>() - 1) as u16).to_le_bytes());
        desc[2..].copy_from_slice(&base.to_le_bytes());
        asm!("lidt [{}]", in(reg) desc.as_ptr(), options(nostack, preserves_flags));
    }
    // Both 8259s masked: only the local APIC timer interrupts us.
    outb(0x21, 0xff);
    outb(0xa1, 0xff);
    mmio_write32(LAPIC_SVR, mmio_read32(LAPIC_SVR) | 0x1ff);
    mmio_write32(LAPIC_LVT_TIMER, TIMER_VECTOR | LVT_TSC_DEADLINE);
    true
}

/// Sleeps until the TSC reaches `deadline`.
fn sleep_until(deadline: u64, timer: bool) {
    while rdtsc() < deadline {
        if timer {
            wrmsr(MSR_TSC_DEADLINE, deadline);
            // SAFETY: `sti; hlt` waits for the armed timer (STI takes effect after HLT
            // starts, so the interrupt cannot slip in between); the handler only sends EOI.
            unsafe { asm!("sti", "hlt", "cli", options(nomem, nostack)) };
        } else {
            pause();
        }
    }
}

/// The `ticker` scenario (see the module doc).
pub fn run(bi: &BootInfo) -> ! {
    let period_ms = bi
        .param("testguest.tick_ms")
        .and_then(parse_num)
        .unwrap_or(1000)
        .max(10);
    let per_ms = tsc_per_ms().max(1);
    let timer = setup_timer();
    let boot_id = seed();
    let mut rng = boot_id;
    println!(
        "ticker: boot-id={:016x} period-ms={} timer={} tsc-khz={}",
        boot_id,
        period_ms,
        if timer { "tsc-deadline" } else { "spin" },
        per_ms
    );
    let period = period_ms * per_ms;
    let start = rdtsc();
    let mut last = start;
    let mut n = 0u64;
    loop {
        sleep_until(last + period, timer);
        let now = rdtsc();
        let late = now.saturating_sub(last);
        if late > GAP_PERIODS * period {
            rng ^= seed();
            println!("ticker: resumed after {} ms: rng reseeded", late / per_ms);
        }
        n += 1;
        println!(
            "tick n={} uptime-ms={} boot-id={:016x} rng={:016x}",
            n,
            now.saturating_sub(start) / per_ms,
            boot_id,
            next(&mut rng)
        );
        last = now;
    }
}
