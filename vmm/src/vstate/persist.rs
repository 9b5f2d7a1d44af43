//! KVM state of the VM and its vCPUs, for snapshots.
//!
//! vCPU state is read on the vCPU's own thread while it is paused, in the order KVM needs:
//! MP state first (reading it makes KVM process pending INIT/SIPI, which changes the other
//! registers), vCPU events last. Restore writes, on a freshly created vCPU before it ever runs:
//! CPUID → MP state → regs → sregs (APIC base) → xsave → xcrs → debug regs → LAPIC → MSRs (TSC
//! first, TSC deadline last) → vCPU events, then KVM_KVMCLOCK_CTRL.
//!
//! Time: the snapshot records the host's CLOCK_REALTIME next to the VM's kvm-clock and each
//! vCPU's TSC. Restore advances both by the real time that passed since (the TSC by that many
//! nanoseconds at the saved TSC frequency), so the guest's clocks — and with them its wall clock
//! — read the same as the host's, as after a suspend, and timers that expired in between fire.
//! KVM_KVMCLOCK_CTRL tells a guest using kvm-clock that it was stopped, so its soft-lockup
//! watchdog does not fire for the gap.

use kvm_bindings::{
    kvm_clock_data, kvm_cpuid_entry2, kvm_irqchip, kvm_msr_entry, kvm_pit_state2, CpuId, Msrs,
    KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE, KVM_MAX_CPUID_ENTRIES,
};
use kvm_ioctls::{VcpuFd, VmFd};
use serde::{Deserialize, Serialize};

use crate::arch::x86_64::msr;
use crate::snapshot::blob::Blob;

/// Why reading or writing KVM state failed.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{what}: {source}")]
    Kvm {
        what: &'static str,
        source: kvm_ioctls::Error,
    },
    #[error("building the {0} list")]
    List(&'static str),
    #[error("KVM refused MSR {index:#x} on restore ({set} of {total} written)")]
    MsrRefused {
        index: u32,
        set: usize,
        total: usize,
    },
}

fn kvm(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> StateError {
    move |source| StateError::Kvm { what, source }
}

/// One CPUID leaf as the guest sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuidEntry {
    pub function: u32,
    pub index: u32,
    pub flags: u32,
    pub eax: u32,
    pub ebx: u32,
    pub ecx: u32,
    pub edx: u32,
}

impl From<&kvm_cpuid_entry2> for CpuidEntry {
    fn from(e: &kvm_cpuid_entry2) -> Self {
        Self {
            function: e.function,
            index: e.index,
            flags: e.flags,
            eax: e.eax,
            ebx: e.ebx,
            ecx: e.ecx,
            edx: e.edx,
        }
    }
}

impl From<&CpuidEntry> for kvm_cpuid_entry2 {
    fn from(e: &CpuidEntry) -> Self {
        Self {
            function: e.function,
            index: e.index,
            flags: e.flags,
            eax: e.eax,
            ebx: e.ebx,
            ecx: e.ecx,
            edx: e.edx,
            ..Default::default()
        }
    }
}

/// One MSR value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MsrEntry {
    pub index: u32,
    pub data: u64,
}

/// Everything KVM holds about one vCPU. Optional parts are there when KVM has the capability
/// (recorded in the snapshot's host facts, required at restore).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VcpuState {
    pub id: u8,
    pub cpuid: Vec<CpuidEntry>,
    pub mp_state: Blob<kvm_bindings::kvm_mp_state>,
    pub regs: Blob<kvm_bindings::kvm_regs>,
    pub sregs: Blob<kvm_bindings::kvm_sregs>,
    pub xsave: Option<Blob<kvm_bindings::kvm_xsave>>,
    pub xcrs: Option<Blob<kvm_bindings::kvm_xcrs>>,
    pub debugregs: Option<Blob<kvm_bindings::kvm_debugregs>>,
    pub lapic: Blob<kvm_bindings::kvm_lapic_state>,
    pub msrs: Vec<MsrEntry>,
    pub events: Option<Blob<kvm_bindings::kvm_vcpu_events>>,
    /// The vCPU's TSC frequency.
    pub tsc_khz: Option<u32>,
}

