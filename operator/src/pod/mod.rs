//! The launcher pod a VMI runs in (pure: no API calls). The contract is documented in
//! `docs/launcher-pod.md`.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    Capabilities, Container, DownwardAPIVolumeFile, DownwardAPIVolumeSource, EmptyDirVolumeSource,
    EnvVar, HostPathVolumeSource, ImageVolumeSource, KeyToPath, LocalObjectReference,
    ObjectFieldSelector, PersistentVolumeClaimVolumeSource, Pod, PodReadinessGate,
    PodSecurityContext, PodSpec, ResourceRequirements, SeccompProfile, Secret, SecretVolumeSource,
    SecurityContext, Volume, VolumeDevice, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::ByteString;
use kube::{Resource, ResourceExt};
use microvirt_crds::quantity::{self, format_bytes, QuantityError};
use microvirt_crds::refusals;
use microvirt_crds::vmi::{
    Disk, Interface, InterfaceBridge, InterfaceMasquerade, KernelBootContainer, Network,
    PodNetwork, PullPolicy, VirtualMachineInstance, VirtualMachineInstanceSpec, ANNOTATION_VMI_UID,
    DEFAULT_NETWORK_NAME, LABEL_VMI_NAME, POD_CONDITION_VM_RUNNING,
};
use serde::Serialize;

use crate::config::{
    Config, DefaultBinding, KvmMode, DEFAULT_KERNEL_PATH, IMAGE_KERNEL_SCRATCH, KVM_RESOURCE,
};

/// Annotation carrying the VMI document the launcher reads (through the downward API).
pub const ANNOTATION_VMI_SPEC: &str = "microvirt.io/vmi-spec";
/// Optional pod annotation with the guest boot time in ms (set by the node agent, never by the
/// launcher, which has no API credentials).
pub use microvirt_crds::vmi::ANNOTATION_BOOT_TIME_MS;
/// Name of the launcher container.
pub const COMPUTE_CONTAINER: &str = "compute";
/// Directory holding runtime files of the launcher.
pub const RUNTIME_DIR: &str = "/var/run/microvirt";
/// Where the VMI document is mounted.
pub const VMI_DIR: &str = "/var/run/microvirt/vmi";
/// File name of the VMI document inside [`VMI_DIR`].
pub const VMI_FILE: &str = "vmi.json";
/// Termination message path of the launcher container.
pub const TERMINATION_LOG: &str = "/dev/termination-log";
/// Label on every launcher pod.
pub const LABEL_APP: &str = "app.kubernetes.io/name";
/// Value of [`LABEL_APP`].
pub const APP_NAME: &str = "virt-launcher";
/// Label saying who manages the pod.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// The user the launcher becomes once its privileged setup is done (KubeVirt's `qemu`, 107);
/// also the pod's `fsGroup`, so the volumes are writable for it.
pub const LAUNCHER_UID: i64 = 107;
/// The launcher's group after the setup.
pub const LAUNCHER_GID: i64 = 107;
/// Where a cloudInitNoCloud volume's data is mounted: `<dir>/<volume>/userdata/` and
/// `<dir>/<volume>/networkdata/` (files `userdata`/`userData`, `networkdata`/`networkData`).
pub const CLOUD_INIT_DIR: &str = "/var/run/microvirt/cloud-init";

