//! What a pool creates (pure): its effective template and hash, builder and warm launcher pods,
//! the VMIs of its replicas, and the patch that turns a warm member into a replica's pod.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, EnvVar, HostPathVolumeSource, NodeAffinity, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, Pod, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};
use microvirt_crds::control::{
    self, ControlCommand, ControlOutcome, ControlRequest, ControlResult,
};
use microvirt_crds::pool::{
    MemberRole, ANNOTATION_CLAIMED_FROM, ANNOTATION_POOL_UID, LABEL_POOL, LABEL_POOL_ROLE,
    LABEL_SNAPSHOT, LABEL_TEMPLATE_HASH,
};
use microvirt_crds::vmi::{
    ANNOTATION_CONTROL_REQUEST, ANNOTATION_CONTROL_RESULT, ANNOTATION_PRESETS_APPLIED,
    ANNOTATION_VMI_UID, FINALIZER_LAUNCHER_POD, LABEL_VMI_NAME,
};
use microvirt_crds::{
    VirtualMachineInstance, VirtualMachineInstancePreset, VirtualMachineInstanceSpec,
    VirtualMachinePool,
};
use serde_json::{json, Value};

use crate::config::{Config, FIELD_MANAGER};
use crate::pod::{
    desired_pod, BlockVolumes, PodError, APP_NAME, COMPUTE_CONTAINER, LABEL_APP, LABEL_MANAGED_BY,
};
use crate::vmi::preset::{self, PresetError};

pub use microvirt_crds::pool::{SNAPSHOT_MOUNT, SNAPSHOT_ROOT};
/// Name of the snapshot volume in builder and warm pods.
pub const SNAPSHOT_VOLUME: &str = "snapshot";
/// Environment of a warm pod's launcher: restore this snapshot instead of booting.
pub const ENV_RESTORE: &str = "MICROVIRT_RESTORE";
/// Environment of a warm pod's launcher: keep the restored VM paused until `unpause`.
pub const ENV_RESTORE_PAUSED: &str = "MICROVIRT_RESTORE_PAUSED";
/// Prefix of every launcher pod name.
pub const POD_PREFIX: &str = "virt-launcher-";

/// The template as the pool's members run it: presets applied, and its hash.
#[derive(Clone, Debug, PartialEq)]
pub struct EffectiveTemplate {
    /// The VMI spec (template spec with matching presets applied).
    pub spec: VirtualMachineInstanceSpec,
    /// Labels of the pool's VMIs.
    pub labels: BTreeMap<String, String>,
    /// Annotations of the pool's VMIs.
    pub annotations: BTreeMap<String, String>,
    /// Presets applied (name order).
    pub presets: Vec<String>,
    /// `(preset, field)` pairs not applied because the template sets another value.
    pub conflicts: Vec<(String, String)>,
    /// Hash of spec, labels and annotations (10 hex digits).
    pub hash: String,
}

/// The pool's template with the presets of its namespace that match the template's labels.
pub fn effective_template<'a>(
    pool: &VirtualMachinePool,
    presets: impl IntoIterator<Item = &'a VirtualMachineInstancePreset>,
) -> Result<EffectiveTemplate, PresetError> {
    let template = pool.spec.vmi_template();
    let labels = template.labels();
    let annotations = template.annotations();
    let mut spec = template.spec.clone();
    let matched = preset::matching(presets, &labels);
    let (names, conflicts) = if matched.is_empty() {
        (vec![], vec![])
    } else {
        let outcome = preset::apply(&spec.domain, &matched)?;
        spec.domain = outcome.domain;
        (outcome.applied, outcome.conflicts)
    };
    let hash = template_hash(&spec, &labels, &annotations);
    Ok(EffectiveTemplate {
        spec,
        labels,
        annotations,
        presets: names,
        conflicts,
        hash,
    })
}

