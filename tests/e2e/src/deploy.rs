//! Installing microvirt on a cluster the way a user does: images into the node's containerd
//! (there is no registry), `kubectl apply -f crds/ -f deploy/`, then waiting for the operator
//! (and the node agent) to run.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use microvirt_testsupport::oci::BuiltImage;
use microvirt_testsupport::RealCluster;

use crate::images::workspace_root;
use crate::kube::{wait_for, Kubectl};

/// Namespace of the operator (and node agent).
pub const NAMESPACE: &str = "microvirt";

/// `<workspace>/deploy`.
pub fn deploy_dir() -> PathBuf {
    workspace_root().join("deploy")
}

/// `<workspace>/crds`.
pub fn crds_dir() -> PathBuf {
    workspace_root().join("crds")
}

/// Imports `images` into the node and applies `crds/` and `deploy/`; returns once the
/// operator holds its Lease with a Ready pod and the node can run a VMI
/// ([`wait_node_runs_vmis`]): a VMI applied right after this is scheduled at once.
pub fn install(rc: &RealCluster, images: &[BuiltImage]) -> Result<()> {
    for i in images {
        rc.node()
            .import_image(&i.archive)
            .with_context(|| format!("importing {}", i.name))?;
    }
    let k = Kubectl::new(rc.kubeconfig_path());
    let crds = crds_dir().display().to_string();
    k.run(&["apply", "-f", &crds])?;
    let crds = k.run(&["get", "crd", "-o", "name"])?;
    let names: Vec<&str> = crds
        .lines()
        .filter_map(|l| l.trim().rsplit('/').next())
        .filter(|n| !n.is_empty())
        .collect();
    microvirt_testsupport::wait_crds_established(
        rc.kubeconfig_path(),
        &names,
        microvirt_testsupport::CRDS_ESTABLISHED_WITHIN,
    )
    .map_err(anyhow::Error::msg)?;
    // The namespaces first: `apply -f deploy/` goes through the files in name order.
    let ns = deploy_dir().join("namespace.yaml").display().to_string();
    k.run(&["apply", "-f", &ns])?;
    let deploy = deploy_dir().display().to_string();
    k.run(&["apply", "-f", &deploy])?;
    wait_operator(&k, Duration::from_secs(180))?;
    wait_node_runs_vmis(&k, rc.node_name(), Duration::from_secs(180))
}

/// Namespace of the node agent (`virt-handler` DaemonSet).
pub const HANDLER_NAMESPACE: &str = "microvirt-node";

/// The extended resource every launcher pod requests (served by virt-handler's device plugin).
pub const KVM_RESOURCE: &str = "devices.microvirt.io/kvm";

/// Waits until `node` can run a VMI: a Ready virt-handler pod on it (the node agent that
/// reports pause state and boot time) and a non-zero allocatable [`KVM_RESOURCE`] (its device
/// plugin registered with the kubelet and the kubelet published it). Until then a launcher pod
/// stays Pending (`Insufficient devices.microvirt.io/kvm`): right after the operator leads
/// this took ~20 s.
pub fn wait_node_runs_vmis(k: &Kubectl, node: &str, timeout: Duration) -> Result<()> {
    wait_for("virt-handler Ready on the node", timeout, |last| {
        let pods = k.list(
            HANDLER_NAMESPACE,
            "pod",
            Some("app.kubernetes.io/name=virt-handler"),
        )?;
        let ready = pods
            .iter()
            .filter(|p| p["spec"]["nodeName"].as_str() == Some(node))
            .filter(|p| crate::kube::condition_true(p, "Ready"))
            .count();
        *last = format!(
            "{} virt-handler pod(s), {ready} Ready on {node}",
            pods.len()
        );
        Ok((ready > 0).then_some(()))
    })?;
    wait_kvm_allocatable(k, node, timeout)
}

/// Waits until `node`'s allocatable [`KVM_RESOURCE`] is non-zero (after virt-handler, the
/// kubelet or the device plugin restarted, too).
pub fn wait_kvm_allocatable(k: &Kubectl, node: &str, timeout: Duration) -> Result<()> {
    wait_for(
        "the device plugin's resource on the node",
        timeout,
        |last| {
            let n = k
                .get("", "node", node)?
                .context("the Node object is gone")?;
            let a = n["status"]["allocatable"][KVM_RESOURCE]
                .as_str()
                .unwrap_or("0")
                .to_string();
            *last = format!("allocatable {KVM_RESOURCE}={a}");
            Ok((a != "0").then_some(()))
        },
    )
}

/// Waits until an operator pod is Ready and the Lease names a holder.
pub fn wait_operator(k: &Kubectl, timeout: Duration) -> Result<String> {
    wait_for("the operator to lead", timeout, |last| {
        let ready = k
            .list(
                NAMESPACE,
                "pod",
                Some("app.kubernetes.io/name=virt-operator"),
            )?
            .iter()
            .filter(|p| crate::kube::condition_true(p, "Ready"))
            .count();
        let holder = k
            .get(NAMESPACE, "lease", "microvirt-operator")?
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string));
        *last = format!("{ready} Ready operator pod(s), lease holder {holder:?}");
        Ok(holder.filter(|_| ready > 0))
    })
}
