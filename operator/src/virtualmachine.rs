//! VirtualMachine planning (pure): run-strategy semantics and printable status.
//!
//! | runStrategy    | no VMI                      | VMI Succeeded | VMI Failed |
//! |----------------|-----------------------------|---------------|------------|
//! | Always         | create                      | delete (→ recreated) | delete (→ recreated) |
//! | RerunOnFailure | create                      | keep          | delete (→ recreated) |
//! | Once           | create unless it already ran| keep          | keep       |
//! | Manual         | nothing                     | keep          | keep       |
//! | Halted         | nothing (an existing VMI is deleted) |      |            |
//!
//! The VMI has the VM's name, the template's labels plus `microvirt.io/vm=<name>`, and a
//! controller owner reference to the VM.

use kube::{Resource, ResourceExt};
use microvirt_crds::{
    PrintableStatus, RunStrategy, VirtualMachine, VirtualMachineInstance, VirtualMachineStatus,
    VmiPhase,
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

/// Decide the action and the status for `vm`, given the VMI with its name (if any).
pub fn plan(
    vm: &VirtualMachine,
    vmi: Option<&VirtualMachineInstance>,
) -> (VmAction, VirtualMachineStatus) {
    let strategy = vm.spec.effective_run_strategy();
    let old = vm.status.clone().unwrap_or_default();
    let vmi = vmi.filter(|v| owned_by(v, vm));
    let deleting = vmi.is_some_and(|v| v.metadata.deletion_timestamp.is_some());
    let phase = vmi.and_then(|v| v.phase());

    let action = match (strategy, vmi) {
        (_, Some(_)) if deleting => VmAction::None,
        (RunStrategy::Halted, Some(_)) => VmAction::Delete,
        (RunStrategy::Halted | RunStrategy::Manual, None) => VmAction::None,
        (RunStrategy::Once, None) if old.once_ran_uid.is_some() => VmAction::None,
        (RunStrategy::Always | RunStrategy::RerunOnFailure | RunStrategy::Once, None) => {
            VmAction::Create
        }
        (RunStrategy::Always, Some(_)) if phase.is_some_and(|p| p.is_final()) => VmAction::Delete,
        (RunStrategy::RerunOnFailure, Some(_)) if phase == Some(VmiPhase::Failed) => {
            VmAction::Delete
        }
        _ => VmAction::None,
    };

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
    let status = VirtualMachineStatus {
        printable_status: Some(printable),
        ready: vmi.is_some_and(|v| v.is_ready()) && !deleting,
        created: vmi.is_some(),
        vmi_name: vmi.map(|v| v.name_any()),
        once_ran_uid,
    };
    (action, status)
}

/// The VMI a VM creates.
pub fn new_vmi(vm: &VirtualMachine) -> VirtualMachineInstance {
    let name = vm.name_any();
    let mut vmi = VirtualMachineInstance::new(&name, vm.spec.template.spec.clone());
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
            let (got, _) = plan(&m, vmi.as_ref());
            assert_eq!(got, *want, "strategy {s:?} vmi {vmi_phase:?}");
        }
    }

    #[test]
    fn once_does_not_rerun_after_its_vmi_is_gone() {
        let mut m = vm(RunStrategy::Once);
        let v = vmi_in(&m, Some(VmiPhase::Succeeded), false);
        let (_, st) = plan(&m, Some(&v));
        assert_eq!(st.once_ran_uid.as_deref(), Some("vmi-uid"));
        m.status = Some(st);
        let (action, st) = plan(&m, None);
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
        let (_, st) = plan(&m, Some(&v));
        assert_eq!(st.printable_status, Some(PrintableStatus::Running));
        assert!(st.ready && st.created);
        let mut d = v.clone();
        d.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(1).unwrap()));
        let (a, st) = plan(&m, Some(&d));
        assert_eq!(a, VmAction::None);
        assert_eq!(st.printable_status, Some(PrintableStatus::Stopping));
        // A VMI not owned by this VM is ignored.
        let mut foreign = v;
        foreign.metadata.owner_references = None;
        let (a, st) = plan(&m, Some(&foreign));
        assert_eq!(a, VmAction::Create);
        assert!(!st.created);
    }
}
