//! VirtualMachineInstance: its launcher pod and its status.
//!
//! - [`plan`]: the VMI's status derived from its launcher pod (pure);
//! - [`preset`]: applying VirtualMachineInstancePresets to its spec (pure);
//! - [`reconcile`]: the reconciler that makes the API calls;
//! - [`VmiRef`]: how the VMI's owners (VMIRS, VM, pool) name one to delete.

use kube::ResourceExt;
use microvirt_crds::VirtualMachineInstance;

pub mod plan;
pub mod preset;
pub mod reconcile;

/// A VMI by name and the uid the decision saw; deleting it is conditioned on that uid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmiRef {
    /// Name.
    pub name: String,
    /// Uid (None only for objects never stored, e.g. in unit tests).
    pub uid: Option<String>,
}

impl VmiRef {
    /// The reference to `vmi`.
    pub fn of(vmi: &VirtualMachineInstance) -> Self {
        Self {
            name: vmi.name_any(),
            uid: vmi.metadata.uid.clone(),
        }
    }
}
