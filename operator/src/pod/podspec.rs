//! The pod renderer: the launcher pod's metadata (name, labels, annotations, owner) and its
//! pod-level spec (scheduling, DNS, host name, pull Secrets, readiness gate, security).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, LocalObjectReference, PodReadinessGate, PodSecurityContext, PodSpec, SeccompProfile,
    Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use microvirt_crds::vmi::{
    VirtualMachineInstance, VirtualMachineInstanceSpec, ANNOTATION_VMI_UID, LABEL_VMI_NAME,
    POD_CONDITION_VM_RUNNING,
};

use super::{pod_name, ANNOTATION_VMI_SPEC, APP_NAME, LABEL_APP, LABEL_MANAGED_BY, LAUNCHER_GID};

/// The pod's labels: the VMI's own (so Services can select launcher pods) plus ours, which
/// win.
pub(super) fn labels(
    vmi_labels: &BTreeMap<String, String>,
    vmi_name: &str,
) -> BTreeMap<String, String> {
    let mut labels = vmi_labels.clone();
    labels.insert(LABEL_VMI_NAME.into(), vmi_name.into());
    labels.insert(LABEL_APP.into(), APP_NAME.into());
    labels.insert(LABEL_MANAGED_BY.into(), crate::config::FIELD_MANAGER.into());
    labels
}

/// The pod's metadata: named after VMI `name` in its `namespace`, owned by it (`owner`, whose
/// uid it also carries in an annotation), with the launcher document `doc_json`.
pub(super) fn metadata(
    name: &str,
    namespace: &str,
    owner: OwnerReference,
    vmi_labels: &BTreeMap<String, String>,
    doc_json: String,
) -> ObjectMeta {
    let annotations = BTreeMap::from([
        (ANNOTATION_VMI_UID.to_string(), owner.uid.clone()),
        (ANNOTATION_VMI_SPEC.to_string(), doc_json),
    ]);
    ObjectMeta {
        name: Some(pod_name(name)),
        namespace: Some(namespace.into()),
        labels: Some(labels(vmi_labels, name)),
        annotations: Some(annotations),
        owner_references: Some(vec![owner]),
        ..Default::default()
    }
}

/// The pod spec: the one `container` with `volumes`, the VMI's scheduling and DNS settings,
/// `hostname` ([`pod_hostname`]), the pull Secrets of its images, the readiness gate, and the
/// launcher's group owning the volumes.
pub(super) fn pod_spec(
    spec: &VirtualMachineInstanceSpec,
    hostname: Option<String>,
    container: Container,
    volumes: Vec<Volume>,
) -> PodSpec {
    PodSpec {
        containers: vec![container],
        restart_policy: Some("Never".into()),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        termination_grace_period_seconds: Some(spec.termination_grace_period_seconds.unwrap_or(30)),
        node_selector: spec.node_selector.clone(),
        priority_class_name: spec.priority_class_name.clone(),
        hostname,
        subdomain: spec.subdomain.clone(),
        scheduler_name: spec.scheduler_name.clone(),
        image_pull_secrets: image_pull_secrets(spec),
        dns_policy: spec.dns_policy.map(|p| p.as_str().to_string()),
        dns_config: spec.dns_config.clone(),
        tolerations: spec.tolerations.clone(),
        affinity: spec.affinity.clone(),
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

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{desired_pod, BlockVolumes, PodError};
    use super::*;
    use crate::config::Config;
    use microvirt_crds::refusals;
    use microvirt_crds::vmi::{Devices, Disk, Volume as VmiVolume};

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

    #[test]
    fn our_labels_win_over_the_vmis() {
        let vmi_labels = BTreeMap::from([
            ("app".to_string(), "web".to_string()),
            (LABEL_APP.to_string(), "user-value".to_string()),
            (LABEL_VMI_NAME.to_string(), "other".to_string()),
        ]);
        assert_eq!(
            labels(&vmi_labels, "vm1"),
            BTreeMap::from([
                ("app".to_string(), "web".to_string()),
                (LABEL_APP.to_string(), APP_NAME.to_string()),
                (
                    LABEL_MANAGED_BY.to_string(),
                    crate::config::FIELD_MANAGER.to_string()
                ),
                (LABEL_VMI_NAME.to_string(), "vm1".to_string()),
            ])
        );
    }
}
