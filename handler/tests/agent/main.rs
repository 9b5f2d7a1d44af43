//! The node agent end to end: the real `virt-handler` binary (`--no-device-plugin`) against a
//! real etcd + kube-apiserver (`tests/support`), running as the ServiceAccount of
//! `deploy/handler.yaml` (impersonated, so its RBAC is what is tested), and a real
//! `virt-launcher pod` process booting the built-in test guest on /dev/kvm.
//!
//! The test stands in for the kubelet: it creates the launcher pod object already bound to
//! node `node-a` and lays out the kubelet's pod directory in a temp "kubelet root":
//! `<root>/pods/<pod uid>/volumes/kubernetes.io~empty-dir/runtime` is a symlink to the
//! directory the launcher uses as `MICROVIRT_ROOT` (in a real pod that directory is the same
//! emptyDir, bind-mounted at /var/run/microvirt). It also plays the operator where needed
//! (writes the VMI's Ready condition with the operator's field manager, sets control
//! requests on the pod).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, ResourceExt};
use microvirt_crds::vmi::{VirtualMachineInstance, VmiCondition};
use microvirt_testsupport::{Cluster, ClusterOptions, Spawned, TempDir};
use serde_json::json;

const NS: &str = "t-agent";
const NODE: &str = "node-a";
const SA: &str = "system:serviceaccount:microvirt-node:virt-handler";
const WAIT: Duration = Duration::from_secs(30);

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `virt-launcher` binary of this workspace, built (debug) if needed.
fn launcher_bin() -> PathBuf {
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

fn kubectl(kubeconfig: &Path, args: &[&str]) {
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

async fn admin_client(kubeconfig: &Path) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    Client::try_from(cfg).unwrap()
}

/// Polls `f` until it returns Some, at most [`WAIT`].
async fn wait_for<T, F, Fut>(what: &str, mut f: F) -> T
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

fn condition<'a>(vmi: &'a VirtualMachineInstance, t: &str) -> Option<&'a VmiCondition> {
    vmi.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == t)
}