/// FNV-1a, 64 bit: a stable hash (Rust's `DefaultHasher` may change between releases, and the
/// hash names snapshots on disk).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Hash of what a member is made from: 10 hex digits.
pub fn template_hash(
    spec: &VirtualMachineInstanceSpec,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> String {
    // Struct fields serialize in declaration order and maps are BTreeMaps: the text is stable.
    let text = serde_json::to_string(&json!({
        "spec": spec,
        "labels": labels,
        "annotations": annotations,
    }))
    .unwrap_or_default();
    format!("{:016x}", fnv1a(text.as_bytes()))[..10].to_string()
}

/// A pseudo-random but reproducible order key (for `sortPolicy: Random`).
pub fn shuffle_key(name: &str, salt: u64) -> u64 {
    fnv1a(format!("{salt}/{name}").as_bytes())
}

/// `<template hash>-<attempt>`.
pub fn snapshot_id(hash: &str, attempt: i32) -> String {
    format!("{hash}-{attempt}")
}

/// The node directory of a snapshot.
pub fn snapshot_host_dir(pool_uid: &str, snapshot_id: &str) -> String {
    format!("{SNAPSHOT_ROOT}/{pool_uid}/{snapshot_id}")
}

/// Name of the builder pod of a snapshot.
pub fn builder_pod_name(pool: &str, snapshot_id: &str) -> String {
    format!("{POD_PREFIX}{pool}-snap-{snapshot_id}")
}

/// The VMI name a warm member's pod becomes (`virt-launcher-<vmi>`), if it has the prefix.
pub fn vmi_name_of_pod(pod_name: &str) -> Option<&str> {
    pod_name.strip_prefix(POD_PREFIX).filter(|n| !n.is_empty())
}

/// The id of a claim's control request.
pub fn claim_request_id(vmi_uid: &str) -> String {
    format!("claim-{vmi_uid}")
}

/// The id of a snapshot's control request.
pub fn snapshot_request_id(snapshot_id: &str) -> String {
    format!("snap-{snapshot_id}")
}

/// What the node agent answered to control request `id` on `pod`: `None` while unanswered,
/// `Some(Ok(detail))` (text after `ok`, possibly empty) or `Some(Err(message))`.
pub fn control_result(pod: &Pod, id: &str) -> Option<Result<String, String>> {
    let r = ControlResult::parse(pod.annotations().get(ANNOTATION_CONTROL_RESULT)?).ok()?;
    if r.id != id {
        return None;
    }
    Some(match r.outcome {
        ControlOutcome::Ok(detail) => Ok(detail.unwrap_or_default()),
        ControlOutcome::Error(msg) if msg.is_empty() => {
            Err("the node agent reported an error".into())
        }
        ControlOutcome::Error(msg) => Err(msg),
    })
}

/// The id of the control request on `pod`, if any (also of a malformed one, which the node
/// agent answers under that id).
pub fn control_request_id(pod: &Pod) -> Option<&str> {
    control::id_of(pod.annotations().get(ANNOTATION_CONTROL_REQUEST)?)
}

/// The role label of a pod.
pub fn role(pod: &Pod) -> Option<MemberRole> {
    pod.labels()
        .get(LABEL_POOL_ROLE)
        .and_then(|r| MemberRole::parse(r))
}

/// Whether `pod` is a builder or warm pod of `pool` (label and uid annotation).
pub fn pod_of_pool(pod: &Pod, pool: &VirtualMachinePool) -> bool {
    let (Some(uid), Some(name)) = (pool.meta().uid.as_deref(), pool.meta().name.as_deref()) else {
        return false;
    };
    pod.labels().get(LABEL_POOL).map(String::as_str) == Some(name)
        && pod
            .annotations()
            .get(ANNOTATION_POOL_UID)
            .map(String::as_str)
            == Some(uid)
}

/// Whether `vmi` is controlled by `pool` and matches its selector.
pub fn vmi_of_pool(vmi: &VirtualMachineInstance, pool: &VirtualMachinePool) -> bool {
    let Some(uid) = pool.meta().uid.as_deref() else {
        return false;
    };
    vmi.owner_references()
        .iter()
        .any(|o| o.uid == uid && o.controller == Some(true))
        && crate::selector::matches(&pool.spec.selector, vmi.labels())
}

/// Labels we own on a launcher pod; a template label with one of these keys is not copied.
fn reserved_label(k: &str) -> bool {
    k == LABEL_APP || k == LABEL_MANAGED_BY || k.starts_with("microvirt.io/")
}

/// A builder or warm launcher pod of `pool` (created with POST; a warm pod has
/// `generateName: virt-launcher-<pool>-`, a builder a fixed name).
///
/// It is the pod a VMI of the template would get (`crate::pod::desired_pod`), with: the pool
/// as controller owner; none of the template's labels (a Service selecting the pool's VMIs
/// must not reach a member before it is claimed); the snapshot directory mounted (read-write
/// for the builder, read-only for warm members); warm members restore it paused and only run
/// on `node`, where it lives.
pub fn member_pod(
    pool: &VirtualMachinePool,
    tmpl: &EffectiveTemplate,
    role: MemberRole,
    snapshot_id: &str,
    node: Option<&str>,
    cfg: &Config,
) -> Result<Pod, PodError> {
    let pool_name = pool
        .meta()
        .name
        .as_deref()
        .ok_or(PodError::MissingMeta("name"))?;
    let pool_uid = pool
        .meta()
        .uid
        .as_deref()
        .ok_or(PodError::MissingMeta("uid"))?;
    // The VMI document's name is the guest's host name (DHCP): the pool's name, for every
    // member (a restored guest keeps the name it booted with anyway).
    let mut vmi = VirtualMachineInstance::new(pool_name, tmpl.spec.clone());
    // A restored guest must not keep the pod IP of the pod its snapshot was taken in: the pod
    // interface a template without interfaces gets is masquerade here, whatever the
    // operator's --default-network-interface (the CRD refuses bridge interfaces with warm).
    crate::pod::with_default_pod_interface(
        &mut vmi.spec,
        crate::config::DefaultBinding::Masquerade,
    );
    vmi.metadata.namespace = pool.namespace();
    vmi.metadata.uid = Some(pool_uid.to_string());
    // No block claims: a template with a warm section has no persistentVolumeClaim volumes
    // (refused by the CRD's rules).
    let mut pod = desired_pod(&vmi, cfg, &BlockVolumes::new())?;

    let labels = BTreeMap::from([
        (LABEL_APP.to_string(), APP_NAME.to_string()),
        (LABEL_MANAGED_BY.to_string(), FIELD_MANAGER.to_string()),
        (LABEL_POOL.to_string(), pool_name.to_string()),
        (LABEL_POOL_ROLE.to_string(), role.as_str().to_string()),
        (LABEL_TEMPLATE_HASH.to_string(), tmpl.hash.clone()),
        (LABEL_SNAPSHOT.to_string(), snapshot_id.to_string()),
    ]);
    let mut annotations = pod.metadata.annotations.take().unwrap_or_default();
    annotations.remove(ANNOTATION_VMI_UID);
    annotations.insert(ANNOTATION_POOL_UID.into(), pool_uid.into());
    pod.metadata.labels = Some(labels);
    pod.metadata.annotations = Some(annotations);
    pod.metadata.owner_references = pool.controller_owner_ref(&()).map(|o| vec![o]);
    match role {
        MemberRole::Builder => pod.metadata.name = Some(builder_pod_name(pool_name, snapshot_id)),
        MemberRole::Warm | MemberRole::Claimed => {
            pod.metadata.name = None;
            pod.metadata.generate_name = Some(format!("{POD_PREFIX}{pool_name}-"));
        }
    }

    let spec = pod.spec.get_or_insert_with(Default::default);
    let read_only = role != MemberRole::Builder;
    spec.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: SNAPSHOT_VOLUME.into(),
        host_path: Some(HostPathVolumeSource {
            path: snapshot_host_dir(pool_uid, snapshot_id),
            type_: Some(
                if read_only {
                    "Directory"
                } else {
                    "DirectoryOrCreate"
                }
                .into(),
            ),
        }),
        ..Default::default()
    });
    if let Some(c) = spec
        .containers
        .iter_mut()
        .find(|c| c.name == COMPUTE_CONTAINER)
    {
        c.volume_mounts
            .get_or_insert_with(Vec::new)
            .push(VolumeMount {
                name: SNAPSHOT_VOLUME.into(),
                mount_path: SNAPSHOT_MOUNT.into(),
                read_only: Some(read_only),
                ..Default::default()
            });
        if role != MemberRole::Builder {
            let env = c.env.get_or_insert_with(Vec::new);
            env.push(EnvVar {
                name: ENV_RESTORE.into(),
                value: Some(SNAPSHOT_MOUNT.into()),
                ..Default::default()
            });
            env.push(EnvVar {
                name: ENV_RESTORE_PAUSED.into(),
                value: Some("1".into()),
                ..Default::default()
            });
        }
    }
    if let Some(node) = node.filter(|_| role != MemberRole::Builder) {
        pin_to_node(&mut spec.affinity, node);
    }
    Ok(pod)
}

