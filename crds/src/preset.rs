//! `VirtualMachineInstancePreset` (short name `vmipreset`): domain defaults for matching VMIs.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::vmi::DomainSpec;

#[allow(clippy::duplicated_attributes)] // repeated printcolumn(...) arguments of #[kube]
/// Domain defaults applied once to VMIs whose labels match `selector`, when the operator first sees them.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "microvirt.io",
    version = "v1alpha1",
    kind = "VirtualMachineInstancePreset",
    plural = "virtualmachineinstancepresets",
    singular = "virtualmachineinstancepreset",
    shortname = "vmipreset",
    shortname = "vmipresets",
    category = "microvirt",
    namespaced,
    derive = "PartialEq",
    derive = "Default",
    doc = "Domain defaults for VMIs matching selector, applied when the operator first sees a VMI.",
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstancePresetSpec {
    /// VMIs whose labels match get the defaults.
    pub selector: LabelSelector,
    /// Defaults; a field already set in the VMI is kept and the conflict reported as an Event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<DomainSpec>,
}
