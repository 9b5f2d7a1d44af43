//! VM pools: the node's host facts, a warm member claimed for a VMI, and snapshot directories no
//! pool or pod uses removed.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use microvirt_crds::vmi::VirtualMachineInstance;
use microvirt_testsupport::{Spawned, TempDir};
use serde_json::json;

use crate::harness::{
    cluster_for_agent, condition, gate_is, launch_with, launcher_bin, launcher_cmd, launcher_state,
    paused_is, wait_for, NODE, NS, WAIT,
};

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
