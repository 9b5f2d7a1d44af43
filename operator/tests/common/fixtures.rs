//! Builders for what the operator tests make again and again: an [`Env`] on the binary's shared
//! control plane (also as the operator's ServiceAccount), manifests applied or refused by
//! `kubectl apply`, the YAML of VMs, VMI ReplicaSets and pools, and the checks that follow them
//! (no reconcile errors, `kubectl get` columns). The VMI itself is [`super::vmi_yaml`] /
//! [`super::vmi`]; pods in a given state are [`super::mark_running`] /
//! [`super::mark_terminated`].

use std::path::Path;

use anyhow::{bail, Result};

use super::{apply_operator_rbac, impersonating_client, kubectl, shared_cluster, Env, OPERATOR_SA};

impl Env {
    /// [`Env::start`] on this binary's shared control plane ([`shared_cluster`]).
    pub async fn start_shared(ns: &str) -> Result<Env> {
        Env::start(shared_cluster().kubeconfig_path(), ns).await
    }

    /// [`Env::start_with`] on the shared control plane, the operator running as its
    /// ServiceAccount with exactly the permissions of `deploy/rbac.yaml` (applied once,
    /// [`apply_operator_rbac`]); [`Env::operator_client`] is that impersonating client.
    pub async fn start_as_operator_sa(ns: &str) -> Result<Env> {
        let kc = shared_cluster().kubeconfig_path();
        apply_operator_rbac(kc)?;
        let op = impersonating_client(kc, OPERATOR_SA).await?;
        Env::start_with(kc, ns, Some(op)).await
    }

    /// `kubectl apply -f -` of `yaml` in this namespace; an error with kubectl's stderr if it is
    /// refused.
    pub fn apply(&self, yaml: &str) -> Result<()> {
        apply_in(&self.kubeconfig, &self.ns, yaml)
    }

    /// `kubectl apply -f -` of `yaml` in this namespace must be refused with every one of
    /// `wants` in kubectl's stderr (`what` names the case in the failure); returns that stderr.
    pub fn apply_refused(&self, what: &str, yaml: &str, wants: &[&str]) -> Result<String> {
        apply_refused_in(&self.kubeconfig, &self.ns, what, yaml, wants)
    }

    /// No `microvirt_operator_reconcile_errors_total` series in this operator's metrics: no
    /// reconcile has failed so far (e.g. for want of a permission).
    pub fn assert_no_reconcile_errors(&self) {
        let metrics = self.metrics.encode();
        let errors = metrics
            .lines()
            .filter(|l| l.starts_with("microvirt_operator_reconcile_errors_total"))
            .count();
        assert_eq!(errors, 0, "reconcile errors:\n{metrics}");
    }
}

/// `kubectl -n ns apply -f -` of `yaml`; an error with kubectl's stderr if it is refused.
pub fn apply_in(kubeconfig: &Path, ns: &str, yaml: &str) -> Result<()> {
    let (ok, _, err) = kubectl(kubeconfig, &["-n", ns, "apply", "-f", "-"], Some(yaml))?;
    if !ok {
        bail!("kubectl apply refused it: {err}");
    }
    Ok(())
}

/// `kubectl -n ns apply -f -` of `yaml` must be refused with every one of `wants` in kubectl's
/// stderr; returns that stderr.
pub fn apply_refused_in(
    kubeconfig: &Path,
    ns: &str,
    what: &str,
    yaml: &str,
    wants: &[&str],
) -> Result<String> {
    let (ok, out, err) = kubectl(kubeconfig, &["-n", ns, "apply", "-f", "-"], Some(yaml))?;
    assert!(!ok, "{what}: kubectl apply accepted it: {out}");
    for want in wants {
        assert!(
            err.contains(want),
            "{what}: kubectl said {err:?}, wanted {want:?}"
        );
    }
    Ok(err)
}

/// The column names of `kubectl get` output (its first line).
pub fn columns(kubectl_get_output: &str) -> Vec<&str> {
    kubectl_get_output
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect()
}

/// A VirtualMachine `name` with `runStrategy: strategy` whose template asks for `memory` of
/// guest memory and nothing else.
pub fn vm_yaml(name: &str, strategy: &str, memory: &str) -> String {
    format!(
        r#"apiVersion: microvirt.io/v1alpha1
kind: VirtualMachine
metadata: {{name: {name}}}
spec:
  runStrategy: {strategy}
  template:
    spec: {{domain: {{memory: {{guest: {memory}}}}}}}
"#
    )
}

/// A VirtualMachineInstanceReplicaSet `name` of `replicas` VMIs labelled `app: name`, each
/// asking for `memory` of guest memory and nothing else.
pub fn vmirs_yaml(name: &str, replicas: i32, memory: &str) -> String {
    format!(
        r#"apiVersion: microvirt.io/v1alpha1
kind: VirtualMachineInstanceReplicaSet
metadata: {{name: {name}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec: {{domain: {{memory: {{guest: {memory}}}}}}}
"#
    )
}

/// A VirtualMachinePool `name` of `replicas` VMIs labelled `app: name` with the `warm:` line
/// `warm` (e.g. `warm: {min: 1}`; empty for none), each asking for `memory` of guest memory and
/// nothing else.
pub fn pool_yaml(name: &str, replicas: i32, warm: &str, memory: &str) -> String {
    format!(
        r#"apiVersion: microvirt.io/v1alpha1
kind: VirtualMachinePool
metadata: {{name: {name}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  {warm}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec: {{domain: {{memory: {{guest: {memory}}}}}}}
"#
    )
}

/// A `kind` (VirtualMachineInstanceReplicaSet or VirtualMachinePool) `name` of `replicas` 32 MiB
/// VMIs labelled `app: name`, created with `finalizer` already (so a reconcile goes straight to
/// its work), as the JSON object to deserialize.
pub fn replicated_json(
    kind: &str,
    finalizer: &str,
    name: &str,
    replicas: i32,
) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "microvirt.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": name, "finalizers": [finalizer]},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"domain": {"memory": {"guest": "32Mi"}}},
            },
        },
    })
}
