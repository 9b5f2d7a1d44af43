//! Shared harness of the operator's integration tests: a real etcd + kube-apiserver
//! (`microvirt-testsupport`), the CRDs installed with `kubectl apply`, the operator's controllers
//! running in-process against one namespace per test, and a simulated kubelet (the test itself
//! binds pods and writes pod status).

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, ResourceExt};
use microvirt_operator::config::Config;
use microvirt_operator::controller::run::{run, RunOptions};
use microvirt_operator::metrics::Metrics;
use microvirt_testsupport::{Cluster, ClusterOptions};
use serde_json::json;

mod fixtures;
// The examples (`operator/examples/`) include this module too and use none of the builders.
#[allow(unused_imports)]
pub use fixtures::*;

/// API server flags the tests need: image volumes (containerDisk) are beta and off in 1.34.
pub fn cluster_options() -> ClusterOptions {
    ClusterOptions {
        extra_apiserver_args: vec!["--feature-gates=ImageVolume=true".to_string()],
        ..Default::default()
    }
}

/// A private etcd + kube-apiserver with [`cluster_options`].
pub fn start_cluster() -> Cluster {
    Cluster::start(cluster_options()).expect("starting etcd + kube-apiserver")
}

/// Directory with the committed CRD YAML.
pub fn crd_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds")
}

/// Run kubectl against `kubeconfig`; returns (success, stdout, stderr).
pub fn kubectl(
    kubeconfig: &Path,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<(bool, String, String)> {
    use std::io::Write;
    let mut cmd = Command::new("kubectl");
    cmd.arg("--kubeconfig").arg(kubeconfig).args(args);
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().context("running kubectl")?;
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .context("kubectl stdin")?
            .write_all(input.as_bytes())?;
    } else {
        drop(child.stdin.take());
    }
    let out = child.wait_with_output()?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// Install the CRDs with `kubectl apply -f crds/` and wait until they are established.
pub fn install_crds(kubeconfig: &Path) -> Result<()> {
    let dir = crd_dir();
    let dir_s = dir.to_string_lossy().into_owned();
    let (ok, out, err) = kubectl(kubeconfig, &["apply", "-f", &dir_s], None)?;
    if !ok {
        bail!("kubectl apply -f crds/ failed:\n{out}\n{err}");
    }
    microvirt_testsupport::wait_crds_established(
        kubeconfig,
        &[
            "virtualmachineinstances.microvirt.io",
            "virtualmachines.microvirt.io",
            "virtualmachineinstancereplicasets.microvirt.io",
            "virtualmachineinstancepresets.microvirt.io",
            "virtualmachinepools.microvirt.io",
            "virtualmachineinstancetypes.microvirt.io",
            "virtualmachineclusterinstancetypes.microvirt.io",
            "virtualmachinepreferences.microvirt.io",
            "virtualmachineclusterpreferences.microvirt.io",
        ],
        microvirt_testsupport::CRDS_ESTABLISHED_WITHIN,
    )
    .map_err(anyhow::Error::msg)?;
    Ok(())
}

static SHARED: OnceLock<Cluster> = OnceLock::new();

/// The cluster shared by all tests of one test binary (started on first use, CRDs installed).
pub fn shared_cluster() -> &'static Cluster {
    SHARED.get_or_init(|| {
        let c = start_cluster();
        install_crds(c.kubeconfig_path()).expect("installing CRDs");
        c
    })
}

/// `deploy/`: the manifests a cluster installs microvirt from.
pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// The operator's ServiceAccount (`deploy/rbac.yaml`), for [`impersonating_client`].
pub const OPERATOR_SA: &str = "system:serviceaccount:microvirt:virt-operator";

/// The clusters (by kubeconfig) that [`apply_operator_rbac`] has set up.
static OPERATOR_RBAC: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

