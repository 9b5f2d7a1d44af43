//! The MADT (signature `APIC`): the interrupt controllers.
//!
//! - Local APIC address [`APIC_ADDR`]; flags `PCAT_COMPAT` (KVM's in-kernel irqchip has the
//!   two 8259s, which the guest should mask).
//! - A Processor Local APIC per vCPU: ACPI UID = APIC ID = vCPU index, enabled.
//! - The IOAPIC at [`IOAPIC_ADDR`], GSI base 0, ID = the vCPU count (as in the MP table).
//! - One Interrupt Source Override, ISA IRQ 0 → GSI 0. A PC (and QEMU) wires the 8254 PIT to
//!   IOAPIC pin 2 and says so with IRQ 0 → GSI 2; this VM uses KVM's default routing, where
//!   GSI *n* < 16 is IOAPIC pin *n* and PIC pin *n*, and the in-kernel PIT raises GSI 0. Saying
//!   GSI 2 would send Linux's `check_timer` through its fallbacks. The entry is identity on
//!   purpose: the MP table says the same (every ISA IRQ *n* → pin *n*).
//!   Every other ISA IRQ is identity-mapped, edge-triggered and active-high by ACPI's default,
//!   which is what the irqfd-driven lines (COM1 4, i8042 1, GED 3, virtio 5..) are; the virtio
//!   GSIs above 15 get their edge/high polarity from their `_CRS` in the DSDT.
//! - A Local APIC NMI entry: LINT1 of every processor is the NMI (as in the MP table).

use acpi_tables::madt::{EnabledStatus, IoApic, ProcessorLocalApic};
use acpi_tables::sdt::Sdt;
use acpi_tables::Aml;

use super::{aml_bytes, OEM_ID, OEM_REVISION, OEM_TABLE_ID};
use crate::arch::x86_64::layout::{APIC_ADDR, IOAPIC_ADDR, MAX_VCPUS};

/// MADT revision (ACPI 6.5).
const MADT_REVISION: u8 = 5;
const MADT_PCAT_COMPAT: u32 = 1;
/// Structure types.
pub const TYPE_LOCAL_APIC: u8 = 0;
pub const TYPE_IOAPIC: u8 = 1;
pub const TYPE_INTERRUPT_OVERRIDE: u8 = 2;
pub const TYPE_LOCAL_APIC_NMI: u8 = 4;
/// MPS INTI flags: polarity and trigger mode as the bus defines them.
const INTI_CONFORMING: u16 = 0;
/// Every processor (Local APIC NMI).
const ALL_PROCESSORS: u8 = 0xff;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MadtError {
    #[error("the MADT supports 1..={MAX_VCPUS} vCPUs, not {0}")]
    VcpuCount(u8),
}

/// Interrupt Source Override (type 2, 10 bytes).
fn interrupt_override(bus_irq: u8, gsi: u32, flags: u16) -> Vec<u8> {
    let mut v = vec![TYPE_INTERRUPT_OVERRIDE, 10, 0, bus_irq];
    v.extend_from_slice(&gsi.to_le_bytes());
    v.extend_from_slice(&flags.to_le_bytes());
    v
}

/// Local APIC NMI (type 4, 6 bytes).
fn local_apic_nmi(uid: u8, flags: u16, lint: u8) -> Vec<u8> {
    let mut v = vec![TYPE_LOCAL_APIC_NMI, 6, uid];
    v.extend_from_slice(&flags.to_le_bytes());
    v.push(lint);
    v
}

/// The MADT of a VM with `vcpus` vCPUs.
pub fn build(vcpus: u8) -> Result<Vec<u8>, MadtError> {
    if vcpus == 0 || vcpus > MAX_VCPUS {
        return Err(MadtError::VcpuCount(vcpus));
    }
    let mut madt = Sdt::new(
        *b"APIC",
        44,
        MADT_REVISION,
        OEM_ID,
        OEM_TABLE_ID,
        OEM_REVISION,
    );
    madt.write_u32(36, APIC_ADDR as u32);
    madt.write_u32(40, MADT_PCAT_COMPAT);
    for cpu in 0..vcpus {
        madt.append_slice(&aml_bytes(&ProcessorLocalApic::new(
            cpu,
            cpu,
            EnabledStatus::Enabled,
        )));
    }
    madt.append_slice(&aml_bytes(&IoApic::new(vcpus, IOAPIC_ADDR as u32, 0)));
    madt.append_slice(&interrupt_override(0, 0, INTI_CONFORMING));
    madt.append_slice(&local_apic_nmi(ALL_PROCESSORS, INTI_CONFORMING, 1));
    let mut out = Vec::with_capacity(madt.len());
    madt.to_aml_bytes(&mut out);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acpi::tests::{check_header, u32_at};

    /// (type, bytes) of each structure after the 44-byte header.
    fn structures(m: &[u8]) -> Vec<(u8, &[u8])> {
        let mut out = Vec::new();
        let mut p = 44;
        while p < m.len() {
            let len = m[p + 1] as usize;
            assert!(len >= 2 && p + len <= m.len());
            out.push((m[p], &m[p..p + len]));
            p += len;
        }
        out
    }

    #[test]
    fn one_local_apic_per_vcpu_and_the_ioapic() {
        for vcpus in [1u8, 2, 4, MAX_VCPUS] {
            let m = build(vcpus).unwrap();
            check_header(&m, b"APIC");
            assert_eq!(m[8], MADT_REVISION);
            assert_eq!(u32_at(&m, 36), 0xfee0_0000);
            assert_eq!(u32_at(&m, 40), MADT_PCAT_COMPAT);
            let s = structures(&m);
            let lapics: Vec<_> = s.iter().filter(|(t, _)| *t == TYPE_LOCAL_APIC).collect();
            assert_eq!(lapics.len(), vcpus as usize);
            for (i, (_, b)) in lapics.iter().enumerate() {
                // uid, APIC ID, flags = enabled
                assert_eq!((b[2], b[3], u32_at(b, 4)), (i as u8, i as u8, 1));
            }
            let ioapics: Vec<_> = s.iter().filter(|(t, _)| *t == TYPE_IOAPIC).collect();
            assert_eq!(ioapics.len(), 1);
            let io = ioapics[0].1;
            assert_eq!(
                (io[2], u32_at(io, 4), u32_at(io, 8)),
                (vcpus, 0xfec0_0000, 0)
            );
            let iso: Vec<_> = s
                .iter()
                .filter(|(t, _)| *t == TYPE_INTERRUPT_OVERRIDE)
                .collect();
            assert_eq!(iso.len(), 1);
            assert_eq!(iso[0].1, &[2, 10, 0, 0, 0, 0, 0, 0, 0, 0]);
            let nmi: Vec<_> = s
                .iter()
                .filter(|(t, _)| *t == TYPE_LOCAL_APIC_NMI)
                .collect();
            assert_eq!(nmi.len(), 1);
            assert_eq!(nmi[0].1, &[4, 6, 0xff, 0, 0, 1]);
            assert_eq!(m.len(), 44 + 8 * vcpus as usize + 12 + 10 + 6);
        }
    }

    #[test]
    fn vcpu_count_is_checked() {
        assert_eq!(build(0), Err(MadtError::VcpuCount(0)));
        assert_eq!(
            build(MAX_VCPUS + 1),
            Err(MadtError::VcpuCount(MAX_VCPUS + 1))
        );
    }
}
