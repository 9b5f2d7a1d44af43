//! `VirtualMachine` (short name `vm`): a VMI that is started and stopped by a run strategy.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::refusals;
use crate::template::VirtualMachineInstanceTemplateSpec;

#[allow(clippy::duplicated_attributes)] // repeated printcolumn(...) arguments of #[kube]
/// Desired state of a VirtualMachine.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "microvirt.io",
    version = "v1alpha1",
    kind = "VirtualMachine",
    plural = "virtualmachines",
    singular = "virtualmachine",
    shortname = "vm",
    shortname = "vms",
    category = "microvirt",
    namespaced,
    status = "VirtualMachineStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "A virtual machine whose VMI the operator creates and deletes according to runStrategy.",
    printcolumn(
        name = "Status",
        type_ = "string",
        json_path = ".status.printableStatus"
    ),
    printcolumn(name = "Ready", type_ = "boolean", json_path = ".status.ready"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(
    validation = Rule::new("!(has(self.running) && has(self.runStrategy))")
        .message("set either spec.running or spec.runStrategy, not both"),
    validation = Rule::new("!has(self.dataVolumeTemplates)")
        .message(refusals::DATA_VOLUME_TEMPLATES)
        .field_path(".dataVolumeTemplates")
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineSpec {
    /// Deprecated shorthand: true = Always, false = Halted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<bool>,
    /// When the operator keeps a VMI: Always, Halted, Manual, RerunOnFailure, Once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_strategy: Option<RunStrategy>,
    /// The VMI to run.
    pub template: VirtualMachineInstanceTemplateSpec,
    /// The instancetype that sizes the VM (vCPUs, memory): expanded into each VMI; the
    /// template must not set what it sets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instancetype: Option<InstancetypeMatcher>,
    /// The preference whose defaults the VM's VMIs get.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preference: Option<PreferenceMatcher>,
    /// CDI DataVolume templates: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object_list")]
    pub data_volume_templates: Option<Vec<serde_json::Value>>,
}

/// A VM's reference to an instancetype (KubeVirt's `InstancetypeMatcher`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("!has(self.kind) || self.kind.lowerAscii() in ['virtualmachineinstancetype', 'virtualmachineinstancetypes', 'virtualmachineclusterinstancetype', 'virtualmachineclusterinstancetypes']")
        .message(refusals::INSTANCETYPE_KIND)
        .field_path(".kind"),
    validation = Rule::new("has(self.inferFromVolume) || size(self.name) > 0")
        .message("instancetype.name is required")
        .field_path(".name"),
    validation = Rule::new("!has(self.inferFromVolume) && !has(self.inferFromVolumeFailurePolicy)")
        .message(refusals::INFER_FROM_VOLUME)
        .field_path(".inferFromVolume")
)]
#[serde(rename_all = "camelCase")]
pub struct InstancetypeMatcher {
    /// `VirtualMachineClusterInstancetype` (the default) or `VirtualMachineInstancetype` (in
    /// the VM's namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub kind: Option<String>,
    /// Name of the instancetype (required: a validation rule says so).
    #[serde(default)]
    #[schemars(length(max = 253))]
    pub name: String,
    /// The ControllerRevision (in the VM's namespace) that holds the instancetype as the VM
    /// first started with it; the operator sets it at the first start, and later VMIs are
    /// expanded from it, so edits of the instancetype do not change the VM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub revision_name: Option<String>,
    /// KubeVirt's inference from a volume: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub infer_from_volume: Option<String>,
    /// KubeVirt's inference failure policy: refused with `inferFromVolume`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub infer_from_volume_failure_policy: Option<String>,
}

/// A VM's reference to a preference (KubeVirt's `PreferenceMatcher`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("!has(self.kind) || self.kind.lowerAscii() in ['virtualmachinepreference', 'virtualmachinepreferences', 'virtualmachineclusterpreference', 'virtualmachineclusterpreferences']")
        .message(refusals::PREFERENCE_KIND)
        .field_path(".kind"),
    validation = Rule::new("has(self.inferFromVolume) || size(self.name) > 0")
        .message("preference.name is required")
        .field_path(".name"),
    validation = Rule::new("!has(self.inferFromVolume) && !has(self.inferFromVolumeFailurePolicy)")
        .message(refusals::INFER_FROM_VOLUME)
        .field_path(".inferFromVolume")
)]
#[serde(rename_all = "camelCase")]
pub struct PreferenceMatcher {
    /// `VirtualMachineClusterPreference` (the default) or `VirtualMachinePreference` (in the
    /// VM's namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub kind: Option<String>,
    /// Name of the preference (required: a validation rule says so).
    #[serde(default)]
    #[schemars(length(max = 253))]
    pub name: String,
    /// The ControllerRevision that holds the preference as the VM first started with it (as
    /// for the instancetype).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub revision_name: Option<String>,
    /// KubeVirt's inference from a volume: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub infer_from_volume: Option<String>,
    /// KubeVirt's inference failure policy: refused with `inferFromVolume`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub infer_from_volume_failure_policy: Option<String>,
}