/// Which optional vCPU state KVM offers here.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VcpuCaps {
    pub xsave: bool,
    pub xcrs: bool,
    pub debugregs: bool,
    pub events: bool,
    pub tsc_khz: bool,
    /// KVM_RUN can complete a pending port/MMIO access without entering the guest.
    pub immediate_exit: bool,
}

impl VcpuCaps {
    pub fn probe(k: &kvm_ioctls::Kvm) -> Self {
        use kvm_ioctls::Cap;
        Self {
            xsave: k.check_extension(Cap::Xsave),
            xcrs: k.check_extension(Cap::Xcrs),
            debugregs: k.check_extension(Cap::Debugregs),
            events: k.check_extension(Cap::VcpuEvents),
            tsc_khz: k.check_extension(Cap::GetTscKhz),
            immediate_exit: k.check_extension(Cap::ImmediateExit),
        }
    }
}

/// The MSR indices to save: KVM's index list filtered by [`msr::should_save`].
pub fn msrs_to_save(k: &kvm_ioctls::Kvm) -> Result<Vec<u32>, StateError> {
    let list = k
        .get_msr_index_list()
        .map_err(kvm("KVM_GET_MSR_INDEX_LIST"))?;
    Ok(list
        .as_slice()
        .iter()
        .copied()
        .filter(|&i| msr::should_save(i))
        .collect())
}

/// Reads the MSRs in `indices`; ones KVM lists but cannot read on this vCPU are left out.
fn get_msrs(fd: &VcpuFd, indices: &[u32]) -> Result<Vec<MsrEntry>, StateError> {
    let mut want: Vec<u32> = indices.to_vec();
    loop {
        let entries: Vec<kvm_msr_entry> = want
            .iter()
            .map(|&index| kvm_msr_entry {
                index,
                ..Default::default()
            })
            .collect();
        let mut msrs = Msrs::from_entries(&entries).map_err(|_| StateError::List("MSR"))?;
        let n = fd.get_msrs(&mut msrs).map_err(kvm("KVM_GET_MSRS"))?;
        if n == want.len() {
            return Ok(msrs
                .as_slice()
                .iter()
                .map(|e| MsrEntry {
                    index: e.index,
                    data: e.data,
                })
                .collect());
        }
        log::debug!("MSR {:#x} is listed but not readable; not saved", want[n]);
        want.remove(n);
    }
}

/// Saves vCPU state; call on the vCPU's thread with the vCPU out of KVM_RUN.
pub fn save_vcpu(
    fd: &VcpuFd,
    id: u8,
    msr_indices: &[u32],
    caps: VcpuCaps,
) -> Result<VcpuState, StateError> {
    let mp_state = fd.get_mp_state().map_err(kvm("KVM_GET_MP_STATE"))?;
    let regs = fd.get_regs().map_err(kvm("KVM_GET_REGS"))?;
    let sregs = fd.get_sregs().map_err(kvm("KVM_GET_SREGS"))?;
    let xsave = if caps.xsave {
        Some(Blob(fd.get_xsave().map_err(kvm("KVM_GET_XSAVE"))?))
    } else {
        None
    };
    let xcrs = if caps.xcrs {
        Some(Blob(fd.get_xcrs().map_err(kvm("KVM_GET_XCRS"))?))
    } else {
        None
    };
    let debugregs = if caps.debugregs {
        Some(Blob(fd.get_debug_regs().map_err(kvm("KVM_GET_DEBUGREGS"))?))
    } else {
        None
    };
    let lapic = fd.get_lapic().map_err(kvm("KVM_GET_LAPIC"))?;
    let msrs = get_msrs(fd, msr_indices)?;
    let cpuid = fd
        .get_cpuid2(KVM_MAX_CPUID_ENTRIES)
        .map_err(kvm("KVM_GET_CPUID2"))?;
    let tsc_khz = if caps.tsc_khz {
        fd.get_tsc_khz().ok()
    } else {
        None
    };
    let events = if caps.events {
        Some(Blob(
            fd.get_vcpu_events().map_err(kvm("KVM_GET_VCPU_EVENTS"))?,
        ))
    } else {
        None
    };
    Ok(VcpuState {
        id,
        cpuid: cpuid.as_slice().iter().map(CpuidEntry::from).collect(),
        mp_state: Blob(mp_state),
        regs: Blob(regs),
        sregs: Blob(sregs),
        xsave,
        xcrs,
        debugregs,
        lapic: Blob(lapic),
        msrs,
        events,
        tsc_khz,
    })
}

