//! VMIRS planning (pure): which VMIs to create and delete, and the status to report.

use std::collections::BTreeSet;

use kube::{Resource, ResourceExt};
use microvirt_crds::{
    VirtualMachineInstance, VirtualMachineInstanceReplicaSet,
    VirtualMachineInstanceReplicaSetStatus,
};

use crate::selector;
use crate::vmi::VmiRef;

/// What the VMIRS reconciler should do.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ReplicaPlan {
    /// Names of VMIs to create.
    pub create: Vec<String>,
    /// VMIs to delete.
    pub delete: Vec<VmiRef>,
    /// Status to report (observed before acting).
    pub status: VirtualMachineInstanceReplicaSetStatus,
}

/// Whether `vmi` is controlled by `rs` (owner reference with the set's uid) and matches its selector.
pub fn owned_by(vmi: &VirtualMachineInstance, rs: &VirtualMachineInstanceReplicaSet) -> bool {
    let Some(uid) = rs.meta().uid.as_deref() else {
        return false;
    };
    vmi.owner_references()
        .iter()
        .any(|o| o.uid == uid && o.controller == Some(true))
        && selector::matches(&rs.spec.selector, vmi.labels())
}

/// Name for replica `i` of set `rs_name`.
pub fn replica_name(rs_name: &str, i: usize) -> String {
    format!("{rs_name}-{i}")
}

/// Plan a reconcile of `rs` given every VMI in its namespace.
///
/// - VMIs owned by the set that are not being deleted and not finished are *active*.
/// - Finished (Succeeded/Failed) owned VMIs are deleted and replaced.
/// - Too few active → create the lowest free names `<set>-<i>` (a name is free when no VMI, in
///   any state, has it; fixed names make retried creates idempotent, so an API server restart
///   cannot produce duplicates).
/// - Too many → delete not-ready ones first, then the newest.
/// - `paused` → no creates or deletes; only status.
pub fn plan<'a>(
    rs: &VirtualMachineInstanceReplicaSet,
    vmis: impl IntoIterator<Item = &'a VirtualMachineInstance>,
) -> ReplicaPlan {
    let rs_name = rs.name_any();
    let all: Vec<&VirtualMachineInstance> = vmis.into_iter().collect();
    let owned: Vec<&VirtualMachineInstance> =
        all.iter().copied().filter(|v| owned_by(v, rs)).collect();
    let mut active: Vec<&VirtualMachineInstance> = owned
        .iter()
        .copied()
        .filter(|v| v.metadata.deletion_timestamp.is_none())
        .filter(|v| !v.phase().is_some_and(|p| p.is_final()))
        .collect();
    let finished: Vec<VmiRef> = owned
        .iter()
        .filter(|v| v.metadata.deletion_timestamp.is_none())
        .filter(|v| v.phase().is_some_and(|p| p.is_final()))
        .map(|v| VmiRef::of(v))
        .collect();

    let paused = rs.spec.paused.unwrap_or(false);
    let status = VirtualMachineInstanceReplicaSetStatus {
        replicas: i32::try_from(active.len()).unwrap_or(i32::MAX),
        ready_replicas: i32::try_from(active.iter().filter(|v| v.is_ready()).count())
            .unwrap_or(i32::MAX),
        label_selector: Some(selector::to_selector_string(&rs.spec.selector)),
        paused: paused.then_some(true),
    };
    if paused {
        return ReplicaPlan {
            status,
            ..Default::default()
        };
    }

    let desired = usize::try_from(rs.spec.desired()).unwrap_or(0);
    let mut create = Vec::new();
    let mut delete = finished;
    if active.len() < desired {
        let taken: BTreeSet<String> = all.iter().map(|v| v.name_any()).collect();
        let mut i = 0usize;
        while create.len() < desired - active.len() {
            let n = replica_name(&rs_name, i);
            if !taken.contains(&n) {
                create.push(n);
            }
            i += 1;
        }
    } else if active.len() > desired {
        // Not ready first, then newest first (creation time, then name, descending).
        active.sort_by(|a, b| {
            a.is_ready()
                .cmp(&b.is_ready())
                .then_with(|| {
                    b.metadata
                        .creation_timestamp
                        .as_ref()
                        .map(|t| t.0)
                        .cmp(&a.metadata.creation_timestamp.as_ref().map(|t| t.0))
                })
                .then_with(|| b.name_any().cmp(&a.name_any()))
        });
        delete.extend(
            active
                .iter()
                .take(active.len() - desired)
                .map(|v| VmiRef::of(v)),
        );
    }
    ReplicaPlan {
        create,
        delete,
        status,
    }
}

