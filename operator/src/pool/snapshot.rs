//! The lifecycle of a pool's snapshot (pure).
//!
//! ```text
//!   (none / template changed) ──> Capturing ──> Ready ──> Incompatible ──> (next attempt)
//!                                     │           │
//!                                     └──> Failed <┘ ──(back-off)──> (next attempt)
//! ```
//!
//! - **Capturing**: a builder pod boots the template cold. Once the guest signalled boot (the
//!   node agent's pod condition `microvirt.io/guest-booted`; the pod's Ready comes earlier, when
//!   the VM starts running) and `afterBootSeconds` have passed, the operator asks the node agent for a
//!   snapshot (`microvirt.io/control-request: snap-<id> snapshot`); the agent's answer
//!   `snap-<id> ok <host facts>` makes it Ready, an error or a builder that ends, disappears or
//!   does not boot within `captureTimeoutSeconds` makes it Failed. The builder is deleted
//!   either way.
//! - **Ready**: warm members restore it, on its node only. It becomes Incompatible when that
//!   node goes away or reports other host facts (`microvirt.io/host-facts`) than the snapshot
//!   recorded, and Failed when 3 warm members could not restore it.
//! - **Failed** and **Incompatible** are never used again; the next attempt (a new id, a new
//!   directory) starts at once after Incompatible and after a back-off (10 s doubling up to
//!   5 min) after Failed.
//!
//! A changed template starts over at attempt 1 with the new hash.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use microvirt_crds::pool::{PoolSnapshot, SnapshotPhase};
use microvirt_crds::vmi::POD_CONDITION_GUEST_BOOTED;

use super::members::{builder_pod_name, control_result, snapshot_id, snapshot_request_id};

/// Warm members that may fail to restore before the snapshot is given up.
pub const MAX_RESTORE_FAILURES: i32 = 3;
/// First back-off after a failed capture.
const BACKOFF_MIN: Duration = Duration::from_secs(10);
/// Longest back-off.
const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// The resolution of a pod condition's `lastTransitionTime`.
const CONDITION_TIME_GRANULARITY: Duration = Duration::from_secs(1);
/// How long the node agent may take to answer a snapshot request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// Whether a snapshot record may go from `from` to `to` (a new attempt is a new record).
pub fn valid_transition(from: SnapshotPhase, to: SnapshotPhase) -> bool {
    use SnapshotPhase::*;
    matches!(
        (from, to),
        (Capturing, Capturing | Ready | Failed)
            | (Ready, Ready | Incompatible | Failed)
            | (Failed, Failed)
            | (Incompatible, Incompatible)
    )
}

/// What the snapshot's node looks like in the cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeView {
    /// Not known (no node recorded, or the node cache is not filled yet).
    Unknown,
    /// The node does not exist.
    Gone,
    /// The node exists; its `microvirt.io/host-facts` annotation.
    Present(Option<String>),
}

/// Inputs of one step.
#[derive(Clone, Debug)]
pub struct SnapshotInputs<'a> {
    /// `status.snapshot`.
    pub current: Option<&'a PoolSnapshot>,
    /// The current template's hash.
    pub hash: &'a str,
    /// Whether a snapshot is wanted (warm members configured and wanted).
    pub wanted: bool,
    /// The current record's builder pod, if the cache has it.
    pub builder: Option<&'a Pod>,
    /// The builder was created and the cache does not show it yet.
    pub builder_pending: bool,
    /// The snapshot request was written and the cache does not show it yet.
    pub request_pending: bool,
    /// The snapshot's node.
    pub node: NodeView,
    /// Warm members of this snapshot that failed to restore since the last step, and the last
    /// launcher message.
    pub restore_failures: (i32, Option<String>),
    /// Pool name (builder pod names).
    pub pool: &'a str,
    /// Seconds after boot before the snapshot.
    pub after_boot: Duration,
    /// Capture timeout.
    pub timeout: Duration,
    /// Now.
    pub now: Timestamp,
}

/// An Event to publish about the pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// Warning (else Normal).
    pub warning: bool,
    /// Reason.
    pub reason: &'static str,
    /// Message.
    pub message: String,
}

