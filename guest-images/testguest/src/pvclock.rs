//! The TSC frequency from KVM's paravirtual clock (kvm-clock), as Linux reads it on KVM.
//!
//! Counting TSC ticks against the PIT is only as good as the vCPU's scheduling: on a loaded
//! host every port read of the poll can cost a scheduler slice, and a 10 ms window then
//! measures anything from 1.8 to 2.9 GHz on a 2.6 GHz host. KVM knows the frequency: with
//! `KVM_FEATURE_CLOCKSOURCE2` the guest names a `pvclock_vcpu_time_info` in
//! `MSR_KVM_SYSTEM_TIME_NEW`, KVM fills it on the next entry with the TSC → nanoseconds scale,
//! and the guest turns kvm-clock off again (it keeps no state in the VM a snapshot would carry).

use core::ptr::{addr_of, addr_of_mut, read_volatile, write_volatile};

use crate::io::{cpuid, wrmsr};

const LEAF_KVM_SIGNATURE: u32 = 0x4000_0000;
const LEAF_KVM_FEATURES: u32 = 0x4000_0001;
/// "KVMKVMKVM\0\0\0" in EBX, ECX, EDX.
const KVM_SIGNATURE: [u32; 3] = [0x4b4d_564b, 0x564b_4d56, 0x0000_004d];
const KVM_FEATURE_CLOCKSOURCE2: u32 = 1 << 3;
const MSR_KVM_SYSTEM_TIME_NEW: u32 = 0x4b56_4d01;
/// Reads of the version before giving up on KVM filling the structure.
const POLLS: u32 = 100_000;

/// `struct pvclock_vcpu_time_info` (32 bytes; must not cross a page).
#[repr(C, align(64))]
struct TimeInfo {
    version: u32,
    pad0: u32,
    tsc_timestamp: u64,
    system_time: u64,
    tsc_to_system_mul: u32,
    tsc_shift: i8,
    flags: u8,
    pad: [u8; 2],
}

static mut TIME_INFO: TimeInfo = TimeInfo {
    version: 0,
    pad0: 0,
    tsc_timestamp: 0,
    system_time: 0,
    tsc_to_system_mul: 0,
    tsc_shift: 0,
    flags: 0,
    pad: [0; 2],
};

/// The TSC frequency in kHz (TSC ticks per millisecond) KVM reports, or None when the guest
/// does not run on KVM with kvm-clock or KVM did not answer.
pub fn tsc_khz() -> Option<u64> {
    let sig = cpuid(LEAF_KVM_SIGNATURE);
    if sig[1..] != KVM_SIGNATURE {
        return None;
    }
    // A maximum leaf of 0 means 0x40000001 (KVM's own convention, as Linux reads it).
    if sig[0] != 0 && sig[0] < LEAF_KVM_FEATURES {
        return None;
    }
    if cpuid(LEAF_KVM_FEATURES)[0] & KVM_FEATURE_CLOCKSOURCE2 == 0 {
        return None;
    }
    let info = addr_of_mut!(TIME_INFO);
    // SAFETY: one CPU runs this (the APs are parked or not started); the structure is a static
    // only this function uses, and the low 4 GiB are identity-mapped, so its address is the
    // guest-physical address KVM writes to while kvm-clock is on.
    unsafe {
        write_volatile(addr_of_mut!((*info).version), 0);
        wrmsr(MSR_KVM_SYSTEM_TIME_NEW, addr_of!(TIME_INFO) as u64 | 1);
    }
    let mut scale = None;
    for _ in 0..POLLS {
        // SAFETY: as above; KVM updates the structure between guest instructions (odd version
        // while it writes), so a read is consistent when the version is even, non-zero and the
        // same before and after.
        let (v1, mul, shift, v2) = unsafe {
            let v1 = read_volatile(addr_of!((*info).version));
            let mul = read_volatile(addr_of!((*info).tsc_to_system_mul));
            let shift = read_volatile(addr_of!((*info).tsc_shift));
            let v2 = read_volatile(addr_of!((*info).version));
            (v1, mul, shift, v2)
        };
        if v1 != 0 && v1 % 2 == 0 && v1 == v2 && mul != 0 {
            scale = Some((mul, shift));
            break;
        }
        core::hint::spin_loop();
    }
    wrmsr(MSR_KVM_SYSTEM_TIME_NEW, 0);
    let (mul, shift) = scale?;
    Some(khz_from_scale(mul, shift))
}

/// kvm-clock's scale (ns = (ticks << shift) * mul >> 32, or >> -shift) as TSC kHz.
fn khz_from_scale(mul: u32, shift: i8) -> u64 {
    let khz = (1_000_000u64 << 32) / u64::from(mul);
    if shift < 0 {
        khz << u32::from(shift.unsigned_abs())
    } else {
        khz >> shift as u32
    }
}