/// `kubectl apply` of `deploy/namespace.yaml` and `deploy/rbac.yaml`, once per cluster: the
/// tests of one binary that run the operator as its ServiceAccount share these cluster-wide
/// objects, and two `kubectl apply` of the same new object at once can both try to create it
/// (one fails with AlreadyExists), so the first caller applies them while the others wait.
pub fn apply_operator_rbac(kubeconfig: &Path) -> Result<()> {
    let mut done = OPERATOR_RBAC
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if done.contains(kubeconfig) {
        return Ok(());
    }
    for f in ["namespace.yaml", "rbac.yaml"] {
        let path = deploy_dir().join(f).display().to_string();
        let (ok, out, err) = kubectl(kubeconfig, &["apply", "-f", &path], None)?;
        if !ok {
            bail!("kubectl apply -f deploy/{f}: {out}{err}");
        }
    }
    done.insert(kubeconfig.to_path_buf());
    Ok(())
}

/// A kube client for a kubeconfig file.
pub async fn client_for(kubeconfig: &Path) -> Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(cfg)?)
}

/// A client for `kubeconfig` that impersonates `user` (e.g. a ServiceAccount).
pub async fn impersonating_client(kubeconfig: &Path, user: &str) -> Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)?;
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    cfg.auth_info.impersonate = Some(user.to_string());
    Ok(Client::try_from(cfg)?)
}

/// One test's world: a namespace, a client, and the operator running against that namespace.
pub struct Env {
    pub client: Client,
    /// The client the operator uses: its own admin client (a new one at every
    /// [`Env::start_operator`], as a restarted operator process would have) unless one was given
    /// (e.g. an impersonated one).
    pub operator_client: Client,
    given_operator_client: bool,
    pub ns: String,
    pub kubeconfig: PathBuf,
    pub metrics: Arc<Metrics>,
    operator: Option<tokio::task::JoinHandle<()>>,
    /// Asks the running controllers to shut down (graceful, see [`Env::shutdown`]).
    stop: Option<tokio::sync::watch::Sender<bool>>,
    kubelet: Option<tokio::task::JoinHandle<()>>,
}

impl Env {
    /// Create namespace `ns` and start the operator (scoped to it) and the pod finalizer of the
    /// simulated kubelet.
    pub async fn start(kubeconfig: &Path, ns: &str) -> Result<Env> {
        Self::start_with(kubeconfig, ns, None).await
    }

