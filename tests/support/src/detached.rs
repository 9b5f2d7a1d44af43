//! Looking after a cluster started with [`ClusterOptions::persistent`](crate::ClusterOptions)
//! by another process (`cargo xtask cluster up`), through the files in its data dir.

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use crate::binaries::{cache_root, BinariesError};
use crate::cluster::ClusterError;
use crate::http::ApiClient;
use crate::process::{pid_runs, signal};

/// Where `cargo xtask cluster up` keeps its cluster: `<cache root>/cluster`, i.e.
/// `~/.cache/microvirt/cluster` unless `MICROVIRT_CACHE_DIR` or `XDG_CACHE_HOME` says otherwise.
pub fn default_dir() -> Result<PathBuf, BinariesError> {
    Ok(cache_root()?.join("cluster"))
}

/// What runs of a persistent cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// etcd's pid, if it runs.
    pub etcd: Option<u32>,
    /// kube-apiserver's pid, if it runs.
    pub kube_apiserver: Option<u32>,
    /// The apiserver URL recorded at start.
    pub server_url: Option<String>,
    /// Whether `/readyz` answered `ok` just now.
    pub ready: bool,
    /// The kubeconfig file.
    pub kubeconfig: PathBuf,
}

impl Status {
    /// Both processes run and the apiserver is ready.
    pub fn healthy(&self) -> bool {
        self.etcd.is_some() && self.kube_apiserver.is_some() && self.ready
    }

    /// Either process runs.
    pub fn any_running(&self) -> bool {
        self.etcd.is_some() || self.kube_apiserver.is_some()
    }
}

/// The pid recorded in `<dir>/<what>.pid`, if that process still runs with this data dir on
/// its command line (so a recycled pid is never mistaken for ours).
fn running_pid(dir: &Path, what: &str) -> Option<u32> {
    let pid: u32 = fs::read_to_string(dir.join(format!("{what}.pid")))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    pid_runs(pid, &dir.to_string_lossy()).then_some(pid)
}

/// Reports on the persistent cluster in `dir`.
pub fn status(dir: &Path) -> Status {
    let dir = fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let etcd = running_pid(&dir, "etcd");
    let kube_apiserver = running_pid(&dir, "kube-apiserver");
    let server_url = fs::read_to_string(dir.join("server-url")).ok();
    let ready = kube_apiserver.is_some() && probe_ready(&dir, server_url.as_deref());
    Status {
        etcd,
        kube_apiserver,
        server_url,
        ready,
        kubeconfig: dir.join("kubeconfig"),
    }
}

fn probe_ready(dir: &Path, url: Option<&str>) -> bool {
    let addr = url
        .and_then(|u| u.trim().strip_prefix("https://"))
        .and_then(|a| a.parse::<SocketAddr>().ok());
    let ca = fs::read(dir.join("pki").join("ca.der")).ok();
    let token = fs::read_to_string(dir.join("pki").join("admin.token")).ok();
    let (Some(addr), Some(ca), Some(token)) = (addr, ca, token) else {
        return false;
    };
    ApiClient::new(&ca, addr, token.trim())
        .and_then(|c| c.request("GET", "/readyz", None, Duration::from_secs(5)))
        .map(|r| r.status == 200 && r.body.trim() == "ok")
        .unwrap_or(false)
}

/// Stops the persistent cluster in `dir` (SIGTERM, SIGKILL after 15 s; kube-controller-manager
/// and kube-scheduler too, when a [`crate::RealCluster`] recorded them) and removes `dir`.
/// Returns whether anything was running.
pub fn stop(dir: &Path) -> Result<bool, ClusterError> {
    let dir = match fs::canonicalize(dir) {
        Ok(d) => d,
        Err(_) => return Ok(false),
    };
    let mut was_running = false;
    // Clients of the apiserver first, etcd last.
    for what in [
        "kube-controller-manager",
        "kube-scheduler",
        "kube-apiserver",
        "etcd",
    ] {
        let Some(pid) = running_pid(&dir, what) else {
            continue;
        };
        was_running = true;
        signal(pid, libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(15);
        while running_pid(&dir, what).is_some() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(50));
        }
        if running_pid(&dir, what).is_some() {
            signal(pid, libc::SIGKILL);
            let deadline = Instant::now() + Duration::from_secs(5);
            while running_pid(&dir, what).is_some() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(50));
            }
        }
    }
    fs::remove_dir_all(&dir).map_err(|source| ClusterError::Io {
        context: format!("removing {}", dir.display()),
        source,
    })?;
    Ok(was_running)
}