/// What one step decided.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SnapshotStep {
    /// The new `status.snapshot`.
    pub snapshot: Option<PoolSnapshot>,
    /// Create the builder pod of `snapshot`.
    pub create_builder: bool,
    /// Ask the node agent to take the snapshot: (pod, request id).
    pub request: Option<(String, String)>,
    /// Delete this builder pod.
    pub delete_builder: Option<String>,
    /// Look again after this long.
    pub requeue: Option<Duration>,
    /// Events.
    pub notes: Vec<Note>,
}

fn secs_since(now: Timestamp, t: Option<&Time>) -> Option<Duration> {
    let t = t?;
    Duration::try_from(now.duration_since(t.0)).ok()
}

fn backoff(attempt: i32) -> Duration {
    let shift = u32::try_from(attempt.saturating_sub(1))
        .unwrap_or(0)
        .min(16);
    (BACKOFF_MIN * 2u32.pow(shift)).min(BACKOFF_MAX)
}

/// A new Capturing record.
fn start(hash: &str, attempt: i32, pool: &str, now: Timestamp) -> PoolSnapshot {
    let id = snapshot_id(hash, attempt);
    PoolSnapshot {
        builder: Some(builder_pod_name(pool, &id)),
        id,
        template_hash: hash.to_string(),
        attempt,
        phase: SnapshotPhase::Capturing,
        started_at: Some(Time(now)),
        ..Default::default()
    }
}

fn pod_terminated(pod: &Pod) -> Option<(i32, String)> {
    let st = pod.status.as_ref()?;
    let term = st
        .container_statuses
        .as_ref()
        .and_then(|cs| cs.first())
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref());
    if let Some(t) = term {
        let msg = t
            .message
            .as_deref()
            .and_then(|m| m.lines().next())
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .map(str::to_string)
            .or_else(|| t.reason.clone())
            .unwrap_or_default();
        return Some((t.exit_code, msg));
    }
    match st.phase.as_deref() {
        Some("Failed") | Some("Succeeded") => Some((
            -1,
            st.message
                .clone()
                .or_else(|| st.reason.clone())
                .unwrap_or_default(),
        )),
        _ => None,
    }
}

/// The launcher's exit code and first termination-message line, if the pod has ended.
pub fn terminated(pod: &Pod) -> Option<(i32, String)> {
    pod_terminated(pod)
}

/// When the pod's condition `type_` turned True (None while it is not True).
fn true_since(pod: &Pod, type_: &str) -> Option<Timestamp> {
    let c = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)?;
    (c.status == "True").then(|| {
        c.last_transition_time
            .as_ref()
            .map(|t| t.0)
            .unwrap_or(Timestamp::UNIX_EPOCH)
    })
}

/// When the pod turned Ready (None while not Ready). A warm member is Ready once it restored
/// the snapshot and waits paused (the node agent's readiness gate, docs/pools.md).
pub fn ready_since(pod: &Pod) -> Option<Timestamp> {
    true_since(pod, "Ready")
}

/// When the guest signalled boot (the node agent's `microvirt.io/guest-booted` pod condition;
/// None before). A pod is Ready as soon as its VM runs, before the guest has booted, so a
/// builder's snapshot waits for this instead.
pub fn booted_since(pod: &Pod) -> Option<Timestamp> {
    true_since(pod, POD_CONDITION_GUEST_BOOTED)
}

impl SnapshotStep {
    fn set(&mut self, mut s: PoolSnapshot, to: SnapshotPhase, msg: Option<String>) {
        debug_assert!(valid_transition(s.phase, to), "{:?} -> {to:?}", s.phase);
        s.phase = to;
        if msg.is_some() {
            s.message = msg;
        }
        self.snapshot = Some(s);
    }

    fn fail(&mut self, s: &PoolSnapshot, why: String, now: Timestamp) {
        let mut s = s.clone();
        s.finished_at = Some(Time(now));
        s.builder = None;
        self.notes.push(Note {
            warning: true,
            reason: "SnapshotFailed",
            message: format!("snapshot {}: {why}", s.id),
        });
        self.requeue = Some(backoff(s.attempt));
        self.set(s, SnapshotPhase::Failed, Some(why));
    }

    fn begin(&mut self, hash: &str, attempt: i32, pool: &str, now: Timestamp, why: String) {
        let s = start(hash, attempt, pool, now);
        self.notes.push(Note {
            warning: false,
            reason: "SnapshotCapturing",
            message: format!("capturing snapshot {}: {why}", s.id),
        });
        self.create_builder = true;
        self.snapshot = Some(s);
    }
}

