//! The launcher pods (and cloud-init Secrets) of a varied set of VMIs, pool members included,
//! rendered and compared byte for byte with `testdata/launcher-pods.txt`, which holds what the
//! operator produced when the file was last written. A change to the rendered pod shows here
//! as a diff of that file; when the change is meant, rewrite it with
//! `MICROVIRT_BLESS_PODS=1 cargo test -p microvirt-operator --lib pod::golden` and review the
//! diff.

use std::fmt::Write as _;

use microvirt_crds::pool::MemberRole;
use microvirt_crds::vmi::VirtualMachineInstance;
use serde_json::json;

use super::{cloud_init_secret, desired_pod, BlockVolumes};
use crate::config::{Config, DefaultBinding, KvmMode};
use crate::pool::members::{effective_template, member_pod};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/src/pod/testdata/launcher-pods.txt"
);

/// A VMI named `name` in namespace `ns` with uid `uid-<name>`, the given labels, annotations
/// and spec (JSON, as in a manifest).
fn vmi(name: &str, labels: serde_json::Value, spec: serde_json::Value) -> VirtualMachineInstance {
    vmi_annotated(name, labels, json!({}), spec)
}

fn vmi_annotated(
    name: &str,
    labels: serde_json::Value,
    annotations: serde_json::Value,
    spec: serde_json::Value,
) -> VirtualMachineInstance {
    serde_json::from_value(json!({
        "apiVersion": "microvirt.io/v1alpha1",
        "kind": "VirtualMachineInstance",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": format!("uid-{name}"),
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec,
    }))
    .unwrap_or_else(|e| panic!("VMI {name}: {e}"))
}

fn root_disk() -> serde_json::Value {
    json!({"name": "root", "containerDisk": {"image": "example/disk:1"}})
}

