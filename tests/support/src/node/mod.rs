//! A real Kubernetes node on this machine: containerd + runc + CNI bridge, and a kubelet, in a
//! network namespace of their own (see [`netns`]).
//!
//! There can be only one per machine (the kubelet's device-plugin socket and a few other paths
//! are fixed), so every owner holds a machine-wide lock file for the node's lifetime and the
//! node's directories are fixed ([`NodePaths`]). A node that was not torn down (its owner was
//! killed) is cleaned up by the next start, or by `cargo xtask cluster down`.
//!
//! [`Node::prepare`] takes the lock, clears leftovers, builds the binaries and creates the
//! namespace (the control plane's apiserver must then listen on the veth's host address);
//! [`Node::start`] starts containerd, imports the sandbox image and starts the kubelet.
//! [`crate::RealCluster`] does both around a control plane.

pub mod config;
pub mod netns;
pub mod paths;
pub mod teardown;

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use crate::binaries::{cache_root, ensure_node_binaries, BinariesError, NodeBinaries};
use crate::oci::{self, OciError};
use crate::process::{log_tail, pid_runs, stop_child};
pub use config::NodeNetwork;
pub use netns::{Netns, NetnsError};
pub use paths::NodePaths;
pub use teardown::TeardownReport;

/// Name of the sandbox image containerd is pinned to (built from the `pause` program).
pub const SANDBOX_IMAGE: &str = "docker.io/microvirt/pause:1";

/// Errors bringing a node up or driving it.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The binaries could not be built.
    #[error(transparent)]
    Binaries(#[from] BinariesError),
    /// The network namespace could not be set up.
    #[error("node network: {0}")]
    Netns(#[from] NetnsError),
    /// The sandbox image could not be written.
    #[error(transparent)]
    Oci(#[from] OciError),
    /// Host tools are missing.
    #[error(
        "the node needs these Debian packages: {0} (apt-get install {0}; `cargo xtask test` \
         installs them)"
    )]
    MissingPackages(String),
    /// Not running as root.
    #[error("a node needs root (mounts, cgroups, network namespaces)")]
    NotRoot,
    /// Another node owns the machine.
    #[error(
        "another node holds {lock} (a `cargo xtask cluster up` node, or another test run) and \
         did not let go within {waited:?}; stop it with `cargo xtask cluster down`"
    )]
    Busy {
        /// The lock file.
        lock: PathBuf,
        /// How long we waited.
        waited: Duration,
    },
    /// A file-system or process operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: io::Error,
    },
    /// A process exited while we waited for it.
    #[error("{what} exited ({status}); the end of {log}:\n{tail}")]
    Exited {
        /// Which process.
        what: &'static str,
        /// How it ended.
        status: String,
        /// Its log.
        log: PathBuf,
        /// The log's last lines.
        tail: String,
    },
    /// Something did not become ready in time.
    #[error("{what} not ready after {waited:?} ({last}); the end of {log}:\n{tail}")]
    NotReady {
        /// What we waited for.
        what: String,
        /// How long.
        waited: Duration,
        /// The last observation.
        last: String,
        /// The relevant log.
        log: PathBuf,
        /// Its last lines.
        tail: String,
    },
    /// A `ctr` command failed.
    #[error("`ctr {args}` failed ({status}): {stderr}")]
    Ctr {
        /// Its arguments.
        args: String,
        /// Exit status.
        status: String,
        /// Its error output.
        stderr: String,
    },
}

fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> NodeError {
    let context = context.into();
    move |source| NodeError::Io { context, source }
}

