//! VirtualMachine planning (pure): run-strategy semantics, start/stop requests and printable
//! status.
//!
//! | runStrategy    | no VMI                      | VMI Succeeded | VMI Failed |
//! |----------------|-----------------------------|---------------|------------|
//! | Always         | create (not during a start back-off) | delete (→ recreated) | delete (→ recreated; after a back-off when it never ran) |
//! | RerunOnFailure | create when just chosen, or on a start request (not during a start back-off) | keep | delete, with a start request (→ recreated; after a back-off when it never ran) |
//! | Once           | create unless it already ran| keep          | keep       |
//! | Manual         | create on a start request   | keep          | keep       |
//! | Halted         | nothing (an existing VMI is deleted) |      |            |
//!
//! Start and stop requests (`status.stateChangeRequests`, KubeVirt's semantics: what
//! `kubectl microvirt start/stop/restart` write when the run strategy stays): only the first is
//! acted on. A stop request names a VMI uid: under Always, RerunOnFailure and Manual that VMI is
//! deleted (Always then creates the next one: a restart); it is done once that VMI is gone. A
//! start request creates a VMI under Manual and RerunOnFailure when there is none; it is done
//! once a VMI exists that is neither ending nor ended. Done requests are removed from the front
//! of the list, one per reconcile, as KubeVirt does.
//!
//! Start failures (KubeVirt's `status.startFailure`): a VMI of an Always or RerunOnFailure VM
//! that ended `Failed` before its VM ran (it never reached `Running`, or its launcher could not
//! set the VM up: KubeVirt's VMI is `Running` only once its domain runs) is counted once (by
//! its uid) in `consecutiveFailCount`, and the next VMI is created no earlier than
//! `retryAfterTimestamp` ([`start_backoff`]: KubeVirt's quadratic back-off with jitter);
//! meanwhile `printableStatus` is `CrashLoopBackOff`. The failed VMI is deleted only once the
//! VM's status (as the cache shows it) records its failure, so every later decision, however
//! stale its VMI cache, sees the back-off. A VMI whose VM ran (`Running` and Ready) clears the record (KubeVirt's reset), as
//! does a run strategy that restarts nothing. A VMI whose VM ran and then failed, or that
//! `Succeeded`, is replaced at once.
//!
//! The VMI has the VM's name, the template's labels plus `microvirt.io/vm=<name>`, and a
//! controller owner reference to the VM.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::{Resource, ResourceExt};
use microvirt_crds::{
    PrintableStatus, RunStrategy, StateChangeAction, StateChangeRequest, VirtualMachine,
    VirtualMachineCondition, VirtualMachineInstance, VirtualMachineInstanceSpec,
    VirtualMachineStartFailure, VirtualMachineStatus, VmiPhase,
};

/// Label on VMIs created for a VM.
pub const LABEL_VM_NAME: &str = "microvirt.io/vm";

/// The VM condition that says why its VMI could not be created.
pub const CONDITION_FAILURE: &str = "Failure";

/// `conditions` without those of type `type_`.
pub fn without_condition(
    conditions: &[VirtualMachineCondition],
    type_: &str,
) -> Vec<VirtualMachineCondition> {
    conditions
        .iter()
        .filter(|c| c.type_ != type_)
        .cloned()
        .collect()
}

/// `conditions` with the `Failure` condition set to `reason` and `message` (its transition
/// time kept while it stays true).
pub fn with_failure(
    conditions: &[VirtualMachineCondition],
    reason: &str,
    message: &str,
    now: Timestamp,
) -> Vec<VirtualMachineCondition> {
    let since = conditions
        .iter()
        .find(|c| c.type_ == CONDITION_FAILURE && c.status == "True")
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    let mut out = without_condition(conditions, CONDITION_FAILURE);
    out.push(VirtualMachineCondition {
        type_: CONDITION_FAILURE.into(),
        status: "True".into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_transition_time: Some(since),
    });
    out
}

/// What the VM reconciler should do to the VMI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmAction {
    /// Nothing.
    None,
    /// Create the VMI.
    Create,
    /// Delete the VMI.
    Delete,
}

/// Whether `vmi` is controlled by `vm`.
pub fn owned_by(vmi: &VirtualMachineInstance, vm: &VirtualMachine) -> bool {
    vm.meta().uid.as_deref().is_some_and(|uid| {
        vmi.owner_references()
            .iter()
            .any(|o| o.uid == uid && o.controller == Some(true))
    })
}

/// What one reconcile of a VM does.
#[derive(Debug, Clone, PartialEq)]
pub struct VmPlan {
    /// What to do to the VMI.
    pub action: VmAction,
    /// The status to write (its `stateChangeRequests` is [`VmPlan::requests`] when that is
    /// `Some`, else the VM's own list).
    pub status: VirtualMachineStatus,
    /// The new `status.stateChangeRequests`, when it changes. It is written (guarded by the
    /// VM's resourceVersion) before the action is taken.
    pub requests: Option<Vec<StateChangeRequest>>,
    /// How long the next VMI waits for the start back-off (reconcile again after it).
    pub backoff_left: Option<Duration>,
}

