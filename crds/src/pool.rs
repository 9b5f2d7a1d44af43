//! `VirtualMachinePool` (short name `vmpool`): N identical VMIs, scaled out from warm members —
//! launcher pods that restored a snapshot of the template's booted guest and wait paused.
//!
//! Field names follow KubeVirt's `pool.kubevirt.io` VirtualMachinePool where they exist
//! (`replicas`, `selector`, `paused`, `scaleInStrategy`, status `replicas`, `readyReplicas`,
//! `labelSelector`, conditions `ReplicaFailure` and `ReplicaPaused`). Two choices differ, both
//! explained in `docs/pools.md`: members are VMIs made from a VMI `template` (as in a VMIRS), not
//! VirtualMachines (KubeVirt's `virtualMachineTemplate` is accepted as another spelling: its
//! `spec.template` is the VMI template); and `warm` (what KubeVirt's
//! `statePreservation: Online` leaves as a to-do) is ours.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::refusals;
use crate::template::{TemplateMeta, VirtualMachineInstanceTemplateSpec};
use crate::vm::VirtualMachineSpec;

/// Longest pool name: its VMIs are `<pool>-<5 characters>` and a VMI name is a label value
/// (at most 63 characters) on the launcher pod.
pub const MAX_POOL_NAME: usize = 57;
/// Label on every pod and VMI of a pool: the pool's name.
pub const LABEL_POOL: &str = "microvirt.io/pool";
/// Label on a pool's pods: what the pod is to the pool ([`MemberRole`]).
pub const LABEL_POOL_ROLE: &str = "microvirt.io/pool-role";
/// Label on a pool's pods and VMIs: the hash of the template they were made from.
pub const LABEL_TEMPLATE_HASH: &str = "microvirt.io/template-hash";
/// Label on a pool's warm and builder pods: the id of the snapshot they restore or capture.
pub const LABEL_SNAPSHOT: &str = "microvirt.io/snapshot";
/// Annotation on a VMI made from a warm member: the id of the snapshot it was restored from.
pub const ANNOTATION_CLAIMED_FROM: &str = "microvirt.io/claimed-from";
/// Annotation on a pool's warm and builder pods: the pool's uid (the snapshot directory on the
/// node is `<snapshot root>/<pool uid>/<snapshot id>`).
pub const ANNOTATION_POOL_UID: &str = "microvirt.io/pool-uid";
/// Annotation on a Node, written by the node agent: the host facts a snapshot must match
/// ([`HostFacts`] in its string form).
pub const ANNOTATION_HOST_FACTS: &str = "microvirt.io/host-facts";
/// Where snapshots live on a node: `<root>/<pool uid>/<snapshot id>/` (a hostPath). The node
/// agent removes the directories of pools that no longer exist and of snapshots nothing uses.
pub const SNAPSHOT_ROOT: &str = "/var/lib/microvirt/snapshots";
/// Where builder and warm pods see their snapshot directory (the `snapshot` control request
/// writes into it; warm members restore from it).
pub const SNAPSHOT_MOUNT: &str = "/var/run/microvirt/snapshot";

/// What a pod is to its pool (value of [`LABEL_POOL_ROLE`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemberRole {
    /// Boots the template cold and is snapshotted once the guest has booted.
    Builder,
    /// Restored from the snapshot, paused, waiting to be claimed.
    Warm,
    /// A warm member that became a replica's VMI (owned by that VMI from then on).
    Claimed,
}

impl MemberRole {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            MemberRole::Builder => "builder",
            MemberRole::Warm => "warm",
            MemberRole::Claimed => "claimed",
        }
    }

    /// Parses a label value.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "builder" => Some(MemberRole::Builder),
            "warm" => Some(MemberRole::Warm),
            "claimed" => Some(MemberRole::Claimed),
            _ => None,
        }
    }
}

