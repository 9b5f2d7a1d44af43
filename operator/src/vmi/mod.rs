//! VirtualMachineInstance: its launcher pod and its status.
//!
//! - [`plan`]: the VMI's status derived from its launcher pod (pure);
//! - [`preset`]: applying VirtualMachineInstancePresets to its spec (pure);
//! - [`reconcile`]: the reconciler that makes the API calls.

pub mod plan;
pub mod preset;
pub mod reconcile;