/// KubeVirt's wait before the next VMI after `fail_count` VMIs in a row failed before they
/// ran: `base × n²`, plus a jitter of up to half of that, at most `30 × base` (KubeVirt:
/// base 10 s, cap 300 s). `jitter` (in `0..=1`) spreads VMs that fail together; the planner
/// derives it from the failed VMI's uid, so every reconcile computes the same wait.
pub fn start_backoff(fail_count: i32, base: Duration, jitter: f64) -> Duration {
    let n = u32::try_from(fail_count.max(1)).unwrap_or(1);
    let cap = base.saturating_mul(30);
    let delay = base.saturating_mul(n.saturating_mul(n));
    let jitter = delay.div_f64(2.0).mul_f64(jitter.clamp(0.0, 1.0));
    delay.saturating_add(jitter).min(cap)
}

/// A number in `0..=1` from `uid` (FNV-1a): the back-off jitter of the VMI with that uid.
fn jitter_of(uid: &str) -> f64 {
    let h = uid.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    (h % 1001) as f64 / 1000.0
}

/// Whether `vmi`'s VM ran; `None` while that cannot be told yet. KubeVirt's VMI is `Running`
/// only once its domain runs; microvirt's is as soon as the launcher's container runs, which
/// then still sets the VM up. So: a VMI that is `Running` and Ready (its VM runs), or that
/// ended after it was `Running` (KubeVirt reads the phase transitions too) other than by a
/// launcher that could not set its VM up ([`crate::vmi::plan::failed_before_the_vm_ran`]).
fn vm_ran(vmi: &VirtualMachineInstance) -> Option<bool> {
    let Some(s) = vmi.status.as_ref() else {
        return Some(false);
    };
    let was_running = s
        .phase_transition_timestamps
        .iter()
        .any(|t| t.phase == VmiPhase::Running);
    match s.phase {
        Some(VmiPhase::Running) if vmi.is_ready() => Some(true),
        Some(VmiPhase::Running) => None,
        Some(VmiPhase::Failed) => Some(
            was_running
                && !s
                    .reason
                    .as_deref()
                    .is_some_and(crate::vmi::plan::failed_before_the_vm_ran),
        ),
        Some(VmiPhase::Succeeded) => Some(was_running),
        _ => Some(false),
    }
}

/// `status.startFailure` after seeing `vmi` at `now` (KubeVirt's `syncStartFailureStatus`,
/// for the strategies that restart a failed VMI).
fn start_failure(
    strategy: RunStrategy,
    old: Option<&VirtualMachineStartFailure>,
    vmi: Option<&VirtualMachineInstance>,
    now: Timestamp,
    base: Duration,
) -> Option<VirtualMachineStartFailure> {
    if !matches!(strategy, RunStrategy::Always | RunStrategy::RerunOnFailure)
        || vmi.is_some_and(|v| vm_ran(v) == Some(true))
    {
        return None;
    }
    let Some((uid, vmi)) = vmi
        .filter(|v| v.phase() == Some(VmiPhase::Failed))
        .and_then(|v| Some((v.metadata.uid.as_deref()?, v)))
    else {
        return old.cloned();
    };
    if old.is_some_and(|o| o.last_failed_vmi_uid.as_deref() == Some(uid)) {
        return old.cloned();
    }
    let count = old
        .map_or(0, |o| o.consecutive_fail_count)
        .saturating_add(1);
    let wait = start_backoff(count, base, jitter_of(uid));
    // From when the VMI failed (its phase transition; else now), so that every reconcile
    // computes the same time; in whole seconds, rounded up: the time the status stores
    // (metav1.Time has no fraction).
    let failed_at = vmi
        .status
        .as_ref()
        .and_then(|s| {
            s.phase_transition_timestamps
                .iter()
                .rev()
                .find(|t| t.phase == VmiPhase::Failed)
        })
        .map_or(now, |t| t.phase_transition_timestamp.0);
    let after = failed_at
        .saturating_add(SignedDuration::try_from(wait).unwrap_or(SignedDuration::MAX))
        .ok()
        .and_then(|t| {
            let secs = t.as_second() + i64::from(t.subsec_nanosecond() > 0);
            Timestamp::from_second(secs).ok()
        })
        .unwrap_or(Timestamp::MAX);
    Some(VirtualMachineStartFailure {
        consecutive_fail_count: count,
        last_failed_vmi_uid: Some(uid.to_string()),
        retry_after_timestamp: Some(Time(after)),
    })
}

/// How long from `now` until `failure` lets the next VMI start (`None`: it may start now).
fn backoff_left(failure: Option<&VirtualMachineStartFailure>, now: Timestamp) -> Option<Duration> {
    let after = failure?.retry_after_timestamp.as_ref()?.0;
    Duration::try_from(after.duration_since(now))
        .ok()
        .filter(|d| !d.is_zero())
}

/// Whether `vmi` ended (Succeeded/Failed).
fn is_final(vmi: &VirtualMachineInstance) -> bool {
    vmi.phase().is_some_and(|p| p.is_final())
}

