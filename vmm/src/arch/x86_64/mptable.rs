//! Intel MultiProcessor Specification 1.4 table, so the guest finds its CPUs,
//! the IOAPIC and how ISA interrupts are routed without ACPI.

use vm_memory::{Bytes, GuestAddress};

use super::layout::{APIC_ADDR, IOAPIC_ADDR, MAX_VCPUS, MPTABLE_MAX_SIZE, MPTABLE_START};
use crate::vstate::memory::GuestMemoryMmap;

const MPC_SPEC_REV: u8 = 4;
const APIC_VERSION: u8 = 0x14;
const IOAPIC_VERSION: u8 = 0x11;
const CPU_ENABLED: u8 = 1;
const CPU_BOOTPROCESSOR: u8 = 2;
const CPU_SIGNATURE: u32 = 0x600; // family 6
const CPU_FEATURES: u32 = 0x201; // FPU | APIC
const MP_PROCESSOR: u8 = 0;
const MP_BUS: u8 = 1;
const MP_IOAPIC: u8 = 2;
const MP_INTSRC: u8 = 3;
const MP_LINTSRC: u8 = 4;
const MP_IRQ_INT: u8 = 0;
const MP_IRQ_NMI: u8 = 1;
const MP_IRQ_EXTINT: u8 = 3;
/// IOAPIC input pins routed 1:1 from ISA IRQs.
const IOAPIC_PINS: u8 = 24;

#[derive(Debug, thiserror::Error)]
pub enum MptableError {
    #[error("the MP table supports 1..={MAX_VCPUS} vCPUs, not {0}")]
    VcpuCount(u8),
    #[error("the MP table ({0} bytes) does not fit its {MPTABLE_MAX_SIZE}-byte area")]
    TooLarge(usize),
    #[error("writing the MP table into guest memory: {0}")]
    GuestMemory(#[from] vm_memory::GuestMemoryError),
}

fn checksum(bytes: &[u8]) -> u8 {
    0u8.wrapping_sub(bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b)))
}

/// The bytes of the floating pointer followed by the configuration table, to be placed at `base`.
pub fn build(base: u64, vcpus: u8) -> Result<Vec<u8>, MptableError> {
    if vcpus == 0 || vcpus > MAX_VCPUS {
        return Err(MptableError::VcpuCount(vcpus));
    }
    let ioapic_id = vcpus; // first ID after the CPUs
    let config_addr = base + 16;

    let mut entries = Vec::new();
    let mut count: u16 = 0;
    for cpu in 0..vcpus {
        entries.push(MP_PROCESSOR);
        entries.push(cpu);
        entries.push(APIC_VERSION);
        entries.push(CPU_ENABLED | if cpu == 0 { CPU_BOOTPROCESSOR } else { 0 });
        entries.extend_from_slice(&CPU_SIGNATURE.to_le_bytes());
        entries.extend_from_slice(&CPU_FEATURES.to_le_bytes());
        entries.extend_from_slice(&[0u8; 8]);
        count += 1;
    }
    entries.extend_from_slice(&[MP_BUS, 0]);
    entries.extend_from_slice(b"ISA   ");
    count += 1;
    entries.extend_from_slice(&[MP_IOAPIC, ioapic_id, IOAPIC_VERSION, 1]);
    entries.extend_from_slice(&(IOAPIC_ADDR as u32).to_le_bytes());
    count += 1;
    for irq in 0..IOAPIC_PINS {
        // type, irq type, flags (u16, conforming), source bus, source irq, dest apic, dest pin
        entries.extend_from_slice(&[MP_INTSRC, MP_IRQ_INT, 0, 0, 0, irq, ioapic_id, irq]);
        count += 1;
    }
    // LINT0 of every CPU is ExtINT, LINT1 is NMI (dest 0xff = all local APICs).
    entries.extend_from_slice(&[MP_LINTSRC, MP_IRQ_EXTINT, 0, 0, 0, 0, 0xff, 0]);
    entries.extend_from_slice(&[MP_LINTSRC, MP_IRQ_NMI, 0, 0, 0, 0, 0xff, 1]);
    count += 2;

    let mut table = Vec::with_capacity(44 + entries.len());
    table.extend_from_slice(b"PCMP");
    table.extend_from_slice(&((44 + entries.len()) as u16).to_le_bytes());
    table.push(MPC_SPEC_REV);
    table.push(0); // checksum, below
    table.extend_from_slice(b"MICROVRT");
    table.extend_from_slice(b"MICROVIRT   ");
    table.extend_from_slice(&0u32.to_le_bytes()); // OEM table pointer
    table.extend_from_slice(&0u16.to_le_bytes()); // OEM table size
    table.extend_from_slice(&count.to_le_bytes());
    table.extend_from_slice(&(APIC_ADDR as u32).to_le_bytes());
    table.extend_from_slice(&0u16.to_le_bytes()); // extended table length
    table.push(0); // extended table checksum
    table.push(0); // reserved
    debug_assert_eq!(table.len(), 44);
    table.extend_from_slice(&entries);
    table[7] = checksum(&table);

    let mut fp = Vec::with_capacity(16);
    fp.extend_from_slice(b"_MP_");
    fp.extend_from_slice(&(config_addr as u32).to_le_bytes());
    fp.push(1); // length in 16-byte units
    fp.push(MPC_SPEC_REV);
    fp.push(0); // checksum, below
    fp.extend_from_slice(&[0u8; 5]); // feature bytes: 0 = configuration table present
    fp[10] = checksum(&fp);

    fp.extend_from_slice(&table);
    if fp.len() as u64 > MPTABLE_MAX_SIZE {
        return Err(MptableError::TooLarge(fp.len()));
    }
    Ok(fp)
}

/// Writes the MP table for `vcpus` CPUs at its fixed place in the EBDA.
pub fn setup(mem: &GuestMemoryMmap, vcpus: u8) -> Result<(), MptableError> {
    let bytes = build(MPTABLE_START, vcpus)?;
    mem.write_slice(&bytes, GuestAddress(MPTABLE_START))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(b: &[u8]) -> u8 {
        b.iter().fold(0u8, |a, x| a.wrapping_add(*x))
    }

    #[test]
    fn checksums_and_counts() {
        for n in [1u8, 2, 4, MAX_VCPUS] {
            let t = build(MPTABLE_START, n).unwrap();
            assert_eq!(&t[0..4], b"_MP_");
            assert_eq!(sum(&t[..16]), 0);
            let cfg = &t[16..];
            assert_eq!(&cfg[0..4], b"PCMP");
            let len = u16::from_le_bytes([cfg[4], cfg[5]]) as usize;
            assert_eq!(len, cfg.len());
            assert_eq!(sum(cfg), 0);
            let count = u16::from_le_bytes([cfg[34], cfg[35]]);
            assert_eq!(count as usize, n as usize + 2 + 24 + 2);
            let cpus = cfg[44..]
                .chunks(20)
                .take(n as usize)
                .filter(|e| e[0] == MP_PROCESSOR)
                .count();
            assert_eq!(cpus, n as usize);
            assert_eq!(cfg[44 + 3], CPU_ENABLED | CPU_BOOTPROCESSOR);
        }
    }

    #[test]
    fn vcpu_limits() {
        assert!(matches!(
            build(MPTABLE_START, 0),
            Err(MptableError::VcpuCount(0))
        ));
        assert!(build(MPTABLE_START, MAX_VCPUS + 1).is_err());
    }
}
