//! Which MSRs travel in a snapshot.
//!
//! KVM_GET_MSR_INDEX_LIST names every MSR KVM can save; a snapshot keeps the ones guest state
//! depends on ([`should_save`]): the TSC and its deadline/adjust/aux MSRs, the APIC base,
//! SYSCALL/SYSENTER, FS/GS bases, PAT, MTRRs, MISC_ENABLE, SPEC_CTRL, XSS, and every KVM
//! paravirtual MSR (kvm-clock, steal time, async page faults, PV EOI, poll control).
//! Restore writes them in [`restore_order`]: the TSC first (kvm-clock and the TSC deadline are
//! relative to it), the TSC deadline last (after the LAPIC is in deadline mode).

pub const MSR_IA32_TSC: u32 = 0x10;
pub const MSR_KVM_WALL_CLOCK: u32 = 0x11;
pub const MSR_KVM_SYSTEM_TIME: u32 = 0x12;
pub const MSR_IA32_APICBASE: u32 = 0x1b;
pub const MSR_IA32_TSC_ADJUST: u32 = 0x3b;
pub const MSR_IA32_SPEC_CTRL: u32 = 0x48;
pub const MSR_IA32_SYSENTER_CS: u32 = 0x174;
pub const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
pub const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
pub const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
pub const MSR_MTRR_PHYS_FIRST: u32 = 0x200;
pub const MSR_MTRR_PHYS_LAST: u32 = 0x21f;
pub const MSR_MTRR_FIX64K: u32 = 0x250;
pub const MSR_MTRR_FIX16K_80000: u32 = 0x258;
pub const MSR_MTRR_FIX16K_A0000: u32 = 0x259;
pub const MSR_MTRR_FIX4K_FIRST: u32 = 0x268;
pub const MSR_MTRR_FIX4K_LAST: u32 = 0x26f;
pub const MSR_IA32_CR_PAT: u32 = 0x277;
pub const MSR_MTRR_DEF_TYPE: u32 = 0x2ff;
pub const MSR_IA32_TSC_DEADLINE: u32 = 0x6e0;
pub const MSR_IA32_XSS: u32 = 0xda0;
pub const MSR_EFER: u32 = 0xc000_0080;
pub const MSR_STAR: u32 = 0xc000_0081;
pub const MSR_LSTAR: u32 = 0xc000_0082;
pub const MSR_CSTAR: u32 = 0xc000_0083;
pub const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
pub const MSR_FS_BASE: u32 = 0xc000_0100;
pub const MSR_GS_BASE: u32 = 0xc000_0101;
pub const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;
pub const MSR_TSC_AUX: u32 = 0xc000_0103;
pub const MSR_AMD64_VIRT_SPEC_CTRL: u32 = 0xc001_011f;
/// KVM paravirtual MSRs (kvm-clock, steal time, async PF, PV EOI, poll control, ...).
pub const MSR_KVM_PV_FIRST: u32 = 0x4b56_4d00;
pub const MSR_KVM_PV_LAST: u32 = 0x4b56_4dff;

/// Whether the MSR `index` (from KVM's index list) is part of a snapshot.
pub fn should_save(index: u32) -> bool {
    matches!(
        index,
        MSR_IA32_TSC
            | MSR_KVM_WALL_CLOCK
            | MSR_KVM_SYSTEM_TIME
            | MSR_IA32_APICBASE
            | MSR_IA32_TSC_ADJUST
            | MSR_IA32_SPEC_CTRL
            | MSR_IA32_SYSENTER_CS
            | MSR_IA32_SYSENTER_ESP
            | MSR_IA32_SYSENTER_EIP
            | MSR_IA32_MISC_ENABLE
            | MSR_MTRR_PHYS_FIRST..=MSR_MTRR_PHYS_LAST
            | MSR_MTRR_FIX64K
            | MSR_MTRR_FIX16K_80000
            | MSR_MTRR_FIX16K_A0000
            | MSR_MTRR_FIX4K_FIRST..=MSR_MTRR_FIX4K_LAST
            | MSR_IA32_CR_PAT
            | MSR_MTRR_DEF_TYPE
            | MSR_IA32_TSC_DEADLINE
            | MSR_IA32_XSS
            | MSR_EFER
            | MSR_STAR
            | MSR_LSTAR
            | MSR_CSTAR
            | MSR_SYSCALL_MASK
            | MSR_FS_BASE
            | MSR_GS_BASE
            | MSR_KERNEL_GS_BASE
            | MSR_TSC_AUX
            | MSR_AMD64_VIRT_SPEC_CTRL
            | MSR_KVM_PV_FIRST..=MSR_KVM_PV_LAST
    )
}

/// Whether `index` is a KVM paravirtual MSR: kvm-clock (old and new numbers), steal time,
/// async page faults, PV EOI, poll control. KVM writes into guest RAM at the addresses these
/// hold (steal time even outside KVM_RUN, when the vCPU thread is preempted inside any vCPU
/// ioctl), so an in-place reboot turns them off before it clears RAM.
pub fn is_paravirt(index: u32) -> bool {
    matches!(
        index,
        MSR_KVM_WALL_CLOCK | MSR_KVM_SYSTEM_TIME | MSR_KVM_PV_FIRST..=MSR_KVM_PV_LAST
    )
}

/// Sort key for writing MSRs back: TSC first, TSC deadline last, the rest by index.
pub fn restore_order(index: u32) -> (u8, u32) {
    match index {
        MSR_IA32_TSC => (0, 0),
        MSR_IA32_TSC_DEADLINE => (2, 0),
        i => (1, i),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_and_order() {
        for i in [
            MSR_IA32_TSC,
            MSR_IA32_TSC_DEADLINE,
            MSR_LSTAR,
            0x4b56_4d01,
            0x20f,
            0x26c,
        ] {
            assert!(should_save(i), "{i:#x}");
        }
        assert!(is_paravirt(MSR_KVM_SYSTEM_TIME) && is_paravirt(0x4b56_4d03));
        assert!(!is_paravirt(MSR_IA32_TSC) && !is_paravirt(MSR_IA32_APICBASE));
        // Read-only or host-only MSRs stay out: MTRRcap, PERF_STATUS, the PMU.
        for i in [0xfe, 0x198, 0xc1, 0x186, 0x10a] {
            assert!(!should_save(i), "{i:#x}");
        }
        let mut v = vec![MSR_IA32_TSC_DEADLINE, MSR_LSTAR, MSR_IA32_TSC, 0x4b56_4d01];
        v.sort_by_key(|&i| restore_order(i));
        assert_eq!(
            v,
            [MSR_IA32_TSC, 0x4b56_4d01, MSR_LSTAR, MSR_IA32_TSC_DEADLINE]
        );
    }
}
