//! Every operator test that needs no API server of its own, in one binary that starts one
//! control plane for all of them: a real etcd + kube-apiserver with the ImageVolume gate on and
//! the CRDs installed (`common::shared_cluster`). Each test's in-process operator is scoped to
//! the test's own namespace (`common::Env::start`), so the tests run side by side; namespaces and
//! cluster-scoped objects (nodes, cluster instancetypes) are named uniquely across the modules,
//! and `deploy/`'s namespace and RBAC are applied once (`common::apply_operator_rbac`).
//!
//! Tests that need their own API server stay separate binaries named by that precondition:
//! `apiserver_restart` (restarts it), `image_volume_gate` (other feature gates), `binary` and
//! `lifecycle` (the `virt-operator` process and its cluster-wide Lease; lifecycle stops and
//! freezes the API server).
//!
//! Modules: CRDs and validation (`crds`, `names`, `quantities`, `kubevirt_manifests`), VMI →
//! pod → status and deletion (`vmi`), VMIRS scaling (`replica_set`), VM run strategies and
//! requests (`run_strategies`, `vm_requests`), presets, instancetypes, pools, reconcilers on a
//! stale cache, cloud-init Secrets, volumes, and the `deploy/` manifests and RBAC (`deploy`).

#[path = "../common/mod.rs"]
mod common;

mod cloud_init_secret;
mod crds;
mod deploy;
mod harness;
mod instancetypes;
mod kubevirt_manifests;
mod names;
mod pool;
mod presets;
mod quantities;
mod replica_set;
mod run_strategies;
mod stale_cache;
mod vm_requests;
mod vmi;
mod volumes;
