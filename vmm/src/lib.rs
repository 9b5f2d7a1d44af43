//! microvirt's virtual machine monitor: boots a guest kernel directly on KVM.
//!
//! Layout follows one directory per concern: `arch/` (x86_64 boot and CPU setup),
//! `vstate/` (KVM VM, vCPUs, guest memory), `acpi/` (the ACPI tables), `devices/` (buses, legacy and virtio
//! devices), `device_manager/` (assigns addresses and IRQs, attaches the devices, saves and
//! restores them), `snapshot/` (snapshot format, save and restore; `docs/snapshot.md`);
//! `persist.rs` is the one shape of every saved piece ([`persist::Persist`]).

pub mod acpi;
pub mod actions;
pub mod arch;
pub mod builder;
pub mod config;
pub mod control;
pub mod device_manager;
pub mod devices;
pub mod event_loop;
pub mod lifecycle;
pub mod logging;
pub mod machine;
pub mod persist;
pub mod reboot;
pub mod snapshot;
pub mod threads;
pub mod timing;
pub mod vstate;

pub use actions::{Action, ExitReason, RunTimings, VmStatus, VmmController};
pub use builder::{BuildOptions, RestoreConfig, VmmError};
pub use config::{SerialConfig, VmConfig};
pub use event_loop::{RunError, Vmm};
pub use threads::{ThreadHook, VmThread};
