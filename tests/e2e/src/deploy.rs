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
/// operator holds its Lease with a Ready pod.
pub fn install(rc: &RealCluster, images: &[BuiltImage]) -> Result<()> {
    for i in images {
        rc.node()
            .import_image(&i.archive)
            .with_context(|| format!("importing {}", i.name))?;
    }
    let k = Kubectl::new(rc.kubeconfig_path());
    let crds = crds_dir().display().to_string();
    k.run(&["apply", "-f", &crds])?;
    k.run(&[
        "wait",
        "--for=condition=Established",
        "crd",
        "--all",
        "--timeout=120s",
    ])?;
    // The namespaces first: `apply -f deploy/` goes through the files in name order.
    let ns = deploy_dir().join("namespace.yaml").display().to_string();
    k.run(&["apply", "-f", &ns])?;
    let deploy = deploy_dir().display().to_string();
    k.run(&["apply", "-f", &deploy])?;
    wait_operator(&k, Duration::from_secs(180)).map(|_| ())
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
