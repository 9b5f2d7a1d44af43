//! VirtualMachine planning (pure): run-strategy semantics, start/stop requests and printable
//! status.
//!
//! | runStrategy    | no VMI                      | VMI Succeeded | VMI Failed |
//! |----------------|-----------------------------|---------------|------------|
//! | Always         | create                      | delete (→ recreated) | delete (→ recreated) |
//! | RerunOnFailure | create when just chosen, or on a start request | keep | delete, with a start request (→ recreated) |
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
//! The VMI has the VM's name, the template's labels plus `microvirt.io/vm=<name>`, and a
//! controller owner reference to the VM.

use kube::{Resource, ResourceExt};
use microvirt_crds::{
    PrintableStatus, RunStrategy, StateChangeAction, StateChangeRequest, VirtualMachine,
    VirtualMachineInstance, VirtualMachineStatus, VmiPhase,
};

/// Label on VMIs created for a VM.
pub const LABEL_VM_NAME: &str = "microvirt.io/vm";

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
/// name (if any).
pub fn plan(vm: &VirtualMachine, vmi: Option<&VirtualMachineInstance>) -> VmPlan {
    let strategy = vm.spec.effective_run_strategy();
    let old = vm.status.clone().unwrap_or_default();
    let vmi = vmi.filter(|v| owned_by(v, vm));
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
        (RunStrategy::Always | RunStrategy::RerunOnFailure | RunStrategy::Once, None) => {
            VmAction::Create
        }
        (RunStrategy::Always | RunStrategy::RerunOnFailure | RunStrategy::Manual, Some(_))
            if stop_requested =>
        {
            VmAction::Delete
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

    let printable = match vmi {
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
    };
    VmPlan {
        action,
        status,
        requests,
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
    let name = vm.name_any();
    let mut spec = vm.spec.template.spec.clone();
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
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use microvirt_crds::vmi::{VirtualMachineInstanceStatus, VmiCondition};
    use microvirt_crds::VirtualMachineSpec;

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

    fn vmi_in(vm: &VirtualMachine, phase: Option<VmiPhase>, ready: bool) -> VirtualMachineInstance {
        let mut v = new_vmi(vm);
        v.metadata.uid = Some("vmi-uid".into());
        v.status = phase.map(|p| VirtualMachineInstanceStatus {
            phase: Some(p),
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
}
