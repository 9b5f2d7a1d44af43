//! ACPI tables for guests that find their hardware through ACPI (distribution kernels built
//! without `CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES` or `X86_MPPARSE`).
//!
//! The tables are written once into guest RAM at build, from
//! [`ACPI_TABLES_START`] (the RSDP, found there or through the zero page's `acpi_rsdp_addr` /
//! PVH `rsdp_paddr`) up to [`ACPI_TABLES_END`], an area the memory map reserves. A snapshot
//! keeps them with the rest of RAM; nothing here has state. The VM generation ID follows them
//! in the same reserved area ([`vmgenid`]).
//!
//! | table | contents |
//! |---|---|
//! | RSDP | ACPI 2.0, pointing at the XSDT |
//! | XSDT | the FADT and the MADT |
//! | FADT | hardware-reduced ACPI, power and sleep buttons as control-method devices, reset register, sleep control/status registers, `X_DSDT` ([`fadt`]) |
//! | MADT | a local APIC per vCPU, the IOAPIC, the IRQ 0 override, LINT1 = NMI ([`madt`]) |
//! | DSDT | COM1, the i8042, every virtio-mmio device the device manager placed, the power button, the VM generation ID device ([`vmgenid`]) and the GED ([`dsdt`]) |
//!
//! Like Firecracker's, the device manager that assigns addresses and IRQs describes its
//! devices ([`MmioDeviceManager::append_aml`]): the DSDT and the kernel command line come from
//! the same list.

pub mod aml;
pub mod dsdt;
pub mod fadt;
pub mod madt;
pub mod vmgenid;

use acpi_tables::rsdp::Rsdp;
use acpi_tables::xsdt::XSDT;
use acpi_tables::Aml;
use vm_memory::{Bytes, GuestAddress};

use crate::arch::x86_64::layout::{ACPI_TABLES_END, ACPI_TABLES_START};
use crate::device_manager::mmio::MmioDeviceManager;
use crate::vstate::memory::GuestMemoryMmap;

/// OEM fields of every table.
pub const OEM_ID: [u8; 6] = *b"MCRVRT";
pub const OEM_TABLE_ID: [u8; 8] = *b"MICROVM ";
pub const OEM_REVISION: u32 = 1;
/// Where the RSDP is.
pub const RSDP_ADDR: u64 = ACPI_TABLES_START;
/// Tables start at multiples of this.
const TABLE_ALIGN: u64 = 16;

#[derive(Debug, thiserror::Error)]
pub enum AcpiError {
    #[error("the ACPI tables ({len} bytes) do not fit their area {ACPI_TABLES_START:#x}..{ACPI_TABLES_END:#x}")]
    TooLarge { len: u64 },
    #[error(transparent)]
    Madt(#[from] madt::MadtError),
    #[error("writing the ACPI tables into guest memory: {0}")]
    GuestMemory(#[from] vm_memory::GuestMemoryError),
}

/// One table and where it goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    pub addr: u64,
    pub bytes: Vec<u8>,
}

/// The tables of one VM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcpiTables {
    pub rsdp: Table,
    pub xsdt: Table,
    pub fadt: Table,
    pub madt: Table,
    pub dsdt: Table,
}

impl AcpiTables {
    /// Every table, the RSDP first.
    pub fn all(&self) -> [&Table; 5] {
        [&self.rsdp, &self.xsdt, &self.fadt, &self.madt, &self.dsdt]
    }

    /// The guest physical address of the RSDP.
    pub fn rsdp_addr(&self) -> u64 {
        self.rsdp.addr
    }

    /// Writes every table into guest memory.
    pub fn write(&self, mem: &GuestMemoryMmap) -> Result<(), AcpiError> {
        for t in self.all() {
            mem.write_slice(&t.bytes, GuestAddress(t.addr))?;
        }
        Ok(())
    }
}

fn aml_bytes(t: &dyn Aml) -> Vec<u8> {
    let mut v = Vec::new();
    t.to_aml_bytes(&mut v);
    v
}

/// Hands out addresses in the table area.
struct Placer {
    next: u64,
}

impl Placer {
    fn place(&mut self, bytes: Vec<u8>) -> Result<Table, AcpiError> {
        let addr = self.next.next_multiple_of(TABLE_ALIGN);
        let end = addr + bytes.len() as u64;
        if end > ACPI_TABLES_END {
            return Err(AcpiError::TooLarge {
                len: end - ACPI_TABLES_START,
            });
        }
        self.next = end;
        Ok(Table { addr, bytes })
    }
}

