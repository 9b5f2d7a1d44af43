//! The VMI template embedded in VirtualMachine and VirtualMachineInstanceReplicaSet.

use std::collections::BTreeMap;

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::refusals;

use crate::vmi::VirtualMachineInstanceSpec;

/// Metadata a template stamps on the VMIs it creates.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("!has(self.annotations) || !('hooks.kubevirt.io/hookSidecars' in self.annotations)")
        .message(refusals::HOOK_SIDECARS)
        .field_path(".annotations")
)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMeta {
    /// Labels of created VMIs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::bounded_labels)]
    pub labels: Option<BTreeMap<String, String>>,
    /// Annotations of created VMIs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// A VMI template: metadata and spec.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceTemplateSpec {
    /// Labels and annotations for created VMIs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMeta>,
    /// Spec of created VMIs.
    pub spec: VirtualMachineInstanceSpec,
}

impl VirtualMachineInstanceTemplateSpec {
    /// Labels of the template (empty when unset).
    pub fn labels(&self) -> BTreeMap<String, String> {
        self.metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default()
    }

    /// Annotations of the template (empty when unset).
    pub fn annotations(&self) -> BTreeMap<String, String> {
        self.metadata
            .as_ref()
            .and_then(|m| m.annotations.clone())
            .unwrap_or_default()
    }
}
