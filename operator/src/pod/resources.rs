//! The resources renderer: the pod's local disk (the runtime directory and each emptyDisk)
//! and the compute container's requests and limits: guest memory plus the launcher's
//! overhead, CPU, local disk, and the KVM device plugin's resource.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use microvirt_crds::quantity::{self, format_bytes};
use microvirt_crds::vmi::VirtualMachineInstanceSpec;

use super::document::names_kernel;
use super::PodError;
use crate::config::{Config, KvmMode, IMAGE_KERNEL_SCRATCH, KVM_RESOURCE};

/// The pod's local disk, in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct LocalDisk {
    /// `sizeLimit` of the runtime directory's emptyDir ([`runtime_scratch`]).
    pub runtime: u64,
    /// `sizeLimit` of each emptyDisk's emptyDir, by volume name ([`empty_disk_size_limit`]).
    pub empty_disks: BTreeMap<String, u64>,
    /// The `ephemeral-storage` request and limit: the runtime directory and every emptyDisk.
    pub total: u64,
}

/// Local disk: the runtime directory (launcher files, containerDisk overlays) and every
/// emptyDisk. The kubelet evicts a pod whose ephemeral storage (emptyDirs included) exceeds
/// the limit, so the limit covers all of it; the request reserves the same on the node.
pub(super) fn local_disk(
    spec: &VirtualMachineInstanceSpec,
    cfg: &Config,
) -> Result<LocalDisk, PodError> {
    let runtime = runtime_scratch(spec, cfg);
    let mut total = runtime;
    let mut empty_disks = BTreeMap::new();
    for v in &spec.volumes {
        if let Some(ed) = &v.empty_disk {
            let cap = quantity::parse_bytes(&ed.capacity.0).map_err(|source| {
                PodError::EmptyDiskCapacity {
                    volume: v.name.clone(),
                    source,
                }
            })?;
            let limit = empty_disk_size_limit(cap);
            total = total.saturating_add(limit);
            empty_disks.insert(v.name.clone(), limit);
        }
    }
    Ok(LocalDisk {
        runtime,
        empty_disks,
        total,
    })
}