#[allow(clippy::duplicated_attributes)] // repeated printcolumn(...) arguments of #[kube]
/// Desired state of a VM pool.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "microvirt.io",
    version = "v1alpha1",
    kind = "VirtualMachinePool",
    plural = "virtualmachinepools",
    singular = "virtualmachinepool",
    shortname = "vmpool",
    shortname = "vmpools",
    category = "microvirt",
    namespaced,
    status = "VirtualMachinePoolStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "Keeps `replicas` VMIs made from `template`; with `warm`, new replicas are claimed from paused, snapshot-restored warm members instead of booting.",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.labelSelector"
    ),
    printcolumn(name = "Desired", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Current", type_ = "integer", json_path = ".status.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(name = "Warm", type_ = "integer", json_path = ".status.warmReplicas"),
    printcolumn(name = "Snapshot", type_ = "string", json_path = ".status.snapshot.phase"),
    printcolumn(
        name = "Claim-P50-ms",
        type_ = "integer",
        json_path = ".status.claimLatency.p50Ms",
        priority = 1
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("size(self.metadata.name) <= 57")
        .message("metadata.name of a VirtualMachinePool must be at most 57 characters: its VMIs are named <pool>-<5 characters> and a VMI name must fit a label value (63)")
)]
#[x_kube(
    validation = Rule::new(
        "!has(self.template) || !has(self.selector.matchLabels) || self.selector.matchLabels.all(k, has(self.template.metadata) && has(self.template.metadata.labels) && k in self.template.metadata.labels && self.template.metadata.labels[k] == self.selector.matchLabels[k])"
    )
    .message("spec.template.metadata.labels must contain every label of spec.selector.matchLabels"),
    validation = Rule::new(
        "!has(self.virtualMachineTemplate) || !has(self.selector.matchLabels) || self.selector.matchLabels.all(k, has(self.virtualMachineTemplate.spec.template.metadata) && has(self.virtualMachineTemplate.spec.template.metadata.labels) && k in self.virtualMachineTemplate.spec.template.metadata.labels && self.virtualMachineTemplate.spec.template.metadata.labels[k] == self.selector.matchLabels[k])"
    )
    .message(refusals::POOL_VM_TEMPLATE_SELECTOR)
    .field_path(".virtualMachineTemplate.spec.template.metadata.labels"),
    validation = Rule::new("has(self.selector.matchLabels) || has(self.selector.matchExpressions)")
        .message("spec.selector must not be empty"),
    validation = Rule::new(
        "!has(self.warm) || !has(self.template) || !has(self.template.spec.volumes) || self.template.spec.volumes.all(v, !has(v.persistentVolumeClaim) && !has(v.emptyDisk))"
    )
    .message("spec.warm needs a template without persistentVolumeClaim and emptyDisk volumes: every warm member is restored from one snapshot, so they would share one PVC, and an emptyDisk's content is not part of the snapshot (use containerDisk, whose overlay travels with the snapshot)"),
    validation = Rule::new(
        "!has(self.warm) || !has(self.template) || !has(self.template.spec.domain.devices) || !has(self.template.spec.domain.devices.interfaces) || self.template.spec.domain.devices.interfaces.all(i, !has(i.bridge))"
    )
    .message("spec.warm needs masquerade interfaces: with a bridge binding the restored guest would keep the pod IP of the pod the snapshot was taken in"),
    validation = Rule::new("!has(self.warm) || !has(self.template) || !has(self.template.spec.startStrategy)")
        .message(refusals::POOL_WARM_START_STRATEGY)
        .field_path(".template.spec.startStrategy"),
    validation = Rule::new("!has(self.warm) || !has(self.template) || (!has(self.template.spec.readinessProbe) && !has(self.template.spec.livenessProbe))")
        .message(refusals::POOL_WARM_PROBES)
        .field_path(".template.spec"),
    // `template` is required by this rule rather than by the schema, so that a KubeVirt pool
    // (virtualMachineTemplate, no template) is accepted.
    validation = Rule::new("has(self.template) || has(self.virtualMachineTemplate)")
        .message("spec.template (or KubeVirt's spec.virtualMachineTemplate) is required")
        .field_path(".template"),
    validation = Rule::new("!has(self.template) || !has(self.virtualMachineTemplate)")
        .message(refusals::POOL_BOTH_TEMPLATES)
        .field_path(".virtualMachineTemplate"),
    validation = Rule::new("!has(self.virtualMachineTemplate) || !has(self.virtualMachineTemplate.spec.instancetype)")
        .message(refusals::POOL_INSTANCETYPE)
        .field_path(".virtualMachineTemplate.spec.instancetype"),
    validation = Rule::new("!has(self.virtualMachineTemplate) || !has(self.virtualMachineTemplate.spec.preference)")
        .message(refusals::POOL_PREFERENCE)
        .field_path(".virtualMachineTemplate.spec.preference"),
    validation = Rule::new("!has(self.virtualMachineTemplate) || !has(self.warm)")
        .message(refusals::POOL_VM_TEMPLATE_WARM)
        .field_path(".warm"),
    validation = Rule::new(
        "!has(self.virtualMachineTemplate) || (has(self.virtualMachineTemplate.spec.runStrategy) ? self.virtualMachineTemplate.spec.runStrategy == 'Always' : (has(self.virtualMachineTemplate.spec.running) && self.virtualMachineTemplate.spec.running))"
    )
    .message(refusals::POOL_VM_RUN_STRATEGY)
    .field_path(".virtualMachineTemplate.spec.runStrategy")
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachinePoolSpec {
    /// Desired number of VMIs (default 1). `kubectl scale`, an HPA or KEDA set it through the
    /// scale subresource; 0 is allowed (scale to zero; warm members stay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10000))]
    pub replicas: Option<i32>,
    /// Which VMIs belong to the pool (must match the template's labels).
    #[schemars(schema_with = "crate::schema::label_selector")]
    pub selector: LabelSelector,
    /// Template of the pool's VMIs (a VMI template, as in a VirtualMachineInstanceReplicaSet).
    /// Required (a validation rule says so).
    #[serde(default)]
    #[schemars(transform = crate::schema::no_default)]
    pub template: VirtualMachineInstanceTemplateSpec,
    /// When true the operator neither creates, claims nor deletes VMIs or warm members of this
    /// pool; it only reports status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// How VMIs are removed when `replicas` goes down (default: proactive, random order).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_in_strategy: Option<ScaleInStrategy>,
    /// Warm members: paused VMs restored from a snapshot of the template's booted guest, from
    /// which new replicas are claimed. Without it every replica boots cold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<WarmSpec>,
    /// KubeVirt's spelling, instead of `template`: a VirtualMachine template whose
    /// `spec.template` is the members' VMI template. A microvirt pool makes no VirtualMachines,
    /// so the VM's own `metadata` has no effect and its run strategy must be `Always` (what the
    /// pool does: an ended member is replaced); `warm` needs `template`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_machine_template: Option<PoolVirtualMachineTemplate>,
}

