//! Planning one pool reconcile (pure): from the pool, its VMIs and pods, the snapshot's node and
//! the outstanding expectations, decide what to write and the status to report.
//!
//! Order of concerns:
//! 1. the snapshot ([`super::snapshot::step`]);
//! 2. warm members: drop those of another snapshot, those whose launcher ended and those
//!    older than `discardAfterSeconds`;
//! 3. replicas: finish interrupted claims, claim Ready warm members (oldest first) for missing
//!    replicas, boot the rest cold; scale in per `scaleInStrategy`;
//! 4. refill warm members to `clamp(replicas, min, max)`, or remove the surplus.
//!
//! A paused pool only reports status.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::{Resource, ResourceExt};
use microvirt_crds::pool::{
    MemberRole, PoolSnapshot, ScaleIn, SnapshotPhase, SortPolicy, VirtualMachinePoolStatus,
    ANNOTATION_CLAIMED_FROM, LABEL_SNAPSHOT,
};
use microvirt_crds::{VirtualMachineInstance, VirtualMachinePool};

use super::expectations::PoolExpectations;
use super::members::{pod_of_pool, role, shuffle_key, vmi_name_of_pod, vmi_of_pool, POD_PREFIX};
use super::snapshot::{self, NodeView, Note, SnapshotInputs};
use crate::selector;
use crate::vmi::VmiRef;

/// Exit code of a launcher whose setup failed (a snapshot it could not restore, among others).
pub const EXIT_SETUP_FAILED: i32 = 3;

/// Condition types of a pool.
pub const CONDITION_REPLICA_PAUSED: &str = "ReplicaPaused";
/// See [`CONDITION_REPLICA_PAUSED`].
pub const CONDITION_REPLICA_FAILURE: &str = "ReplicaFailure";
/// See [`CONDITION_REPLICA_PAUSED`].
pub const CONDITION_SNAPSHOT_READY: &str = "SnapshotReady";
/// See [`CONDITION_REPLICA_PAUSED`].
pub const CONDITION_WARM_READY: &str = "WarmReady";

/// Everything a plan is made from.
pub struct Inputs<'a> {
    /// The pool.
    pub pool: &'a VirtualMachinePool,
    /// Hash of its effective template.
    pub template_hash: &'a str,
    /// VMIs of the pool's namespace.
    pub vmis: Vec<&'a VirtualMachineInstance>,
    /// Pods of the pool's namespace with the pool's label (any role).
    pub pods: Vec<&'a Pod>,
    /// The snapshot's node.
    pub node: NodeView,
    /// Unconfirmed writes.
    pub pending: &'a PoolExpectations,
    /// The last API error of a create, if any (reported as ReplicaFailure).
    pub last_failure: Option<String>,
    /// Now.
    pub now: Timestamp,
}

/// One write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Create the builder pod of the snapshot in the plan's status.
    CreateBuilder,
    /// Ask the node agent for the snapshot: (pod, request id).
    RequestSnapshot(String, String),
    /// Delete a builder or warm pod.
    DeletePod(String, &'static str),
    /// Create this many warm members (of the plan's snapshot).
    CreateWarm(usize),
    /// Claim warm pod `.0` as VMI `.1`.
    Claim(String, String),
    /// A claimed VMI `.1` exists whose warm pod `.0` still is unclaimed: patch the pod.
    FinishClaim(String, String),
    /// Create this many cold VMIs.
    CreateCold(usize),
    /// Delete a VMI (only if its name still belongs to the uid this plan saw).
    DeleteVmi(VmiRef, &'static str),
}

/// The outcome of planning.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// Writes, in order.
    pub steps: Vec<Step>,
    /// The status to report (claim latency is filled in by the reconciler).
    pub status: VirtualMachinePoolStatus,
    /// Look again after this long (timers of the snapshot and of warm members).
    pub requeue: Option<Duration>,
    /// Events.
    pub notes: Vec<Note>,
}

fn ready(pod: &Pod) -> bool {
    snapshot::ready_since(pod).is_some()
        && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

fn created(o: &impl Resource) -> Option<Timestamp> {
    o.meta().creation_timestamp.as_ref().map(|t| t.0)
}

fn age(now: Timestamp, o: &impl Resource) -> Duration {
    created(o)
        .and_then(|c| Duration::try_from(now.duration_since(c)).ok())
        .unwrap_or_default()
}

fn min_requeue(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// Builds the pool's conditions, keeping each one's `lastTransitionTime` when its status did
/// not change.
struct Conditions<'a> {
    old: &'a [Condition],
    now: Timestamp,
    generation: Option<i64>,
    out: Vec<Condition>,
}

impl Conditions<'_> {
    fn set(&mut self, type_: &str, status: bool, reason: &str, message: String) {
        let s = if status { "True" } else { "False" };
        let last = self
            .old
            .iter()
            .find(|c| c.type_ == type_ && c.status == s)
            .map(|c| c.last_transition_time.clone())
            .unwrap_or(Time(self.now));
        self.out.push(Condition {
            type_: type_.into(),
            status: s.into(),
            reason: reason.into(),
            message,
            last_transition_time: last,
            observed_generation: self.generation,
        });
    }
}

