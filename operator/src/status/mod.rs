//! VMI status derived from its launcher pod (pure: no API calls).
//!
//! | pod                                                   | VMI phase  |
//! |-------------------------------------------------------|------------|
//! | none yet                                              | Pending    |
//! | created, no `spec.nodeName`                           | Scheduling |
//! | node assigned, compute container not running          | Scheduled  |
//! | compute container running                             | Running    |
//! | compute container exited 0, the guest chose to stop   | Succeeded  |
//! | compute container exited 0 after the launcher was asked to stop the VM (pod deleted, evicted, node shut down) and the VMI is not being deleted | Failed (`LauncherStopped`) |
//! | pod Succeeded without container status                | Succeeded  |
//! | compute container exited non-zero                     | Failed (`GuestCrashed`, `VmmFailed`, `NoBootableKernel` as the launcher says, else `LauncherExited<code>`) |
//! | compute container stopped by the kubelet because its liveness probe (the VMI's `livenessProbe`) failed | Failed (`LivenessProbeFailed`) |
//! | pod Failed                                            | Failed     |
//! | pod phase Unknown                                     | Unknown    |
//! | pod gone after the VMI got past Pending               | Failed     |
//!
//! A stop the launcher was asked for is told from one the guest chose by the termination message's
//! `shutdownRequested` key (or, should the message be lost, by the pod's deletion timestamp), so a
//! VM with `runStrategy: RerunOnFailure` or `Always` comes back after a node drain: KubeVirt
//! documents that only a guest that stopped by itself keeps a `RerunOnFailure` VM down
//! (kubevirt/kubevirt#9823 is the bug report where KubeVirt itself gets this wrong).
//!
//! Ready comes from the pod's Ready condition (KubeVirt's Ready: the VM runs in a Ready launcher
//! pod; the pod's only readiness gate, `microvirt.io/vm-running`, is the node agent's, True
//! while the launcher's VM runs, so a paused VMI is not Ready) and, for a VMI
//! claimed from a pool's warm member, the node agent's answer to the claim's resume request
//! (`microvirt.io/control-result: claim-<uid> ok`; an error fails the VMI). `Paused` is the
//! node agent's (virt-handler): kept as it is while the VMI runs, `False` once it is final.
//! `bootTimeMs` comes
//! from a `bootTimeMs=<n>` line of the launcher's termination message, or from the pod annotation
//! `microvirt.io/boot-time-ms` when a node agent sets one.

use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use microvirt_crds::termination::{exit_code, Reason, ShutdownOrigin, TerminationMessage};
use microvirt_crds::vmi::{
    InterfaceStatus, PhaseTransitionTimestamp, VirtualMachineInstance,
    VirtualMachineInstanceStatus, VmiCondition, VmiPhase, NODE_AGENT_CONDITIONS,
    POD_CONDITION_VM_RUNNING, REASON_VM_RUNNING,
};

use crate::pod::{ANNOTATION_BOOT_TIME_MS, COMPUTE_CONTAINER};

/// Reason set when the launcher pod disappeared under a started VMI.
pub const REASON_POD_GONE: &str = "LauncherPodGone";
/// Reason set when the launcher stopped the VM because it was asked to (SIGTERM from the kubelet:
/// pod deleted or evicted, node shutting down) while the VMI itself was not being deleted.
pub const REASON_LAUNCHER_STOPPED: &str = "LauncherStopped";
/// Reason set when the kubelet stopped the launcher because the VMI's `livenessProbe` (the
/// compute container's liveness probe) failed; the pod never restarts (`restartPolicy: Never`),
/// so the VMI fails, as in KubeVirt.
pub const REASON_LIVENESS_PROBE_FAILED: &str = "LivenessProbeFailed";
/// Reason set when the node agent could not resume a claimed warm member.
pub const REASON_RESUME_FAILED: &str = "ResumeFailed";
/// Reason of `Ready=False` when the launcher pod is not Ready for another reason than the node
/// agent's readiness gate (or the gate is not set yet).
pub const REASON_POD_NOT_READY: &str = "PodNotReady";

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