const APIC_LVTT: usize = 0x320;
const LVTT_MASKED: u32 = 1 << 16;
const LVTT_MODE_MASK: u32 = 3 << 17;
const LVTT_MODE_TSC_DEADLINE: u32 = 2 << 17;

fn lapic_reg(l: &kvm_bindings::kvm_lapic_state, off: usize) -> u32 {
    let mut b = [0u8; 4];
    for (i, v) in b.iter_mut().enumerate() {
        *v = l.regs[off + i] as u8;
    }
    u32::from_le_bytes(b)
}

/// What a person debugging a guest that stopped making progress wants to see of one vCPU
/// (the control socket's `vcpu-state` command): where it is, whether it halted with interrupts on,
/// its LAPIC timer and the vectors waiting in its LAPIC, and the event KVM holds for it.
pub fn describe_vcpu(state: &VcpuState) -> serde_json::Value {
    let r = &state.regs.0;
    let s = &state.sregs.0;
    let l = &state.lapic.0;
    let msr = |index: u32| {
        state
            .msrs
            .iter()
            .find(|m| m.index == index)
            .map(|m| format!("{:#x}", m.data))
    };
    // IRR/ISR/TMR: 8 registers of 32 vectors each, 16 bytes apart.
    let vectors = |base: usize| -> Vec<u32> {
        (0..8u32)
            .flat_map(|i| {
                let bits = lapic_reg(l, base + 0x10 * i as usize);
                (0..32u32)
                    .filter(move |b| bits & (1 << b) != 0)
                    .map(move |b| i * 32 + b)
            })
            .collect()
    };
    let mp_state = match state.mp_state.0.mp_state {
        kvm_bindings::KVM_MP_STATE_RUNNABLE => "runnable".to_string(),
        kvm_bindings::KVM_MP_STATE_UNINITIALIZED => "uninitialized".to_string(),
        kvm_bindings::KVM_MP_STATE_INIT_RECEIVED => "init-received".to_string(),
        kvm_bindings::KVM_MP_STATE_HALTED => "halted".to_string(),
        kvm_bindings::KVM_MP_STATE_SIPI_RECEIVED => "sipi-received".to_string(),
        other => other.to_string(),
    };
    let events = state.events.as_ref().map(|e| {
        let e = &e.0;
        serde_json::json!({
            "exception": {"injected": e.exception.injected, "nr": e.exception.nr, "pending": e.exception.pending},
            "interrupt": {"injected": e.interrupt.injected, "nr": e.interrupt.nr, "shadow": e.interrupt.shadow},
            "nmi": {"injected": e.nmi.injected, "pending": e.nmi.pending, "masked": e.nmi.masked},
        })
    });
    serde_json::json!({
        "id": state.id,
        "mp_state": mp_state,
        "rip": format!("{:#x}", r.rip),
        "rsp": format!("{:#x}", r.rsp),
        "rflags": format!("{:#x}", r.rflags),
        "interrupts_enabled": r.rflags & (1 << 9) != 0,
        "cr0": format!("{:#x}", s.cr0),
        "cr3": format!("{:#x}", s.cr3),
        "cr4": format!("{:#x}", s.cr4),
        "efer": format!("{:#x}", s.efer),
        "lapic": {
            "id": lapic_reg(l, 0x20) >> 24,
            "tpr": lapic_reg(l, 0x80),
            "svr": format!("{:#x}", lapic_reg(l, 0xf0)),
            "lvt_timer": format!("{:#x}", lapic_reg(l, APIC_LVTT)),
            "timer_initial": lapic_reg(l, 0x380),
            "timer_current": lapic_reg(l, 0x390),
            "timer_divide": lapic_reg(l, 0x3e0),
            "esr": lapic_reg(l, 0x280),
            "isr": vectors(0x100),
            "tmr": vectors(0x180),
            "irr": vectors(0x200),
        },
        "tsc": msr(msr::MSR_IA32_TSC),
        "tsc_deadline": msr(msr::MSR_IA32_TSC_DEADLINE),
        "events": events,
    })
}