/// Adds "only on node `node`" (a `metadata.name` field requirement) to every required node
/// affinity term, keeping the template's own terms.
fn pin_to_node(affinity: &mut Option<Affinity>, node: &str) {
    let req = NodeSelectorRequirement {
        key: "metadata.name".into(),
        operator: "In".into(),
        values: Some(vec![node.to_string()]),
    };
    let na = affinity
        .get_or_insert_with(Default::default)
        .node_affinity
        .get_or_insert_with(NodeAffinity::default);
    let sel = na
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_with(|| NodeSelector {
            node_selector_terms: vec![],
        });
    if sel.node_selector_terms.is_empty() {
        sel.node_selector_terms.push(NodeSelectorTerm::default());
    }
    for t in &mut sel.node_selector_terms {
        t.match_fields
            .get_or_insert_with(Vec::new)
            .push(req.clone());
    }
}

/// A replica VMI of `pool`: the effective template (presets already applied and recorded, so
/// the VMI controller does not apply them again), the pool's labels, the pool as controller.
/// `claimed_from`: the snapshot of the warm member it takes over (its name is then fixed by
/// that member's pod name); otherwise it boots cold and gets `generateName: <pool>-`.
pub fn replica_vmi(
    pool: &VirtualMachinePool,
    tmpl: &EffectiveTemplate,
    name: Option<&str>,
    claimed_from: Option<&str>,
) -> VirtualMachineInstance {
    let pool_name = pool.name_any();
    let mut vmi = VirtualMachineInstance::new(name.unwrap_or(""), tmpl.spec.clone());
    if name.is_none() {
        vmi.metadata.name = None;
        vmi.metadata.generate_name = Some(format!("{pool_name}-"));
    }
    vmi.metadata.namespace = pool.namespace();
    let mut labels = tmpl.labels.clone();
    labels.insert(LABEL_POOL.into(), pool_name);
    labels.insert(LABEL_TEMPLATE_HASH.into(), tmpl.hash.clone());
    let mut annotations = tmpl.annotations.clone();
    annotations.insert(ANNOTATION_PRESETS_APPLIED.into(), tmpl.presets.join(","));
    if let Some(s) = claimed_from {
        annotations.insert(ANNOTATION_CLAIMED_FROM.into(), s.into());
        // The VMI controller's finalizer, set at creation: one write less on the claim path.
        vmi.metadata.finalizers = Some(vec![FINALIZER_LAUNCHER_POD.into()]);
    }
    vmi.metadata.labels = Some(labels);
    vmi.metadata.annotations = Some(annotations);
    vmi.metadata.owner_references = pool.controller_owner_ref(&()).map(|o| vec![o]);
    vmi
}

