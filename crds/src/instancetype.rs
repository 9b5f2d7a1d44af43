//! KubeVirt's instancetypes and preferences, in microvirt's group: `VirtualMachineInstancetype`
//! (namespaced) and `VirtualMachineClusterInstancetype` (cluster-wide) give a VM its size
//! (`spec.cpu.guest` vCPUs, `spec.memory.guest`); `VirtualMachinePreference` and
//! `VirtualMachineClusterPreference` its defaults (`spec.cpu.preferredCPUTopology`,
//! `spec.devices.preferredDiskBus`, `spec.devices.preferredInterfaceModel`). A VM names them in
//! `spec.instancetype` and `spec.preference`; the VM controller expands them into the VMI it
//! creates. Only fields that map to something microvirt does are in the schema; the preference
//! sections KubeVirt's examples use that microvirt cannot honour are refused by a validation
//! rule that names the field.

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::refusals;

/// The vCPUs of an instancetype.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CpuInstancetype {
    /// Number of vCPUs the guest sees.
    #[schemars(range(min = 1, max = 64))]
    pub guest: u32,
}

/// The memory of an instancetype.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new(
        "isQuantity(string(self.guest)) && quantity(string(self.guest)).compareTo(quantity('16Mi')) >= 0 && quantity(string(self.guest)).compareTo(quantity('1Ei')) <= 0"
    )
    .message("memory.guest must be a quantity from 16Mi to 1Ei, e.g. 128Mi")
    .field_path(".guest")
)]
#[serde(rename_all = "camelCase")]
pub struct MemoryInstancetype {
    /// Memory the guest sees, e.g. `2Gi`.
    #[schemars(transform = crate::schema::bounded_quantity)]
    pub guest: k8s_openapi::apimachinery::pkg::api::resource::Quantity,
}

/// The size a VM gets from an instancetype (the spec of both instancetype kinds).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct InstancetypeSpec {
    /// vCPUs.
    pub cpu: CpuInstancetype,
    /// Memory.
    pub memory: MemoryInstancetype,
}

/// The CPU preferences.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("!has(self.preferredCPUTopology) || self.preferredCPUTopology in ['sockets', 'cores', 'threads', 'any', 'preferSockets', 'preferCores', 'preferThreads', 'preferAny']")
        .message(refusals::PREFERRED_CPU_TOPOLOGY)
        .field_path(".preferredCPUTopology")
)]
#[serde(rename_all = "camelCase")]
pub struct CpuPreferences {
    /// How the instancetype's vCPUs are laid out: `sockets` (KubeVirt's default), `cores`,
    /// `threads` or `any` (as `cores`); KubeVirt's older `prefer…` spellings too. `spread` is
    /// refused (a validation rule says why).
    #[serde(
        default,
        rename = "preferredCPUTopology",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(max = 32))]
    pub preferred_cpu_topology: Option<String>,
}

/// The device preferences.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("!has(self.preferredDiskBus) || self.preferredDiskBus == 'virtio'")
        .message(refusals::PREFERRED_DISK_BUS)
        .field_path(".preferredDiskBus"),
    validation = Rule::new("!has(self.preferredInterfaceModel) || self.preferredInterfaceModel == 'virtio'")
        .message(refusals::PREFERRED_INTERFACE_MODEL)
        .field_path(".preferredInterfaceModel"),
    validation = Rule::new("!has(self.preferredTPM)")
        .message(refusals::PREFERRED_TPM)
        .field_path(".preferredTPM")
)]
#[serde(rename_all = "camelCase")]
pub struct DevicePreferences {
    /// Bus of the disks that name none: only `virtio` (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub preferred_disk_bus: Option<String>,
    /// Model of the interfaces that name none: only `virtio` (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub preferred_interface_model: Option<String>,
    /// A TPM: refused (a validation rule says why).
    #[serde(
        default,
        rename = "preferredTPM",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub preferred_tpm: Option<serde_json::Value>,
}

/// The defaults a VM gets from a preference (the spec of both preference kinds).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PreferenceSpec {
    /// CPU preferences.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuPreferences>,
    /// Device preferences.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<DevicePreferences>,
}

