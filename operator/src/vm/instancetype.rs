//! Instancetypes and preferences (pure): what a VM's `spec.instancetype` and `spec.preference`
//! do to the VMI it creates, and the ControllerRevisions that keep them as the VM first
//! started with them.
//!
//! As in KubeVirt: the instancetype's `cpu.guest` becomes the VMI's `domain.cpu` (laid out by
//! the preference's `preferredCPUTopology`, by default as sockets) and its `memory.guest` the
//! VMI's `domain.memory.guest`; the VM's template must not set those itself ([`conflicts`]).
//! A preference only fills in what the template leaves unset: the bus of disks and the model
//! of interfaces (both can only be virtio on microvirt, which the preference CRDs enforce).
//!
//! The referenced object's spec is captured at the VM's first start in a ControllerRevision
//! owned by the VM ([`revision`]), named after the VM, the object and a hash of its spec; the
//! VM's `spec.instancetype.revisionName` (`spec.preference.revisionName`) records it, as
//! KubeVirt does, and later VMIs are expanded from the revision.

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::{Resource, ResourceExt};
use microvirt_crds::vmi::{Cpu, DiskBus, Memory};
use microvirt_crds::{
    InstancetypeSpec, PreferenceSpec, VirtualMachine, VirtualMachineInstanceSpec,
};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::vm::plan::LABEL_VM_NAME;

/// The fields of a VM's template that an instancetype sets; the template must leave them unset
/// (KubeVirt's conflict rule). Returns the paths that are set, from the VM's `spec`.
pub fn conflicts(template: &VirtualMachineInstanceSpec) -> Vec<&'static str> {
    let mut out = Vec::new();
    let d = &template.domain;
    if let Some(cpu) = &d.cpu {
        if cpu.sockets.is_some() {
            out.push("spec.template.spec.domain.cpu.sockets");
        }
        if cpu.cores.is_some() {
            out.push("spec.template.spec.domain.cpu.cores");
        }
        if cpu.threads.is_some() {
            out.push("spec.template.spec.domain.cpu.threads");
        }
    }
    if d.memory.as_ref().is_some_and(|m| m.guest.is_some()) {
        out.push("spec.template.spec.domain.memory.guest");
    }
    if let Some(r) = &d.resources {
        let has = |m: &Option<std::collections::BTreeMap<String, _>>, k: &str| {
            m.as_ref().is_some_and(|m| m.contains_key(k))
        };
        for (set, path) in [
            (
                has(&r.requests, "cpu"),
                "spec.template.spec.domain.resources.requests.cpu",
            ),
            (
                has(&r.limits, "cpu"),
                "spec.template.spec.domain.resources.limits.cpu",
            ),
            (
                has(&r.requests, "memory"),
                "spec.template.spec.domain.resources.requests.memory",
            ),
            (
                has(&r.limits, "memory"),
                "spec.template.spec.domain.resources.limits.memory",
            ),
        ] {
            if set {
                out.push(path);
            }
        }
    }
    out
}

/// `(sockets, cores, threads)` for `vcpus` by a preferred CPU topology (KubeVirt's default:
/// sockets; `any` as cores).
pub fn topology(vcpus: u32, preferred: Option<&str>) -> (u32, u32, u32) {
    match preferred {
        Some("cores" | "preferCores" | "any" | "preferAny") => (1, vcpus, 1),
        Some("threads" | "preferThreads") => (1, 1, vcpus),
        _ => (vcpus, 1, 1),
    }
}

/// The VMI spec of a VM's `template` with its instancetype and preference expanded; `Err`
/// names the template's fields that conflict with the instancetype.
pub fn expand(
    template: &VirtualMachineInstanceSpec,
    instancetype: Option<&InstancetypeSpec>,
    preference: Option<&PreferenceSpec>,
) -> Result<VirtualMachineInstanceSpec, String> {
    let mut spec = template.clone();
    if let Some(it) = instancetype {
        let c = conflicts(template);
        if !c.is_empty() {
            return Err(format!(
                "VM field(s) {} conflict with the selected instancetype, which sets the vCPUs and the guest memory: remove them from the template",
                c.join(", ")
            ));
        }
        let preferred = preference
            .and_then(|p| p.cpu.as_ref())
            .and_then(|c| c.preferred_cpu_topology.as_deref());
        let (sockets, cores, threads) = topology(it.cpu.guest, preferred);
        let cpu = spec.domain.cpu.get_or_insert_with(Cpu::default);
        cpu.sockets = Some(sockets);
        cpu.cores = Some(cores);
        cpu.threads = Some(threads);
        spec.domain.memory.get_or_insert_with(Memory::default).guest =
            Some(it.memory.guest.clone());
    }
    if let Some(devices) = preference.and_then(|p| p.devices.as_ref()) {
        if let Some(d) = spec.domain.devices.as_mut() {
            if devices.preferred_disk_bus.as_deref() == Some("virtio") {
                for disk in &mut d.disks {
                    // (A disk without `disk:` is a virtio disk too; only a `disk:` target has a
                    // bus to fill in.)
                    if let Some(target) = disk.disk.as_mut() {
                        target.bus.get_or_insert(DiskBus::Virtio);
                    }
                }
            }
            if let Some(model) = devices.preferred_interface_model.as_deref() {
                for i in &mut d.interfaces {
                    i.model.get_or_insert_with(|| model.to_string());
                }
            }
        }
    }
    Ok(spec)
}

