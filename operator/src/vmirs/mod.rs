//! VirtualMachineInstanceReplicaSet: a number of VMIs from one template.
//!
//! - [`plan`]: which VMIs to create and delete, and the status to report (pure);
//! - [`reconcile`]: the reconciler that makes the API calls.

pub mod plan;
pub mod reconcile;
