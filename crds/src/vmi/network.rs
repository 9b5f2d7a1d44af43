//! Network interfaces (`spec.domain.devices.interfaces`) and the networks they attach to
//! (`spec.networks`).

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::refusals;

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