/// `(case, VMI, config, block volumes)`.
pub(super) fn cases() -> Vec<(&'static str, VirtualMachineInstance, Config, BlockVolumes)> {
    let none = BlockVolumes::new;
    let d = Config::default;
    vec![
        (
            "minimal",
            vmi("min", json!({}), json!({"domain": {}})),
            d(),
            none(),
        ),
        (
            "container disk and empty disk, topology, user labels",
            vmi(
                "vm1",
                json!({"app": "web", "app.kubernetes.io/name": "user-value"}),
                json!({
                    "domain": {
                        "cpu": {"cores": 2, "sockets": 1, "threads": 1},
                        "memory": {"guest": "256Mi"},
                    },
                    "volumes": [
                        root_disk(),
                        {"name": "scratch", "emptyDisk": {"capacity": "1Gi"}},
                    ],
                    "terminationGracePeriodSeconds": 7,
                }),
            ),
            d(),
            none(),
        ),
        (
            "host path mode, default memory, custom config",
            vmi(
                "hp",
                json!({}),
                json!({"domain": {}, "volumes": [root_disk()]}),
            ),
            Config {
                kvm_mode: KvmMode::HostPath,
                launcher_memory_overhead: 64 << 20,
                launcher_image: "registry.example/launcher:7".into(),
                cpu_request_millis_per_vcpu: 250,
                launcher_scratch: 10 << 20,
                container_disk_overlay: 1 << 30,
                default_guest_memory: 512 << 20,
                ..d()
            },
            none(),
        ),
        (
            "cloud-init: inline, secret refs, base64",
            vmi(
                "ci",
                json!({}),
                json!({
                    "domain": {"memory": {"guest": "64Mi"}},
                    "volumes": [
                        root_disk(),
                        {"name": "seed", "cloudInitNoCloud": {
                            "userData": "#cloud-config\npassword: hunter2\n",
                            "networkData": "version: 2\n",
                        }},
                        {"name": "other", "cloudInitNoCloud": {
                            "secretRef": {"name": "my-user-data"},
                            "networkDataSecretRef": {"name": "my-net-data"},
                        }},
                        {"name": "b64", "cloudInitNoCloud": {
                            "userDataBase64": "aGk=",
                            "networkDataBase64": "dmVyc2lvbjogMgo=",
                        }},
                        {"name": "mixed", "cloudInitNoCloud": {
                            "secretRef": {"name": "mixed-user"},
                            "networkData": "version: 1\n",
                        }},
                    ],
                }),
            ),
            d(),
            none(),
        ),
        (
            "persistent volume claims, block and file system",
            vmi(
                "pvc",
                json!({}),
                json!({
                    "domain": {"memory": {"guest": "1Gi"}, "devices": {"disks": [
                        {"name": "files", "disk": {"bus": "virtio"}},
                        {"name": "fast", "serial": "f1"},
                    ]}},
                    "volumes": [
                        {"name": "fast", "persistentVolumeClaim": {"claimName": "fast-claim"}},
                        {"name": "files", "persistentVolumeClaim": {
                            "claimName": "files-claim", "readOnly": true,
                        }},
                        {"name": "ro-block", "persistentVolumeClaim": {
                            "claimName": "ro-claim", "readOnly": true,
                        }},
                    ],
                }),
            ),
            d(),
            BlockVolumes::from(["fast".to_string(), "ro-block".to_string()]),
        ),
        (
            "kernel boot image, pull policies and secrets",
            vmi(
                "kb",
                json!({}),
                json!({
                    "domain": {
                        "memory": {"guest": "128Mi"},
                        "firmware": {"kernelBoot": {
                            "kernelArgs": "console=ttyS0",
                            "container": {
                                "image": "registry.example/kernel:v1",
                                "kernelPath": "/boot/vmlinux",
                                "initrdPath": "/boot/initrd",
                                "imagePullPolicy": "Always",
                                "imagePullSecret": "kernel-cred",
                            },
                        }},
                        "devices": {"disks": [
                            {"name": "b", "disk": {"readonly": true}},
                        ]},
                    },
                    "volumes": [
                        {"name": "a", "containerDisk": {
                            "image": "registry.example/a:v1",
                            "imagePullSecret": "regcred",
                            "imagePullPolicy": "IfNotPresent",
                        }},
                        {"name": "b", "containerDisk": {
                            "image": "registry.example/b:v1",
                            "imagePullPolicy": "Never",
                        }},
                        {"name": "c", "containerDisk": {
                            "image": "registry.example/c:v1",
                            "imagePullSecret": "regcred",
                        }},
                    ],
                }),
            ),
            d(),
            none(),
        ),
        (
            "kernel arguments without a kernel image",
            vmi(
                "kargs",
                json!({}),
                json!({
                    "domain": {"firmware": {"kernelBoot": {"kernelArgs": "quiet"}}},
                    "volumes": [root_disk()],
                }),
            ),
            d(),
            none(),
        ),
        (
            "no default kernel image configured",
            vmi(
                "nokernel",
                json!({}),
                json!({"domain": {}, "volumes": [root_disk()]}),
            ),
            Config {
                default_kernel_image: None,
                ..d()
            },
            none(),
        ),
        (
            "default interface: bridge",
            vmi(
                "br",
                json!({}),
                json!({"domain": {}, "volumes": [root_disk()]}),
            ),
            Config {
                default_network_interface: DefaultBinding::Bridge,
                ..d()
            },
            none(),
        ),
        (
            "declared interfaces and networks",
            vmi(
                "nics",
                json!({}),
                json!({
                    "domain": {"devices": {"interfaces": [
                        {"name": "net0", "bridge": {}},
                        {"name": "net1", "masquerade": {},
                         "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
                    ]}},
                    "networks": [
                        {"name": "net0", "pod": {}},
                        {"name": "net1", "pod": {}},
                    ],
                    "volumes": [root_disk()],
                }),
            ),
            d(),
            none(),
        ),
        (
            "no pod interface (autoattachPodInterface: false)",
            vmi(
                "noauto",
                json!({}),
                json!({
                    "domain": {"devices": {"autoattachPodInterface": false}},
                    "volumes": [root_disk()],
                }),
            ),
            d(),
            none(),
        ),
        (
            "scheduling, dns, host name and boot order",
            vmi(
                "sched",
                json!({"tier": "db"}),
                json!({
                    "domain": {"devices": {"disks": [
                        {"name": "scratch"},
                        {"name": "root", "bootOrder": 1},
                    ]}},
                    "volumes": [
                        root_disk(),
                        {"name": "scratch", "emptyDisk": {"capacity": "100Mi"}},
                    ],
                    "nodeSelector": {"kubernetes.io/arch": "amd64"},
                    "tolerations": [{"key": "dedicated", "operator": "Equal",
                                     "value": "vms", "effect": "NoSchedule"}],
                    "affinity": {"nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [{"matchExpressions": [
                                {"key": "zone", "operator": "In", "values": ["a"]},
                            ]}],
                        },
                    }},
                    "priorityClassName": "high",
                    "schedulerName": "other",
                    "dnsPolicy": "None",
                    "dnsConfig": {
                        "nameservers": ["192.0.2.53"],
                        "searches": ["example.internal"],
                        "options": [{"name": "ndots", "value": "2"}],
                    },
                    "hostname": "db-0",
                    "subdomain": "web",
                }),
            ),
            d(),
            none(),
        ),
        (
            "a name that is no DNS label",
            vmi(
                "a.b",
                json!({}),
                json!({"domain": {}, "subdomain": "s", "volumes": [root_disk()]}),
            ),
            d(),
            none(),
        ),
        (
            "dedicated CPUs with an emulator thread",
            vmi(
                "pinned",
                json!({}),
                json!({
                    "domain": {
                        "cpu": {"cores": 2, "dedicatedCpuPlacement": true,
                                "isolateEmulatorThread": true},
                        "memory": {"guest": "64Mi"},
                    },
                    "volumes": [root_disk()],
                }),
            ),
            d(),
            none(),
        ),
        (
            "cpu resources without a topology",
            vmi(
                "cpures",
                json!({}),
                json!({
                    "domain": {"resources": {
                        "requests": {"cpu": "1500m", "memory": "300Mi"},
                        "limits": {"cpu": "3"},
                    }},
                    "volumes": [root_disk()],
                }),
            ),
            d(),
            none(),
        ),
        (
            "readiness and liveness probes",
            vmi(
                "probed",
                json!({"app": "web"}),
                json!({
                    "domain": {},
                    "readinessProbe": {
                        "httpGet": {"port": 80, "path": "/healthz"},
                        "initialDelaySeconds": 10, "periodSeconds": 5,
                        "timeoutSeconds": 2, "successThreshold": 2, "failureThreshold": 3
                    },
                    "livenessProbe": {
                        "tcpSocket": {"port": 22},
                        "initialDelaySeconds": 60, "periodSeconds": 20, "failureThreshold": 6
                    }
                }),
            ),
            d(),
            none(),
        ),
        (
            "bad emptyDisk capacity",
            vmi(
                "badcap",
                json!({}),
                json!({"domain": {}, "volumes": [
                    {"name": "scratch", "emptyDisk": {"capacity": "lots"}},
                ]}),
            ),
            d(),
            none(),
        ),
        (
            "bad memory",
            vmi(
                "badmem",
                json!({}),
                json!({"domain": {"memory": {"guest": "lots"}}}),
            ),
            d(),
            none(),
        ),
        (
            "bad base64 cloud-init data",
            vmi(
                "bad64",
                json!({}),
                json!({"domain": {}, "volumes": [
                    {"name": "seed", "cloudInitNoCloud": {"userDataBase64": "not base64!"}},
                ]}),
            ),
            d(),
            none(),
        ),
        (
            "hook sidecars",
            vmi_annotated(
                "hooks",
                json!({}),
                json!({"hooks.kubevirt.io/hookSidecars": "[]"}),
                json!({"domain": {}}),
            ),
            d(),
            none(),
        ),
    ]
}

