//! `virt-operator`: runs microvirt's controllers.
//!
//! Shutdown (first SIGTERM/SIGINT): the controllers take no new work, running reconciles get a
//! short deadline, the Lease is released if the API server answers in time, and the process exits
//! 0 within a few seconds whatever the API server does; a second signal exits at once
//! (status 128 + signal number). Errors are one line on stderr, naming the flag to change.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::Parser;
use microvirt_crds::quantity::parse_bytes;
use microvirt_operator::config::{
    Config, DefaultBinding, KvmMode, DEFAULT_KERNEL_ARGS, DEFAULT_KERNEL_IMAGE,
    DEFAULT_LAUNCHER_IMAGE,
};
use microvirt_operator::controller::run::{run, RunOptions};
use microvirt_operator::health::{Health, Role};
use microvirt_operator::leader::{LeaderConfig, LeaderElector};
use microvirt_operator::metrics::Metrics;
use microvirt_operator::shutdown::{self, RELEASE_TIMEOUT};

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
    /// Local disk for the launcher's runtime files (a quantity; ephemeral-storage).
    #[arg(long, env = "MICROVIRT_LAUNCHER_SCRATCH", default_value = "64Mi")]
    launcher_scratch: String,
    /// Local disk each writable containerDisk's copy-on-write overlay may take (a quantity;
    /// ephemeral-storage).
    #[arg(long, env = "MICROVIRT_CONTAINER_DISK_OVERLAY", default_value = "2Gi")]
    container_disk_overlay: String,
    /// Fallback kernelBoot image for VMIs without firmware.kernelBoot.container whose boot
    /// disk has no kernel of its own (kernel at /boot/vmlinux inside it); empty: such VMIs
    /// boot their disk's kernel or fail (NoBootableKernel).
    #[arg(long, env = "MICROVIRT_DEFAULT_KERNEL_IMAGE", default_value = DEFAULT_KERNEL_IMAGE)]
    default_kernel_image: String,
    /// Command line of the fallback kernel when the VMI gives no kernelArgs (root= is
    /// replaced by the image's root partition on a partitioned boot disk).
    #[arg(long, default_value = DEFAULT_KERNEL_ARGS)]
    default_kernel_args: String,
    /// Binding of the pod network interface that VMIs without interfaces and networks get
    /// (as KubeVirt's autoattachPodInterface).
    #[arg(
        long,
        env = "MICROVIRT_DEFAULT_NETWORK_INTERFACE",
        value_enum,
        default_value = "masquerade"
    )]
    default_network_interface: DefaultBinding,
    /// Seconds a VM waits before its next VMI after one failed before it ran (KubeVirt's
    /// back-off: n² times this for the n-th failure in a row, plus up to half again, at most
    /// 30 times this).
    #[arg(
        long,
        env = "MICROVIRT_VM_START_BACKOFF_SECONDS",
        default_value_t = 10.0
    )]
    vm_start_backoff_seconds: f64,
    /// Watch only this namespace (default: all).
    #[arg(long, env = "MICROVIRT_WATCH_NAMESPACE")]
    namespace: Option<String>,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Run controllers only while holding the Lease.
    #[arg(long, env = "MICROVIRT_LEADER_ELECT", default_value_t = false)]
    leader_elect: bool,
    /// How long the Lease is valid without renewal (e.g. 15s, 1500ms).
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    leader_elect_lease_duration: Duration,
    /// How long the leader keeps leading without renewing; shorter than the lease duration.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    leader_elect_renew_deadline: Duration,
    /// How often the leader renews and a standby retries.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    leader_elect_retry_period: Duration,
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

