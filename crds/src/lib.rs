//! microvirt's custom resources: group `microvirt.io`, version `v1alpha1`.
//!
//! - [`VirtualMachineInstance`] (`vmi`): one microVM, run by one virt-launcher pod.
//! - [`VirtualMachine`] (`vm`): a VMI started and stopped according to a run strategy.
//! - [`VirtualMachineInstanceReplicaSet`] (`vmirs`): N identical VMIs (with a scale subresource).
//! - [`VirtualMachineInstancePreset`] (`vmipreset`): domain defaults for matching VMIs.
//! - [`VirtualMachineInstancetype`], [`VirtualMachineClusterInstancetype`],
//!   [`VirtualMachinePreference`], [`VirtualMachineClusterPreference`]: KubeVirt's
//!   instancetypes and preferences, which a VM names ([`instancetype`]).
//! - [`VirtualMachinePool`] (`vmpool`): N identical VMIs, scaled out from paused,
//!   snapshot-restored warm members (with a scale subresource).
//!
//! `crdgen` writes one YAML file per CRD into `crds/`; a test checks the committed files are current.
//!
//! All of the above needs feature `kube` (default). Without it the crate is only its kube-free
//! part, which `virt-launcher` uses so that operator and launcher share one implementation:
//! [`quantity`] (Kubernetes quantities → bytes) and [`termination`] (the launcher's termination
//! message); [`launcher_state`] (the launcher's state, as its control socket reports it to the
//! node agent); [`control`], the launcher pod's control annotations that operator and node
//! agent share; [`launcher_document`], the envelope of the VMI document the operator writes
//! for the launcher and the launcher reads; and [`mac`], the MAC address type that the VMM,
//! `netsetup` and the launcher share (feature `serde`, which `kube` turns on, adds their serde
//! impls).

pub mod control;
#[cfg(feature = "kube")]
pub mod instancetype;
pub mod launcher_document;
pub mod launcher_state;
pub mod mac;
#[cfg(feature = "kube")]
pub mod pool;
#[cfg(feature = "kube")]
pub mod preset;
pub mod quantity;
pub mod refusals;
#[cfg(feature = "kube")]
pub mod schema;
#[cfg(feature = "kube")]
pub mod template;
pub mod termination;
#[cfg(feature = "kube")]
pub mod vm;
#[cfg(feature = "kube")]
pub mod vmi;
#[cfg(feature = "kube")]
pub mod vmirs;
pub mod workload;

#[cfg(feature = "kube")]
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
#[cfg(feature = "kube")]
use kube::CustomResourceExt;

#[cfg(feature = "kube")]
pub use instancetype::{
    InstancetypeSpec, PreferenceSpec, VirtualMachineClusterInstancetype,
    VirtualMachineClusterPreference, VirtualMachineInstancetype, VirtualMachinePreference,
};
#[cfg(feature = "kube")]
pub use pool::{VirtualMachinePool, VirtualMachinePoolSpec, VirtualMachinePoolStatus, WarmSpec};
#[cfg(feature = "kube")]
pub use preset::{VirtualMachineInstancePreset, VirtualMachineInstancePresetSpec};
#[cfg(feature = "kube")]
pub use template::{TemplateMeta, VirtualMachineInstanceTemplateSpec};
#[cfg(feature = "kube")]
pub use vm::{
    InstancetypeMatcher, PreferenceMatcher, PrintableStatus, RunStrategy, StateChangeAction,
    StateChangeRequest, VirtualMachine, VirtualMachineCondition, VirtualMachineSpec,
    VirtualMachineStartFailure, VirtualMachineStatus,
};
#[cfg(feature = "kube")]
pub use vmi::{
    VirtualMachineInstance, VirtualMachineInstanceSpec, VirtualMachineInstanceStatus, VmiPhase,
};
#[cfg(feature = "kube")]
pub use vmirs::{
    VirtualMachineInstanceReplicaSet, VirtualMachineInstanceReplicaSetSpec,
    VirtualMachineInstanceReplicaSetStatus,
};

/// API group of every microvirt resource.
#[cfg(feature = "kube")]
pub const GROUP: &str = "microvirt.io";
/// API version of every microvirt resource.
#[cfg(feature = "kube")]
pub const VERSION: &str = "v1alpha1";

/// Errors of this crate.
#[cfg(feature = "kube")]
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// A CRD could not be rendered as YAML.
    #[error("rendering CRD {name} as YAML: {source}")]
    Yaml {
        /// CRD name.
        name: String,
        /// Cause.
        source: serde_saphyr::ser::Error,
    },
}

/// Every CRD, as `(file name, definition)`, in a fixed order.
#[cfg(feature = "kube")]
pub fn all_crds() -> Vec<(String, CustomResourceDefinition)> {
    [
        VirtualMachineInstance::crd(),
        VirtualMachine::crd(),
        VirtualMachineInstanceReplicaSet::crd(),
        VirtualMachineInstancePreset::crd(),
        VirtualMachinePool::crd(),
        VirtualMachineInstancetype::crd(),
        VirtualMachineClusterInstancetype::crd(),
        VirtualMachinePreference::crd(),
        VirtualMachineClusterPreference::crd(),
    ]
    .into_iter()
    .map(|crd| {
        let name = crd.metadata.name.clone().unwrap_or_default();
        (format!("{name}.yaml"), crd)
    })
    .collect()
}

/// Render one CRD the way `crdgen` writes it.
#[cfg(feature = "kube")]
pub fn render_yaml(crd: &CustomResourceDefinition) -> Result<String, CrdError> {
    let body = serde_saphyr::to_string(crd).map_err(|source| CrdError::Yaml {
        name: crd.metadata.name.clone().unwrap_or_default(),
        source,
    })?;
    Ok(format!(
        "# Generated by `cargo run -p microvirt-crds --bin crdgen`; do not edit.\n---\n{body}"
    ))
}
