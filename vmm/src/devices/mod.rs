//! Devices: the address buses, legacy PC devices and virtio devices.
pub mod acpi;
pub mod bus;
pub mod interrupt;
pub mod legacy;
pub mod virtio;
