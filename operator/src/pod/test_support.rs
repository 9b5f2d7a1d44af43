//! VMIs and accessors the renderers' unit tests share.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, Volume};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use microvirt_crds::quantity;
use microvirt_crds::vmi::{
    ContainerDiskSource, Cpu, DomainSpec, EmptyDiskSource, Memory, VirtualMachineInstance,
    Volume as VmiVolume,
};
use microvirt_crds::VirtualMachineInstanceSpec;

use super::{ANNOTATION_VMI_SPEC, LABEL_APP};

/// `vm1` in `ns` (uid `uid-1`), labelled `app=web` and with a user value for [`LABEL_APP`].
pub(super) fn vmi(spec: VirtualMachineInstanceSpec) -> VirtualMachineInstance {
    let mut v = VirtualMachineInstance::new("vm1", spec);
    v.metadata.namespace = Some("ns".into());
    v.metadata.uid = Some("uid-1".into());
    v.metadata.labels = Some(BTreeMap::from([
        ("app".to_string(), "web".to_string()),
        (LABEL_APP.to_string(), "user-value".to_string()),
    ]));
    v
}

/// `memory` of guest memory, `cores` (one socket, one thread), a containerDisk `root` and a
/// 1Gi emptyDisk `scratch`, a grace period of 7 s.
pub(super) fn spec(memory: Option<&str>, cores: Option<u32>) -> VirtualMachineInstanceSpec {
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

pub(super) fn container(pod: &Pod) -> &Container {
    &pod.spec.as_ref().unwrap().containers[0]
}

pub(super) fn volume(pod: &Pod, vol: &str) -> Volume {
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

pub(super) fn bytes(q: &Quantity) -> u64 {
    quantity::parse_bytes(&q.0).unwrap()
}

pub(super) fn launcher_doc(pod: &Pod) -> serde_json::Value {
    let ann = pod.metadata.annotations.as_ref().unwrap();
    serde_json::from_str(&ann[ANNOTATION_VMI_SPEC]).unwrap()
}
