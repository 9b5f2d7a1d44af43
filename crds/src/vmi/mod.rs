//! `VirtualMachineInstance` (short name `vmi`): one running microVM.
//!
//! Field names follow KubeVirt's `kubevirt.io/v1` API so that a KubeVirt manifest works after its
//! `apiVersion` is changed to `microvirt.io/v1alpha1` (for the subset of fields microvirt supports).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, PodDNSConfig, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::refusals;

/// Label key that the operator puts on launcher pods: the owning VMI's name.
pub const LABEL_VMI_NAME: &str = "microvirt.io/vmi";
/// Finalizer the operator puts on every VMI (created by it or by a user): the launcher pod is
/// stopped before the VMI goes away.
pub const FINALIZER_LAUNCHER_POD: &str = "microvirt.io/launcher-pod";
/// Annotation key on launcher pods carrying the owning VMI's uid.
pub const ANNOTATION_VMI_UID: &str = "microvirt.io/vmi-uid";
/// Annotation on a VMI listing the presets (namespace/name, comma separated) applied to it.
pub const ANNOTATION_PRESETS_APPLIED: &str = "microvirt.io/presets-applied";
/// Annotation on launcher pods: milliseconds from VMM start to guest booted (set by the node
/// agent `virt-handler` while the pod runs; read by the operator into `status.bootTimeMs`).
pub const ANNOTATION_BOOT_TIME_MS: &str = "microvirt.io/boot-time-ms";
/// The launcher pod's control annotations (operator → node agent → launcher); their values are
/// [`crate::control::ControlRequest`] and [`crate::control::ControlResult`].
pub use crate::control::{ANNOTATION_CONTROL_REQUEST, ANNOTATION_CONTROL_RESULT};
/// Name of the interface and the network a VMI gets when it declares neither (KubeVirt's
/// `autoattachPodInterface`).
pub const DEFAULT_NETWORK_NAME: &str = "default";
/// VMI condition reported by the node agent (the launcher's `paused` state).
pub const CONDITION_PAUSED: &str = "Paused";
/// VMI conditions whose owner is the node agent (field manager `virt-handler`); the operator
/// leaves them alone while the VMI runs.
pub const NODE_AGENT_CONDITIONS: &[&str] = &[CONDITION_PAUSED];
/// Pod condition, and the launcher pod's only readiness gate: `True` while the launcher's VM
/// runs (for a VM pool's unclaimed warm member: restored and waiting paused), `False` once it
/// is paused or stopped. Written by the node agent `virt-handler` on `pods/status` from the
/// launcher's `watch` stream; absent (so the pod is not Ready) until the agent has seen the
/// launcher. The kubelet's pod Ready, and so the VMI's Ready, follow it (KubeVirt's Ready: the
/// VM runs in a Ready launcher pod; a paused VMI is not Ready).
pub const POD_CONDITION_VM_RUNNING: &str = "microvirt.io/vm-running";
/// Pod condition, informational (not a readiness gate): `True` once the guest signalled boot
/// through the boot timer (the shipped guest images do; a stock guest never does). Its
/// `lastTransitionTime` is when the node agent saw the boot; a VM pool's builder is snapshotted
/// `afterBootSeconds` after it. Written by the node agent, never set back to `False`.
pub const POD_CONDITION_GUEST_BOOTED: &str = "microvirt.io/guest-booted";
/// Reasons of the two pod conditions above.
pub const REASON_VM_RUNNING: &str = "VMRunning";
pub const REASON_VM_PAUSED: &str = "VMPaused";
pub const REASON_VM_STARTING: &str = "VMStarting";
pub const REASON_VM_STOPPED: &str = "VMStopped";
pub const REASON_WARM_MEMBER: &str = "RestoredPaused";
pub const REASON_GUEST_BOOTED: &str = "GuestBooted";