/// The MSRs to write back, in restore order, with the TSC advanced by `tsc_delta` ticks.
/// A TSC-deadline timer that was armed reads back as 0 when it had already fired into the
/// LAPIC; writing 0 would disarm it and the guest could wait forever for its tick, so it is set
/// to the (restored) TSC instead: the timer fires right away.
pub fn restore_msrs(state: &VcpuState, tsc_delta: u64) -> Vec<MsrEntry> {
    let mut msrs = state.msrs.clone();
    let mut tsc = None;
    for m in &mut msrs {
        if m.index == msr::MSR_IA32_TSC {
            m.data = m.data.wrapping_add(tsc_delta);
            tsc = Some(m.data);
        }
    }
    let lvtt = lapic_reg(&state.lapic.0, APIC_LVTT);
    let deadline_mode = lvtt & LVTT_MODE_MASK == LVTT_MODE_TSC_DEADLINE && lvtt & LVTT_MASKED == 0;
    if let Some(tsc) = tsc.filter(|_| deadline_mode) {
        for m in &mut msrs {
            if m.index == msr::MSR_IA32_TSC_DEADLINE && m.data == 0 {
                m.data = tsc;
            }
        }
    }
    msrs.sort_by_key(|m| msr::restore_order(m.index));
    msrs
}

/// Writes `state` into a freshly created vCPU (never run), in KVM's order.
pub fn restore_vcpu(fd: &VcpuFd, state: &VcpuState, tsc_delta: u64) -> Result<(), StateError> {
    let entries: Vec<kvm_cpuid_entry2> = state.cpuid.iter().map(Into::into).collect();
    let cpuid = CpuId::from_entries(&entries).map_err(|_| StateError::List("CPUID"))?;
    fd.set_cpuid2(&cpuid).map_err(kvm("KVM_SET_CPUID2"))?;
    write_vcpu_state(fd, state, restore_msrs(state, tsc_delta))?;
    // Only a guest that enabled kvm-clock can be told; EINVAL otherwise.
    if let Err(e) = fd.kvmclock_ctrl() {
        log::debug!(
            "vcpu{}: KVM_KVMCLOCK_CTRL: {e} (guest without kvm-clock)",
            state.id
        );
    }
    Ok(())
}

/// Puts a vCPU that has run back into `boot`, the state it had when it was built (an in-place
/// reboot): everything [`restore_vcpu`] writes except the CPUID (unchanged, and KVM refuses a
/// different one after the first KVM_RUN) and the TSC, which keeps counting. The paravirtual
/// MSRs must already be off ([`paravirt_off`]) when RAM is cleared; this writes them again.
pub fn reset_vcpu(fd: &VcpuFd, boot: &VcpuState) -> Result<(), StateError> {
    let msrs = restore_msrs(boot, 0)
        .into_iter()
        .filter(|m| m.index != msr::MSR_IA32_TSC)
        .collect();
    write_vcpu_state(fd, boot, msrs)
}

/// Writes `boot`'s values (off) of the paravirtual MSRs ([`msr::is_paravirt`]) into a paused
/// vCPU: afterwards KVM writes nothing into guest RAM on the guest's behalf (no kvm-clock
/// page, no steal-time record, no PV EOI flag). An in-place reboot does this before it clears
/// RAM and loads the kernel again: KVM records steal time's "preempted" flag whenever the vCPU
/// thread is preempted inside a vCPU ioctl, which would land in the new kernel's memory.
pub fn paravirt_off(fd: &VcpuFd, boot: &VcpuState) -> Result<(), StateError> {
    let entries: Vec<kvm_msr_entry> = boot
        .msrs
        .iter()
        .filter(|m| msr::is_paravirt(m.index))
        .map(|m| kvm_msr_entry {
            index: m.index,
            data: m.data,
            ..Default::default()
        })
        .collect();
    set_msrs(fd, &entries)
}