    /// Like [`Env::start`], the operator using `operator_client` (e.g. an impersonated one).
    pub async fn start_with(
        kubeconfig: &Path,
        ns: &str,
        operator_client: Option<Client>,
    ) -> Result<Env> {
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    // The controllers' start-up lines (each cache as it fills) say where a
                    // start that never gets ready waits.
                    .unwrap_or_else(|_| "warn,microvirt_operator::controller=info".into()),
            )
            .try_init();
        let client = client_for(kubeconfig).await?;
        let nss: Api<Namespace> = Api::all(client.clone());
        let nsobj: Namespace = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}
        }))?;
        match nss.create(&PostParams::default(), &nsobj).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        let mut env = Env {
            given_operator_client: operator_client.is_some(),
            operator_client: operator_client.unwrap_or_else(|| client.clone()),
            client,
            ns: ns.to_string(),
            kubeconfig: kubeconfig.to_path_buf(),
            metrics: Arc::new(Metrics::new()),
            operator: None,
            stop: None,
            kubelet: None,
        };
        env.start_operator().await?;
        env.kubelet = Some(tokio::spawn(finalize_deleted_pods(
            env.client.clone(),
            env.ns.clone(),
        )));
        Ok(env)
    }

    /// Start the controllers (scoped to this namespace) and wait until their caches are filled
    /// (at most [`CACHES_READY_WITHIN`]).
    pub async fn start_operator(&mut self) -> Result<()> {
        if !self.given_operator_client {
            // Nothing of an earlier (aborted) operator's connections is shared with the new one.
            self.operator_client = client_for(&self.kubeconfig).await?;
        }
        let ready = Arc::new(AtomicBool::new(false));
        let opts = RunOptions {
            namespace: Some(self.ns.clone()),
            instance: Some(format!("test-{}", self.ns)),
            ..RunOptions::default()
        };
        let (tx, mut rx) = tokio::sync::watch::channel(false);
        let stop = futures::FutureExt::shared(futures::FutureExt::boxed(async move {
            let _ = rx.wait_for(|v| *v).await;
        }));
        self.stop = Some(tx);
        self.operator = Some(tokio::spawn(run(
            self.operator_client.clone(),
            test_config(),
            self.metrics.clone(),
            opts,
            ready.clone(),
            stop,
        )));
        let start = Instant::now();
        while !ready.load(Ordering::SeqCst) {
            // An operator that ended (an error at start-up) never gets ready: say why at once
            // instead of waiting out the deadline.
            if self.operator.as_ref().is_some_and(|h| h.is_finished()) {
                let h = self.operator.take().context("operator task")?;
                match h.await {
                    Ok(()) => bail!(
                        "the operator stopped before its caches were filled (its log is above)"
                    ),
                    Err(e) => bail!("the operator task ended before its caches were filled: {e}"),
                }
            }
            if start.elapsed() > CACHES_READY_WITHIN {
                bail!(
                    "operator caches not ready after {} s (the operator still runs; its log \
                     names each cache as it fills)",
                    CACHES_READY_WITHIN.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Stop the controllers at once (their tasks are aborted).
    pub fn stop_operator(&mut self) {
        self.stop = None;
        if let Some(h) = self.operator.take() {
            h.abort();
        }
    }

    /// Shut down in order, before the cluster goes away: the simulated kubelet stops, then the
    /// controllers stop taking work and finish (or abandon, after their drain timeout) what
    /// they are doing; returns once nothing of this environment talks to the API server.
    pub async fn shutdown(&mut self) {
        if let Some(h) = self.kubelet.take() {
            h.abort();
            let _ = h.await;
        }
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(true);
        }
        if let Some(h) = self.operator.take() {
            let _ = h.await;
        }
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<(bool, String, String)> {
        let mut full = vec!["-n", self.ns.as_str()];
        full.extend_from_slice(args);
        kubectl(&self.kubeconfig, &full, stdin)
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        self.stop_operator();
        if let Some(h) = self.kubelet.take() {
            h.abort();
        }
    }
}

/// The operator's settings in these tests: the defaults, but a VM's start back-off (after VMIs
/// that failed before they ran) from 1 s instead of KubeVirt's 10 s, so that the VM tests wait
/// seconds, not minutes (`virtualmachine::start_backoff` has KubeVirt's values).
pub fn test_config() -> Config {
    Config {
        vm_start_backoff: Duration::from_secs(1),
        ..Config::default()
    }
}

/// Simulated kubelet, part 1: pods marked for deletion are removed (grace period 0), as a
/// kubelet does once the container has stopped.
pub async fn finalize_deleted_pods(client: Client, ns: String) {
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    loop {
        if let Ok(list) = pods.list(&ListParams::default()).await {
            for p in list.items {
                if p.metadata.deletion_timestamp.is_some() {
                    let dp = DeleteParams {
                        grace_period_seconds: Some(0),
                        ..Default::default()
                    };
                    let _ = pods.delete(&p.name_any(), &dp).await;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Simulated kubelet, part 2: the scheduler's binding of a pod to `node`.
pub async fn bind(pods: &Api<Pod>, name: &str, node: &str) -> Result<()> {
    let binding = json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    });
    let _: serde_json::Value = pods
        .create_subresource("binding", name, &PostParams::default(), &binding)
        .await?;
    Ok(())
}

/// Now, as the API server writes times (RFC 3339, seconds).
pub fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Simulated kubelet and node agent, part 3: the compute container runs; `ready`: the node
/// agent saw the VM running and the guest booted (pod conditions `microvirt.io/vm-running`, the
/// readiness gate, and `microvirt.io/guest-booted`) and the kubelet set Ready from the gate.
pub async fn mark_running(pods: &Api<Pod>, name: &str, ip: &str, ready: bool) -> Result<()> {
    let now = now_rfc3339();
    let r = if ready { "True" } else { "False" };
    let mut conditions = vec![
        json!({"type": "PodScheduled", "status": "True", "lastTransitionTime": now}),
        json!({"type": "Ready", "status": r, "lastTransitionTime": now}),
        json!({"type": "ContainersReady", "status": "True", "lastTransitionTime": now}),
        json!({"type": "microvirt.io/vm-running", "status": r, "lastTransitionTime": now}),
    ];
    if ready {
        conditions.push(
            json!({"type": "microvirt.io/guest-booted", "status": "True", "lastTransitionTime": now}),
        );
    }
    let status = json!({
        "status": {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": now,
            "conditions": conditions,
            "containerStatuses": [{
                "name": "compute",
                "image": "microvirt/virt-launcher:dev",
                "imageID": "sha256:0000",
                "ready": true,
                "restartCount": 0,
                "started": true,
                "state": {"running": {"startedAt": now}},
            }],
        }
    });
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

/// Simulated kubelet, part 4: the compute container exited with `code` and `message`.
pub async fn mark_terminated(pods: &Api<Pod>, name: &str, code: i32, message: &str) -> Result<()> {
    let now = now_rfc3339();
    let phase = if code == 0 { "Succeeded" } else { "Failed" };
    let status = json!({
        "status": {
            "phase": phase,
            "conditions": [
                {"type": "Ready", "status": "False", "lastTransitionTime": now},
            ],
            "containerStatuses": [{
                "name": "compute",
                "image": "microvirt/virt-launcher:dev",
                "imageID": "sha256:0000",
                "ready": false,
                "restartCount": 0,
                "started": false,
                "state": {"terminated": {
                    "exitCode": code,
                    "reason": if code == 0 { "Completed" } else { "Error" },
                    "message": message,
                    "startedAt": now,
                    "finishedAt": now,
                }},
            }],
        }
    });
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

/// Poll `f` every 50 ms until it returns `Some`, or fail after `timeout` with `what`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let start = Instant::now();
    let mut last_err = String::new();
    loop {
        match f().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_err = format!("{e:#}"),
        }
        if start.elapsed() > timeout {
            bail!("timed out after {timeout:?} waiting for {what} (last error: {last_err})");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Default wait.
pub const WAIT: Duration = Duration::from_secs(30);

/// How long a started operator may take to fill its caches: one list per watched kind, a
/// second or two on a busy machine; the bound is generous and fails only an operator that is
/// stuck. (The starts that once waited out 60 s and then 180 s here were not slow lists: the
/// start-up lost a wake-up to a reconcile waiting on the same cache, see
/// `operator/src/controller/filled.rs`.)
pub const CACHES_READY_WITHIN: Duration = Duration::from_secs(180);

/// A minimal valid VMI manifest (YAML) named `name` with extra labels.
pub fn vmi_yaml(name: &str, labels: &str) -> String {
    format!(
        r#"apiVersion: microvirt.io/v1alpha1
kind: VirtualMachineInstance
metadata:
  name: {name}
  labels: {{{labels}}}
spec:
  domain:
    cpu: {{cores: 1}}
    memory: {{guest: 128Mi}}
    devices:
      disks:
      - name: root
        disk: {{bus: virtio}}
      interfaces:
      - name: default
        masquerade: {{}}
  networks:
  - name: default
    pod: {{}}
  volumes:
  - name: root
    containerDisk:
      image: quay.io/containerdisks/fedora:latest
"#
    )
}

/// The same as a typed object.
pub fn vmi(name: &str, labels: &[(&str, &str)]) -> microvirt_crds::VirtualMachineInstance {
    let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    serde_saphyr::from_str(&vmi_yaml(name, &l.join(", "))).expect("test VMI YAML parses")
}

/// The VM's spec names the ControllerRevisions of both its instancetype and its preference.
pub fn revisions_recorded(vm: &microvirt_crds::VirtualMachine) -> bool {
    let it = vm.spec.instancetype.as_ref();
    let pref = vm.spec.preference.as_ref();
    it.is_some_and(|m| m.revision_name.is_some()) && pref.is_some_and(|m| m.revision_name.is_some())
}