/// Which of a VM's references a revision holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// `spec.instancetype`.
    Instancetype,
    /// `spec.preference`.
    Preference,
}

impl Which {
    /// The VM spec field.
    pub fn field(self) -> &'static str {
        match self {
            Which::Instancetype => "instancetype",
            Which::Preference => "preference",
        }
    }
}

/// FNV-1a of `bytes`, as 8 hex digits (a revision name's content part).
fn short_hash(bytes: &[u8]) -> String {
    let h = bytes.iter().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    });
    format!("{h:08x}")
}

/// The ControllerRevision that captures `object` (`kind`/`name`, with `spec`) for `vm`: owned
/// by the VM, named `<vm>-<instancetype|preference>-<name>-<hash of the spec>` (cut to fit a
/// name), so that the same content gives the same name (a retried capture finds the revision
/// it made before).
pub fn revision(
    vm: &VirtualMachine,
    which: Which,
    kind: &str,
    name: &str,
    spec: &serde_json::Value,
) -> ControllerRevision {
    let data = json!({
        "apiVersion": format!("{}/{}", microvirt_crds::GROUP, microvirt_crds::VERSION),
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    });
    let hash = short_hash(data.to_string().as_bytes());
    let mut prefix = format!("{}-{}-{}", vm.name_any(), which.field(), name);
    prefix.truncate(253 - hash.len() - 1);
    let mut rev = ControllerRevision {
        data: Some(RawExtension(data)),
        revision: 1,
        ..Default::default()
    };
    rev.metadata.name = Some(format!("{prefix}-{hash}"));
    rev.metadata.namespace = vm.namespace();
    rev.metadata.labels = Some([(LABEL_VM_NAME.to_string(), vm.name_any())].into());
    rev.metadata.owner_references = vm.controller_owner_ref(&()).map(|o| vec![o]);
    rev
}

/// Whether `rev` captured the object `kind`/`name` (a reference whose kind or name was changed
/// after its revision was recorded no longer matches it).
pub fn captures(rev: &ControllerRevision, kind: &str, name: &str) -> bool {
    rev.data.as_ref().is_some_and(|d| {
        d.0.get("kind").and_then(|k| k.as_str()) == Some(kind)
            && d.0.pointer("/metadata/name").and_then(|n| n.as_str()) == Some(name)
    })
}