/// KubeVirt's `virtualMachineTemplate` of a pool: a VirtualMachine's metadata and spec.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolVirtualMachineTemplate {
    /// Labels and annotations of the VirtualMachines KubeVirt would create; no effect (a
    /// microvirt pool's members are VMIs, labelled by `spec.template.metadata`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMeta>,
    /// The VirtualMachine spec: `runStrategy: Always` (or `running: true`) and the VMI
    /// `template` (instancetypes and preferences are refused: the members are VMIs; dataVolumeTemplates
    /// as in a VM).
    pub spec: VirtualMachineSpec,
}

impl VirtualMachinePoolSpec {
    /// The members' VMI template: `template`, or KubeVirt's
    /// `virtualMachineTemplate.spec.template` (the validation rules admit exactly one).
    pub fn vmi_template(&self) -> &VirtualMachineInstanceTemplateSpec {
        match &self.virtual_machine_template {
            Some(vm) => &vm.spec.template,
            None => &self.template,
        }
    }
}

/// How a pool scales in (KubeVirt's names; exactly one of the three).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new(
        "(has(self.proactive) ? 1 : 0) + (has(self.opportunistic) ? 1 : 0) + (has(self.unmanaged) ? 1 : 0) == 1"
    )
    .message("spec.scaleInStrategy needs exactly one of proactive, opportunistic, unmanaged")
)]
#[serde(rename_all = "camelCase")]
pub struct ScaleInStrategy {
    /// Delete VMIs beyond `replicas` at once (the default), chosen by `selectionPolicy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proactive: Option<ProactiveScaleIn>,
    /// Delete nothing; VMIs beyond `replicas` leave when they end by themselves (guest shut
    /// down, failed, deleted by someone else) and are not replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opportunistic: Option<OpportunisticScaleIn>,
    /// Never remove a VMI; ended VMIs are not replaced while there are more than `replicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unmanaged: Option<UnmanagedScaleIn>,
}

