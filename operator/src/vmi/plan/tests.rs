use super::*;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus, PodCondition,
    PodIP, PodSpec, PodStatus,
};
use k8s_openapi::jiff::Timestamp;
use microvirt_crds::termination::{ShutdownOrigin, TerminationMessage};
use microvirt_crds::vmi::{VmiCondition, POD_CONDITION_VM_RUNNING};

use crate::pod::COMPUTE_CONTAINER;

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
