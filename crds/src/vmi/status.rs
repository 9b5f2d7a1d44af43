//! Observed state of a VMI: phase, conditions, interfaces.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::VirtualMachineInstance;

/// Observed state of a VMI, derived by the operator from its launcher pod.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceStatus {
    /// Lifecycle phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<VmiPhase>,
    /// Short machine-readable reason for the phase (set when Failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable detail (the launcher's termination message when Failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Conditions (Ready, Paused), one per type: a map list, so the operator (Ready) and the
    /// node agent (Paused) each own their entries under server-side apply.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<VmiCondition>,
    /// When each phase was entered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phase_transition_timestamps: Vec<PhaseTransitionTimestamp>,
    /// Node the launcher pod runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Guest interfaces; `interfaces[0].ipAddress` is the pod IP.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<InterfaceStatus>,
    /// Name of the launcher pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launcher_pod: Option<String>,
    /// Milliseconds from VMM start to guest booted, reported by the launcher.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_time_ms: Option<u64>,
}

/// VMI lifecycle phase (KubeVirt's names).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum VmiPhase {
    /// Accepted; no launcher pod yet (or the pod is not scheduled yet).
    Pending,
    /// Launcher pod created, no node assigned.
    Scheduling,
    /// Node assigned, launcher not running yet.
    Scheduled,
    /// Launcher container running.
    Running,
    /// Guest powered off cleanly (launcher exited 0).
    Succeeded,
    /// Launcher failed (non-zero exit, or pod Failed/lost).
    Failed,
    /// State cannot be determined.
    Unknown,
}

impl VmiPhase {
    /// Succeeded or Failed: nothing more will happen to this VMI.
    pub fn is_final(self) -> bool {
        matches!(self, VmiPhase::Succeeded | VmiPhase::Failed)
    }

    /// The name used in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            VmiPhase::Pending => "Pending",
            VmiPhase::Scheduling => "Scheduling",
            VmiPhase::Scheduled => "Scheduled",
            VmiPhase::Running => "Running",
            VmiPhase::Succeeded => "Succeeded",
            VmiPhase::Failed => "Failed",
            VmiPhase::Unknown => "Unknown",
        }
    }
}

impl std::fmt::Display for VmiPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A VMI condition.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VmiCondition {
    /// Ready or Paused.
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

/// When a phase was entered.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PhaseTransitionTimestamp {
    /// The phase.
    pub phase: VmiPhase,
    /// When it was entered.
    pub phase_transition_timestamp: Time,
}

/// Observed state of a guest interface.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceStatus {
    /// Interface name from the spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Primary IP address (the pod IP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_address: Option<String>,
    /// All IP addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_addresses: Vec<String>,
    /// MAC address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
}

impl VirtualMachineInstanceStatus {
    /// The condition of the given type, if present.
    pub fn condition(&self, type_: &str) -> Option<&VmiCondition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    /// Whether the Ready condition is True.
    pub fn is_ready(&self) -> bool {
        self.condition("Ready").is_some_and(|c| c.status == "True")
    }
}

impl VirtualMachineInstance {
    /// Current phase (None before the operator has seen the VMI).
    pub fn phase(&self) -> Option<VmiPhase> {
        self.status.as_ref().and_then(|s| s.phase)
    }

    /// Whether the Ready condition is True.
    pub fn is_ready(&self) -> bool {
        self.status.as_ref().is_some_and(|s| s.is_ready())
    }
}