/// The spec a revision captured; `Err` says what is wrong with it.
pub fn spec_of<T: DeserializeOwned>(rev: &ControllerRevision) -> Result<T, String> {
    let data = rev
        .data
        .as_ref()
        .ok_or_else(|| format!("ControllerRevision {} has no data", rev.name_any()))?;
    let spec = data.0.get("spec").cloned().unwrap_or_default();
    serde_json::from_value(spec).map_err(|e| {
        format!(
            "ControllerRevision {} holds no valid spec: {e}",
            rev.name_any()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use microvirt_crds::instancetype::{
        CpuInstancetype, CpuPreferences, DevicePreferences, MemoryInstancetype,
    };
    use microvirt_crds::vmi::{Devices, Disk, DiskTarget, Interface, ResourceRequirements};

    fn it(vcpus: u32, mem: &str) -> InstancetypeSpec {
        InstancetypeSpec {
            cpu: CpuInstancetype { guest: vcpus },
            memory: MemoryInstancetype {
                guest: Quantity(mem.into()),
            },
        }
    }

    fn template() -> VirtualMachineInstanceSpec {
        let mut t = VirtualMachineInstanceSpec::default();
        t.domain.devices = Some(Devices {
            disks: vec![Disk {
                name: "root".into(),
                disk: Some(DiskTarget::default()),
                ..Default::default()
            }],
            interfaces: vec![Interface {
                name: "default".into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        t
    }

    #[test]
    fn the_instancetype_sizes_the_vmi() {
        let s = expand(&template(), Some(&it(4, "2Gi")), None).unwrap();
        let cpu = s.domain.cpu.as_ref().unwrap();
        assert_eq!(
            (cpu.sockets, cpu.cores, cpu.threads),
            (Some(4), Some(1), Some(1))
        );
        assert_eq!(s.vcpus(), 4);
        assert_eq!(
            s.domain.memory.as_ref().unwrap().guest,
            Some(Quantity("2Gi".into()))
        );
        // Nothing else changes.
        assert_eq!(s.domain.devices, template().domain.devices);
    }

    #[test]
    fn the_preference_lays_out_the_vcpus_and_fills_in_devices() {
        let p = PreferenceSpec {
            cpu: Some(CpuPreferences {
                preferred_cpu_topology: Some("cores".into()),
            }),
            devices: Some(DevicePreferences {
                preferred_disk_bus: Some("virtio".into()),
                preferred_interface_model: Some("virtio".into()),
                preferred_tpm: None,
            }),
        };
        let s = expand(&template(), Some(&it(2, "1Gi")), Some(&p)).unwrap();
        let cpu = s.domain.cpu.as_ref().unwrap();
        assert_eq!(
            (cpu.sockets, cpu.cores, cpu.threads),
            (Some(1), Some(2), Some(1))
        );
        let d = s.domain.devices.as_ref().unwrap();
        assert_eq!(d.disks[0].disk.as_ref().unwrap().bus, Some(DiskBus::Virtio));
        assert_eq!(d.interfaces[0].model.as_deref(), Some("virtio"));
        assert_eq!(topology(2, Some("threads")), (1, 1, 2));
        assert_eq!(topology(3, Some("preferSockets")), (3, 1, 1));
        assert_eq!(topology(3, None), (3, 1, 1));
        // A preference alone leaves the size to the template.
        let s = expand(&template(), None, Some(&p)).unwrap();
        assert_eq!(s.domain.cpu, None);
    }

    #[test]
    fn a_template_that_sets_what_the_instancetype_sets_conflicts() {
        let mut t = template();
        t.domain.memory = Some(Memory {
            guest: Some(Quantity("128Mi".into())),
            hugepages: None,
        });
        t.domain.cpu = Some(Cpu {
            cores: Some(2),
            ..Default::default()
        });
        t.domain.resources = Some(ResourceRequirements {
            requests: Some([("cpu".to_string(), Quantity("1".into()))].into()),
            limits: None,
        });
        let e = expand(&t, Some(&it(1, "1Gi")), None).unwrap_err();
        for f in [
            "spec.template.spec.domain.cpu.cores",
            "spec.template.spec.domain.memory.guest",
            "spec.template.spec.domain.resources.requests.cpu",
        ] {
            assert!(e.contains(f), "{e}");
        }
        assert!(!e.contains("sockets"), "{e}");
        // Without an instancetype the template is the VMI.
        assert_eq!(expand(&t, None, None).unwrap(), t);
    }

    #[test]
    fn revisions_are_named_by_content_and_owned_by_the_vm() {
        let mut vm = VirtualMachine::new("vm1", Default::default());
        vm.metadata.namespace = Some("ns".into());
        vm.metadata.uid = Some("uid".into());
        let spec = serde_json::to_value(it(1, "128Mi")).unwrap();
        let r = revision(
            &vm,
            Which::Instancetype,
            "VirtualMachineInstancetype",
            "small",
            &spec,
        );
        let again = revision(
            &vm,
            Which::Instancetype,
            "VirtualMachineInstancetype",
            "small",
            &spec,
        );
        assert_eq!(r.metadata.name, again.metadata.name);
        assert!(r
            .metadata
            .name
            .as_deref()
            .unwrap()
            .starts_with("vm1-instancetype-small-"));
        let other = serde_json::to_value(it(2, "128Mi")).unwrap();
        let r2 = revision(
            &vm,
            Which::Instancetype,
            "VirtualMachineInstancetype",
            "small",
            &other,
        );
        assert_ne!(r.metadata.name, r2.metadata.name);
        assert_eq!(r.metadata.owner_references.as_ref().unwrap()[0].uid, "uid");
        assert_eq!(spec_of::<InstancetypeSpec>(&r).unwrap(), it(1, "128Mi"));
        assert!(captures(&r, "VirtualMachineInstancetype", "small"));
        assert!(!captures(&r, "VirtualMachineInstancetype", "large"));
        assert!(!captures(&r, "VirtualMachineClusterInstancetype", "small"));
        let long = "x".repeat(300);
        let r3 = revision(
            &vm,
            Which::Preference,
            "VirtualMachinePreference",
            &long,
            &spec,
        );
        assert!(r3.metadata.name.unwrap().len() <= 253);
    }
}
