//! `virt-operator`: runs microvirt's controllers.

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::Parser;
use futures::FutureExt;
use microvirt_crds::quantity::parse_bytes;
use microvirt_operator::config::{Config, KvmMode, DEFAULT_LAUNCHER_IMAGE};
use microvirt_operator::controller::{run, RunOptions};
use microvirt_operator::leader::{LeaderConfig, LeaderElector};
use microvirt_operator::metrics::Metrics;

/// microvirt's operator: maps VirtualMachineInstance, VirtualMachine,
/// VirtualMachineInstanceReplicaSet and VirtualMachineInstancePreset onto virt-launcher pods.
#[derive(Parser, Debug)]
#[command(name = "virt-operator", version)]
struct Args {
    /// Image of the launcher container.
    #[arg(long, env = "MICROVIRT_LAUNCHER_IMAGE", default_value = DEFAULT_LAUNCHER_IMAGE)]
    launcher_image: String,
    /// Memory the launcher needs on top of guest memory (a quantity).
    #[arg(long, env = "MICROVIRT_LAUNCHER_OVERHEAD", default_value = "32Mi")]
    launcher_memory_overhead: String,
    /// How launcher pods get /dev/kvm and /dev/net/tun.
    #[arg(
        long,
        env = "MICROVIRT_KVM_MODE",
        value_enum,
        default_value = "device-plugin"
    )]
    kvm_mode: KvmMode,
    /// Guest memory for VMIs that name none (a quantity).
    #[arg(long, default_value = "128Mi")]
    default_guest_memory: String,
    /// Watch only this namespace (default: all).
    #[arg(long, env = "MICROVIRT_WATCH_NAMESPACE")]
    namespace: Option<String>,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Run controllers only while holding the Lease.
    #[arg(long, env = "MICROVIRT_LEADER_ELECT", default_value_t = false)]
    leader_elect: bool,
    /// Namespace of the Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "microvirt")]
    lease_namespace: String,
    /// Name of the Lease.
    #[arg(long, default_value = "microvirt-operator")]
    lease_name: String,
    /// Identity in the Lease (default: the pod name, else the host name).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => futures::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .init();
    let args = Args::parse();
    let config = Config {
        launcher_image: args.launcher_image.clone(),
        launcher_memory_overhead: parse_bytes(&args.launcher_memory_overhead)
            .context("--launcher-memory-overhead")?,
        kvm_mode: args.kvm_mode,
        default_guest_memory: parse_bytes(&args.default_guest_memory)
            .context("--default-guest-memory")?,
        ..Config::default()
    };
    let client = kube::Client::try_default()
        .await
        .context("building the Kubernetes client (in-cluster or KUBECONFIG)")?;
    let metrics = Arc::new(Metrics::new());
    let ready = Arc::new(AtomicBool::new(false));
    let (addr, server) =
        microvirt_operator::http::serve(args.metrics_addr, metrics.clone(), ready.clone()).await?;
    tracing::info!("serving /metrics, /healthz, /readyz on {addr}");
    tokio::spawn(server);

    let identity = args
        .identity
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("virt-operator-{}", std::process::id()));
    let shutdown = shutdown_signal().shared();
    let opts = RunOptions {
        namespace: args.namespace.clone(),
        instance: Some(identity.clone()),
    };

    if args.leader_elect {
        let elector = LeaderElector::new(
            client.clone(),
            LeaderConfig {
                name: args.lease_name.clone(),
                namespace: args.lease_namespace.clone(),
                identity,
                lease_duration: Duration::from_secs(15),
                renew_every: Duration::from_secs(5),
            },
        );
        tokio::select! {
            _ = elector.acquire() => {}
            _ = shutdown.clone() => return Ok(()),
        }
        tokio::select! {
            _ = run(client, config, metrics, opts, ready, shutdown.clone()) => Ok(()),
            lost = elector.hold() => Err(lost).context("leader election"),
        }
    } else {
        run(client, config, metrics, opts, ready, shutdown).await;
        Ok(())
    }
}
