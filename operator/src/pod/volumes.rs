//! The volumes renderer: the pod's volumes and the compute container's mounts and devices:
//! the VMI document (downward API), the runtime directory, `/dev/kvm` and `/dev/net/tun` in
//! hostPath mode, and each VMI volume (containerDisk and kernelBoot images, persistent volume
//! claims, emptyDisks, cloud-init Secrets).

use k8s_openapi::api::core::v1::{
    DownwardAPIVolumeFile, DownwardAPIVolumeSource, EmptyDirVolumeSource, HostPathVolumeSource,
    ImageVolumeSource, KeyToPath, ObjectFieldSelector, PersistentVolumeClaimVolumeSource,
    SecretVolumeSource, Volume, VolumeDevice, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use microvirt_crds::quantity::format_bytes;
use microvirt_crds::vmi::{
    CloudInitNoCloudSource, ContainerDiskSource, KernelBootContainer, PersistentVolumeClaimSource,
    PullPolicy, Volume as VmiVolume,
};

use super::cloud_init::{cloud_init_secret_name, network_data_key, user_data_key, CLOUD_INIT_DIR};
use super::resources::LocalDisk;
use super::{BlockVolumes, ANNOTATION_VMI_SPEC, RUNTIME_DIR, VMI_DIR, VMI_FILE};
use crate::config::KvmMode;

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

/// Mount path of an emptyDisk volume (the launcher creates `disk.img` inside).
pub fn empty_disk_dir(volume: &str) -> String {
    format!("{RUNTIME_DIR}/empty-disks/{volume}")
}

/// Mount path of the kernel boot image.
pub const KERNEL_BOOT_DIR: &str = "/var/run/microvirt/kernel-boot";

/// The pod's volumes and what the compute container makes of them, in order.
#[derive(Debug, Default, PartialEq)]
pub(super) struct PodVolumes {
    /// The pod's `volumes`.
    pub volumes: Vec<Volume>,
    /// The container's `volumeMounts`.
    pub mounts: Vec<VolumeMount>,
    /// The container's `volumeDevices` (block-mode claims).
    pub devices: Vec<VolumeDevice>,
}

impl PodVolumes {
    fn mount(&mut self, (volume, mount): (Volume, VolumeMount)) {
        self.volumes.push(volume);
        self.mounts.push(mount);
    }
}

/// The volumes of the launcher pod of VMI `vmi_name`: the VMI document and the runtime
/// directory (sized by `disk`), the device nodes in hostPath mode, the VMI's `volumes` (pod
/// volume `vol-<index>`; claims in `block` as devices) and the kernel image.
pub(super) fn pod_volumes(
    vmi_name: &str,
    vmi_volumes: &[VmiVolume],
    kernel: Option<&KernelBootContainer>,
    disk: &LocalDisk,
    kvm_mode: KvmMode,
    block: &BlockVolumes,
) -> PodVolumes {
    let mut out = launcher_volumes(disk.runtime);
    match kvm_mode {
        KvmMode::DevicePlugin => {}
        KvmMode::HostPath => {
            for (vol, path) in [("dev-kvm", "/dev/kvm"), ("dev-net-tun", "/dev/net/tun")] {
                out.mount(char_device(vol, path));
            }
        }
    }
    for (i, v) in vmi_volumes.iter().enumerate() {
        let vol_name = format!("vol-{i}");
        if let Some(cd) = &v.container_disk {
            out.mount(container_disk(vol_name, &v.name, cd));
        } else if let Some(pvc) = &v.persistent_volume_claim {
            let (volume, attach) = claim(vol_name, &v.name, pvc, block.contains(&v.name));
            out.volumes.push(volume);
            match attach {
                Attach::Mount(m) => out.mounts.push(m),
                Attach::Device(d) => out.devices.push(d),
            }
        } else if v.empty_disk.is_some() {
            let limit = disk.empty_disks.get(&v.name).copied();
            out.mount(empty_disk(vol_name, &v.name, limit));
        } else if let Some(ci) = &v.cloud_init_no_cloud {
            for part in cloud_init(vmi_name, &vol_name, &v.name, ci) {
                out.mount(part);
            }
        }
    }
    if let Some(kc) = kernel {
        out.mount(kernel_boot(kc));
    }
    out
}

/// The VMI document (the pod's annotation, through the downward API, read-only) and the
/// runtime directory (an emptyDir of `runtime` bytes).
fn launcher_volumes(runtime: u64) -> PodVolumes {
    PodVolumes {
        volumes: vec![
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
                    size_limit: Some(Quantity(format_bytes(runtime))),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ],
        mounts: vec![
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
        ],
        devices: Vec::new(),
    }
}

/// A node's character device at `path`, through a hostPath volume `vol`.
fn char_device(vol: &str, path: &str) -> (Volume, VolumeMount) {
    (
        Volume {
            name: vol.into(),
            host_path: Some(HostPathVolumeSource {
                path: path.into(),
                type_: Some("CharDevice".into()),
            }),
            ..Default::default()
        },
        VolumeMount {
            name: vol.into(),
            mount_path: path.into(),
            ..Default::default()
        },
    )
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

/// An image volume, mounted read-only at `mount_path`.
fn image(
    vol_name: String,
    image: &str,
    policy: Option<PullPolicy>,
    mount_path: String,
) -> (Volume, VolumeMount) {
    (
        Volume {
            name: vol_name.clone(),
            image: Some(ImageVolumeSource {
                reference: Some(image.to_string()),
                pull_policy: pull_policy(policy),
            }),
            ..Default::default()
        },
        VolumeMount {
            name: vol_name,
            mount_path,
            read_only: Some(true),
            ..Default::default()
        },
    )
}

/// containerDisk `volume`: its image, at [`container_disk_dir`].
fn container_disk(
    vol_name: String,
    volume: &str,
    cd: &ContainerDiskSource,
) -> (Volume, VolumeMount) {
    image(
        vol_name,
        &cd.image,
        cd.image_pull_policy,
        container_disk_dir(volume),
    )
}

/// The kernel image, at [`KERNEL_BOOT_DIR`].
fn kernel_boot(kc: &KernelBootContainer) -> (Volume, VolumeMount) {
    image(
        "kernel-boot".into(),
        &kc.image,
        kc.image_pull_policy,
        KERNEL_BOOT_DIR.into(),
    )
}

/// How a claim reaches the container.
#[derive(Debug, PartialEq)]
enum Attach {
    /// A file system, mounted at [`pvc_dir`].
    Mount(VolumeMount),
    /// A block device (`volumeMode: Block`), at [`pvc_device`].
    Device(VolumeDevice),
}

/// persistentVolumeClaim `volume`: a device when its claim is `block`, else a mount.
fn claim(
    vol_name: String,
    volume: &str,
    pvc: &PersistentVolumeClaimSource,
    block: bool,
) -> (Volume, Attach) {
    let pod_volume = Volume {
        name: vol_name.clone(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: pvc.claim_name.clone(),
            read_only: pvc.read_only,
        }),
        ..Default::default()
    };
    let attach = if block {
        Attach::Device(VolumeDevice {
            name: vol_name,
            device_path: pvc_device(volume),
        })
    } else {
        Attach::Mount(VolumeMount {
            name: vol_name,
            mount_path: pvc_dir(volume),
            read_only: pvc.read_only,
            ..Default::default()
        })
    };
    (pod_volume, attach)
}

/// emptyDisk `volume`: an emptyDir of `size_limit` bytes at [`empty_disk_dir`].
fn empty_disk(vol_name: String, volume: &str, size_limit: Option<u64>) -> (Volume, VolumeMount) {
    (
        Volume {
            name: vol_name.clone(),
            empty_dir: Some(EmptyDirVolumeSource {
                size_limit: size_limit.map(|l| Quantity(format_bytes(l))),
                ..Default::default()
            }),
            ..Default::default()
        },
        VolumeMount {
            name: vol_name,
            mount_path: empty_disk_dir(volume),
            ..Default::default()
        },
    )
}

/// cloudInitNoCloud `volume` of VMI `vmi_name`: a Secret volume for its user data and one
/// for its network data, each the user's Secret or the inline data's (in the Secret of
/// [`cloud_init_secret_name`]), read-only at `<CLOUD_INIT_DIR>/<volume>/<part>`; none for a
/// part it has no data for. The launcher builds the seed disk from the mounted files.
fn cloud_init(
    vmi_name: &str,
    vol_name: &str,
    volume: &str,
    ci: &CloudInitNoCloudSource,
) -> Vec<(Volume, VolumeMount)> {
    let inline_user = ci.user_data.is_some() || ci.user_data_base64.is_some();
    let parts = [
        (
            "userdata",
            ci.secret_ref.as_ref().map(|r| r.name.clone()),
            inline_user,
            user_data_key(volume),
        ),
        (
            "networkdata",
            ci.network_data_secret_ref.as_ref().map(|r| r.name.clone()),
            ci.network_data.is_some() || ci.network_data_base64.is_some(),
            network_data_key(volume),
        ),
    ];
    let mut out = Vec::new();
    for (part, user_secret, inline, key) in parts {
        let secret = match (user_secret, inline) {
            (Some(s), _) => SecretVolumeSource {
                secret_name: Some(s),
                ..Default::default()
            },
            (None, true) => SecretVolumeSource {
                secret_name: Some(cloud_init_secret_name(vmi_name)),
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
        out.push((
            Volume {
                name: vol.clone(),
                secret: Some(secret),
                ..Default::default()
            },
            VolumeMount {
                name: vol,
                mount_path: format!("{CLOUD_INIT_DIR}/{volume}/{part}"),
                read_only: Some(true),
                ..Default::default()
            },
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{desired_pod, BlockVolumes};
    use super::*;
    use crate::config::Config;

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

    fn names<T>(items: &[T], name: impl Fn(&T) -> &str) -> Vec<&str> {
        items.iter().map(name).collect()
    }

    #[test]
    fn pod_volumes_are_the_launchers_then_the_vmis_in_order_then_the_kernel() {
        use microvirt_crds::vmi::{CloudInitNoCloudSource, EmptyDiskSource};
        let vmi_volumes = vec![
            VmiVolume {
                name: "root".into(),
                container_disk: Some(ContainerDiskSource {
                    image: "disk:1".into(),
                    image_pull_policy: Some(PullPolicy::Never),
                    ..Default::default()
                }),
                ..Default::default()
            },
            VmiVolume {
                name: "data".into(),
                persistent_volume_claim: Some(PersistentVolumeClaimSource {
                    claim_name: "data-claim".into(),
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
            VmiVolume {
                name: "seed".into(),
                cloud_init_no_cloud: Some(CloudInitNoCloudSource {
                    user_data: Some("#cloud-config".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ];
        let kernel = KernelBootContainer {
            image: "kernel:1".into(),
            ..Default::default()
        };
        let disk = LocalDisk {
            runtime: 64 << 20,
            empty_disks: [("scratch".to_string(), 2 << 30)].into(),
            total: (64 << 20) + (2 << 30),
        };
        let block = BlockVolumes::from(["data".to_string()]);
        let out = pod_volumes(
            "vm1",
            &vmi_volumes,
            Some(&kernel),
            &disk,
            KvmMode::HostPath,
            &block,
        );
        assert_eq!(
            names(&out.volumes, |v| &v.name),
            [
                "vmi",
                "runtime",
                "dev-kvm",
                "dev-net-tun",
                "vol-0",
                "vol-1",
                "vol-2",
                "vol-3-userdata",
                "kernel-boot"
            ]
        );
        assert_eq!(
            names(&out.mounts, |m| &m.mount_path),
            [
                RUNTIME_DIR,
                VMI_DIR,
                "/dev/kvm",
                "/dev/net/tun",
                "/var/run/microvirt/container-disks/root",
                "/var/run/microvirt/empty-disks/scratch",
                "/var/run/microvirt/cloud-init/seed/userdata",
                KERNEL_BOOT_DIR,
            ]
        );
        assert_eq!(
            names(&out.devices, |d| &d.device_path),
            ["/dev/microvirt/pvcs/data"]
        );
        let sizes: Vec<Option<String>> = out
            .volumes
            .iter()
            .filter_map(|v| v.empty_dir.as_ref())
            .map(|e| e.size_limit.as_ref().map(|q| q.0.clone()))
            .collect();
        assert_eq!(sizes, [Some("64Mi".to_string()), Some("2Gi".to_string())]);
        assert_eq!(
            out.volumes[4].image,
            Some(ImageVolumeSource {
                reference: Some("disk:1".into()),
                pull_policy: Some("Never".into()),
            })
        );

        // Device-plugin mode mounts no device nodes; no kernel image, no kernel volume.
        let out = pod_volumes("vm1", &[], None, &disk, KvmMode::DevicePlugin, &block);
        assert_eq!(names(&out.volumes, |v| &v.name), ["vmi", "runtime"]);
        assert_eq!(names(&out.mounts, |m| &m.name), ["runtime", "vmi"]);
    }

    #[test]
    fn cloud_init_parts_come_from_the_users_secret_or_the_inline_datas() {
        use microvirt_crds::vmi::{CloudInitNoCloudSource, SecretRef};
        let secret = |parts: &[(Volume, VolumeMount)], i: usize| {
            parts[i].0.secret.clone().expect("a secret volume")
        };
        // The user's Secret for user data, inline network data: ours, one key.
        let ci = CloudInitNoCloudSource {
            secret_ref: Some(SecretRef {
                name: "mine".into(),
            }),
            network_data: Some("version: 2".into()),
            ..Default::default()
        };
        let parts = cloud_init("vm1", "vol-3", "seed", &ci);
        assert_eq!(parts.len(), 2);
        assert_eq!(secret(&parts, 0).secret_name.as_deref(), Some("mine"));
        assert_eq!(secret(&parts, 0).items, None);
        assert_eq!(
            secret(&parts, 1).secret_name.as_deref(),
            Some("virt-launcher-vm1-cloud-init")
        );
        assert_eq!(
            secret(&parts, 1).items,
            Some(vec![KeyToPath {
                key: "seed.networkdata".into(),
                path: "networkdata".into(),
                ..Default::default()
            }])
        );
        assert_eq!(parts[1].0.name, "vol-3-networkdata");
        assert_eq!(
            parts[1].1.mount_path,
            "/var/run/microvirt/cloud-init/seed/networkdata"
        );
        assert_eq!(parts[1].1.read_only, Some(true));
        // No network data at all: no network data volume.
        let ci = CloudInitNoCloudSource {
            user_data_base64: Some("aGk=".into()),
            ..Default::default()
        };
        let parts = cloud_init("vm1", "vol-0", "seed", &ci);
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].0.name, "vol-0-userdata");
    }
}