#[allow(clippy::duplicated_attributes)] // repeated printcolumn(...) arguments of #[kube]
/// Desired state of a microVM.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "microvirt.io",
    version = "v1alpha1",
    kind = "VirtualMachineInstance",
    plural = "virtualmachineinstances",
    singular = "virtualmachineinstance",
    shortname = "vmi",
    shortname = "vmis",
    category = "microvirt",
    namespaced,
    status = "VirtualMachineInstanceStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "A microVM instance. The operator runs it in one virt-launcher pod.",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "IP", type_ = "string", json_path = ".status.interfaces[0].ipAddress"),
    printcolumn(name = "NodeName", type_ = "string", json_path = ".status.nodeName"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].status"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("!has(oldSelf.status) || self.spec == oldSelf.spec")
        .message("spec of a VirtualMachineInstance is immutable after creation; delete and recreate it")
)]
#[x_kube(
    validation = Rule::new(
        "!has(self.domain.devices) || !has(self.domain.devices.disks) || self.domain.devices.disks.all(d, has(self.volumes) && self.volumes.exists(v, v.name == d.name))"
    )
    .message("every entry of spec.domain.devices.disks must name a volume listed in spec.volumes"),
    validation = Rule::new(
        "!has(self.domain.devices) || !has(self.domain.devices.interfaces) || self.domain.devices.interfaces.all(i, has(self.networks) && self.networks.exists(n, n.name == i.name))"
    )
    .message("every entry of spec.domain.devices.interfaces must name a network listed in spec.networks"),
    validation = Rule::new("!has(self.resourceClaims)").message(refusals::RESOURCE_CLAIMS).field_path(".resourceClaims"),
    validation = Rule::new(PROBES_NEED_A_NIC_RULE).message(refusals::PROBE_WITHOUT_NIC),
    validation = Rule::new(READINESS_PROBE_PORT_FORWARDED_RULE)
        .message(refusals::PROBE_PORT_NOT_FORWARDED)
        .field_path(".readinessProbe"),
    validation = Rule::new(LIVENESS_PROBE_PORT_FORWARDED_RULE)
        .message(refusals::PROBE_PORT_NOT_FORWARDED)
        .field_path(".livenessProbe"),
    validation = Rule::new("!has(self.livenessProbe) || !has(self.livenessProbe.successThreshold) || self.livenessProbe.successThreshold == 1")
        .message(refusals::LIVENESS_SUCCESS_THRESHOLD)
        .field_path(".livenessProbe.successThreshold"),
    validation = Rule::new("!has(self.accessCredentials)").message(refusals::ACCESS_CREDENTIALS).field_path(".accessCredentials"),
    validation = Rule::new("!has(self.dnsPolicy) || self.dnsPolicy != 'None' || (has(self.dnsConfig) && has(self.dnsConfig.nameservers) && size(self.dnsConfig.nameservers) > 0)")
        .message("dnsPolicy: None needs dnsConfig.nameservers (the pod, and so the guest, would have no DNS server)")
        .field_path(".dnsConfig"),
    validation = Rule::new("!has(self.evictionStrategy) || self.evictionStrategy == 'None' || self.evictionStrategy == 'LiveMigrateIfPossible'")
        .message(refusals::EVICTION_STRATEGY)
        .field_path(".evictionStrategy")
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceSpec {
    /// The virtual hardware.
    pub domain: DomainSpec,
    /// Volumes that disks refer to by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub volumes: Vec<Volume>,
    /// Networks that interfaces refer to by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub networks: Vec<Network>,
    /// Node labels the launcher pod must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Tolerations of the launcher pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// Affinity of the launcher pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Seconds the launcher gets to power the guest off when the VMI is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3600))]
    pub termination_grace_period_seconds: Option<i64>,
    /// Host name of the guest (DHCP, cloud-init `local-hostname`) and of the launcher pod
    /// (default: the VMI's name). With `subdomain` and a headless Service of that name,
    /// `<hostname>.<subdomain>.<namespace>.svc` resolves to the VMI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new(DNS_LABEL_RULE).message(
        "hostname must be a DNS label (lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters)"
    ))]
    pub hostname: Option<String>,
    /// Subdomain of the launcher pod (a headless Service's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new(DNS_LABEL_RULE).message(
        "subdomain must be a DNS label (lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters)"
    ))]
    pub subdomain: Option<String>,
    /// KubeVirt's eviction strategy. `None` (what microvirt does) and `LiveMigrateIfPossible`
    /// (the same, as nothing is migratable) are accepted; `LiveMigrate` and `External` are
    /// refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction_strategy: Option<EvictionStrategy>,
    /// PriorityClass of the launcher pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub priority_class_name: Option<String>,
    /// Scheduler of the launcher pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub scheduler_name: Option<String>,
    /// DNS policy of the launcher pod (`ClusterFirst`, the default, `ClusterFirstWithHostNet`,
    /// `Default` or `None`). The guest gets the pod's DNS servers and search list over DHCP,
    /// as in KubeVirt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_policy: Option<DnsPolicy>,
    /// DNS settings of the launcher pod (with `dnsPolicy: None`, the only ones), which the
    /// guest gets over DHCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_config: Option<PodDNSConfig>,
    /// KubeVirt's `startStrategy`: `Paused` builds the VM and leaves its vCPUs stopped (the
    /// `Paused` condition is True) until `kubectl microvirt unpause`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_strategy: Option<StartStrategy>,
    /// KubeVirt's dynamic resource allocation claims: refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object_list")]
    pub resource_claims: Option<Vec<serde_json::Value>>,
    /// KubeVirt's readiness probe (`tcpSocket` or `httpGet`): the launcher container's
    /// readiness probe, so the kubelet probes the pod IP, which reaches the guest (masquerade:
    /// DNAT to the guest; bridge: the guest owns the pod IP). The VMI is Ready only while it
    /// passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_probe: Option<Probe>,
    /// KubeVirt's liveness probe (`tcpSocket` or `httpGet`): the launcher container's liveness
    /// probe; when it fails the kubelet stops the launcher (the pod never restarts) and the VMI
    /// ends `Failed`, reason `LivenessProbeFailed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness_probe: Option<Probe>,
    /// KubeVirt's access credentials (SSH keys, passwords): refused, not implemented yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object_list")]
    pub access_credentials: Option<Vec<serde_json::Value>>,
}

/// CEL: a VMI with a probe has a NIC on the pod network (declared interfaces, or the pod
/// interface attached by default), else the kubelet's probes of the pod IP never reach the guest.
const PROBES_NEED_A_NIC_RULE: &str = "(!has(self.readinessProbe) && !has(self.livenessProbe)) || (has(self.domain.devices) && has(self.domain.devices.interfaces) && size(self.domain.devices.interfaces) > 0) || ((!has(self.networks) || size(self.networks) == 0) && (!has(self.domain.devices) || !has(self.domain.devices.autoattachPodInterface) || self.domain.devices.autoattachPodInterface))";

/// CEL: the readiness probe's port reaches the guest: a masquerade interface that lists
/// `ports` forwards only those (TCP) to the guest. (A probe with its own `host` goes elsewhere.)
const READINESS_PROBE_PORT_FORWARDED_RULE: &str = "!has(self.readinessProbe) || (has(self.readinessProbe.tcpSocket) && has(self.readinessProbe.tcpSocket.host)) || (has(self.readinessProbe.httpGet) && has(self.readinessProbe.httpGet.host)) || !has(self.domain.devices) || !has(self.domain.devices.interfaces) || self.domain.devices.interfaces.all(i, has(i.bridge) || !has(i.ports) || size(i.ports) == 0 || i.ports.exists(p, (!has(p.protocol) || p.protocol == 'TCP') && p.port == (has(self.readinessProbe.tcpSocket) ? self.readinessProbe.tcpSocket.port : has(self.readinessProbe.httpGet) ? self.readinessProbe.httpGet.port : 0)))";
/// CEL: the same for the liveness probe.
const LIVENESS_PROBE_PORT_FORWARDED_RULE: &str = "!has(self.livenessProbe) || (has(self.livenessProbe.tcpSocket) && has(self.livenessProbe.tcpSocket.host)) || (has(self.livenessProbe.httpGet) && has(self.livenessProbe.httpGet.host)) || !has(self.domain.devices) || !has(self.domain.devices.interfaces) || self.domain.devices.interfaces.all(i, has(i.bridge) || !has(i.ports) || size(i.ports) == 0 || i.ports.exists(p, (!has(p.protocol) || p.protocol == 'TCP') && p.port == (has(self.livenessProbe.tcpSocket) ? self.livenessProbe.tcpSocket.port : has(self.livenessProbe.httpGet) ? self.livenessProbe.httpGet.port : 0)))";