/// Whether the first request (the one acted on) is done, given the VM's VMI: a stop request
/// once its VMI is gone, a start request once a VMI is there that is neither ending nor ended.
fn first_request_done(first: &StateChangeRequest, vmi: Option<&VirtualMachineInstance>) -> bool {
    match first.action {
        StateChangeAction::Stop => match (vmi, first.uid.as_deref()) {
            (None, _) | (_, None) => true,
            (Some(v), Some(uid)) => v.metadata.uid.as_deref() != Some(uid),
        },
        StateChangeAction::Start => {
            vmi.is_some_and(|v| v.metadata.deletion_timestamp.is_none() && !is_final(v))
        }
    }
}

/// Decide the action, the status and the start/stop requests for `vm`, given the VMI with its
/// name (if any), the time, and the first start back-off (`Config::vm_start_backoff`).
pub fn plan(
    vm: &VirtualMachine,
    vmi: Option<&VirtualMachineInstance>,
    now: Timestamp,
    backoff_base: Duration,
) -> VmPlan {
    let strategy = vm.spec.effective_run_strategy();
    let old = vm.status.clone().unwrap_or_default();
    let vmi = vmi.filter(|v| owned_by(v, vm));
    let failure = start_failure(strategy, old.start_failure.as_ref(), vmi, now, backoff_base);
    // A VMI that failed before it ran is deleted only once the VM's status records it (so
    // that no later decision can miss the back-off), and the next one waits it out.
    let failure_unrecorded = failure.as_ref().is_some_and(|f| {
        vmi.is_some_and(|v| v.metadata.uid.is_some() && v.metadata.uid == f.last_failed_vmi_uid)
            && old.start_failure.as_ref() != Some(f)
    });
    let waiting = backoff_left(failure.as_ref(), now);
    let deleting = vmi.is_some_and(|v| v.metadata.deletion_timestamp.is_some());
    let phase = vmi.and_then(|v| v.phase());
    let first = old.state_change_requests.first();
    let start_requested = first.is_some_and(|r| r.action == StateChangeAction::Start);
    let stop_requested = first.is_some_and(|r| {
        r.action == StateChangeAction::Stop
            && r.uid.is_some()
            && r.uid.as_deref() == vmi.and_then(|v| v.metadata.uid.as_deref())
    });
    // RerunOnFailure starts on its own only when it was just chosen (KubeVirt: the recorded
    // strategy differs), so that a VMI ended by a stop request stays ended.
    let rerun_starts = start_requested || old.run_strategy != Some(RunStrategy::RerunOnFailure);

    let mut requests: Option<Vec<StateChangeRequest>> = None;
    let action = match (strategy, vmi) {
        (_, Some(_)) if deleting => VmAction::None,
        (RunStrategy::Halted, Some(_)) => VmAction::Delete,
        (RunStrategy::Halted, None) => VmAction::None,
        (RunStrategy::Manual, None) if start_requested => VmAction::Create,
        (RunStrategy::Manual, None) => VmAction::None,
        (RunStrategy::Once, None) if old.once_ran_uid.is_some() => VmAction::None,
        (RunStrategy::RerunOnFailure, None) if !rerun_starts => VmAction::None,
        (RunStrategy::Always | RunStrategy::RerunOnFailure, None) if waiting.is_some() => {
            VmAction::None
        }
        (RunStrategy::Always | RunStrategy::RerunOnFailure | RunStrategy::Once, None) => {
            VmAction::Create
        }
        (RunStrategy::Always | RunStrategy::RerunOnFailure | RunStrategy::Manual, Some(_))
            if stop_requested =>
        {
            VmAction::Delete
        }
        (RunStrategy::Always | RunStrategy::RerunOnFailure, Some(_)) if failure_unrecorded => {
            VmAction::None
        }
        (RunStrategy::Always, Some(_)) if phase.is_some_and(|p| p.is_final()) => VmAction::Delete,
        (RunStrategy::RerunOnFailure, Some(_)) if phase == Some(VmiPhase::Failed) => {
            // The next VMI comes from a start request, as in KubeVirt (so that a stop request
            // made meanwhile is not overridden).
            if old.state_change_requests.is_empty() {
                requests = Some(vec![StateChangeRequest::start()]);
            }
            VmAction::Delete
        }
        _ => VmAction::None,
    };
    if requests.is_none() && first.is_some_and(|f| first_request_done(f, vmi)) {
        requests = Some(old.state_change_requests[1..].to_vec());
    }

    // KubeVirt's CrashLoopBackOff: no VMI runs (none, or a failed one), and the next one
    // waits out a back-off. (A VMI that Succeeded shows that instead.)
    let crash_loop = failure
        .as_ref()
        .is_some_and(|f| f.consecutive_fail_count > 0)
        && vmi.is_none_or(|v| v.phase() == Some(VmiPhase::Failed))
        && action != VmAction::Create;
    let printable = match vmi {
        _ if crash_loop => PrintableStatus::CrashLoopBackOff,
        None => PrintableStatus::Stopped,
        Some(_) if deleting => PrintableStatus::Stopping,
        Some(_) => match phase {
            None
            | Some(VmiPhase::Pending)
            | Some(VmiPhase::Scheduling)
            | Some(VmiPhase::Scheduled) => PrintableStatus::Starting,
            Some(VmiPhase::Running) => PrintableStatus::Running,
            Some(VmiPhase::Succeeded) => PrintableStatus::Succeeded,
            Some(VmiPhase::Failed) => PrintableStatus::Failed,
            Some(VmiPhase::Unknown) => PrintableStatus::Unknown,
        },
    };
    let once_ran_uid = if strategy == RunStrategy::Once {
        vmi.and_then(|v| v.metadata.uid.clone())
            .or(old.once_ran_uid.clone())
    } else {
        None
    };
    // Recorded from the first VMI on (KubeVirt's rule), so a new RerunOnFailure VM starts.
    let run_strategy = (vmi.is_some() || old.run_strategy.is_some()).then_some(strategy);
    // The `Failure` condition (the VMI could not be created) holds until a VMI exists or the
    // VM is to have none; the reconciler sets it and clears it when it creates one.
    let conditions = if vmi.is_some() || strategy == RunStrategy::Halted {
        without_condition(&old.conditions, CONDITION_FAILURE)
    } else {
        old.conditions.clone()
    };
    let status = VirtualMachineStatus {
        printable_status: Some(printable),
        ready: vmi.is_some_and(|v| v.is_ready()) && !deleting,
        created: vmi.is_some(),
        vmi_name: vmi.map(|v| v.name_any()),
        once_ran_uid,
        run_strategy,
        state_change_requests: requests
            .clone()
            .unwrap_or_else(|| old.state_change_requests.clone()),
        start_failure: failure,
        conditions,
    };
    VmPlan {
        action,
        status,
        requests,
        backoff_left: waiting.filter(|_| crash_loop),
    }
}