/// Why a launcher pod whose container runs is not Ready: the node agent's readiness gate
/// (`VMPaused`, `VMStarting`, `VMStopped`, with its message), else `PodNotReady` with the
/// kubelet's message (e.g. the gate is not set yet: the agent has not reached the launcher).
fn not_ready_reason(pod: Option<&Pod>) -> (String, Option<String>) {
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
fn pod_ready(pod: &Pod) -> bool {
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
fn set_condition(
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
fn set_condition_msg(
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

/// The status a VMI should have, given its launcher pod (`None` when there is none) and `now`.
///
/// Pure and idempotent: called again with the same inputs it returns the same status, so the
/// reconciler only writes when something changed.
pub fn desired_status(
    vmi: &VirtualMachineInstance,
    pod: Option<&Pod>,
    now: &Time,
) -> VirtualMachineInstanceStatus {
    let old = vmi.status.clone().unwrap_or_default();
    let old_phase = old.phase;

    // A final phase never changes again.
    if let Some(p) = old_phase.filter(|p| p.is_final()) {
        let mut st = old.clone();
        st.phase = Some(p);
        let mut conds = Vec::new();
        set_condition(
            &mut conds,
            &old.conditions,
            "Ready",
            false,
            "VMIFinished",
            now,
        );
        set_condition(
            &mut conds,
            &old.conditions,
            "Paused",
            false,
            "NotPaused",
            now,
        );
        st.conditions = conds;
        if let Some(pod) = pod {
            if st.boot_time_ms.is_none() {
                st.boot_time_ms = boot_time_ms(pod);
            }
        }
        return st;
    }

    let (phase, reason, message, ready, node, interfaces, launcher, boot) = match pod {
        None => {
            if old_phase.is_some_and(|p| p != VmiPhase::Pending) {
                (
                    VmiPhase::Failed,
                    Some(REASON_POD_GONE.to_string()),
                    Some("the launcher pod was deleted".to_string()),
                    false,
                    old.node_name.clone(),
                    old.interfaces.clone(),
                    old.launcher_pod.clone(),
                    old.boot_time_ms,
                )
            } else {
                (
                    VmiPhase::Pending,
                    None,
                    None,
                    false,
                    None,
                    vec![],
                    None,
                    None,
                )
            }
        }
        Some(pod) => {
            let deleting = vmi.metadata.deletion_timestamp.is_some();
            let (mut phase, mut reason, mut message) = pod_phase(pod, deleting);
            // A pool member claimed from the warm pool is Ready once the node agent confirms
            // that it resumed the launcher; a failed resume fails the VMI.
            let resume = crate::pool::members::resume_state(pod);
            if let (Some(Err(e)), false) = (&resume, phase.is_final()) {
                phase = VmiPhase::Failed;
                reason = Some(REASON_RESUME_FAILED.to_string());
                message = Some(format!("resuming the warm member failed: {e}"));
            }
            let ready =
                phase == VmiPhase::Running && pod_ready(pod) && matches!(resume, Some(Ok(())));
            let node = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .filter(|n| !n.is_empty());
            let ps = pod.status.as_ref();
            let ip = ps
                .and_then(|s| s.pod_ip.clone())
                .filter(|ip| !ip.is_empty());
            let ips: Vec<String> = ps
                .and_then(|s| s.pod_ips.as_ref())
                .map(|v| v.iter().map(|p| p.ip.clone()).collect())
                .unwrap_or_default();
            // The VMI's interface, or the one the operator added (the binding does not matter
            // here, only the name).
            let default_iface = crate::pod::default_pod_interface(
                &vmi.spec,
                crate::config::DefaultBinding::Masquerade,
            )
            .map(|(i, _)| i);
            let iface_spec = vmi
                .spec
                .domain
                .devices
                .as_ref()
                .and_then(|d| d.interfaces.first())
                .or(default_iface.as_ref());
            let interfaces = if ip.is_some() || iface_spec.is_some() {
                vec![InterfaceStatus {
                    name: iface_spec.map(|i| i.name.clone()),
                    ip_address: ip,
                    ip_addresses: ips,
                    mac: iface_spec.and_then(|i| i.mac_address.clone()),
                }]
            } else {
                vec![]
            };
            (
                phase,
                reason,
                message,
                ready,
                node,
                interfaces,
                Some(pod.name_any()),
                boot_time_ms(pod).or(old.boot_time_ms),
            )
        }
    };

    // Never step back (Running → Scheduled, …): that only happens with a pod read from a cache
    // older than the one the current status was computed from; keep the status until it catches up.
    if let (Some(o), Some(n)) = (old_phase.and_then(rank), rank(phase)) {
        if n < o {
            return old;
        }
    }

    let mut transitions = old.phase_transition_timestamps.clone();
    if old_phase != Some(phase) || transitions.is_empty() {
        transitions.push(PhaseTransitionTimestamp {
            phase,
            phase_transition_timestamp: now.clone(),
        });
    }
    let mut conditions = Vec::new();
    let stuck = pod
        .filter(|_| matches!(phase, VmiPhase::Scheduling | VmiPhase::Scheduled))
        .and_then(pod_not_running_reason);
    match &stuck {
        Some(("Ready", why, msg)) => set_condition_msg(
            &mut conditions,
            &old.conditions,
            "Ready",
            false,
            why,
            Some(msg.clone()).filter(|m| !m.is_empty()),
            now,
        ),
        _ => {
            let (why, msg) = if ready {
                (REASON_VM_RUNNING.to_string(), None)
            } else {
                not_ready_reason(pod.filter(|_| phase == VmiPhase::Running))
            };
            set_condition_msg(
                &mut conditions,
                &old.conditions,
                "Ready",
                ready,
                &why,
                msg,
                now,
            )
        }
    }
    if let Some(("PodScheduled", why, msg)) = &stuck {
        set_condition_msg(
            &mut conditions,
            &old.conditions,
            "PodScheduled",
            false,
            why,
            Some(msg.clone()).filter(|m| !m.is_empty()),
            now,
        );
    }
    if phase.is_final() {
        // The launcher is gone: nothing is paused any more.
        set_condition(
            &mut conditions,
            &old.conditions,
            "Paused",
            false,
            "NotPaused",
            now,
        );
    } else {
        // Paused belongs to the node agent (virt-handler), which asks the launcher: keep what
        // it reported (the apply in the controller leaves it out, see `operator_owned`).
        conditions.extend(
            old.conditions
                .iter()
                .filter(|c| NODE_AGENT_CONDITIONS.contains(&c.type_.as_str()))
                .cloned(),
        );
    }

    VirtualMachineInstanceStatus {
        phase: Some(phase),
        reason,
        message,
        conditions,
        phase_transition_timestamps: transitions,
        node_name: node,
        interfaces,
        launcher_pod: launcher,
        boot_time_ms: boot,
    }
}

/// The part of `st` the operator applies: while the VMI is not final, the conditions the node
/// agent owns (Paused) are left out, so the operator's server-side apply neither takes them
/// over nor sets them back from a stale cache. A final VMI has no launcher any more: the
/// operator then reports `Paused=False` itself.
pub fn operator_owned(st: &VirtualMachineInstanceStatus) -> VirtualMachineInstanceStatus {
    let mut st = st.clone();
    if !st.phase.is_some_and(VmiPhase::is_final) {
        st.conditions
            .retain(|c| !NODE_AGENT_CONDITIONS.contains(&c.type_.as_str()));
    }
    st
}

/// The status of a VMI that failed before it got a launcher pod (invalid spec, pod refused).
pub fn failed_status(
    vmi: &VirtualMachineInstance,
    reason: &str,
    message: &str,
    now: &Time,
) -> VirtualMachineInstanceStatus {
    let mut st = vmi.status.clone().unwrap_or_default();
    if st.phase.is_some_and(|p| p.is_final()) {
        return st;
    }
    st.phase = Some(VmiPhase::Failed);
    st.reason = Some(reason.to_string());
    st.message = termination_reason(message);
    st.phase_transition_timestamps
        .push(PhaseTransitionTimestamp {
            phase: VmiPhase::Failed,
            phase_transition_timestamp: now.clone(),
        });
    let old = std::mem::take(&mut st.conditions);
    set_condition(&mut st.conditions, &old, "Ready", false, "VMIFinished", now);
    set_condition(&mut st.conditions, &old, "Paused", false, "NotPaused", now);
    st
}

/// Order of the non-final phases a VMI walks through (None for Unknown and final phases).
fn rank(p: VmiPhase) -> Option<u8> {
    match p {
        VmiPhase::Pending => Some(0),
        VmiPhase::Scheduling => Some(1),
        VmiPhase::Scheduled => Some(2),
        VmiPhase::Running => Some(3),
        _ => None,
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStatus, PodCondition, PodIP, PodSpec,
        PodStatus,
    };
    use k8s_openapi::jiff::Timestamp;

    fn t(s: i64) -> Time {
        Time(Timestamp::from_second(s).unwrap())
    }

    fn vmi() -> VirtualMachineInstance {
        let mut v = VirtualMachineInstance::new("vm1", Default::default());
        v.metadata.namespace = Some("ns".into());
        v.metadata.uid = Some("uid".into());
        v
    }

    fn pod(node: Option<&str>, state: Option<ContainerState>, phase: &str, ready: bool) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("virt-launcher-vm1".into());
        p.spec = Some(PodSpec {
            node_name: node.map(String::from),
            ..Default::default()
        });
        p.status = Some(PodStatus {
            phase: Some(phase.into()),
            pod_ip: Some("10.0.0.5".into()),
            pod_ips: Some(vec![PodIP {
                ip: "10.0.0.5".into(),
            }]),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            container_statuses: state.map(|s| {
                vec![ContainerStatus {
                    name: COMPUTE_CONTAINER.into(),
                    state: Some(s),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        });
        p
    }

    fn running() -> Option<ContainerState> {
        Some(ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        })
    }

    fn terminated(code: i32, msg: &str) -> Option<ContainerState> {
        Some(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: code,
                message: Some(msg.into()),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    #[test]
    fn phases_follow_the_pod() {
        let v = vmi();
        let now = t(100);
        assert_eq!(
            desired_status(&v, None, &now).phase,
            Some(VmiPhase::Pending)
        );
        let p = pod(None, None, "Pending", false);
        assert_eq!(
            desired_status(&v, Some(&p), &now).phase,
            Some(VmiPhase::Scheduling)
        );
        let p = pod(Some("n1"), None, "Pending", false);
        let st = desired_status(&v, Some(&p), &now);
        assert_eq!(st.phase, Some(VmiPhase::Scheduled));
        assert_eq!(st.node_name.as_deref(), Some("n1"));
        let p = pod(Some("n1"), running(), "Running", true);
        let st = desired_status(&v, Some(&p), &now);
        assert_eq!(st.phase, Some(VmiPhase::Running));
        assert!(st.is_ready());
        assert_eq!(st.interfaces[0].ip_address.as_deref(), Some("10.0.0.5"));
        assert_eq!(st.launcher_pod.as_deref(), Some("virt-launcher-vm1"));
        let p = pod(Some("n1"), None, "Unknown", false);
        assert_eq!(
            desired_status(&v, Some(&p), &now).phase,
            Some(VmiPhase::Unknown)
        );
    }

    /// KubeVirt's Ready: the VM runs in a Ready launcher pod. The pod's readiness is the node
    /// agent's gate (no boot-timer probe): a paused or not yet seen VM is not Ready, and says why.
    #[test]
    fn ready_follows_the_launcher_pods_readiness_gate() {
        let v = vmi();
        let now = t(100);
        let gate = |status: &str, reason: &str, msg: &str| PodCondition {
            type_: POD_CONDITION_VM_RUNNING.into(),
            status: status.into(),
            reason: Some(reason.into()),
            message: Some(msg.into()),
            ..Default::default()
        };
        let ready = |st: &VirtualMachineInstanceStatus| {
            st.conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
                .unwrap()
        };
        // Running, the agent has not reached the launcher yet: no gate, pod not Ready.
        let mut p = pod(Some("n1"), running(), "Running", false);
        p.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].message = Some(
            "the status of pod readiness gate \"microvirt.io/vm-running\" is not \"True\", but False"
                .into(),
        );
        let st = desired_status(&v, Some(&p), &now);
        assert_eq!(st.phase, Some(VmiPhase::Running));
        let (s, r, m) = ready(&st);
        assert_eq!((s.as_str(), r.as_deref()), ("False", Some("PodNotReady")));
        assert!(m.unwrap().contains("microvirt.io/vm-running"));
        // The VM runs: the kubelet makes the pod Ready, and the VMI is Ready (no boot time).
        let mut p = pod(Some("n1"), running(), "Running", true);
        p.status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()
            .push(gate("True", "VMRunning", ""));
        let st = desired_status(&v, Some(&p), &now);
        assert_eq!(ready(&st), ("True".into(), Some("VMRunning".into()), None));
        assert_eq!(st.boot_time_ms, None);
        // Paused: the gate is False, the pod is not Ready, the VMI says why.
        let mut v2 = v.clone();
        v2.status = Some(st);
        let mut p = pod(Some("n1"), running(), "Running", false);
        p.status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()
            .push(gate("False", "VMPaused", "the VM's vCPUs are paused"));
        let st = desired_status(&v2, Some(&p), &t(200));
        assert_eq!(
            ready(&st),
            (
                "False".into(),
                Some("VMPaused".into()),
                Some("the VM's vCPUs are paused".into())
            )
        );
        let c = st.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(c.last_transition_time, Some(t(200)));

        // With the gate in the pod's spec, the kubelet's rule is evaluated from the
        // conditions (containers ready, every gate True) without waiting for its Ready.
        let gated = |containers: &str, gate_status: &str, pod_ready: bool| {
            let mut p = pod(Some("n1"), running(), "Running", pod_ready);
            p.spec.as_mut().unwrap().readiness_gates =
                Some(vec![k8s_openapi::api::core::v1::PodReadinessGate {
                    condition_type: POD_CONDITION_VM_RUNNING.into(),
                }]);
            let cs = p.status.as_mut().unwrap().conditions.as_mut().unwrap();
            cs.push(PodCondition {
                type_: "ContainersReady".into(),
                status: containers.into(),
                ..Default::default()
            });
            cs.push(gate(gate_status, "VMRunning", ""));
            desired_status(&v, Some(&p), &now).is_ready()
        };
        assert!(gated("True", "True", false), "the kubelet's Ready lags");
        assert!(
            !gated("True", "False", true),
            "the kubelet's Ready lags a pause"
        );
        assert!(!gated("False", "True", true));
    }

    #[test]
    fn a_claimed_warm_member_is_ready_once_the_agent_resumed_it() {
        use microvirt_crds::pool::LABEL_POOL_ROLE;
        use microvirt_crds::vmi::{ANNOTATION_CONTROL_REQUEST, ANNOTATION_CONTROL_RESULT};
        let v = vmi();
        let now = t(100);
        let mut p = pod(Some("n1"), running(), "Running", true);
        p.metadata.labels = Some([(LABEL_POOL_ROLE.to_string(), "claimed".to_string())].into());
        p.metadata.annotations = Some(
            [(
                ANNOTATION_CONTROL_REQUEST.to_string(),
                "claim-uid unpause".to_string(),
            )]
            .into(),
        );
        // The launcher pod is Ready (restored, paused) but not resumed yet.
        let st = desired_status(&v, Some(&p), &now);
        assert_eq!(st.phase, Some(VmiPhase::Running));
        assert!(!st.is_ready());
        // The agent's answer to an older request does not count.
        let answered = |r: &str| {
            let mut q = p.clone();
            q.metadata
                .annotations
                .as_mut()
                .unwrap()
                .insert(ANNOTATION_CONTROL_RESULT.into(), r.into());
            q
        };
        assert!(!desired_status(&v, Some(&answered("claim-old ok")), &now).is_ready());
        assert!(desired_status(&v, Some(&answered("claim-uid ok")), &now).is_ready());
        let st = desired_status(&v, Some(&answered("claim-uid error no launcher")), &now);
        assert_eq!(st.phase, Some(VmiPhase::Failed));
        assert_eq!(st.reason.as_deref(), Some(REASON_RESUME_FAILED));
        assert!(st.message.unwrap().contains("no launcher"));
    }

    #[test]
    fn why_a_pod_is_not_running_shows_on_the_vmi() {
        use k8s_openapi::api::core::v1::ContainerStateWaiting;
        let v = vmi();
        let now = t(100);
        let cond = |st: &VirtualMachineInstanceStatus, ty: &str| {
            st.conditions
                .iter()
                .find(|c| c.type_ == ty)
                .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
        };
        // Unschedulable: the scheduler's message.
        let mut p = pod(None, None, "Pending", false);
        p.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
            type_: "PodScheduled".into(),
            status: "False".into(),
            reason: Some("Unschedulable".into()),
            message: Some("0/1 nodes are available: 1 Insufficient memory.".into()),
            ..Default::default()
        }]);
        let st = desired_status(&v, Some(&p), &now);
        assert_eq!(st.phase, Some(VmiPhase::Scheduling));
        assert_eq!(
            cond(&st, "PodScheduled"),
            Some((
                "False".into(),
                Some("Unschedulable".into()),
                Some("0/1 nodes are available: 1 Insufficient memory.".into())
            ))
        );
        // An image that cannot be pulled: the kubelet's reason and message on Ready.
        let waiting = |reason: &str| {
            Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(reason.into()),
                    message: Some(format!("{reason}: details")),
                }),
                ..Default::default()
            })
        };
        let p = pod(Some("n1"), waiting("ImagePullBackOff"), "Pending", false);
        let st = desired_status(&v, Some(&p), &now);
        assert_eq!(st.phase, Some(VmiPhase::Scheduled));
        assert_eq!(
            cond(&st, "Ready"),
            Some((
                "False".into(),
                Some("ImagePullBackOff".into()),
                Some("ImagePullBackOff: details".into())
            ))
        );
        assert_eq!(cond(&st, "PodScheduled"), None);
        // Normal start-up is not an error.
        let p = pod(Some("n1"), waiting("ContainerCreating"), "Pending", false);
        let st = desired_status(&v, Some(&p), &now);
        assert_eq!(
            cond(&st, "Ready").unwrap().1.as_deref(),
            Some("PodNotReady")
        );
    }

    #[test]
    fn exit_codes_and_termination_message() {
        let v = vmi();
        let now = t(100);
        // Terminated state decides even before the pod phase catches up.
        let p = pod(
            Some("n1"),
            terminated(0, "powered off\nbootTimeMs=87\n"),
            "Running",
            false,
        );
        let st = desired_status(&v, Some(&p), &now);
        assert_eq!(st.phase, Some(VmiPhase::Succeeded));
        assert_eq!(st.boot_time_ms, Some(87));
        assert!(!st.is_ready());
        let p = pod(
            Some("n1"),
            terminated(2, "disk missing: root\nmore"),
            "Failed",
            false,
        );
        let st = desired_status(&v, Some(&p), &now);
        assert_eq!(st.phase, Some(VmiPhase::Failed));
        assert_eq!(st.reason.as_deref(), Some("LauncherExited2"));
        assert_eq!(st.message.as_deref(), Some("disk missing: root"));
        // The launcher's NoBootableKernel becomes the VMI's reason; other launcher reasons
        // do not.
        let p = pod(
            Some("n1"),
            terminated(
                3,
                "no bootable kernel: disk \"root\": no kernel\nreason=NoBootableKernel\nexitCode=3\n",
            ),
            "Failed",
            false,
        );
        let st = desired_status(&v, Some(&p), &now);
        assert_eq!(st.phase, Some(VmiPhase::Failed));
        assert_eq!(st.reason.as_deref(), Some("NoBootableKernel"));
        assert_eq!(
            st.message.as_deref(),
            Some("no bootable kernel: disk \"root\": no kernel")
        );
        let p = pod(
            Some("n1"),
            terminated(3, "setup failed: x\nreason=SetupFailed\nexitCode=3\n"),
            "Failed",
            false,
        );
        let st = desired_status(&v, Some(&p), &now);
        assert_eq!(st.reason.as_deref(), Some("LauncherExited3"));
        // Only the launcher's setup failures count as failed before the VM ran.
        for (reason, before) in [
            ("NoBootableKernel", true),
            ("LauncherExited2", true),
            ("LauncherExited3", true),
            ("LauncherExited1", false),
            ("GuestCrashed", false),
            ("VmmFailed", false),
            ("LauncherStopped", false),
            ("LauncherPodGone", false),
        ] {
            assert_eq!(failed_before_the_vm_ran(reason), before, "{reason}");
        }
        // A guest crash and a VMM failure are named as the launcher names them.
        for (reason, msg) in [
            ("GuestCrashed", "guest crashed: triple fault"),
            ("VmmFailed", "VMM failed: KVM_RUN: Bad address"),
        ] {
            let p = pod(
                Some("n1"),
                terminated(1, &format!("{msg}\nreason={reason}\nexitCode=1\n")),
                "Failed",
                false,
            );
            let st = desired_status(&v, Some(&p), &now);
            assert_eq!(st.phase, Some(VmiPhase::Failed));
            assert_eq!(st.reason.as_deref(), Some(reason));
            assert_eq!(st.message.as_deref(), Some(msg));
        }
        // Pod Failed without container status (e.g. evicted).
        let mut p = pod(Some("n1"), None, "Failed", false);
        p.status.as_mut().unwrap().reason = Some("Evicted".into());
        let st = desired_status(&v, Some(&p), &now);
        assert_eq!(st.reason.as_deref(), Some("Evicted"));
    }

    #[test]
    fn a_failed_liveness_probe_fails_the_vmi() {
        use k8s_openapi::api::core::v1::{Container, Probe};
        let now = t(100);
        let signalled = |message: &str, reason: &str, code: i32| {
            TerminationMessage {
                message: message.into(),
                reason: Some(reason.into()),
                exit_code: Some(code),
                boot_time_ms: Some(5),
                shutdown_requested: Some(ShutdownOrigin::Signal),
            }
            .render()
        };
        let with_liveness = |mut p: Pod| {
            p.spec.as_mut().unwrap().containers = vec![Container {
                name: COMPUTE_CONTAINER.into(),
                liveness_probe: Some(Probe::default()),
                ..Default::default()
            }];
            p
        };
        // The guest powered off on the kubelet's SIGTERM (exit 0; restartPolicy Never: the
        // pod Succeeded).
        let msg = signalled("guest powered off", "GuestShutdown", 0);
        let p = with_liveness(pod(Some("n1"), terminated(0, &msg), "Succeeded", false));
        let st = desired_status(&vmi(), Some(&p), &now);
        assert_eq!(st.phase, Some(VmiPhase::Failed));
        assert_eq!(st.reason.as_deref(), Some(REASON_LIVENESS_PROBE_FAILED));
        assert_eq!(
            st.message.as_deref(),
            Some("livenessProbe failed, the kubelet stopped the launcher: guest powered off")
        );
        // A hung guest ignored it: the launcher stopped the VM after the grace period.
        let msg = signalled(
            "guest ignored the shutdown request",
            "GracePeriodExpired",
            4,
        );
        let p = with_liveness(pod(Some("n1"), terminated(4, &msg), "Failed", false));
        let st = desired_status(&vmi(), Some(&p), &now);
        assert_eq!(st.phase, Some(VmiPhase::Failed));
        assert_eq!(st.reason.as_deref(), Some(REASON_LIVENESS_PROBE_FAILED));
        // Without a liveness probe the same stop is what it was before.
        let p = pod(Some("n1"), terminated(4, &msg), "Failed", false);
        let st = desired_status(&vmi(), Some(&p), &now);
        assert_eq!(st.reason.as_deref(), Some("LauncherExited4"));
        // With a liveness probe, a deleted pod, an eviction and a deleted VMI keep their reasons.
        let msg = signalled("guest powered off", "GuestShutdown", 0);
        let mut p = with_liveness(pod(Some("n1"), terminated(0, &msg), "Succeeded", false));
        p.metadata.deletion_timestamp = Some(t(90));
        let st = desired_status(&vmi(), Some(&p), &now);
        assert_eq!(st.reason.as_deref(), Some(REASON_LAUNCHER_STOPPED));
        let mut p = with_liveness(pod(Some("n1"), terminated(0, &msg), "Failed", false));
        p.status.as_mut().unwrap().reason = Some("Evicted".into());
        let st = desired_status(&vmi(), Some(&p), &now);
        assert_eq!(st.reason.as_deref(), Some(REASON_LAUNCHER_STOPPED));
        let p = with_liveness(pod(Some("n1"), terminated(0, &msg), "Succeeded", false));
        let mut v = vmi();
        v.metadata.deletion_timestamp = Some(t(80));
        let st = desired_status(&v, Some(&p), &now);
        assert_eq!(st.phase, Some(VmiPhase::Succeeded));
    }

    #[test]
    fn a_stop_the_launcher_was_asked_for_is_not_a_success() {
        let now = t(100);
        let asked = TerminationMessage {
            message: "guest reset after the shutdown request".into(),
            reason: Some("GuestShutdown".into()),
            exit_code: Some(0),
            boot_time_ms: Some(5),
            shutdown_requested: Some(ShutdownOrigin::Signal),
        }
        .render();
        // Evicted by the kubelet (pod not deleted): Failed, so RerunOnFailure reruns it.
        let mut p = pod(Some("n1"), terminated(0, &asked), "Failed", false);
        p.status.as_mut().unwrap().reason = Some("Evicted".into());
        let st = desired_status(&vmi(), Some(&p), &now);
        assert_eq!(st.phase, Some(VmiPhase::Failed));
        assert_eq!(st.reason.as_deref(), Some(REASON_LAUNCHER_STOPPED));
        assert_eq!(
            st.message.as_deref(),
            Some("Evicted: guest reset after the shutdown request")
        );
        assert_eq!(st.boot_time_ms, Some(5));
        // Evicted, and the termination message lost: the pod phase still tells.
        let mut p = pod(Some("n1"), terminated(0, ""), "Failed", false);
        p.status.as_mut().unwrap().reason = Some("Evicted".into());
        let st = desired_status(&vmi(), Some(&p), &now);
        assert_eq!(st.phase, Some(VmiPhase::Failed));
        assert_eq!(st.message.as_deref(), Some("Evicted: VM stopped"));
        // Pod deleted (drain), even when the termination message was lost.
        let mut p = pod(Some("n1"), terminated(0, ""), "Succeeded", false);
        p.metadata.deletion_timestamp = Some(t(90));
        let st = desired_status(&vmi(), Some(&p), &now);
        assert_eq!(st.phase, Some(VmiPhase::Failed));
        assert_eq!(st.reason.as_deref(), Some(REASON_LAUNCHER_STOPPED));
        // The VMI itself is being deleted: that stop is the expected end.
        let mut v = vmi();
        v.metadata.deletion_timestamp = Some(t(80));
        let st = desired_status(&v, Some(&p), &now);
        assert_eq!(st.phase, Some(VmiPhase::Succeeded));
        // The guest chose to power off: Succeeded.
        let chose = TerminationMessage {
            message: "guest powered off".into(),
            exit_code: Some(0),
            ..Default::default()
        }
        .render();
        let p = pod(Some("n1"), terminated(0, &chose), "Succeeded", false);
        let st = desired_status(&vmi(), Some(&p), &now);
        assert_eq!(st.phase, Some(VmiPhase::Succeeded));
        assert_eq!(st.message.as_deref(), Some("guest powered off"));
    }

    #[test]
    fn transitions_are_recorded_once_and_conditions_keep_their_time() {
        let mut v = vmi();
        let p = pod(Some("n1"), running(), "Running", false);
        let st1 = desired_status(&v, Some(&p), &t(100));
        assert_eq!(st1.phase_transition_timestamps.len(), 1);
        v.status = Some(st1.clone());
        // Same inputs later: nothing changes (idempotent, no write needed).
        let st2 = desired_status(&v, Some(&p), &t(200));
        assert_eq!(st2, st1);
        // Ready flips: one new transition time on the condition, phase list unchanged.
        let p = pod(Some("n1"), running(), "Running", true);
        let st3 = desired_status(&v, Some(&p), &t(300));
        assert_eq!(
            st3.phase_transition_timestamps,
            st1.phase_transition_timestamps
        );
        let ready = st3.condition("Ready").unwrap();
        assert_eq!(ready.last_transition_time, Some(t(300)));
    }

    #[test]
    fn paused_belongs_to_the_node_agent_until_the_vmi_is_final() {
        let mut v = vmi();
        let p = pod(Some("n1"), running(), "Running", true);
        let st = desired_status(&v, Some(&p), &t(100));
        assert!(
            st.condition("Paused").is_none(),
            "the operator never invents Paused"
        );
        // The agent reported Paused=True: kept (so no write is needed), but never applied.
        let mut with_paused = st.clone();
        with_paused.conditions.push(VmiCondition {
            type_: "Paused".into(),
            status: "True".into(),
            reason: Some("PausedByUser".into()),
            message: None,
            last_transition_time: Some(t(150)),
        });
        v.status = Some(with_paused.clone());
        let st = desired_status(&v, Some(&p), &t(200));
        assert_eq!(st, with_paused);
        let applied = operator_owned(&st);
        assert!(applied.condition("Paused").is_none());
        assert!(applied.condition("Ready").is_some());
        // Final: the launcher is gone, the operator reports Paused=False itself.
        let done = pod(
            Some("n1"),
            terminated(0, "guest powered off"),
            "Succeeded",
            false,
        );
        let st = desired_status(&v, Some(&done), &t(300));
        let applied = operator_owned(&st);
        assert_eq!(applied.condition("Paused").unwrap().status, "False");
    }

    #[test]
    fn lost_pod_fails_a_started_vmi_and_final_phases_stick() {
        let mut v = vmi();
        let p = pod(Some("n1"), running(), "Running", true);
        v.status = Some(desired_status(&v, Some(&p), &t(100)));
        let st = desired_status(&v, None, &t(110));
        assert_eq!(st.phase, Some(VmiPhase::Failed));
        assert_eq!(st.reason.as_deref(), Some(REASON_POD_GONE));
        v.status = Some(st);
        // Even a running pod cannot revive a Failed VMI.
        let st = desired_status(&v, Some(&p), &t(120));
        assert_eq!(st.phase, Some(VmiPhase::Failed));
        assert!(!st.is_ready());
    }

    #[test]
    fn a_stale_pod_never_moves_the_phase_back() {
        let mut v = vmi();
        let running = pod(Some("n1"), running(), "Running", true);
        v.status = Some(desired_status(&v, Some(&running), &t(100)));
        let stale = pod(None, None, "Pending", false);
        let st = desired_status(&v, Some(&stale), &t(110));
        assert_eq!(Some(&st), v.status.as_ref());
    }

    #[test]
    fn failing_before_a_pod_exists() {
        let v = vmi();
        let st = failed_status(&v, "InvalidSpec", "guest memory: bad\nmore", &t(5));
        assert_eq!(st.phase, Some(VmiPhase::Failed));
        assert_eq!(st.reason.as_deref(), Some("InvalidSpec"));
        assert_eq!(st.message.as_deref(), Some("guest memory: bad"));
        assert_eq!(st.phase_transition_timestamps.len(), 1);
        assert!(!st.is_ready());
    }

    #[test]
    fn termination_message_parsing() {
        assert_eq!(termination_reason(""), None);
        assert_eq!(termination_reason("  ok  \nx"), Some("ok".into()));
        let long = "é".repeat(200);
        assert!(termination_reason(&long).unwrap().len() <= 256);
        assert_eq!(termination_boot_time_ms("a\nbootTimeMs= 12\n"), Some(12));
        assert_eq!(termination_boot_time_ms("bootTimeMs=x"), None);
    }
}