/// One step of the snapshot lifecycle.
pub fn step(inp: &SnapshotInputs) -> SnapshotStep {
    let mut out = SnapshotStep::default();
    let now = inp.now;
    let cur = match inp.current {
        Some(c) if c.template_hash == inp.hash => c,
        Some(c) => {
            if inp.wanted {
                out.begin(
                    inp.hash,
                    1,
                    inp.pool,
                    now,
                    format!("the template changed (was {})", c.template_hash),
                );
            }
            if let Some(b) = &c.builder {
                out.delete_builder = Some(b.clone());
            }
            return out;
        }
        None => {
            if inp.wanted {
                out.begin(
                    inp.hash,
                    1,
                    inp.pool,
                    now,
                    "first snapshot of this template".into(),
                );
            }
            return out;
        }
    };
    match cur.phase {
        SnapshotPhase::Capturing => capturing(inp, cur, &mut out),
        SnapshotPhase::Ready => {
            let mut s = cur.clone();
            let (n, msg) = &inp.restore_failures;
            s.restore_failures += n;
            if s.restore_failures >= MAX_RESTORE_FAILURES {
                let why = format!(
                    "{} warm members could not restore it: {}",
                    s.restore_failures,
                    msg.as_deref().unwrap_or("launcher failed")
                );
                out.fail(&s, why, now);
                return out;
            }
            let node = s.node.clone().unwrap_or_default();
            let incompatible = match (&inp.node, &s.host_facts) {
                (NodeView::Gone, _) => Some(format!("node {node} is gone")),
                (NodeView::Present(Some(now_facts)), Some(recorded)) if now_facts != recorded => {
                    Some(format!(
                        "node {node} reports {now_facts:?}; the snapshot was taken with {recorded:?}"
                    ))
                }
                _ => None,
            };
            match incompatible {
                Some(why) => {
                    out.notes.push(Note {
                        warning: true,
                        reason: "SnapshotIncompatible",
                        message: format!("snapshot {}: {why}", s.id),
                    });
                    s.finished_at = s.finished_at.or(Some(Time(now)));
                    out.set(s, SnapshotPhase::Incompatible, Some(why));
                }
                None => out.snapshot = Some(s),
            }
        }
        SnapshotPhase::Failed => {
            let waited = secs_since(now, cur.finished_at.as_ref()).unwrap_or(Duration::MAX);
            let wait = backoff(cur.attempt);
            if !inp.wanted || waited < wait {
                out.snapshot = Some(cur.clone());
                if inp.wanted {
                    out.requeue = Some(wait - waited);
                }
            } else {
                out.begin(
                    inp.hash,
                    cur.attempt + 1,
                    inp.pool,
                    now,
                    format!("attempt {} failed", cur.attempt),
                );
            }
        }
        SnapshotPhase::Incompatible => {
            if inp.wanted {
                out.begin(
                    inp.hash,
                    cur.attempt + 1,
                    inp.pool,
                    now,
                    format!("snapshot {} is incompatible", cur.id),
                );
            } else {
                out.snapshot = Some(cur.clone());
            }
        }
    }
    out
}

