//! The document renderer: the VMI document the launcher reads from the pod's
//! `microvirt.io/vmi-spec` annotation (the envelope `microvirt_crds::launcher_document`), its
//! spec with the defaults the operator applies (as KubeVirt's virt-controller and webhooks do).

use std::collections::BTreeSet;

use microvirt_crds::launcher_document::{DefaultKernel, LauncherDocument, LauncherMeta};
use microvirt_crds::quantity;
use microvirt_crds::vmi::{
    Disk, KernelBootContainer, VirtualMachineInstance, VirtualMachineInstanceSpec,
};

use super::network::with_default_pod_interface;
use super::PodError;
use crate::config::{Config, DEFAULT_KERNEL_PATH};

/// The document as the pod's annotation carries it (JSON): the shared envelope
/// ([`LauncherDocument`], which the launcher parses too) around the CRD's spec.
pub(super) fn document_json(
    metadata: LauncherMeta,
    spec: &VirtualMachineInstanceSpec,
    guest_memory_bytes: u64,
    vcpus: u32,
    default_kernel: Option<DefaultKernel>,
) -> Result<String, PodError> {
    let doc = LauncherDocument::new(
        metadata,
        spec,
        guest_memory_bytes,
        u64::from(vcpus),
        default_kernel,
    );
    Ok(serde_json::to_string(&doc)?)
}

/// Guest memory in bytes: `domain.memory.guest`, else `domain.resources.requests.memory`, else
/// the configured default.
pub fn guest_memory_bytes(vmi: &VirtualMachineInstance, cfg: &Config) -> Result<u64, PodError> {
    match vmi.spec.guest_memory() {
        Some(q) => Ok(quantity::parse_bytes(&q.0)?),
        None => Ok(cfg.default_guest_memory),
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

/// The spec the launcher gets: the VMI's, with the defaults the operator applies (as
/// KubeVirt's virt-controller and webhooks do): a disk for every volume without one
/// ([`with_default_volume_disks`]), disks in boot order ([`disks_in_boot_order`]), the pod
/// network interface ([`default_pod_interface`](super::default_pod_interface)), and the operator's default kernel image when
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
        kernel_args: Some(cfg.default_kernel_args.clone()),
    })
}

/// The kernel image the spec names (`firmware.kernelBoot.container`).
pub(super) fn kernel_container(spec: &VirtualMachineInstanceSpec) -> Option<&KernelBootContainer> {
    spec.domain
        .firmware
        .as_ref()
        .and_then(|f| f.kernel_boot.as_ref())
        .and_then(|k| k.container.as_ref())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;

    use super::super::test_support::*;
    use super::super::{desired_pod, BlockVolumes, ANNOTATION_VMI_SPEC};
    use super::*;
    use microvirt_crds::vmi::Devices;

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
}