fn set_msrs(fd: &VcpuFd, entries: &[kvm_msr_entry]) -> Result<(), StateError> {
    let list = Msrs::from_entries(entries).map_err(|_| StateError::List("MSR"))?;
    let set = fd.set_msrs(&list).map_err(kvm("KVM_SET_MSRS"))?;
    if set != entries.len() {
        return Err(StateError::MsrRefused {
            index: entries[set].index,
            set,
            total: entries.len(),
        });
    }
    Ok(())
}

/// MP state, registers, FPU, LAPIC, `msrs` and events, in KVM's order.
fn write_vcpu_state(fd: &VcpuFd, state: &VcpuState, msrs: Vec<MsrEntry>) -> Result<(), StateError> {
    fd.set_mp_state(state.mp_state.0)
        .map_err(kvm("KVM_SET_MP_STATE"))?;
    fd.set_regs(&state.regs.0).map_err(kvm("KVM_SET_REGS"))?;
    fd.set_sregs(&state.sregs.0).map_err(kvm("KVM_SET_SREGS"))?;
    if let Some(x) = &state.xsave {
        // SAFETY: `x.0` is a complete legacy `kvm_xsave` (4 KiB region) as KVM_GET_XSAVE
        // returned it; KVM_SET_XSAVE reads exactly that much.
        unsafe { fd.set_xsave(&x.0) }.map_err(kvm("KVM_SET_XSAVE"))?;
    }
    if let Some(x) = &state.xcrs {
        fd.set_xcrs(&x.0).map_err(kvm("KVM_SET_XCRS"))?;
    }
    if let Some(d) = &state.debugregs {
        fd.set_debug_regs(&d.0).map_err(kvm("KVM_SET_DEBUGREGS"))?;
    }
    fd.set_lapic(&state.lapic.0).map_err(kvm("KVM_SET_LAPIC"))?;
    let entries: Vec<kvm_msr_entry> = msrs
        .iter()
        .map(|m| kvm_msr_entry {
            index: m.index,
            data: m.data,
            ..Default::default()
        })
        .collect();
    set_msrs(fd, &entries)?;
    if let Some(e) = &state.events {
        fd.set_vcpu_events(&e.0)
            .map_err(kvm("KVM_SET_VCPU_EVENTS"))?;
    }
    Ok(())
}

/// The VM-wide KVM state: interrupt controllers, PIT and kvm-clock.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VmState {
    pub pic_master: Blob<kvm_irqchip>,
    pub pic_slave: Blob<kvm_irqchip>,
    pub ioapic: Blob<kvm_irqchip>,
    pub pit: Blob<kvm_pit_state2>,
    pub clock: Blob<kvm_clock_data>,
    /// Host CLOCK_REALTIME (ns since the epoch) when `clock` was read.
    pub realtime_ns: u64,
}

fn get_chip(vm: &VmFd, chip_id: u32) -> Result<Blob<kvm_irqchip>, StateError> {
    let mut c = kvm_irqchip {
        chip_id,
        ..Default::default()
    };
    vm.get_irqchip(&mut c).map_err(kvm("KVM_GET_IRQCHIP"))?;
    Ok(Blob(c))
}

/// Host CLOCK_REALTIME in nanoseconds.
pub fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Saves the VM state; the vCPUs must be paused. Read along the interrupt path — PIT, then PIC
/// and IOAPIC (then, by the caller, the LAPICs) — so an interrupt raised meanwhile is captured
/// at one end or the other.
pub fn save_vm(vm: &VmFd) -> Result<VmState, StateError> {
    let pit = Blob(vm.get_pit2().map_err(kvm("KVM_GET_PIT2"))?);
    let pic_master = get_chip(vm, KVM_IRQCHIP_PIC_MASTER)?;
    let pic_slave = get_chip(vm, KVM_IRQCHIP_PIC_SLAVE)?;
    let ioapic = get_chip(vm, KVM_IRQCHIP_IOAPIC)?;
    let clock = vm.get_clock().map_err(kvm("KVM_GET_CLOCK"))?;
    let realtime_ns = realtime_ns();
    Ok(VmState {
        pic_master,
        pic_slave,
        ioapic,
        pit,
        clock: Blob(clock),
        realtime_ns,
    })
}

