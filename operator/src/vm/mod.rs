//! VirtualMachine: one VMI run by a run strategy.
//!
//! - [`plan`]: run-strategy semantics, start/stop requests and printable status (pure);
//! - [`instancetype`]: instancetypes and preferences and their ControllerRevisions (pure);
//! - [`reconcile`]: the reconciler that makes the API calls.

pub mod instancetype;
pub mod plan;
pub mod reconcile;
