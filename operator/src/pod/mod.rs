//! The launcher pod a VMI runs in (pure: no API calls). The contract is documented in
//! `docs/launcher-pod.md`.
//!
//! [`desired_pod`] composes the pod from renderers, each a function of the VMI spec pieces and
//! settings it needs that renders one part of the pod (as KubeVirt's virt-controller renders
//! its launcher pods):
//! - `document`: the VMI document the launcher reads (the spec with the operator's defaults);
//! - `network`: the pod network interface a VMI without interfaces gets;
//! - `resources`: the pod's local disk and the container's requests and limits;
//! - `volumes`: the pod's volumes and the container's mounts and devices;
//! - `container`: the compute container;
//! - `podspec`: the pod's metadata (labels, annotations, owner) and its pod-level spec.
//!
//! `cloud_init` renders the Secret with the VMI's inline cloud-init data, an object of its own.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};
use microvirt_crds::launcher_document::LauncherMeta;
use microvirt_crds::quantity::QuantityError;
use microvirt_crds::refusals;
use microvirt_crds::vmi::{VirtualMachineInstance, ANNOTATION_VMI_UID};

use crate::config::Config;

mod cloud_init;
mod container;
mod document;
mod network;
mod podspec;
mod resources;
mod volumes;

pub use cloud_init::{cloud_init_secret, cloud_init_secret_name, CLOUD_INIT_DIR};
pub use document::{
    default_kernel, disks_in_boot_order, guest_memory_bytes, launcher_spec, names_kernel,
    with_default_volume_disks,
};
pub use network::{default_pod_interface, with_default_pod_interface};
pub use podspec::pod_hostname;
pub use resources::{dedicated_cpus, empty_disk_size_limit};
pub use volumes::{
    container_disk_dir, empty_disk_dir, pvc_device, pvc_dir, KERNEL_BOOT_DIR, PVC_DEVICE_DIR,
};

/// Annotation carrying the VMI document the launcher reads (through the downward API).
pub use microvirt_crds::launcher_document::ANNOTATION_VMI_SPEC;
/// Optional pod annotation with the guest boot time in ms (set by the node agent, never by the
/// launcher, which has no API credentials).
pub use microvirt_crds::vmi::ANNOTATION_BOOT_TIME_MS;
/// Name of the launcher container.
pub const COMPUTE_CONTAINER: &str = "compute";
/// Directory holding runtime files of the launcher.
pub const RUNTIME_DIR: &str = "/var/run/microvirt";
/// Where the VMI document is mounted.
pub use microvirt_crds::launcher_document::DOCUMENT_DIR as VMI_DIR;
/// File name of the VMI document inside [`VMI_DIR`].
pub use microvirt_crds::launcher_document::DOCUMENT_FILE as VMI_FILE;
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

/// Name of the launcher pod of a VMI (deterministic, so retries never create a second pod).
pub fn pod_name(vmi_name: &str) -> String {
    format!("virt-launcher-{vmi_name}")
}

/// Volumes whose persistentVolumeClaim has `volumeMode: Block` (the controller looks the
/// claims up; a claim it has not seen counts as a file system).
pub type BlockVolumes = BTreeSet<String>;

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

/// The launcher pod for a VMI. `block` names the persistentVolumeClaim volumes whose claims
/// have `volumeMode: Block`: they reach the launcher as devices (`volumeDevices`).
pub fn desired_pod(
    vmi: &VirtualMachineInstance,
    cfg: &Config,
    block: &BlockVolumes,
) -> Result<Pod, PodError> {
    let (name, namespace, owner) = identity(vmi)?;
    if vmi
        .annotations()
        .contains_key(refusals::ANNOTATION_HOOK_SIDECARS)
    {
        return Err(PodError::HookSidecars);
    }

    let guest_memory = guest_memory_bytes(vmi, cfg)?;
    let vcpus = vmi.spec.vcpus().max(1);
    let spec = cloud_init::spec_without_cloud_init_data(&launcher_spec(vmi, cfg));
    let doc_json = document::document_json(
        LauncherMeta::new(name, namespace, &owner.uid),
        &spec,
        guest_memory,
        vcpus,
        default_kernel(vmi, cfg),
    )?;

    let disk = resources::local_disk(&vmi.spec, cfg)?;
    let resources = resources::compute_resources(&vmi.spec, cfg, guest_memory, vcpus, disk.total);
    let volumes = volumes::pod_volumes(
        name,
        &vmi.spec.volumes,
        document::kernel_container(&spec),
        &disk,
        cfg.kvm_mode,
        block,
    );
    let container = container::compute_container(
        &cfg.launcher_image,
        &vmi.spec,
        resources,
        volumes.mounts,
        volumes.devices,
    );

    Ok(Pod {
        metadata: podspec::metadata(name, namespace, owner, vmi.labels(), doc_json),
        spec: Some(podspec::pod_spec(
            &vmi.spec,
            pod_hostname(vmi),
            container,
            volumes.volumes,
        )),
        status: None,
    })
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
mod launcher_roundtrip;
#[cfg(test)]
mod test_support;

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;
    use crate::config::KVM_RESOURCE;
    use microvirt_crds::vmi::LABEL_VMI_NAME;

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
}
