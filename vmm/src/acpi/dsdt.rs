//! The DSDT: the devices a guest cannot find otherwise, in `\_SB`.
//!
//! ```text
//! \_S5_  Package {5, 0, 0, 0}      SLP_TYP of S5 for the sleep control register
//! \_SB.COM1  PNP0501  IO 0x3f8/8, IRQ 4 (edge, high)
//! \_SB.PS2K  PNP0303  IO 0x60 and 0x64, IRQ 1 (edge, high)
//! \_SB.V000.. LNRO0005 (virtio-mmio)  _UID n, Memory32Fixed slot, IRQ (edge, high)  <- device manager
//! \_SB.PWRB  PNP0C0C  the power button
//! \_SB.VGEN  QEMUVGID / VM_Gen_Counter, the VM generation ID (ADDR: its address; vmgenid.rs)
//! \_SB.GED_  ACPI0013 IRQ 3 (edge, high); _EVT reads the GED event port and notifies PWRB
//!            (0x80) for bit 0 and VGEN (0x80) for bit 1
//! ```
//!
//! The virtio devices come from [`MmioDeviceManager::append_aml`], the list the kernel command
//! line's `virtio_mmio.device=` entries come from too.

use acpi_tables::aml::{
    And, Device, EISAName, Equal, Field, FieldAccessType, FieldEntry, FieldLockRule,
    FieldUpdateRule, If, Local, Method, Name, Notify, OpRegion, OpRegionSpace, Package, Path,
    ResourceTemplate, Scope, Store, IO, ONE, ZERO,
};
use acpi_tables::sdt::Sdt;
use acpi_tables::Aml;

use super::aml::edge_interrupt;
use super::vmgenid;
use super::{OEM_ID, OEM_REVISION, OEM_TABLE_ID};
use crate::arch::x86_64::layout::{
    ACPI_GED_IRQ, ACPI_PM_PORT, I8042_CMD_PORT, I8042_IRQ, I8042_PORT, SERIAL_IRQ, SERIAL_PORT,
};
use crate::device_manager::mmio::MmioDeviceManager;
use crate::devices::acpi::{EVENT_POWER_BUTTON, EVENT_VMGENID, REG_GED_EVENT, S5_SLP_TYP};

/// DSDT revision 2: integers are 64 bits.
const DSDT_REVISION: u8 = 2;
/// `Notify` value of a power button press (ACPI 6.5 §4.8.3.1.1).
const NOTIFY_POWER_BUTTON: u8 = 0x80;

fn serial(sink: &mut Vec<u8>) {
    Device::new(
        "COM1".into(),
        vec![
            &Name::new("_HID".into(), &EISAName::new("PNP0501")),
            &Name::new("_UID".into(), &ZERO),
            &Name::new(
                "_CRS".into(),
                &ResourceTemplate::new(vec![
                    &IO::new(SERIAL_PORT, SERIAL_PORT, 1, 8),
                    &edge_interrupt(SERIAL_IRQ),
                ]),
            ),
        ],
    )
    .to_aml_bytes(sink);
}

fn i8042(sink: &mut Vec<u8>) {
    Device::new(
        "PS2K".into(),
        vec![
            &Name::new("_HID".into(), &EISAName::new("PNP0303")),
            &Name::new(
                "_CRS".into(),
                &ResourceTemplate::new(vec![
                    &IO::new(I8042_PORT, I8042_PORT, 1, 1),
                    &IO::new(I8042_CMD_PORT, I8042_CMD_PORT, 1, 1),
                    &edge_interrupt(I8042_IRQ),
                ]),
            ),
        ],
    )
    .to_aml_bytes(sink);
}

fn power_button(sink: &mut Vec<u8>) {
    Device::new(
        "PWRB".into(),
        vec![
            &Name::new("_HID".into(), &EISAName::new("PNP0C0C")),
            &Name::new("_UID".into(), &ZERO),
        ],
    )
    .to_aml_bytes(sink);
}

