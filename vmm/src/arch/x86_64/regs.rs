//! Initial register, FPU, MSR and LAPIC state of vCPUs, and the boot page tables.

use kvm_bindings::{kvm_fpu, kvm_msr_entry, kvm_regs, kvm_sregs, Msrs};
use kvm_ioctls::VcpuFd;
use vm_memory::{Address, Bytes, GuestAddress};

use super::gdt::{kvm_segment_from_gdt, GDT_LONG_MODE, GDT_PROTECTED_MODE};
use super::layout::*;
use crate::vstate::memory::GuestMemoryMmap;

const X86_CR0_PE: u64 = 1 << 0;
const X86_CR0_ET: u64 = 1 << 4;
const X86_CR0_NE: u64 = 1 << 5;
const X86_CR0_PG: u64 = 1 << 31;
const X86_CR4_PAE: u64 = 1 << 5;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;

const MSR_IA32_SYSENTER_CS: u32 = 0x174;
const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
const MSR_STAR: u32 = 0xc000_0081;
const MSR_LSTAR: u32 = 0xc000_0082;
const MSR_CSTAR: u32 = 0xc000_0083;
const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;
const MSR_IA32_TSC: u32 = 0x10;
const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
const MSR_IA32_MISC_ENABLE_FAST_STRING: u64 = 1;
const MSR_MTRR_DEF_TYPE: u32 = 0x2ff;
const MTRR_ENABLE: u64 = 1 << 11;
const MTRR_MEM_TYPE_WB: u64 = 6;

const APIC_LVT0: usize = 0x350;
const APIC_LVT1: usize = 0x360;
const APIC_MODE_NMI: u32 = 0x4;
const APIC_MODE_EXTINT: u32 = 0x7;

/// How the boot vCPU enters the guest kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootProtocol {
    /// 64-bit Linux boot protocol: long mode, paging on, RSI = zero page.
    Linux64,
    /// PVH: 32-bit protected mode, paging off, EBX = hvm_start_info.
    Pvh,
}