/// Proactive scale-in.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProactiveScaleIn {
    /// Which VMIs go first (not-Ready VMIs always go before Ready ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selection_policy: Option<SelectionPolicy>,
    /// Only `Disabled`: a member that ran never returns to the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_preservation: Option<StatePreservation>,
}

/// Opportunistic scale-in.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OpportunisticScaleIn {
    /// Only `Disabled`: a member that ran never returns to the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_preservation: Option<StatePreservation>,
}

/// Unmanaged scale-in (no fields).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct UnmanagedScaleIn {}

/// The order in which proactive scale-in picks VMIs.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SelectionPolicy {
    /// AscendingOrder / DescendingOrder (by name), Newest, Oldest, Random (default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sort_policy: Option<SortPolicy>,
}

/// KubeVirt's sort policies.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum SortPolicy {
    /// Lowest name first.
    AscendingOrder,
    /// Highest name first.
    DescendingOrder,
    /// Most recently created first.
    Newest,
    /// Least recently created first.
    Oldest,
    /// Any order (the default).
    Random,
}

/// What happens to a scaled-in member's state. KubeVirt also has `Offline` and `Online`
/// (reuse the member's disks / memory on the next scale-out); a microvirt pool never hands a
/// member that ran to another replica (no state leaks between tenants), and `warm` is its
/// answer to fast scale-out.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum StatePreservation {
    /// The member and all its state are deleted.
    Disabled,
}

/// Warm members.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("!has(self.max) || self.max >= (has(self.min) ? self.min : 1)")
        .message("spec.warm.max must be at least spec.warm.min (default 1)")
)]
#[serde(rename_all = "camelCase")]
pub struct WarmSpec {
    /// Warm members kept while the pool has no replicas, and the fewest kept at any time
    /// (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    pub min: Option<i32>,
    /// The most warm members kept (default: `min`). The operator keeps
    /// `clamp(replicas, min, max)` of them: as many as there are replicas, so the pool can
    /// double at once (the default step of a HorizontalPodAutoscaler), within the bounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    pub max: Option<i32>,
    /// Replace a warm member that has waited this long with a fresh one (default: never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 31536000))]
    pub discard_after_seconds: Option<i64>,
    /// How the snapshot is taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotPolicy>,
}

/// How the pool's snapshot is captured.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotPolicy {
    /// Seconds to let the guest run after it signalled boot before the snapshot is taken (to
    /// start and warm up its workload first; default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3600))]
    pub after_boot_seconds: Option<i32>,
    /// Give up on a builder whose guest has not booted within this many seconds (default 300);
    /// the next attempt starts after a back-off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 3600))]
    pub capture_timeout_seconds: Option<i32>,
}