/// How to bring a node up. `Default` is what tests want.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// The node's directories.
    pub paths: NodePaths,
    /// Its private network.
    pub network: NodeNetwork,
    /// The Node object's name.
    pub node_name: String,
    /// The cgroup (in every hierarchy) all pods live under.
    pub cgroup_root: String,
    /// Leave the node running when the [`Node`] is dropped (`cargo xtask cluster up`); the
    /// machine-wide lock is then held by the namespace holder process until
    /// [`teardown::teardown`].
    pub persistent: bool,
    /// How long to wait for another node's owner to let go of the machine.
    pub lock_wait: Duration,
    /// How long containerd, then the kubelet, may take to become ready.
    pub ready_timeout: Duration,
}

impl Default for NodeOptions {
    fn default() -> Self {
        Self {
            paths: NodePaths::default(),
            network: NodeNetwork::default(),
            node_name: "microvirt-node".to_string(),
            cgroup_root: "/microvirt-node".to_string(),
            persistent: false,
            lock_wait: Duration::from_secs(30 * 60),
            ready_timeout: Duration::from_secs(180),
        }
    }
}

/// A node: the lock, the network namespace and (after [`Node::start`]) containerd and the
/// kubelet. Dropping it tears everything down unless it is persistent.
pub struct Node {
    opts: NodeOptions,
    bins: NodeBinaries,
    lock: Option<File>,
    netns: Netns,
    holder: Option<Child>,
    containerd: Option<Child>,
    kubelet: Mutex<Option<Child>>,
    kubelet_args: Vec<String>,
    started: bool,
}

/// Takes the machine-wide node lock, waiting up to `wait`.
fn take_lock(path: &Path, wait: Duration) -> Result<File, NodeError> {
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(io_err(format!("opening {}", path.display())))?;
    let started = Instant::now();
    let mut said = false;
    loop {
        match f.try_lock() {
            Ok(()) => return Ok(f),
            Err(fs::TryLockError::WouldBlock) => {}
            Err(fs::TryLockError::Error(e)) => {
                return Err(io_err(format!("locking {}", path.display()))(e))
            }
        }
        if started.elapsed() > wait {
            return Err(NodeError::Busy {
                lock: path.to_path_buf(),
                waited: started.elapsed(),
            });
        }
        if !said {
            eprintln!(
                "microvirt-testsupport: waiting for the machine's node lock {} (held by a \
                 `cargo xtask cluster up` node or another test run)",
                path.display()
            );
            said = true;
        }
        thread::sleep(Duration::from_millis(500));
    }
}

/// The kubeconfig the node's components and the test use: points at `server` with `token`.
pub fn kubeconfig_text(server: &str, ca_pem_b64: &str, token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: microvirt\n  cluster:\n    \
         server: {server}\n    certificate-authority-data: {ca_pem_b64}\nusers:\n- name: admin\n  \
         user:\n    token: {token}\ncontexts:\n- name: microvirt\n  context:\n    \
         cluster: microvirt\n    user: admin\ncurrent-context: microvirt\n"
    )
}