/// The merge patch that makes warm pod `pod` the launcher pod of `vmi` and asks the node agent
/// to resume it: the VMI's labels (so Services select it now) and uid, the VMI as controller
/// owner (instead of the pool), role `claimed`, and the control request `claim-<uid> unpause`.
/// `metadata.resourceVersion` makes it fail (409) if the pod changed since it was read.
pub fn claim_patch(pod: &Pod, vmi: &VirtualMachineInstance) -> Value {
    let vmi_name = vmi.name_any();
    let uid = vmi.uid().unwrap_or_default();
    let mut labels = serde_json::Map::new();
    for (k, v) in vmi.labels() {
        if !reserved_label(k) {
            labels.insert(k.clone(), json!(v));
        }
    }
    labels.insert(LABEL_VMI_NAME.into(), json!(vmi_name));
    labels.insert(LABEL_POOL_ROLE.into(), json!(MemberRole::Claimed.as_str()));
    let owner: Option<OwnerReference> = vmi.controller_owner_ref(&());
    let request = ControlRequest::new(claim_request_id(&uid), ControlCommand::Unpause);
    json!({
        "metadata": {
            "resourceVersion": pod.resource_version(),
            "labels": labels,
            "annotations": {
                ANNOTATION_VMI_UID: uid,
                ANNOTATION_CONTROL_REQUEST: request.to_string(),
            },
            "ownerReferences": owner.map(|o| vec![o]).unwrap_or_default(),
        }
    })
}