/// Observed state of a VM pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachinePoolStatus {
    /// VMIs that belong to the pool and are neither being deleted nor finished.
    #[serde(default)]
    pub replicas: i32,
    /// Of those, how many are Ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Warm members ready to be claimed (restored, paused, launcher Ready).
    #[serde(default)]
    pub warm_replicas: i32,
    /// The selector as a string, for the scale subresource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<String>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Hash of the current template (label `microvirt.io/template-hash` of its members).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_hash: Option<String>,
    /// The snapshot warm members are restored from (absent without `warm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<PoolSnapshot>,
    /// ReplicaPaused, ReplicaFailure (KubeVirt's), SnapshotReady, WarmReady.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Claim latency measured by the operator: from the reconcile that claimed a warm member
    /// to the claimed VMI's Ready condition, over the most recent claims.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_latency: Option<ClaimLatency>,
}

/// A snapshot of the template's booted guest, on one node.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolSnapshot {
    /// `<template hash>-<attempt>`; the directory on the node is
    /// `/var/lib/microvirt/snapshots/<pool uid>/<id>`.
    pub id: String,
    /// The template hash it was captured from.
    pub template_hash: String,
    /// Attempt number (a new snapshot of the same template gets the next one).
    pub attempt: i32,
    /// Capturing, Ready, Failed, Incompatible.
    pub phase: SnapshotPhase,
    /// The node it lives on (known once the builder is scheduled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The builder pod (while capturing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub builder: Option<String>,
    /// The node's host facts when the snapshot was taken; warm members are only created while
    /// the node still reports the same (`microvirt.io/host-facts` on the Node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_facts: Option<String>,
    /// When capture started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When capture ended: the snapshot was written (Ready), or capture failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// Warm members of this snapshot whose launcher ended before it was ever Ready (a restore
    /// the node refused); at 3 the snapshot is Failed and a new one is taken.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restore_failures: i32,
    /// Why it failed or was discarded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

fn is_zero(v: &i32) -> bool {
    *v == 0
}

/// Snapshot lifecycle.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum SnapshotPhase {
    /// A builder boots the template; the snapshot is taken once the guest has booted.
    #[default]
    Capturing,
    /// Written; warm members restore it.
    Ready,
    /// Capture failed (the next attempt follows after a back-off).
    Failed,
    /// The node no longer reports the host facts the snapshot was taken with.
    Incompatible,
}

impl SnapshotPhase {
    /// The name used in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotPhase::Capturing => "Capturing",
            SnapshotPhase::Ready => "Ready",
            SnapshotPhase::Failed => "Failed",
            SnapshotPhase::Incompatible => "Incompatible",
        }
    }
}

/// Claim latency over recent claims, in milliseconds.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimLatency {
    /// Claims the figures are computed from (the most recent, at most 100).
    pub samples: i32,
    /// The most recent claim.
    pub last_ms: i64,
    /// Median.
    pub p50_ms: i64,
    /// 95th percentile.
    pub p95_ms: i64,
    /// Slowest.
    pub max_ms: i64,
}

/// Facts about a host that a snapshot depends on: the CPU (vendor, family, model, stepping)
/// and the kernel release. Rendered as `cpu=<vendor>/<family>/<model>/<stepping> kernel=<release>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostFacts {
    /// CPUID vendor string, e.g. `AuthenticAMD`.
    pub cpu_vendor: String,
    /// Display family.
    pub cpu_family: u32,
    /// Display model.
    pub cpu_model: u32,
    /// Stepping.
    pub cpu_stepping: u32,
    /// `uname -r`.
    pub kernel: String,
}

impl std::fmt::Display for HostFacts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cpu={}/{}/{}/{} kernel={}",
            self.cpu_vendor, self.cpu_family, self.cpu_model, self.cpu_stepping, self.kernel
        )
    }
}

