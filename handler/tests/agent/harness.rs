//! The shared harness: the cluster with the agent's ServiceAccount, the launcher binary, a
//! launcher pod laid out as the kubelet would, and waits on VMI and pod conditions.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, ResourceExt};
use microvirt_crds::vmi::{VirtualMachineInstance, VmiCondition};
use microvirt_testsupport::{Cluster, ClusterOptions, Spawned};
use serde_json::json;

pub(crate) const NS: &str = "t-agent";
pub(crate) const NODE: &str = "node-a";
pub(crate) const SA: &str = "system:serviceaccount:microvirt-node:virt-handler";
pub(crate) const WAIT: Duration = Duration::from_secs(30);

pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `virt-launcher` binary of this workspace, built (debug) if needed.
pub(crate) fn launcher_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("MICROVIRT_LAUNCHER_BIN") {
        return PathBuf::from(p);
    }
    let root = workspace_root();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|t| if t.is_absolute() { t } else { root.join(t) })
        .unwrap_or_else(|| root.join("target"));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(&root)
        .env("CARGO_TARGET_DIR", &target)
        .args([
            "build",
            "-p",
            "microvirt-launcher",
            "--bin",
            "virt-launcher",
        ])
        .output()
        .expect("running cargo build");
    assert!(
        out.status.success(),
        "building virt-launcher:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    target.join("debug/virt-launcher")
}

pub(crate) fn kubectl(kubeconfig: &Path, args: &[&str]) {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .expect("running kubectl");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

pub(crate) async fn admin_client(kubeconfig: &Path) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    Client::try_from(cfg).unwrap()
}

/// Polls `f` until it returns Some, at most [`WAIT`].
pub(crate) async fn wait_for<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let t0 = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(t0.elapsed() < WAIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub(crate) fn condition<'a>(vmi: &'a VirtualMachineInstance, t: &str) -> Option<&'a VmiCondition> {
    vmi.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == t)
}

pub(crate) async fn paused_is(
    vmis: &Api<VirtualMachineInstance>,
    name: &str,
    want: &str,
) -> Option<VmiCondition> {
    let v = vmis.get(name).await.ok()?;
    condition(&v, "Paused")
        .filter(|c| c.status == want)
        .cloned()
}

/// The launcher's state through its control socket (the client subcommand).
pub(crate) fn launcher_state(bin: &Path, root: &Path) -> String {
    let out = Command::new(bin)
        .arg("status")
        .env("MICROVIRT_ROOT", root)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["state"].as_str().unwrap_or("").to_string()
}

pub(crate) fn launcher_cmd(bin: &Path, root: &Path, cmd: &str) {
    let out = Command::new(bin)
        .arg(cmd)
        .env("MICROVIRT_ROOT", root)
        .output()
        .unwrap();
    assert!(out.status.success(), "virt-launcher {cmd}: {out:?}");
}

/// Creates the launcher pod of VMI `name` (as the operator does, already bound to our node),
/// lays out the kubelet's pod directory for it and starts `virt-launcher pod` in it.
pub(crate) async fn launch(
    pods: &Api<Pod>,
    tmp: &Path,
    bin: &Path,
    name: &str,
    vmi_uid: &str,
) -> (Spawned, PathBuf) {
    launch_with(
        pods,
        tmp,
        bin,
        name,
        json!({"app.kubernetes.io/name": "virt-launcher", "microvirt.io/vmi": name}),
        json!({"microvirt.io/vmi-uid": vmi_uid}),
        &[],
    )
    .await
}

/// [`launch`] with the pod's labels and annotations given (a pool's warm member names no VMI)
/// and extra environment for the launcher.
pub(crate) async fn launch_with(
    pods: &Api<Pod>,
    tmp: &Path,
    bin: &Path,
    name: &str,
    labels: serde_json::Value,
    annotations: serde_json::Value,
    env: &[(&str, PathBuf)],
) -> (Spawned, PathBuf) {
    let (mut cmd, runtime) = prepare(
        pods,
        tmp,
        bin,
        name,
        labels,
        annotations,
        env,
        "halt-forever",
    )
    .await;
    (Spawned::spawn(&mut cmd), runtime)
}

