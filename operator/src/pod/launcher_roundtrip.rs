//! What the operator writes is what the launcher reads: the VMI documents the operator renders
//! into launcher pods are parsed by the launcher's own parser (`launcher::vmi::VmiDocument`,
//! a dev-dependency: the launcher does not depend on the operator), and every field the
//! launcher acts on must hold what the operator meant.
//!
//! The documents: those of the golden test's VMIs ([`super::golden`]) rendered now, a VMI
//! that sets every field the launcher reads, and every document in the golden fixture
//! (`testdata/launcher-pods.txt`, which holds the pool members' too). What the operator meant:
//! for the rendered ones, the envelope built from the operator's own functions (the spec it
//! renders, its memory, vCPUs and default kernel); for the fixture's, the document read back
//! with the operator's types (the CRD spec).
//!
//! Both sides are reduced to the same flat view ([`launcher_view`], [`operator_view`]), one
//! entry per field the launcher reads, and compared. [`every_field_is_exercised`] checks that
//! each entry is set in some document: a field whose name drifts on one side reads as absent
//! there while the other side has a value, so the views differ. Checked by adding a serde
//! rename, one at a time, to the launcher's `Interface::mac_address` (`mac`) and to the CRD's
//! `PersistentVolumeClaimSource::read_only` (`readonly`): the first made
//! `the_launcher_reads_what_the_operator_writes` fail, the second that test and
//! `the_launcher_reads_the_fixtures_documents`.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use launcher::vmi::VmiDocument;
use microvirt_crds::launcher_document::{LauncherDocument, LauncherMeta, ANNOTATION_VMI_SPEC};
use microvirt_crds::vmi::{StartStrategy, VirtualMachineInstance};
use microvirt_crds::VirtualMachineInstanceSpec;
use serde_json::{json, Value};

use super::cloud_init::spec_without_cloud_init_data;
use super::{default_kernel, desired_pod, guest_memory_bytes, launcher_spec, BlockVolumes};
use crate::config::Config;

/// The document as the operator's types read it.
type OperatorDocument = LauncherDocument<VirtualMachineInstanceSpec>;

/// One entry per field the launcher reads: its path in the document, its value (lists: one
/// element per item; a device without settings, `rng: {}`, `masquerade: {}`: `true` when
/// present, null when not).
type View = BTreeMap<&'static str, Value>;

/// A serde value (an enum of the CRD) as JSON.
fn js<T: serde::Serialize>(v: T) -> Value {
    serde_json::to_value(v).unwrap()
}