/// Builds the tables for `vcpus` vCPUs and the devices `mmio` placed.
pub fn create(vcpus: u8, mmio: &MmioDeviceManager) -> Result<AcpiTables, AcpiError> {
    let rsdp_len = Rsdp::len() as u64;
    let mut placer = Placer {
        next: RSDP_ADDR + rsdp_len,
    };
    let dsdt = placer.place(dsdt::build(mmio))?;
    let fadt = placer.place(fadt::build(dsdt.addr))?;
    let madt = placer.place(madt::build(vcpus)?)?;
    let mut xsdt = XSDT::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    xsdt.add_entry(fadt.addr);
    xsdt.add_entry(madt.addr);
    let xsdt = placer.place(aml_bytes(&xsdt))?;
    let rsdp = Table {
        addr: RSDP_ADDR,
        bytes: aml_bytes(&Rsdp::new(OEM_ID, xsdt.addr)),
    };
    Ok(AcpiTables {
        rsdp,
        xsdt,
        fadt,
        madt,
        dsdt,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::arch::x86_64::layout::{ACPI_GED_IRQ, VIRTIO_IRQ_FIRST};

    pub fn sum(b: &[u8]) -> u8 {
        b.iter().fold(0u8, |a, x| a.wrapping_add(*x))
    }

    pub fn u32_at(b: &[u8], o: usize) -> u32 {
        u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
    }

    pub fn u64_at(b: &[u8], o: usize) -> u64 {
        u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
    }

    /// Checks the standard header: signature, length field = bytes, checksum.
    pub fn check_header(b: &[u8], sig: &[u8; 4]) {
        assert_eq!(&b[0..4], sig);
        assert_eq!(u32_at(b, 4) as usize, b.len(), "{sig:?} length");
        assert_eq!(sum(b), 0, "{sig:?} checksum");
        assert_eq!(&b[10..16], &OEM_ID);
        assert_eq!(&b[16..24], &OEM_TABLE_ID);
    }

    pub fn manager(n: usize) -> MmioDeviceManager {
        let mut m = MmioDeviceManager::new();
        for i in 0..n {
            m.allocate(&format!("dev{i}")).unwrap();
        }
        m
    }

    #[test]
    fn tables_are_linked_checksummed_and_placed_without_overlap() {
        let t = create(2, &manager(3)).unwrap();
        // RSDP: signature, both checksums, revision 2, the XSDT address.
        let r = &t.rsdp.bytes;
        assert_eq!(t.rsdp.addr, 0xe_0000);
        assert_eq!(&r[0..8], b"RSD PTR ");
        assert_eq!(r.len(), 36);
        assert_eq!(sum(&r[0..20]), 0);
        assert_eq!(sum(r), 0);
        assert_eq!(r[15], 2);
        assert_eq!(u32_at(r, 20), 36);
        assert_eq!(u64_at(r, 24), t.xsdt.addr);
        // XSDT: the FADT and the MADT.
        check_header(&t.xsdt.bytes, b"XSDT");
        assert_eq!(t.xsdt.bytes.len(), 36 + 16);
        assert_eq!(u64_at(&t.xsdt.bytes, 36), t.fadt.addr);
        assert_eq!(u64_at(&t.xsdt.bytes, 44), t.madt.addr);
        check_header(&t.fadt.bytes, b"FACP");
        check_header(&t.madt.bytes, b"APIC");
        check_header(&t.dsdt.bytes, b"DSDT");
        // X_DSDT
        assert_eq!(u64_at(&t.fadt.bytes, 140), t.dsdt.addr);
        // In the reserved area, aligned, no overlap.
        for tb in t.all() {
            assert!(
                tb.addr >= ACPI_TABLES_START && tb.addr % 16 == 0,
                "{:#x}",
                tb.addr
            );
            assert!(tb.addr + tb.bytes.len() as u64 <= ACPI_TABLES_END);
        }
        let mut all = t.all().to_vec();
        all.sort_by_key(|t| t.addr);
        for w in all.windows(2) {
            assert!(w[0].addr + w[0].bytes.len() as u64 <= w[1].addr);
        }
    }

    #[test]
    fn the_largest_vm_fits() {
        let m =
            manager((crate::arch::x86_64::layout::VIRTIO_IRQ_LAST - VIRTIO_IRQ_FIRST + 1) as usize);
        let t = create(crate::arch::x86_64::layout::MAX_VCPUS, &m).unwrap();
        assert!(t.xsdt.addr + t.xsdt.bytes.len() as u64 <= ACPI_TABLES_END);
        assert_ne!(ACPI_GED_IRQ, VIRTIO_IRQ_FIRST);
    }

    #[test]
    fn written_into_guest_memory() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 2 << 20)]).unwrap();
        let t = create(1, &manager(1)).unwrap();
        t.write(&mem).unwrap();
        for tb in t.all() {
            let mut back = vec![0u8; tb.bytes.len()];
            mem.read_slice(&mut back, GuestAddress(tb.addr)).unwrap();
            assert_eq!(back, tb.bytes);
        }
    }
}