/// KubeVirt's `Probe`: a check of the guest that the kubelet runs against the pod IP. microvirt
/// supports the `tcpSocket` and `httpGet` handlers; `exec` and `guestAgentPing` run inside the
/// guest through a guest agent, which microvirt does not have (a validation rule says so).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("!has(self.exec)").message(refusals::PROBE_EXEC).field_path(".exec"),
    validation = Rule::new("!has(self.guestAgentPing)")
        .message(refusals::PROBE_GUEST_AGENT_PING)
        .field_path(".guestAgentPing"),
    validation = Rule::new("has(self.tcpSocket) || has(self.httpGet) || has(self.exec) || has(self.guestAgentPing)")
        .message(refusals::PROBE_NO_HANDLER),
    validation = Rule::new("!has(self.tcpSocket) || !has(self.httpGet)")
        .message(refusals::PROBE_TWO_HANDLERS)
)]
#[serde(rename_all = "camelCase")]
pub struct Probe {
    /// Open a TCP connection to the guest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_socket: Option<TcpSocketProbe>,
    /// An HTTP GET to the guest; success is a status from 200 to 399.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_get: Option<HttpGetProbe>,
    /// A command in the guest: refused (needs a guest agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub exec: Option<serde_json::Value>,
    /// A ping of the guest agent: refused (needs a guest agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub guest_agent_ping: Option<serde_json::Value>,
    /// Seconds after the launcher container started before the first probe (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 86400))]
    pub initial_delay_seconds: Option<i32>,
    /// Seconds after which a probe attempt counts as failed (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub timeout_seconds: Option<i32>,
    /// Seconds between probes (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub period_seconds: Option<i32>,
    /// Consecutive successes after a failure before the probe counts as passing (default 1;
    /// must be 1 for a liveness probe).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub success_threshold: Option<i32>,
    /// Consecutive failures before the probe counts as failed (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub failure_threshold: Option<i32>,
}

/// A probe that opens a TCP connection.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TcpSocketProbe {
    /// The guest's port (a number: the launcher container names no ports).
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// Host to connect to (default: the pod IP, which reaches the guest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub host: Option<String>,
}

/// A probe that sends an HTTP GET.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpGetProbe {
    /// The guest's port (a number: the launcher container names no ports).
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// Path of the request (default `/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    pub path: Option<String>,
    /// Host to connect to (default: the pod IP, which reaches the guest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub host: Option<String>,
    /// `HTTP` (default) or `HTTPS` (the certificate is not verified).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<ProbeScheme>,
    /// Headers of the request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub http_headers: Vec<ProbeHttpHeader>,
}

/// Scheme of an HTTP probe.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ProbeScheme {
    #[serde(rename = "HTTP")]
    Http,
    #[serde(rename = "HTTPS")]
    Https,
}

impl ProbeScheme {
    /// The name in a pod spec.
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeScheme::Http => "HTTP",
            ProbeScheme::Https => "HTTPS",
        }
    }
}

/// A header of an HTTP probe's request.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ProbeHttpHeader {
    /// Header name.
    #[schemars(length(min = 1, max = 256))]
    pub name: String,
    /// Header value.
    #[schemars(length(max = 4096))]
    pub value: String,
}

/// KubeVirt's eviction strategies.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum EvictionStrategy {
    /// The VMI is stopped on eviction (microvirt's behaviour).
    None,
    /// Live-migrate, else block the eviction: refused.
    LiveMigrate,
    /// Live-migrate when possible, else as None: accepted, as None.
    LiveMigrateIfPossible,
    /// Block the eviction for an external controller: refused.
    External,
}

/// A pod's DNS policies (Kubernetes' names).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum DnsPolicy {
    /// The cluster's DNS first (the default).
    ClusterFirst,
    /// The same for a pod on the host network (the launcher pod never is).
    ClusterFirstWithHostNet,
    /// The node's resolver configuration.
    Default,
    /// Only `dnsConfig`.
    None,
}

impl DnsPolicy {
    /// The name in a pod spec.
    pub fn as_str(self) -> &'static str {
        match self {
            DnsPolicy::ClusterFirst => "ClusterFirst",
            DnsPolicy::ClusterFirstWithHostNet => "ClusterFirstWithHostNet",
            DnsPolicy::Default => "Default",
            DnsPolicy::None => "None",
        }
    }
}

/// KubeVirt's start strategies.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum StartStrategy {
    /// Start the VMI paused.
    Paused,
}

/// Virtual hardware of a VMI (also the defaults a preset carries).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("!has(self.chassis)").message(refusals::CHASSIS).field_path(".chassis"),
    validation = Rule::new("!has(self.firmware) || !has(self.firmware.serial)")
        .message(refusals::FIRMWARE_SERIAL)
        .field_path(".firmware.serial")
)]
#[serde(rename_all = "camelCase")]
pub struct DomainSpec {
    /// vCPU topology; the guest gets cores × sockets × threads vCPUs (without any of them:
    /// the CPU limit, else the CPU request, rounded up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Cpu>,
    /// Guest memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
    /// Resources of the launcher pod's compute container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// How the guest is booted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware: Option<Firmware>,
    /// Disks and network interfaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<Devices>,
    /// Machine type. Accepted, no effect: a microVM has one machine (no PCI, virtio-mmio
    /// devices), whatever the type says (`q35`, `pc`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<Machine>,
    /// Platform features (acpi: on or off; apic, smm: accepted; hyperv: refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<Features>,
    /// Guest clock (UTC, kvm-clock; timer settings accepted without effect).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock: Option<Clock>,
    /// SMBIOS chassis information: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub chassis: Option<serde_json::Value>,
}

/// Machine type (accepted, no effect).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct Machine {
    /// KubeVirt's QEMU machine type, e.g. `q35`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub type_: Option<String>,
}

/// Platform features.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("!has(self.hyperv)").message(refusals::HYPERV).field_path(".hyperv"),
    validation = Rule::new("!has(self.kvm) || !has(self.kvm.hidden) || !self.kvm.hidden")
        .message(refusals::KVM_HIDDEN)
        .field_path(".kvm.hidden")
)]
#[serde(rename_all = "camelCase")]
pub struct Features {
    /// ACPI (default on): `enabled: false` builds the VM without ACPI tables; the launcher's
    /// soft stop then sends Ctrl-Alt-Del (i8042) instead of pressing the ACPI power button.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acpi: Option<FeatureState>,
    /// Accepted, no effect: every vCPU has a local APIC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apic: Option<FeatureApic>,
    /// Accepted, no effect: SMM is for firmware, and a microVM runs none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smm: Option<FeatureState>,
    /// Hyper-V enlightenments: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub hyperv: Option<serde_json::Value>,
    /// KVM's paravirtual features: accepted (the guest always sees KVM's CPUID signature and
    /// paravirtual features); `hidden: true` is refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kvm: Option<FeatureKvm>,
    /// Paravirtual spinlocks: accepted, no effect (the guest uses them when KVM offers them,
    /// whatever `enabled` says).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvspinlock: Option<FeatureState>,
}

/// KubeVirt's KVM feature.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct FeatureKvm {
    /// Hide the KVM signature from the guest: only `false`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden: Option<bool>,
}

/// A feature that is on when present (`enabled` defaults to true).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct FeatureState {
    /// Whether the feature is on (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// The APIC feature.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FeatureApic {
    /// Whether the feature is on (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// KubeVirt's EOI setting (no effect).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_of_interrupt: Option<bool>,
}