/// The fields the launcher acts on, as the launcher parsed them.
fn launcher_view(d: &VmiDocument) -> View {
    let s = &d.spec;
    let dom = &s.domain;
    let cpu = dom.cpu.clone().unwrap_or_default();
    let res = dom.resources.clone().unwrap_or_default();
    let quantities = |m: Option<BTreeMap<String, launcher::vmi::Quantity>>| {
        m.map(|m| {
            m.into_iter()
                .map(|(k, v)| (k, v.0))
                .collect::<BTreeMap<_, _>>()
        })
    };
    let fw = dom.firmware.clone().unwrap_or_default();
    let kb = fw.kernel_boot.clone().unwrap_or_default();
    let kc = kb.container.clone().unwrap_or_default();
    let dev = &dom.devices;
    let disks = &dev.disks;
    let nics = &dev.interfaces;
    let vols = &s.volumes;
    let ci = |f: fn(&launcher::vmi::CloudInitNoCloud) -> Option<String>| -> Value {
        json!(vols
            .iter()
            .map(|v| v.cloud_init_no_cloud.as_ref().and_then(f))
            .collect::<Vec<_>>())
    };
    BTreeMap::from([
        ("apiVersion", json!(d.api_version)),
        ("kind", json!(d.kind)),
        ("metadata.name", json!(d.metadata.name)),
        ("metadata.namespace", json!(d.metadata.namespace)),
        ("metadata.uid", json!(d.metadata.uid)),
        ("guestMemoryBytes", json!(d.guest_memory_bytes)),
        ("vcpus", json!(d.vcpus)),
        (
            "defaultKernel.kernelArgs",
            json!(d.default_kernel.as_ref().map(|k| &k.kernel_args)),
        ),
        ("domain.cpu.cores", json!(cpu.cores)),
        ("domain.cpu.sockets", json!(cpu.sockets)),
        ("domain.cpu.threads", json!(cpu.threads)),
        (
            "domain.memory.guest",
            json!(dom
                .memory
                .as_ref()
                .and_then(|m| m.guest.as_ref())
                .map(|q| &q.0)),
        ),
        ("domain.resources.requests", json!(quantities(res.requests))),
        ("domain.resources.limits", json!(quantities(res.limits))),
        ("domain.firmware.uuid", json!(fw.uuid)),
        (
            "domain.firmware.kernelBoot.kernelArgs",
            json!(kb.kernel_args),
        ),
        (
            "domain.firmware.kernelBoot.container.image",
            json!(kc.image),
        ),
        (
            "domain.firmware.kernelBoot.container.kernelPath",
            json!(kc.kernel_path),
        ),
        (
            "domain.firmware.kernelBoot.container.initrdPath",
            json!(kc.initrd_path),
        ),
        (
            "domain.features.acpi.enabled",
            json!(dom
                .features
                .as_ref()
                .and_then(|f| f.acpi.as_ref())
                .map(|a| a.enabled)),
        ),
        (
            "domain.devices.rng",
            json!(dev.rng.is_some().then_some(true)),
        ),
        (
            "domain.devices.disks[].name",
            json!(disks.iter().map(|d| &d.name).collect::<Vec<_>>()),
        ),
        (
            "domain.devices.disks[].disk.bus",
            json!(disks
                .iter()
                .map(|d| d.disk.as_ref().and_then(|t| t.bus.clone()))
                .collect::<Vec<_>>()),
        ),
        (
            "domain.devices.disks[].disk.readonly",
            json!(disks
                .iter()
                .map(|d| d.disk.as_ref().and_then(|t| t.readonly))
                .collect::<Vec<_>>()),
        ),
        (
            "domain.devices.disks[].serial",
            json!(disks.iter().map(|d| &d.serial).collect::<Vec<_>>()),
        ),
        (
            "domain.devices.interfaces[].name",
            json!(nics.iter().map(|i| &i.name).collect::<Vec<_>>()),
        ),
        (
            "domain.devices.interfaces[].masquerade",
            json!(nics
                .iter()
                .map(|i| i.masquerade.is_some().then_some(true))
                .collect::<Vec<_>>()),
        ),
        (
            "domain.devices.interfaces[].bridge",
            json!(nics
                .iter()
                .map(|i| i.bridge.is_some().then_some(true))
                .collect::<Vec<_>>()),
        ),
        (
            "domain.devices.interfaces[].macAddress",
            json!(nics.iter().map(|i| &i.mac_address).collect::<Vec<_>>()),
        ),
        (
            "domain.devices.interfaces[].ports[].port",
            json!(nics
                .iter()
                .map(|i| i.ports.iter().map(|p| p.port).collect::<Vec<_>>())
                .collect::<Vec<_>>()),
        ),
        (
            "domain.devices.interfaces[].ports[].protocol",
            json!(nics
                .iter()
                .map(|i| i.ports.iter().map(|p| &p.protocol).collect::<Vec<_>>())
                .collect::<Vec<_>>()),
        ),
        (
            "networks[].name",
            json!(s.networks.iter().map(|n| &n.name).collect::<Vec<_>>()),
        ),
        (
            "volumes[].name",
            json!(vols.iter().map(|v| &v.name).collect::<Vec<_>>()),
        ),
        (
            "volumes[].containerDisk.image",
            json!(vols
                .iter()
                .map(|v| v.container_disk.as_ref().and_then(|c| c.image.clone()))
                .collect::<Vec<_>>()),
        ),
        (
            "volumes[].containerDisk.path",
            json!(vols
                .iter()
                .map(|v| v.container_disk.as_ref().and_then(|c| c.path.clone()))
                .collect::<Vec<_>>()),
        ),
        (
            "volumes[].persistentVolumeClaim.claimName",
            json!(vols
                .iter()
                .map(|v| v.persistent_volume_claim.as_ref().map(|c| &c.claim_name))
                .collect::<Vec<_>>()),
        ),
        (
            "volumes[].persistentVolumeClaim.readOnly",
            json!(vols
                .iter()
                .map(|v| v.persistent_volume_claim.as_ref().and_then(|c| c.read_only))
                .collect::<Vec<_>>()),
        ),
        (
            "volumes[].cloudInitNoCloud.userData",
            ci(|c| c.user_data.clone()),
        ),
        (
            "volumes[].cloudInitNoCloud.userDataBase64",
            ci(|c| c.user_data_base64.clone()),
        ),
        (
            "volumes[].cloudInitNoCloud.networkData",
            ci(|c| c.network_data.clone()),
        ),
        (
            "volumes[].cloudInitNoCloud.networkDataBase64",
            ci(|c| c.network_data_base64.clone()),
        ),
        (
            "volumes[].cloudInitNoCloud.secretRef.name",
            ci(|c| c.secret_ref.as_ref().map(|r| r.name.clone())),
        ),
        (
            "volumes[].cloudInitNoCloud.networkDataSecretRef.name",
            ci(|c| c.network_data_secret_ref.as_ref().map(|r| r.name.clone())),
        ),
        (
            "volumes[].emptyDisk.capacity",
            json!(vols
                .iter()
                .map(|v| v.empty_disk.as_ref().map(|e| &e.capacity.0))
                .collect::<Vec<_>>()),
        ),
        (
            "terminationGracePeriodSeconds",
            json!(s.termination_grace_period_seconds),
        ),
        ("hostname", json!(s.hostname)),
        ("startStrategy", json!(s.start_strategy)),
    ])
}