impl std::str::FromStr for HostFacts {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mut cpu = None;
        let mut kernel = None;
        for part in s.split_whitespace() {
            match part.split_once('=') {
                Some(("cpu", v)) => cpu = Some(v),
                Some(("kernel", v)) => kernel = Some(v),
                _ => return Err(format!("unexpected {part:?} in host facts {s:?}")),
            }
        }
        let cpu = cpu.ok_or_else(|| format!("no cpu= in host facts {s:?}"))?;
        let kernel = kernel.ok_or_else(|| format!("no kernel= in host facts {s:?}"))?;
        let f: Vec<&str> = cpu.split('/').collect();
        let num = |i: usize| -> Result<u32, String> {
            f.get(i).and_then(|v| v.parse().ok()).ok_or_else(|| {
                format!("bad cpu={cpu:?} in host facts (want vendor/family/model/stepping)")
            })
        };
        if f.len() != 4 || f[0].is_empty() {
            return Err(format!(
                "bad cpu={cpu:?} in host facts (want vendor/family/model/stepping)"
            ));
        }
        Ok(HostFacts {
            cpu_vendor: f[0].to_string(),
            cpu_family: num(1)?,
            cpu_model: num(2)?,
            cpu_stepping: num(3)?,
            kernel: kernel.to_string(),
        })
    }
}

impl VirtualMachinePoolSpec {
    /// Desired replicas (default 1).
    pub fn desired(&self) -> i32 {
        self.replicas.unwrap_or(1).max(0)
    }

    /// Whether the operator may act (not paused).
    pub fn is_paused(&self) -> bool {
        self.paused.unwrap_or(false)
    }

    /// Warm members wanted for `replicas` replicas: `clamp(replicas, min, max)`; 0 without `warm`.
    pub fn warm_target(&self, replicas: i32) -> i32 {
        let Some(w) = &self.warm else { return 0 };
        let min = w.min.unwrap_or(1).max(0);
        let max = w.max.unwrap_or(min).max(min);
        replicas.clamp(min, max)
    }

    /// The scale-in strategy in effect.
    pub fn scale_in(&self) -> ScaleIn {
        match &self.scale_in_strategy {
            Some(ScaleInStrategy {
                opportunistic: Some(_),
                ..
            }) => ScaleIn::Opportunistic,
            Some(ScaleInStrategy {
                unmanaged: Some(_), ..
            }) => ScaleIn::Unmanaged,
            Some(ScaleInStrategy {
                proactive: Some(p), ..
            }) => ScaleIn::Proactive(
                p.selection_policy
                    .as_ref()
                    .and_then(|s| s.sort_policy)
                    .unwrap_or(SortPolicy::Random),
            ),
            _ => ScaleIn::Proactive(SortPolicy::Random),
        }
    }
}

/// The effective scale-in behaviour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScaleIn {
    /// Delete surplus VMIs in this order.
    Proactive(SortPolicy),
    /// Delete none; ended ones are not replaced while above `replicas`.
    Opportunistic,
    /// Never delete; ended ones are not replaced while above `replicas`.
    Unmanaged,
}

impl WarmSpec {
    /// Seconds after boot before the snapshot (default 0).
    pub fn after_boot_seconds(&self) -> u64 {
        self.snapshot
            .as_ref()
            .and_then(|s| s.after_boot_seconds)
            .and_then(|s| u64::try_from(s).ok())
            .unwrap_or(0)
    }

