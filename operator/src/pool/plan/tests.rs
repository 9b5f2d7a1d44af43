use super::*;
use crate::config::Config;
use crate::pool::members::{effective_template, member_pod, replica_vmi, tests::pool as base_pool};
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStatus, PodCondition, PodStatus,
};
use microvirt_crds::pool::{
    OpportunisticScaleIn, ProactiveScaleIn, ScaleInStrategy, SelectionPolicy, UnmanagedScaleIn,
    WarmSpec,
};
use microvirt_crds::vmi::{VirtualMachineInstanceStatus, VmiCondition, VmiPhase};
use std::time::Instant;

fn ts(s: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + s).unwrap()
}

struct World {
    pool: VirtualMachinePool,
    hash: String,
    vmis: Vec<VirtualMachineInstance>,
    pods: Vec<Pod>,
    pending: PoolExpectations,
    now: Timestamp,
}

impl World {
    /// A pool (replicas, warm min/max) whose snapshot `<hash>-1` is Ready on node n1.
    fn new(replicas: i32, min: i32, max: i32) -> Self {
        let mut pool = base_pool();
        pool.spec.replicas = Some(replicas);
        pool.spec.warm = Some(WarmSpec {
            min: Some(min),
            max: Some(max),
            ..Default::default()
        });
        pool.metadata.generation = Some(3);
        let hash = effective_template(&pool, []).unwrap().hash;
        pool.status = Some(VirtualMachinePoolStatus {
            snapshot: Some(PoolSnapshot {
                id: format!("{hash}-1"),
                template_hash: hash.clone(),
                attempt: 1,
                phase: SnapshotPhase::Ready,
                node: Some("n1".into()),
                host_facts: Some("cpu=A/1/1/1 kernel=k".into()),
                ..Default::default()
            }),
            ..Default::default()
        });
        World {
            pool,
            hash,
            vmis: vec![],
            pods: vec![],
            pending: PoolExpectations::default(),
            now: ts(1000),
        }
    }

    fn snap(&self) -> String {
        format!("{}-1", self.hash)
    }

