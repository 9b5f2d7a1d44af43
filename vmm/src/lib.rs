//! microvirt's virtual machine monitor: boots a guest kernel directly on KVM.
//!
//! Layout follows one directory per concern: `arch/` (x86_64 boot and CPU setup),
//! `vstate/` (KVM VM, vCPUs, guest memory), `acpi/` (the ACPI tables), `devices/` (buses, legacy and virtio
//! devices), `device_manager/` (assigns addresses and IRQs), `snapshot/` (snapshot format,
//! save and restore; `docs/snapshot.md`).

pub mod acpi;
pub mod arch;
pub mod builder;
pub mod config;
pub mod control;
pub mod device_manager;
pub mod devices;
pub mod lifecycle;
pub mod logging;
pub mod machine;
pub mod reboot;
pub mod snapshot;
pub mod timing;
pub mod vstate;

pub use builder::{
    Action, BuildOptions, ExitReason, RestoreConfig, ThreadHook, VmStatus, VmThread, Vmm,
    VmmController, VmmError,
};
pub use config::{SerialConfig, VmConfig};
