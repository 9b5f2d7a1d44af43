//! What the launcher pod says: the VMI's phase (with the launcher's termination message), why a
//! pod that is not running yet is stuck, and the boot time.

use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod};
use kube::ResourceExt;
use microvirt_crds::termination::{exit_code, Reason, ShutdownOrigin, TerminationMessage};
use microvirt_crds::vmi::VmiPhase;

use super::{REASON_LAUNCHER_STOPPED, REASON_LIVENESS_PROBE_FAILED};
use crate::pod::{ANNOTATION_BOOT_TIME_MS, COMPUTE_CONTAINER};

/// The terminated state of the compute container, if it has terminated.
fn compute_terminated(pod: &Pod) -> Option<&ContainerStateTerminated> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == COMPUTE_CONTAINER)?
        .state
        .as_ref()?
        .terminated
        .as_ref()
}

/// Whether the compute container has a liveness probe (the VMI's `livenessProbe`).
fn compute_has_liveness_probe(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|c| c.name == COMPUTE_CONTAINER))
        .is_some_and(|c| c.liveness_probe.is_some())
}

fn compute_running(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == COMPUTE_CONTAINER))
        .and_then(|c| c.state.as_ref())
        .is_some_and(|s| s.running.is_some())
}

/// The VMI reason of a launcher that exited with `code` and no reason that
/// [`Reason::is_vmi_reason`].
fn launcher_exited(code: impl std::fmt::Display) -> String {
    format!("LauncherExited{code}")
}

/// Whether a VMI that ended `Failed` with `reason` failed before its VM ran, although its
/// launcher's container ran (the VMI was `Running`): the launcher could not set the VM up (no
/// bootable kernel, a bad spec, a disk or KVM that could not be opened). KubeVirt's VMI is
/// `Running` only once its domain runs, so there such a failure never reached `Running`; the
/// VM controller counts it as a start failure all the same.
pub fn failed_before_the_vm_ran(reason: &str) -> bool {
    // The launcher's exit codes of a VM that never ran: bad usage or an invalid VMI, and a
    // setup that failed (disks, kernel, KVM).
    reason == Reason::NoBootableKernel.as_str()
        || reason == launcher_exited(exit_code::USAGE)
        || reason == launcher_exited(exit_code::SETUP)
}

/// First line of a termination message, trimmed and capped at 256 bytes.
pub fn termination_reason(message: &str) -> Option<String> {
    Some(TerminationMessage::parse(message).message).filter(|m| !m.is_empty())
}

/// `bootTimeMs=<n>` from a termination message.
pub fn termination_boot_time_ms(message: &str) -> Option<u64> {
    TerminationMessage::parse(message).boot_time_ms
}