#[derive(Debug, thiserror::Error)]
pub enum RegsError {
    #[error("writing boot page tables or GDT into guest memory: {0}")]
    GuestMemory(#[from] vm_memory::GuestMemoryError),
    #[error("{what} ioctl failed: {source}")]
    Kvm {
        what: &'static str,
        source: kvm_ioctls::Error,
    },
    #[error("KVM accepted {set} of {total} boot MSRs; MSR {first_failed:#x} was refused")]
    MsrsRefused {
        set: usize,
        total: usize,
        first_failed: u32,
    },
    #[error("building the MSR list: {0}")]
    MsrList(String),
}

fn kvm_err(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> RegsError {
    move |source| RegsError::Kvm { what, source }
}

/// Writes the identity-mapped page tables for the low 4 GiB (2 MiB pages).
pub fn setup_page_tables(mem: &GuestMemoryMmap) -> Result<(), RegsError> {
    mem.write_obj(PDPTE_START | 0x3, GuestAddress(PML4_START))?;
    for pdpt in 0..4u64 {
        let pd = PDE_START + pdpt * 0x1000;
        mem.write_obj(pd | 0x3, GuestAddress(PDPTE_START + pdpt * 8))?;
        for i in 0..512u64 {
            let phys = (pdpt << 30) | (i << 21);
            mem.write_obj(phys | 0x83, GuestAddress(pd + i * 8))?;
        }
    }
    Ok(())
}

fn write_gdt(mem: &GuestMemoryMmap, gdt: &[u64]) -> Result<(), RegsError> {
    for (i, entry) in gdt.iter().enumerate() {
        mem.write_obj(*entry, GuestAddress(GDT_START).unchecked_add(i as u64 * 8))?;
    }
    mem.write_obj(0u64, GuestAddress(IDT_START))?;
    Ok(())
}

/// Segment, control and paging registers for the boot vCPU.
pub fn setup_sregs(
    mem: &GuestMemoryMmap,
    vcpu: &VcpuFd,
    protocol: BootProtocol,
) -> Result<(), RegsError> {
    let mut sregs: kvm_sregs = vcpu.get_sregs().map_err(kvm_err("KVM_GET_SREGS"))?;
    let gdt: &[u64; 4] = match protocol {
        BootProtocol::Linux64 => &GDT_LONG_MODE,
        BootProtocol::Pvh => &GDT_PROTECTED_MODE,
    };
    write_gdt(mem, gdt)?;
    sregs.gdt.base = GDT_START;
    sregs.gdt.limit = (std::mem::size_of_val(gdt) - 1) as u16;
    sregs.idt.base = IDT_START;
    sregs.idt.limit = 7;

    let code = kvm_segment_from_gdt(gdt[1], 1);
    let data = kvm_segment_from_gdt(gdt[2], 2);
    let tss = kvm_segment_from_gdt(gdt[3], 3);
    sregs.cs = code;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = tss;

    match protocol {
        BootProtocol::Linux64 => {
            setup_page_tables(mem)?;
            sregs.cr3 = PML4_START;
            sregs.cr4 |= X86_CR4_PAE;
            sregs.cr0 |= X86_CR0_PE | X86_CR0_PG | X86_CR0_ET | X86_CR0_NE;
            sregs.efer |= EFER_LME | EFER_LMA;
        }
        BootProtocol::Pvh => {
            sregs.cr0 = X86_CR0_PE | X86_CR0_ET;
            sregs.cr3 = 0;
            sregs.cr4 = 0;
            sregs.efer = 0;
        }
    }
    vcpu.set_sregs(&sregs).map_err(kvm_err("KVM_SET_SREGS"))
}

/// General purpose registers for the boot vCPU.
pub fn setup_regs(vcpu: &VcpuFd, protocol: BootProtocol, entry: u64) -> Result<(), RegsError> {
    let regs = match protocol {
        BootProtocol::Linux64 => kvm_regs {
            rflags: 0x2,
            rip: entry,
            rsp: BOOT_STACK_POINTER,
            rbp: BOOT_STACK_POINTER,
            rsi: ZERO_PAGE_START,
            ..Default::default()
        },
        BootProtocol::Pvh => kvm_regs {
            rflags: 0x2,
            rip: entry,
            rbx: PVH_INFO_START,
            ..Default::default()
        },
    };
    vcpu.set_regs(&regs).map_err(kvm_err("KVM_SET_REGS"))
}

/// x87/SSE state: default control word and MXCSR.
pub fn setup_fpu(vcpu: &VcpuFd) -> Result<(), RegsError> {
    let fpu = kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    vcpu.set_fpu(&fpu).map_err(kvm_err("KVM_SET_FPU"))
}

/// The MSRs every vCPU starts with.
pub fn boot_msr_entries() -> Vec<kvm_msr_entry> {
    let e = |index, data| kvm_msr_entry {
        index,
        data,
        ..Default::default()
    };
    vec![
        e(MSR_IA32_SYSENTER_CS, 0),
        e(MSR_IA32_SYSENTER_ESP, 0),
        e(MSR_IA32_SYSENTER_EIP, 0),
        e(MSR_STAR, 0),
        e(MSR_CSTAR, 0),
        e(MSR_KERNEL_GS_BASE, 0),
        e(MSR_SYSCALL_MASK, 0),
        e(MSR_LSTAR, 0),
        e(MSR_IA32_TSC, 0),
        e(MSR_IA32_MISC_ENABLE, MSR_IA32_MISC_ENABLE_FAST_STRING),
        e(MSR_MTRR_DEF_TYPE, MTRR_ENABLE | MTRR_MEM_TYPE_WB),
    ]
}

pub fn setup_msrs(vcpu: &VcpuFd) -> Result<(), RegsError> {
    let entries = boot_msr_entries();
    let msrs = Msrs::from_entries(&entries).map_err(|e| RegsError::MsrList(format!("{e:?}")))?;
    let set = vcpu.set_msrs(&msrs).map_err(kvm_err("KVM_SET_MSRS"))?;
    if set != entries.len() {
        return Err(RegsError::MsrsRefused {
            set,
            total: entries.len(),
            first_failed: entries[set].index,
        });
    }
    Ok(())
}

fn set_lapic_reg(regs: &mut [std::os::raw::c_char; 1024], offset: usize, value: u32) {
    for (i, b) in value.to_le_bytes().iter().enumerate() {
        regs[offset + i] = *b as std::os::raw::c_char;
    }
}

fn get_lapic_reg(regs: &[std::os::raw::c_char; 1024], offset: usize) -> u32 {
    let mut b = [0u8; 4];
    for (i, v) in b.iter_mut().enumerate() {
        *v = regs[offset + i] as u8;
    }
    u32::from_le_bytes(b)
}

fn set_delivery_mode(reg: u32, mode: u32) -> u32 {
    (reg & !0x700) | (mode << 8)
}

/// LINT0 = ExtINT (the PIC), LINT1 = NMI, as firmware leaves them.
pub fn setup_lint(vcpu: &VcpuFd) -> Result<(), RegsError> {
    let mut lapic = vcpu.get_lapic().map_err(kvm_err("KVM_GET_LAPIC"))?;
    let lvt0 = get_lapic_reg(&lapic.regs, APIC_LVT0);
    set_lapic_reg(
        &mut lapic.regs,
        APIC_LVT0,
        set_delivery_mode(lvt0, APIC_MODE_EXTINT),
    );
    let lvt1 = get_lapic_reg(&lapic.regs, APIC_LVT1);
    set_lapic_reg(
        &mut lapic.regs,
        APIC_LVT1,
        set_delivery_mode(lvt1, APIC_MODE_NMI),
    );
    vcpu.set_lapic(&lapic).map_err(kvm_err("KVM_SET_LAPIC"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestAddress;

    #[test]
    fn page_tables_identity_map_4gib() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap();
        setup_page_tables(&mem).unwrap();
        let pml4: u64 = mem.read_obj(GuestAddress(PML4_START)).unwrap();
        assert_eq!(pml4, PDPTE_START | 3);
        let pdpt3: u64 = mem.read_obj(GuestAddress(PDPTE_START + 3 * 8)).unwrap();
        assert_eq!(pdpt3, (PDE_START + 0x3000) | 3);
        // The last 2 MiB page below 4 GiB maps itself.
        let last: u64 = mem
            .read_obj(GuestAddress(PDE_START + 0x3000 + 511 * 8))
            .unwrap();
        assert_eq!(last, (0xffe0_0000) | 0x83);
    }

    #[test]
    fn lapic_delivery_mode_bits() {
        assert_eq!(set_delivery_mode(0x0001_0700, APIC_MODE_NMI), 0x0001_0400);
        let mut regs = [0 as std::os::raw::c_char; 1024];
        set_lapic_reg(&mut regs, APIC_LVT0, 0xdead_beef);
        assert_eq!(get_lapic_reg(&regs, APIC_LVT0), 0xdead_beef);
    }
}