fn render_json<T: serde::Serialize>(out: &mut String, what: &str, v: &T) {
    writeln!(out, "--- {what}").unwrap();
    out.push_str(&serde_json::to_string_pretty(v).unwrap());
    out.push('\n');
}

fn render_error(out: &mut String, what: &str, e: &dyn std::fmt::Display) {
    writeln!(out, "--- {what}: error: {e}").unwrap();
}

/// Everything the fixture holds, as the code renders it now.
fn render_all() -> String {
    let mut out = String::new();
    for (case, vmi, cfg, block) in cases() {
        writeln!(out, "=== {case}").unwrap();
        match desired_pod(&vmi, &cfg, &block) {
            Ok(pod) => render_json(&mut out, "pod", &pod),
            Err(e) => render_error(&mut out, "pod", &e),
        }
        match cloud_init_secret(&vmi) {
            Ok(Some(secret)) => render_json(&mut out, "cloud-init secret", &secret),
            Ok(None) => {}
            Err(e) => render_error(&mut out, "cloud-init secret", &e),
        }
    }
    // Pool members are launcher pods too (desired_pod plus the pool's changes).
    let mut pool = crate::pool::members::tests::pool();
    pool.spec.template.spec = serde_json::from_value(json!({
        "domain": {"memory": {"guest": "96Mi"}, "cpu": {"cores": 1}},
        "volumes": [root_disk()],
    }))
    .unwrap();
    let tmpl = effective_template(&pool, []).unwrap();
    for (role, node) in [
        (MemberRole::Builder, None),
        (MemberRole::Warm, Some("node-a")),
        (MemberRole::Claimed, Some("node-b")),
    ] {
        writeln!(out, "=== pool member {role:?}").unwrap();
        let pod = member_pod(&pool, &tmpl, role, "snap-1", node, &Config::default()).unwrap();
        render_json(&mut out, "pod", &pod);
    }
    out
}

#[test]
fn rendered_launcher_pods_match_the_fixture() {
    let now = render_all();
    if std::env::var_os("MICROVIRT_BLESS_PODS").is_some() {
        std::fs::write(FIXTURE, &now).unwrap();
        return;
    }
    let want = std::fs::read_to_string(FIXTURE).unwrap();
    if now != want {
        // The first differing line, with its case, before the whole comparison fails.
        let mut case = "";
        for (i, (a, b)) in now.lines().zip(want.lines()).enumerate() {
            if a.starts_with("=== ") {
                case = a;
            }
            assert_eq!(a, b, "{case}: line {} of {FIXTURE} differs", i + 1);
        }
        assert_eq!(
            now.lines().count(),
            want.lines().count(),
            "{FIXTURE}: the number of lines differs"
        );
        panic!("{FIXTURE} differs");
    }
}
