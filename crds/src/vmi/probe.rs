//! KubeVirt's readiness and liveness probes.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::refusals;

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