/// Whether `pod` is a warm member that `vmi` was made from and whose claim patch the cache has
/// not shown yet (the VMI controller then waits instead of treating the pod as someone else's).
pub fn awaiting_claim(pod: &Pod, vmi: &VirtualMachineInstance) -> bool {
    vmi.annotations().contains_key(ANNOTATION_CLAIMED_FROM)
        && pod.metadata.deletion_timestamp.is_none()
        && role(pod) == Some(MemberRole::Warm)
        && pod.labels().get(LABEL_POOL).is_some()
        && pod.labels().get(LABEL_POOL) == vmi.labels().get(LABEL_POOL)
}

/// Whether `pod` is a claimed member whose resume the node agent has not confirmed: the VMI is
/// not Ready until then. `Some(Err(message))` when the agent reported a failure.
pub fn resume_state(pod: &Pod) -> Option<Result<(), String>> {
    if role(pod) != Some(MemberRole::Claimed) {
        return Some(Ok(()));
    }
    let id = control_request_id(pod)?;
    control_result(pod, id).map(|r| r.map(|_| ()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use microvirt_crds::pool::{PoolVirtualMachineTemplate, WarmSpec};
    use microvirt_crds::vm::{RunStrategy, VirtualMachineSpec};
    use microvirt_crds::vmi::Memory;
    use microvirt_crds::{
        TemplateMeta, VirtualMachineInstanceTemplateSpec, VirtualMachinePoolSpec,
    };

    pub(crate) fn pool() -> VirtualMachinePool {
        let labels = BTreeMap::from([("app".to_string(), "web".to_string())]);
        let mut p = VirtualMachinePool::new(
            "web",
            VirtualMachinePoolSpec {
                replicas: Some(2),
                selector: LabelSelector {
                    match_labels: Some(labels.clone()),
                    ..Default::default()
                },
                template: VirtualMachineInstanceTemplateSpec {
                    metadata: Some(TemplateMeta {
                        labels: Some(labels),
                        annotations: None,
                    }),
                    spec: Default::default(),
                },
                warm: Some(WarmSpec::default()),
                ..Default::default()
            },
        );
        p.metadata.namespace = Some("ns".into());
        p.metadata.uid = Some("pool-uid".into());
        p
    }

    fn env(pod: &Pod) -> Vec<(String, String)> {
        pod.spec.as_ref().unwrap().containers[0]
            .env
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|e| (e.name, e.value.unwrap_or_default()))
            .collect()
    }

    #[test]
    fn template_hash_is_stable_and_follows_the_template() {
        let p = pool();
        let a = effective_template(&p, []).unwrap();
        let b = effective_template(&p, []).unwrap();
        assert_eq!(a.hash, b.hash);
        assert_eq!(a.hash.len(), 10);
        let mut q = pool();
        q.spec.template.spec.domain.memory = Some(Memory {
            guest: Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
                "256Mi".into(),
            )),
            ..Default::default()
        });
        assert_ne!(effective_template(&q, []).unwrap().hash, a.hash);
        // Replicas and warm settings are not part of what a member is made from.
        q = pool();
        q.spec.replicas = Some(9);
        q.spec.warm = None;
        assert_eq!(effective_template(&q, []).unwrap().hash, a.hash);
    }

    #[test]
    fn a_kubevirt_pool_makes_its_members_from_the_vm_templates_vmi_template() {
        let p = pool();
        let mut k = pool();
        k.spec.warm = None;
        let vmi_template = std::mem::take(&mut k.spec.template);
        k.spec.virtual_machine_template = Some(PoolVirtualMachineTemplate {
            metadata: Some(TemplateMeta {
                labels: Some(BTreeMap::from([("vm-only".into(), "x".into())])),
                annotations: None,
            }),
            spec: VirtualMachineSpec {
                run_strategy: Some(RunStrategy::Always),
                template: vmi_template,
                ..Default::default()
            },
        });
        let (a, b) = (
            effective_template(&p, []).unwrap(),
            effective_template(&k, []).unwrap(),
        );
        // The same members as the microvirt spelling; the VM's own labels go nowhere.
        assert_eq!(b.hash, a.hash);
        assert_eq!(b.labels, a.labels);
        assert_eq!(b.spec, a.spec);
    }

    #[test]
    fn warm_member_pods_restore_paused_on_the_snapshot_node_without_template_labels() {
        let p = pool();
        let t = effective_template(&p, []).unwrap();
        let pod = member_pod(
            &p,
            &t,
            MemberRole::Warm,
            "abc-1",
            Some("node-a"),
            &Config::default(),
        )
        .unwrap();
        assert_eq!(pod.metadata.name, None);
        assert_eq!(
            pod.metadata.generate_name.as_deref(),
            Some("virt-launcher-web-")
        );
        let l = pod.labels();
        assert_eq!(
            l.get("app"),
            None,
            "template labels must wait for the claim"
        );
        assert_eq!(l.get(LABEL_VMI_NAME), None);
        assert_eq!(l.get(LABEL_APP).map(String::as_str), Some(APP_NAME));
        assert_eq!(l.get(LABEL_POOL_ROLE).map(String::as_str), Some("warm"));
        assert_eq!(l.get(LABEL_SNAPSHOT).map(String::as_str), Some("abc-1"));
        assert_eq!(l.get(LABEL_TEMPLATE_HASH), Some(&t.hash));
        let a = pod.annotations();
        assert_eq!(a.get(ANNOTATION_VMI_UID), None);
        assert_eq!(
            a.get(ANNOTATION_POOL_UID).map(String::as_str),
            Some("pool-uid")
        );
        let owners = pod.owner_references();
        assert_eq!(owners.len(), 1);
        assert_eq!(owners[0].kind, "VirtualMachinePool");
        assert_eq!(owners[0].controller, Some(true));
        assert!(pod_of_pool(&pod, &p));
        assert_eq!(
            env(&pod)
                .into_iter()
                .filter(|(k, _)| k.starts_with("MICROVIRT_RESTORE"))
                .collect::<Vec<_>>(),
            vec![
                (ENV_RESTORE.to_string(), SNAPSHOT_MOUNT.to_string()),
                (ENV_RESTORE_PAUSED.to_string(), "1".to_string())
            ]
        );
        let spec = pod.spec.as_ref().unwrap();
        let vol = spec
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == SNAPSHOT_VOLUME)
            .unwrap();
        let hp = vol.host_path.as_ref().unwrap();
        assert_eq!(hp.path, "/var/lib/microvirt/snapshots/pool-uid/abc-1");
        assert_eq!(hp.type_.as_deref(), Some("Directory"));
        let m = spec.containers[0]
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.name == SNAPSHOT_VOLUME)
            .unwrap();
        assert_eq!(m.read_only, Some(true));
        let terms = &spec
            .affinity
            .as_ref()
            .unwrap()
            .node_affinity
            .as_ref()
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .as_ref()
            .unwrap()
            .node_selector_terms;
        assert_eq!(terms.len(), 1);
        let f = &terms[0].match_fields.as_ref().unwrap()[0];
        assert_eq!(
            (f.key.as_str(), f.operator.as_str(), f.values.clone()),
            ("metadata.name", "In", Some(vec!["node-a".to_string()]))
        );
    }

    #[test]
    fn builder_pods_boot_cold_and_may_write_the_snapshot() {
        let mut p = pool();
        // A template that pins itself keeps its own terms; the builder is not pinned further.
        p.spec.template.spec.node_selector =
            Some(BTreeMap::from([("disk".to_string(), "ssd".to_string())]));
        let t = effective_template(&p, []).unwrap();
        let pod = member_pod(
            &p,
            &t,
            MemberRole::Builder,
            "abc-2",
            None,
            &Config::default(),
        )
        .unwrap();
        assert_eq!(
            pod.metadata.name.as_deref(),
            Some("virt-launcher-web-snap-abc-2")
        );
        assert!(env(&pod)
            .iter()
            .all(|(k, _)| !k.starts_with("MICROVIRT_RESTORE")));
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(
            spec.node_selector.as_ref().unwrap().get("disk").unwrap(),
            "ssd"
        );
        assert!(spec.affinity.is_none());
        let vol = spec
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == SNAPSHOT_VOLUME)
            .unwrap();
        assert_eq!(
            vol.host_path.as_ref().unwrap().type_.as_deref(),
            Some("DirectoryOrCreate")
        );
    }

    #[test]
    fn node_pin_is_added_to_every_required_term() {
        let mut aff = Some(Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: vec![
                        NodeSelectorTerm {
                            match_expressions: Some(vec![NodeSelectorRequirement {
                                key: "zone".into(),
                                operator: "In".into(),
                                values: Some(vec!["a".into()]),
                            }]),
                            ..Default::default()
                        },
                        NodeSelectorTerm::default(),
                    ],
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        pin_to_node(&mut aff, "n1");
        let terms = aff
            .unwrap()
            .node_affinity
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .unwrap()
            .node_selector_terms;
        assert_eq!(terms.len(), 2);
        for t in &terms {
            assert_eq!(
                t.match_fields.as_ref().unwrap()[0].values,
                Some(vec!["n1".into()])
            );
        }
        assert_eq!(terms[0].match_expressions.as_ref().unwrap()[0].key, "zone");
    }

    #[test]
    fn replica_vmis_and_the_claim_patch() {
        let p = pool();
        let t = effective_template(&p, []).unwrap();
        let cold = replica_vmi(&p, &t, None, None);
        assert_eq!(cold.metadata.name, None);
        assert_eq!(cold.metadata.generate_name.as_deref(), Some("web-"));
        assert!(cold.metadata.finalizers.is_none());
        assert!(vmi_of_pool(&cold, &p));
        let mut claimed = replica_vmi(&p, &t, Some("web-x7k2p"), Some("abc-1"));
        assert_eq!(claimed.name_any(), "web-x7k2p");
        assert_eq!(
            claimed
                .annotations()
                .get(ANNOTATION_CLAIMED_FROM)
                .map(String::as_str),
            Some("abc-1")
        );
        assert_eq!(
            claimed
                .annotations()
                .get(ANNOTATION_PRESETS_APPLIED)
                .map(String::as_str),
            Some("")
        );
        assert_eq!(
            claimed.metadata.finalizers,
            Some(vec!["microvirt.io/launcher-pod".to_string()])
        );
        assert_eq!(claimed.labels().get("app").map(String::as_str), Some("web"));
        assert_eq!(
            claimed.labels().get(LABEL_POOL).map(String::as_str),
            Some("web")
        );
        claimed.metadata.uid = Some("vmi-uid".into());

        let mut pod = member_pod(
            &p,
            &t,
            MemberRole::Warm,
            "abc-1",
            Some("n"),
            &Config::default(),
        )
        .unwrap();
        pod.metadata.name = Some("virt-launcher-web-x7k2p".into());
        pod.metadata.resource_version = Some("42".into());
        assert!(awaiting_claim(&pod, &claimed));
        let patch = claim_patch(&pod, &claimed);
        let m = &patch["metadata"];
        assert_eq!(m["resourceVersion"], "42");
        assert_eq!(m["labels"]["app"], "web");
        assert_eq!(m["labels"][LABEL_VMI_NAME], "web-x7k2p");
        assert_eq!(m["labels"][LABEL_POOL_ROLE], "claimed");
        assert!(
            m["labels"].get(LABEL_POOL).is_none(),
            "pool labels are ours, not copied"
        );
        assert_eq!(m["annotations"][ANNOTATION_VMI_UID], "vmi-uid");
        assert_eq!(
            m["annotations"][ANNOTATION_CONTROL_REQUEST],
            "claim-vmi-uid unpause"
        );
        assert_eq!(m["ownerReferences"][0]["kind"], "VirtualMachineInstance");
        assert_eq!(m["ownerReferences"][0]["uid"], "vmi-uid");
        assert_eq!(m["ownerReferences"].as_array().unwrap().len(), 1);
        assert_eq!(
            vmi_name_of_pod("virt-launcher-web-x7k2p"),
            Some("web-x7k2p")
        );
        assert_eq!(vmi_name_of_pod("other"), None);
    }

    fn with_annotations(pairs: &[(&str, &str)], role: MemberRole) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.labels = Some(BTreeMap::from([(
            LABEL_POOL_ROLE.to_string(),
            role.as_str().to_string(),
        )]));
        pod.metadata.annotations = Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        pod
    }

    #[test]
    fn control_results_and_resume_state() {
        let p = with_annotations(
            &[(
                ANNOTATION_CONTROL_RESULT,
                "snap-a-1 ok cpu=X/1/2/3 kernel=6.1",
            )],
            MemberRole::Builder,
        );
        assert_eq!(
            control_result(&p, "snap-a-1"),
            Some(Ok("cpu=X/1/2/3 kernel=6.1".to_string()))
        );
        assert_eq!(control_result(&p, "snap-a"), None, "ids must match whole");
        assert_eq!(control_result(&p, "other"), None);
        let p = with_annotations(
            &[(ANNOTATION_CONTROL_RESULT, "snap-a-1 error disk full")],
            MemberRole::Builder,
        );
        assert_eq!(
            control_result(&p, "snap-a-1"),
            Some(Err("disk full".to_string()))
        );
        let p = with_annotations(&[(ANNOTATION_CONTROL_RESULT, "x ok")], MemberRole::Builder);
        assert_eq!(control_result(&p, "x"), Some(Ok(String::new())));

        // Not a claimed member: nothing to wait for.
        assert_eq!(
            resume_state(&with_annotations(&[], MemberRole::Warm)),
            Some(Ok(()))
        );
        let req = (ANNOTATION_CONTROL_REQUEST, "claim-u unpause");
        assert_eq!(
            resume_state(&with_annotations(&[req], MemberRole::Claimed)),
            None
        );
        assert_eq!(
            resume_state(&with_annotations(
                &[req, (ANNOTATION_CONTROL_RESULT, "claim-u ok")],
                MemberRole::Claimed
            )),
            Some(Ok(()))
        );
        assert_eq!(
            resume_state(&with_annotations(
                &[req, (ANNOTATION_CONTROL_RESULT, "claim-old ok")],
                MemberRole::Claimed
            )),
            None
        );
        assert_eq!(
            resume_state(&with_annotations(
                &[
                    req,
                    (ANNOTATION_CONTROL_RESULT, "claim-u error launcher gone")
                ],
                MemberRole::Claimed
            )),
            Some(Err("launcher gone".to_string()))
        );
    }
}