/// Creates the pod and the kubelet's directories of [`launch_with`], with the test guest's
/// `scenario`; returns the launcher's command (not started) and its runtime directory.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn prepare(
    pods: &Api<Pod>,
    tmp: &Path,
    bin: &Path,
    name: &str,
    labels: serde_json::Value,
    annotations: serde_json::Value,
    env: &[(&str, PathBuf)],
    scenario: &str,
) -> (Command, PathBuf) {
    let vmi_uid = annotations["microvirt.io/vmi-uid"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": format!("virt-launcher-{name}"),
            "labels": labels,
            "annotations": annotations
        },
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "compute", "image": "microvirt/virt-launcher:dev"}]
        }
    }))
    .unwrap();
    let pod = pods.create(&PostParams::default(), &pod).await.unwrap();
    let pod_uid = pod.uid().unwrap();
    let runtime = tmp.join(format!("rt-{name}"));
    std::fs::create_dir_all(runtime.join("vmi")).unwrap();
    // The kernelBoot image's mount with the demo guest at boot/vmlinux (as in
    // microvirt/demo-kernel:dev): a pod never boots the launcher's built-in demo guest.
    let kernel_dir = runtime.join("kernel-boot/boot");
    std::fs::create_dir_all(&kernel_dir).unwrap();
    let guest =
        tokio::task::block_in_place(testguest_build::build).expect("building the test guest");
    std::fs::copy(&guest.pvh, kernel_dir.join("vmlinux")).unwrap();
    let empty_dirs = tmp
        .join("kubelet/pods")
        .join(&pod_uid)
        .join("volumes/kubernetes.io~empty-dir");
    std::fs::create_dir_all(&empty_dirs).unwrap();
    std::os::unix::fs::symlink(&runtime, empty_dirs.join("runtime")).unwrap();
    let doc = json!({
        "apiVersion": "microvirt.io/v1alpha1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": NS, "uid": vmi_uid},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "domain": {"firmware": {"kernelBoot": {
                "kernelArgs": format!("testguest.scenario={scenario}"),
                "container": {"image": "microvirt/demo-kernel:dev", "kernelPath": "/boot/vmlinux"}
            }}}
        },
        "guestMemoryBytes": 33554432u64,
        "vcpus": 1
    });
    std::fs::write(runtime.join("vmi/vmi.json"), doc.to_string()).unwrap();
    let mut cmd = Command::new(bin);
    cmd.arg("pod").env("MICROVIRT_ROOT", &runtime).env(
        "MICROVIRT_TERMINATION_LOG",
        tmp.join(format!("termination-log-{name}")),
    );
    for (k, v) in env {
        cmd.env(k, v);
    }
    (cmd, runtime)
}

/// The pod condition `type_` of pod `name`: (status, reason, lastTransitionTime).
pub(crate) async fn pod_condition(
    pods: &Api<Pod>,
    name: &str,
    type_: &str,
) -> Option<(String, String, String)> {
    let p = pods.get(name).await.ok()?;
    let c = p
        .status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == type_)?;
    Some((
        c.status,
        c.reason.unwrap_or_default(),
        c.last_transition_time
            .map(|t| t.0.to_string())
            .unwrap_or_default(),
    ))
}

/// Waits until the pod's readiness gate `microvirt.io/vm-running` is `status` with `reason`.
pub(crate) async fn gate_is(
    pods: &Api<Pod>,
    name: &str,
    status: &str,
    reason: &str,
) -> (String, String, String) {
    wait_for(
        &format!("{name}: vm-running={status} ({reason})"),
        || async {
            pod_condition(pods, name, GATE)
                .await
                .filter(|(s, r, _)| s == status && r == reason)
        },
    )
    .await
}

pub(crate) const GATE: &str = "microvirt.io/vm-running";
pub(crate) const BOOTED: &str = "microvirt.io/guest-booted";

/// Starts a cluster with the CRDs, the handler's RBAC and namespace `NS`; returns it with an
/// admin client and a kubeconfig for the handler's ServiceAccount (in `tmp`).
pub(crate) async fn cluster_for_agent(tmp: &Path) -> (Cluster, Client, PathBuf) {
    let cluster = tokio::task::block_in_place(|| {
        Cluster::start(ClusterOptions::default()).expect("starting etcd + kube-apiserver")
    });
    let kc = cluster.kubeconfig_path().to_path_buf();
    let crds = workspace_root().join("crds").display().to_string();
    kubectl(&kc, &["apply", "-f", &crds]);
    microvirt_testsupport::wait_crds_established(
        &kc,
        &[
            "virtualmachineinstances.microvirt.io",
            "virtualmachinepools.microvirt.io",
        ],
        microvirt_testsupport::CRDS_ESTABLISHED_WITHIN,
    )
    .expect("CRDs established");
    let deploy = workspace_root().join("deploy");
    for f in ["namespace.yaml", "handler.yaml"] {
        kubectl(&kc, &["apply", "-f", &deploy.join(f).display().to_string()]);
    }
    kubectl(&kc, &["create", "namespace", NS]);
    let client = admin_client(&kc).await;
    let kubeconfig = std::fs::read_to_string(&kc).unwrap();
    let (head, tail) = kubeconfig.split_once("    token: ").unwrap();
    let (token, rest) = tail.split_once('\n').unwrap();
    let sa_kubeconfig = tmp.join("handler.kubeconfig");
    std::fs::write(
        &sa_kubeconfig,
        format!("{head}    token: {token}\n    as: {SA}\n{rest}"),
    )
    .unwrap();
    (cluster, client, sa_kubeconfig)
}