/// Defines a namespaced and a cluster-wide kind with the same spec fields.
macro_rules! instancetype_kinds {
    (
        $(#[$doc:meta])*
        $spec:ident, $kdoc:literal, $kind:literal, $plural:literal, $singular:literal, $short:literal,
        scope = [$($scope:ident)?],
        $(rules = [$($rule:expr),+ $(,)?],)?
        fields = { $($field:tt)* }
    ) => {
        $(#[$doc])*
        #[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
        #[kube(
            group = "microvirt.io",
            version = "v1alpha1",
            kind = $kind,
            plural = $plural,
            singular = $singular,
            shortname = $short,
            category = "microvirt",
            $($scope,)?
            derive = "PartialEq",
            derive = "Default",
            doc = $kdoc,
            printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
        )]
        $(#[x_kube($(validation = $rule),+)])?
        #[serde(rename_all = "camelCase")]
        pub struct $spec { $($field)* }
    };
}

instancetype_kinds! {
    /// A namespaced instancetype: the vCPUs and memory of the VMs that name it.
    VirtualMachineInstancetypeSpec, "A namespaced instancetype: the vCPUs and memory of the VMs that name it.",
    "VirtualMachineInstancetype", "virtualmachineinstancetypes",
    "virtualmachineinstancetype", "vminstancetype",
    scope = [namespaced],
    fields = {
        /// vCPUs (`guest`).
        pub cpu: CpuInstancetype,
        /// Memory (`guest`).
        pub memory: MemoryInstancetype,
    }
}

instancetype_kinds! {
    /// A cluster-wide instancetype: the vCPUs and memory of the VMs that name it.
    VirtualMachineClusterInstancetypeSpec, "A cluster-wide instancetype: the vCPUs and memory of the VMs that name it.",
    "VirtualMachineClusterInstancetype",
    "virtualmachineclusterinstancetypes", "virtualmachineclusterinstancetype",
    "vmclusterinstancetype",
    scope = [],
    fields = {
        /// vCPUs (`guest`).
        pub cpu: CpuInstancetype,
        /// Memory (`guest`).
        pub memory: MemoryInstancetype,
    }
}

instancetype_kinds! {
    /// A namespaced preference: defaults of the VMs that name it.
    VirtualMachinePreferenceSpec, "A namespaced preference: defaults of the VMs that name it.",
    "VirtualMachinePreference", "virtualmachinepreferences",
    "virtualmachinepreference", "vmpref",
    scope = [namespaced],
    rules = [
        Rule::new("!has(self.clock)").message(refusals::PREFERRED_CLOCK).field_path(".clock"),
        Rule::new("!has(self.features)").message(refusals::PREFERRED_FEATURES).field_path(".features"),
        Rule::new("!has(self.firmware)").message(refusals::PREFERRED_FIRMWARE).field_path(".firmware"),
    ],
    fields = {
        /// CPU preferences.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub cpu: Option<CpuPreferences>,
        /// Device preferences.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub devices: Option<DevicePreferences>,
        /// Clock preferences: refused (a validation rule says why).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(schema_with = "crate::schema::any_object")]
        pub clock: Option<serde_json::Value>,
        /// Feature preferences: refused (a validation rule says why).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(schema_with = "crate::schema::any_object")]
        pub features: Option<serde_json::Value>,
        /// Firmware preferences: refused (a validation rule says why).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(schema_with = "crate::schema::any_object")]
        pub firmware: Option<serde_json::Value>,
    }
}

instancetype_kinds! {
    /// A cluster-wide preference: defaults of the VMs that name it.
    VirtualMachineClusterPreferenceSpec, "A cluster-wide preference: defaults of the VMs that name it.",
    "VirtualMachineClusterPreference",
    "virtualmachineclusterpreferences", "virtualmachineclusterpreference", "vmcpref",
    scope = [],
    rules = [
        Rule::new("!has(self.clock)").message(refusals::PREFERRED_CLOCK).field_path(".clock"),
        Rule::new("!has(self.features)").message(refusals::PREFERRED_FEATURES).field_path(".features"),
        Rule::new("!has(self.firmware)").message(refusals::PREFERRED_FIRMWARE).field_path(".firmware"),
    ],
    fields = {
        /// CPU preferences.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub cpu: Option<CpuPreferences>,
        /// Device preferences.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub devices: Option<DevicePreferences>,
        /// Clock preferences: refused (a validation rule says why).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(schema_with = "crate::schema::any_object")]
        pub clock: Option<serde_json::Value>,
        /// Feature preferences: refused (a validation rule says why).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(schema_with = "crate::schema::any_object")]
        pub features: Option<serde_json::Value>,
        /// Firmware preferences: refused (a validation rule says why).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(schema_with = "crate::schema::any_object")]
        pub firmware: Option<serde_json::Value>,
    }
}

/// Kind of a VM's `spec.instancetype` reference (KubeVirt's default: the cluster-wide kind).
pub const DEFAULT_INSTANCETYPE_KIND: &str = "VirtualMachineClusterInstancetype";
/// Kind of a VM's `spec.preference` reference (KubeVirt's default: the cluster-wide kind).
pub const DEFAULT_PREFERENCE_KIND: &str = "VirtualMachineClusterPreference";

/// Whether a reference's `kind` (as KubeVirt accepts it: the kind, or its lowercase singular or
/// plural, case-insensitive) names the cluster-wide kind; `None` for a kind that is neither.
pub fn is_cluster_kind(kind: Option<&str>, namespaced: &str) -> Option<bool> {
    let Some(kind) = kind else {
        return Some(true);
    };
    let k = kind.to_ascii_lowercase();
    let ns = namespaced.to_ascii_lowercase();
    let cluster = ns.replacen("virtualmachine", "virtualmachinecluster", 1);
    if k == ns || k == format!("{ns}s") {
        Some(false)
    } else if k == cluster || k == format!("{cluster}s") {
        Some(true)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_as_kubevirt_spells_them() {
        let it = "VirtualMachineInstancetype";
        assert_eq!(is_cluster_kind(None, it), Some(true));
        assert_eq!(is_cluster_kind(Some(it), it), Some(false));
        assert_eq!(
            is_cluster_kind(Some("virtualmachineinstancetypes"), it),
            Some(false)
        );
        assert_eq!(
            is_cluster_kind(Some("VirtualMachineClusterInstancetype"), it),
            Some(true)
        );
        assert_eq!(
            is_cluster_kind(
                Some("virtualmachineclusterpreferences"),
                "VirtualMachinePreference"
            ),
            Some(true)
        );
        assert_eq!(is_cluster_kind(Some("Pod"), it), None);
    }
}