/// Guest clock.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("!has(self.timezone)").message(refusals::TIMEZONE).field_path(".timezone"),
    validation = Rule::new("!has(self.utc) || !has(self.utc.offsetSeconds) || self.utc.offsetSeconds == 0")
        .message(refusals::UTC_OFFSET)
        .field_path(".utc.offsetSeconds")
)]
#[serde(rename_all = "camelCase")]
pub struct Clock {
    /// The guest clock is UTC (the only choice).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utc: Option<ClockUtc>,
    /// KubeVirt's local-time clock: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub timezone: Option<String>,
    /// Timers. Accepted without effect (kvm-clock is the clock source; the microVM's PIT is
    /// KVM's, with its own tick policy; there is no HPET, RTC or Hyper-V clock), except that
    /// kvm-clock cannot be removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timer: Option<Timers>,
}

/// UTC clock.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClockUtc {
    /// Offset from UTC: only 0 (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset_seconds: Option<i64>,
}

/// KubeVirt's timers.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("!has(self.kvm) || !has(self.kvm.present) || self.kvm.present")
        .message(refusals::KVM_CLOCK)
        .field_path(".kvm.present")
)]
pub struct Timers {
    /// HPET.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hpet: Option<Timer>,
    /// kvm-clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kvm: Option<Timer>,
    /// PIT.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pit: Option<Timer>,
    /// RTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtc: Option<Timer>,
    /// Hyper-V reference clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hyperv: Option<Timer>,
}

/// One timer's settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Timer {
    /// Whether the timer is present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub present: Option<bool>,
    /// Tick policy (delay, catchup, merge, discard).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub tick_policy: Option<String>,
    /// What the RTC tracks (guest, wall).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub track: Option<String>,
}

/// vCPU topology.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("!has(self.isolateEmulatorThread) || !self.isolateEmulatorThread || (has(self.dedicatedCpuPlacement) && self.dedicatedCpuPlacement)")
        .message(refusals::ISOLATE_EMULATOR_THREAD)
        .field_path(".isolateEmulatorThread"),
    validation = Rule::new("!has(self.model) || self.model == 'host-passthrough' || self.model == 'host-model'")
        .message(refusals::CPU_MODEL)
        .field_path(".model"),
    validation = Rule::new("!has(self.features)").message(refusals::CPU_FEATURES).field_path(".features"),
    validation = Rule::new("!has(self.numa)").message(refusals::NUMA).field_path(".numa")
)]
#[serde(rename_all = "camelCase")]
pub struct Cpu {
    /// Cores per socket (at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub cores: Option<u32>,
    /// Sockets (at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 8))]
    pub sockets: Option<u32>,
    /// Threads per core (at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 2))]
    pub threads: Option<u32>,
    /// Whole, exclusive CPUs for the vCPUs: the launcher pod gets a CPU request and limit of
    /// one CPU per vCPU (Guaranteed QoS), which the kubelet's static CPU manager makes
    /// exclusive. The vCPU threads are not pinned one to one inside that set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedicated_cpu_placement: Option<bool>,
    /// With `dedicatedCpuPlacement`: one more whole CPU for the VMM's own threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolate_emulator_thread: Option<bool>,
    /// KubeVirt's CPU model: `host-passthrough` and `host-model` are accepted and mean what
    /// the guest always gets, the host CPU's features as KVM reports them (KVM's supported
    /// CPUID); a named model is refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub model: Option<String>,
    /// CPU features to require or disable: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object_list")]
    pub features: Option<Vec<serde_json::Value>>,
    /// Guest NUMA topology: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub numa: Option<serde_json::Value>,
}

/// Guest memory.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new(
        "!has(self.guest) || (isQuantity(string(self.guest)) && quantity(string(self.guest)).compareTo(quantity('16Mi')) >= 0 && quantity(string(self.guest)).compareTo(quantity('1Ei')) <= 0)"
    )
    .message("domain.memory.guest must be a quantity from 16Mi to 1Ei, e.g. 128Mi"),
    validation = Rule::new("!has(self.hugepages)").message(refusals::HUGEPAGES).field_path(".hugepages")
)]
#[serde(rename_all = "camelCase")]
pub struct Memory {
    /// Memory the guest sees, e.g. `128Mi` (at least 16Mi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::bounded_quantity)]
    pub guest: Option<Quantity>,
    /// Huge pages: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub hugepages: Option<serde_json::Value>,
}

/// Resource requests and limits (KubeVirt's `domain.resources`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new(
        "!has(self.requests) || !('memory' in self.requests) || (isQuantity(string(self.requests['memory'])) && quantity(string(self.requests['memory'])).compareTo(quantity('16Mi')) >= 0 && quantity(string(self.requests['memory'])).compareTo(quantity('1Ei')) <= 0)"
    )
    .message("domain.resources.requests.memory must be a quantity from 16Mi to 1Ei")
)]
#[serde(rename_all = "camelCase")]
pub struct ResourceRequirements {
    /// Requests, e.g. `memory: 128Mi`. A memory request is the guest memory when
    /// `domain.memory.guest` is unset; a CPU request (without a CPU limit) is the vCPU count,
    /// rounded up, when `domain.cpu` gives no cores, sockets or threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::bounded_quantity_map)]
    pub requests: Option<BTreeMap<String, Quantity>>,
    /// Limits. A CPU limit is the vCPU count, rounded up, when `domain.cpu` gives no cores,
    /// sockets or threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::bounded_quantity_map)]
    pub limits: Option<BTreeMap<String, Quantity>>,
}

/// Boot firmware.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Firmware {
    /// Direct kernel boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_boot: Option<KernelBoot>,
    /// BIOS or EFI. Accepted as microvirt's one boot path: no firmware runs; the guest boots
    /// the kernel of `kernelBoot` (or the operator's default kernel) directly. Secure Boot is
    /// refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootloader: Option<Bootloader>,
    /// The machine's UUID. A microVM has no SMBIOS; it is the guest's cloud-init
    /// `instance-id` (else the VMI's uid), as in KubeVirt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub uuid: Option<String>,
    /// The SMBIOS serial number: refused (a validation rule on the domain says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub serial: Option<String>,
}

/// BIOS or EFI (both: boot the kernel directly).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("!(has(self.bios) && has(self.efi))").message(refusals::BOOTLOADER_BOTH),
    validation = Rule::new("!has(self.efi) || (has(self.efi.secureBoot) && !self.efi.secureBoot)")
        .message(refusals::SECURE_BOOT)
        .field_path(".efi")
)]
pub struct Bootloader {
    /// BIOS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bios: Option<Bios>,
    /// EFI (only with `secureBoot: false`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub efi: Option<Efi>,
}

