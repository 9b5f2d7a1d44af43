//! `virt-handler`: microvirt's per-node agent, run as a DaemonSet (KubeVirt's name and role).
//!
//! One process, two jobs:
//! - [`deviceplugin`]: a kubelet device plugin (API v1beta1 over gRPC on unix sockets) that
//!   advertises `devices.microvirt.io/kvm` and injects `/dev/kvm` and `/dev/net/tun` into the
//!   launcher containers that request it;
//! - [`agent`]: the node agent. It has API credentials (launcher pods never do), finds the
//!   launcher pods on its node, talks to each launcher's control socket through the kubelet's
//!   pod volume directory, reports the VMI `Paused` condition and carries out pause/unpause
//!   requests that the operator puts on launcher pods (the warm-pool claim path), and takes the
//!   snapshots of VM pools ([`hostfacts`]: what a snapshot depends on, published on the Node;
//!   [`snapshots`]: removal of snapshots nothing uses any more).
//!
//! [`shutdown`] gives both a bounded, signal-driven shutdown.

pub mod agent;
pub mod deviceplugin;
pub mod hostfacts;
pub mod launcher;
pub mod shutdown;
pub mod snapshots;

/// The kubelet device-plugin API (`v1beta1`), generated from `proto/deviceplugin.proto`:
/// messages, the `Registration` and `DevicePlugin` servers and clients.
pub mod api {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("v1beta1");
}

/// Dials a gRPC server on a unix socket (the kubelet's `kubelet.sock`, a plugin's socket).
pub async fn unix_channel(
    path: &std::path::Path,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    // The URI is required by the API but unused: the connector always dials `path`.
    tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                let s = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
            }
        }))
        .await
}
