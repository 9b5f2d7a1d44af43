//! `VirtualMachineInstanceReplicaSet` (short name `vmirs`): N identical VMIs.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::template::VirtualMachineInstanceTemplateSpec;

#[allow(clippy::duplicated_attributes)] // repeated printcolumn(...) arguments of #[kube]
/// Desired state of a VMI replica set.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "microvirt.io",
    version = "v1alpha1",
    kind = "VirtualMachineInstanceReplicaSet",
    plural = "virtualmachineinstancereplicasets",
    singular = "virtualmachineinstancereplicaset",
    shortname = "vmirs",
    shortname = "vmirss",
    category = "microvirt",
    namespaced,
    status = "VirtualMachineInstanceReplicaSetStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "Keeps `replicas` VMIs matching `selector` alive, created from `template`.",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.labelSelector"
    ),
    printcolumn(name = "Desired", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Current", type_ = "integer", json_path = ".status.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(
    validation = Rule::new(
        "!has(self.selector.matchLabels) || self.selector.matchLabels.all(k, has(self.template.metadata) && has(self.template.metadata.labels) && k in self.template.metadata.labels && self.template.metadata.labels[k] == self.selector.matchLabels[k])"
    )
    .message("spec.template.metadata.labels must contain every label of spec.selector.matchLabels"),
    validation = Rule::new("has(self.selector.matchLabels) || has(self.selector.matchExpressions)")
        .message("spec.selector must not be empty")
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceReplicaSetSpec {
    /// Desired number of VMIs (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10000))]
    pub replicas: Option<i32>,
    /// Which VMIs belong to this set.
    #[schemars(schema_with = "crate::schema::label_selector")]
    pub selector: LabelSelector,
    /// Template of created VMIs.
    pub template: VirtualMachineInstanceTemplateSpec,
    /// When true the operator neither creates nor deletes VMIs for this set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
}

/// Observed state of a VMI replica set.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceReplicaSetStatus {
    /// VMIs that belong to the set and are not being deleted.
    #[serde(default)]
    pub replicas: i32,
    /// Of those, how many are Ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// The selector as a string, for the scale subresource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<String>,
    /// Whether reconciliation is paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
}

impl VirtualMachineInstanceReplicaSetSpec {
    /// Desired replicas (default 1).
    pub fn desired(&self) -> i32 {
        self.replicas.unwrap_or(1).max(0)
    }
}
