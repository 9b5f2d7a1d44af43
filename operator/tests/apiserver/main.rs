//! The operator against a real kube-apiserver: CRDs, validation, VMI → pod → status, deletion,
//! VMIRS scaling, VM run strategies, presets, `kubectl get` columns.

#[path = "../common/mod.rs"]
mod common;
mod crds;
mod harness;
mod presets;
mod replica_set;
mod run_strategies;
mod vm_requests;
mod vmi;