/// The same fields, as the operator meant them (the CRD's types).
fn operator_view(d: &OperatorDocument) -> View {
    let s = &d.spec;
    let dom = &s.domain;
    let cpu = dom.cpu.clone().unwrap_or_default();
    let res = dom.resources.clone().unwrap_or_default();
    let quantities = |m: Option<BTreeMap<String, Quantity>>| {
        m.map(|m| {
            m.into_iter()
                .map(|(k, v)| (k, v.0))
                .collect::<BTreeMap<_, _>>()
        })
    };
    let fw = dom.firmware.clone().unwrap_or_default();
    let kb = fw.kernel_boot.clone().unwrap_or_default();
    let kc = kb.container.clone();
    let dev = dom.devices.clone().unwrap_or_default();
    let disks = &dev.disks;
    let nics = &dev.interfaces;
    let vols = &s.volumes;
    let ci = |f: fn(&microvirt_crds::vmi::CloudInitNoCloudSource) -> Option<String>| -> Value {
        json!(vols
            .iter()
            .map(|v| v.cloud_init_no_cloud.as_ref().and_then(f))
            .collect::<Vec<_>>())
    };
    BTreeMap::from([
        ("apiVersion", json!(d.api_version)),
        ("kind", json!(d.kind)),
        ("metadata.name", json!(d.metadata.name)),
        ("metadata.namespace", json!(d.metadata.namespace)),
        ("metadata.uid", json!(d.metadata.uid)),
        ("guestMemoryBytes", json!(d.guest_memory_bytes)),
        ("vcpus", json!(d.vcpus)),
        (
            "defaultKernel.kernelArgs",
            json!(d.default_kernel.as_ref().map(|k| &k.kernel_args)),
        ),
        ("domain.cpu.cores", json!(cpu.cores)),
        ("domain.cpu.sockets", json!(cpu.sockets)),
        ("domain.cpu.threads", json!(cpu.threads)),
        (
            "domain.memory.guest",
            json!(dom
                .memory
                .as_ref()
                .and_then(|m| m.guest.as_ref())
                .map(|q| &q.0)),
        ),
        ("domain.resources.requests", json!(quantities(res.requests))),
        ("domain.resources.limits", json!(quantities(res.limits))),
        ("domain.firmware.uuid", json!(fw.uuid)),
        (
            "domain.firmware.kernelBoot.kernelArgs",
            json!(kb.kernel_args),
        ),
        (
            "domain.firmware.kernelBoot.container.image",
            json!(kc.as_ref().map(|c| &c.image)),
        ),
        (
            "domain.firmware.kernelBoot.container.kernelPath",
            json!(kc.as_ref().and_then(|c| c.kernel_path.clone())),
        ),
        (
            "domain.firmware.kernelBoot.container.initrdPath",
            json!(kc.as_ref().and_then(|c| c.initrd_path.clone())),
        ),
        (
            "domain.features.acpi.enabled",
            json!(dom
                .features
                .as_ref()
                .and_then(|f| f.acpi.as_ref())
                .map(|a| a.enabled)),
        ),
        (
            "domain.devices.rng",
            json!(dev.rng.is_some().then_some(true)),
        ),
        (
            "domain.devices.disks[].name",
            json!(disks.iter().map(|d| &d.name).collect::<Vec<_>>()),
        ),
        (
            "domain.devices.disks[].disk.bus",
            json!(disks
                .iter()
                .map(|d| d.disk.as_ref().and_then(|t| t.bus).map(js))
                .collect::<Vec<_>>()),
        ),
        (
            "domain.devices.disks[].disk.readonly",
            json!(disks
                .iter()
                .map(|d| d.disk.as_ref().and_then(|t| t.readonly))
                .collect::<Vec<_>>()),
        ),
        (
            "domain.devices.disks[].serial",
            json!(disks.iter().map(|d| &d.serial).collect::<Vec<_>>()),
        ),
        (
            "domain.devices.interfaces[].name",
            json!(nics.iter().map(|i| &i.name).collect::<Vec<_>>()),
        ),
        (
            "domain.devices.interfaces[].masquerade",
            json!(nics
                .iter()
                .map(|i| i.masquerade.is_some().then_some(true))
                .collect::<Vec<_>>()),
        ),
        (
            "domain.devices.interfaces[].bridge",
            json!(nics
                .iter()
                .map(|i| i.bridge.is_some().then_some(true))
                .collect::<Vec<_>>()),
        ),
        (
            "domain.devices.interfaces[].macAddress",
            json!(nics.iter().map(|i| &i.mac_address).collect::<Vec<_>>()),
        ),
        (
            "domain.devices.interfaces[].ports[].port",
            json!(nics
                .iter()
                .map(|i| i.ports.iter().map(|p| p.port).collect::<Vec<_>>())
                .collect::<Vec<_>>()),
        ),
        (
            "domain.devices.interfaces[].ports[].protocol",
            json!(nics
                .iter()
                .map(|i| i
                    .ports
                    .iter()
                    .map(|p| p.protocol.map(js))
                    .collect::<Vec<_>>())
                .collect::<Vec<_>>()),
        ),
        (
            "networks[].name",
            json!(s.networks.iter().map(|n| &n.name).collect::<Vec<_>>()),
        ),
        (
            "volumes[].name",
            json!(vols.iter().map(|v| &v.name).collect::<Vec<_>>()),
        ),
        (
            "volumes[].containerDisk.image",
            json!(vols
                .iter()
                .map(|v| v.container_disk.as_ref().map(|c| &c.image))
                .collect::<Vec<_>>()),
        ),
        (
            "volumes[].containerDisk.path",
            json!(vols
                .iter()
                .map(|v| v.container_disk.as_ref().and_then(|c| c.path.clone()))
                .collect::<Vec<_>>()),
        ),
        (
            "volumes[].persistentVolumeClaim.claimName",
            json!(vols
                .iter()
                .map(|v| v.persistent_volume_claim.as_ref().map(|c| &c.claim_name))
                .collect::<Vec<_>>()),
        ),
        (
            "volumes[].persistentVolumeClaim.readOnly",
            json!(vols
                .iter()
                .map(|v| v.persistent_volume_claim.as_ref().and_then(|c| c.read_only))
                .collect::<Vec<_>>()),
        ),
        (
            "volumes[].cloudInitNoCloud.userData",
            ci(|c| c.user_data.clone()),
        ),
        (
            "volumes[].cloudInitNoCloud.userDataBase64",
            ci(|c| c.user_data_base64.clone()),
        ),
        (
            "volumes[].cloudInitNoCloud.networkData",
            ci(|c| c.network_data.clone()),
        ),
        (
            "volumes[].cloudInitNoCloud.networkDataBase64",
            ci(|c| c.network_data_base64.clone()),
        ),
        (
            "volumes[].cloudInitNoCloud.secretRef.name",
            ci(|c| c.secret_ref.as_ref().map(|r| r.name.clone())),
        ),
        (
            "volumes[].cloudInitNoCloud.networkDataSecretRef.name",
            ci(|c| c.network_data_secret_ref.as_ref().map(|r| r.name.clone())),
        ),
        (
            "volumes[].emptyDisk.capacity",
            json!(vols
                .iter()
                .map(|v| v.empty_disk.as_ref().map(|e| &e.capacity.0))
                .collect::<Vec<_>>()),
        ),
        (
            "terminationGracePeriodSeconds",
            json!(s.termination_grace_period_seconds),
        ),
        ("hostname", json!(s.hostname)),
        ("startStrategy", json!(s.start_strategy.map(js))),
    ])
}

