//! A real, private Kubernetes control plane (etcd + kube-apiserver), and a whole single-node
//! cluster, for microvirt's tests.
//!
//! Controllers are tested against the real thing, not a mock: [`Cluster::start`] builds (once,
//! cached) and starts an `etcd` and a `kube-apiserver` listening on 127.0.0.1 only, on ports
//! picked at run time, with freshly generated certificates, and writes a kubeconfig for them.
//! Dropping the [`Cluster`] stops both processes and removes their data directory.
//!
//! ```no_run
//! use microvirt_testsupport::Cluster;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cluster = Cluster::start(Default::default())?;
//! // Point a client at it: kube-rs `Config::from_custom_kubeconfig`, or `kubectl --kubeconfig`.
//! let kubeconfig = cluster.kubeconfig_path();
//! let status = std::process::Command::new("kubectl")
//!     .arg("--kubeconfig")
//!     .arg(kubeconfig)
//!     .args(["get", "ns"])
//!     .status()?;
//! assert!(status.success());
//! // Or talk HTTP directly, authenticated as the cluster admin.
//! let resp = cluster.request("GET", "/api/v1/namespaces/default", None)?;
//! assert_eq!(resp.status, 200);
//! # Ok(())
//! # }
//! ```
//!
//! What runs, and what does not:
//! - Kubernetes [`KUBERNETES_VERSION`] (kube-apiserver) on etcd [`ETCD_VERSION`], built from the
//!   Go module proxy with the machine's Go toolchain by [`ensure_binaries`] and cached under
//!   `~/.cache/microvirt/k8s/<hash>/` (the first build takes several minutes).
//! - No kube-controller-manager, no scheduler, no kubelet. So there is no garbage collection of
//!   owned objects, namespaces stay `Terminating` after deletion, pods stay `Pending` and no
//!   service-account tokens are minted. Tests must not wait for any of that.
//! - The `ServiceAccount` admission plugin is turned off: with it, every pod create is refused
//!   until the (absent) service-account controller has made the namespace's `default` account.
//! - Authentication: a static bearer token for user `microvirt-admin` in group `system:masters`
//!   (in the kubeconfig); authorization is RBAC, so other identities can be tested too.
//! - etcd runs with `--unsafe-no-fsync`: state is not crash-safe, which a test cluster does not
//!   need.
//!
//! The processes' output goes to `logs/etcd.log` and `logs/kube-apiserver.log` in
//! [`Cluster::data_dir`]; start and readiness errors carry the tail of the relevant log. Set
//! `MICROVIRT_KEEP_CLUSTER_DIR=1` to keep the data directory after the cluster is dropped.
//!
//! If a test process dies without dropping its cluster (a `static` cluster, `SIGKILL`), a small
//! watchdog process stops etcd and kube-apiserver within about a second of the test process
//! exiting and removes the data directory.
//!
//! # A whole single-node cluster
//!
//! [`RealCluster::start`] adds kube-scheduler, kube-controller-manager and a [`Node`]
//! (containerd + runc + CNI bridge + kubelet, in a network namespace of its own behind a veth;
//! binaries from [`ensure_node_binaries`], cached under `~/.cache/microvirt/{k8s-node,containerd}/`)
//! and returns once the node is Ready and schedulable. One node per machine: every owner holds
//! the machine's node lock (`/var/lib/microvirt-node.lock`), a second one waits for it. Images
//! come from OCI archives ([`oci::Image`], [`Node::import_image`]); nothing is pulled.
//!
//! ```no_run
//! use microvirt_testsupport::{RealCluster, RealClusterOptions};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let rc = RealCluster::start(RealClusterOptions::default())?;
//! let st = rc.kubectl().args(["get", "nodes"]).status()?; // --kubeconfig is set
//! assert!(st.success());
//! rc.node().netns().command("ip").args(["addr"]).status()?; // a command "on the node"
//! rc.restart_kubelet()?; // waits until the node is Ready again
//! drop(rc); // tears the node down (nothing left behind), then the control plane
//! # Ok(())
//! # }
//! ```
//!
//! Dropping it removes the node's processes, containers, mounts, cgroups, veth and route, and
//! restores the kernel settings the kubelet changed ([`node::teardown`]). If the owner dies
//! first, watchdogs do the same for the control plane and the node
//! ([`node::teardown::spawn_watchdog`]). See `docs/cluster.md` for the layout.
//!
//! # Small helpers for any test
//!
//! The kit depends on no crate of this workspace and on neither kube nor tokio, so every crate
//! (`vmm`, the lowest, included) takes it as a dev-dependency. Instead of copies of their own,
//! tests use:
//! - [`TempDir`]: a fresh scratch directory, removed on drop;
//! - [`ScratchNetns`]: a named network namespace, deleted on drop, and commands and threads
//!   inside it;
//! - [`Spawned`]: a child process with its output collected, bounded waits for a line or for
//!   its exit whose failures say what was awaited, killed on drop.

mod binaries;
mod certs;
mod cluster;
mod crds;
pub mod detached;
mod http;
pub mod node;
pub mod oci;
mod process;
mod real;
mod scratch_netns;
mod spawned;
mod tempdir;

pub use binaries::{
    cache_root, ensure_binaries, ensure_node_binaries, Binaries, BinariesError, NodeBinaries,
    CONTAINERD_VERSION, ETCD_VERSION, KUBERNETES_VERSION,
};
pub use certs::CertError;
pub use cluster::{Cluster, ClusterError, ClusterOptions, FrozenApiserver};
pub use crds::{wait_crds_established, CRDS_ESTABLISHED_WITHIN};
pub use http::{Connected, HttpError, Response};
pub use node::{Node, NodeError, NodeOptions};
pub use process::{continue_process, signal_taken, stop_process, SIGNAL_ACTED_ON_WITHIN};
pub use real::{RealCluster, RealClusterError, RealClusterOptions};
pub use scratch_netns::ScratchNetns;
pub use spawned::Spawned;
pub use tempdir::TempDir;