/// The namespace of the name-based firmware UUIDs: KubeVirt's own, so that a VM moved between
/// KubeVirt and microvirt under the same name keeps its UUID, and with it cloud-init's
/// `instance-id` (cloud-init does not run its first boot again on a disk it already set up).
const FIRMWARE_UUID_NAMESPACE: uuid::Uuid = uuid::uuid!("6a1a24a1-4061-4607-8bf4-a3963d0c5895");

/// The firmware UUID of the VMIs of a VM named `vm_name` that sets none: the same for every
/// VMI the VM ever has (KubeVirt's rule: a name-based UUID, version 5, of the VM's name).
pub fn stable_firmware_uuid(vm_name: &str) -> String {
    uuid::Uuid::new_v5(&FIRMWARE_UUID_NAMESPACE, vm_name.as_bytes()).to_string()
}

/// The VMI a VM creates. Without `firmware.uuid` in the template it gets
/// [`stable_firmware_uuid`], the guest's cloud-init `instance-id`, so that a restart of the VM
/// (a new VMI, a new uid) is not a new instance to cloud-init.
pub fn new_vmi(vm: &VirtualMachine) -> VirtualMachineInstance {
    new_vmi_with(vm, vm.spec.template.spec.clone())
}

/// [`new_vmi`] with `spec` (the template's, with the VM's instancetype and preference
/// expanded: [`crate::vm::instancetype::expand`]).
pub fn new_vmi_with(
    vm: &VirtualMachine,
    mut spec: VirtualMachineInstanceSpec,
) -> VirtualMachineInstance {
    let name = vm.name_any();
    let firmware = spec.domain.firmware.get_or_insert_with(Default::default);
    if firmware.uuid.as_deref().is_none_or(str::is_empty) {
        firmware.uuid = Some(stable_firmware_uuid(&name));
    }
    let mut vmi = VirtualMachineInstance::new(&name, spec);
    vmi.metadata.namespace = vm.namespace();
    let mut labels = vm.spec.template.labels();
    labels.insert(LABEL_VM_NAME.into(), name);
    vmi.metadata.labels = Some(labels);
    let annotations = vm.spec.template.annotations();
    if !annotations.is_empty() {
        vmi.metadata.annotations = Some(annotations);
    }
    vmi.metadata.owner_references = vm.controller_owner_ref(&()).map(|o| vec![o]);
    vmi
}

#[cfg(test)]
mod tests {
    use super::*;
    use microvirt_crds::vmi::{
        PhaseTransitionTimestamp, VirtualMachineInstanceStatus, VmiCondition,
    };
    use microvirt_crds::VirtualMachineSpec;