/// BIOS settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Bios {
    /// BIOS output on the serial console (no effect: the kernel's console is the serial one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_serial: Option<bool>,
}

/// EFI settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Efi {
    /// Secure Boot; KubeVirt's default is true, so microvirt needs an explicit `false`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secure_boot: Option<bool>,
    /// Persistent EFI variables (no effect: there are none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent: Option<bool>,
}

/// Direct kernel boot: a kernel (and optional initrd) taken from a container image.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KernelBoot {
    /// Kernel command line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    pub kernel_args: Option<String>,
    /// Where the kernel and initrd come from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<KernelBootContainer>,
}

/// A container image holding the guest kernel.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("has(self.kernelPath) || has(self.initrdPath)")
        .message("firmware.kernelBoot.container needs kernelPath (and optionally initrdPath)")
)]
#[serde(rename_all = "camelCase")]
pub struct KernelBootContainer {
    /// Image reference.
    #[schemars(length(min = 1, max = 512))]
    pub image: String,
    /// Path of the kernel inside the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    #[x_kube(validation = Rule::new(INSIDE_IMAGE_RULE)
        .message("kernelPath must stay inside the image: no '..' component"))]
    pub kernel_path: Option<String>,
    /// Path of the initrd inside the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    #[x_kube(validation = Rule::new(INSIDE_IMAGE_RULE)
        .message("initrdPath must stay inside the image: no '..' component"))]
    pub initrd_path: Option<String>,
    /// Image pull policy (Always, IfNotPresent, Never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// A Secret in the VMI's namespace to pull the image with (it joins the launcher pod's
    /// `imagePullSecrets`, as in KubeVirt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub image_pull_secret: Option<String>,
}

/// Image pull policy.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum PullPolicy {
    /// Always pull.
    Always,
    /// Pull when absent.
    IfNotPresent,
    /// Never pull.
    Never,
}

/// Devices of the guest.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("!has(self.gpus)").message(refusals::GPUS).field_path(".gpus"),
    validation = Rule::new("!has(self.hostDevices)").message(refusals::HOST_DEVICES).field_path(".hostDevices"),
    validation = Rule::new("!has(self.tpm)").message(refusals::TPM).field_path(".tpm"),
    validation = Rule::new("!has(self.filesystems)").message(refusals::FILESYSTEMS).field_path(".filesystems"),
    validation = Rule::new("!has(self.autoattachVSOCK) || !self.autoattachVSOCK")
        .message(refusals::VSOCK)
        .field_path(".autoattachVSOCK"),
    validation = Rule::new("!has(self.watchdog)").message(refusals::WATCHDOG).field_path(".watchdog"),
    validation = Rule::new("!has(self.sound)").message(refusals::SOUND).field_path(".sound")
)]
#[serde(rename_all = "camelCase")]
pub struct Devices {
    /// Block devices; each names a volume.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub disks: Vec<Disk>,
    /// Network interfaces; each names a network.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub interfaces: Vec<Interface>,
    /// A virtio-rng device: entropy for the guest from the host (KubeVirt's `rng: {}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rng: Option<Rng>,
    /// When the VMI declares neither `interfaces` nor `networks`, attach the pod network with
    /// the operator's default binding (masquerade unless `--default-network-interface`), as an
    /// interface and a network named `default` (KubeVirt's default: true). `false`: no NIC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoattach_pod_interface: Option<bool>,
    /// Accepted, no effect: a microVM never has a graphics device (KubeVirt's default: true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoattach_graphics_device: Option<bool>,
    /// Accepted, no effect: the serial console always exists (it is the launcher's log).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoattach_serial_console: Option<bool>,
    /// Accepted, no effect: a microVM has no memory balloon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoattach_mem_balloon: Option<bool>,
    /// Only `false` (the default): a microVM has no vsock device (a validation rule says why).
    #[serde(
        rename = "autoattachVSOCK",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub autoattach_vsock: Option<bool>,
    /// GPU passthrough: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object_list")]
    pub gpus: Option<Vec<serde_json::Value>>,
    /// Host device passthrough: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object_list")]
    pub host_devices: Option<Vec<serde_json::Value>>,
    /// A TPM: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub tpm: Option<serde_json::Value>,
    /// virtiofs shares: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object_list")]
    pub filesystems: Option<Vec<serde_json::Value>>,
    /// Input devices (KubeVirt's tablet for a VNC pointer): accepted, no effect: without a
    /// graphics device there is nothing to point at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 8))]
    pub inputs: Option<Vec<Input>>,
    /// Accepted, no effect: every virtio-net device has one queue pair.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_interface_multiqueue: Option<bool>,
    /// Accepted, no effect: every virtio-blk device has one queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_multi_queue: Option<bool>,
    /// A watchdog device: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub watchdog: Option<serde_json::Value>,
    /// A sound device: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub sound: Option<serde_json::Value>,
}

/// An input device (accepted, no effect).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct Input {
    /// Name.
    #[schemars(length(max = 63))]
    pub name: String,
    /// `tablet`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub type_: Option<String>,
    /// `usb` or `virtio`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub bus: Option<String>,
}

/// The random number generator device (no settings).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct Rng {}

/// CEL: the string is a DNS label (RFC 1123, as Kubernetes names; length checked separately).
pub const DNS_LABEL_RULE: &str = "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')";
/// CEL: the string is a relative path inside an image (no `..` component).
pub const INSIDE_IMAGE_RULE: &str = "!self.matches('(^|/)[.][.](/|$)')";

/// A disk of the guest.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("!has(self.cdrom)").message(refusals::CDROM).field_path(".cdrom"),
    validation = Rule::new("!has(self.lun)").message(refusals::LUN).field_path(".lun"),
    validation = Rule::new("!has(self.cache) || self.cache != 'writethrough'")
        .message(refusals::DISK_CACHE_WRITETHROUGH)
        .field_path(".cache"),
    validation = Rule::new("!has(self.shareable) || !self.shareable")
        .message(refusals::SHAREABLE)
        .field_path(".shareable")
)]
#[serde(rename_all = "camelCase")]
pub struct Disk {
    /// Name; must match a volume's name. A DNS label: it becomes a file name in the launcher
    /// pod.
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new(DNS_LABEL_RULE).message(
        "a disk name must be a DNS label (lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters): it becomes a file name in the launcher pod"
    ))]
    pub name: String,
    /// Attach as a disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<DiskTarget>,
    /// Serial number the guest sees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 20))]
    pub serial: Option<String>,
    /// Boot priority (1 is first). There is no firmware to boot from a disk: the disk with the
    /// lowest `bootOrder` becomes the first disk, which is the root disk of the default kernel
    /// (`root=/dev/vda`); disks without one follow in their order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub boot_order: Option<u32>,
    /// A CD-ROM: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub cdrom: Option<serde_json::Value>,
    /// A SCSI LUN: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub lun: Option<serde_json::Value>,
    /// KubeVirt's cache mode. `none` and `writeback` are accepted and mean what the VMM
    /// always does: writes go through the host's page cache and a guest flush is an
    /// `fdatasync`, so what the guest flushed is durable; `writethrough` is refused (a
    /// validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<DiskCache>,
    /// KubeVirt's I/O mode (`native`, `threads`, `default`): accepted, no effect (the VMM's own
    /// I/O thread does the disk's I/O).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io: Option<DiskIo>,
    /// Only `false`: a writable image is locked to one VMI (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shareable: Option<bool>,
}