/// Writes the VM state into a VM that has its irqchip and PIT, with kvm-clock advanced by
/// `elapsed_ns`.
pub fn restore_vm(vm: &VmFd, state: &VmState, elapsed_ns: u64) -> Result<(), StateError> {
    for chip in [&state.pic_master, &state.pic_slave, &state.ioapic] {
        vm.set_irqchip(&chip.0).map_err(kvm("KVM_SET_IRQCHIP"))?;
    }
    vm.set_pit2(&state.pit.0).map_err(kvm("KVM_SET_PIT2"))?;
    let clock = kvm_clock_data {
        clock: state.clock.0.clock.wrapping_add(elapsed_ns),
        // KVM_CLOCK_REALTIME and friends are outputs of KVM_GET_CLOCK; the advance is ours.
        flags: 0,
        ..Default::default()
    };
    vm.set_clock(&clock).map_err(kvm("KVM_SET_CLOCK"))?;
    Ok(())
}

/// Puts the interrupt controllers and the PIT back into `boot`, their state when the VM was
/// built (an in-place reboot); kvm-clock keeps running.
pub fn reset_vm(vm: &VmFd, boot: &VmState) -> Result<(), StateError> {
    for chip in [&boot.pic_master, &boot.pic_slave, &boot.ioapic] {
        vm.set_irqchip(&chip.0).map_err(kvm("KVM_SET_IRQCHIP"))?;
    }
    vm.set_pit2(&boot.pit.0).map_err(kvm("KVM_SET_PIT2"))?;
    Ok(())
}