/// Run strategies (KubeVirt's semantics).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum RunStrategy {
    /// Keep a VMI running; recreate it whenever it ends.
    Always,
    /// Keep no VMI.
    Halted,
    /// Never create or delete the VMI on its own; the user starts and stops it.
    Manual,
    /// Recreate the VMI when it Failed; leave it when it Succeeded.
    RerunOnFailure,
    /// Run the VMI once; never recreate it.
    Once,
}

impl VirtualMachineSpec {
    /// The effective run strategy (`running` maps to Always/Halted; default Halted).
    pub fn effective_run_strategy(&self) -> RunStrategy {
        match (self.run_strategy, self.running) {
            (Some(s), _) => s,
            (None, Some(true)) => RunStrategy::Always,
            (None, Some(false)) | (None, None) => RunStrategy::Halted,
        }
    }
}

/// Observed state of a VirtualMachine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineStatus {
    /// Human-readable state: Stopped, Starting, Running, Stopping, Succeeded, Failed, Unknown,
    /// CrashLoopBackOff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub printable_status: Option<PrintableStatus>,
    /// Whether the VMI exists and is Ready.
    #[serde(default)]
    pub ready: bool,
    /// Whether a VMI exists.
    #[serde(default)]
    pub created: bool,
    /// Name of the current VMI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vmi_name: Option<String>,
    /// uid of the last VMI that `Once` already ran (so it is not run again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub once_ran_uid: Option<String>,
    /// The run strategy the operator last acted on, recorded once the VM has had a VMI
    /// (KubeVirt's `status.runStrategy`): `RerunOnFailure` starts a VMI on its own only when
    /// it was just chosen, not after a stop request ended the VMI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_strategy: Option<RunStrategy>,
    /// Start and stop requests, oldest first (KubeVirt's `status.stateChangeRequests`): what
    /// `kubectl microvirt start/stop/restart` ask for when the run strategy itself stays
    /// (`Manual`, `RerunOnFailure`, and a restart under `Always`). The operator acts on the
    /// first one and removes it once it is done; the operator's status updates never touch
    /// this list otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub state_change_requests: Vec<StateChangeRequest>,
    /// KubeVirt's start-failure tracking: set when a VMI of an `Always` or `RerunOnFailure`
    /// VM failed before its VM ran, cleared once a VMI is `Running` and Ready (or the run
    /// strategy restarts nothing). The next VMI is created no earlier than
    /// `retryAfterTimestamp`; meanwhile `printableStatus` is `CrashLoopBackOff`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_failure: Option<VirtualMachineStartFailure>,
    /// KubeVirt's VM conditions; microvirt writes `Failure` (status "True") while it cannot
    /// create the VM's VMI: its instancetype or preference is missing or conflicts with the
    /// template, or the API server refused the VMI. Its message names the cause.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<VirtualMachineCondition>,
}

/// A condition of a VirtualMachine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineCondition {
    /// `Failure`.
    #[serde(rename = "type")]
    pub type_: String,
    /// "True", "False" or "Unknown".
    pub status: String,
    /// Machine-readable reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When status last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
}

/// Consecutive start failures of a VM (KubeVirt's `VirtualMachineStartFailure`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineStartFailure {
    /// VMIs in a row that failed before they ran.
    #[serde(default)]
    pub consecutive_fail_count: i32,
    /// uid of the last of them (each failed VMI is counted once).
    #[serde(
        default,
        rename = "lastFailedVMIUID",
        skip_serializing_if = "Option::is_none"
    )]
    pub last_failed_vmi_uid: Option<String>,
    /// No new VMI is created before this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_timestamp: Option<Time>,
}

/// A request to start or stop a VM's VMI.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StateChangeRequest {
    /// Start or Stop.
    pub action: StateChangeAction,
    /// Stop: the uid of the VMI to stop (a request for a VMI that is gone is done).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Extra parameters (KubeVirt's `data`; none is read yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<std::collections::BTreeMap<String, String>>,
}

/// What a [`StateChangeRequest`] asks for.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum StateChangeAction {
    /// Create a VMI (when there is none).
    Start,
    /// Delete the VMI with the request's uid.
    Stop,
}

impl StateChangeRequest {
    /// A start request.
    pub fn start() -> Self {
        Self {
            action: StateChangeAction::Start,
            uid: None,
            data: None,
        }
    }

    /// A request to stop the VMI with `uid`.
    pub fn stop(uid: &str) -> Self {
        Self {
            action: StateChangeAction::Stop,
            uid: Some(uid.to_string()),
            data: None,
        }
    }
}

/// `kubectl get vm` STATUS values.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum PrintableStatus {
    /// No VMI.
    Stopped,
    /// VMI exists, not Running yet.
    Starting,
    /// VMI Running.
    Running,
    /// VMI being deleted.
    Stopping,
    /// VMI ended cleanly and is kept.
    Succeeded,
    /// VMI failed and is kept.
    Failed,
    /// VMI state unknown.
    Unknown,
    /// The last VMIs failed before they ran; the next one waits out a back-off
    /// (`status.startFailure.retryAfterTimestamp`).
    CrashLoopBackOff,
}
