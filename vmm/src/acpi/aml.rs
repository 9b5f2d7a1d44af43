//! AML pieces that more than one table writer uses (the DSDT's own devices and the device
//! manager's virtio-mmio entries). A leaf: it imports nothing of this crate.

use acpi_tables::aml::Interrupt;

/// An edge-triggered, active-high, exclusive interrupt the device consumes: how every line of
/// this VM behaves (irqfd edges).
pub fn edge_interrupt(gsi: u32) -> Interrupt {
    Interrupt::new(true, true, false, false, gsi)
}