    /// A warm member `virt-launcher-web-<sfx>` created at `created`, Ready or not.
    fn warm(&mut self, sfx: &str, created: i64, ready: bool, snapshot: &str) {
        let t = effective_template(&self.pool, []).unwrap();
        let mut p = member_pod(
            &self.pool,
            &t,
            MemberRole::Warm,
            snapshot,
            Some("n1"),
            &Config::default(),
        )
        .unwrap();
        p.metadata.name = Some(format!("virt-launcher-web-{sfx}"));
        p.metadata.creation_timestamp = Some(Time(ts(created)));
        p.status = Some(PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                last_transition_time: Some(Time(ts(created + 1))),
                ..Default::default()
            }]),
            ..Default::default()
        });
        self.pods.push(p);
    }

    fn replica(&mut self, name: &str, created: i64, ready: bool, phase: VmiPhase) {
        let t = effective_template(&self.pool, []).unwrap();
        let mut v = replica_vmi(&self.pool, &t, Some(name), None);
        v.metadata.creation_timestamp = Some(Time(ts(created)));
        v.status = Some(VirtualMachineInstanceStatus {
            phase: Some(phase),
            conditions: vec![VmiCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        self.vmis.push(v);
    }

    fn plan(&self) -> Plan {
        plan(&Inputs {
            pool: &self.pool,
            template_hash: &self.hash,
            vmis: self.vmis.iter().collect(),
            pods: self.pods.iter().collect(),
            node: NodeView::Present(Some("cpu=A/1/1/1 kernel=k".into())),
            pending: &self.pending,
            last_failure: None,
            now: self.now,
        })
    }
}

fn claims(p: &Plan) -> Vec<(String, String)> {
    p.steps
        .iter()
        .filter_map(|s| match s {
            Step::Claim(a, b) => Some((a.clone(), b.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn scale_up_claims_the_oldest_ready_members_and_refills() {
    let mut w = World::new(3, 2, 10);
    let s = w.snap();
    w.warm("aaaaa", 30, true, &s);
    w.warm("bbbbb", 10, true, &s);
    w.warm("ccccc", 20, true, &s);
    w.warm("ddddd", 5, false, &s);
    w.warm("eeeee", 40, true, &s);
    let p = w.plan();
    assert_eq!(
        claims(&p),
        vec![
            ("virt-launcher-web-bbbbb".into(), "web-bbbbb".into()),
            ("virt-launcher-web-ccccc".into(), "web-ccccc".into()),
            ("virt-launcher-web-aaaaa".into(), "web-aaaaa".into()),
        ]
    );
    // Target clamp(3, 2, 10) = 3; left: eeeee (ready) + ddddd (starting) = 2 → one more.
    assert!(p.steps.contains(&Step::CreateWarm(1)), "{:?}", p.steps);
    assert!(!p.steps.iter().any(|s| matches!(s, Step::CreateCold(_))));
    assert_eq!(p.status.warm_replicas, 1);
    assert_eq!(p.status.replicas, 0);
    assert_eq!(p.status.label_selector.as_deref(), Some("app=web"));
    assert_eq!(p.status.observed_generation, Some(3));
    let c = |t: &str| {
        p.status
            .conditions
            .iter()
            .find(|c| c.type_ == t)
            .unwrap()
            .clone()
    };
    assert_eq!(c(CONDITION_SNAPSHOT_READY).status, "True");
    assert_eq!(c(CONDITION_WARM_READY).status, "False");
    assert_eq!(c(CONDITION_REPLICA_PAUSED).status, "False");
}

#[test]
fn without_ready_members_replicas_boot_cold() {
    let mut w = World::new(2, 1, 1);
    let s = w.snap();
    w.warm("aaaaa", 10, false, &s);
    let p = w.plan();
    assert!(claims(&p).is_empty());
    assert!(p.steps.contains(&Step::CreateCold(2)));
    // One warm member is starting: the target (1) is met.
    assert!(!p.steps.iter().any(|s| matches!(s, Step::CreateWarm(_))));
}

#[test]
fn members_of_another_snapshot_are_drained_and_failed_restores_counted() {
    let mut w = World::new(0, 1, 1);
    let s = w.snap();
    w.warm("old00", 10, true, "0123456789-1");
    w.warm("good0", 10, true, &s);
    w.warm("bad00", 10, false, &s);
    w.pods
        .last_mut()
        .unwrap()
        .status
        .as_mut()
        .unwrap()
        .container_statuses = Some(vec![ContainerStatus {
        name: "compute".into(),
        state: Some(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 3,
                message: Some("snapshot taken on another CPU\n".into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }]);
    let p = w.plan();
    assert!(p.steps.contains(&Step::DeletePod(
        "virt-launcher-web-old00".into(),
        "made from another snapshot"
    )));
    assert!(p.steps.contains(&Step::DeletePod(
        "virt-launcher-web-bad00".into(),
        "the warm member's launcher ended"
    )));
    assert_eq!(p.status.snapshot.as_ref().unwrap().restore_failures, 1);
    assert_eq!(p.status.warm_replicas, 1);
    assert!(!p.steps.iter().any(|s| matches!(s, Step::CreateWarm(_))));
}

#[test]
fn a_changed_template_drains_warm_members_and_captures_again() {
    let mut w = World::new(1, 2, 2);
    let s = w.snap();
    w.warm("aaaaa", 10, true, &s);
    w.warm("bbbbb", 10, true, &s);
    w.pool.spec.template.spec.termination_grace_period_seconds = Some(5);
    w.hash = effective_template(&w.pool, []).unwrap().hash;
    let p = w.plan();
    let snap = p.status.snapshot.clone().unwrap();
    assert_eq!(snap.id, format!("{}-1", w.hash));
    assert_eq!(snap.phase, SnapshotPhase::Capturing);
    assert!(p.steps.contains(&Step::CreateBuilder));
    assert_eq!(
        p.steps
            .iter()
            .filter(|s| matches!(s, Step::DeletePod(_, "made from another snapshot")))
            .count(),
        2
    );
    // Meanwhile the replica boots cold.
    assert!(p.steps.contains(&Step::CreateCold(1)));
}

#[test]
fn scale_in_follows_the_strategy() {
    let mut w = World::new(1, 0, 0);
    w.replica("web-aaaaa", 10, true, VmiPhase::Running);
    w.replica("web-bbbbb", 30, true, VmiPhase::Running);
    w.replica("web-ccccc", 20, false, VmiPhase::Scheduling);
    w.replica("web-ddddd", 5, false, VmiPhase::Succeeded);
    w.pool.spec.scale_in_strategy = Some(ScaleInStrategy {
        proactive: Some(ProactiveScaleIn {
            selection_policy: Some(SelectionPolicy {
                sort_policy: Some(SortPolicy::Newest),
            }),
            state_preservation: None,
        }),
        ..Default::default()
    });
    let deleted = |p: &Plan| -> Vec<String> {
        p.steps
            .iter()
            .filter_map(|s| match s {
                Step::DeleteVmi(r, _) => Some(r.name.clone()),
                _ => None,
            })
            .collect()
    };
    let p = w.plan();
    // The ended one, then not-Ready first, then newest.
    assert_eq!(deleted(&p), vec!["web-ddddd", "web-ccccc", "web-bbbbb"]);
    assert_eq!(p.status.replicas, 3);
    assert_eq!(p.status.ready_replicas, 2);

    w.pool.spec.scale_in_strategy.as_mut().unwrap().proactive = None;
    w.pool
        .spec
        .scale_in_strategy
        .as_mut()
        .unwrap()
        .opportunistic = Some(OpportunisticScaleIn::default());
    assert_eq!(deleted(&w.plan()), vec!["web-ddddd"]);

    w.pool.spec.scale_in_strategy = Some(ScaleInStrategy {
        unmanaged: Some(UnmanagedScaleIn {}),
        ..Default::default()
    });
    assert!(deleted(&w.plan()).is_empty());

    // Random picks two of the three, not-Ready first.
    w.pool.spec.scale_in_strategy = None;
    w.pool.spec.replicas = Some(1);
    let d = deleted(&w.plan());
    assert_eq!(d.len(), 3);
    assert_eq!(d[1], "web-ccccc");
}

#[test]
fn a_paused_pool_only_reports() {
    let mut w = World::new(5, 2, 2);
    let s = w.snap();
    w.warm("aaaaa", 10, true, &s);
    w.warm("old00", 10, true, "x-1");
    w.pool.spec.paused = Some(true);
    let p = w.plan();
    assert!(p.steps.is_empty(), "{:?}", p.steps);
    assert_eq!(p.status.warm_replicas, 1);
    let c = p
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_REPLICA_PAUSED)
        .unwrap();
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "Paused"));
}

#[test]
fn expectations_keep_a_stale_cache_from_acting_twice() {
    let mut w = World::new(2, 1, 1);
    let s = w.snap();
    w.warm("aaaaa", 10, true, &s);
    w.warm("bbbbb", 11, true, &s);
    let t = Instant::now();
    // aaaaa was claimed as web-aaaaa; neither the VMI nor the patch is in the cache yet.
    w.pending
        .pods_claimed
        .insert("virt-launcher-web-aaaaa".into(), t);
    w.pending.vmis_created.insert("web-aaaaa".into(), t);
    // A warm member was created that the cache does not show.
    w.pending
        .pods_created
        .insert("virt-launcher-web-zzzzz".into(), t);
    let p = w.plan();
    assert_eq!(
        claims(&p),
        vec![("virt-launcher-web-bbbbb".into(), "web-bbbbb".into())]
    );
    assert!(!p.steps.iter().any(|s| matches!(s, Step::CreateCold(_))));
    // zzzzz (in flight) covers the target of 1.
    assert!(!p.steps.iter().any(|s| matches!(s, Step::CreateWarm(_))));

    // A deleted warm member still in the cache is neither claimed nor counted.
    let mut w = World::new(1, 1, 1);
    let s = w.snap();
    w.warm("aaaaa", 10, true, &s);
    w.pending
        .pods_deleted
        .insert("virt-launcher-web-aaaaa".into(), t);
    let p = w.plan();
    assert!(claims(&p).is_empty());
    assert!(p.steps.contains(&Step::CreateCold(1)));
    assert!(p.steps.contains(&Step::CreateWarm(1)));
}

#[test]
fn an_interrupted_claim_is_finished_and_its_member_not_claimed_again() {
    let mut w = World::new(1, 1, 1);
    let s = w.snap();
    w.warm("aaaaa", 10, true, &s);
    let t = effective_template(&w.pool, []).unwrap();
    let mut v = replica_vmi(&w.pool, &t, Some("web-aaaaa"), Some(&s));
    v.metadata.creation_timestamp = Some(Time(ts(20)));
    w.vmis.push(v);
    let p = w.plan();
    assert_eq!(
        p.steps.first(),
        Some(&Step::FinishClaim(
            "virt-launcher-web-aaaaa".into(),
            "web-aaaaa".into()
        ))
    );
    assert!(claims(&p).is_empty());
    assert!(!p.steps.iter().any(|s| matches!(s, Step::CreateCold(_))));
    assert!(p.steps.contains(&Step::CreateWarm(1)));
}

#[test]
fn old_warm_members_are_discarded_and_surplus_removed() {
    let mut w = World::new(0, 1, 1);
    let s = w.snap();
    w.pool.spec.warm.as_mut().unwrap().discard_after_seconds = Some(600);
    w.warm("aaaaa", 100, true, &s); // 900 s old
    w.warm("bbbbb", 900, true, &s); // 100 s old
    w.warm("ccccc", 950, false, &s); // surplus, starting
    let p = w.plan();
    assert!(p.steps.contains(&Step::DeletePod(
        "virt-launcher-web-aaaaa".into(),
        "warm longer than discardAfterSeconds"
    )));
    assert!(p.steps.contains(&Step::DeletePod(
        "virt-launcher-web-ccccc".into(),
        "more warm members than wanted"
    )));
    assert_eq!(p.status.warm_replicas, 1);
    // Looked at again when bbbbb reaches the limit.
    assert_eq!(p.requeue, Some(Duration::from_secs(500)));
}

#[test]
fn without_warm_the_pool_is_a_replica_set() {
    let mut w = World::new(2, 1, 1);
    w.pool.spec.warm = None;
    w.warm("aaaaa", 10, true, "x-1");
    let p = w.plan();
    assert!(p.steps.contains(&Step::CreateCold(2)));
    assert!(p.steps.contains(&Step::DeletePod(
        "virt-launcher-web-aaaaa".into(),
        "made from another snapshot"
    )));
    assert_eq!(p.status.snapshot, None);
    assert!(p
        .status
        .conditions
        .iter()
        .all(|c| c.type_ != CONDITION_SNAPSHOT_READY));
}
