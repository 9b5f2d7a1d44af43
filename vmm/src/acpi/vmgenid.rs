//! The VM generation ID: 16 random bytes in guest memory that change whenever the VM may have
//! been duplicated, so that a guest can tell it is a copy (Linux's `vmgenid` driver, 5.18+,
//! reseeds its RNG from them).
//!
//! ```text
//! \_SB.VGEN  _HID "QEMUVGID", _CID "VM_Gen_Counter", _DDN "VM_Gen_Counter"
//!            ADDR: Package {low 32 bits, high 32 bits} of the ID's guest-physical address
//! ```
//!
//! The ID lives at [`VMGENID_ADDR`], a page of the legacy BIOS area that the memory map
//! reserves and nothing else uses. A fresh VM gets a random ID at build; every restore of a
//! snapshot writes a new random one before any vCPU runs and queues the GED's
//! [`EVENT_VMGENID`](crate::devices::acpi::EVENT_VMGENID), whose `_EVT` branch does
//! `Notify (\_SB.VGEN, 0x80)` (the notification the driver listens for). An in-place reboot
//! keeps the ID (it is in the low pages the reboot puts back).

use acpi_tables::aml::{Device, Method, Name, Package, Return};
use acpi_tables::Aml;
use vm_memory::{Bytes, GuestAddress};

use crate::arch::x86_64::layout::{VMGENID_ADDR, VMGENID_LEN};
use crate::vstate::memory::GuestMemoryMmap;

/// The device's `_HID` (QEMU's, which guests' drivers know) and its `_CID` / `_DDN` (the name
/// Linux's driver matches after ACPICA upper-cases it).
pub const HID: &str = "QEMUVGID";
pub const CID: &str = "VM_Gen_Counter";
/// The DSDT path of the device (the GED's `_EVT` notifies it).
pub const DEVICE_PATH: &str = "\\_SB_.VGEN";
/// `Notify` value of a generation change (the one the driver handles).
pub const NOTIFY_GENERATION_CHANGED: u8 = 0x80;

/// A generation ID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GenerationId(pub [u8; VMGENID_LEN as usize]);

#[derive(Debug, thiserror::Error)]
pub enum VmGenIdError {
    #[error("getrandom for a new VM generation ID: {0}")]
    Random(std::io::Error),
    #[error("writing the VM generation ID into guest memory: {0}")]
    GuestMemory(#[from] vm_memory::GuestMemoryError),
}

impl GenerationId {
    /// A new random ID from the kernel's CSPRNG (`getrandom`, blocking only until the host's
    /// pool was initialized once, long before any VM runs).
    pub fn random() -> Result<Self, VmGenIdError> {
        let mut b = [0u8; VMGENID_LEN as usize];
        let mut filled = 0;
        while filled < b.len() {
            // SAFETY: the pointer and length describe the unfilled tail of `b`, which we own;
            // getrandom writes at most that many bytes.
            let n =
                unsafe { libc::getrandom(b[filled..].as_mut_ptr().cast(), b.len() - filled, 0) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(VmGenIdError::Random(e));
            }
            filled += n as usize;
        }
        Ok(Self(b))
    }

    /// Writes the ID where the DSDT's `ADDR` points.
    pub fn write(&self, mem: &GuestMemoryMmap, addr: u64) -> Result<(), VmGenIdError> {
        mem.write_slice(&self.0, GuestAddress(addr))?;
        Ok(())
    }

