//! The VMI's spec: the `VirtualMachineInstance` custom resource itself, its top-level fields
//! and the CEL rules across them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, PodDNSConfig, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{DomainSpec, Network, Probe, VirtualMachineInstanceStatus, Volume, DNS_LABEL_RULE};
use crate::refusals;

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