/// KubeVirt's disk cache modes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DiskCache {
    /// Accepted: the VMM's behaviour (flushes are honoured).
    None,
    /// Refused.
    Writethrough,
    /// Accepted: the VMM's behaviour (flushes are honoured).
    Writeback,
}

/// KubeVirt's disk I/O modes (accepted, no effect).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DiskIo {
    /// Linux native AIO.
    Native,
    /// A thread pool.
    Threads,
    /// The hypervisor's choice.
    Default,
}

/// How a disk is attached.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiskTarget {
    /// Bus; microvirt only has virtio.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bus: Option<DiskBus>,
    /// Attach read-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readonly: Option<bool>,
}

/// Disk bus.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DiskBus {
    /// virtio-blk (the only bus a microVM has).
    Virtio,
}

/// A network interface of the guest.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("!(has(self.masquerade) && has(self.bridge))")
        .message("an interface uses either masquerade or bridge, not both"),
    validation = Rule::new("!has(self.sriov)").message(refusals::SRIOV).field_path(".sriov"),
    validation = Rule::new("!has(self.passt)").message(refusals::PASST).field_path(".passt"),
    validation = Rule::new("!has(self.binding)").message(refusals::BINDING).field_path(".binding"),
    validation = Rule::new("!has(self.model) || self.model == 'virtio'")
        .message(refusals::INTERFACE_MODEL)
        .field_path(".model")
)]
#[serde(rename_all = "camelCase")]
pub struct Interface {
    /// Name; must match a network's name.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// NAT the guest behind the pod IP (the default when neither binding is given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub masquerade: Option<InterfaceMasquerade>,
    /// Bridge the guest onto the pod interface; the guest takes the pod IP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge: Option<InterfaceBridge>,
    /// Ports forwarded to the guest (masquerade only; all ports when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub ports: Vec<Port>,
    /// MAC address, e.g. `02:00:00:00:00:01`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9a-fA-F]{2}[:-]){5}[0-9a-fA-F]{2}$"))]
    pub mac_address: Option<String>,
    /// NIC model: only `virtio` (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub model: Option<String>,
    /// SR-IOV binding: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub sriov: Option<serde_json::Value>,
    /// passt binding: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub passt: Option<serde_json::Value>,
    /// A network binding plugin: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub binding: Option<serde_json::Value>,
}

/// Masquerade binding (no fields).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct InterfaceMasquerade {}

/// Bridge binding (no fields).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct InterfaceBridge {}

/// A forwarded port.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Port {
    /// Optional name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub name: Option<String>,
    /// TCP (default) or UDP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
    /// Port number.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
}

/// Transport protocol.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Protocol {
    /// TCP.
    #[serde(rename = "TCP")]
    Tcp,
    /// UDP.
    #[serde(rename = "UDP")]
    Udp,
}

/// A volume: exactly one source.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new(
        "(has(self.containerDisk) ? 1 : 0) + (has(self.persistentVolumeClaim) ? 1 : 0) + (has(self.cloudInitNoCloud) ? 1 : 0) + (has(self.emptyDisk) ? 1 : 0) + (has(self.dataVolume) ? 1 : 0) + (has(self.hostDisk) ? 1 : 0) + (has(self.configMap) ? 1 : 0) + (has(self.secret) ? 1 : 0) + (has(self.serviceAccount) ? 1 : 0) + (has(self.downwardAPI) ? 1 : 0) + (has(self.cloudInitConfigDrive) ? 1 : 0) + (has(self.ephemeral) ? 1 : 0) + (has(self.downwardMetrics) ? 1 : 0) + (has(self.sysprep) ? 1 : 0) + (has(self.memoryDump) ? 1 : 0) == 1"
    )
    .message("a volume needs exactly one of containerDisk, persistentVolumeClaim, cloudInitNoCloud, emptyDisk"),
    validation = Rule::new("!has(self.dataVolume)").message(refusals::DATA_VOLUME).field_path(".dataVolume"),
    validation = Rule::new("!has(self.hostDisk)").message(refusals::HOST_DISK).field_path(".hostDisk"),
    validation = Rule::new("!has(self.configMap)").message(refusals::VOLUME_SOURCE).field_path(".configMap"),
    validation = Rule::new("!has(self.secret)").message(refusals::VOLUME_SOURCE).field_path(".secret"),
    validation = Rule::new("!has(self.serviceAccount)").message(refusals::VOLUME_SOURCE).field_path(".serviceAccount"),
    validation = Rule::new("!has(self.downwardAPI)").message(refusals::VOLUME_SOURCE).field_path(".downwardAPI"),
    validation = Rule::new("!has(self.cloudInitConfigDrive)").message(refusals::VOLUME_SOURCE).field_path(".cloudInitConfigDrive"),
    validation = Rule::new("!has(self.ephemeral)").message(refusals::VOLUME_SOURCE).field_path(".ephemeral"),
    validation = Rule::new("!has(self.downwardMetrics)").message(refusals::VOLUME_SOURCE).field_path(".downwardMetrics"),
    validation = Rule::new("!has(self.sysprep)").message(refusals::VOLUME_SOURCE).field_path(".sysprep"),
    validation = Rule::new("!has(self.memoryDump)").message(refusals::VOLUME_SOURCE).field_path(".memoryDump")
)]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    /// Name that a disk refers to. A DNS label: it becomes a directory name in the launcher
    /// pod.
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new(DNS_LABEL_RULE).message(
        "a volume name must be a DNS label (lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters): it becomes a directory name in the launcher pod"
    ))]
    pub name: String,
    /// A disk image inside a container image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_disk: Option<ContainerDiskSource>,
    /// A PersistentVolumeClaim in the VMI's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim: Option<PersistentVolumeClaimSource>,
    /// A NoCloud cloud-init seed disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_init_no_cloud: Option<CloudInitNoCloudSource>,
    /// A blank disk discarded when the VMI ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub empty_disk: Option<EmptyDiskSource>,
    /// A CDI DataVolume: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub data_volume: Option<serde_json::Value>,
    /// A disk image on the node: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub host_disk: Option<serde_json::Value>,
    /// KubeVirt's ConfigMap volume: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub config_map: Option<serde_json::Value>,
    /// KubeVirt's Secret volume: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub secret: Option<serde_json::Value>,
    /// KubeVirt's ServiceAccount token volume: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub service_account: Option<serde_json::Value>,
    /// KubeVirt's downward API volume: refused (a validation rule says why).
    #[serde(
        rename = "downwardAPI",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub downward_api: Option<serde_json::Value>,
    /// KubeVirt's cloud-init ConfigDrive volume: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub cloud_init_config_drive: Option<serde_json::Value>,
    /// KubeVirt's ephemeral PVC volume: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub ephemeral: Option<serde_json::Value>,
    /// KubeVirt's downward metrics volume: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub downward_metrics: Option<serde_json::Value>,
    /// KubeVirt's Windows sysprep volume: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub sysprep: Option<serde_json::Value>,
    /// KubeVirt's memory dump volume: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub memory_dump: Option<serde_json::Value>,
}