    /// Reads the ID at `addr`.
    pub fn read(mem: &GuestMemoryMmap, addr: u64) -> Result<Self, VmGenIdError> {
        let mut b = [0u8; VMGENID_LEN as usize];
        mem.read_slice(&mut b, GuestAddress(addr))?;
        Ok(Self(b))
    }
}

impl std::fmt::Display for GenerationId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// A fresh VM's ID: a new random one written to [`VMGENID_ADDR`]; returns that address.
pub fn install(mem: &GuestMemoryMmap) -> Result<u64, VmGenIdError> {
    GenerationId::random()?.write(mem, VMGENID_ADDR)?;
    Ok(VMGENID_ADDR)
}

/// Appends `\_SB.VGEN` (see the module documentation) to `sink`.
pub fn append_aml(sink: &mut Vec<u8>) {
    let low = (VMGENID_ADDR & 0xffff_ffff) as u32;
    let high = (VMGENID_ADDR >> 32) as u32;
    Device::new(
        "VGEN".into(),
        vec![
            &Name::new("_HID".into(), &HID),
            &Name::new("_CID".into(), &CID),
            &Name::new("_DDN".into(), &CID),
            &Method::new(
                "ADDR".into(),
                0,
                false,
                vec![&Return::new(&Package::new(vec![&low, &high]))],
            ),
        ],
    )
    .to_aml_bytes(sink);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::x86_64::boot::{memory_map, E820_RAM, E820_RESERVED};
    use crate::arch::x86_64::layout::{MAX_VCPUS, VIRTIO_IRQ_FIRST, VIRTIO_IRQ_LAST};

    #[test]
    fn random_ids_differ_and_round_trip_through_guest_memory() {
        let a = GenerationId::random().unwrap();
        let b = GenerationId::random().unwrap();
        assert_ne!(a, b);
        assert_ne!(a.0, [0; 16]);
        assert_eq!(a.to_string().len(), 32);
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 2 << 20)]).unwrap();
        assert_eq!(install(&mem).unwrap(), VMGENID_ADDR);
        let first = GenerationId::read(&mem, VMGENID_ADDR).unwrap();
        assert_ne!(first.0, [0; 16]);
        a.write(&mem, VMGENID_ADDR).unwrap();
        assert_eq!(GenerationId::read(&mem, VMGENID_ADDR).unwrap(), a);
        // Only the 16 bytes: the rest of the page stays as it was.
        let mut next = [0xffu8; 16];
        mem.read_slice(&mut next, GuestAddress(VMGENID_ADDR + 16))
            .unwrap();
        assert_eq!(next, [0; 16]);
    }

    #[test]
    fn the_id_is_reserved_in_every_memory_map_and_overlaps_nothing() {
        let id = VMGENID_ADDR..VMGENID_ADDR + VMGENID_LEN;
        for mib in [1u64, 64, 128, 3072, 4096, 8192] {
            let map = memory_map(mib << 20);
            let holding: Vec<_> = map
                .iter()
                .filter(|e| e.addr < id.end && id.start < e.addr + e.size)
                .collect();
            assert_eq!(holding.len(), 1, "{mib} MiB: {map:?}");
            let e = holding[0];
            assert_eq!(e.kind, E820_RESERVED, "{mib} MiB");
            assert!(e.addr <= id.start && id.end <= e.addr + e.size);
            assert!(map
                .iter()
                .filter(|e| e.kind == E820_RAM)
                .all(|e| e.addr + e.size <= id.start || id.end <= e.addr));
        }
        // After every ACPI table of the largest VM.
        let m = crate::acpi::tests::manager((VIRTIO_IRQ_LAST - VIRTIO_IRQ_FIRST + 1) as usize);
        let t = crate::acpi::create(MAX_VCPUS, &m).unwrap();
        for tb in t.all() {
            assert!(
                tb.addr + tb.bytes.len() as u64 <= VMGENID_ADDR,
                "{:#x}",
                tb.addr
            );
        }
    }

    #[test]
    fn the_device_names_its_ids_and_address_method() {
        let mut aml = Vec::new();
        append_aml(&mut aml);
        let has = |n: &[u8]| aml.windows(n.len()).any(|w| w == n);
        assert!(has(b"VGEN"));
        assert!(has(b"QEMUVGID\0"));
        assert!(has(b"VM_Gen_Counter\0"));
        assert!(has(b"ADDR"));
        // ReturnOp, PackageOp, .., 2 elements, DWordConst low, Zero (high).
        let mut ret = vec![0x0c];
        ret.extend_from_slice(&(VMGENID_ADDR as u32).to_le_bytes());
        ret.push(0x00);
        assert!(has(&ret), "{aml:02x?}");
    }
}
