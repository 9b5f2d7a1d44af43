//! Starting the APs with INIT-SIPI-SIPI through the xAPIC, and a TSC calibrated against the PIT.

use crate::boot::{ap_trampoline, AP_COUNT};
use crate::io::{inb, mmio_read32, mmio_write32, outb, pause, rdtsc};
use crate::mptable::MpInfo;
use core::sync::atomic::Ordering;

const LAPIC: u64 = 0xfee0_0000;
const LAPIC_ID: u64 = LAPIC + 0x20;
const LAPIC_SVR: u64 = LAPIC + 0xf0;
const LAPIC_ICR_LO: u64 = LAPIC + 0x300;
const LAPIC_ICR_HI: u64 = LAPIC + 0x310;
const ICR_INIT: u32 = 0x0000_0500;
const ICR_STARTUP: u32 = 0x0000_0600;
const ICR_LEVEL_ASSERT: u32 = 1 << 14;
const ICR_TRIGGER_LEVEL: u32 = 1 << 15;
const ICR_BUSY: u32 = 1 << 12;

/// Trampoline page: free low memory per the VMM's layout (0x1000..0x5fff), SIPI vector 0x01.
pub const TRAMPOLINE_ADDR: u64 = 0x1000;
const SIPI_VECTOR: u32 = (TRAMPOLINE_ADDR >> 12) as u32;

/// TSC ticks per millisecond, measured against PIT channel 2 (falls back to 3 GHz).
pub fn tsc_per_ms() -> u64 {
    const PIT_HZ: u64 = 1_193_182;
    const MS: u64 = 10;
    let latch = (PIT_HZ * MS / 1000) as u16;
    // Gate on, speaker off; channel 2, lobyte/hibyte, mode 0.
    outb(0x61, (inb(0x61) & !0x02) | 0x01);
    outb(0x43, 0xb0);
    outb(0x42, latch as u8);
    outb(0x42, (latch >> 8) as u8);
    let t0 = rdtsc();
    let mut polls = 0u32;
    // OUT2 (port 0x61 bit 5) goes high at terminal count; bound the wait by polls.
    while inb(0x61) & 0x20 == 0 && polls < 10_000_000 {
        polls += 1;
    }
    let per_ms = rdtsc().wrapping_sub(t0) / MS;
    // Anything outside 100 MHz..20 GHz means no working PIT: assume 3 GHz.
    if (100_000..=20_000_000).contains(&per_ms) && polls > 1 {
        per_ms
    } else {
        3_000_000
    }
}

fn delay_ticks(ticks: u64) {
    let t0 = rdtsc();
    while rdtsc().wrapping_sub(t0) < ticks {
        pause();
    }
}

fn wait_icr_idle(tsc_ms: u64) {
    let t0 = rdtsc();
    while mmio_read32(LAPIC_ICR_LO) & ICR_BUSY != 0 && rdtsc().wrapping_sub(t0) < tsc_ms {
        pause();
    }
}

fn send_ipi(apic_id: u8, icr: u32, tsc_ms: u64) {
    mmio_write32(LAPIC_ICR_HI, u32::from(apic_id) << 24);
    mmio_write32(LAPIC_ICR_LO, icr);
    wait_icr_idle(tsc_ms);
}

/// Result of [`start_aps`].
pub struct SmpResult {
    /// CPUs running, BSP included.
    pub started: u32,
    /// What the BSP saw, for the log when APs did not come up.
    pub bsp_apic_id: u8,
    pub lapic_svr: u32,
    pub waited_ms: u64,
}

/// Copies the trampoline, sends INIT-SIPI-SIPI to every MP-table processor but ourselves, and
/// waits (at most `timeout_ms`) for them to check in.
pub fn start_aps(mp: &MpInfo, timeout_ms: u64) -> SmpResult {
    let bsp_apic_id = (mmio_read32(LAPIC_ID) >> 24) as u8;
    let ids = &mp.apic_ids[..mp.cpus.min(mp.apic_ids.len())];
    if ids.iter().all(|&id| id == bsp_apic_id) {
        return SmpResult {
            started: 1,
            bsp_apic_id,
            lapic_svr: 0,
            waited_ms: 0,
        };
    }
    let tsc_ms = tsc_per_ms().max(1);
    let tramp = ap_trampoline();
    let tramp = &tramp[..tramp.len().min(4096)];
    for (i, &b) in tramp.iter().enumerate() {
        // SAFETY: 0x1000..0x2000 is free guest RAM by the VMM's layout contract (documented in
        // vmm/src/arch/x86_64/layout.rs) and identity-mapped; nothing else of ours lives there.
        unsafe { core::ptr::write_volatile((TRAMPOLINE_ADDR as usize + i) as *mut u8, b) };
    }
    // Software-enable the local APIC (spurious vector 0xff).
    let svr = mmio_read32(LAPIC_SVR);
    mmio_write32(LAPIC_SVR, svr | 0x1ff);
    let targets = ids.iter().copied().filter(|&id| id != bsp_apic_id);
    for id in targets.clone() {
        send_ipi(id, ICR_INIT | ICR_LEVEL_ASSERT | ICR_TRIGGER_LEVEL, tsc_ms);
        send_ipi(id, ICR_INIT | ICR_TRIGGER_LEVEL, tsc_ms);
    }
    delay_ticks(tsc_ms * 10);
    for _ in 0..2 {
        for id in targets.clone() {
            send_ipi(id, ICR_STARTUP | SIPI_VECTOR, tsc_ms);
        }
        delay_ticks(tsc_ms / 5);
    }
    let expected = targets.count() as u32;
    let t0 = rdtsc();
    let limit = tsc_ms.saturating_mul(timeout_ms);
    while AP_COUNT.load(Ordering::Acquire) < expected && rdtsc().wrapping_sub(t0) < limit {
        pause();
    }
    SmpResult {
        started: 1 + AP_COUNT.load(Ordering::Acquire),
        bsp_apic_id,
        lapic_svr: svr,
        waited_ms: rdtsc().wrapping_sub(t0) / tsc_ms.max(1),
    }
}