/// A new VMI for `rs` named `name`: template labels/annotations, controller owner reference.
pub fn new_replica(rs: &VirtualMachineInstanceReplicaSet, name: &str) -> VirtualMachineInstance {
    let mut vmi = VirtualMachineInstance::new(name, rs.spec.template.spec.clone());
    vmi.metadata.namespace = rs.namespace();
    let labels = rs.spec.template.labels();
    if !labels.is_empty() {
        vmi.metadata.labels = Some(labels);
    }
    let annotations = rs.spec.template.annotations();
    if !annotations.is_empty() {
        vmi.metadata.annotations = Some(annotations);
    }
    vmi.metadata.owner_references = rs.controller_owner_ref(&()).map(|o| vec![o]);
    vmi
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
    use k8s_openapi::jiff::Timestamp;
    use microvirt_crds::vmi::{VirtualMachineInstanceStatus, VmiCondition, VmiPhase};
    use microvirt_crds::{
        TemplateMeta, VirtualMachineInstanceReplicaSetSpec, VirtualMachineInstanceTemplateSpec,
    };
    use std::collections::BTreeMap;

    fn rs(replicas: i32) -> VirtualMachineInstanceReplicaSet {
        let labels = BTreeMap::from([("app".to_string(), "x".to_string())]);
        let mut rs = VirtualMachineInstanceReplicaSet::new(
            "web",
            VirtualMachineInstanceReplicaSetSpec {
                replicas: Some(replicas),
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
                paused: None,
            },
        );
        rs.metadata.namespace = Some("ns".into());
        rs.metadata.uid = Some("rs-uid".into());
        rs
    }

    fn replica(
        rs: &VirtualMachineInstanceReplicaSet,
        name: &str,
        created_s: i64,
        ready: bool,
        phase: VmiPhase,
    ) -> VirtualMachineInstance {
        let mut v = new_replica(rs, name);
        v.metadata.uid = Some(format!("{name}-uid"));
        v.metadata.creation_timestamp = Some(Time(Timestamp::from_second(created_s).unwrap()));
        v.status = Some(VirtualMachineInstanceStatus {
            phase: Some(phase),
            conditions: vec![VmiCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        v
    }

    fn names(refs: &[VmiRef]) -> Vec<&str> {
        refs.iter().map(|r| r.name.as_str()).collect()
    }

    #[test]
    fn scale_up_uses_lowest_free_names() {
        let s = rs(3);
        let existing = [replica(&s, "web-1", 10, true, VmiPhase::Running)];
        let p = plan(&s, existing.iter());
        assert_eq!(p.create, vec!["web-0".to_string(), "web-2".to_string()]);
        assert!(p.delete.is_empty());
        assert_eq!(p.status.replicas, 1);
        assert_eq!(p.status.ready_replicas, 1);
        assert_eq!(p.status.label_selector.as_deref(), Some("app=x"));
    }

    #[test]
    fn scale_down_removes_not_ready_then_newest() {
        let s = rs(1);
        let existing = [
            replica(&s, "web-0", 10, true, VmiPhase::Running),
            replica(&s, "web-1", 30, true, VmiPhase::Running),
            replica(&s, "web-2", 20, false, VmiPhase::Scheduling),
        ];
        let p = plan(&s, existing.iter());
        assert!(p.create.is_empty());
        assert_eq!(names(&p.delete), ["web-2", "web-1"]);
        assert_eq!(p.delete[0].uid.as_deref(), Some("web-2-uid"));
    }

    #[test]
    fn finished_replicas_are_replaced_and_foreign_vmis_ignored() {
        let s = rs(2);
        let mut foreign = replica(&s, "other", 5, true, VmiPhase::Running);
        foreign.metadata.owner_references = None;
        let mut deleting = replica(&s, "web-0", 5, true, VmiPhase::Running);
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(50).unwrap()));
        let existing = [
            foreign,
            deleting,
            replica(&s, "web-1", 10, false, VmiPhase::Failed),
            replica(&s, "web-2", 10, true, VmiPhase::Running),
        ];
        let p = plan(&s, existing.iter());
        assert_eq!(names(&p.delete), ["web-1"]);
        // web-0 is still terminating and web-1 not yet gone: new replica takes web-3.
        assert_eq!(p.create, vec!["web-3".to_string()]);
        assert_eq!(p.status.replicas, 1);
    }

    #[test]
    fn paused_set_only_reports() {
        let mut s = rs(5);
        s.spec.paused = Some(true);
        let p = plan(&s, std::iter::empty());
        assert!(p.create.is_empty() && p.delete.is_empty());
        assert_eq!(p.status.paused, Some(true));
        assert_eq!(p.status.replicas, 0);
    }
}