/// The launcher's parse of `json` (the annotation's text) agrees with `meant` on every field
/// it reads, and on the values it derives from them.
fn assert_launcher_reads(case: &str, json: &str, meant: &OperatorDocument) {
    let doc = VmiDocument::parse(json, "vmi.json")
        .unwrap_or_else(|e| panic!("{case}: the launcher refuses the document: {e}\n{json}"));
    let (got, want) = (launcher_view(&doc), operator_view(meant));
    for (field, w) in &want {
        assert_eq!(&got[field], w, "{case}: {field}\n{json}");
    }
    assert_eq!(got.len(), want.len());
    // What the launcher derives: the operator's memory and vCPUs win over the spec's.
    let s = &meant.spec;
    assert_eq!(
        doc.guest_memory_bytes().ok(),
        meant.guest_memory_bytes,
        "{case}"
    );
    assert_eq!(doc.vcpus().ok(), meant.vcpus, "{case}");
    assert_eq!(Some(doc.name()), meant.metadata.name.as_deref(), "{case}");
    assert_eq!(
        doc.grace_period_seconds(),
        s.termination_grace_period_seconds
            .map_or(30, |g| g.max(0) as u64),
        "{case}"
    );
    assert_eq!(
        doc.start_paused(),
        s.start_strategy == Some(StartStrategy::Paused),
        "{case}"
    );
    let acpi_off = s
        .domain
        .features
        .as_ref()
        .and_then(|f| f.acpi.as_ref())
        .and_then(|a| a.enabled)
        == Some(false);
    assert_eq!(doc.acpi(), !acpi_off, "{case}");
}

