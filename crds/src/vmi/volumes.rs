//! Volumes (`spec.volumes`) and their sources.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use super::{PullPolicy, DNS_LABEL_RULE, INSIDE_IMAGE_RULE};
use crate::refusals;

/// A volume: exactly one source.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new(
        "(has(self.containerDisk) ? 1 : 0) + (has(self.persistentVolumeClaim) ? 1 : 0) + (has(self.cloudInitNoCloud) ? 1 : 0) + (has(self.emptyDisk) ? 1 : 0) + (has(self.dataVolume) ? 1 : 0) + (has(self.hostDisk) ? 1 : 0) + (has(self.configMap) ? 1 : 0) + (has(self.secret) ? 1 : 0) + (has(self.serviceAccount) ? 1 : 0) + (has(self.downwardAPI) ? 1 : 0) + (has(self.cloudInitConfigDrive) ? 1 : 0) + (has(self.ephemeral) ? 1 : 0) + (has(self.downwardMetrics) ? 1 : 0) + (has(self.sysprep) ? 1 : 0) + (has(self.memoryDump) ? 1 : 0) == 1"
    )
    .message("a volume needs exactly one of containerDisk, persistentVolumeClaim, cloudInitNoCloud, emptyDisk"),
    validation = Rule::new("!has(self.dataVolume)").message(refusals::DATA_VOLUME).field_path(".dataVolume"),
    validation = Rule::new("!has(self.hostDisk)").message(refusals::HOST_DISK).field_path(".hostDisk"),
    validation = Rule::new("!has(self.configMap)").message(refusals::VOLUME_SOURCE).field_path(".configMap"),
    validation = Rule::new("!has(self.secret)").message(refusals::VOLUME_SOURCE).field_path(".secret"),
    validation = Rule::new("!has(self.serviceAccount)").message(refusals::VOLUME_SOURCE).field_path(".serviceAccount"),
    validation = Rule::new("!has(self.downwardAPI)").message(refusals::VOLUME_SOURCE).field_path(".downwardAPI"),
    validation = Rule::new("!has(self.cloudInitConfigDrive)").message(refusals::VOLUME_SOURCE).field_path(".cloudInitConfigDrive"),
    validation = Rule::new("!has(self.ephemeral)").message(refusals::VOLUME_SOURCE).field_path(".ephemeral"),
    validation = Rule::new("!has(self.downwardMetrics)").message(refusals::VOLUME_SOURCE).field_path(".downwardMetrics"),
    validation = Rule::new("!has(self.sysprep)").message(refusals::VOLUME_SOURCE).field_path(".sysprep"),
    validation = Rule::new("!has(self.memoryDump)").message(refusals::VOLUME_SOURCE).field_path(".memoryDump")
)]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    /// Name that a disk refers to. A DNS label: it becomes a directory name in the launcher
    /// pod.
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new(DNS_LABEL_RULE).message(
        "a volume name must be a DNS label (lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters): it becomes a directory name in the launcher pod"
    ))]
    pub name: String,
    /// A disk image inside a container image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_disk: Option<ContainerDiskSource>,
    /// A PersistentVolumeClaim in the VMI's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim: Option<PersistentVolumeClaimSource>,
    /// A NoCloud cloud-init seed disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_init_no_cloud: Option<CloudInitNoCloudSource>,
    /// A blank disk discarded when the VMI ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub empty_disk: Option<EmptyDiskSource>,
    /// A CDI DataVolume: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub data_volume: Option<serde_json::Value>,
    /// A disk image on the node: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub host_disk: Option<serde_json::Value>,
    /// KubeVirt's ConfigMap volume: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub config_map: Option<serde_json::Value>,
    /// KubeVirt's Secret volume: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub secret: Option<serde_json::Value>,
    /// KubeVirt's ServiceAccount token volume: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub service_account: Option<serde_json::Value>,
    /// KubeVirt's downward API volume: refused (a validation rule says why).
    #[serde(
        rename = "downwardAPI",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub downward_api: Option<serde_json::Value>,
    /// KubeVirt's cloud-init ConfigDrive volume: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub cloud_init_config_drive: Option<serde_json::Value>,
    /// KubeVirt's ephemeral PVC volume: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub ephemeral: Option<serde_json::Value>,
    /// KubeVirt's downward metrics volume: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub downward_metrics: Option<serde_json::Value>,
    /// KubeVirt's Windows sysprep volume: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub sysprep: Option<serde_json::Value>,
    /// KubeVirt's memory dump volume: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub memory_dump: Option<serde_json::Value>,
}