impl Node {
    /// Takes the machine's node lock, clears what an earlier node left, builds (or finds) the
    /// binaries and the sandbox image, and creates the node's network namespace and veth.
    pub fn prepare(opts: NodeOptions) -> Result<Node, NodeError> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err(NodeError::NotRoot);
        }
        let missing = netns::missing_host_packages();
        if !missing.is_empty() {
            return Err(NodeError::MissingPackages(missing.join(" ")));
        }
        let bins = ensure_node_binaries()?;
        let paths = opts.paths.clone();
        if let Some(parent) = paths.lock_file().parent() {
            fs::create_dir_all(parent).map_err(io_err(format!("creating {}", parent.display())))?;
        }
        let lock = take_lock(&paths.lock_file(), opts.lock_wait)?;
        let report = teardown::teardown(&paths, &opts.cgroup_root);
        if !report.killed.is_empty() || !report.unmounted.is_empty() {
            eprintln!(
                "microvirt-testsupport: cleared an earlier node: {} process(es), {} mount(s), \
                 {} cgroup(s)",
                report.killed.len(),
                report.unmounted.len(),
                report.cgroups_removed
            );
        }
        if !report.problems.is_empty() {
            eprintln!(
                "microvirt-testsupport: clearing the earlier node: {}",
                report.problems.join("; ")
            );
        }
        // Before anything is created: which of the fixed paths are ours to remove later.
        fs::create_dir_all(paths.base())
            .map_err(io_err(format!("creating {}", paths.base().display())))?;
        teardown::record_fixed_paths(&paths).map_err(io_err("recording fixed paths"))?;
        let logs = paths.logs();
        let _ = fs::remove_dir_all(&logs);
        for d in [
            paths.base().to_path_buf(),
            paths.run().to_path_buf(),
            logs,
            paths.tmp(),
            paths.cni_conf_dir(),
            paths.cni_ipam_dir(),
            paths.pod_logs(),
            paths.kubelet_root(),
            paths.containerd_root(),
        ] {
            fs::create_dir_all(&d).map_err(io_err(format!("creating {}", d.display())))?;
        }
        teardown::record_sysctls(&paths).map_err(io_err("recording kernel settings"))?;

        // The holder keeps the namespace alive and, for a persistent node, the lock held.
        let lock_fd = lock.as_raw_fd();
        let persistent = opts.persistent;
        let holder_args = vec![
            "microvirt-node-netns".to_string(),
            paths.base().display().to_string(),
        ];
        let (netns, holder) = Netns::create_with(&bins.pause, &holder_args, move |_| {
            if persistent {
                // SAFETY: fcntl on an fd we own, in the child before exec: clears
                // FD_CLOEXEC so the holder inherits the lock.
                if unsafe { libc::fcntl(lock_fd, libc::F_SETFD, 0) } != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        })?;
        fs::write(paths.pid_file("netns"), holder.id().to_string())
            .map_err(io_err("writing the holder's pid file"))?;
        let node = Node {
            opts,
            bins,
            lock: Some(lock),
            netns,
            holder: Some(holder),
            containerd: None,
            kubelet: Mutex::new(None),
            kubelet_args: Vec::new(),
            started: false,
        };
        node.netns.connect(&node.opts.network)?;
        Ok(node)
    }

    /// Starts containerd (importing the sandbox image) and the kubelet, which registers with
    /// the apiserver at `server` (on the veth's host address) using `kubeconfig`.
    pub fn start(&mut self, kubeconfig: &str, apiserver_port: u16) -> Result<(), NodeError> {
        let paths = self.opts.paths.clone();
        let net = self.opts.network;
        self.netns
            .load_nft(&config::nft_rules(&net, apiserver_port))?;
        let w = |p: PathBuf, text: String| {
            fs::write(&p, text).map_err(io_err(format!("writing {}", p.display())))
        };
        w(
            paths.containerd_config(),
            config::containerd_toml(&paths, SANDBOX_IMAGE, Path::new("/usr/sbin/runc")),
        )?;
        w(
            paths.cni_conf_dir().join("10-microvirt.conflist"),
            config::cni_conflist(&paths, &net),
        )?;
        w(
            paths.kubelet_config(),
            config::kubelet_yaml(&paths, &net, &self.opts.cgroup_root),
        )?;
        w(paths.kubeconfig(), kubeconfig.to_string())?;
        // Pods get no name servers: nothing outside the machine is reachable from them.
        w(paths.resolv_conf(), "search cluster.local\n".to_string())?;
        teardown::create_cgroup_root(&self.opts.cgroup_root)
            .map_err(io_err(format!("creating cgroup {}", self.opts.cgroup_root)))?;

        self.start_containerd()?;
        let sandbox = oci::Image {
            name: SANDBOX_IMAGE.to_string(),
            entries: vec![oci::Entry::file("pause", &self.bins.pause, true)],
            entrypoint: vec!["/pause".to_string()],
            ..Default::default()
        }
        .build(&cache_root()?.join("oci"))?;
        self.import_image(&sandbox.archive)?;

        self.kubelet_args = vec![
            format!("--config={}", paths.kubelet_config().display()),
            format!("--kubeconfig={}", paths.kubeconfig().display()),
            format!("--root-dir={}", paths.kubelet_root().display()),
            format!("--node-ip={}", net.node_ip),
            format!("--hostname-override={}", self.opts.node_name),
            "--v=1".to_string(),
        ];
        self.start_kubelet()?;
        self.started = true;
        Ok(())
    }

    fn log(&self, what: &str) -> PathBuf {
        self.opts.paths.logs().join(format!("{what}.log"))
    }

    fn spawn_in_netns(&self, bin: &Path, args: &[String], what: &str) -> Result<Child, NodeError> {
        let log = self.log(what);
        let f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(io_err(format!("opening {}", log.display())))?;
        let f2 = f.try_clone().map_err(io_err("cloning a log handle"))?;
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .env(
                "PATH",
                format!(
                    "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    self.bins.runtime_dir.display()
                ),
            )
            .env("TMPDIR", self.opts.paths.tmp())
            .stdin(Stdio::null())
            .stdout(f)
            .stderr(f2)
            .process_group(0);
        self.netns.enter(&mut cmd);
        let child = cmd
            .spawn()
            .map_err(io_err(format!("starting {}", bin.display())))?;
        fs::write(self.opts.paths.pid_file(what), child.id().to_string())
            .map_err(io_err(format!("writing the pid file of {what}")))?;
        Ok(child)
    }

    fn start_containerd(&mut self) -> Result<(), NodeError> {
        let args = vec![
            format!("--config={}", self.opts.paths.containerd_config().display()),
            "--log-level=info".to_string(),
        ];
        let bin = self.bins.containerd.clone();
        self.containerd = Some(self.spawn_in_netns(&bin, &args, "containerd")?);
        let started = Instant::now();
        loop {
            if let Some(c) = self.containerd.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    return Err(NodeError::Exited {
                        what: "containerd",
                        status: st.to_string(),
                        log: self.log("containerd"),
                        tail: log_tail(&self.log("containerd"), 30),
                    });
                }
            }
            let last = match self.ctr(&["version"]) {
                Ok(_) => return Ok(()),
                Err(e) => e.to_string(),
            };
            if started.elapsed() > self.opts.ready_timeout {
                return Err(NodeError::NotReady {
                    what: "containerd".into(),
                    waited: started.elapsed(),
                    last,
                    log: self.log("containerd"),
                    tail: log_tail(&self.log("containerd"), 30),
                });
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    fn start_kubelet(&self) -> Result<(), NodeError> {
        let marker = "\n==== microvirt-testsupport: kubelet (re)started ====\n";
        if let Ok(mut f) = OpenOptions::new().append(true).open(self.log("kubelet")) {
            let _ = io::Write::write_all(&mut f, marker.as_bytes());
        }
        let child = self.spawn_in_netns(&self.bins.kubelet, &self.kubelet_args, "kubelet")?;
        *self.kubelet.lock().unwrap_or_else(|e| e.into_inner()) = Some(child);
        self.wait_kubelet_healthy()
    }

    /// Waits for the kubelet's `/healthz` (on the node's address, port 10248).
    fn wait_kubelet_healthy(&self) -> Result<(), NodeError> {
        let started = Instant::now();
        let addr = std::net::SocketAddr::from((self.opts.network.node_ip, 10248));
        loop {
            if let Some(c) = self
                .kubelet
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_mut()
            {
                if let Ok(Some(st)) = c.try_wait() {
                    return Err(NodeError::Exited {
                        what: "kubelet",
                        status: st.to_string(),
                        log: self.log("kubelet"),
                        tail: log_tail(&self.log("kubelet"), 40),
                    });
                }
            }
            let last = match crate::http::plain_get_addr(addr, "/healthz", Duration::from_secs(2)) {
                Ok(r) if r.status == 200 => return Ok(()),
                Ok(r) => format!("HTTP {}: {}", r.status, r.body.trim()),
                Err(e) => e.to_string(),
            };
            if started.elapsed() > self.opts.ready_timeout {
                return Err(NodeError::NotReady {
                    what: "kubelet /healthz".into(),
                    waited: started.elapsed(),
                    last,
                    log: self.log("kubelet"),
                    tail: log_tail(&self.log("kubelet"), 40),
                });
            }
            thread::sleep(Duration::from_millis(200));
        }
    }

    /// Stops the kubelet (SIGTERM) and starts it again with the same configuration; running
    /// pods keep running. Returns once its `/healthz` answers.
    pub fn restart_kubelet(&self) -> Result<(), NodeError> {
        let old = self
            .kubelet
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(mut k) = old {
            stop_child(&mut k, Duration::from_secs(20));
        }
        self.start_kubelet()
    }

    /// The kubelet's pid, while it runs.
    pub fn kubelet_pid(&self) -> Option<u32> {
        self.kubelet
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(Child::id)
    }

    /// Runs `ctr` against this node's containerd (in the `k8s.io` namespace, which the
    /// kubelet's CRI uses); returns its stdout.
    pub fn ctr(&self, args: &[&str]) -> Result<String, NodeError> {
        let out = Command::new(&self.bins.ctr)
            .arg(format!(
                "--address={}",
                self.opts.paths.containerd_socket().display()
            ))
            .args(["--namespace", "k8s.io"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(io_err(format!("running {}", self.bins.ctr.display())))?;
        if !out.status.success() {
            return Err(NodeError::Ctr {
                args: args.join(" "),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Imports an OCI/Docker image archive into containerd's `k8s.io` namespace (where the
    /// kubelet finds it; pods must not pull it: `imagePullPolicy: IfNotPresent` or `Never`).
    pub fn import_image(&self, archive: &Path) -> Result<(), NodeError> {
        let a = archive.display().to_string();
        self.ctr(&["images", "import", "--platform", "linux/amd64", &a])
            .map(|_| ())
    }

    /// The node's network namespace (run commands "on the node", e.g. reach pod IPs).
    pub fn netns(&self) -> &Netns {
        &self.netns
    }

    /// The options the node runs with.
    pub fn options(&self) -> &NodeOptions {
        &self.opts
    }

    /// The node's binaries.
    pub fn binaries(&self) -> &NodeBinaries {
        &self.bins
    }

    /// Tears the node down now (see [`teardown::teardown`]) and reports what it removed.
    pub fn teardown(mut self) -> TeardownReport {
        self.do_teardown()
    }

    fn do_teardown(&mut self) -> TeardownReport {
        // Our children first, so they are reaped rather than left as zombies.
        let kubelet = self
            .kubelet
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(mut k) = kubelet {
            stop_child(&mut k, Duration::from_secs(10));
        }
        let mut report = teardown::teardown(&self.opts.paths, &self.opts.cgroup_root);
        for c in [self.containerd.take(), self.holder.take()]
            .into_iter()
            .flatten()
        {
            let mut c = c;
            stop_child(&mut c, Duration::from_secs(5));
        }
        if let Some(l) = self.lock.take() {
            let _ = l.unlock();
        }
        report.problems.retain(|p| !p.is_empty());
        report
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.opts.persistent && self.started {
            return;
        }
        let report = self.do_teardown();
        if !report.problems.is_empty() {
            eprintln!(
                "microvirt-testsupport: node teardown: {}",
                report.problems.join("; ")
            );
        }
    }
}

/// Whether a persistent node's holder (from its pid file) is alive.
pub fn persistent_node_running(paths: &NodePaths) -> bool {
    fs::read_to_string(paths.pid_file("netns"))
        .ok()
        .and_then(|p| p.trim().parse::<u32>().ok())
        .is_some_and(|pid| pid_runs(pid, &paths.base().display().to_string()))
}