fn capturing(inp: &SnapshotInputs, cur: &PoolSnapshot, out: &mut SnapshotStep) {
    let now = inp.now;
    let mut s = cur.clone();
    let elapsed = secs_since(now, s.started_at.as_ref()).unwrap_or_default();
    let builder_name = s
        .builder
        .clone()
        .unwrap_or_else(|| builder_pod_name(inp.pool, &s.id));
    s.builder = Some(builder_name.clone());
    let Some(b) = inp.builder.filter(|b| b.name_any() == builder_name) else {
        if elapsed > inp.timeout {
            out.fail(
                &s,
                format!(
                    "the builder pod did not start within {} s",
                    inp.timeout.as_secs()
                ),
                now,
            );
        } else {
            // Not created yet (or gone before it produced anything): create it (a fixed name
            // makes this idempotent), unless the cache is only behind our own create.
            out.create_builder = !inp.builder_pending;
            out.snapshot = Some(s);
            out.requeue = Some(Duration::from_secs(5));
        }
        return;
    };
    if let Some(n) = b.spec.as_ref().and_then(|s| s.node_name.clone()) {
        s.node = Some(n);
    }
    let req_id = snapshot_request_id(&s.id);
    // The node agent's answer outlives the builder: once this controller marked the snapshot
    // Ready it deletes the builder, and a reconcile whose pool cache is older than that status
    // write sees a terminating or ended builder. Its answer still says the snapshot was taken.
    let taken = matches!(control_result(b, &req_id), Some(Ok(_)));
    if let Some((code, msg)) = pod_terminated(b).filter(|_| !taken) {
        out.delete_builder = Some(builder_name);
        out.fail(
            &s,
            format!("the builder's launcher ended (exit code {code}): {msg}"),
            now,
        );
        return;
    }
    if b.metadata.deletion_timestamp.is_some() && !taken {
        out.fail(&s, "the builder pod was deleted".into(), now);
        return;
    }
    let requested = taken
        || inp.request_pending
        || super::members::control_request_id(b) == Some(req_id.as_str());
    if requested {
        match control_result(b, &req_id) {
            Some(Ok(facts)) => {
                s.host_facts = Some(facts).filter(|f| !f.is_empty());
                s.finished_at = Some(Time(now));
                s.builder = None;
                s.message = None;
                out.delete_builder = Some(builder_name);
                out.notes.push(Note {
                    warning: false,
                    reason: "SnapshotReady",
                    message: format!(
                        "snapshot {} taken on node {} ({})",
                        s.id,
                        s.node.as_deref().unwrap_or("?"),
                        s.host_facts.as_deref().unwrap_or("no host facts")
                    ),
                });
                out.set(s, SnapshotPhase::Ready, None);
                // Check the new snapshot against the node at once.
                let again = SnapshotInputs {
                    current: out.snapshot.as_ref(),
                    restore_failures: (0, None),
                    ..inp.clone()
                };
                let next = step(&again);
                if next
                    .snapshot
                    .as_ref()
                    .is_some_and(|n| n.phase == SnapshotPhase::Incompatible)
                {
                    // A snapshot that does not match its own node at capture: the node agent
                    // and the Node disagree. Back off instead of capturing again at once.
                    let why = next
                        .snapshot
                        .as_ref()
                        .and_then(|n| n.message.clone())
                        .unwrap_or_default();
                    let mut ready = out.snapshot.take().unwrap_or_default();
                    ready.phase = SnapshotPhase::Capturing;
                    out.notes.clear();
                    out.fail(
                        &ready,
                        format!("taken, but does not match its node: {why}"),
                        now,
                    );
                }
            }
            Some(Err(e)) => {
                out.delete_builder = Some(builder_name);
                out.fail(&s, format!("the node agent could not take it: {e}"), now);
            }
            None if elapsed > inp.timeout + REQUEST_TIMEOUT => {
                out.delete_builder = Some(builder_name);
                out.fail(
                    &s,
                    "the node agent did not answer the snapshot request".into(),
                    now,
                );
            }
            None => {
                out.snapshot = Some(s);
                out.requeue = Some(Duration::from_secs(5));
            }
        }
        return;
    }
    match booted_since(b) {
        Some(since) => {
            // Condition times are whole seconds (RFC 3339 without a fraction): the guest may
            // have booted up to a second after `since`. Counting from the end of that second
            // never asks early; at worst it asks up to a second late.
            let booted_for = Duration::try_from(now.duration_since(since))
                .unwrap_or_default()
                .saturating_sub(CONDITION_TIME_GRANULARITY);
            if booted_for >= inp.after_boot {
                out.request = Some((builder_name, req_id));
            } else {
                out.requeue = Some(inp.after_boot - booted_for);
            }
            out.snapshot = Some(s);
        }
        None if elapsed > inp.timeout => {
            out.delete_builder = Some(builder_name);
            out.fail(
                &s,
                format!(
                    "the guest did not signal boot within {} s",
                    inp.timeout.as_secs()
                ),
                now,
            );
        }
        None => {
            out.requeue = Some((inp.timeout - elapsed).min(Duration::from_secs(5)));
            out.snapshot = Some(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStatus, PodCondition, PodSpec, PodStatus,
    };
    use microvirt_crds::vmi::{ANNOTATION_CONTROL_REQUEST, ANNOTATION_CONTROL_RESULT};
    use std::collections::BTreeMap;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    fn inputs<'a>(
        current: Option<&'a PoolSnapshot>,
        builder: Option<&'a Pod>,
        now: i64,
    ) -> SnapshotInputs<'a> {
        SnapshotInputs {
            current,
            hash: "h1",
            wanted: true,
            builder,
            builder_pending: false,
            request_pending: false,
            node: NodeView::Present(Some("cpu=A/1/2/3 kernel=k".into())),
            restore_failures: (0, None),
            pool: "web",
            after_boot: Duration::from_secs(2),
            timeout: Duration::from_secs(60),
            now: t(now),
        }
    }

    /// A builder whose VM has run (pod Ready) since second 3 and whose guest signalled boot at
    /// `booted_at`.
    fn builder(booted_at: Option<i64>, annotations: &[(&str, &str)]) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("virt-launcher-web-snap-h1-1".into());
        p.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        );
        p.spec = Some(PodSpec {
            node_name: Some("n1".into()),
            ..Default::default()
        });
        p.status = Some(PodStatus {
            phase: Some("Running".into()),
            conditions: Some(
                [("Ready", Some(3)), (POD_CONDITION_GUEST_BOOTED, booted_at)]
                    .into_iter()
                    .filter_map(|(type_, at)| {
                        Some(PodCondition {
                            type_: type_.into(),
                            status: "True".into(),
                            last_transition_time: Some(Time(t(at?))),
                            ..Default::default()
                        })
                    })
                    .collect(),
            ),
            ..Default::default()
        });
        p
    }

    #[test]
    fn transitions_are_checked() {
        use SnapshotPhase::*;
        let all = [Capturing, Ready, Failed, Incompatible];
        let ok: Vec<_> = all
            .iter()
            .flat_map(|a| all.iter().map(move |b| (*a, *b)))
            .filter(|(a, b)| valid_transition(*a, *b))
            .collect();
        assert_eq!(
            ok,
            vec![
                (Capturing, Capturing),
                (Capturing, Ready),
                (Capturing, Failed),
                (Ready, Ready),
                (Ready, Failed),
                (Ready, Incompatible),
                (Failed, Failed),
                (Incompatible, Incompatible),
            ]
        );
    }

    #[test]
    fn a_capture_boots_waits_after_boot_requests_and_becomes_ready() {
        // First sight: start attempt 1 and create the builder.
        let s0 = step(&inputs(None, None, 0));
        assert!(s0.create_builder);
        let snap = s0.snapshot.clone().unwrap();
        assert_eq!(snap.id, "h1-1");
        assert_eq!(snap.phase, SnapshotPhase::Capturing);
        assert_eq!(snap.builder.as_deref(), Some("virt-launcher-web-snap-h1-1"));

        // Created, cache behind: no second create.
        let mut i = inputs(Some(&snap), None, 1);
        i.builder_pending = true;
        assert!(!step(&i).create_builder);

        // Booting: the pod is Ready (its VM runs) since second 3, but the guest has not
        // signalled boot: no snapshot, however long ago the pod turned Ready.
        let b = builder(None, &[]);
        for now in [5, 30] {
            let s = step(&inputs(Some(&snap), Some(&b), now));
            assert!(s.request.is_none());
            assert_eq!(s.snapshot.as_ref().unwrap().node.as_deref(), Some("n1"));
        }

        // Booted at second 9 (at any time within it): at second 10 it may have been
        // booted for only a moment, wait 2 s more; at second 11, 1 s more.
        let b = builder(Some(9), &[]);
        let s = step(&inputs(Some(&snap), Some(&b), 10));
        assert!(s.request.is_none());
        assert_eq!(s.requeue, Some(Duration::from_secs(2)));
        let s = step(&inputs(Some(&snap), Some(&b), 11));
        assert!(s.request.is_none());
        assert_eq!(s.requeue, Some(Duration::from_secs(1)));
        // Booted for at least 2 s: request it.
        let s = step(&inputs(Some(&snap), Some(&b), 12));
        assert_eq!(
            s.request,
            Some((
                "virt-launcher-web-snap-h1-1".to_string(),
                "snap-h1-1".to_string()
            ))
        );
        let snap = s.snapshot.unwrap();

        // Answered ok with host facts: Ready, builder deleted.
        let b = builder(
            Some(9),
            &[
                (ANNOTATION_CONTROL_REQUEST, "snap-h1-1 snapshot"),
                (
                    ANNOTATION_CONTROL_RESULT,
                    "snap-h1-1 ok cpu=A/1/2/3 kernel=k",
                ),
            ],
        );
        let s = step(&inputs(Some(&snap), Some(&b), 12));
        let ready = s.snapshot.unwrap();
        assert_eq!(ready.phase, SnapshotPhase::Ready);
        assert_eq!(ready.host_facts.as_deref(), Some("cpu=A/1/2/3 kernel=k"));
        assert_eq!(ready.node.as_deref(), Some("n1"));
        assert_eq!(ready.builder, None);
        assert_eq!(
            s.delete_builder.as_deref(),
            Some("virt-launcher-web-snap-h1-1")
        );
        assert_eq!(s.notes[0].reason, "SnapshotReady");

        // A pool cache older than the Ready status, with a builder cache that already shows
        // the builder's deletion: the answer on the builder still makes it Ready, not Failed.
        let mut deleting = b.clone();
        deleting.metadata.deletion_timestamp = Some(Time(t(13)));
        let s = step(&inputs(Some(&snap), Some(&deleting), 13));
        assert_eq!(s.snapshot.unwrap().phase, SnapshotPhase::Ready);
        let mut ended = b.clone();
        ended.status = Some(PodStatus {
            phase: Some("Succeeded".into()),
            container_statuses: Some(vec![k8s_openapi::api::core::v1::ContainerStatus {
                name: "compute".into(),
                state: Some(k8s_openapi::api::core::v1::ContainerState {
                    terminated: Some(k8s_openapi::api::core::v1::ContainerStateTerminated {
                        exit_code: 0,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let s = step(&inputs(Some(&snap), Some(&ended), 13));
        assert_eq!(s.snapshot.unwrap().phase, SnapshotPhase::Ready);
        // Without an answer, a deleted builder fails the attempt.
        let mut unanswered = builder(Some(9), &[]);
        unanswered.metadata.deletion_timestamp = Some(Time(t(13)));
        let s = step(&inputs(Some(&snap), Some(&unanswered), 13));
        assert_eq!(s.snapshot.unwrap().phase, SnapshotPhase::Failed);

        // Stays Ready while the node agrees.
        let s = step(&inputs(Some(&ready), None, 100));
        assert_eq!(s.snapshot.as_ref().unwrap().phase, SnapshotPhase::Ready);
        assert!(!s.create_builder);
    }

    #[test]
    fn a_ready_snapshot_whose_node_changed_is_incompatible_and_recaptured() {
        let mut ready = start("h1", 1, "web", t(0));
        ready.phase = SnapshotPhase::Ready;
        ready.node = Some("n1".into());
        ready.host_facts = Some("cpu=Other/6/85/7 kernel=k".into());
        let s = step(&inputs(Some(&ready), None, 50));
        let inc = s.snapshot.unwrap();
        assert_eq!(inc.phase, SnapshotPhase::Incompatible);
        assert!(inc.message.as_deref().unwrap().contains("cpu=Other/6/85/7"));
        assert_eq!(s.notes[0].reason, "SnapshotIncompatible");
        // The next step starts attempt 2 at once.
        let s = step(&inputs(Some(&inc), None, 51));
        let next = s.snapshot.unwrap();
        assert_eq!(
            (next.id.as_str(), next.phase),
            ("h1-2", SnapshotPhase::Capturing)
        );
        assert!(s.create_builder);
        // A node that is gone.
        let mut i = inputs(Some(&ready), None, 50);
        i.node = NodeView::Gone;
        assert_eq!(
            step(&i).snapshot.unwrap().phase,
            SnapshotPhase::Incompatible
        );
        // A node without facts (agent not running there) does not invalidate it.
        i.node = NodeView::Present(None);
        assert_eq!(step(&i).snapshot.unwrap().phase, SnapshotPhase::Ready);
    }

    #[test]
    fn failures_back_off_and_restore_failures_count() {
        let snap = start("h1", 1, "web", t(0));
        // The guest never boots.
        let b = builder(None, &[]);
        let s = step(&inputs(Some(&snap), Some(&b), 61));
        let failed = s.snapshot.unwrap();
        assert_eq!(failed.phase, SnapshotPhase::Failed);
        assert!(failed
            .message
            .as_deref()
            .unwrap()
            .contains("did not signal boot within 60 s"));
        assert_eq!(
            s.delete_builder.as_deref(),
            Some("virt-launcher-web-snap-h1-1")
        );
        // Back-off: 10 s for attempt 1.
        let s = step(&inputs(Some(&failed), None, 65));
        assert_eq!(s.snapshot.as_ref().unwrap().phase, SnapshotPhase::Failed);
        assert_eq!(s.requeue, Some(Duration::from_secs(6)));
        let s = step(&inputs(Some(&failed), None, 71));
        assert_eq!(s.snapshot.unwrap().id, "h1-2");
        assert_eq!(backoff(4), Duration::from_secs(80));
        assert_eq!(backoff(40), BACKOFF_MAX);

        // The builder's launcher fails.
        let mut b = builder(None, &[]);
        b.status.as_mut().unwrap().container_statuses = Some(vec![ContainerStatus {
            name: "compute".into(),
            state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 3,
                    message: Some("cannot open /dev/kvm\n".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]);
        let s = step(&inputs(Some(&snap), Some(&b), 5));
        let m = s.snapshot.unwrap().message.unwrap();
        assert!(
            m.contains("exit code 3") && m.contains("cannot open /dev/kvm"),
            "{m}"
        );

        // The node agent refuses.
        let b = builder(
            Some(1),
            &[
                (ANNOTATION_CONTROL_REQUEST, "snap-h1-1 snapshot"),
                (ANNOTATION_CONTROL_RESULT, "snap-h1-1 error no space left"),
            ],
        );
        let s = step(&inputs(Some(&snap), Some(&b), 5));
        assert!(s
            .snapshot
            .unwrap()
            .message
            .unwrap()
            .contains("no space left"));

        // Restore failures accumulate to Failed.
        let mut ready = snap.clone();
        ready.phase = SnapshotPhase::Ready;
        let mut i = inputs(Some(&ready), None, 5);
        i.node = NodeView::Unknown;
        i.restore_failures = (2, Some("snapshot taken on another CPU".into()));
        let s = step(&i);
        let r = s.snapshot.unwrap();
        assert_eq!((r.phase, r.restore_failures), (SnapshotPhase::Ready, 2));
        let mut i = inputs(Some(&r), None, 6);
        i.restore_failures = (1, Some("snapshot taken on another CPU".into()));
        let r = step(&i).snapshot.unwrap();
        assert_eq!(r.phase, SnapshotPhase::Failed);
        assert!(r.message.unwrap().contains("another CPU"));
    }

    #[test]
    fn a_snapshot_that_does_not_match_its_node_at_capture_fails_instead_of_looping() {
        let snap = start("h1", 1, "web", t(0));
        let b = builder(
            Some(1),
            &[
                (ANNOTATION_CONTROL_REQUEST, "snap-h1-1 snapshot"),
                (
                    ANNOTATION_CONTROL_RESULT,
                    "snap-h1-1 ok cpu=B/1/1/1 kernel=k",
                ),
            ],
        );
        let s = step(&inputs(Some(&snap), Some(&b), 5));
        let f = s.snapshot.unwrap();
        assert_eq!(f.phase, SnapshotPhase::Failed);
        assert!(f.message.unwrap().contains("does not match its node"));
        assert_eq!(
            s.delete_builder.as_deref(),
            Some("virt-launcher-web-snap-h1-1")
        );
    }

    #[test]
    fn a_template_change_starts_over() {
        let mut old = start("h0", 4, "web", t(0));
        old.phase = SnapshotPhase::Ready;
        let s = step(&inputs(Some(&old), None, 5));
        let n = s.snapshot.unwrap();
        assert_eq!((n.id.as_str(), n.attempt), ("h1-1", 1));
        assert!(s.create_builder);
        // Not wanted (warm removed): nothing is started.
        let mut i = inputs(Some(&old), None, 5);
        i.wanted = false;
        assert_eq!(step(&i).snapshot, None);
        let mut i = inputs(None, None, 5);
        i.wanted = false;
        assert_eq!(step(&i), SnapshotStep::default());
    }
}