/// Disk image inside a container image.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ContainerDiskSource {
    /// Image reference.
    #[schemars(length(min = 1, max = 512))]
    pub image: String,
    /// Path of the disk image inside the container image (default: the first file in `/disk`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    #[x_kube(validation = Rule::new(INSIDE_IMAGE_RULE)
        .message("containerDisk.path must stay inside the image: no '..' component"))]
    pub path: Option<String>,
    /// Image pull policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// A Secret in the VMI's namespace to pull the image with (it joins the launcher pod's
    /// `imagePullSecrets`, as in KubeVirt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub image_pull_secret: Option<String>,
}

/// PVC reference.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PersistentVolumeClaimSource {
    /// Claim name.
    #[schemars(length(min = 1, max = 253))]
    pub claim_name: String,
    /// Attach read-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    /// Only `false`: a microVM has no disk hotplug (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("!self").message(refusals::HOTPLUG))]
    pub hotpluggable: Option<bool>,
}

/// cloud-init NoCloud data (KubeVirt's `cloudInitNoCloud`): user data inline, in base64 or in a
/// Secret (`secretRef`, key `userdata` or `userData`); network data inline, in base64 or in a
/// Secret (`networkDataSecretRef`, key `networkdata` or `networkData`). The launcher pod never gets the
/// data through its annotations: the operator puts inline data into a Secret of its own that
/// the pod mounts, like the referenced ones.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("has(self.userData) || has(self.userDataBase64) || has(self.secretRef) || has(self.networkData) || has(self.networkDataBase64) || has(self.networkDataSecretRef)")
        .message("cloudInitNoCloud needs userData, userDataBase64, secretRef, networkData, networkDataBase64 or networkDataSecretRef"),
    validation = Rule::new("(has(self.userData) ? 1 : 0) + (has(self.userDataBase64) ? 1 : 0) + (has(self.secretRef) ? 1 : 0) <= 1")
        .message("cloudInitNoCloud takes one of userData, userDataBase64 and secretRef"),
    validation = Rule::new("(has(self.networkData) ? 1 : 0) + (has(self.networkDataBase64) ? 1 : 0) + (has(self.networkDataSecretRef) ? 1 : 0) <= 1")
        .message("cloudInitNoCloud takes one of networkData, networkDataBase64 and networkDataSecretRef")
)]
#[serde(rename_all = "camelCase")]
pub struct CloudInitNoCloudSource {
    /// user-data as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16384))]
    pub user_data: Option<String>,
    /// user-data, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32768))]
    pub user_data_base64: Option<String>,
    /// A Secret in the VMI's namespace holding the user-data (key `userdata` or `userData`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretRef>,
    /// network-config as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16384))]
    pub network_data: Option<String>,
    /// network-config, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32768))]
    pub network_data_base64: Option<String>,
    /// A Secret in the VMI's namespace holding the network-config (key `networkdata` or
    /// `networkData`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_data_secret_ref: Option<SecretRef>,
}

/// A Secret in the same namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')")
        .message("a Secret name must be a DNS subdomain (lowercase letters, digits, '-' and '.')"))]
    pub name: String,
}

/// Blank disk.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new(
        "isQuantity(string(self.capacity)) && quantity(string(self.capacity)).isGreaterThan(quantity('0')) && quantity(string(self.capacity)).compareTo(quantity('1Ei')) <= 0"
    )
    .message("emptyDisk.capacity must be a quantity greater than 0 and at most 1Ei, e.g. 1Gi")
)]
#[serde(rename_all = "camelCase")]
pub struct EmptyDiskSource {
    /// Size, e.g. `1Gi`.
    #[schemars(transform = crate::schema::bounded_quantity)]
    pub capacity: Quantity,
}
