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

/// TSC ticks per millisecond: what KVM reports through kvm-clock ([`crate::pvclock`]), else
/// measured against PIT channel 2 (else 3 GHz).
///
/// The PIT counts real time, the vCPU does not always run: a vCPU thread descheduled between
/// the start of the count and the read of the TSC, or between the end of the count and the poll
/// that sees it, stretches or shrinks the measured window (1.82 and 2.93 GHz were measured on a
/// loaded 2.6 GHz host). Each try knows its own uncertainty — the TSC time between the
/// two reads around each edge — and one whose uncertainty is over 1% of the window is tried
/// again; after [`CALIBRATION_TRIES`] the most certain one is used.
pub fn tsc_per_ms() -> u64 {
    if let Some(khz) = crate::pvclock::tsc_khz() {
        return khz;
    }
    let mut best: Option<Calibration> = None;
    for _ in 0..CALIBRATION_TRIES {
        let Some(c) = calibrate_once() else { break };
        if c.uncertain * 100 <= c.ticks {
            return c.per_ms();
        }
        if best.is_none_or(|b| c.uncertain < b.uncertain) {
            best = Some(c);
        }
    }
    best.map_or(3_000_000, |c| c.per_ms())
}

/// Tries before [`tsc_per_ms`] settles for the most certain one.
const CALIBRATION_TRIES: u32 = 8;
/// The calibration window.
const CALIBRATION_MS: u64 = 10;

#[derive(Clone, Copy)]
struct Calibration {
    /// TSC ticks in the window (midpoints of the edges' brackets).
    ticks: u64,
    /// Width of the two brackets together.
    uncertain: u64,
}

impl Calibration {
    fn per_ms(self) -> u64 {
        self.ticks / CALIBRATION_MS
    }
}

/// One PIT channel 2 count of [`CALIBRATION_MS`]; None without a working PIT (anything outside
/// 100 MHz..20 GHz).
fn calibrate_once() -> Option<Calibration> {
    const PIT_HZ: u64 = 1_193_182;
    let latch = (PIT_HZ * CALIBRATION_MS / 1000) as u16;
    // Gate on, speaker off; channel 2, lobyte/hibyte, mode 0.
    outb(0x61, (inb(0x61) & !0x02) | 0x01);
    outb(0x43, 0xb0);
    outb(0x42, latch as u8);
    // The count starts with the high byte: it is bracketed by two TSC reads.
    let s0 = rdtsc();
    outb(0x42, (latch >> 8) as u8);
    let s1 = rdtsc();
    // OUT2 (port 0x61 bit 5) goes high at terminal count, between the last poll that saw it
    // low (after `before`) and the one that sees it high (before `after`).
    let mut before = s1;
    let mut polls = 0u32;
    let after = loop {
        let t = rdtsc();
        let high = inb(0x61) & 0x20 != 0;
        if high {
            break rdtsc();
        }
        polls += 1;
        if polls >= 10_000_000 {
            return None;
        }
        before = t;
    };
    let ticks = (before / 2 + after / 2).wrapping_sub(s0 / 2 + s1 / 2);
    let per_ms = ticks / CALIBRATION_MS;
    ((100_000..=20_000_000).contains(&per_ms) && polls > 1).then_some(Calibration {
        ticks,
        uncertain: (s1 - s0) + (after - before),
    })
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
