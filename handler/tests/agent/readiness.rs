//! The readiness gate when the guest never reports its boot (no boot timer).

use std::process::Command;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use microvirt_crds::vmi::VirtualMachineInstance;
use microvirt_testsupport::{Spawned, TempDir};
use serde_json::json;

use crate::harness::{
    cluster_for_agent, gate_is, launcher_bin, launcher_cmd, pod_condition, prepare, BOOTED, GATE,
    NODE, NS, WAIT,
};

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