/// Disk image inside a container image.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ContainerDiskSource {
    /// Image reference.
    #[schemars(length(min = 1, max = 512))]
    pub image: String,
    /// Path of the disk image inside the container image (default: the first file in `/disk`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    #[x_kube(validation = Rule::new(INSIDE_IMAGE_RULE)
        .message("containerDisk.path must stay inside the image: no '..' component"))]
    pub path: Option<String>,
    /// Image pull policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// A Secret in the VMI's namespace to pull the image with (it joins the launcher pod's
    /// `imagePullSecrets`, as in KubeVirt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub image_pull_secret: Option<String>,
}

/// PVC reference.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PersistentVolumeClaimSource {
    /// Claim name.
    #[schemars(length(min = 1, max = 253))]
    pub claim_name: String,
    /// Attach read-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    /// Only `false`: a microVM has no disk hotplug (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("!self").message(refusals::HOTPLUG))]
    pub hotpluggable: Option<bool>,
}

/// cloud-init NoCloud data (KubeVirt's `cloudInitNoCloud`): user data inline, in base64 or in a
/// Secret (`secretRef`, key `userdata` or `userData`); network data inline, in base64 or in a
/// Secret (`networkDataSecretRef`, key `networkdata` or `networkData`). The launcher pod never gets the
/// data through its annotations: the operator puts inline data into a Secret of its own that
/// the pod mounts, like the referenced ones.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("has(self.userData) || has(self.userDataBase64) || has(self.secretRef) || has(self.networkData) || has(self.networkDataBase64) || has(self.networkDataSecretRef)")
        .message("cloudInitNoCloud needs userData, userDataBase64, secretRef, networkData, networkDataBase64 or networkDataSecretRef"),
    validation = Rule::new("(has(self.userData) ? 1 : 0) + (has(self.userDataBase64) ? 1 : 0) + (has(self.secretRef) ? 1 : 0) <= 1")
        .message("cloudInitNoCloud takes one of userData, userDataBase64 and secretRef"),
    validation = Rule::new("(has(self.networkData) ? 1 : 0) + (has(self.networkDataBase64) ? 1 : 0) + (has(self.networkDataSecretRef) ? 1 : 0) <= 1")
        .message("cloudInitNoCloud takes one of networkData, networkDataBase64 and networkDataSecretRef")
)]
#[serde(rename_all = "camelCase")]
pub struct CloudInitNoCloudSource {
    /// user-data as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16384))]
    pub user_data: Option<String>,
    /// user-data, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32768))]
    pub user_data_base64: Option<String>,
    /// A Secret in the VMI's namespace holding the user-data (key `userdata` or `userData`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretRef>,
    /// network-config as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16384))]
    pub network_data: Option<String>,
    /// network-config, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32768))]
    pub network_data_base64: Option<String>,
    /// A Secret in the VMI's namespace holding the network-config (key `networkdata` or
    /// `networkData`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_data_secret_ref: Option<SecretRef>,
}

/// A Secret in the same namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')")
        .message("a Secret name must be a DNS subdomain (lowercase letters, digits, '-' and '.')"))]
    pub name: String,
}

/// Blank disk.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new(
        "isQuantity(string(self.capacity)) && quantity(string(self.capacity)).isGreaterThan(quantity('0')) && quantity(string(self.capacity)).compareTo(quantity('1Ei')) <= 0"
    )
    .message("emptyDisk.capacity must be a quantity greater than 0 and at most 1Ei, e.g. 1Gi")
)]
#[serde(rename_all = "camelCase")]
pub struct EmptyDiskSource {
    /// Size, e.g. `1Gi`.
    #[schemars(transform = crate::schema::bounded_quantity)]
    pub capacity: Quantity,
}

/// A network the guest attaches to.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("!has(self.multus)").message(refusals::MULTUS).field_path(".multus")
)]
#[serde(rename_all = "camelCase")]
pub struct Network {
    /// Name that an interface refers to.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// The pod network (the only kind microvirt has).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodNetwork>,
    /// A Multus network: refused (a validation rule says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub multus: Option<serde_json::Value>,
}

/// The pod network.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("!has(self.vmNetworkCIDR)")
        .message(refusals::VM_NETWORK_CIDR)
        .field_path(".vmNetworkCIDR")
)]
pub struct PodNetwork {
    /// KubeVirt's CIDR of the guest side of masquerade: refused, not implemented yet (the
    /// guest side is 10.0.2.0/24).
    #[serde(
        rename = "vmNetworkCIDR",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(max = 64))]
    pub vm_network_cidr: Option<String>,
}

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

impl VirtualMachineInstanceSpec {
    /// Number of vCPUs: cores × sockets × threads (each defaulting to 1); without any of the
    /// three, KubeVirt's rule: the CPU limit, else the CPU request, rounded up to whole CPUs
    /// (`1500m` → 2), else 1. A quantity that does not parse counts as no quantity (the CRD's
    /// rules admit only quantities).
    pub fn vcpus(&self) -> u32 {
        let cpu = self.domain.cpu.clone().unwrap_or_default();
        if cpu.cores.is_none() && cpu.sockets.is_none() && cpu.threads.is_none() {
            if let Some(n) = self.vcpus_from_resources() {
                return n;
            }
        }
        cpu.cores
            .unwrap_or(1)
            .saturating_mul(cpu.sockets.unwrap_or(1))
            .saturating_mul(cpu.threads.unwrap_or(1))
    }