/// Phase, reason and message from the pod. `vmi_deleting`: the VMI has a deletion timestamp
/// (then a stop the launcher was asked for is the expected end, not a failure).
pub fn pod_phase(pod: &Pod, vmi_deleting: bool) -> (VmiPhase, Option<String>, Option<String>) {
    let pod_phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    let term = compute_terminated(pod);
    let term_msg = TerminationMessage::parse(term.and_then(|t| t.message.as_deref()).unwrap_or(""));
    let term_reason = Some(term_msg.message.clone()).filter(|m| !m.is_empty());
    // The launcher was stopped from outside the guest: it says so, or the pod is being deleted,
    // or the kubelet failed a pod whose container exited 0 (eviction, node shutdown).
    let pod_deleting = pod.metadata.deletion_timestamp.is_some();
    let stopped_from_outside = !vmi_deleting
        && (term_msg.shutdown_requested.is_some() || pod_deleting || pod_phase == Some("Failed"));
    // The kubelet signalled the launcher although nobody deleted the pod and the kubelet did not
    // fail it (eviction, node shutdown: a pod reason): with a liveness probe on the container,
    // that is the probe failing. The launcher then asked the guest to power off, and exited
    // 0 (it did) or GracePeriodExpired (a hung guest did not).
    let liveness_failed = !vmi_deleting
        && !pod_deleting
        && term_msg.shutdown_requested == Some(ShutdownOrigin::Signal)
        && pod
            .status
            .as_ref()
            .and_then(|s| s.reason.as_ref())
            .is_none()
        && compute_has_liveness_probe(pod);
    match (pod_phase, term) {
        (_, Some(_)) if liveness_failed => (
            VmiPhase::Failed,
            Some(REASON_LIVENESS_PROBE_FAILED.into()),
            termination_reason(&format!(
                "livenessProbe failed, the kubelet stopped the launcher: {}",
                term_reason.unwrap_or_else(|| "VM stopped".into())
            )),
        ),
        (_, Some(t)) if t.exit_code == 0 && stopped_from_outside => {
            let why = pod
                .status
                .as_ref()
                .and_then(|s| s.reason.clone())
                .or_else(|| pod_deleting.then(|| "launcher pod deleted".to_string()))
                .unwrap_or_else(|| "launcher asked to stop the VM".to_string());
            let first = term_reason.unwrap_or_else(|| "VM stopped".into());
            (
                VmiPhase::Failed,
                Some(REASON_LAUNCHER_STOPPED.into()),
                termination_reason(&format!("{why}: {first}")),
            )
        }
        (_, Some(t)) if t.exit_code == 0 => (VmiPhase::Succeeded, None, term_reason),
        (_, Some(t)) => (
            VmiPhase::Failed,
            Some(
                term_msg
                    .reason
                    .clone()
                    .filter(|r| Reason::parse(r).is_some_and(Reason::is_vmi_reason))
                    .unwrap_or_else(|| launcher_exited(t.exit_code)),
            ),
            term_reason.or_else(|| t.reason.clone()),
        ),
        (Some("Succeeded"), None) => (VmiPhase::Succeeded, None, None),
        (Some("Failed"), None) => (
            VmiPhase::Failed,
            Some(
                pod.status
                    .as_ref()
                    .and_then(|s| s.reason.clone())
                    .unwrap_or_else(|| "PodFailed".into()),
            ),
            pod.status.as_ref().and_then(|s| s.message.clone()),
        ),
        (Some("Unknown"), None) => (VmiPhase::Unknown, None, None),
        _ if compute_running(pod) => (VmiPhase::Running, None, None),
        _ if pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| !n.is_empty()) =>
        {
            (VmiPhase::Scheduled, None, None)
        }
        _ => (VmiPhase::Scheduling, None, None),
    }
}

/// Why a launcher pod that is not running yet is stuck, as the kubelet and scheduler report
/// it: the pod's `PodScheduled=False` (e.g. `Unschedulable`, "0/1 nodes are available: 1
/// Insufficient memory"), or the compute container waiting with a reason other than the
/// normal `ContainerCreating`/`PodInitializing` (`ErrImagePull`, `ImagePullBackOff`,
/// `ErrImageNeverPull`, `CreateContainerError`, …). KubeVirt shows the same on the VMI.
pub fn pod_not_running_reason(pod: &Pod) -> Option<(&'static str, String, String)> {
    let st = pod.status.as_ref()?;
    if let Some(c) = st
        .conditions
        .as_ref()
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
        .filter(|c| c.status == "False")
    {
        return Some((
            "PodScheduled",
            c.reason.clone().unwrap_or_else(|| "Unschedulable".into()),
            c.message.clone().unwrap_or_default(),
        ));
    }
    let waiting = st
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == COMPUTE_CONTAINER)?
        .state
        .as_ref()?
        .waiting
        .as_ref()?;
    let reason = waiting.reason.clone()?;
    if matches!(reason.as_str(), "ContainerCreating" | "PodInitializing") {
        return None;
    }
    Some(("Ready", reason, waiting.message.clone().unwrap_or_default()))
}

/// Boot time from the pod: termination message line `bootTimeMs=<n>`, else the annotation.
pub fn boot_time_ms(pod: &Pod) -> Option<u64> {
    compute_terminated(pod)
        .and_then(|t| t.message.as_deref())
        .and_then(termination_boot_time_ms)
        .or_else(|| {
            pod.annotations()
                .get(ANNOTATION_BOOT_TIME_MS)
                .and_then(|v| v.trim().parse().ok())
        })
}