/// Why a launcher pod cannot be built for a VMI.
#[derive(Debug, thiserror::Error)]
pub enum PodError {
    /// The VMI has no name, namespace or uid (not read from the API).
    #[error("VMI has no {0} (not read from the API server?)")]
    MissingMeta(&'static str),
    /// Guest memory is not a usable quantity.
    #[error("guest memory: {0}")]
    Memory(#[from] QuantityError),
    /// The VMI document could not be serialized.
    #[error("serializing the VMI document: {0}")]
    Json(#[from] serde_json::Error),
    /// An emptyDisk capacity is not a usable quantity.
    #[error("volume {volume:?}: emptyDisk.capacity: {source}")]
    EmptyDiskCapacity {
        volume: String,
        source: QuantityError,
    },
    /// The VMI asks for KubeVirt sidecar hooks (an annotation CEL rules cannot see).
    #[error("{}", refusals::HOOK_SIDECARS)]
    HookSidecars,
    /// cloudInitNoCloud.userDataBase64 or networkDataBase64 is not base64.
    #[error("volume {volume:?}: cloudInitNoCloud.{field} is not valid base64")]
    Base64 { volume: String, field: &'static str },
}

/// The document handed to the launcher at `/var/run/microvirt/vmi/vmi.json`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LauncherDocument<'a> {
    /// `microvirt.io/v1alpha1`.
    pub api_version: &'static str,
    /// `VirtualMachineInstance`.
    pub kind: &'static str,
    /// name, namespace, uid.
    pub metadata: LauncherMeta<'a>,
    /// The VMI spec (presets already applied).
    pub spec: &'a microvirt_crds::VirtualMachineInstanceSpec,
    /// Guest memory in bytes after defaulting.
    pub guest_memory_bytes: u64,
    /// vCPU count after defaulting.
    pub vcpus: u32,
    /// Present when `spec.domain.firmware.kernelBoot.container` is the operator's default
    /// kernel image, filled in because the VMI names none: the launcher boots the boot disk's
    /// own kernel when it has one, and this one only as a fallback.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_kernel: Option<DefaultKernel>,
}

/// The document's `defaultKernel`.
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DefaultKernel {
    /// `--default-kernel-args`: the default kernel's command line when the VMI gives no
    /// `kernelArgs` (never written into the spec).
    pub kernel_args: String,
}

/// Identity of the VMI inside [`LauncherDocument`].
#[derive(Serialize)]
pub struct LauncherMeta<'a> {
    /// VMI name.
    pub name: &'a str,
    /// VMI namespace.
    pub namespace: &'a str,
    /// VMI uid.
    pub uid: &'a str,
}

/// Name of the launcher pod of a VMI (deterministic, so retries never create a second pod).
pub fn pod_name(vmi_name: &str) -> String {
    format!("virt-launcher-{vmi_name}")
}

/// Name of the Secret with a VMI's inline cloud-init data.
pub fn cloud_init_secret_name(vmi_name: &str) -> String {
    format!("{}-cloud-init", pod_name(vmi_name))
}

/// Keys of the inline cloud-init data in that Secret.
fn user_data_key(volume: &str) -> String {
    format!("{volume}.userdata")
}
fn network_data_key(volume: &str) -> String {
    format!("{volume}.networkdata")
}

/// The VMI's name, namespace and the owner reference its launcher objects carry (which needs
/// its uid).
fn identity(vmi: &VirtualMachineInstance) -> Result<(&str, &str, OwnerReference), PodError> {
    let name = vmi
        .metadata
        .name
        .as_deref()
        .ok_or(PodError::MissingMeta("name"))?;
    let namespace = vmi
        .metadata
        .namespace
        .as_deref()
        .ok_or(PodError::MissingMeta("namespace"))?;
    let owner = vmi
        .controller_owner_ref(&())
        .ok_or(PodError::MissingMeta("uid"))?;
    Ok((name, namespace, owner))
}

/// The Secret holding the inline cloud-init data (`userData`, `userDataBase64`,
/// `networkData`) of the VMI's cloudInitNoCloud volumes, owned by the VMI; `None` when there is
/// none. User data often holds secrets: it must not sit in a pod annotation that anyone who may
/// read pods can see.
pub fn cloud_init_secret(vmi: &VirtualMachineInstance) -> Result<Option<Secret>, PodError> {
    let (name, namespace, owner) = identity(vmi)?;
    let mut data: BTreeMap<String, ByteString> = BTreeMap::new();
    for v in &vmi.spec.volumes {
        let Some(ci) = &v.cloud_init_no_cloud else {
            continue;
        };
        if let Some(u) = &ci.user_data {
            data.insert(user_data_key(&v.name), ByteString(u.as_bytes().to_vec()));
        }
        // ByteString's JSON form is base64: this decodes and checks it.
        let decode = |field: &'static str, b: &str| -> Result<ByteString, PodError> {
            serde_json::from_value(serde_json::Value::String(b.trim().to_string())).map_err(|_| {
                PodError::Base64 {
                    volume: v.name.clone(),
                    field,
                }
            })
        };
        if let Some(b) = &ci.user_data_base64 {
            data.insert(user_data_key(&v.name), decode("userDataBase64", b)?);
        }
        if let Some(n) = &ci.network_data {
            data.insert(network_data_key(&v.name), ByteString(n.as_bytes().to_vec()));
        }
        if let Some(b) = &ci.network_data_base64 {
            data.insert(network_data_key(&v.name), decode("networkDataBase64", b)?);
        }
    }
    if data.is_empty() {
        return Ok(None);
    }
    Ok(Some(Secret {
        metadata: ObjectMeta {
            name: Some(cloud_init_secret_name(name)),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([
                (LABEL_VMI_NAME.to_string(), name.to_string()),
                (
                    LABEL_MANAGED_BY.to_string(),
                    crate::config::FIELD_MANAGER.to_string(),
                ),
            ])),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        data: Some(data),
        type_: Some("Opaque".into()),
        ..Default::default()
    }))
}

/// The VMI spec as the launcher document carries it: inline cloud-init data removed (it is in
/// the Secret of [`cloud_init_secret`], mounted into the pod).
fn spec_without_cloud_init_data(
    spec: &microvirt_crds::VirtualMachineInstanceSpec,
) -> microvirt_crds::VirtualMachineInstanceSpec {
    let mut spec = spec.clone();
    for v in &mut spec.volumes {
        if let Some(ci) = v.cloud_init_no_cloud.as_mut() {
            ci.user_data = None;
            ci.user_data_base64 = None;
            ci.network_data = None;
            ci.network_data_base64 = None;
        }
    }
    spec
}

/// Guest memory in bytes: `domain.memory.guest`, else `domain.resources.requests.memory`, else
/// the configured default.
pub fn guest_memory_bytes(vmi: &VirtualMachineInstance, cfg: &Config) -> Result<u64, PodError> {
    match vmi.spec.guest_memory() {
        Some(q) => Ok(quantity::parse_bytes(&q.0)?),
        None => Ok(cfg.default_guest_memory),
    }
}

fn pull_policy(p: Option<PullPolicy>) -> Option<String> {
    p.map(|p| {
        match p {
            PullPolicy::Always => "Always",
            PullPolicy::IfNotPresent => "IfNotPresent",
            PullPolicy::Never => "Never",
        }
        .to_string()
    })
}

/// Mount path of a containerDisk volume's image.
pub fn container_disk_dir(volume: &str) -> String {
    format!("{RUNTIME_DIR}/container-disks/{volume}")
}

/// Mount path of a persistentVolumeClaim volume (the disk is `disk.img` inside).
pub fn pvc_dir(volume: &str) -> String {
    format!("{RUNTIME_DIR}/pvcs/{volume}")
}

/// Where a `volumeMode: Block` persistentVolumeClaim's device appears in the launcher
/// container (`volumeDevices`); the launcher looks there when `pvc_dir` is absent.
pub const PVC_DEVICE_DIR: &str = "/dev/microvirt/pvcs";

/// Device path of a `volumeMode: Block` persistentVolumeClaim volume.
pub fn pvc_device(volume: &str) -> String {
    format!("{PVC_DEVICE_DIR}/{volume}")
}

/// The `sizeLimit` of an emptyDisk's emptyDir for a disk of `capacity` bytes: the disk file
/// (the capacity rounded up to whole sectors, as the launcher creates it) plus what the file
/// system spends on it once the guest has written all of it — indirect or extent blocks, at
/// most 0.4% on ext2/3 with 1 KiB blocks, less elsewhere — with margin: 1/128 of the capacity
/// plus 1 MiB, rounded up to a MiB. The kubelet measures usage in allocated blocks, which
/// include that metadata.
pub fn empty_disk_size_limit(capacity: u64) -> u64 {
    let file = capacity.div_ceil(512).saturating_mul(512);
    file.saturating_add(file / 128)
        .saturating_add(1 << 20)
        .div_ceil(1 << 20)
        .saturating_mul(1 << 20)
}

/// Volumes whose persistentVolumeClaim has `volumeMode: Block` (the controller looks the
/// claims up; a claim it has not seen counts as a file system).
pub type BlockVolumes = BTreeSet<String>;

/// Mount path of an emptyDisk volume (the launcher creates `disk.img` inside).
pub fn empty_disk_dir(volume: &str) -> String {
    format!("{RUNTIME_DIR}/empty-disks/{volume}")
}

/// Mount path of the kernel boot image.
pub const KERNEL_BOOT_DIR: &str = "/var/run/microvirt/kernel-boot";

/// The pod network interface (and its network) that a VMI without `interfaces` and `networks`
/// gets, as in KubeVirt (`autoattachPodInterface`, default true): an interface and a network
/// both named `default`, the network the pod network, the binding the operator's
/// `--default-network-interface`. `None` when the VMI declares either, or turns it off with
/// `autoattachPodInterface: false`. The one place this default is decided: the launcher
/// document gets it ([`launcher_spec`]), the VMI status names it.
pub fn default_pod_interface(
    spec: &VirtualMachineInstanceSpec,
    binding: DefaultBinding,
) -> Option<(Interface, Network)> {
    let devices = spec.domain.devices.as_ref();
    let autoattach = devices
        .and_then(|d| d.autoattach_pod_interface)
        .unwrap_or(true);
    let has_interfaces = devices.is_some_and(|d| !d.interfaces.is_empty());
    if !autoattach || has_interfaces || !spec.networks.is_empty() {
        return None;
    }
    let mut iface = Interface {
        name: DEFAULT_NETWORK_NAME.into(),
        ..Default::default()
    };
    match binding {
        DefaultBinding::Masquerade => iface.masquerade = Some(InterfaceMasquerade {}),
        DefaultBinding::Bridge => iface.bridge = Some(InterfaceBridge {}),
    }
    let network = Network {
        name: DEFAULT_NETWORK_NAME.into(),
        pod: Some(PodNetwork::default()),
        ..Default::default()
    };
    Some((iface, network))
}

/// `spec` with [`default_pod_interface`] added (unchanged when it gets none).
pub fn with_default_pod_interface(spec: &mut VirtualMachineInstanceSpec, binding: DefaultBinding) {
    if let Some((iface, network)) = default_pod_interface(spec, binding) {
        spec.domain
            .devices
            .get_or_insert_with(Default::default)
            .interfaces
            .push(iface);
        spec.networks.push(network);
    }
}

/// Adds a disk for every volume that no disk names, after the VMI's own disks, as KubeVirt does
/// (`SetDefaultVolumeDisk`): a KubeVirt manifest may list only volumes. The disk has no
/// settings (virtio, writable); the first disk stays the root disk.
pub fn with_default_volume_disks(spec: &mut VirtualMachineInstanceSpec) {
    let named: BTreeSet<String> = spec
        .domain
        .devices
        .iter()
        .flat_map(|d| &d.disks)
        .map(|d| d.name.clone())
        .collect();
    let missing: Vec<Disk> = spec
        .volumes
        .iter()
        .filter(|v| !named.contains(&v.name))
        .map(|v| Disk {
            name: v.name.clone(),
            ..Default::default()
        })
        .collect();
    if !missing.is_empty() {
        spec.domain
            .devices
            .get_or_insert_with(Default::default)
            .disks
            .extend(missing);
    }
}

/// Orders the disks by `bootOrder` (lowest first; disks without one after them, in their
/// order): a microVM has no firmware to boot from a disk, so the first disk, the root disk of
/// the default kernel, is the one KubeVirt's firmware would boot.
pub fn disks_in_boot_order(spec: &mut VirtualMachineInstanceSpec) {
    if let Some(d) = spec.domain.devices.as_mut() {
        d.disks.sort_by_key(|d| d.boot_order.unwrap_or(u32::MAX));
    }
}

/// The launcher pod's host name: `spec.hostname`, else the VMI's name when it is a DNS label
/// (as KubeVirt names its launcher pods' hosts).
pub fn pod_hostname(vmi: &VirtualMachineInstance) -> Option<String> {
    if let Some(h) = &vmi.spec.hostname {
        return Some(h.clone());
    }
    let name = vmi.metadata.name.as_deref()?;
    let label = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    label.then(|| name.to_string())
}

/// The spec the launcher gets: the VMI's, with the defaults the operator applies (as
/// KubeVirt's virt-controller and webhooks do): a disk for every volume without one
/// ([`with_default_volume_disks`]), disks in boot order ([`disks_in_boot_order`]), the pod
/// network interface ([`default_pod_interface`]), and the operator's default kernel image when
/// it names no kernelBoot container ([`default_kernel`] says so in the document; the VMI's
/// `kernelArgs` stay as they are). A pod never boots the launcher's built-in demo guest: that
/// takes an image that carries it.
pub fn launcher_spec(
    vmi: &VirtualMachineInstance,
    cfg: &Config,
) -> microvirt_crds::VirtualMachineInstanceSpec {
    let mut spec = vmi.spec.clone();
    with_default_volume_disks(&mut spec);
    disks_in_boot_order(&mut spec);
    with_default_pod_interface(&mut spec, cfg.default_network_interface);
    if names_kernel(&spec) {
        return spec;
    }
    let Some(image) = cfg.default_kernel_image.clone() else {
        return spec;
    };
    let kb = spec
        .domain
        .firmware
        .get_or_insert_with(Default::default)
        .kernel_boot
        .get_or_insert_with(Default::default);
    kb.container = Some(KernelBootContainer {
        image,
        kernel_path: Some(DEFAULT_KERNEL_PATH.to_string()),
        initrd_path: None,
        image_pull_policy: None,
        image_pull_secret: None,
    });
    spec
}

/// Whether the VMI names its kernel image (`firmware.kernelBoot.container`).
pub fn names_kernel(spec: &microvirt_crds::VirtualMachineInstanceSpec) -> bool {
    spec.domain
        .firmware
        .as_ref()
        .and_then(|f| f.kernel_boot.as_ref())
        .is_some_and(|k| k.container.is_some())
}

/// The document's `defaultKernel`: present when the operator fills in its default kernel image
/// ([`launcher_spec`]).
pub fn default_kernel(vmi: &VirtualMachineInstance, cfg: &Config) -> Option<DefaultKernel> {
    (!names_kernel(&vmi.spec) && cfg.default_kernel_image.is_some()).then(|| DefaultKernel {
        kernel_args: cfg.default_kernel_args.clone(),
    })
}

/// The launcher pod for a VMI. `block` names the persistentVolumeClaim volumes whose claims
/// have `volumeMode: Block`: they reach the launcher as devices (`volumeDevices`).
/// The pull Secrets the VMI's containerDisks and kernel image name (KubeVirt's
/// `imagePullSecret`), each once, in name order; `None` when there are none.
fn image_pull_secrets(spec: &VirtualMachineInstanceSpec) -> Option<Vec<LocalObjectReference>> {
    let kernel = spec
        .domain
        .firmware
        .as_ref()
        .and_then(|f| f.kernel_boot.as_ref())
        .and_then(|k| k.container.as_ref())
        .and_then(|c| c.image_pull_secret.as_ref());
    let names: std::collections::BTreeSet<&String> = spec
        .volumes
        .iter()
        .filter_map(|v| v.container_disk.as_ref()?.image_pull_secret.as_ref())
        .chain(kernel)
        .collect();
    (!names.is_empty()).then(|| {
        names
            .into_iter()
            .map(|n| LocalObjectReference { name: n.clone() })
            .collect()
    })
}

pub fn desired_pod(
    vmi: &VirtualMachineInstance,
    cfg: &Config,
    block: &BlockVolumes,
) -> Result<Pod, PodError> {
    let (name, namespace, owner) = identity(vmi)?;
    let uid = owner.uid.as_str();
    if vmi
        .annotations()
        .contains_key(refusals::ANNOTATION_HOOK_SIDECARS)
    {
        return Err(PodError::HookSidecars);
    }

    let guest_memory = guest_memory_bytes(vmi, cfg)?;
    let vcpus = vmi.spec.vcpus().max(1);
    let spec = spec_without_cloud_init_data(&launcher_spec(vmi, cfg));
    let doc = LauncherDocument {
        api_version: "microvirt.io/v1alpha1",
        kind: "VirtualMachineInstance",
        metadata: LauncherMeta {
            name,
            namespace,
            uid,
        },
        spec: &spec,
        guest_memory_bytes: guest_memory,
        vcpus,
        default_kernel: default_kernel(vmi, cfg),
    };
    let doc_json = serde_json::to_string(&doc)?;

    // Labels: the VMI's own (so Services can select launcher pods) plus ours.
    let mut labels: BTreeMap<String, String> = vmi.labels().clone();
    labels.insert(LABEL_VMI_NAME.into(), name.into());
    labels.insert(LABEL_APP.into(), APP_NAME.into());
    labels.insert(LABEL_MANAGED_BY.into(), crate::config::FIELD_MANAGER.into());
    let annotations = BTreeMap::from([
        (ANNOTATION_VMI_UID.to_string(), uid.to_string()),
        (ANNOTATION_VMI_SPEC.to_string(), doc_json),
    ]);

    // Memory: guest + launcher overhead; the limit equals the request so the pod is not
    // evicted before others under memory pressure.
    let pod_memory = guest_memory.saturating_add(cfg.launcher_memory_overhead);
    let cpu_request = format!(
        "{}m",
        u64::from(vcpus) * u64::from(cfg.cpu_request_millis_per_vcpu)
    );
    let mut requests = BTreeMap::from([
        ("memory".to_string(), Quantity(format_bytes(pod_memory))),
        ("cpu".to_string(), Quantity(cpu_request)),
    ]);
    let mut limits = BTreeMap::from([("memory".to_string(), Quantity(format_bytes(pod_memory)))]);
    // Local disk: the runtime directory (launcher files, containerDisk overlays) and every
    // emptyDisk. The kubelet evicts a pod whose ephemeral storage (emptyDirs included) exceeds
    // the limit, so the limit covers all of it; the request reserves the same on the node.
    let scratch = runtime_scratch(vmi, cfg);
    let mut ephemeral = scratch;
    let mut empty_limits = BTreeMap::new();
    for v in &vmi.spec.volumes {
        if let Some(ed) = &v.empty_disk {
            let cap = quantity::parse_bytes(&ed.capacity.0).map_err(|source| {
                PodError::EmptyDiskCapacity {
                    volume: v.name.clone(),
                    source,
                }
            })?;
            let limit = empty_disk_size_limit(cap);
            ephemeral = ephemeral.saturating_add(limit);
            empty_limits.insert(v.name.clone(), limit);
        }
    }
    for m in [&mut requests, &mut limits] {
        m.insert(
            "ephemeral-storage".into(),
            Quantity(format_bytes(ephemeral)),
        );
    }
    if let Some(res) = &vmi.spec.domain.resources {
        if let Some(cpu) = res.requests.as_ref().and_then(|r| r.get("cpu")) {
            requests.insert("cpu".into(), cpu.clone());
        }
        if let Some(cpu) = res.limits.as_ref().and_then(|l| l.get("cpu")) {
            limits.insert("cpu".into(), cpu.clone());
        }
    }
    // dedicatedCpuPlacement: whole CPUs, request = limit (Guaranteed QoS, as memory already
    // is), so that the kubelet's static CPU manager gives the pod exclusive CPUs (KubeVirt's
    // rule); isolateEmulatorThread adds one for the VMM's own threads.
    if let Some(cpus) = dedicated_cpus(&vmi.spec) {
        let q = Quantity(cpus.to_string());
        requests.insert("cpu".into(), q.clone());
        limits.insert("cpu".into(), q);
    }

    let mut volumes = vec![
        Volume {
            name: "vmi".into(),
            downward_api: Some(DownwardAPIVolumeSource {
                items: Some(vec![DownwardAPIVolumeFile {
                    path: VMI_FILE.into(),
                    field_ref: Some(ObjectFieldSelector {
                        field_path: format!("metadata.annotations['{ANNOTATION_VMI_SPEC}']"),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        },
        Volume {
            name: "runtime".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                size_limit: Some(Quantity(format_bytes(scratch))),
                ..Default::default()
            }),
            ..Default::default()
        },
    ];
    let mut devices: Vec<VolumeDevice> = Vec::new();
    let mut mounts = vec![
        VolumeMount {
            name: "runtime".into(),
            mount_path: RUNTIME_DIR.into(),
            ..Default::default()
        },
        VolumeMount {
            name: "vmi".into(),
            mount_path: VMI_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        },
    ];

    match cfg.kvm_mode {
        KvmMode::DevicePlugin => {
            limits.insert(KVM_RESOURCE.into(), Quantity("1".into()));
            requests.insert(KVM_RESOURCE.into(), Quantity("1".into()));
        }
        KvmMode::HostPath => {
            for (vol, path) in [("dev-kvm", "/dev/kvm"), ("dev-net-tun", "/dev/net/tun")] {
                volumes.push(Volume {
                    name: vol.into(),
                    host_path: Some(HostPathVolumeSource {
                        path: path.into(),
                        type_: Some("CharDevice".into()),
                    }),
                    ..Default::default()
                });
                mounts.push(VolumeMount {
                    name: vol.into(),
                    mount_path: path.into(),
                    ..Default::default()
                });
            }
        }
    }

    for (i, v) in vmi.spec.volumes.iter().enumerate() {
        let vol_name = format!("vol-{i}");
        if let Some(cd) = &v.container_disk {
            volumes.push(Volume {
                name: vol_name.clone(),
                image: Some(ImageVolumeSource {
                    reference: Some(cd.image.clone()),
                    pull_policy: pull_policy(cd.image_pull_policy),
                }),
                ..Default::default()
            });
            mounts.push(VolumeMount {
                name: vol_name,
                mount_path: container_disk_dir(&v.name),
                read_only: Some(true),
                ..Default::default()
            });
        } else if let Some(pvc) = &v.persistent_volume_claim {
            volumes.push(Volume {
                name: vol_name.clone(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: pvc.claim_name.clone(),
                    read_only: pvc.read_only,
                }),
                ..Default::default()
            });
            if block.contains(&v.name) {
                devices.push(VolumeDevice {
                    name: vol_name,
                    device_path: pvc_device(&v.name),
                });
            } else {
                mounts.push(VolumeMount {
                    name: vol_name,
                    mount_path: pvc_dir(&v.name),
                    read_only: pvc.read_only,
                    ..Default::default()
                });
            }
        } else if v.empty_disk.is_some() {
            volumes.push(Volume {
                name: vol_name.clone(),
                empty_dir: Some(EmptyDirVolumeSource {
                    size_limit: empty_limits
                        .get(&v.name)
                        .map(|&l| Quantity(format_bytes(l))),
                    ..Default::default()
                }),
                ..Default::default()
            });
            mounts.push(VolumeMount {
                name: vol_name,
                mount_path: empty_disk_dir(&v.name),
                ..Default::default()
            });
        } else if let Some(ci) = &v.cloud_init_no_cloud {
            // The data comes from Secrets (the user's, or ours with the inline data); the
            // launcher builds the seed disk from the mounted files.
            let inline_user = ci.user_data.is_some() || ci.user_data_base64.is_some();
            let parts = [
                (
                    "userdata",
                    ci.secret_ref.as_ref().map(|r| r.name.clone()),
                    inline_user,
                    user_data_key(&v.name),
                ),
                (
                    "networkdata",
                    ci.network_data_secret_ref.as_ref().map(|r| r.name.clone()),
                    ci.network_data.is_some() || ci.network_data_base64.is_some(),
                    network_data_key(&v.name),
                ),
            ];
            for (part, user_secret, inline, key) in parts {
                let secret = match (user_secret, inline) {
                    (Some(s), _) => SecretVolumeSource {
                        secret_name: Some(s),
                        ..Default::default()
                    },
                    (None, true) => SecretVolumeSource {
                        secret_name: Some(cloud_init_secret_name(name)),
                        items: Some(vec![KeyToPath {
                            key,
                            path: part.into(),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    },
                    (None, false) => continue,
                };
                let vol = format!("{vol_name}-{part}");
                volumes.push(Volume {
                    name: vol.clone(),
                    secret: Some(secret),
                    ..Default::default()
                });
                mounts.push(VolumeMount {
                    name: vol,
                    mount_path: format!("{CLOUD_INIT_DIR}/{}/{part}", v.name),
                    read_only: Some(true),
                    ..Default::default()
                });
            }
        }
    }
    if let Some(kc) = spec
        .domain
        .firmware
        .as_ref()
        .and_then(|f| f.kernel_boot.as_ref())
        .and_then(|k| k.container.as_ref())
    {
        volumes.push(Volume {
            name: "kernel-boot".into(),
            image: Some(ImageVolumeSource {
                reference: Some(kc.image.clone()),
                pull_policy: pull_policy(kc.image_pull_policy),
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: "kernel-boot".into(),
            mount_path: KERNEL_BOOT_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        });
    }

    let container = Container {
        name: COMPUTE_CONTAINER.into(),
        image: Some(cfg.launcher_image.clone()),
        command: Some(vec!["virt-launcher".into(), "pod".into()]),
        env: Some(vec![
            EnvVar {
                name: "MICROVIRT_VMI_FILE".into(),
                value: Some(format!("{VMI_DIR}/{VMI_FILE}")),
                ..Default::default()
            },
            EnvVar {
                name: "MICROVIRT_LAUNCHER_USER".into(),
                value: Some(format!("{LAUNCHER_UID}:{LAUNCHER_GID}")),
                ..Default::default()
            },
        ]),
        resources: Some(ResourceRequirements {
            requests: Some(requests),
            limits: Some(limits),
            ..Default::default()
        }),
        // No probe: readiness is the pod's readiness gate (below), which the node agent sets
        // from the launcher's status stream. An exec probe cost a runtime exec per VM per
        // second for the pod's whole life.
        // The launcher starts as root only for its setup: the pod network (NET_ADMIN: tap,
        // bridge, nftables; NET_BIND_SERVICE: the DHCP server's UDP port 67) and opening
        // /dev/kvm; then it becomes LAUNCHER_UID:LAUNCHER_GID (SETUID, SETGID), which leaves
        // it no capability, before it opens any volume or runs the guest.
        security_context: Some(SecurityContext {
            privileged: Some(false),
            allow_privilege_escalation: Some(false),
            run_as_user: Some(0),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                add: Some(vec![
                    "NET_ADMIN".into(),
                    "NET_BIND_SERVICE".into(),
                    "SETGID".into(),
                    "SETUID".into(),
                ]),
                drop: Some(vec!["ALL".into()]),
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        termination_message_path: Some(TERMINATION_LOG.into()),
        termination_message_policy: Some("File".into()),
        volume_mounts: Some(mounts),
        volume_devices: (!devices.is_empty()).then_some(devices),
        ..Default::default()
    };

    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(name)),
            namespace: Some(namespace.into()),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![container],
            restart_policy: Some("Never".into()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            termination_grace_period_seconds: Some(
                vmi.spec.termination_grace_period_seconds.unwrap_or(30),
            ),
            node_selector: vmi.spec.node_selector.clone(),
            priority_class_name: vmi.spec.priority_class_name.clone(),
            hostname: pod_hostname(vmi),
            subdomain: vmi.spec.subdomain.clone(),
            scheduler_name: vmi.spec.scheduler_name.clone(),
            image_pull_secrets: image_pull_secrets(&vmi.spec),
            dns_policy: vmi.spec.dns_policy.map(|p| p.as_str().to_string()),
            dns_config: vmi.spec.dns_config.clone(),
            tolerations: vmi.spec.tolerations.clone(),
            affinity: vmi.spec.affinity.clone(),
            volumes: Some(volumes),
            // Ready while the VM runs (KubeVirt's Ready without probes): the node agent sets
            // this pod condition on pods/status from the launcher's `watch` stream.
            readiness_gates: Some(vec![PodReadinessGate {
                condition_type: POD_CONDITION_VM_RUNNING.into(),
            }]),
            // Volumes group-owned (and writable) by the launcher's group after the uid drop.
            security_context: Some(PodSecurityContext {
                fs_group: Some(LAUNCHER_GID),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    })
}

/// Whole CPUs the launcher pod requests and is limited to when the VMI asks for
/// `dedicatedCpuPlacement` (its vCPUs, plus one with `isolateEmulatorThread`).
pub fn dedicated_cpus(spec: &VirtualMachineInstanceSpec) -> Option<u32> {
    let cpu = spec.domain.cpu.as_ref()?;
    if cpu.dedicated_cpu_placement != Some(true) {
        return None;
    }
    let emulator = u32::from(cpu.isolate_emulator_thread == Some(true));
    Some(spec.vcpus().max(1).saturating_add(emulator))
}

/// The runtime directory's share of local disk: the launcher's own files plus an overlay
/// allowance per writable containerDisk (the launcher gives those a copy-on-write overlay
/// there; read-only ones need none).
fn runtime_scratch(vmi: &VirtualMachineInstance, cfg: &Config) -> u64 {
    let overlays = vmi
        .spec
        .volumes
        .iter()
        .filter(|v| v.container_disk.is_some())
        .filter(|v| {
            !vmi.spec
                .domain
                .devices
                .iter()
                .flat_map(|d| &d.disks)
                .any(|d| d.name == v.name && d.disk.as_ref().and_then(|t| t.readonly) == Some(true))
        })
        .count() as u64;
    let image_kernel = if names_kernel(&vmi.spec) {
        0
    } else {
        IMAGE_KERNEL_SCRATCH
    };
    cfg.launcher_scratch
        .saturating_add(overlays.saturating_mul(cfg.container_disk_overlay))
        .saturating_add(image_kernel)
}

/// Names of volumes of `desired` that `created` (as returned by the API server) lacks.
pub fn missing_volumes(desired: &Pod, created: &Pod) -> Vec<String> {
    let have: Vec<&str> = created
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .map(|v| v.iter().map(|v| v.name.as_str()).collect())
        .unwrap_or_default();
    desired
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .map(|v| {
            v.iter()
                .filter(|v| !have.contains(&v.name.as_str()))
                .map(|v| v.name.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `pod` belongs to this VMI (same uid in the annotation or owner reference).
pub fn pod_belongs_to(pod: &Pod, vmi: &VirtualMachineInstance) -> bool {
    let Some(uid) = vmi.meta().uid.as_deref() else {
        return false;
    };
    pod.annotations()
        .get(ANNOTATION_VMI_UID)
        .map(String::as_str)
        == Some(uid)
        || pod.owner_references().iter().any(|o| o.uid == uid)
}

#[cfg(test)]
mod golden;

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use microvirt_crds::vmi::{
        ContainerDiskSource, Cpu, Devices, DomainSpec, EmptyDiskSource, Memory, Volume as VmiVolume,
    };
    use microvirt_crds::VirtualMachineInstanceSpec;

    fn vmi(spec: VirtualMachineInstanceSpec) -> VirtualMachineInstance {
        let mut v = VirtualMachineInstance::new("vm1", spec);
        v.metadata.namespace = Some("ns".into());
        v.metadata.uid = Some("uid-1".into());
        v.metadata.labels = Some(BTreeMap::from([
            ("app".to_string(), "web".to_string()),
            (LABEL_APP.to_string(), "user-value".to_string()),
        ]));
        v
    }

    fn spec(memory: Option<&str>, cores: Option<u32>) -> VirtualMachineInstanceSpec {
        VirtualMachineInstanceSpec {
            domain: DomainSpec {
                cpu: cores.map(|c| Cpu {
                    cores: Some(c),
                    sockets: Some(1),
                    threads: Some(1),
                    ..Default::default()
                }),
                memory: memory.map(|m| Memory {
                    guest: Some(Quantity(m.into())),
                    ..Default::default()
                }),
                ..Default::default()
            },
            volumes: vec![
                VmiVolume {
                    name: "root".into(),
                    container_disk: Some(ContainerDiskSource {
                        image: "example/disk:1".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                VmiVolume {
                    name: "scratch".into(),
                    empty_disk: Some(EmptyDiskSource {
                        capacity: Quantity("1Gi".into()),
                    }),
                    ..Default::default()
                },
            ],
            termination_grace_period_seconds: Some(7),
            ..Default::default()
        }
    }

    fn container(pod: &Pod) -> &Container {
        &pod.spec.as_ref().unwrap().containers[0]
    }

    #[test]
    fn pod_follows_the_contract() {
        let v = vmi(spec(Some("256Mi"), Some(2)));
        let pod = desired_pod(&v, &Config::default(), &BlockVolumes::new()).unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("virt-launcher-vm1"));
        let labels = pod.metadata.labels.clone().unwrap();
        assert_eq!(labels["app"], "web");
        assert_eq!(labels[LABEL_VMI_NAME], "vm1");
        // Our label wins over a user label with the same key.
        assert_eq!(labels[LABEL_APP], APP_NAME);
        let ann = pod.metadata.annotations.clone().unwrap();
        assert_eq!(ann[ANNOTATION_VMI_UID], "uid-1");
        let doc: serde_json::Value = serde_json::from_str(&ann[ANNOTATION_VMI_SPEC]).unwrap();
        assert_eq!(doc["guestMemoryBytes"], 256u64 << 20);
        assert_eq!(doc["vcpus"], 2);
        assert_eq!(doc["metadata"]["uid"], "uid-1");
        assert_eq!(doc["spec"]["domain"]["memory"]["guest"], "256Mi");
        let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.uid.as_str(), owner.controller),
            ("uid-1", Some(true))
        );

        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.termination_grace_period_seconds, Some(7));
        assert_eq!(spec.automount_service_account_token, Some(false));
        let c = container(&pod);
        let res = c.resources.as_ref().unwrap();
        let req = res.requests.as_ref().unwrap();
        let lim = res.limits.as_ref().unwrap();
        assert_eq!(req["memory"].0, "288Mi");
        assert_eq!(lim["memory"].0, "288Mi");
        assert_eq!(req["cpu"].0, "200m");
        assert_eq!(lim[KVM_RESOURCE].0, "1");
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.privileged, Some(false));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(
            sc.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
            Some("RuntimeDefault")
        );
        let caps = sc.capabilities.as_ref().unwrap();
        assert_eq!(caps.drop, Some(vec!["ALL".to_string()]));
        assert_eq!(
            caps.add,
            Some(vec![
                "NET_ADMIN".to_string(),
                "NET_BIND_SERVICE".to_string(),
                "SETGID".to_string(),
                "SETUID".to_string(),
            ])
        );
        // The launcher drops to 107:107 after its setup; volumes are group 107.
        let env = c.env.as_ref().unwrap();
        assert!(env
            .iter()
            .any(|e| e.name == "MICROVIRT_LAUNCHER_USER" && e.value.as_deref() == Some("107:107")));
        let psc = spec.security_context.as_ref().unwrap();
        assert_eq!(psc.fs_group, Some(107));
        assert_eq!(
            psc.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
            Some("RuntimeDefault")
        );
        let mounts: Vec<&str> = c
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| m.mount_path.as_str())
            .collect();
        assert!(mounts.contains(&"/var/run/microvirt/container-disks/root"));
        assert!(mounts.contains(&"/var/run/microvirt/empty-disks/scratch"));
        assert!(mounts.contains(&VMI_DIR));
        // No hostPath in device-plugin mode.
        assert!(spec
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .all(|v| v.host_path.is_none()));
    }

    #[test]
    fn readiness_is_a_gate_the_node_agent_sets_not_a_probe() {
        let pod = desired_pod(
            &vmi(spec(None, None)),
            &Config::default(),
            &BlockVolumes::new(),
        )
        .unwrap();
        let c = container(&pod);
        assert!(c.readiness_probe.is_none(), "{:?}", c.readiness_probe);
        assert!(c.liveness_probe.is_none() && c.startup_probe.is_none());
        let gates = pod.spec.as_ref().unwrap().readiness_gates.clone().unwrap();
        assert_eq!(gates.len(), 1);
        assert_eq!(gates[0].condition_type, POD_CONDITION_VM_RUNNING);
        assert_eq!(POD_CONDITION_VM_RUNNING, "microvirt.io/vm-running");
    }

    #[test]
    fn inline_cloud_init_data_goes_to_a_secret_not_the_pod() {
        use microvirt_crds::vmi::{CloudInitNoCloudSource, SecretRef};
        let mut sp = spec(Some("64Mi"), None);
        sp.volumes.push(VmiVolume {
            name: "seed".into(),
            cloud_init_no_cloud: Some(CloudInitNoCloudSource {
                user_data: Some("#cloud-config\npassword: hunter2\n".into()),
                network_data: Some("version: 2\n".into()),
                ..Default::default()
            }),
            ..Default::default()
        });
        sp.volumes.push(VmiVolume {
            name: "other".into(),
            cloud_init_no_cloud: Some(CloudInitNoCloudSource {
                secret_ref: Some(SecretRef {
                    name: "my-user-data".into(),
                }),
                user_data: None,
                ..Default::default()
            }),
            ..Default::default()
        });
        let v = vmi(sp);
        let pod = desired_pod(&v, &Config::default(), &BlockVolumes::new()).unwrap();
        let pod_json = serde_json::to_string(&pod).unwrap();
        assert!(!pod_json.contains("hunter2"), "{pod_json}");
        assert!(!pod_json.contains("version: 2"), "{pod_json}");
        let secret = cloud_init_secret(&v).unwrap().expect("a secret");
        assert_eq!(
            secret.metadata.name.as_deref(),
            Some("virt-launcher-vm1-cloud-init")
        );
        assert_eq!(
            secret.metadata.owner_references.as_ref().unwrap()[0].uid,
            "uid-1"
        );
        let data = secret.data.as_ref().unwrap();
        assert_eq!(
            data["seed.userdata"].0,
            b"#cloud-config\npassword: hunter2\n"
        );
        assert_eq!(data["seed.networkdata"].0, b"version: 2\n");
        assert_eq!(data.len(), 2, "the referenced Secret is not copied");
        let vols = pod.spec.as_ref().unwrap().volumes.as_ref().unwrap();
        let secret_of = |n: &str| {
            vols.iter()
                .find(|v| v.name == n)
                .and_then(|v| v.secret.clone())
                .unwrap_or_else(|| panic!("no secret volume {n}"))
        };
        let s = secret_of("vol-2-userdata");
        assert_eq!(
            s.secret_name.as_deref(),
            Some("virt-launcher-vm1-cloud-init")
        );
        assert_eq!(s.items.as_ref().unwrap()[0].key, "seed.userdata");
        assert_eq!(s.items.as_ref().unwrap()[0].path, "userdata");
        assert_eq!(
            secret_of("vol-2-networkdata").items.as_ref().unwrap()[0].key,
            "seed.networkdata"
        );
        let s = secret_of("vol-3-userdata");
        assert_eq!(s.secret_name.as_deref(), Some("my-user-data"));
        assert!(s.items.is_none());
        assert!(!vols.iter().any(|v| v.name == "vol-3-networkdata"));
        let mounts: Vec<(String, Option<bool>)> = container(&pod)
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| (m.mount_path.clone(), m.read_only))
            .collect();
        for p in [
            "/var/run/microvirt/cloud-init/seed/userdata",
            "/var/run/microvirt/cloud-init/seed/networkdata",
            "/var/run/microvirt/cloud-init/other/userdata",
        ] {
            assert!(
                mounts.contains(&(p.to_string(), Some(true))),
                "{p}: {mounts:?}"
            );
        }
        // base64 user data is decoded into the Secret; garbage is an error.
        let mut sp = spec(Some("64Mi"), None);
        sp.volumes.push(VmiVolume {
            name: "b64".into(),
            cloud_init_no_cloud: Some(CloudInitNoCloudSource {
                user_data_base64: Some("aGk=".into()),
                ..Default::default()
            }),
            ..Default::default()
        });
        let s = cloud_init_secret(&vmi(sp.clone())).unwrap().unwrap();
        assert_eq!(s.data.unwrap()["b64.userdata"].0, b"hi");
        sp.volumes[2]
            .cloud_init_no_cloud
            .as_mut()
            .unwrap()
            .user_data_base64 = Some("not base64!".into());
        assert!(matches!(
            cloud_init_secret(&vmi(sp.clone())),
            Err(PodError::Base64 {
                field: "userDataBase64",
                ..
            })
        ));
        // So is base64 network data.
        let ci = sp.volumes[2].cloud_init_no_cloud.as_mut().unwrap();
        ci.user_data_base64 = None;
        ci.network_data_base64 = Some("dmVyc2lvbjogMgo=".into());
        let s = cloud_init_secret(&vmi(sp.clone())).unwrap().unwrap();
        assert_eq!(s.data.unwrap()["b64.networkdata"].0, b"version: 2\n");
        let pod = desired_pod(&vmi(sp.clone()), &Config::default(), &BlockVolumes::new()).unwrap();
        let pod_json = serde_json::to_string(&pod).unwrap();
        assert!(!pod_json.contains("dmVyc2lvbjogMgo="), "{pod_json}");
        assert!(pod_json.contains("b64.networkdata"), "{pod_json}");
        sp.volumes[2]
            .cloud_init_no_cloud
            .as_mut()
            .unwrap()
            .network_data_base64 = Some("%%%".into());
        assert!(matches!(
            cloud_init_secret(&vmi(sp)),
            Err(PodError::Base64 {
                field: "networkDataBase64",
                ..
            })
        ));
        assert!(cloud_init_secret(&vmi(spec(None, None))).unwrap().is_none());
    }

    #[test]
    fn host_path_mode_and_defaults() {
        let cfg = Config {
            kvm_mode: KvmMode::HostPath,
            launcher_memory_overhead: 64 << 20,
            ..Config::default()
        };
        // No memory given: default 128Mi guest + 64Mi overhead; 1 vCPU.
        let v = vmi(spec(None, None));
        let pod = desired_pod(&v, &cfg, &BlockVolumes::new()).unwrap();
        let c = container(&pod);
        let res = c.resources.as_ref().unwrap();
        assert_eq!(res.requests.as_ref().unwrap()["memory"].0, "192Mi");
        assert_eq!(res.requests.as_ref().unwrap()["cpu"].0, "100m");
        assert!(!res.limits.as_ref().unwrap().contains_key(KVM_RESOURCE));
        let host_paths: Vec<String> = pod
            .spec
            .as_ref()
            .unwrap()
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .filter_map(|v| v.host_path.as_ref().map(|h| h.path.clone()))
            .collect();
        assert_eq!(host_paths, vec!["/dev/kvm", "/dev/net/tun"]);
    }

    fn volume(pod: &Pod, vol: &str) -> Volume {
        pod.spec
            .as_ref()
            .unwrap()
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == vol)
            .unwrap_or_else(|| panic!("no volume {vol}"))
            .clone()
    }

    fn bytes(q: &Quantity) -> u64 {
        quantity::parse_bytes(&q.0).unwrap()
    }

    #[test]
    fn block_mode_claims_are_devices_and_filesystem_claims_mounts() {
        let mut sp = spec(Some("64Mi"), None);
        for (name, claim) in [("fast", "fast-claim"), ("files", "files-claim")] {
            sp.volumes.push(VmiVolume {
                name: name.into(),
                persistent_volume_claim: Some(microvirt_crds::vmi::PersistentVolumeClaimSource {
                    claim_name: claim.into(),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
        let block = BlockVolumes::from(["fast".to_string()]);
        let pod = desired_pod(&vmi(sp), &Config::default(), &block).unwrap();
        let c = container(&pod);
        let devices = c.volume_devices.clone().unwrap_or_default();
        assert_eq!(
            devices,
            vec![VolumeDevice {
                name: "vol-2".into(),
                device_path: "/dev/microvirt/pvcs/fast".into(),
            }]
        );
        assert_eq!(
            volume(&pod, "vol-2")
                .persistent_volume_claim
                .unwrap()
                .claim_name,
            "fast-claim"
        );
        let mounts = c.volume_mounts.as_ref().unwrap();
        assert!(mounts.iter().all(|m| m.name != "vol-2"), "{mounts:?}");
        assert!(mounts
            .iter()
            .any(|m| m.name == "vol-3" && m.mount_path == "/var/run/microvirt/pvcs/files"));
        // Without block claims there is no volumeDevices field at all.
        let pod = desired_pod(
            &vmi(spec(None, None)),
            &Config::default(),
            &BlockVolumes::new(),
        )
        .unwrap();
        assert_eq!(container(&pod).volume_devices, None);
    }

    #[test]
    fn local_disk_is_requested_and_limited() {
        let cfg = Config {
            launcher_scratch: 64 << 20,
            container_disk_overlay: 1 << 30,
            ..Config::default()
        };
        // One writable containerDisk (root) and a 1Gi emptyDisk (scratch).
        let v = vmi(spec(Some("64Mi"), None));
        let pod = desired_pod(&v, &cfg, &BlockVolumes::new()).unwrap();
        let runtime = bytes(
            &volume(&pod, "runtime")
                .empty_dir
                .unwrap()
                .size_limit
                .unwrap(),
        );
        // The VMI names no kernel: room to extract its boot disk's kernel too.
        assert_eq!(runtime, (64 << 20) + (1 << 30) + IMAGE_KERNEL_SCRATCH);
        let empty = bytes(&volume(&pod, "vol-1").empty_dir.unwrap().size_limit.unwrap());
        assert_eq!(empty, empty_disk_size_limit(1 << 30));
        assert!(empty > 1 << 30, "no room for the file system's overhead");
        let res = container(&pod).resources.clone().unwrap();
        let (req, lim) = (res.requests.unwrap(), res.limits.unwrap());
        assert_eq!(bytes(&req["ephemeral-storage"]), runtime + empty);
        assert_eq!(bytes(&lim["ephemeral-storage"]), runtime + empty);
        // A read-only containerDisk gets no overlay allowance.
        let mut sp = spec(Some("64Mi"), None);
        sp.domain.devices = Some(microvirt_crds::vmi::Devices {
            disks: vec![microvirt_crds::vmi::Disk {
                name: "root".into(),
                disk: Some(microvirt_crds::vmi::DiskTarget {
                    bus: None,
                    readonly: Some(true),
                }),
                serial: None,
                ..Default::default()
            }],
            ..Default::default()
        });
        let pod = desired_pod(&vmi(sp), &cfg, &BlockVolumes::new()).unwrap();
        let runtime = bytes(
            &volume(&pod, "runtime")
                .empty_dir
                .unwrap()
                .size_limit
                .unwrap(),
        );
        assert_eq!(runtime, (64 << 20) + IMAGE_KERNEL_SCRATCH);
    }

    /// The emptyDisk's sizeLimit holds the disk file the launcher creates once the guest has
    /// written all of it, on the file system that spends the most on a file's metadata
    /// (ext2, 1 KiB blocks: an indirect block per 256 data blocks), measured as the kubelet
    /// does (allocated blocks). The capacity alone does not.
    #[test]
    fn an_empty_disk_fully_written_fits_its_size_limit() {
        let dir = std::env::temp_dir().join(format!("operator-emptydisk-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("mnt")).unwrap();
        let cap: u64 = 48 << 20;
        let mut sp = spec(None, None);
        sp.volumes[1].empty_disk = Some(EmptyDiskSource {
            capacity: Quantity(format_bytes(cap)),
        });
        let pod = desired_pod(&vmi(sp), &Config::default(), &BlockVolumes::new()).unwrap();
        let limit = bytes(&volume(&pod, "vol-1").empty_dir.unwrap().size_limit.unwrap());
        // In a private mount namespace (gone with the shell): a fresh ext2, the disk file as
        // the launcher makes it (sparse, the capacity), then every byte written.
        let script = format!(
            "set -e; mkfs.ext2 -q -F -b 1024 fs.img 80M >/dev/null; mount -o loop fs.img mnt; \
             truncate -s {cap} mnt/disk.img; \
             dd if=/dev/urandom of=mnt/disk.img bs=1M count={} conv=notrunc,fsync status=none; \
             stat -c %b mnt/disk.img",
            cap >> 20
        );
        let out = std::process::Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", &script])
            .current_dir(&dir)
            .output()
            .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(out.status.success(), "{out:?}");
        let used = String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse::<u64>()
            .unwrap()
            * 512;
        assert!(
            used > cap,
            "ext2 spent nothing on metadata? {used} <= {cap}"
        );
        assert!(used <= limit, "{used} bytes used, sizeLimit {limit}");
    }

    #[test]
    fn dropped_volumes_are_detected() {
        let v = vmi(spec(Some("64Mi"), None));
        let desired = desired_pod(&v, &Config::default(), &BlockVolumes::new()).unwrap();
        assert!(missing_volumes(&desired, &desired).is_empty());
        let mut created = desired.clone();
        let vols = created.spec.as_mut().unwrap().volumes.as_mut().unwrap();
        vols.retain(|v| v.image.is_none());
        // The containerDisk and the (default) kernel image are both image volumes.
        assert_eq!(
            missing_volumes(&desired, &created),
            vec!["vol-0".to_string(), "kernel-boot".to_string()]
        );
    }

    #[test]
    fn kernel_less_vmis_get_the_default_kernel_image() {
        let kernel_image = |pod: &Pod| -> Option<String> {
            pod.spec.as_ref()?.volumes.as_ref()?.iter().find_map(|v| {
                (v.name == "kernel-boot").then(|| v.image.as_ref()?.reference.clone())?
            })
        };
        let doc = |pod: &Pod| -> serde_json::Value {
            serde_json::from_str(&pod.metadata.annotations.as_ref().unwrap()[ANNOTATION_VMI_SPEC])
                .unwrap()
        };
        // No kernelBoot at all: default image, path and arguments.
        let v = vmi(spec(Some("64Mi"), None));
        let pod = desired_pod(&v, &Config::default(), &BlockVolumes::new()).unwrap();
        assert_eq!(
            kernel_image(&pod).as_deref(),
            Some(crate::config::DEFAULT_KERNEL_IMAGE)
        );
        let kb = &doc(&pod)["spec"]["domain"]["firmware"]["kernelBoot"];
        assert_eq!(kb["container"]["kernelPath"], DEFAULT_KERNEL_PATH);
        // The default arguments are the fallback's, not the VMI's: they go to defaultKernel.
        assert_eq!(kb.get("kernelArgs"), None);
        assert_eq!(
            doc(&pod)["defaultKernel"],
            serde_json::json!({"kernelArgs": crate::config::DEFAULT_KERNEL_ARGS})
        );
        // The VMI object itself is not changed.
        assert!(v.spec.domain.firmware.is_none());

        // kernelArgs without a container: the VMI's arguments stay.
        let mut sp = spec(Some("64Mi"), None);
        sp.domain.firmware = Some(microvirt_crds::vmi::Firmware {
            kernel_boot: Some(microvirt_crds::vmi::KernelBoot {
                kernel_args: Some("quiet".into()),
                container: None,
            }),
            ..Default::default()
        });
        let pod = desired_pod(&vmi(sp.clone()), &Config::default(), &BlockVolumes::new()).unwrap();
        assert_eq!(
            doc(&pod)["spec"]["domain"]["firmware"]["kernelBoot"]["kernelArgs"],
            "quiet"
        );
        assert!(doc(&pod).get("defaultKernel").is_some());

        // A VMI naming its kernel image keeps it.
        sp.domain
            .firmware
            .as_mut()
            .unwrap()
            .kernel_boot
            .as_mut()
            .unwrap()
            .container = Some(KernelBootContainer {
            image: "my/kernel:1".into(),
            kernel_path: Some("/k".into()),
            ..Default::default()
        });
        let pod = desired_pod(&vmi(sp), &Config::default(), &BlockVolumes::new()).unwrap();
        assert_eq!(kernel_image(&pod).as_deref(), Some("my/kernel:1"));
        // The user's kernel is no fallback: no defaultKernel, and no extraction allowance.
        assert!(doc(&pod).get("defaultKernel").is_none());
        let runtime = volume(&pod, "runtime")
            .empty_dir
            .unwrap()
            .size_limit
            .unwrap();
        let cfg = Config::default();
        assert_eq!(
            bytes(&runtime),
            cfg.launcher_scratch + cfg.container_disk_overlay
        );

        // No default configured: the pod mounts no kernel image and the launcher boots the
        // boot disk's own kernel or fails the VMI (NoBootableKernel), never the demo guest.
        let cfg = Config {
            default_kernel_image: None,
            ..Config::default()
        };
        let pod = desired_pod(&vmi(spec(Some("64Mi"), None)), &cfg, &BlockVolumes::new()).unwrap();
        assert_eq!(kernel_image(&pod), None);
        assert!(doc(&pod).get("defaultKernel").is_none());
        assert!(doc(&pod)["spec"]["domain"].get("firmware").is_none());
    }

    #[test]
    fn bad_memory_and_missing_uid_are_errors() {
        let v = vmi(spec(Some("lots"), None));
        assert!(matches!(
            desired_pod(&v, &Config::default(), &BlockVolumes::new()),
            Err(PodError::Memory(_))
        ));
        let mut v = vmi(spec(Some("64Mi"), None));
        v.metadata.uid = None;
        assert!(matches!(
            desired_pod(&v, &Config::default(), &BlockVolumes::new()),
            Err(PodError::MissingMeta("uid"))
        ));
    }

    fn launcher_doc(pod: &Pod) -> serde_json::Value {
        let ann = pod.metadata.annotations.as_ref().unwrap();
        serde_json::from_str(&ann[ANNOTATION_VMI_SPEC]).unwrap()
    }

    #[test]
    fn a_vmi_without_interfaces_gets_the_pod_network_as_in_kubevirt() {
        // spec() declares no interfaces and no networks.
        let v = vmi(spec(Some("64Mi"), None));
        let pod = desired_pod(&v, &Config::default(), &BlockVolumes::new()).unwrap();
        let doc = launcher_doc(&pod);
        assert_eq!(
            doc["spec"]["domain"]["devices"]["interfaces"],
            serde_json::json!([{"name": "default", "masquerade": {}}])
        );
        assert_eq!(
            doc["spec"]["networks"],
            serde_json::json!([{"name": "default", "pod": {}}])
        );
        // The VMI object itself is not changed.
        assert!(v.spec.domain.devices.is_none());

        // --default-network-interface=bridge.
        let cfg = Config {
            default_network_interface: DefaultBinding::Bridge,
            ..Config::default()
        };
        let doc = launcher_doc(&desired_pod(&v, &cfg, &BlockVolumes::new()).unwrap());
        assert_eq!(
            doc["spec"]["domain"]["devices"]["interfaces"],
            serde_json::json!([{"name": "default", "bridge": {}}])
        );

        // autoattachPodInterface: false: no NIC.
        let mut sp = spec(Some("64Mi"), None);
        sp.domain.devices = Some(Devices {
            autoattach_pod_interface: Some(false),
            ..Default::default()
        });
        let doc =
            launcher_doc(&desired_pod(&vmi(sp), &Config::default(), &BlockVolumes::new()).unwrap());
        assert!(doc["spec"]["domain"]["devices"].get("interfaces").is_none());
        assert!(doc["spec"].get("networks").is_none());

        // Declared interfaces and networks are kept as they are, and so is a VMI that names
        // a network but no interface (KubeVirt adds nothing to either).
        let mut sp = spec(Some("64Mi"), None);
        sp.domain.devices = Some(Devices {
            interfaces: vec![Interface {
                name: "net0".into(),
                bridge: Some(InterfaceBridge {}),
                ..Default::default()
            }],
            ..Default::default()
        });
        sp.networks = vec![Network {
            name: "net0".into(),
            pod: Some(PodNetwork::default()),
            ..Default::default()
        }];
        let doc = launcher_doc(
            &desired_pod(&vmi(sp.clone()), &Config::default(), &BlockVolumes::new()).unwrap(),
        );
        assert_eq!(
            doc["spec"]["domain"]["devices"]["interfaces"],
            serde_json::json!([{"name": "net0", "bridge": {}}])
        );
        sp.domain.devices = None;
        assert!(default_pod_interface(&sp, DefaultBinding::Masquerade).is_none());
    }

    #[test]
    fn dedicated_cpus_make_a_guaranteed_pod() {
        let mut sp = spec(Some("64Mi"), Some(2));
        let cpu = sp.domain.cpu.as_mut().unwrap();
        cpu.dedicated_cpu_placement = Some(true);
        let res = |sp: &VirtualMachineInstanceSpec| {
            let pod =
                desired_pod(&vmi(sp.clone()), &Config::default(), &BlockVolumes::new()).unwrap();
            let r = container(&pod).resources.clone().unwrap();
            (
                r.requests.unwrap()["cpu"].0.clone(),
                r.limits.unwrap().get("cpu").map(|q| q.0.clone()),
            )
        };
        assert_eq!(res(&sp), ("2".to_string(), Some("2".to_string())));
        sp.domain.cpu.as_mut().unwrap().isolate_emulator_thread = Some(true);
        assert_eq!(res(&sp), ("3".to_string(), Some("3".to_string())));
        sp.domain.cpu.as_mut().unwrap().dedicated_cpu_placement = None;
        assert_eq!(res(&sp), ("200m".to_string(), None));
    }

    /// KubeVirt's rule: without a CPU topology the CPU limit, else the request, rounded up, is
    /// the guest's vCPU count (it used to be 1 whatever the pod reserved); the pod keeps the
    /// quantities as given.
    #[test]
    fn cpu_resources_without_a_topology_are_the_vcpus() {
        let launch = |requests: Option<&str>, limits: Option<&str>| {
            let mut sp = spec(Some("64Mi"), None);
            let cpu = |q: Option<&str>| {
                q.map(|q| BTreeMap::from([("cpu".to_string(), Quantity(q.to_string()))]))
            };
            sp.domain.resources = Some(microvirt_crds::vmi::ResourceRequirements {
                requests: cpu(requests),
                limits: cpu(limits),
            });
            let pod = desired_pod(&vmi(sp), &Config::default(), &BlockVolumes::new()).unwrap();
            let ann = pod.metadata.annotations.clone().unwrap();
            let doc: serde_json::Value = serde_json::from_str(&ann[ANNOTATION_VMI_SPEC]).unwrap();
            let r = container(&pod).resources.clone().unwrap();
            (
                doc["vcpus"].as_u64().unwrap(),
                r.requests.unwrap()["cpu"].0.clone(),
                r.limits.unwrap().get("cpu").map(|q| q.0.clone()),
            )
        };
        assert_eq!(launch(Some("2"), None), (2, "2".into(), None));
        assert_eq!(launch(Some("1500m"), None), (2, "1500m".into(), None));
        assert_eq!(
            launch(Some("1"), Some("3")),
            (3, "1".into(), Some("3".into()))
        );
        assert_eq!(launch(None, None), (1, "100m".into(), None));
        // A topology wins.
        let mut sp = spec(Some("64Mi"), Some(1));
        sp.domain.resources = Some(microvirt_crds::vmi::ResourceRequirements {
            requests: Some(BTreeMap::from([("cpu".to_string(), Quantity("4".into()))])),
            limits: None,
        });
        let pod = desired_pod(&vmi(sp), &Config::default(), &BlockVolumes::new()).unwrap();
        let ann = pod.metadata.annotations.unwrap();
        let doc: serde_json::Value = serde_json::from_str(&ann[ANNOTATION_VMI_SPEC]).unwrap();
        assert_eq!(doc["vcpus"], 1);
    }

    #[test]
    fn image_pull_secrets_of_container_disks_and_the_kernel_reach_the_pod() {
        let mut sp = spec(Some("64Mi"), None);
        let pod = desired_pod(&vmi(sp.clone()), &Config::default(), &BlockVolumes::new()).unwrap();
        assert_eq!(pod.spec.unwrap().image_pull_secrets, None);
        for (name, secret) in [("a", Some("regcred")), ("b", None), ("c", Some("regcred"))] {
            sp.volumes.push(VmiVolume {
                name: name.into(),
                container_disk: Some(microvirt_crds::vmi::ContainerDiskSource {
                    image: format!("registry.example/{name}:v1"),
                    image_pull_secret: secret.map(String::from),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
        sp.domain.firmware = Some(microvirt_crds::vmi::Firmware {
            kernel_boot: Some(microvirt_crds::vmi::KernelBoot {
                container: Some(microvirt_crds::vmi::KernelBootContainer {
                    image: "registry.example/kernel:v1".into(),
                    kernel_path: Some("/boot/vmlinux".into()),
                    image_pull_secret: Some("kernel-cred".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        let pod = desired_pod(&vmi(sp), &Config::default(), &BlockVolumes::new()).unwrap();
        let names: Vec<String> = pod
            .spec
            .unwrap()
            .image_pull_secrets
            .unwrap()
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(names, ["kernel-cred", "regcred"]);
    }

    #[test]
    fn dns_policy_and_config_reach_the_pod() {
        let mut sp = spec(Some("64Mi"), None);
        sp.dns_policy = Some(microvirt_crds::vmi::DnsPolicy::None);
        let cfg = k8s_openapi::api::core::v1::PodDNSConfig {
            nameservers: Some(vec!["192.0.2.53".into()]),
            searches: Some(vec!["example.internal".into()]),
            options: None,
        };
        sp.dns_config = Some(cfg.clone());
        let pod = desired_pod(&vmi(sp), &Config::default(), &BlockVolumes::new()).unwrap();
        let ps = pod.spec.unwrap();
        assert_eq!(ps.dns_policy.as_deref(), Some("None"));
        assert_eq!(ps.dns_config, Some(cfg));
    }

    #[test]
    fn priority_class_and_scheduler_reach_the_pod_and_hooks_are_refused() {
        let mut sp = spec(Some("64Mi"), None);
        sp.priority_class_name = Some("high".into());
        sp.scheduler_name = Some("other".into());
        let mut v = vmi(sp);
        let pod = desired_pod(&v, &Config::default(), &BlockVolumes::new()).unwrap();
        let ps = pod.spec.unwrap();
        assert_eq!(ps.priority_class_name.as_deref(), Some("high"));
        assert_eq!(ps.scheduler_name.as_deref(), Some("other"));
        assert_eq!(ps.dns_policy, None);
        assert_eq!(ps.dns_config, None);

        v.metadata.annotations = Some(BTreeMap::from([(
            refusals::ANNOTATION_HOOK_SIDECARS.to_string(),
            "[]".to_string(),
        )]));
        let err = desired_pod(&v, &Config::default(), &BlockVolumes::new()).unwrap_err();
        assert!(matches!(err, PodError::HookSidecars));
        assert_eq!(err.to_string(), refusals::HOOK_SIDECARS);
    }

    #[test]
    fn volumes_no_disk_names_get_a_disk_as_in_kubevirt() {
        // spec() has volumes root and scratch and no disks.
        let mut sp = spec(Some("64Mi"), None);
        let doc = launcher_doc(
            &desired_pod(&vmi(sp.clone()), &Config::default(), &BlockVolumes::new()).unwrap(),
        );
        assert_eq!(
            doc["spec"]["domain"]["devices"]["disks"],
            serde_json::json!([{"name": "root"}, {"name": "scratch"}])
        );
        // Declared disks come first and keep their settings.
        sp.domain.devices = Some(Devices {
            disks: vec![Disk {
                name: "scratch".into(),
                serial: Some("s1".into()),
                ..Default::default()
            }],
            ..Default::default()
        });
        with_default_volume_disks(&mut sp);
        let names: Vec<_> = sp
            .domain
            .devices
            .as_ref()
            .unwrap()
            .disks
            .iter()
            .map(|d| d.name.as_str())
            .collect();
        assert_eq!(names, ["scratch", "root"]);
        assert_eq!(
            sp.domain.devices.as_ref().unwrap().disks[0]
                .serial
                .as_deref(),
            Some("s1")
        );
    }

    #[test]
    fn boot_order_picks_the_root_disk_and_hostname_reaches_the_pod() {
        let mut sp = spec(Some("64Mi"), None);
        sp.domain.devices = Some(Devices {
            disks: vec![
                Disk {
                    name: "scratch".into(),
                    ..Default::default()
                },
                Disk {
                    name: "root".into(),
                    boot_order: Some(1),
                    ..Default::default()
                },
            ],
            ..Default::default()
        });
        sp.subdomain = Some("web".into());
        let v = vmi(sp.clone());
        let pod = desired_pod(&v, &Config::default(), &BlockVolumes::new()).unwrap();
        let doc = launcher_doc(&pod);
        let names: Vec<&str> = doc["spec"]["domain"]["devices"]["disks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["root", "scratch"]);
        let ps = pod.spec.unwrap();
        assert_eq!(ps.hostname.as_deref(), Some("vm1"));
        assert_eq!(ps.subdomain.as_deref(), Some("web"));

        sp.hostname = Some("db-0".into());
        assert_eq!(pod_hostname(&vmi(sp.clone())).as_deref(), Some("db-0"));
        sp.hostname = None;
        let mut dotted = vmi(sp);
        dotted.metadata.name = Some("a.b".into());
        assert_eq!(pod_hostname(&dotted), None);
    }
}