/// `15s`, `1500ms`, `2m`.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration (examples: 15s, 1500ms, 2m)");
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map_or((s, ""), |i| s.split_at(i));
    let n: u64 = num.parse().map_err(|_| bad())?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => n.checked_mul(60).map(Duration::from_secs).ok_or_else(bad),
        _ => Err(bad()),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("virt-operator: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(operate(args));
    // Tasks still waiting on the API server must not hold the exit up.
    runtime.shutdown_timeout(Duration::from_millis(200));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("virt-operator: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn operate(args: Args) -> Result<()> {
    let shutdown = shutdown::install()?;
    let config = Config {
        launcher_image: args.launcher_image.clone(),
        launcher_memory_overhead: parse_bytes(&args.launcher_memory_overhead)
            .context("--launcher-memory-overhead")?,
        kvm_mode: args.kvm_mode,
        default_guest_memory: parse_bytes(&args.default_guest_memory)
            .context("--default-guest-memory")?,
        launcher_scratch: parse_bytes(&args.launcher_scratch).context("--launcher-scratch")?,
        container_disk_overlay: parse_bytes(&args.container_disk_overlay)
            .context("--container-disk-overlay")?,
        default_kernel_image: Some(args.default_kernel_image.clone()).filter(|s| !s.is_empty()),
        default_kernel_args: args.default_kernel_args.clone(),
        default_network_interface: args.default_network_interface,
        vm_start_backoff: std::time::Duration::try_from_secs_f64(args.vm_start_backoff_seconds)
            .context("--vm-start-backoff-seconds")?,
        ..Config::default()
    };
    let identity = args
        .identity
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("virt-operator-{}", std::process::id()));
    let mut leader_cfg = LeaderConfig::new(&args.lease_name, &args.lease_namespace, &identity);
    leader_cfg.lease_duration = args.leader_elect_lease_duration;
    leader_cfg.renew_deadline = args.leader_elect_renew_deadline;
    leader_cfg.retry_period = args.leader_elect_retry_period;
    if args.leader_elect {
        leader_cfg.validate().context(
            "--leader-elect-lease-duration / --leader-elect-renew-deadline / --leader-elect-retry-period",
        )?;
    }

    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::new());
    let (addr, server) =
        microvirt_operator::http::serve(args.metrics_addr, metrics.clone(), health.clone()).await?;
    tracing::info!("serving /metrics, /healthz, /readyz on {addr}");
    tokio::spawn(server);

    let client = tokio::select! {
        c = kube::Client::try_default() => {
            c.context("building the Kubernetes client (in-cluster or KUBECONFIG)")?
        }
        _ = shutdown.signalled() => return Ok(()),
    };
    let opts = RunOptions {
        namespace: args.namespace.clone(),
        instance: Some(identity.clone()),
        ..RunOptions::default()
    };
    let caches = health.caches_filled();

    if !args.leader_elect {
        health.set_role(Role::Leading);
        run(client, config, metrics, opts, caches, shutdown.signalled()).await;
        health.set_role(Role::Stopping);
        return Ok(());
    }

    let elector = LeaderElector::new(client.clone(), leader_cfg);
    tokio::select! {
        _ = elector.acquire(|| { health.set_role(Role::Standby); }) => {}
        _ = shutdown.signalled() => {
            health.set_role(Role::Stopping);
            return Ok(());
        }
    }
    health.set_role(Role::Leading);
    let lost = tokio::select! {
        _ = run(client, config, metrics, opts, caches, shutdown.signalled()) => None,
        lost = elector.hold() => Some(lost),
    };
    health.set_role(Role::Stopping);
    match lost {
        // Leadership ended without a shutdown request: stop at once (the controllers are
        // dropped with the select) and exit non-zero, to be restarted as a standby.
        Some(e) if !shutdown.requested() => Err(e).context("leader election"),
        Some(e) => {
            tracing::warn!("leadership ended while shutting down: {e}");
            Ok(())
        }
        None => {
            match elector.release(RELEASE_TIMEOUT).await {
                Ok(()) => tracing::info!("released the lease"),
                Err(e) => tracing::warn!("not releasing the lease: {e}"),
            }
            Ok(())
        }
    }
}
