//! The FADT (signature `FACP`, ACPI 6.5): a hardware-reduced platform.
//!
//! - Flags: `HW_REDUCED_ACPI` (no PM1/GPE blocks, no SCI, no FACS: events come through the
//!   GED), `PWR_BUTTON` and `SLP_BUTTON` (the power button is a control-method device, there is
//!   no sleep button), `RESET_REG_SUP`.
//! - `IAPC_BOOT_ARCH`: an 8042 is present (without it Linux never probes the i8042, and the
//!   VMM's Ctrl-Alt-Del would not reach the guest; `reboot=k` pokes port 0x64 either way), no
//!   VGA, no MSI (no PCI), no CMOS RTC (there is none).
//! - `RESET_REG` / `RESET_VALUE`, `SLEEP_CONTROL_REG`, `SLEEP_STATUS_REG`: byte-wide I/O ports
//!   of the [`AcpiPmDevice`](crate::devices::acpi::AcpiPmDevice).
//! - `X_DSDT`: the DSDT (the 32-bit `DSDT` field stays 0).

use acpi_tables::fadt::{FADTBuilder, Flags};
use acpi_tables::gas::{AccessSize, AddressSpace, GAS};

use super::{aml_bytes, OEM_ID, OEM_REVISION, OEM_TABLE_ID};
use crate::arch::x86_64::layout::ACPI_PM_PORT;
use crate::devices::acpi::{REG_RESET, REG_SLEEP_CONTROL, REG_SLEEP_STATUS, RESET_VALUE};

/// `IAPC_BOOT_ARCH` bits (ACPI 6.5 table 5.11).
pub const IAPC_8042: u16 = 1 << 1;
pub const IAPC_VGA_NOT_PRESENT: u16 = 1 << 2;
pub const IAPC_MSI_NOT_SUPPORTED: u16 = 1 << 3;
pub const IAPC_CMOS_RTC_NOT_PRESENT: u16 = 1 << 5;

/// A byte-wide register at `offset` in the ACPI platform ports.
fn pm_port(offset: u64) -> GAS {
    GAS::new(
        AddressSpace::SystemIo,
        8,
        0,
        AccessSize::ByteAccess,
        u64::from(ACPI_PM_PORT) + offset,
    )
}

/// The FADT pointing at the DSDT at `dsdt_addr`.
pub fn build(dsdt_addr: u64) -> Vec<u8> {
    let mut b = FADTBuilder::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION)
        .flag(Flags::HwReducedAcpi)
        .flag(Flags::PwrButton)
        .flag(Flags::SlpButton)
        .flag(Flags::ResetRegSup)
        .dsdt_64(dsdt_addr);
    b.iapc_boot_arch =
        (IAPC_8042 | IAPC_VGA_NOT_PRESENT | IAPC_MSI_NOT_SUPPORTED | IAPC_CMOS_RTC_NOT_PRESENT)
            .into();
    b.reset_reg = pm_port(REG_RESET);
    b.reset_value = RESET_VALUE;
    b.sleep_control_reg = pm_port(REG_SLEEP_CONTROL);
    b.sleep_status_reg = pm_port(REG_SLEEP_STATUS);
    aml_bytes(&b.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acpi::tests::{check_header, u32_at, u64_at};

    #[test]
    fn fadt_fields() {
        let f = build(0xe_1234);
        check_header(&f, b"FACP");
        assert_eq!(f.len(), 276, "ACPI 6.x FADT");
        assert_eq!((f[8], f[131]), (6, 5), "revision 6.5");
        let flags = u32_at(&f, 112);
        assert_ne!(flags & (1 << 20), 0, "HW_REDUCED_ACPI");
        assert_ne!(flags & (1 << 10), 0, "RESET_REG_SUP");
        assert_ne!(flags & (1 << 4), 0, "PWR_BUTTON");
        let boot_arch = u16::from_le_bytes([f[109], f[110]]);
        assert_eq!(boot_arch, 0b10_1110);
        // RESET_REG: system I/O, 8 bits, byte access, port 0x603; RESET_VALUE.
        assert_eq!(&f[116..120], &[1, 8, 0, 1]);
        assert_eq!(u64_at(&f, 120), 0x603);
        assert_eq!(f[128], RESET_VALUE);
        // X_DSDT, and the 32-bit DSDT left 0.
        assert_eq!(u64_at(&f, 140), 0xe_1234);
        assert_eq!(u32_at(&f, 40), 0);
        // SLEEP_CONTROL_REG (offset 244) and SLEEP_STATUS_REG (256).
        assert_eq!(&f[244..248], &[1, 8, 0, 1]);
        assert_eq!(u64_at(&f, 248), 0x601);
        assert_eq!(&f[256..260], &[1, 8, 0, 1]);
        assert_eq!(u64_at(&f, 260), 0x602);
        // No SCI, no PM1 blocks.
        assert_eq!(u16::from_le_bytes([f[46], f[47]]), 0);
        assert_eq!(u32_at(&f, 56), 0);
    }
}
