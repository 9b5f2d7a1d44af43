//! The agent reports a paused guest, carries out the control requests set on the pod, and stops
//! on SIGTERM.

use std::process::Command;
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use microvirt_crds::vmi::VirtualMachineInstance;
use microvirt_testsupport::{Cluster, ClusterOptions, Spawned, TempDir};
use serde_json::json;

use crate::harness::{
    admin_client, condition, gate_is, kubectl, launch, launcher_bin, launcher_cmd, launcher_state,
    paused_is, pod_condition, wait_for, workspace_root, BOOTED, NODE, NS, SA, WAIT,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_paused_carries_out_control_requests_and_stops_on_sigterm() {
    let bin = tokio::task::block_in_place(launcher_bin);
    let cluster = tokio::task::block_in_place(|| {
        Cluster::start(ClusterOptions::default()).expect("starting etcd + kube-apiserver")
    });
    let kc = cluster.kubeconfig_path();
    let crds = workspace_root().join("crds").display().to_string();
    kubectl(kc, &["apply", "-f", &crds]);
    microvirt_testsupport::wait_crds_established(
        kc,
        &["virtualmachineinstances.microvirt.io"],
        microvirt_testsupport::CRDS_ESTABLISHED_WITHIN,
    )
    .expect("CRDs established");
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