    /// Capture timeout in seconds (default 300).
    pub fn capture_timeout_seconds(&self) -> u64 {
        self.snapshot
            .as_ref()
            .and_then(|s| s.capture_timeout_seconds)
            .and_then(|s| u64::try_from(s).ok())
            .unwrap_or(300)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(warm: Option<WarmSpec>) -> VirtualMachinePoolSpec {
        VirtualMachinePoolSpec {
            warm,
            ..Default::default()
        }
    }

    #[test]
    fn a_kubevirt_pool_takes_its_vmi_template_from_the_vm_template() {
        let yaml = r#"
selector: {matchLabels: {app: web}}
virtualMachineTemplate:
  metadata: {labels: {vm-label: x}}
  spec:
    runStrategy: Always
    template:
      metadata: {labels: {app: web}}
      spec: {domain: {memory: {guest: 128Mi}}}
"#;
        let v: serde_json::Value = serde_saphyr::from_str(yaml).unwrap();
        let k: VirtualMachinePoolSpec = serde_json::from_value(v).unwrap();
        let t = k.vmi_template();
        assert_eq!(t.labels().get("app").map(String::as_str), Some("web"));
        assert!(!t.labels().contains_key("vm-label"));
        let guest = t.spec.domain.memory.as_ref().and_then(|m| m.guest.as_ref());
        assert_eq!(guest.map(|q| q.0.as_str()), Some("128Mi"));
        // Without it, spec.template is the template.
        let mut p = spec(None);
        p.template.spec.hostname = Some("h".into());
        assert_eq!(p.vmi_template().spec.hostname.as_deref(), Some("h"));
    }

    #[test]
    fn warm_target_is_replicas_within_bounds() {
        assert_eq!(spec(None).warm_target(5), 0);
        let w = |min, max| {
            spec(Some(WarmSpec {
                min,
                max,
                ..Default::default()
            }))
        };
        assert_eq!(w(None, None).warm_target(0), 1);
        assert_eq!(w(None, None).warm_target(7), 1);
        assert_eq!(w(Some(2), Some(10)).warm_target(0), 2);
        assert_eq!(w(Some(2), Some(10)).warm_target(5), 5);
        assert_eq!(w(Some(2), Some(10)).warm_target(50), 10);
        assert_eq!(w(Some(0), Some(0)).warm_target(50), 0);
        // A max below min (refused by the schema) acts as min.
        assert_eq!(w(Some(3), Some(1)).warm_target(0), 3);
    }

    #[test]
    fn scale_in_defaults_to_proactive_random() {
        assert_eq!(
            spec(None).scale_in(),
            ScaleIn::Proactive(SortPolicy::Random)
        );
        let mut s = spec(None);
        s.scale_in_strategy = Some(ScaleInStrategy {
            proactive: Some(ProactiveScaleIn {
                selection_policy: Some(SelectionPolicy {
                    sort_policy: Some(SortPolicy::Newest),
                }),
                state_preservation: None,
            }),
            ..Default::default()
        });
        assert_eq!(s.scale_in(), ScaleIn::Proactive(SortPolicy::Newest));
        s.scale_in_strategy = Some(ScaleInStrategy {
            opportunistic: Some(OpportunisticScaleIn::default()),
            ..Default::default()
        });
        assert_eq!(s.scale_in(), ScaleIn::Opportunistic);
    }

    #[test]
    fn host_facts_round_trip_and_refuse_garbage() {
        let f = HostFacts {
            cpu_vendor: "AuthenticAMD".into(),
            cpu_family: 25,
            cpu_model: 1,
            cpu_stepping: 1,
            kernel: "6.18.2-fc".into(),
        };
        let s = f.to_string();
        assert_eq!(s, "cpu=AuthenticAMD/25/1/1 kernel=6.18.2-fc");
        assert_eq!(s.parse::<HostFacts>(), Ok(f));
        for bad in [
            "",
            "cpu=AuthenticAMD/25/1 kernel=x",
            "cpu=AuthenticAMD/25/1/x kernel=x",
            "cpu=/25/1/1 kernel=x",
            "kernel=x",
            "cpu=A/1/1/1",
            "cpu=A/1/1/1 kernel=x other=y",
        ] {
            assert!(bad.parse::<HostFacts>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn member_roles_round_trip() {
        for r in [MemberRole::Builder, MemberRole::Warm, MemberRole::Claimed] {
            assert_eq!(MemberRole::parse(r.as_str()), Some(r));
        }
        assert_eq!(MemberRole::parse("other"), None);
    }
}
