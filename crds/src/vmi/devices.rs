//! `spec.domain.devices` and its disks.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Interface, DNS_LABEL_RULE};
use crate::refusals;

/// Devices of the guest.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("!has(self.gpus)").message(refusals::GPUS).field_path(".gpus"),
    validation = Rule::new("!has(self.hostDevices)").message(refusals::HOST_DEVICES).field_path(".hostDevices"),
    validation = Rule::new("!has(self.tpm)").message(refusals::TPM).field_path(".tpm"),
    validation = Rule::new("!has(self.filesystems)").message(refusals::FILESYSTEMS).field_path(".filesystems"),
    validation = Rule::new("!has(self.autoattachVSOCK) || !self.autoattachVSOCK")
        .message(refusals::VSOCK)
        .field_path(".autoattachVSOCK"),
    validation = Rule::new("!has(self.watchdog)").message(refusals::WATCHDOG).field_path(".watchdog"),
    validation = Rule::new("!has(self.sound)").message(refusals::SOUND).field_path(".sound")
)]
#[serde(rename_all = "camelCase")]
pub struct Devices {
    /// Block devices; each names a volume.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub disks: Vec<Disk>,
    /// Network interfaces; each names a network.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub interfaces: Vec<Interface>,
    /// A virtio-rng device: entropy for the guest from the host (KubeVirt's `rng: {}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rng: Option<Rng>,
    /// When the VMI declares neither `interfaces` nor `networks`, attach the pod network with
    /// the operator's default binding (masquerade unless `--default-network-interface`), as an
    /// interface and a network named `default` (KubeVirt's default: true). `false`: no NIC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoattach_pod_interface: Option<bool>,
    /// Accepted, no effect: a microVM never has a graphics device (KubeVirt's default: true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoattach_graphics_device: Option<bool>,
    /// Accepted, no effect: the serial console always exists (it is the launcher's log).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoattach_serial_console: Option<bool>,
    /// Accepted, no effect: a microVM has no memory balloon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoattach_mem_balloon: Option<bool>,
    /// Only `false` (the default): a microVM has no vsock device (a validation rule says why).
    #[serde(
        rename = "autoattachVSOCK",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub autoattach_vsock: Option<bool>,
    /// GPU passthrough: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object_list")]
    pub gpus: Option<Vec<serde_json::Value>>,
    /// Host device passthrough: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object_list")]
    pub host_devices: Option<Vec<serde_json::Value>>,
    /// A TPM: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub tpm: Option<serde_json::Value>,
    /// virtiofs shares: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object_list")]
    pub filesystems: Option<Vec<serde_json::Value>>,
    /// Input devices (KubeVirt's tablet for a VNC pointer): accepted, no effect: without a
    /// graphics device there is nothing to point at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 8))]
    pub inputs: Option<Vec<Input>>,
    /// Accepted, no effect: every virtio-net device has one queue pair.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_interface_multiqueue: Option<bool>,
    /// Accepted, no effect: every virtio-blk device has one queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_multi_queue: Option<bool>,
    /// A watchdog device: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub watchdog: Option<serde_json::Value>,
    /// A sound device: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub sound: Option<serde_json::Value>,
}

/// An input device (accepted, no effect).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct Input {
    /// Name.
    #[schemars(length(max = 63))]
    pub name: String,
    /// `tablet`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub type_: Option<String>,
    /// `usb` or `virtio`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub bus: Option<String>,
}

/// The random number generator device (no settings).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct Rng {}

/// A disk of the guest.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("!has(self.cdrom)").message(refusals::CDROM).field_path(".cdrom"),
    validation = Rule::new("!has(self.lun)").message(refusals::LUN).field_path(".lun"),
    validation = Rule::new("!has(self.cache) || self.cache != 'writethrough'")
        .message(refusals::DISK_CACHE_WRITETHROUGH)
        .field_path(".cache"),
    validation = Rule::new("!has(self.shareable) || !self.shareable")
        .message(refusals::SHAREABLE)
        .field_path(".shareable")
)]
#[serde(rename_all = "camelCase")]
pub struct Disk {
    /// Name; must match a volume's name. A DNS label: it becomes a file name in the launcher
    /// pod.
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new(DNS_LABEL_RULE).message(
        "a disk name must be a DNS label (lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters): it becomes a file name in the launcher pod"
    ))]
    pub name: String,
    /// Attach as a disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<DiskTarget>,
    /// Serial number the guest sees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 20))]
    pub serial: Option<String>,
    /// Boot priority (1 is first). There is no firmware to boot from a disk: the disk with the
    /// lowest `bootOrder` becomes the first disk, which is the root disk of the default kernel
    /// (`root=/dev/vda`); disks without one follow in their order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub boot_order: Option<u32>,
    /// A CD-ROM: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub cdrom: Option<serde_json::Value>,
    /// A SCSI LUN: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub lun: Option<serde_json::Value>,
    /// KubeVirt's cache mode. `none` and `writeback` are accepted and mean what the VMM
    /// always does: writes go through the host's page cache and a guest flush is an
    /// `fdatasync`, so what the guest flushed is durable; `writethrough` is refused (a
    /// validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<DiskCache>,
    /// KubeVirt's I/O mode (`native`, `threads`, `default`): accepted, no effect (the VMM's own
    /// I/O thread does the disk's I/O).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io: Option<DiskIo>,
    /// Only `false`: a writable image is locked to one VMI (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shareable: Option<bool>,
}

/// KubeVirt's disk cache modes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DiskCache {
    /// Accepted: the VMM's behaviour (flushes are honoured).
    None,
    /// Refused.
    Writethrough,
    /// Accepted: the VMM's behaviour (flushes are honoured).
    Writeback,
}

/// KubeVirt's disk I/O modes (accepted, no effect).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DiskIo {
    /// Linux native AIO.
    Native,
    /// A thread pool.
    Threads,
    /// The hypervisor's choice.
    Default,
}

/// How a disk is attached.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiskTarget {
    /// Bus; microvirt only has virtio.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bus: Option<DiskBus>,
    /// Attach read-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readonly: Option<bool>,
}

/// Disk bus.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DiskBus {
    /// virtio-blk (the only bus a microVM has).
    Virtio,
}