    /// `resources.limits.cpu`, else `resources.requests.cpu`, in whole CPUs rounded up.
    fn vcpus_from_resources(&self) -> Option<u32> {
        let res = self.domain.resources.as_ref()?;
        let q = res
            .limits
            .as_ref()
            .and_then(|l| l.get("cpu"))
            .or_else(|| res.requests.as_ref().and_then(|r| r.get("cpu")))?;
        let n = crate::quantity::parse_bytes(&q.0).ok()?;
        Some(u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// Guest memory: `domain.memory.guest`, else `domain.resources.requests.memory`, else `None`.
    pub fn guest_memory(&self) -> Option<&Quantity> {
        if let Some(q) = self.domain.memory.as_ref().and_then(|m| m.guest.as_ref()) {
            return Some(q);
        }
        self.domain
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("memory"))
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> VirtualMachineInstanceSpec {
        serde_json::from_value(serde_saphyr::from_str::<serde_json::Value>(yaml).unwrap()).unwrap()
    }

    #[test]
    fn kubevirt_tuning_fields_survive_a_round_trip() {
        // What the operator passes on (presets merged as JSON, the launcher's document) keeps
        // every accepted KubeVirt field with KubeVirt's spelling.
        let yaml = r#"
domain:
  cpu: {model: host-passthrough}
  features: {kvm: {hidden: false}, pvspinlock: {enabled: false}}
  devices:
    networkInterfaceMultiqueue: true
    blockMultiQueue: true
    inputs: [{name: tablet, type: tablet, bus: virtio}]
    disks: [{name: d, cache: none, io: native, shareable: false}]
volumes: [{name: d, persistentVolumeClaim: {claimName: c, hotpluggable: false}}]
dnsPolicy: None
dnsConfig: {nameservers: [192.0.2.53]}
"#;
        let v: serde_json::Value = serde_saphyr::from_str(yaml).unwrap();
        let s = spec(yaml);
        let d = s.domain.devices.as_ref().unwrap();
        assert_eq!(d.disks[0].cache, Some(DiskCache::None));
        assert_eq!(d.disks[0].io, Some(DiskIo::Native));
        assert_eq!(s.dns_policy.map(DnsPolicy::as_str), Some("None"));
        assert_eq!(serde_json::to_value(&s).unwrap(), v);
        let w: Disk =
            serde_json::from_value(serde_json::json!({"name": "d", "cache": "writethrough"}))
                .unwrap();
        assert_eq!(w.cache, Some(DiskCache::Writethrough));
    }

    #[test]
    fn kubevirt_probes_are_typed_and_survive_a_round_trip() {
        let yaml = r#"
domain: {}
readinessProbe:
  httpGet: {port: 1500, path: /healthz, scheme: HTTPS, httpHeaders: [{name: X-A, value: b}]}
  initialDelaySeconds: 120
  periodSeconds: 20
  timeoutSeconds: 10
  failureThreshold: 3
  successThreshold: 3
livenessProbe:
  tcpSocket: {port: 22}
  failureThreshold: 6
"#;
        let v: serde_json::Value = serde_saphyr::from_str(yaml).unwrap();
        let s = spec(yaml);
        let r = s.readiness_probe.as_ref().unwrap();
        let h = r.http_get.as_ref().unwrap();
        assert_eq!((h.port, h.path.as_deref()), (1500, Some("/healthz")));
        assert_eq!(h.scheme, Some(ProbeScheme::Https));
        assert_eq!(h.http_headers[0].name, "X-A");
        assert_eq!(
            (r.initial_delay_seconds, r.period_seconds, r.timeout_seconds),
            (Some(120), Some(20), Some(10))
        );
        assert_eq!(
            (r.failure_threshold, r.success_threshold),
            (Some(3), Some(3))
        );
        let l = s.liveness_probe.as_ref().unwrap();
        assert_eq!(l.tcp_socket.as_ref().map(|t| t.port), Some(22));
        assert!(l.http_get.is_none() && l.exec.is_none() && l.guest_agent_ping.is_none());
        assert_eq!(serde_json::to_value(&s).unwrap(), v);
        // The handlers that need a guest agent are kept (for the CRD's rules to refuse).
        let s = spec("{domain: {}, livenessProbe: {guestAgentPing: {}}, readinessProbe: {exec: {command: [x]}}}");
        assert!(s.liveness_probe.unwrap().guest_agent_ping.is_some());
        assert!(s.readiness_probe.unwrap().exec.is_some());
    }

    #[test]
    fn the_probe_rules_are_in_the_schema() {
        use kube::CustomResourceExt;
        let crd = serde_json::to_string(&VirtualMachineInstance::crd()).unwrap();
        for message in [
            refusals::PROBE_EXEC,
            refusals::PROBE_GUEST_AGENT_PING,
            refusals::PROBE_NO_HANDLER,
            refusals::PROBE_TWO_HANDLERS,
            refusals::PROBE_WITHOUT_NIC,
            refusals::PROBE_PORT_NOT_FORWARDED,
            refusals::LIVENESS_SUCCESS_THRESHOLD,
        ] {
            assert!(
                crd.contains(&serde_json::to_string(message).unwrap()),
                "{message}"
            );
        }
        assert!(!crd.contains("not supported by microvirt yet: the VMI is Ready"));
    }

    #[test]
    fn vcpus_from_topology_else_cpu_limit_else_request() {
        let v = |y: &str| spec(y).vcpus();
        assert_eq!(v("domain: {}"), 1);
        assert_eq!(v("domain: {cpu: {cores: 2, sockets: 2, threads: 2}}"), 8);
        assert_eq!(v("domain: {cpu: {sockets: 3}}"), 3);
        // KubeVirt: no topology → the limit, else the request, rounded up.
        assert_eq!(v("domain: {resources: {requests: {cpu: '2'}}}"), 2);
        assert_eq!(v("domain: {resources: {requests: {cpu: 1500m}}}"), 2);
        assert_eq!(v("domain: {resources: {requests: {cpu: 100m}}}"), 1);
        assert_eq!(
            v("domain: {resources: {requests: {cpu: '1'}, limits: {cpu: '3'}}}"),
            3
        );
        // A topology wins over resources; dedicatedCpuPlacement alone is no topology.
        assert_eq!(
            v("domain: {cpu: {cores: 1}, resources: {requests: {cpu: '4'}}}"),
            1
        );
        assert_eq!(
            v("domain: {cpu: {dedicatedCpuPlacement: true}, resources: {limits: {cpu: '2'}}}"),
            2
        );
        // Memory only: 1.
        assert_eq!(v("domain: {resources: {requests: {memory: 1Gi}}}"), 1);
    }
}