async fn paused_is(
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
fn launcher_state(bin: &Path, root: &Path) -> String {
    let out = Command::new(bin)
        .arg("status")
        .env("MICROVIRT_ROOT", root)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["state"].as_str().unwrap_or("").to_string()
}

fn launcher_cmd(bin: &Path, root: &Path, cmd: &str) {
    let out = Command::new(bin)
        .arg(cmd)
        .env("MICROVIRT_ROOT", root)
        .output()
        .unwrap();
    assert!(out.status.success(), "virt-launcher {cmd}: {out:?}");
}

/// Creates the launcher pod of VMI `name` (as the operator does, already bound to our node),
/// lays out the kubelet's pod directory for it and starts `virt-launcher pod` in it.
async fn launch(
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
async fn launch_with(
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
async fn prepare(
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
async fn pod_condition(
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
async fn gate_is(
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

const GATE: &str = "microvirt.io/vm-running";
const BOOTED: &str = "microvirt.io/guest-booted";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_paused_carries_out_control_requests_and_stops_on_sigterm() {
    let bin = tokio::task::block_in_place(launcher_bin);
    let cluster = tokio::task::block_in_place(|| {
        Cluster::start(ClusterOptions::default()).expect("starting etcd + kube-apiserver")
    });
    let kc = cluster.kubeconfig_path();
    let crds = workspace_root().join("crds").display().to_string();
    kubectl(kc, &["apply", "-f", &crds]);
    kubectl(
        kc,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/virtualmachineinstances.microvirt.io",
        ],
    );
    let deploy = workspace_root().join("deploy");
    for f in ["namespace.yaml", "handler.yaml"] {
        kubectl(kc, &["apply", "-f", &deploy.join(f).display().to_string()]);
    }
    kubectl(kc, &["create", "namespace", NS]);
    let client = admin_client(kc).await;
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);

    // The VMI, with a Ready condition owned by the operator's field manager.
    let vmi: VirtualMachineInstance = serde_json::from_value(json!({
        "apiVersion": "microvirt.io/v1alpha1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "vm1"},
        "spec": {"domain": {"memory": {"guest": "32Mi"}}}
    }))
    .unwrap();
    let vmi = vmis.create(&PostParams::default(), &vmi).await.unwrap();
    let vmi_uid = vmi.uid().unwrap();
    let operator_status = json!({
        "apiVersion": "microvirt.io/v1alpha1",
        "kind": "VirtualMachineInstance",
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True", "reason": "GuestBooted",
                            "lastTransitionTime": "2026-01-01T00:00:00Z"}]
        }
    });
    let op = PatchParams::apply("microvirt-operator").force();
    vmis.patch_status("vm1", &op, &Patch::Apply(&operator_status))
        .await
        .unwrap();

    // The launcher pod as the operator creates it, already bound to our node.
    let tmp = TempDir::new("agent");
    let (mut launcher, runtime) = launch(&pods, tmp.path(), &bin, "vm1", &vmi_uid).await;
    // A second VMI whose pod names another uid (as if the VMI had been re-created under the
    // same name while the old pod still ran): the agent must leave that VMI alone.
    let vmi2: VirtualMachineInstance = serde_json::from_value(json!({
        "apiVersion": "microvirt.io/v1alpha1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "vm2"},
        "spec": {"domain": {"memory": {"guest": "32Mi"}}}
    }))
    .unwrap();
    vmis.create(&PostParams::default(), &vmi2).await.unwrap();
    let (_launcher2, _) = launch(
        &pods,
        tmp.path(),
        &bin,
        "vm2",
        "00000000-0000-0000-0000-000000000000",
    )
    .await;

    // virt-handler as its ServiceAccount.
    let kubeconfig = std::fs::read_to_string(kc).unwrap();
    let (head, tail) = kubeconfig.split_once("    token: ").unwrap();
    let (token, rest) = tail.split_once('\n').unwrap();
    let sa_kubeconfig = tmp.join("handler.kubeconfig");
    std::fs::write(
        &sa_kubeconfig,
        format!("{head}    token: {token}\n    as: {SA}\n{rest}"),
    )
    .unwrap();
    let mut handler = Spawned::spawn(
        Command::new(env!("CARGO_BIN_EXE_virt-handler"))
            .args(["--no-device-plugin", "--node-name", NODE, "--namespace", NS])
            .arg("--kubelet-root")
            .arg(tmp.join("kubelet"))
            .env("KUBECONFIG", &sa_kubeconfig)
            .env("RUST_LOG", "info,microvirt_handler=debug"),
    );
    let diag =
        |h: &Spawned, l: &Spawned| format!("handler:\n{}\nlauncher:\n{}", h.stderr(), l.stderr());

    // 1. Running guest: Paused=False appears; the operator's Ready condition stays.
    let c = wait_for("Paused=False", || paused_is(&vmis, "vm1", "False")).await;
    assert_eq!(
        c.reason.as_deref(),
        Some("NotPaused"),
        "{}",
        diag(&handler, &launcher)
    );
    let v = vmis.get("vm1").await.unwrap();
    assert_eq!(
        condition(&v, "Ready").map(|c| c.status.as_str()),
        Some("True")
    );
    // Boot time on the pod.
    let ms = wait_for("boot-time annotation", || async {
        pods.get("virt-launcher-vm1")
            .await
            .ok()?
            .annotations()
            .get("microvirt.io/boot-time-ms")
            .cloned()
    })
    .await;
    assert!(ms.parse::<u64>().is_ok(), "{ms}");
    // The pod's readiness gate: the VM runs; this guest wrote the boot timer.
    gate_is(&pods, "virt-launcher-vm1", "True", "VMRunning").await;
    let booted = wait_for("guest-booted", || {
        pod_condition(&pods, "virt-launcher-vm1", BOOTED)
    })
    .await;
    assert_eq!(
        (booted.0.as_str(), booted.1.as_str()),
        ("True", "GuestBooted")
    );
    // vm2's launcher was followed (boot time on its pod) but its VMI was not written.
    wait_for("vm2 boot-time annotation", || async {
        pods.get("virt-launcher-vm2")
            .await
            .ok()?
            .annotations()
            .get("microvirt.io/boot-time-ms")
            .cloned()
    })
    .await;
    let v2 = vmis.get("vm2").await.unwrap();
    assert!(condition(&v2, "Paused").is_none(), "{:?}", v2.status);
    // Each manager owns only its entry.
    let managers: Vec<String> = v
        .managed_fields()
        .iter()
        .filter(|m| m.subresource.as_deref() == Some("status"))
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(
        managers.contains(&"virt-handler".to_string()),
        "{managers:?}"
    );
    assert!(
        managers.contains(&"microvirt-operator".to_string()),
        "{managers:?}"
    );

    // 2. Paused from inside the pod (what `kubectl microvirt pause` does) → Paused=True.
    let t0 = Instant::now();
    launcher_cmd(&bin, &runtime, "pause");
    let c = wait_for("Paused=True", || paused_is(&vmis, "vm1", "True")).await;
    let pause_to_condition = t0.elapsed();
    assert_eq!(c.reason.as_deref(), Some("PausedByUser"));
    // A paused VM's pod is not Ready (KubeVirt's virtual-machine-unpaused gate).
    gate_is(&pods, "virt-launcher-vm1", "False", "VMPaused").await;
    // The operator re-applies its status (without Paused): Paused stays.
    vmis.patch_status("vm1", &op, &Patch::Apply(&operator_status))
        .await
        .unwrap();
    let v = vmis.get("vm1").await.unwrap();
    assert_eq!(
        condition(&v, "Paused").map(|c| c.status.as_str()),
        Some("True")
    );
    assert_eq!(
        condition(&v, "Ready").map(|c| c.status.as_str()),
        Some("True")
    );

    // 3. The warm-pool claim path: a control request on the pod resumes the launcher.
    let t0 = Instant::now();
    let req =
        json!({"metadata": {"annotations": {"microvirt.io/control-request": "claim-1 unpause"}}});
    pods.patch(
        "virt-launcher-vm1",
        &PatchParams::default(),
        &Patch::Merge(&req),
    )
    .await
    .unwrap();
    wait_for("launcher running", || async {
        (launcher_state(&bin, &runtime) == "running").then_some(())
    })
    .await;
    let request_to_running = t0.elapsed();
    let result = wait_for("control result", || async {
        pods.get("virt-launcher-vm1")
            .await
            .ok()?
            .annotations()
            .get("microvirt.io/control-result")
            .cloned()
    })
    .await;
    assert_eq!(result, "claim-1 ok", "{}", diag(&handler, &launcher));
    wait_for("Paused=False after the claim", || {
        paused_is(&vmis, "vm1", "False")
    })
    .await;
    let request_to_condition = t0.elapsed();
    gate_is(&pods, "virt-launcher-vm1", "True", "VMRunning").await;
    eprintln!(
        "latency: pause -> VMI Paused=True {:.1} ms; control request -> launcher running {:.1} ms, -> VMI Paused=False {:.1} ms",
        pause_to_condition.as_secs_f64() * 1e3,
        request_to_running.as_secs_f64() * 1e3,
        request_to_condition.as_secs_f64() * 1e3
    );

    // 4. Bad requests are answered, not carried out.
    for (raw, want) in [
        ("r2 reboot", "r2 error unknown command \"reboot\""),
        ("r3", "r3 error malformed request"),
    ] {
        let req = json!({"metadata": {"annotations": {"microvirt.io/control-request": raw}}});
        pods.patch(
            "virt-launcher-vm1",
            &PatchParams::default(),
            &Patch::Merge(&req),
        )
        .await
        .unwrap();
        let got = wait_for("error result", || async {
            pods.get("virt-launcher-vm1")
                .await
                .ok()?
                .annotations()
                .get("microvirt.io/control-result")
                .filter(|r| r.starts_with(raw.split(' ').next().unwrap()))
                .cloned()
        })
        .await;
        assert!(got.starts_with(want), "{got}");
    }
    assert_eq!(launcher_state(&bin, &runtime), "running");

    // 5. A pause request, then the launcher exits while paused → Paused=False.
    let req = json!({"metadata": {"annotations": {"microvirt.io/control-request": "p4 pause"}}});
    pods.patch(
        "virt-launcher-vm1",
        &PatchParams::default(),
        &Patch::Merge(&req),
    )
    .await
    .unwrap();
    wait_for("Paused=True by request", || paused_is(&vmis, "vm1", "True")).await;
    launcher_cmd(&bin, &runtime, "stop");
    assert_eq!(
        tokio::task::block_in_place(|| launcher.wait(WAIT).0.code()),
        Some(5),
        "{}",
        diag(&handler, &launcher)
    );
    wait_for("Paused=False after exit", || {
        paused_is(&vmis, "vm1", "False")
    })
    .await;
    gate_is(&pods, "virt-launcher-vm1", "False", "VMStopped").await;

    // 6. SIGTERM: exit 0 with the API server up, and with the API server hung (stopped).
    let mut second = Spawned::spawn(
        Command::new(env!("CARGO_BIN_EXE_virt-handler"))
            .args(["--no-device-plugin", "--node-name", NODE, "--namespace", NS])
            .arg("--kubelet-root")
            .arg(tmp.join("kubelet"))
            .env("KUBECONFIG", &sa_kubeconfig),
    );
    second.wait_for_stderr("node agent watching", WAIT);
    handler.signal(libc::SIGTERM);
    let code = tokio::task::block_in_place(|| handler.wait(WAIT).0.code());
    assert_eq!(code, Some(0), "{}", handler.stderr());
    // Frozen (every thread stopped) until the guard drops, even if the test fails.
    let frozen = tokio::task::block_in_place(|| cluster.freeze_apiserver()).expect("apiserver");
    second.signal(libc::SIGTERM);
    let code = tokio::task::block_in_place(|| second.wait(WAIT).0.code());
    tokio::task::block_in_place(|| drop(frozen));
    assert_eq!(code, Some(0), "{}", second.stderr());
}

/// Starts a cluster with the CRDs, the handler's RBAC and namespace `NS`; returns it with an
/// admin client and a kubeconfig for the handler's ServiceAccount (in `tmp`).
async fn cluster_for_agent(tmp: &Path) -> (Cluster, Client, PathBuf) {
    let cluster = tokio::task::block_in_place(|| {
        Cluster::start(ClusterOptions::default()).expect("starting etcd + kube-apiserver")
    });
    let kc = cluster.kubeconfig_path().to_path_buf();
    let crds = workspace_root().join("crds").display().to_string();
    kubectl(&kc, &["apply", "-f", &crds]);
    kubectl(
        &kc,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/virtualmachineinstances.microvirt.io",
            "crd/virtualmachinepools.microvirt.io",
        ],
    );
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

/// The VM pool side of the agent: it publishes the node's host facts, follows a warm member
/// (a paused launcher whose pod names no VMI) when the operator claims it for a VMI — resume,
/// answer, and from then on report `Paused` for that VMI — and removes snapshot directories that
/// no pool or pod uses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_host_facts_and_unused_snapshots() {
    use k8s_openapi::api::core::v1::Node;
    use microvirt_crds::VirtualMachinePool;

    let bin = tokio::task::block_in_place(launcher_bin);
    let tmp = TempDir::new("pool-agent");
    let (_cluster, client, sa_kubeconfig) = cluster_for_agent(tmp.path()).await;
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();

    // A pool whose current snapshot is h-2.
    let pools: Api<VirtualMachinePool> = Api::namespaced(client.clone(), NS);
    let pool: VirtualMachinePool = serde_json::from_value(json!({
        "apiVersion": "microvirt.io/v1alpha1", "kind": "VirtualMachinePool",
        "metadata": {"name": "web"},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"domain": {}}}}
    }))
    .unwrap();
    let pool = pools.create(&PostParams::default(), &pool).await.unwrap();
    let pool_uid = pool.uid().unwrap();
    let status = json!({"status": {"snapshot": {
        "id": "h-2", "templateHash": "h", "attempt": 2, "phase": "Ready"}}});
    pools
        .patch_status("web", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    // Snapshot directories on the node: h-2 is current, h-0 is used by the warm member below,
    // h-1 is neither; the other pool no longer exists.
    let root = tmp.join("snapshots");
    let gone_pool = "00000000-dead-beef-0000-000000000000";
    for (uid, id) in [
        (pool_uid.as_str(), "h-0"),
        (pool_uid.as_str(), "h-1"),
        (pool_uid.as_str(), "h-2"),
        (gone_pool, "x-1"),
    ] {
        let d = root.join(uid).join(id);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("vmstate"), b"state").unwrap();
    }

    // A pool's builder: the template booted cold.
    let (mut builder, builder_rt) = launch_with(
        &pods,
        tmp.path(),
        &bin,
        "web-snap-h-0",
        json!({"app.kubernetes.io/name": "virt-launcher", "microvirt.io/pool": "web",
               "microvirt.io/pool-role": "builder", "microvirt.io/snapshot": "h-0"}),
        json!({"microvirt.io/pool-uid": pool_uid}),
        &[],
    )
    .await;
    tokio::task::block_in_place(|| builder.wait_for_stderr("guest booted", WAIT));

    let mut handler = Spawned::spawn(
        Command::new(env!("CARGO_BIN_EXE_virt-handler"))
            .args(["--no-device-plugin", "--node-name", NODE, "--namespace", NS])
            .arg("--kubelet-root")
            .arg(tmp.join("kubelet"))
            .arg("--snapshot-root")
            .arg(&root)
            .args(["--snapshot-gc-interval-secs", "1"])
            .env("KUBECONFIG", &sa_kubeconfig)
            .env("RUST_LOG", "info,microvirt_handler=debug"),
    );
    let diag =
        |h: &Spawned, l: &Spawned| format!("handler:\n{}\nlauncher:\n{}", h.stderr(), l.stderr());

    // 1. The snapshot request: the launcher writes into its snapshot mount and stays paused;
    //    the answer carries this node's host facts.
    let want = microvirt_handler::hostfacts::detect().unwrap().to_string();
    let req =
        json!({"metadata": {"annotations": {"microvirt.io/control-request": "snap-h-0 snapshot"}}});
    pods.patch(
        "virt-launcher-web-snap-h-0",
        &PatchParams::default(),
        &Patch::Merge(&req),
    )
    .await
    .unwrap();
    let t = Instant::now();
    let result = loop {
        let r = pods
            .get("virt-launcher-web-snap-h-0")
            .await
            .unwrap()
            .annotations()
            .get("microvirt.io/control-result")
            .cloned();
        if let Some(r) = r {
            break r;
        }
        assert!(
            t.elapsed() < WAIT,
            "no snapshot result\n{}",
            diag(&handler, &builder)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        result,
        format!("snap-h-0 ok {want}"),
        "{}",
        diag(&handler, &builder)
    );
    let snapshot = builder_rt.join("snapshot");
    assert!(
        snapshot.join("vmstate").is_file(),
        "no snapshot in {}",
        snapshot.display()
    );
    assert!(snapshot.join("memory").is_file());
    assert_eq!(launcher_state(&bin, &builder_rt), "paused");
    // The builder's job is done.
    launcher_cmd(&bin, &builder_rt, "stop");
    tokio::task::block_in_place(|| builder.wait(WAIT));

    // The warm member: `virt-launcher pod` restoring that snapshot paused; its pod names no
    // VMI yet. It is Ready (probe) while paused.
    let (mut launcher, runtime) = launch_with(
        &pods,
        tmp.path(),
        &bin,
        "web-abcde",
        json!({"app.kubernetes.io/name": "virt-launcher", "microvirt.io/pool": "web",
               "microvirt.io/pool-role": "warm", "microvirt.io/snapshot": "h-0"}),
        json!({"microvirt.io/pool-uid": pool_uid}),
        &[
            ("MICROVIRT_RESTORE", snapshot.clone()),
            ("MICROVIRT_RESTORE_PAUSED", PathBuf::from("1")),
        ],
    )
    .await;
    tokio::task::block_in_place(|| launcher.wait_for_stderr("restored paused", WAIT));
    assert_eq!(launcher_state(&bin, &runtime), "paused");
    // Ready to be claimed: the readiness gate is True while it waits paused (the pool counts
    // its Ready warm members), and says why.
    gate_is(&pods, "virt-launcher-web-abcde", "True", "RestoredPaused").await;

    // 1b. The node's host facts.
    let got = wait_for("host facts on the node", || async {
        nodes
            .get(NODE)
            .await
            .ok()?
            .annotations()
            .get("microvirt.io/host-facts")
            .cloned()
    })
    .await;
    assert_eq!(got, want);

    // 2. Unused snapshots go, the current one and the warm member's stay.
    wait_for("unused snapshots removed", || async {
        (!root.join(&pool_uid).join("h-1").exists() && !root.join(gone_pool).exists()).then_some(())
    })
    .await;
    assert!(root.join(&pool_uid).join("h-2/vmstate").exists());
    assert!(root.join(&pool_uid).join("h-0/vmstate").exists());

    // 3. The claim: the VMI, then the operator's patch that hands it the pod and asks for the
    //    resume (crate `microvirt-operator`, `pool::members::claim_patch`).
    let vmi: VirtualMachineInstance = serde_json::from_value(json!({
        "apiVersion": "microvirt.io/v1alpha1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "web-abcde", "labels": {"app": "web"}},
        "spec": {"domain": {}}
    }))
    .unwrap();
    let vmi = vmis.create(&PostParams::default(), &vmi).await.unwrap();
    let uid = vmi.uid().unwrap();
    // The agent follows the warm pod but writes nothing to any VMI.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(condition(&vmis.get("web-abcde").await.unwrap(), "Paused").is_none());
    assert_eq!(launcher_state(&bin, &runtime), "paused");
    let t0 = Instant::now();
    let claim = json!({"metadata": {
        "labels": {"app": "web", "microvirt.io/vmi": "web-abcde", "microvirt.io/pool-role": "claimed"},
        "annotations": {"microvirt.io/vmi-uid": uid,
                        "microvirt.io/control-request": format!("claim-{uid} unpause")}
    }});
    pods.patch(
        "virt-launcher-web-abcde",
        &PatchParams::default(),
        &Patch::Merge(&claim),
    )
    .await
    .unwrap();
    let result = wait_for("claim result", || async {
        pods.get("virt-launcher-web-abcde")
            .await
            .ok()?
            .annotations()
            .get("microvirt.io/control-result")
            .cloned()
    })
    .await;
    let to_result = t0.elapsed();
    assert_eq!(
        result,
        format!("claim-{uid} ok"),
        "{}",
        diag(&handler, &launcher)
    );
    assert_eq!(launcher_state(&bin, &runtime), "running");
    let c = wait_for("Paused=False on the claiming VMI", || {
        paused_is(&vmis, "web-abcde", "False")
    })
    .await;
    assert_eq!(c.reason.as_deref(), Some("NotPaused"));
    // Claimed and running: still Ready, now as a running VM.
    gate_is(&pods, "virt-launcher-web-abcde", "True", "VMRunning").await;
    eprintln!(
        "latency: claim patch -> control result {:.1} ms, -> VMI Paused=False {:.1} ms",
        to_result.as_secs_f64() * 1e3,
        t0.elapsed().as_secs_f64() * 1e3
    );
    // From now on the agent reports for that VMI.
    launcher_cmd(&bin, &runtime, "pause");
    wait_for("Paused=True", || paused_is(&vmis, "web-abcde", "True")).await;
    // A claimed member is a VMI's pod: paused, it is not Ready.
    gate_is(&pods, "virt-launcher-web-abcde", "False", "VMPaused").await;

    // 4. The pool and the member go: so does the member's snapshot, and the pool's directory.
    pools.delete("web", &Default::default()).await.unwrap();
    launcher_cmd(&bin, &runtime, "stop");
    tokio::task::block_in_place(|| launcher.wait(WAIT));
    for p in ["virt-launcher-web-abcde", "virt-launcher-web-snap-h-0"] {
        pods.delete(
            p,
            &kube::api::DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    }
    wait_for("the pool's snapshots removed", || async {
        (!root.join(&pool_uid).exists()).then_some(())
    })
    .await;
    assert!(root.exists());
    handler.signal(libc::SIGTERM);
    assert_eq!(
        tokio::task::block_in_place(|| handler.wait(WAIT).0.code()),
        Some(0),
        "{}",
        handler.stderr()
    );
}

/// KubeVirt's Ready without the boot timer: a guest that never signals boot (every stock
/// guest) gets its pod's readiness gate `True` once its VM runs. The gate is absent until the
/// agent has reached the launcher, follows pause/unpause and the launcher's exit, and a
/// restarted agent re-applies the launcher's current state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_gate_without_the_boot_timer() {
    let bin = tokio::task::block_in_place(launcher_bin);
    let tmp = TempDir::new("gate");
    let (_cluster, client, sa_kubeconfig) = cluster_for_agent(tmp.path()).await;
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let vmi: VirtualMachineInstance = serde_json::from_value(json!({
        "apiVersion": "microvirt.io/v1alpha1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "stock"},
        "spec": {"domain": {"memory": {"guest": "32Mi"}}}
    }))
    .unwrap();
    let uid = vmis
        .create(&PostParams::default(), &vmi)
        .await
        .unwrap()
        .uid()
        .unwrap();
    let pod = "virt-launcher-stock";
    let (mut cmd, runtime) = prepare(
        &pods,
        tmp.path(),
        &bin,
        "stock",
        json!({"app.kubernetes.io/name": "virt-launcher", "microvirt.io/vmi": "stock"}),
        json!({"microvirt.io/vmi-uid": uid}),
        &[],
        "no-boot-timer",
    )
    .await;
    let start_handler = || {
        Spawned::spawn(
            Command::new(env!("CARGO_BIN_EXE_virt-handler"))
                .args(["--no-device-plugin", "--node-name", NODE, "--namespace", NS])
                .arg("--kubelet-root")
                .arg(tmp.join("kubelet"))
                .env("KUBECONFIG", &sa_kubeconfig)
                .env("RUST_LOG", "info,microvirt_handler=debug"),
        )
    };

    // 1. The agent follows the pod, but the launcher has not started: no gate (not Ready).
    let mut handler = start_handler();
    tokio::task::block_in_place(|| handler.wait_for_stderr("waiting for the launcher", WAIT));
    assert_eq!(pod_condition(&pods, pod, GATE).await, None);

    // 2. The launcher runs a guest that never writes the boot timer: Ready anyway.
    let mut launcher = Spawned::spawn(&mut cmd);
    let diag =
        |h: &Spawned, l: &Spawned| format!("handler:\n{}\nlauncher:\n{}", h.stderr(), l.stderr());
    let (_, _, since) = gate_is(&pods, pod, "True", "VMRunning").await;
    let status: serde_json::Value = serde_json::from_slice(
        &Command::new(&bin)
            .arg("status")
            .env("MICROVIRT_ROOT", &runtime)
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert_eq!(status["state"], "running", "{}", diag(&handler, &launcher));
    assert_eq!(
        status["booted"], false,
        "the guest signalled boot: {status}"
    );
    let p = pods.get(pod).await.unwrap();
    assert_eq!(pod_condition(&pods, pod, BOOTED).await, None);
    assert!(!p.annotations().contains_key("microvirt.io/boot-time-ms"));
    // The kubelet's own conditions are not the agent's to write.
    let types: Vec<String> = p
        .status
        .unwrap()
        .conditions
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.type_)
        .collect();
    assert_eq!(types, vec![GATE.to_string()]);

    // 3. Paused → False; resumed → True again, with a new transition time.
    launcher_cmd(&bin, &runtime, "pause");
    gate_is(&pods, pod, "False", "VMPaused").await;
    launcher_cmd(&bin, &runtime, "unpause");
    let (_, _, since2) = gate_is(&pods, pod, "True", "VMRunning").await;
    assert!(since2 >= since, "{since2} < {since}");

    // 4. A restarted agent re-applies the launcher's state: here over a gate someone set wrong
    //    while no agent ran.
    handler.signal(libc::SIGTERM);
    assert_eq!(
        tokio::task::block_in_place(|| handler.wait(WAIT).0.code()),
        Some(0)
    );
    let wrong = json!({"status": {"conditions": [{"type": GATE, "status": "False",
        "reason": "SetByHand", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    pods.patch_status(pod, &PatchParams::default(), &Patch::Strategic(&wrong))
        .await
        .unwrap();
    let mut handler = start_handler();
    gate_is(&pods, pod, "True", "VMRunning").await;

    // 5. The launcher exits: False.
    launcher_cmd(&bin, &runtime, "stop");
    assert_eq!(
        tokio::task::block_in_place(|| launcher.wait(WAIT).0.code()),
        Some(5),
        "{}",
        diag(&handler, &launcher)
    );
    gate_is(&pods, pod, "False", "VMStopped").await;
    handler.signal(libc::SIGTERM);
    assert_eq!(
        tokio::task::block_in_place(|| handler.wait(WAIT).0.code()),
        Some(0),
        "{}",
        handler.stderr()
    );
}
