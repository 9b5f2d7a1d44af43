//! [`RealCluster`]: a whole single-node Kubernetes cluster from real parts — etcd,
//! kube-apiserver, kube-scheduler, kube-controller-manager, and a [`Node`] (containerd, runc,
//! CNI bridge, kubelet) — all built from source and cached like [`crate::Cluster`].

use std::fs::{self, OpenOptions};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use base64::Engine as _;

use crate::binaries::ensure_node_binaries;
use crate::cluster::{Cluster, ClusterError, ClusterOptions};
use crate::node::{kubeconfig_text, Node, NodeError, NodeOptions};
use crate::process::{log_tail, stop_child};

/// Errors starting a [`RealCluster`].
#[derive(Debug, thiserror::Error)]
pub enum RealClusterError {
    /// The control plane failed.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// The node failed.
    #[error(transparent)]
    Node(#[from] NodeError),
    /// A process could not be started.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A control-plane component exited.
    #[error("{what} exited ({status}); the end of {log}:\n{tail}")]
    Exited {
        /// Which component.
        what: &'static str,
        /// How it ended.
        status: String,
        /// Its log.
        log: PathBuf,
        /// The log's last lines.
        tail: String,
    },
    /// The node did not become Ready.
    #[error("node {node} not Ready after {waited:?} ({last}); the end of {log}:\n{tail}")]
    NodeNotReady {
        /// The node name.
        node: String,
        /// How long we waited.
        waited: Duration,
        /// What we saw last.
        last: String,
        /// The kubelet's log.
        log: PathBuf,
        /// Its last lines.
        tail: String,
    },
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> RealClusterError {
    let context = context.into();
    move |source| RealClusterError::Io { context, source }
}

/// How to start a [`RealCluster`].
#[derive(Debug, Clone)]
pub struct RealClusterOptions {
    /// Control-plane data directory (`None`: a fresh temp dir, removed on drop).
    pub data_dir: Option<PathBuf>,
    /// Leave everything running when dropped (`cargo xtask cluster up`).
    pub persistent: bool,
    /// The node.
    pub node: NodeOptions,
    /// How long the node may take to become Ready after the kubelet started.
    pub node_ready_timeout: Duration,
}

impl Default for RealClusterOptions {
    fn default() -> Self {
        Self {
            data_dir: None,
            persistent: false,
            node: NodeOptions::default(),
            node_ready_timeout: Duration::from_secs(180),
        }
    }
}

/// A running single-node cluster. Dropping it tears down the node (no processes, mounts,
/// cgroups, interfaces or kernel-setting changes stay behind), then the control plane, unless
/// it is persistent.
pub struct RealCluster {
    // Field order is drop order: the node goes first, while the apiserver still runs.
    node: Node,
    components: Mutex<Vec<(&'static str, Child)>>,
    watchdog: Option<Child>,
    control: Cluster,
    persistent: bool,
}

/// The Kubernetes components besides the apiserver that run in the host's network namespace.
const COMPONENTS: [&str; 2] = ["kube-controller-manager", "kube-scheduler"];

impl RealCluster {
    /// Takes the machine's node lock (waiting for another owner), builds what is missing, and
    /// starts etcd, kube-apiserver (on the node network's host address, ImageVolume on),
    /// kube-controller-manager, kube-scheduler, containerd and the kubelet; returns once the
    /// node is Ready and schedulable.
    pub fn start(opts: RealClusterOptions) -> Result<RealCluster, RealClusterError> {
        let started = Instant::now();
        // Build everything before taking the lock (a cold build takes minutes).
        ensure_node_binaries().map_err(NodeError::from)?;
        let node = Node::prepare(NodeOptions {
            persistent: opts.persistent,
            ..opts.node.clone()
        })?;
        let net = node.options().network;
        let control = Cluster::start(ClusterOptions {
            data_dir: opts.data_dir.clone(),
            persistent: opts.persistent,
            bind_address: net.host_ip,
            extra_serving_ips: vec![net.service_ip],
            service_account_admission: true,
            extra_apiserver_args: vec![
                "--feature-gates=ImageVolume=true".to_string(),
                // The kubelet listens on the node's private address only.
                "--kubelet-preferred-address-types=InternalIP".to_string(),
            ],
            ..Default::default()
        })?;
        let mut rc = RealCluster {
            node,
            components: Mutex::new(Vec::new()),
            watchdog: None,
            control,
            persistent: opts.persistent,
        };
        if !opts.persistent {
            rc.start_node_watchdog()?;
        }
        rc.start_components()?;
        let kubeconfig = rc.node_kubeconfig()?;
        let port = rc.apiserver_port();
        rc.node.start(&kubeconfig, port)?;
        rc.wait_node_ready(opts.node_ready_timeout)?;
        eprintln!(
            "microvirt-testsupport: real cluster ready in {:.1} s: apiserver {}, node {} \
             ({}), logs in {} and {}",
            started.elapsed().as_secs_f64(),
            rc.server_url(),
            rc.node_name(),
            net.node_ip,
            rc.control.data_dir().join("logs").display(),
            rc.node.options().paths.logs().display()
        );
        Ok(rc)
    }

    fn apiserver_port(&self) -> u16 {
        self.server_url()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or(0)
    }

    /// The admin kubeconfig's credentials, as a kubeconfig for the node's components.
    fn node_kubeconfig(&self) -> Result<String, RealClusterError> {
        let pki = self.control.data_dir().join("pki");
        let ca = fs::read(pki.join("ca.crt")).map_err(io_err("reading ca.crt"))?;
        let token =
            fs::read_to_string(pki.join("admin.token")).map_err(io_err("reading admin.token"))?;
        Ok(kubeconfig_text(
            self.server_url(),
            &base64::engine::general_purpose::STANDARD.encode(ca),
            token.trim(),
        ))
    }

    /// Tears the node down if the test process dies without dropping the cluster (SIGKILL, a
    /// CI timeout): see [`crate::node::teardown::spawn_watchdog`]. The control plane has a
    /// watchdog of its own.
    fn start_node_watchdog(&mut self) -> Result<(), RealClusterError> {
        let child = crate::node::teardown::spawn_watchdog(
            &self.node.options().paths,
            &self.node.options().cgroup_root,
            std::process::id(),
        )
        .map_err(io_err("starting the node watchdog (sh)"))?;
        self.watchdog = Some(child);
        Ok(())
    }

    fn start_components(&mut self) -> Result<(), RealClusterError> {
        let bins = self.node.binaries().clone();
        let dir = self.control.data_dir().to_path_buf();
        let kc = self.control.kubeconfig_path().display().to_string();
        let pki = dir.join("pki");
        let cm_args = vec![
            format!("--kubeconfig={kc}"),
            "--secure-port=0".to_string(),
            // No cloud, no node IPAM (the CNI plugin hands out pod addresses), no load
            // balancers or routes.
            "--controllers=*,-node-ipam-controller,-cloud-node-lifecycle-controller,\
             -service-lb-controller,-node-route-controller"
                .to_string(),
            format!(
                "--service-account-private-key-file={}",
                pki.join("service-account.key").display()
            ),
            format!("--root-ca-file={}", pki.join("ca.crt").display()),
            "--use-service-account-credentials=false".to_string(),
            "--leader-elect=false".to_string(),
            "--kube-api-qps=100".to_string(),
            "--kube-api-burst=200".to_string(),
            "--v=1".to_string(),
        ];
        let sched_args = vec![
            format!("--kubeconfig={kc}"),
            "--secure-port=0".to_string(),
            "--leader-elect=false".to_string(),
            "--v=1".to_string(),
        ];
        for (what, bin, args) in [
            (COMPONENTS[0], &bins.kube_controller_manager, cm_args),
            (COMPONENTS[1], &bins.kube_scheduler, sched_args),
        ] {
            let log = dir.join("logs").join(format!("{what}.log"));
            let f = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .map_err(io_err(format!("opening {}", log.display())))?;
            let f2 = f.try_clone().map_err(io_err("cloning a log handle"))?;
            let child = Command::new(bin)
                .args(&args)
                .stdin(Stdio::null())
                .stdout(f)
                .stderr(f2)
                .process_group(0)
                .spawn()
                .map_err(io_err(format!("starting {}", bin.display())))?;
            fs::write(dir.join(format!("{what}.pid")), child.id().to_string())
                .map_err(io_err(format!("writing {what}.pid")))?;
            self.components
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((what, child));
        }
        Ok(())
    }

    fn check_components(&self) -> Result<(), RealClusterError> {
        let mut comps = self.components.lock().unwrap_or_else(|e| e.into_inner());
        for (what, c) in comps.iter_mut() {
            if let Ok(Some(st)) = c.try_wait() {
                let log = self
                    .control
                    .data_dir()
                    .join("logs")
                    .join(format!("{what}.log"));
                return Err(RealClusterError::Exited {
                    what,
                    status: st.to_string(),
                    tail: log_tail(&log, 30),
                    log,
                });
            }
        }
        Ok(())
    }

    /// Waits until the Node object is Ready without the not-ready taint (which the
    /// controller-manager's node-lifecycle controller removes).
    fn wait_node_ready(&self, timeout: Duration) -> Result<(), RealClusterError> {
        let started = Instant::now();
        let path = format!("/api/v1/nodes/{}", self.node_name());
        loop {
            self.check_components()?;
            let last = match self.control.request("GET", &path, None) {
                Ok(r) if r.status == 200 => match node_state(&r.body) {
                    Ok(()) => return Ok(()),
                    Err(s) => s,
                },
                Ok(r) => format!("HTTP {}", r.status),
                Err(e) => e.to_string(),
            };
            if started.elapsed() > timeout {
                let log = self.node.options().paths.logs().join("kubelet.log");
                return Err(RealClusterError::NodeNotReady {
                    node: self.node_name().to_string(),
                    waited: started.elapsed(),
                    last,
                    tail: log_tail(&log, 40),
                    log,
                });
            }
            thread::sleep(Duration::from_millis(250));
        }
    }

    /// The admin kubeconfig (bearer token, `system:masters`).
    pub fn kubeconfig_path(&self) -> &Path {
        self.control.kubeconfig_path()
    }

    /// `https://<node network host address>:<port>`.
    pub fn server_url(&self) -> &str {
        self.control.server_url()
    }

    /// The control plane (etcd + kube-apiserver).
    pub fn control_plane(&self) -> &Cluster {
        &self.control
    }

    /// The node.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// The Node object's name.
    pub fn node_name(&self) -> &str {
        &self.node.options().node_name
    }

    /// A `kubectl` command with this cluster's kubeconfig.
    pub fn kubectl(&self) -> Command {
        let mut c = Command::new("kubectl");
        c.arg(format!("--kubeconfig={}", self.kubeconfig_path().display()));
        c
    }

    /// Restarts the kubelet (see [`Node::restart_kubelet`]), then waits for the Node to be
    /// Ready again.
    pub fn restart_kubelet(&self) -> Result<(), RealClusterError> {
        self.node.restart_kubelet()?;
        self.wait_node_ready(Duration::from_secs(120))
    }
}

/// `Ok` when a Node JSON is Ready and carries no not-ready/unreachable taint; else what is
/// missing.
fn node_state(body: &str) -> Result<(), String> {
    let v: serde_json::Value =
        serde_json::from_str(body).map_err(|e| format!("bad Node JSON: {e}"))?;
    let ready = v["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready");
    match ready {
        Some(c) if c["status"] == "True" => {}
        Some(c) => {
            return Err(format!(
                "Ready={} ({})",
                c["status"].as_str().unwrap_or("?"),
                c["message"].as_str().unwrap_or("")
            ))
        }
        None => return Err("no Ready condition yet".into()),
    }
    let taints: Vec<String> = v["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["key"].as_str().map(str::to_string))
        .filter(|k| k.starts_with("node.kubernetes.io/"))
        .collect();
    if !taints.is_empty() {
        return Err(format!("tainted {taints:?}"));
    }
    Ok(())
}

impl Drop for RealCluster {
    fn drop(&mut self) {
        if self.persistent {
            return;
        }
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
        // The node (a field dropped after this body) tears itself down; stop the clients of
        // the apiserver before the control plane goes.
        let comps = std::mem::take(&mut *self.components.lock().unwrap_or_else(|e| e.into_inner()));
        for (_, mut c) in comps {
            stop_child(&mut c, Duration::from_secs(10));
        }
    }
}

// Tests share one cluster across threads.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<RealCluster>();
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_readiness_needs_ready_and_no_taint() {
        let ready = r#"{"status":{"conditions":[{"type":"Ready","status":"True"}]}}"#;
        assert!(node_state(ready).is_ok());
        let tainted = r#"{"spec":{"taints":[{"key":"node.kubernetes.io/not-ready","effect":"NoSchedule"}]},
            "status":{"conditions":[{"type":"Ready","status":"True"}]}}"#;
        assert!(node_state(tainted).unwrap_err().contains("not-ready"));
        let not =
            r#"{"status":{"conditions":[{"type":"Ready","status":"False","message":"cni"}]}}"#;
        assert!(node_state(not).unwrap_err().contains("cni"));
        assert!(node_state("{}").is_err());
    }
}