/// The Generic Event Device: on its interrupt Linux's GED driver runs `_EVT`, which reads (and
/// so clears) the pending events and notifies the power button and the VM generation ID device
/// for their bits.
fn ged(sink: &mut Vec<u8>) {
    let port = u64::from(ACPI_PM_PORT) + REG_GED_EVENT;
    Device::new(
        "GED_".into(),
        vec![
            &Name::new("_HID".into(), &"ACPI0013"),
            &Name::new("_UID".into(), &ZERO),
            &Name::new(
                "_CRS".into(),
                &ResourceTemplate::new(vec![&edge_interrupt(ACPI_GED_IRQ)]),
            ),
            &OpRegion::new("GDST".into(), OpRegionSpace::SystemIO, &port, &ONE),
            &Field::new(
                "GDST".into(),
                FieldAccessType::Byte,
                FieldLockRule::NoLock,
                FieldUpdateRule::Preserve,
                vec![FieldEntry::Named(*b"GDAT", 8)],
            ),
            &Method::new(
                "_EVT".into(),
                1,
                true,
                vec![
                    &Store::new(&Local(0), &Path::new("GDAT")),
                    &And::new(&Local(1), &Local(0), &EVENT_POWER_BUTTON),
                    &If::new(
                        &Equal::new(&Local(1), &EVENT_POWER_BUTTON),
                        vec![&Notify::new(
                            &Path::new("\\_SB_.PWRB"),
                            &NOTIFY_POWER_BUTTON,
                        )],
                    ),
                    &And::new(&Local(1), &Local(0), &EVENT_VMGENID),
                    &If::new(
                        &Equal::new(&Local(1), &EVENT_VMGENID),
                        vec![&Notify::new(
                            &Path::new(vmgenid::DEVICE_PATH),
                            &vmgenid::NOTIFY_GENERATION_CHANGED,
                        )],
                    ),
                ],
            ),
        ],
    )
    .to_aml_bytes(sink);
}

/// The DSDT with the devices `mmio` placed.
pub fn build(mmio: &MmioDeviceManager) -> Vec<u8> {
    let mut sb = Vec::new();
    serial(&mut sb);
    i8042(&mut sb);
    mmio.append_aml(&mut sb);
    power_button(&mut sb);
    vmgenid::append_aml(&mut sb);
    ged(&mut sb);
    let mut body = Scope::raw("\\_SB_".into(), sb);
    Name::new(
        "_S5_".into(),
        &Package::new(vec![&S5_SLP_TYP, &ZERO, &ZERO, &ZERO]),
    )
    .to_aml_bytes(&mut body);
    let mut dsdt = Sdt::new(
        *b"DSDT",
        36,
        DSDT_REVISION,
        OEM_ID,
        OEM_TABLE_ID,
        OEM_REVISION,
    );
    dsdt.append_slice(&body);
    let mut out = Vec::with_capacity(dsdt.len());
    dsdt.to_aml_bytes(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acpi::tests::{check_header, manager};

    fn find(hay: &[u8], needle: &[u8]) -> usize {
        hay.windows(needle.len()).filter(|w| *w == needle).count()
    }

    #[test]
    fn names_every_device_the_manager_placed() {
        for n in [0usize, 1, 3, 19] {
            let m = manager(n);
            let d = build(&m);
            check_header(&d, b"DSDT");
            assert_eq!(d[8], DSDT_REVISION);
            assert_eq!(find(&d, b"LNRO0005\0"), n, "{n} devices");
            for (i, dev) in m.devices().iter().enumerate() {
                assert_eq!(find(&d, format!("V{i:03X}").as_bytes()), 1);
                // Memory32Fixed (0x86, length 9, read-write) with the slot.
                let mut mem = vec![0x86, 9, 0, 1];
                mem.extend_from_slice(&(dev.slot.addr as u32).to_le_bytes());
                mem.extend_from_slice(&(dev.slot.len as u32).to_le_bytes());
                assert_eq!(find(&d, &mem), 1, "{dev:?}");
                // Extended interrupt (0x89, length 6, consumer|edge, one GSI).
                let mut irq = vec![0x89, 6, 0, 0b11, 1];
                irq.extend_from_slice(&dev.slot.irq.to_le_bytes());
                assert_eq!(find(&d, &irq), 1, "{dev:?}");
            }
            assert_eq!(find(&d, b"ACPI0013\0"), 1);
            assert_eq!(find(&d, b"QEMUVGID\0"), 1);
            for name in [
                b"COM1", b"PS2K", b"PWRB", b"VGEN", b"ADDR", b"GED_", b"_EVT", b"_S5_",
            ] {
                assert!(find(&d, name) >= 1, "{}", String::from_utf8_lossy(name));
            }
        }
    }
}
