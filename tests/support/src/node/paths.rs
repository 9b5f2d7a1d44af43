//! Where the node keeps its state. One node per machine, so the places are fixed.

use std::path::{Path, PathBuf};

/// Default persistent state directory of the node.
pub const DEFAULT_BASE: &str = "/var/lib/microvirt-node";
/// Default runtime (tmpfs) directory of the node.
pub const DEFAULT_RUN: &str = "/run/microvirt-node";

/// The kubelet's root directory.
pub const KUBELET_ROOT: &str = "/var/lib/kubelet";

/// Paths fixed by the kubelet and containerd regardless of their configured directories. Each
/// is removed at teardown if the node created it (recorded in [`NodePaths::created_record`]).
pub const FIXED_PATHS: &[&str] = &[
    // The device-plugin registration socket's directory (a kubelet constant).
    "/var/lib/kubelet",
    // Symlinks to pod logs, one per container.
    "/var/log/containers",
    // containerd's shim sockets and runc's state.
    "/run/containerd",
    // libcni's result cache.
    "/var/lib/cni",
    // virt-handler's snapshot hostPath (deploy/handler.yaml, DirectoryOrCreate).
    "/var/lib/microvirt",
];

/// The node's directories and files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePaths {
    base: PathBuf,
    run: PathBuf,
}

impl Default for NodePaths {
    fn default() -> Self {
        Self::new(PathBuf::from(DEFAULT_BASE), PathBuf::from(DEFAULT_RUN))
    }
}

impl NodePaths {
    /// Paths below `base` (persistent state) and `run` (sockets, containerd state).
    pub fn new(base: PathBuf, run: PathBuf) -> Self {
        Self { base, run }
    }

    /// The persistent state directory.
    pub fn base(&self) -> &Path {
        &self.base
    }

    /// The runtime directory.
    pub fn run(&self) -> &Path {
        &self.run
    }

    /// The machine-wide lock every node owner holds (next to the state directory).
    pub fn lock_file(&self) -> PathBuf {
        let mut name = self
            .base
            .file_name()
            .map(|n| n.to_os_string())
            .unwrap_or_default();
        name.push(".lock");
        self.base.with_file_name(name)
    }

    /// containerd's content and snapshots.
    pub fn containerd_root(&self) -> PathBuf {
        self.base.join("containerd/root")
    }

    /// containerd's state (task bundles, pod network namespaces).
    pub fn containerd_state(&self) -> PathBuf {
        self.run.join("containerd")
    }

    /// containerd's gRPC socket (the CRI endpoint).
    pub fn containerd_socket(&self) -> PathBuf {
        self.run.join("containerd.sock")
    }

    /// containerd's ttrpc socket.
    pub fn containerd_ttrpc_socket(&self) -> PathBuf {
        self.run.join("containerd.sock.ttrpc")
    }

    /// containerd's config file.
    pub fn containerd_config(&self) -> PathBuf {
        self.base.join("containerd.toml")
    }

    /// Temporary files of containerd (image import).
    pub fn tmp(&self) -> PathBuf {
        self.base.join("tmp")
    }

    /// The CNI configuration directory.
    pub fn cni_conf_dir(&self) -> PathBuf {
        self.base.join("cni/net.d")
    }

    /// host-local IPAM's allocations.
    pub fn cni_ipam_dir(&self) -> PathBuf {
        self.base.join("cni/ipam")
    }

    /// The kubelet's root directory (pod volumes, its serving certificate): the standard
    /// `/var/lib/kubelet`, since node agents (virt-handler) find launcher pods' volumes there
    /// and the device-plugin directory inside it is fixed anyway.
    pub fn kubelet_root(&self) -> PathBuf {
        PathBuf::from(KUBELET_ROOT)
    }

    /// The kubelet's configuration file.
    pub fn kubelet_config(&self) -> PathBuf {
        self.base.join("kubelet.yaml")
    }

    /// The kubeconfig of the node's components.
    pub fn kubeconfig(&self) -> PathBuf {
        self.base.join("kubeconfig")
    }

    /// Pod logs (`podLogsDir`).
    pub fn pod_logs(&self) -> PathBuf {
        self.base.join("pod-logs")
    }

    /// The resolv.conf pods get.
    pub fn resolv_conf(&self) -> PathBuf {
        self.base.join("resolv.conf")
    }

    /// Process logs (containerd, kubelet); kept after teardown for debugging.
    pub fn logs(&self) -> PathBuf {
        self.base.join("logs")
    }

    /// The pid file of one of the node's processes.
    pub fn pid_file(&self, what: &str) -> PathBuf {
        self.base.join(format!("{what}.pid"))
    }

    /// Kernel settings as they were before the kubelet changed them.
    pub fn sysctl_record(&self) -> PathBuf {
        self.base.join("sysctl.saved")
    }

    /// Which of [`FIXED_PATHS`] the node created.
    pub fn created_record(&self) -> PathBuf {
        self.base.join("created-paths")
    }

    /// Everything mounted below these directories belongs to the node (container root
    /// filesystems and pod network namespaces under containerd's state, pod volumes under the
    /// kubelet's root).
    pub fn mount_roots(&self) -> Vec<PathBuf> {
        vec![self.base.clone(), self.run.clone(), self.kubelet_root()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_sits_next_to_the_state_dir() {
        let p = NodePaths::default();
        assert_eq!(p.lock_file(), PathBuf::from("/var/lib/microvirt-node.lock"));
        assert_eq!(
            p.containerd_socket(),
            PathBuf::from("/run/microvirt-node/containerd.sock")
        );
    }
}
