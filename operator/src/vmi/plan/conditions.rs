//! The VMI's conditions: Ready from the launcher pod's readiness, and how a condition keeps its
//! `lastTransitionTime`.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use microvirt_crds::vmi::{VmiCondition, POD_CONDITION_VM_RUNNING};

use super::REASON_POD_NOT_READY;

/// Why a launcher pod whose container runs is not Ready: the node agent's readiness gate
/// (`VMPaused`, `VMStarting`, `VMStopped`, with its message), else `PodNotReady` with the
/// kubelet's message (e.g. the gate is not set yet: the agent has not reached the launcher).
pub(super) fn not_ready_reason(pod: Option<&Pod>) -> (String, Option<String>) {
    let conds = pod
        .and_then(|p| p.status.as_ref())
        .and_then(|s| s.conditions.as_ref());
    let find = |t: &str| conds.and_then(|cs| cs.iter().find(|c| c.type_ == t));
    if let Some(g) = find(POD_CONDITION_VM_RUNNING).filter(|c| c.status != "True") {
        if let Some(r) = g.reason.clone().filter(|r| !r.is_empty()) {
            return (r, g.message.clone().filter(|m| !m.is_empty()));
        }
    }
    (
        REASON_POD_NOT_READY.to_string(),
        find("Ready")
            .filter(|c| c.status != "True")
            .and_then(|c| c.message.clone())
            .filter(|m| !m.is_empty()),
    )
}

/// Whether the pod is Ready, by the kubelet's rule: with readiness gates, its containers are
/// ready (`ContainersReady`) and every gate's condition is `True`; without, its `Ready`. The
/// rule is evaluated here rather than waiting for the kubelet to write `Ready`: when the node
/// agent sets the launcher's gate, the VMI turns Ready without the kubelet's pod sync and
/// status write in between (the pod's own `Ready`, which Services follow, comes a moment
/// later), and a gate that turned `False` (paused) counts at once.
pub(super) fn pod_ready(pod: &Pod) -> bool {
    let is_true = |t: &str| {
        pod.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == t))
            .is_some_and(|c| c.status == "True")
    };
    let gates = pod
        .spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_deref())
        .unwrap_or_default();
    if gates.is_empty() {
        is_true("Ready")
    } else {
        is_true("ContainersReady") && gates.iter().all(|g| is_true(&g.condition_type))
    }
}

/// Set or update a condition, keeping `lastTransitionTime` when the status did not change.
pub(super) fn set_condition(
    conditions: &mut Vec<VmiCondition>,
    old: &[VmiCondition],
    type_: &str,
    status: bool,
    reason: &str,
    now: &Time,
) {
    set_condition_msg(conditions, old, type_, status, reason, None, now);
}

/// [`set_condition`] with a message.
pub(super) fn set_condition_msg(
    conditions: &mut Vec<VmiCondition>,
    old: &[VmiCondition],
    type_: &str,
    status: bool,
    reason: &str,
    message: Option<String>,
    now: &Time,
) {
    let status_s = if status { "True" } else { "False" };
    let prev = old.iter().find(|c| c.type_ == type_);
    let last_transition_time = match prev {
        Some(p) if p.status == status_s => p.last_transition_time.clone(),
        _ => Some(now.clone()),
    };
    conditions.push(VmiCondition {
        type_: type_.into(),
        status: status_s.into(),
        reason: Some(reason.into()),
        message,
        last_transition_time,
    });
}