/// The document the operator means for `vmi`, built from its own functions, not from the JSON.
fn meant(vmi: &VirtualMachineInstance, cfg: &Config) -> OperatorDocument {
    let m = &vmi.metadata;
    LauncherDocument::new(
        LauncherMeta::new(
            m.name.as_deref().unwrap(),
            m.namespace.as_deref().unwrap(),
            m.uid.as_deref().unwrap(),
        ),
        spec_without_cloud_init_data(&launcher_spec(vmi, cfg)),
        guest_memory_bytes(vmi, cfg).unwrap(),
        u64::from(vmi.spec.vcpus().max(1)),
        default_kernel(vmi, cfg),
    )
}

/// A VMI that sets every field the launcher reads (where the operator passes it on), built
/// from the CRD's types rather than from JSON, so that what it means does not depend on the
/// CRD's field names.
fn everything() -> VirtualMachineInstance {
    use microvirt_crds::vmi::*;
    let q = |s: &str| Quantity(s.to_string());
    let mut v = VirtualMachineInstance::new(
        "all",
        VirtualMachineInstanceSpec {
            domain: DomainSpec {
                cpu: Some(Cpu {
                    cores: Some(2),
                    sockets: Some(2),
                    threads: Some(1),
                    ..Default::default()
                }),
                memory: Some(Memory {
                    guest: Some(q("192Mi")),
                    ..Default::default()
                }),
                resources: Some(ResourceRequirements {
                    requests: Some(BTreeMap::from([
                        ("memory".to_string(), q("300Mi")),
                        ("cpu".to_string(), q("2")),
                    ])),
                    limits: Some(BTreeMap::from([("cpu".to_string(), q("4"))])),
                }),
                firmware: Some(Firmware {
                    uuid: Some("5d307ca9-b3ef-428c-8861-06e72d69f223".into()),
                    kernel_boot: Some(KernelBoot {
                        kernel_args: Some("console=ttyS0 quiet".into()),
                        container: Some(KernelBootContainer {
                            image: "registry.example/kernel:v2".into(),
                            kernel_path: Some("/boot/bzImage".into()),
                            initrd_path: Some("/boot/initrd.img".into()),
                            ..Default::default()
                        }),
                    }),
                    ..Default::default()
                }),
                features: Some(Features {
                    acpi: Some(FeatureState {
                        enabled: Some(false),
                    }),
                    ..Default::default()
                }),
                devices: Some(Devices {
                    rng: Some(Rng {}),
                    disks: vec![
                        Disk {
                            name: "root".into(),
                            disk: Some(DiskTarget {
                                bus: Some(DiskBus::Virtio),
                                readonly: None,
                            }),
                            serial: Some("root-1".into()),
                            boot_order: Some(1),
                            ..Default::default()
                        },
                        Disk {
                            name: "data".into(),
                            disk: Some(DiskTarget {
                                bus: None,
                                readonly: Some(true),
                            }),
                            ..Default::default()
                        },
                    ],
                    interfaces: vec![
                        Interface {
                            name: "net0".into(),
                            masquerade: Some(InterfaceMasquerade {}),
                            mac_address: Some("02:00:00:00:00:01".into()),
                            ports: vec![
                                Port {
                                    name: None,
                                    protocol: None,
                                    port: 22,
                                },
                                Port {
                                    name: Some("dns".into()),
                                    protocol: Some(Protocol::Udp),
                                    port: 53,
                                },
                                Port {
                                    name: None,
                                    protocol: Some(Protocol::Tcp),
                                    port: 80,
                                },
                            ],
                            ..Default::default()
                        },
                        Interface {
                            name: "net1".into(),
                            bridge: Some(InterfaceBridge {}),
                            ..Default::default()
                        },
                    ],
                    ..Default::default()
                }),
                ..Default::default()
            },
            networks: ["net0", "net1"]
                .map(|n| Network {
                    name: n.into(),
                    pod: Some(PodNetwork::default()),
                    ..Default::default()
                })
                .into(),
            volumes: vec![
                Volume {
                    name: "root".into(),
                    container_disk: Some(ContainerDiskSource {
                        image: "example/disk:2".into(),
                        path: Some("/disk/root.qcow2".into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                Volume {
                    name: "data".into(),
                    persistent_volume_claim: Some(PersistentVolumeClaimSource {
                        claim_name: "data-claim".into(),
                        read_only: Some(true),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                Volume {
                    name: "scratch".into(),
                    empty_disk: Some(EmptyDiskSource { capacity: q("2Gi") }),
                    ..Default::default()
                },
                Volume {
                    name: "seed".into(),
                    cloud_init_no_cloud: Some(CloudInitNoCloudSource {
                        secret_ref: Some(SecretRef {
                            name: "user-secret".into(),
                        }),
                        network_data_secret_ref: Some(SecretRef {
                            name: "net-secret".into(),
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                Volume {
                    name: "inline".into(),
                    cloud_init_no_cloud: Some(CloudInitNoCloudSource {
                        user_data: Some("#cloud-config\n".into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ],
            termination_grace_period_seconds: Some(12),
            hostname: Some("all-host".into()),
            start_strategy: Some(StartStrategy::Paused),
            ..Default::default()
        },
    );
    v.metadata.namespace = Some("ns2".into());
    v.metadata.uid = Some("uid-all".into());
    v
}

/// Every `microvirt.io/vmi-spec` annotation in the golden fixture, with its case.
fn fixture_documents() -> Vec<(String, String)> {
    let text = include_str!("testdata/launcher-pods.txt");
    let mut docs = Vec::new();
    let mut case = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if let Some(c) = line.strip_prefix("=== ") {
            case = c.to_string();
        } else if line == "--- pod" {
            let mut body = String::new();
            while let Some(l) = lines.next_if(|l| !l.starts_with("=== ") && !l.starts_with("--- "))
            {
                body.push_str(l);
                body.push('\n');
            }
            let pod: Value = serde_json::from_str(&body)
                .unwrap_or_else(|e| panic!("{case}: the fixture's pod is no JSON: {e}"));
            let doc = pod["metadata"]["annotations"][ANNOTATION_VMI_SPEC]
                .as_str()
                .unwrap_or_else(|| panic!("{case}: no {ANNOTATION_VMI_SPEC}"));
            docs.push((case.clone(), doc.to_string()));
        }
    }
    docs
}

/// The documents rendered now: `(case, JSON, what the operator meant)`.
fn rendered_documents() -> Vec<(String, String, OperatorDocument)> {
    let mut cases = super::golden::cases();
    cases.push((
        "every field the launcher reads",
        everything(),
        Config::default(),
        BlockVolumes::from(["data".to_string()]),
    ));
    cases
        .into_iter()
        .filter_map(|(case, vmi, cfg, block)| {
            // The golden cases the operator refuses render no document.
            let pod = desired_pod(&vmi, &cfg, &block).ok()?;
            let json = pod.metadata.annotations.as_ref()?[ANNOTATION_VMI_SPEC].clone();
            Some((case.to_string(), json, meant(&vmi, &cfg)))
        })
        .collect()
}

#[test]
fn the_launcher_reads_what_the_operator_writes() {
    let rendered = rendered_documents();
    assert_eq!(
        rendered.len(),
        18,
        "the golden cases that render a pod, and one more"
    );
    for (case, json, meant) in &rendered {
        // The operator's own types read back what it meant (no field lost on its side).
        let back: OperatorDocument = serde_json::from_str(json).unwrap();
        assert_eq!(
            &back, meant,
            "{case}: the operator's types read back another document"
        );
        assert_launcher_reads(case, json, meant);
    }
}

#[test]
fn the_launcher_reads_the_fixtures_documents() {
    let docs = fixture_documents();
    // 17 golden cases with a pod, the three pool members.
    assert_eq!(docs.len(), 20);
    assert!(docs.iter().any(|(c, _)| c.starts_with("pool member")));
    for (case, json) in &docs {
        let meant: OperatorDocument = serde_json::from_str(json)
            .unwrap_or_else(|e| panic!("{case}: the operator's types refuse the document: {e}"));
        assert_launcher_reads(case, json, &meant);
    }
}

/// Each field of the view is set in some document: a field no document sets would compare
/// equal (absent on both sides) whatever its name is on either side.
#[test]
fn every_field_is_exercised() {
    let views: Vec<View> = rendered_documents()
        .iter()
        .map(|(_, _, meant)| operator_view(meant))
        .chain(fixture_documents().iter().map(|(_, json)| {
            operator_view(&serde_json::from_str::<OperatorDocument>(json).unwrap())
        }))
        .collect();
    fn set(v: &Value) -> bool {
        match v {
            Value::Null => false,
            Value::Array(a) => a.iter().any(set),
            _ => true,
        }
    }
    // Inline cloud-init data never reaches the document (it goes to a Secret); the launcher
    // reads those fields from manifests (`virt-launcher run`) only.
    let never_written = [
        "volumes[].cloudInitNoCloud.userData",
        "volumes[].cloudInitNoCloud.userDataBase64",
        "volumes[].cloudInitNoCloud.networkData",
        "volumes[].cloudInitNoCloud.networkDataBase64",
    ];
    for field in views[0].keys() {
        let written = views.iter().any(|v| set(&v[field]));
        assert_eq!(
            written,
            !never_written.contains(field),
            "{field}: set in a document: {written}"
        );
    }
}