/// Plan one reconcile.
pub fn plan(inp: &Inputs) -> Plan {
    let pool = inp.pool;
    let spec = &pool.spec;
    let now = inp.now;
    let pending = inp.pending;
    let paused = spec.is_paused();
    let desired = usize::try_from(spec.desired()).unwrap_or(0);
    let warm_target = usize::try_from(spec.warm_target(spec.desired())).unwrap_or(0);
    let mut p = Plan::default();

    // --- Observed VMIs.
    let all_vmi_names: BTreeSet<String> = inp.vmis.iter().map(|v| v.name_any()).collect();
    let owned: Vec<&VirtualMachineInstance> = inp
        .vmis
        .iter()
        .copied()
        .filter(|v| vmi_of_pool(v, pool))
        .filter(|v| !pending.vmis_deleted.contains_key(&v.name_any()))
        .collect();
    let mut active: Vec<&VirtualMachineInstance> = owned
        .iter()
        .copied()
        .filter(|v| v.metadata.deletion_timestamp.is_none())
        .filter(|v| !v.phase().is_some_and(|ph| ph.is_final()))
        .collect();
    let finished: Vec<&VirtualMachineInstance> = owned
        .iter()
        .copied()
        .filter(|v| v.metadata.deletion_timestamp.is_none())
        .filter(|v| v.phase().is_some_and(|ph| ph.is_final()))
        .collect();
    let vmis_in_flight = pending
        .vmis_created
        .keys()
        .filter(|n| !all_vmi_names.contains(*n))
        .count();

    // --- Observed pods of this pool.
    let mine: Vec<&Pod> = inp
        .pods
        .iter()
        .copied()
        .filter(|pod| pod_of_pool(pod, pool))
        .filter(|pod| !pending.pods_deleted.contains_key(&pod.name_any()))
        .collect();
    let builders: Vec<&Pod> = mine
        .iter()
        .copied()
        .filter(|pod| role(pod) == Some(MemberRole::Builder))
        .collect();
    let warm: Vec<&Pod> = mine
        .iter()
        .copied()
        .filter(|pod| role(pod) == Some(MemberRole::Warm))
        .filter(|pod| !pending.pods_claimed.contains_key(&pod.name_any()))
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .collect();

    // --- 1. The snapshot.
    let current = pool.status.as_ref().and_then(|s| s.snapshot.as_ref());
    let builder_name = current.and_then(|s| s.builder.clone());
    let builder = builders
        .iter()
        .copied()
        .find(|b| Some(b.name_any()) == builder_name);
    let current_ready_id = current
        .filter(|s| s.phase == SnapshotPhase::Ready && s.template_hash == inp.template_hash)
        .map(|s| s.id.clone());
    // Warm members of the ready snapshot whose launcher failed during restore.
    let mut restore_failures = (0, None);
    let mut failed_warm: Vec<(&Pod, i32)> = Vec::new();
    for w in &warm {
        if let Some((code, msg)) = snapshot::terminated(w) {
            if code == EXIT_SETUP_FAILED
                && w.labels().get(LABEL_SNAPSHOT) == current_ready_id.as_ref()
            {
                restore_failures.0 += 1;
                restore_failures.1 = Some(msg);
            }
            failed_warm.push((w, code));
        }
    }
    let wanted = spec.warm.is_some() && warm_target > 0;
    let warm_cfg = spec.warm.clone().unwrap_or_default();
    let snap: Option<PoolSnapshot> = if paused {
        current.cloned()
    } else if spec.warm.is_none() {
        for b in &builders {
            p.steps.push(Step::DeletePod(
                b.name_any(),
                "the pool has no warm section",
            ));
        }
        None
    } else {
        let step = snapshot::step(&SnapshotInputs {
            current,
            hash: inp.template_hash,
            wanted,
            builder,
            builder_pending: builder_name
                .as_ref()
                .is_some_and(|n| pending.pods_created.contains_key(n)),
            request_pending: builder_name
                .as_ref()
                .is_some_and(|n| pending.pods_requested.contains_key(n)),
            node: inp.node.clone(),
            restore_failures,
            pool: &pool.name_any(),
            after_boot: Duration::from_secs(warm_cfg.after_boot_seconds()),
            timeout: Duration::from_secs(warm_cfg.capture_timeout_seconds()),
            now,
        });
        if step.create_builder {
            p.steps.push(Step::CreateBuilder);
        }
        if let Some((pod, id)) = step.request {
            p.steps.push(Step::RequestSnapshot(pod, id));
        }
        // Builders that are not the current record's (an earlier attempt or template).
        let keep = step.snapshot.as_ref().and_then(|s| s.builder.clone());
        for b in &builders {
            let n = b.name_any();
            if Some(&n) != keep.as_ref() && b.metadata.deletion_timestamp.is_none() {
                p.steps.push(Step::DeletePod(n, "builder no longer needed"));
            } else if step.delete_builder.as_ref() == Some(&n) {
                p.steps.push(Step::DeletePod(n, "snapshot capture ended"));
            }
        }
        p.requeue = min_requeue(p.requeue, step.requeue);
        p.notes.extend(step.notes);
        step.snapshot
    };
    let usable_id = snap
        .as_ref()
        .filter(|s| s.phase == SnapshotPhase::Ready && s.template_hash == inp.template_hash)
        .map(|s| s.id.clone());

    // --- 2. Warm members.
    let mut claimable: Vec<&Pod> = Vec::new();
    let mut starting: Vec<&Pod> = Vec::new();
    let discard_after = warm_cfg
        .discard_after_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map(Duration::from_secs);
    for w in &warm {
        let name = w.name_any();
        // A warm pod whose VMI already exists is being claimed (finished below), never again.
        let taken = vmi_name_of_pod(&name).is_some_and(|v| all_vmi_names.contains(v));
        if taken {
            continue;
        }
        if failed_warm.iter().any(|(f, _)| f.name_any() == name) {
            if !paused {
                p.steps
                    .push(Step::DeletePod(name, "the warm member's launcher ended"));
            }
            continue;
        }
        if w.labels().get(LABEL_SNAPSHOT) != usable_id.as_ref() {
            if !paused {
                p.steps
                    .push(Step::DeletePod(name, "made from another snapshot"));
            }
            continue;
        }
        if let Some(limit) = discard_after {
            let a = age(now, *w);
            if a >= limit {
                if !paused {
                    p.steps.push(Step::DeletePod(
                        name,
                        "warm longer than discardAfterSeconds",
                    ));
                }
                continue;
            }
            p.requeue = min_requeue(p.requeue, Some(limit - a));
        }
        if ready(w) {
            claimable.push(w);
        } else {
            starting.push(w);
        }
    }
    // Oldest first: they have waited longest (and would be discarded first).
    claimable.sort_by_key(|w| (created(*w), w.name_any()));

    // --- 3. Replicas.
    let scale_in = spec.scale_in();
    if !paused {
        // Interrupted claims: a VMI made from a warm member whose pod still says warm.
        for v in &active {
            if !v.annotations().contains_key(ANNOTATION_CLAIMED_FROM) {
                continue;
            }
            let pod_name = format!("{POD_PREFIX}{}", v.name_any());
            let unclaimed = mine.iter().any(|w| {
                w.name_any() == pod_name
                    && role(w) == Some(MemberRole::Warm)
                    && w.metadata.deletion_timestamp.is_none()
                    && !pending.pods_claimed.contains_key(&pod_name)
            });
            if unclaimed {
                p.steps.push(Step::FinishClaim(pod_name, v.name_any()));
            }
        }
        if scale_in != ScaleIn::Unmanaged {
            for v in &finished {
                p.steps
                    .push(Step::DeleteVmi(VmiRef::of(v), "the VMI has ended"));
            }
        }
        let have = active.len() + vmis_in_flight;
        if have < desired {
            let need = desired - have;
            let mut claimed = 0;
            for w in claimable.iter().take(need) {
                let name = w.name_any();
                if let Some(v) = vmi_name_of_pod(&name) {
                    p.steps.push(Step::Claim(name.clone(), v.to_string()));
                    claimed += 1;
                }
            }
            claimable.drain(..claimed);
            if need > claimed {
                p.steps.push(Step::CreateCold(need - claimed));
            }
        } else if have > desired {
            if let ScaleIn::Proactive(order) = scale_in {
                let surplus = (have - desired).min(active.len());
                let salt = u64::try_from(now.as_second()).unwrap_or(0);
                sort_for_scale_in(&mut active, order, salt);
                for v in active.iter().take(surplus) {
                    p.steps.push(Step::DeleteVmi(VmiRef::of(v), "scale in"));
                }
            }
        }
    }

    // --- 4. Refill warm members.
    let warm_in_flight = pending
        .pods_created
        .keys()
        .filter(|n| !mine.iter().any(|m| m.name_any() == **n))
        .filter(|n| builder_name.as_ref() != Some(*n))
        .count();
    if !paused && usable_id.is_some() {
        let have = claimable.len() + starting.len() + warm_in_flight;
        if have < warm_target {
            p.steps.push(Step::CreateWarm(warm_target - have));
        } else if have > warm_target {
            let mut surplus = have - warm_target;
            // Starting ones first (newest first), then the newest Ready ones.
            starting.sort_by_key(|w| std::cmp::Reverse((created(*w), w.name_any())));
            let mut ready_newest: Vec<&Pod> = claimable.clone();
            ready_newest.reverse();
            for w in starting.iter().chain(ready_newest.iter()) {
                if surplus == 0 {
                    break;
                }
                p.steps.push(Step::DeletePod(
                    w.name_any(),
                    "more warm members than wanted",
                ));
                surplus -= 1;
            }
        }
    }

    // --- Status.
    let old = pool.status.clone().unwrap_or_default();
    let generation = pool.meta().generation;
    let mut conditions = Conditions {
        old: &old.conditions,
        now,
        generation,
        out: Vec::new(),
    };
    conditions.set(
        CONDITION_REPLICA_PAUSED,
        paused,
        if paused { "Paused" } else { "NotPaused" },
        if paused {
            "spec.paused is true: nothing is created, claimed or deleted".into()
        } else {
            String::new()
        },
    );
    conditions.set(
        CONDITION_REPLICA_FAILURE,
        inp.last_failure.is_some(),
        if inp.last_failure.is_some() {
            "FailedCreate"
        } else {
            "NoFailure"
        },
        inp.last_failure.clone().unwrap_or_default(),
    );
    if spec.warm.is_some() {
        let (ok, reason, msg) = match &snap {
            Some(s) if s.phase == SnapshotPhase::Ready => (
                true,
                "Ready",
                format!(
                    "snapshot {} on node {}",
                    s.id,
                    s.node.as_deref().unwrap_or("?")
                ),
            ),
            Some(s) => (
                false,
                s.phase.as_str(),
                s.message
                    .clone()
                    .unwrap_or_else(|| format!("snapshot {}", s.id)),
            ),
            None => (
                false,
                "None",
                "no snapshot is wanted (warm target 0)".into(),
            ),
        };
        conditions.set(CONDITION_SNAPSHOT_READY, ok, reason, msg);
        let left = claimable.len();
        conditions.set(
            CONDITION_WARM_READY,
            left >= warm_target,
            if left >= warm_target {
                "Enough"
            } else {
                "Refilling"
            },
            format!("{left} of {warm_target} warm members ready"),
        );
    }
    p.status = VirtualMachinePoolStatus {
        replicas: i32::try_from(active.len()).unwrap_or(i32::MAX),
        ready_replicas: i32::try_from(active.iter().filter(|v| v.is_ready()).count())
            .unwrap_or(i32::MAX),
        warm_replicas: i32::try_from(claimable.len()).unwrap_or(i32::MAX),
        label_selector: Some(selector::to_selector_string(&spec.selector)),
        observed_generation: generation,
        template_hash: Some(inp.template_hash.to_string()),
        snapshot: snap,
        conditions: conditions.out,
        claim_latency: old.claim_latency,
    };
    p
}

/// Orders `vmis` for proactive scale-in: not Ready first, then by `order`.
fn sort_for_scale_in(vmis: &mut [&VirtualMachineInstance], order: SortPolicy, salt: u64) {
    vmis.sort_by(|a, b| {
        let by_ready = a.is_ready().cmp(&b.is_ready());
        let by_policy = match order {
            SortPolicy::AscendingOrder => a.name_any().cmp(&b.name_any()),
            SortPolicy::DescendingOrder => b.name_any().cmp(&a.name_any()),
            SortPolicy::Newest => created(*b)
                .cmp(&created(*a))
                .then_with(|| b.name_any().cmp(&a.name_any())),
            SortPolicy::Oldest => created(*a)
                .cmp(&created(*b))
                .then_with(|| a.name_any().cmp(&b.name_any())),
            SortPolicy::Random => {
                shuffle_key(&a.name_any(), salt).cmp(&shuffle_key(&b.name_any(), salt))
            }
        };
        by_ready.then(by_policy)
    });
}

#[cfg(test)]
mod tests;
