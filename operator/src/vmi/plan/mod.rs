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
//! | compute container exited non-zero                     | Failed (`GuestCrashed`, `VmmFailed`, `NoBootableKernel`, `WorkloadFailed` as the launcher says, else `LauncherExited<code>`) |
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

mod conditions;
mod phase;
#[cfg(test)]
mod tests;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use microvirt_crds::vmi::{
    InterfaceStatus, PhaseTransitionTimestamp, VirtualMachineInstance,
    VirtualMachineInstanceStatus, VmiPhase, NODE_AGENT_CONDITIONS, REASON_VM_RUNNING,
};

use conditions::{not_ready_reason, pod_ready, set_condition, set_condition_msg};
pub use phase::{
    boot_time_ms, failed_before_the_vm_ran, pod_not_running_reason, pod_phase,
    termination_boot_time_ms, termination_reason,
};

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