/// The compute container's requests and limits for `guest_memory` bytes, `vcpus` and
/// `ephemeral` bytes of local disk ([`LocalDisk::total`]).
pub(super) fn compute_resources(
    spec: &VirtualMachineInstanceSpec,
    cfg: &Config,
    guest_memory: u64,
    vcpus: u32,
    ephemeral: u64,
) -> ResourceRequirements {
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
    for m in [&mut requests, &mut limits] {
        m.insert(
            "ephemeral-storage".into(),
            Quantity(format_bytes(ephemeral)),
        );
    }
    if let Some(res) = &spec.domain.resources {
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
    if let Some(cpus) = dedicated_cpus(spec) {
        let q = Quantity(cpus.to_string());
        requests.insert("cpu".into(), q.clone());
        limits.insert("cpu".into(), q);
    }
    // The device plugin grants /dev/kvm and /dev/net/tun; in hostPath mode the volumes
    // renderer mounts them instead.
    match cfg.kvm_mode {
        KvmMode::DevicePlugin => {
            limits.insert(KVM_RESOURCE.into(), Quantity("1".into()));
            requests.insert(KVM_RESOURCE.into(), Quantity("1".into()));
        }
        KvmMode::HostPath => {}
    }
    ResourceRequirements {
        requests: Some(requests),
        limits: Some(limits),
        ..Default::default()
    }
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
fn runtime_scratch(spec: &VirtualMachineInstanceSpec, cfg: &Config) -> u64 {
    let overlays =
        spec.volumes
            .iter()
            .filter(|v| v.container_disk.is_some())
            .filter(|v| {
                !spec.domain.devices.iter().flat_map(|d| &d.disks).any(|d| {
                    d.name == v.name && d.disk.as_ref().and_then(|t| t.readonly) == Some(true)
                })
            })
            .count() as u64;
    let image_kernel = if names_kernel(spec) {
        0
    } else {
        IMAGE_KERNEL_SCRATCH
    };
    cfg.launcher_scratch
        .saturating_add(overlays.saturating_mul(cfg.container_disk_overlay))
        .saturating_add(image_kernel)
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::test_support::*;
    use super::super::{desired_pod, BlockVolumes, ANNOTATION_VMI_SPEC};
    use super::*;
    use microvirt_crds::vmi::EmptyDiskSource;

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
    fn local_disk_sizes_the_runtime_directory_and_each_empty_disk() {
        let cfg = Config {
            launcher_scratch: 10 << 20,
            container_disk_overlay: 100 << 20,
            ..Config::default()
        };
        // spec(): a writable containerDisk (root) and a 1Gi emptyDisk (scratch); no kernel.
        let mut sp = spec(None, None);
        sp.volumes.push(microvirt_crds::vmi::Volume {
            name: "more".into(),
            empty_disk: Some(EmptyDiskSource {
                capacity: Quantity("100Mi".into()),
            }),
            ..Default::default()
        });
        let disk = local_disk(&sp, &cfg).unwrap();
        let runtime = (10 << 20) + (100 << 20) + IMAGE_KERNEL_SCRATCH;
        assert_eq!(disk.runtime, runtime);
        assert_eq!(
            disk.empty_disks,
            BTreeMap::from([
                ("more".to_string(), empty_disk_size_limit(100 << 20)),
                ("scratch".to_string(), empty_disk_size_limit(1 << 30)),
            ])
        );
        assert_eq!(
            disk.total,
            runtime + empty_disk_size_limit(100 << 20) + empty_disk_size_limit(1 << 30)
        );

        // A VMI naming its kernel needs no room to extract one.
        sp.domain.firmware = Some(microvirt_crds::vmi::Firmware {
            kernel_boot: Some(microvirt_crds::vmi::KernelBoot {
                container: Some(microvirt_crds::vmi::KernelBootContainer {
                    image: "k:1".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        assert_eq!(
            local_disk(&sp, &cfg).unwrap().runtime,
            (10 << 20) + (100 << 20)
        );

        // A capacity that is no quantity names its volume.
        sp.volumes[2].empty_disk = Some(EmptyDiskSource {
            capacity: Quantity("lots".into()),
        });
        let err = local_disk(&sp, &cfg).unwrap_err();
        assert!(
            matches!(&err, PodError::EmptyDiskCapacity { volume, .. } if volume == "more"),
            "{err}"
        );
    }

    #[test]
    fn compute_resources_add_the_overhead_and_the_kvm_resource() {
        let cfg = Config {
            launcher_memory_overhead: 32 << 20,
            cpu_request_millis_per_vcpu: 250,
            ..Config::default()
        };
        let sp = spec(None, None);
        let r = compute_resources(&sp, &cfg, 1 << 30, 3, 5 << 30);
        let q = |s: &str| Quantity(s.to_string());
        assert_eq!(
            r.requests,
            Some(BTreeMap::from([
                ("cpu".to_string(), q("750m")),
                (KVM_RESOURCE.to_string(), q("1")),
                ("ephemeral-storage".to_string(), q("5Gi")),
                ("memory".to_string(), q("1056Mi")),
            ]))
        );
        assert_eq!(
            r.limits,
            Some(BTreeMap::from([
                (KVM_RESOURCE.to_string(), q("1")),
                ("ephemeral-storage".to_string(), q("5Gi")),
                ("memory".to_string(), q("1056Mi")),
            ]))
        );
        // In hostPath mode the devices are volumes, not a resource.
        let host = Config {
            kvm_mode: KvmMode::HostPath,
            ..cfg
        };
        let r = compute_resources(&sp, &host, 1 << 30, 3, 5 << 30);
        assert!(!r.requests.unwrap().contains_key(KVM_RESOURCE));
        assert!(!r.limits.unwrap().contains_key(KVM_RESOURCE));
    }
}