/// TSC ticks in `ns` nanoseconds at `khz`.
pub fn tsc_ticks(ns: u64, khz: u32) -> u64 {
    (u128::from(ns) * u128::from(khz) / 1_000_000) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_bindings::{kvm_lapic_state, kvm_mp_state, kvm_regs, kvm_sregs};

    fn state_with(lvtt: u32, msrs: Vec<MsrEntry>) -> VcpuState {
        let mut lapic = kvm_lapic_state::default();
        for (i, b) in lvtt.to_le_bytes().iter().enumerate() {
            lapic.regs[APIC_LVTT + i] = *b as std::os::raw::c_char;
        }
        VcpuState {
            id: 0,
            cpuid: vec![],
            mp_state: Blob(kvm_mp_state::default()),
            regs: Blob(kvm_regs::default()),
            sregs: Blob(kvm_sregs::default()),
            xsave: None,
            xcrs: None,
            debugregs: None,
            lapic: Blob(lapic),
            msrs,
            events: None,
            tsc_khz: Some(2_000_000),
        }
    }

    #[test]
    fn tsc_advances_and_a_fired_deadline_is_rearmed() {
        let m = |index, data| MsrEntry { index, data };
        let s = state_with(
            LVTT_MODE_TSC_DEADLINE | 0xec,
            vec![
                m(msr::MSR_IA32_TSC_DEADLINE, 0),
                m(msr::MSR_LSTAR, 5),
                m(msr::MSR_IA32_TSC, 1000),
            ],
        );
        let out = restore_msrs(&s, 500);
        assert_eq!(
            out,
            vec![
                m(msr::MSR_IA32_TSC, 1500),
                m(msr::MSR_LSTAR, 5),
                m(msr::MSR_IA32_TSC_DEADLINE, 1500)
            ]
        );
        // An armed deadline keeps its value (in the past now: it fires at once).
        let s = state_with(
            LVTT_MODE_TSC_DEADLINE,
            vec![m(msr::MSR_IA32_TSC, 10), m(msr::MSR_IA32_TSC_DEADLINE, 20)],
        );
        assert_eq!(restore_msrs(&s, 100)[1].data, 20);
        // Not in deadline mode (or masked): a zero deadline stays zero.
        let s = state_with(
            LVTT_MODE_TSC_DEADLINE | LVTT_MASKED,
            vec![m(msr::MSR_IA32_TSC, 10), m(msr::MSR_IA32_TSC_DEADLINE, 0)],
        );
        assert_eq!(restore_msrs(&s, 100)[1].data, 0);
        assert_eq!(tsc_ticks(1_000_000_000, 2_500_000), 2_500_000_000);
        let j = serde_json::to_string(&s).unwrap();
        let back: VcpuState = serde_json::from_str(&j).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn describe_shows_where_a_vcpu_waits() {
        let m = |index, data| MsrEntry { index, data };
        let mut s = state_with(
            LVTT_MODE_TSC_DEADLINE | 0xec,
            vec![m(msr::MSR_IA32_TSC, 1000), m(msr::MSR_IA32_TSC_DEADLINE, 0)],
        );
        s.id = 1;
        s.mp_state.0.mp_state = kvm_bindings::KVM_MP_STATE_HALTED;
        s.regs.0.rip = 0xffff_ffff_8100_1234;
        s.regs.0.rflags = 0x246;
        // Vector 0xec (236 = 7 * 32 + 12) waiting in the IRR, vector 0x22 in service.
        let set = |l: &mut kvm_lapic_state, off: usize, v: u32| {
            for (i, b) in v.to_le_bytes().iter().enumerate() {
                l.regs[off + i] = *b as std::os::raw::c_char;
            }
        };
        set(&mut s.lapic.0, 0x200 + 0x10 * 7, 1 << 12);
        set(&mut s.lapic.0, 0x100 + 0x10, 1 << 2);
        set(&mut s.lapic.0, 0x380, 5000);
        let d = describe_vcpu(&s);
        assert_eq!(d["id"], 1);
        assert_eq!(d["mp_state"], "halted");
        assert_eq!(d["rip"], "0xffffffff81001234");
        assert_eq!(d["interrupts_enabled"], true);
        assert_eq!(d["lapic"]["irr"], serde_json::json!([0xec]));
        assert_eq!(d["lapic"]["isr"], serde_json::json!([0x22]));
        assert_eq!(d["lapic"]["timer_initial"], 5000);
        assert_eq!(d["lapic"]["lvt_timer"], "0x400ec");
        assert_eq!(d["tsc"], "0x3e8");
        assert_eq!(d["tsc_deadline"], "0x0");
        assert!(d["events"].is_null());
    }

    /// On this machine's KVM: a vCPU whose guest turned kvm-clock and steal time on (as Linux
    /// does at boot) has both off again after `paravirt_off` with its boot state.
    #[test]
    fn paravirt_off_turns_kvm_clock_and_steal_time_off() {
        const SYSTEM_TIME_NEW: u32 = 0x4b56_4d01;
        const STEAL_TIME: u32 = 0x4b56_4d03;
        let kvm = kvm_ioctls::Kvm::new().expect("opening /dev/kvm");
        let vm = kvm.create_vm().expect("KVM_CREATE_VM");
        vm.create_irq_chip().expect("KVM_CREATE_IRQCHIP");
        let fd = vm.create_vcpu(0).expect("KVM_CREATE_VCPU");
        let indices = msrs_to_save(&kvm).expect("MSR list");
        for i in [SYSTEM_TIME_NEW, STEAL_TIME] {
            assert!(indices.contains(&i), "KVM does not list MSR {i:#x}");
        }
        let boot = save_vcpu(&fd, 0, &indices, VcpuCaps::probe(&kvm)).expect("boot state");
        let on = |index, data| kvm_msr_entry {
            index,
            data,
            ..Default::default()
        };
        set_msrs(&fd, &[on(SYSTEM_TIME_NEW, 0x2001), on(STEAL_TIME, 0x3001)])
            .expect("the guest's kvm-clock and steal time");
        let read = |fd: &VcpuFd| get_msrs(fd, &[SYSTEM_TIME_NEW, STEAL_TIME]).unwrap();
        assert!(read(&fd).iter().all(|m| m.data & 1 == 1), "{:?}", read(&fd));
        paravirt_off(&fd, &boot).expect("paravirt_off");
        assert!(read(&fd).iter().all(|m| m.data == 0), "{:?}", read(&fd));
    }
}