    const BASE: Duration = Duration::from_secs(10);

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_000_000 + second).unwrap()
    }

    /// The plan at time `at(0)` with KubeVirt's back-off.
    fn plan(vm: &VirtualMachine, vmi: Option<&VirtualMachineInstance>) -> VmPlan {
        super::plan(vm, vmi, at(0), BASE)
    }

    fn vm(strategy: RunStrategy) -> VirtualMachine {
        let mut vm = VirtualMachine::new(
            "vm1",
            VirtualMachineSpec {
                run_strategy: Some(strategy),
                ..Default::default()
            },
        );
        vm.metadata.namespace = Some("ns".into());
        vm.metadata.uid = Some("vm-uid".into());
        vm
    }

    /// A VMI in `phase`; an ended one ran before (its transitions show `Running`).
    fn vmi_in(vm: &VirtualMachine, phase: Option<VmiPhase>, ready: bool) -> VirtualMachineInstance {
        let mut v = new_vmi(vm);
        v.metadata.uid = Some("vmi-uid".into());
        v.status = phase.map(|p| VirtualMachineInstanceStatus {
            phase: Some(p),
            phase_transition_timestamps: p
                .is_final()
                .then(|| PhaseTransitionTimestamp {
                    phase: VmiPhase::Running,
                    phase_transition_timestamp: Time(at(-60)),
                })
                .into_iter()
                .collect(),
            conditions: vec![VmiCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        v
    }

    #[test]
    fn strategies_decide_create_and_delete() {
        use RunStrategy::*;
        use VmiPhase::*;
        let cases: &[(RunStrategy, Option<Option<VmiPhase>>, VmAction)] = &[
            (Always, None, VmAction::Create),
            (Always, Some(Some(Running)), VmAction::None),
            (Always, Some(Some(Succeeded)), VmAction::Delete),
            (Always, Some(Some(Failed)), VmAction::Delete),
            (RerunOnFailure, None, VmAction::Create),
            (RerunOnFailure, Some(Some(Succeeded)), VmAction::None),
            (RerunOnFailure, Some(Some(Failed)), VmAction::Delete),
            (Once, None, VmAction::Create),
            (Once, Some(Some(Failed)), VmAction::None),
            (Manual, None, VmAction::None),
            (Manual, Some(Some(Succeeded)), VmAction::None),
            (Halted, None, VmAction::None),
            (Halted, Some(Some(Running)), VmAction::Delete),
            (Halted, Some(None), VmAction::Delete),
        ];
        for (s, vmi_phase, want) in cases {
            let m = vm(*s);
            let vmi = vmi_phase.map(|p| vmi_in(&m, p, false));
            let got = plan(&m, vmi.as_ref()).action;
            assert_eq!(got, *want, "strategy {s:?} vmi {vmi_phase:?}");
        }
    }

    #[test]
    fn once_does_not_rerun_after_its_vmi_is_gone() {
        let mut m = vm(RunStrategy::Once);
        let v = vmi_in(&m, Some(VmiPhase::Succeeded), false);
        let st = plan(&m, Some(&v)).status;
        assert_eq!(st.once_ran_uid.as_deref(), Some("vmi-uid"));
        m.status = Some(st);
        let VmPlan {
            action, status: st, ..
        } = plan(&m, None);
        assert_eq!(action, VmAction::None);
        assert_eq!(st.printable_status, Some(PrintableStatus::Stopped));
    }

    #[test]
    fn running_flag_and_printable_status() {
        let mut m = vm(RunStrategy::Always);
        m.spec.run_strategy = None;
        m.spec.running = Some(true);
        assert_eq!(m.spec.effective_run_strategy(), RunStrategy::Always);
        let v = vmi_in(&m, Some(VmiPhase::Running), true);
        let st = plan(&m, Some(&v)).status;
        assert_eq!(st.printable_status, Some(PrintableStatus::Running));
        assert!(st.ready && st.created);
        let mut d = v.clone();
        d.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(1).unwrap()));
        let VmPlan {
            action: a,
            status: st,
            ..
        } = plan(&m, Some(&d));
        assert_eq!(a, VmAction::None);
        assert_eq!(st.printable_status, Some(PrintableStatus::Stopping));
        // A VMI not owned by this VM is ignored.
        let mut foreign = v;
        foreign.metadata.owner_references = None;
        let VmPlan {
            action: a,
            status: st,
            ..
        } = plan(&m, Some(&foreign));
        assert_eq!(a, VmAction::Create);
        assert!(!st.created);
    }

    fn with_requests(mut m: VirtualMachine, r: Vec<StateChangeRequest>) -> VirtualMachine {
        let mut st = m.status.take().unwrap_or_default();
        st.state_change_requests = r;
        m.status = Some(st);
        m
    }

    #[test]
    fn vmis_of_a_vm_keep_one_firmware_uuid() {
        let m = vm(RunStrategy::Always);
        let uuid = |v: &VirtualMachineInstance| {
            v.spec.domain.firmware.as_ref().and_then(|f| f.uuid.clone())
        };
        let a = new_vmi(&m);
        let b = new_vmi(&m);
        assert_eq!(uuid(&a), uuid(&b));
        // KubeVirt's value for a VM named vm1 (its namespace UUID, SHA-1 of the name).
        assert_eq!(
            uuid(&a).as_deref(),
            Some(stable_firmware_uuid("vm1").as_str())
        );
        assert_eq!(
            stable_firmware_uuid("testvm"),
            "5a9fc181-957e-5c32-9e5a-2de5e9673531"
        );
        assert_ne!(stable_firmware_uuid("vm2"), stable_firmware_uuid("vm1"));
        // A UUID in the template wins.
        let mut m2 = m.clone();
        m2.spec.template.spec.domain.firmware = Some(microvirt_crds::vmi::Firmware {
            uuid: Some("given".into()),
            ..Default::default()
        });
        assert_eq!(uuid(&new_vmi(&m2)).as_deref(), Some("given"));
    }

    #[test]
    fn manual_starts_and_stops_only_on_requests() {
        let m = vm(RunStrategy::Manual);
        // No request: nothing, whatever the VMI does.
        assert_eq!(plan(&m, None).action, VmAction::None);
        let v = vmi_in(&m, Some(VmiPhase::Succeeded), false);
        assert_eq!(plan(&m, Some(&v)).action, VmAction::None);
        // start: a VMI is created; the request stays until the VMI is there and running.
        let m = with_requests(m, vec![StateChangeRequest::start()]);
        let p = plan(&m, None);
        assert_eq!((p.action, p.requests), (VmAction::Create, None));
        let running = vmi_in(&m, Some(VmiPhase::Running), true);
        let p = plan(&m, Some(&running));
        assert_eq!(p.action, VmAction::None);
        assert_eq!(p.requests, Some(vec![]));
        assert!(p.status.state_change_requests.is_empty());
        // An ended VMI does not count as started (start of a Succeeded VMI is stop + start).
        let ended = vmi_in(&m, Some(VmiPhase::Succeeded), false);
        assert_eq!(plan(&m, Some(&ended)).requests, None);
        // stop: the named VMI is deleted; the request is done once it is gone.
        let m = with_requests(m, vec![StateChangeRequest::stop("vmi-uid")]);
        let p = plan(&m, Some(&running));
        assert_eq!((p.action, p.requests), (VmAction::Delete, None));
        let mut deleting = running.clone();
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(1).unwrap()));
        let p = plan(&m, Some(&deleting));
        assert_eq!((p.action, p.requests), (VmAction::None, None));
        let p = plan(&m, None);
        assert_eq!((p.action, p.requests), (VmAction::None, Some(vec![])));
        // A stop request for another VMI (an older one) is done and leaves this one alone.
        let m = with_requests(m, vec![StateChangeRequest::stop("old-uid")]);
        let p = plan(&m, Some(&running));
        assert_eq!((p.action, p.requests), (VmAction::None, Some(vec![])));
        // restart of an ended VMI: stop it, then start a new one; one request at a time.
        let m = with_requests(
            m,
            vec![
                StateChangeRequest::stop("vmi-uid"),
                StateChangeRequest::start(),
            ],
        );
        let p = plan(&m, Some(&ended));
        assert_eq!((p.action, p.requests), (VmAction::Delete, None));
        let p = plan(&m, None);
        assert_eq!(p.action, VmAction::None);
        assert_eq!(p.requests, Some(vec![StateChangeRequest::start()]));
    }

    #[test]
    fn always_restarts_on_a_stop_request() {
        let m = with_requests(
            vm(RunStrategy::Always),
            vec![
                StateChangeRequest::stop("vmi-uid"),
                StateChangeRequest::start(),
            ],
        );
        let running = vmi_in(&m, Some(VmiPhase::Running), true);
        assert_eq!(plan(&m, Some(&running)).action, VmAction::Delete);
        // Gone: the next VMI is created at once and the stop request is done.
        let p = plan(&m, None);
        assert_eq!(p.action, VmAction::Create);
        assert_eq!(p.requests, Some(vec![StateChangeRequest::start()]));
    }

    #[test]
    fn rerun_on_failure_follows_requests_once_it_ran() {
        let m = vm(RunStrategy::RerunOnFailure);
        // Just chosen (nothing recorded): starts on its own, and records the strategy once a
        // VMI exists.
        assert_eq!(plan(&m, None).action, VmAction::Create);
        assert_eq!(plan(&m, None).status.run_strategy, None);
        let running = vmi_in(&m, Some(VmiPhase::Running), true);
        let st = plan(&m, Some(&running)).status;
        assert_eq!(st.run_strategy, Some(RunStrategy::RerunOnFailure));
        let mut m = m;
        m.status = Some(st);
        // Stopped by a request: stays stopped.
        let m = with_requests(m, vec![StateChangeRequest::stop("vmi-uid")]);
        assert_eq!(plan(&m, Some(&running)).action, VmAction::Delete);
        let p = plan(&m, None);
        assert_eq!((p.action, p.requests), (VmAction::None, Some(vec![])));
        let m = with_requests(m, vec![]);
        assert_eq!(plan(&m, None).action, VmAction::None);
        // A start request starts it.
        let m = with_requests(m, vec![StateChangeRequest::start()]);
        assert_eq!(plan(&m, None).action, VmAction::Create);
        // A failed VMI is deleted and a start request queued for the next one.
        let m = with_requests(m, vec![]);
        let failed = vmi_in(&m, Some(VmiPhase::Failed), false);
        let p = plan(&m, Some(&failed));
        assert_eq!(p.action, VmAction::Delete);
        assert_eq!(p.requests, Some(vec![StateChangeRequest::start()]));
        // Switching to RerunOnFailure from another strategy starts it.
        let mut other = m.clone();
        other.status.as_mut().unwrap().run_strategy = Some(RunStrategy::Halted);
        assert_eq!(plan(&other, None).action, VmAction::Create);
    }

    /// A VMI of `vm` with `uid` that failed before it ever ran.
    fn failed_early(vm: &VirtualMachine, uid: &str) -> VirtualMachineInstance {
        let mut v = vmi_in(vm, Some(VmiPhase::Scheduled), false);
        v.metadata.uid = Some(uid.into());
        let st = v.status.as_mut().unwrap();
        st.phase = Some(VmiPhase::Failed);
        st.reason = Some("GuestCrashed".into());
        st.phase_transition_timestamps = vec![PhaseTransitionTimestamp {
            phase: VmiPhase::Failed,
            phase_transition_timestamp: Time(at(0)),
        }];
        v
    }

    fn with_status(mut m: VirtualMachine, st: VirtualMachineStatus) -> VirtualMachine {
        m.status = Some(st);
        m
    }

    #[test]
    fn kubevirts_start_backoff_values() {
        // KubeVirt's table (failCount: min..max seconds): 0,1: 10..15; 2: 40..60; 3: 90..135;
        // 4: 160..240; 5: 250..300; 6: 300.
        let s = |n, j| start_backoff(n, BASE, j).as_secs_f64();
        for (n, lo, hi) in [
            (0, 10.0, 15.0),
            (1, 10.0, 15.0),
            (2, 40.0, 60.0),
            (3, 90.0, 135.0),
            (4, 160.0, 240.0),
            (5, 250.0, 300.0),
            (6, 300.0, 300.0),
            (1000, 300.0, 300.0),
        ] {
            assert_eq!((s(n, 0.0), s(n, 1.0)), (lo, hi), "failCount {n}");
        }
        // The jitter is a function of the uid: the same on every reconcile, in 0..=1, and not
        // the same for every VMI.
        assert_eq!(jitter_of("a"), jitter_of("a"));
        let js: Vec<f64> = (0..20).map(|i| jitter_of(&format!("uid-{i}"))).collect();
        assert!(js.iter().all(|j| (0.0..=1.0).contains(j)));
        assert!(js.iter().any(|j| *j != js[0]));
        // A small base (tests) keeps KubeVirt's shape.
        let ms = Duration::from_millis(500);
        assert_eq!(start_backoff(2, ms, 0.0), Duration::from_secs(2));
        assert_eq!(start_backoff(9, ms, 1.0), Duration::from_secs(15));
    }

    #[test]
    fn a_vmi_failing_before_it_ran_backs_off_the_next_one() {
        for strategy in [RunStrategy::Always, RunStrategy::RerunOnFailure] {
            let m = vm(strategy);
            let failed = failed_early(&m, "u1");
            // 1. Seen failed: recorded first (count 1), not deleted yet.
            let p = plan(&m, Some(&failed));
            assert_eq!(p.action, VmAction::None, "{strategy:?}");
            assert_eq!(p.requests, None);
            let f = p.status.start_failure.clone().expect("startFailure");
            assert_eq!(f.consecutive_fail_count, 1);
            assert_eq!(f.last_failed_vmi_uid.as_deref(), Some("u1"));
            let after = f.retry_after_timestamp.clone().unwrap().0;
            let wait = after.duration_since(at(0)).as_secs();
            assert!((10..=16).contains(&wait), "{wait}");
            assert_eq!(
                p.status.printable_status,
                Some(PrintableStatus::CrashLoopBackOff)
            );
            // The same reconcile again (the status not seen yet, later): the same record, timed
            // from the VMI's failure.
            let again = super::plan(&m, Some(&failed), at(3), BASE);
            assert_eq!(again.status.start_failure, Some(f.clone()));
            let mut no_time = failed.clone();
            no_time
                .status
                .as_mut()
                .unwrap()
                .phase_transition_timestamps
                .clear();
            let later = super::plan(&m, Some(&no_time), at(3), BASE)
                .status
                .start_failure;
            assert_eq!(
                later.unwrap().retry_after_timestamp.unwrap().0,
                at(3)
                    .checked_add(
                        SignedDuration::try_from(Duration::from_secs(wait as u64)).unwrap()
                    )
                    .unwrap(),
            );
            // 2. Recorded: the failed VMI is deleted (RerunOnFailure: with a start request).
            let m = with_status(m, p.status);
            let p = plan(&m, Some(&failed));
            assert_eq!(p.action, VmAction::Delete);
            assert_eq!(p.status.start_failure, Some(f.clone()));
            if strategy == RunStrategy::RerunOnFailure {
                assert_eq!(p.requests, Some(vec![StateChangeRequest::start()]));
            }
            let mut m = with_status(m, p.status);
            if let Some(r) = p.requests {
                m.status.as_mut().unwrap().state_change_requests = r;
            }
            // 3. Gone, before the retry time: nothing, CrashLoopBackOff, and a requeue then.
            let p = super::plan(&m, None, at(5), BASE);
            assert_eq!(p.action, VmAction::None);
            assert_eq!(
                p.status.printable_status,
                Some(PrintableStatus::CrashLoopBackOff)
            );
            assert_eq!(p.backoff_left, Some(Duration::from_secs(wait as u64 - 5)));
            // 4. At the retry time: the next VMI.
            let p = super::plan(&m, None, after, BASE);
            assert_eq!(p.action, VmAction::Create);
            assert_eq!(p.backoff_left, None);
            assert_eq!(p.status.start_failure, Some(f.clone()));
            // 5. It fails too: count 2, a longer wait from then on.
            let mut failed2 = failed_early(&m, "u2");
            failed2.status.as_mut().unwrap().phase_transition_timestamps[0]
                .phase_transition_timestamp = Time(after);
            let p = super::plan(&m, Some(&failed2), after, BASE);
            assert_eq!(p.action, VmAction::None);
            let f2 = p.status.start_failure.clone().unwrap();
            assert_eq!(f2.consecutive_fail_count, 2);
            assert_eq!(f2.last_failed_vmi_uid.as_deref(), Some("u2"));
            let wait2 = f2.retry_after_timestamp.unwrap().0.duration_since(after);
            assert!((40..=61).contains(&wait2.as_secs()), "{wait2:?}");
            // 6. The next VMI reaches Running: the record stays until it is Ready (its VM
            //    runs; the launcher may still fail to set it up), then it is cleared.
            let m = with_status(m, p.status);
            let mut starting = vmi_in(&m, Some(VmiPhase::Running), false);
            starting.metadata.uid = Some("u3".into());
            let p = plan(&m, Some(&starting));
            assert_eq!(
                p.status.start_failure,
                m.status.as_ref().unwrap().start_failure
            );
            assert_eq!(p.status.printable_status, Some(PrintableStatus::Running));
            let mut running = vmi_in(&m, Some(VmiPhase::Running), true);
            running.metadata.uid = Some("u3".into());
            let p = plan(&m, Some(&running));
            assert_eq!(p.status.start_failure, None);
            assert_eq!(p.status.printable_status, Some(PrintableStatus::Running));
        }
    }

    #[test]
    fn only_vmis_that_never_ran_count_and_only_for_restarting_strategies() {
        // A VMI that ran and then failed: cleared, replaced at once (KubeVirt).
        let mut m = vm(RunStrategy::Always);
        let old = failed_early(&m, "u0");
        m.status = Some(plan(&m, Some(&old)).status);
        assert!(m.status.as_ref().unwrap().start_failure.is_some());
        let ran = vmi_in(&m, Some(VmiPhase::Failed), false);
        let p = plan(&m, Some(&ran));
        assert_eq!((p.action, p.status.start_failure), (VmAction::Delete, None));
        // A VMI whose launcher ran but could not set its VM up (no bootable kernel, setup
        // failed: its container ran, so it was Running) counts as a start failure.
        for reason in ["NoBootableKernel", "LauncherExited3"] {
            let mut setup = vmi_in(&m, Some(VmiPhase::Failed), false);
            setup.status.as_mut().unwrap().reason = Some(reason.into());
            let p = plan(&m, Some(&setup));
            assert_eq!(p.action, VmAction::None, "{reason}");
            let f = p.status.start_failure.expect("startFailure");
            assert_eq!(f.consecutive_fail_count, 2, "{reason}");
            assert_eq!(f.last_failed_vmi_uid.as_deref(), Some("vmi-uid"));
        }
        // A Succeeded VMI under Always: replaced at once, no record.
        let m0 = vm(RunStrategy::Always);
        let mut done = vmi_in(&m0, Some(VmiPhase::Succeeded), false);
        done.status
            .as_mut()
            .unwrap()
            .phase_transition_timestamps
            .clear();
        let p = plan(&m0, Some(&done));
        assert_eq!((p.action, p.status.start_failure), (VmAction::Delete, None));
        assert_eq!(p.status.printable_status, Some(PrintableStatus::Succeeded));
        // Once, Manual, Halted restart nothing: no record, and an old one is dropped.
        for s in [RunStrategy::Once, RunStrategy::Manual, RunStrategy::Halted] {
            let mut o = m.clone();
            o.spec.run_strategy = Some(s);
            let f = failed_early(&o, "u9");
            let p = plan(&o, Some(&f));
            assert_eq!(p.status.start_failure, None, "{s:?}");
            assert_ne!(
                p.status.printable_status,
                Some(PrintableStatus::CrashLoopBackOff)
            );
            assert_eq!(plan(&o, None).status.start_failure, None);
        }
        // A VMI that Succeeded without running (RerunOnFailure keeps it) leaves the record
        // and shows Succeeded.
        let mut r = m.clone();
        r.spec.run_strategy = Some(RunStrategy::RerunOnFailure);
        let mut done = vmi_in(&r, Some(VmiPhase::Succeeded), false);
        done.status
            .as_mut()
            .unwrap()
            .phase_transition_timestamps
            .clear();
        let p = plan(&r, Some(&done));
        assert_eq!(p.action, VmAction::None);
        assert_eq!(
            p.status.start_failure,
            m.status.as_ref().unwrap().start_failure
        );
        assert_eq!(p.status.printable_status, Some(PrintableStatus::Succeeded));
        // A pending VMI (not failed) leaves the record as it is, and shows Starting.
        let pending = vmi_in(&m, Some(VmiPhase::Scheduled), false);
        let p = plan(&m, Some(&pending));
        assert_eq!(
            p.status.start_failure,
            m.status.as_ref().unwrap().start_failure
        );
        assert_eq!(p.status.printable_status, Some(PrintableStatus::Starting));
        assert_eq!(p.backoff_left, None);
    }
}
