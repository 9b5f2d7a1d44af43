//! The `virt-operator` binary itself: flags, leader election, /healthz, /readyz, /metrics,
//! reconciling, and a clean exit on SIGTERM.

mod common;

use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result};
use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::Api;
use microvirt_crds::VirtualMachineInstance;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn http_get(addr: SocketAddr, path: &str) -> Result<String> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn virt_operator_binary_leads_serves_health_and_reconciles() -> Result<()> {
    let cluster = tokio::task::block_in_place(start_cluster);
    let kc = cluster.kubeconfig_path();
    install_crds(kc)?;
    let client = client_for(kc).await?;
    for ns in ["bin", "microvirt"] {
        let (ok, _, err) = kubectl(kc, &["create", "namespace", ns], None)?;
        assert!(ok, "{err}");
    }
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let mut child = Command::new(env!("CARGO_BIN_EXE_virt-operator"))
        .env("KUBECONFIG", kc)
        .env("RUST_LOG", "warn")
        .args([
            "--leader-elect",
            "--identity=bin-test",
            "--launcher-image=example/launcher:1",
            "--launcher-memory-overhead=16Mi",
            "--namespace=bin",
            &format!("--metrics-addr={addr}"),
        ])
        .stdout(Stdio::null())
        .spawn()
        .context("starting virt-operator")?;

    let health = wait_for("/healthz", WAIT, || async {
        Ok(http_get(addr, "/healthz").await.ok())
    })
    .await?;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    wait_for("/readyz 200", WAIT, || async {
        Ok(http_get(addr, "/readyz")
            .await
            .ok()
            .filter(|r| r.starts_with("HTTP/1.1 200")))
    })
    .await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "microvirt");
    let lease = leases.get("microvirt-operator").await?;
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("bin-test")
    );

    // It reconciles with the flags it was given.
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), "bin");
    vmis.create(&PostParams::default(), &vmi("b1", &[])).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "bin");
    let pod = wait_for("launcher pod", WAIT, || async {
        Ok(pods.get_opt("virt-launcher-b1").await?)
    })
    .await?;
    let c = &pod.spec.context("spec")?.containers[0];
    assert_eq!(c.image.as_deref(), Some("example/launcher:1"));
    let req = c
        .resources
        .clone()
        .unwrap_or_default()
        .requests
        .unwrap_or_default();
    assert_eq!(req.get("memory").map(|q| q.0.as_str()), Some("144Mi"));
    let metrics = http_get(addr, "/metrics").await?;
    assert!(
        metrics.contains("microvirt_operator_reconciles_total{controller=\"vmi\"}"),
        "{metrics}"
    );

    // SIGTERM: a clean exit.
    // SAFETY: kill(2) on the pid of a child this test spawned and has not reaped yet.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            anyhow::bail!("virt-operator did not exit within 20 s of SIGTERM");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "exit status {status}");
    // It released the Lease on the way out, so a standby need not wait for it to expire.
    let spec = leases
        .get("microvirt-operator")
        .await?
        .spec
        .unwrap_or_default();
    assert_eq!(
        spec.holder_identity.as_deref().unwrap_or(""),
        "",
        "{spec:?}"
    );
    assert_eq!(spec.lease_duration_seconds, Some(1));
    Ok(())
}
