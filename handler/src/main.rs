//! `virt-handler`: microvirt's node agent and kubelet device plugin (one per node, DaemonSet).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use clap::Parser;
use microvirt_handler::agent::{self, AgentConfig};
use microvirt_handler::deviceplugin::{self, PluginConfig};
use microvirt_handler::hostfacts;
use microvirt_handler::shutdown;
use microvirt_handler::snapshots::{self, GcConfig};

/// microvirt's per-node agent: a kubelet device plugin that advertises
/// devices.microvirt.io/kvm (and injects /dev/kvm + /dev/net/tun into launcher containers),
/// and the node agent that reports launcher state (VMI Paused condition, boot time) and carries
/// out the operator's pause/unpause requests.
///
/// SIGTERM/SIGINT: stop and exit 0 within --shutdown-timeout; a second signal exits at once
/// (status 130).
#[derive(Parser, Debug)]
#[command(name = "virt-handler", version)]
struct Args {
    /// This node's name (the DaemonSet passes spec.nodeName through the downward API).
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// Do not run the device plugin.
    #[arg(long)]
    no_device_plugin: bool,
    /// Do not run the node agent (no API server needed then).
    #[arg(long)]
    no_node_agent: bool,
    /// The kubelet's device-plugin directory.
    #[arg(long, default_value = deviceplugin::DEFAULT_PLUGIN_DIR)]
    device_plugin_dir: PathBuf,
    /// The kubelet's registration socket [default: <device-plugin-dir>/kubelet.sock].
    #[arg(long)]
    kubelet_socket: Option<PathBuf>,
    /// File name of this plugin's socket in the device-plugin directory.
    #[arg(long, default_value = deviceplugin::DEFAULT_ENDPOINT)]
    endpoint: String,
    /// Extended resource to advertise.
    #[arg(long, default_value = deviceplugin::RESOURCE_NAME)]
    resource_name: String,
    /// Shareable devices to advertise (launchers per node).
    #[arg(long, default_value_t = 1000)]
    devices: u32,
    /// Host path of the KVM device (health-checked; injected as /dev/kvm).
    #[arg(long, default_value = "/dev/kvm")]
    kvm_device: PathBuf,
    /// Host path of the TUN device (health-checked; injected as /dev/net/tun).
    #[arg(long, default_value = "/dev/net/tun")]
    tun_device: PathBuf,
    /// Where the host's root is mounted for the device health check: the devices are looked
    /// for at <root>/<--kvm-device> and <root>/<--tun-device> (a container mounts the host's
    /// /dev at <root>/dev).
    #[arg(long, default_value = "/")]
    device_check_root: PathBuf,
    /// How often device health and the plugin sockets are checked, in ms.
    #[arg(long, default_value_t = 1000)]
    poll_interval_ms: u64,
    /// The kubelet's root directory as seen by this process (launcher sockets are found under
    /// <root>/pods/<pod uid>/volumes/kubernetes.io~empty-dir/<runtime volume>/).
    #[arg(long, default_value = "/var/lib/kubelet")]
    kubelet_root: PathBuf,
    /// Name of the launcher pod's runtime emptyDir.
    #[arg(long, default_value = agent::RUNTIME_VOLUME)]
    runtime_volume: String,
    /// Watch launcher pods in this namespace only (default: all).
    #[arg(long)]
    namespace: Option<String>,
    /// Delay before reconnecting to a launcher or retrying a failed write (doubling up to 5 s
    /// while writes keep failing), in ms.
    #[arg(long, default_value_t = 200)]
    retry_ms: u64,
    /// Longest wait for the tasks to stop after the first signal, in ms.
    #[arg(long, default_value_t = 5000)]
    shutdown_timeout_ms: u64,
    /// Where VM pool snapshots live (the host's /var/lib/microvirt/snapshots as mounted into
    /// this process); unused ones are removed.
    #[arg(long, default_value = microvirt_crds::pool::SNAPSHOT_ROOT)]
    snapshot_root: PathBuf,
    /// Sweep for unused snapshots at least this often, in seconds.
    #[arg(long, default_value_t = 60)]
    snapshot_gc_interval_secs: u64,
    /// Do not publish this host's facts (`microvirt.io/host-facts`) on its Node.
    #[arg(long)]
    no_host_facts: bool,
}

async fn run(args: Args) -> Result<()> {
    if args.no_device_plugin && args.no_node_agent {
        bail!("--no-device-plugin and --no-node-agent together leave nothing to run");
    }
    let (trigger, stop) = shutdown::channel();
    shutdown::on_signals(trigger.clone()).context("installing signal handlers")?;
    let mut tasks: Vec<(&str, tokio::task::JoinHandle<Result<()>>)> = Vec::new();

    if !args.no_device_plugin {
        let mut cfg = PluginConfig::new(&args.device_plugin_dir);
        if let Some(s) = &args.kubelet_socket {
            cfg.kubelet_socket = s.clone();
        }
        cfg.endpoint = args.endpoint.clone();
        cfg.resource_name = args.resource_name.clone();
        cfg.devices = args.devices;
        cfg.kvm_device = args.kvm_device.clone();
        cfg.tun_device = args.tun_device.clone();
        cfg.check_root = args.device_check_root.clone();
        cfg.poll_interval = Duration::from_millis(args.poll_interval_ms);
        let stop = stop.clone();
        tasks.push((
            "device plugin",
            tokio::spawn(async move { Ok(deviceplugin::run(cfg, stop).await?) }),
        ));
    }
    if !args.no_node_agent {
        let Some(node) = args.node_name.clone().filter(|n| !n.is_empty()) else {
            bail!("the node agent needs --node-name (or NODE_NAME); --no-node-agent runs only the device plugin");
        };
        let client = kube::Client::try_default()
            .await
            .context("building the Kubernetes client (in-cluster or KUBECONFIG)")?;
        let mut cfg = AgentConfig::new(node.clone());
        cfg.kubelet_root = args.kubelet_root.clone();
        cfg.runtime_volume = args.runtime_volume.clone();
        cfg.namespace = args.namespace.clone();
        cfg.retry = Duration::from_millis(args.retry_ms.max(1));
        if !args.no_host_facts {
            match hostfacts::detect() {
                Ok(f) => {
                    tracing::info!("host facts: {f}");
                    cfg.host_facts = Some(f.to_string());
                    // Not fatal: pools then skip the check against this node (the VMM still
                    // checks the CPU when it restores).
                    if let Err(e) = hostfacts::publish(&client, &node, &f).await {
                        tracing::warn!("{e}");
                    }
                }
                Err(e) => tracing::warn!("{e}"),
            }
        }
        let gc = GcConfig {
            root: args.snapshot_root.clone(),
            node_name: node,
            interval: Duration::from_secs(args.snapshot_gc_interval_secs.max(1)),
        };
        let gc_client = client.clone();
        let gc_stop = stop.clone();
        tasks.push((
            "snapshot collector",
            tokio::spawn(async move {
                snapshots::run(gc_client, gc, gc_stop).await;
                Ok(())
            }),
        ));
        let stop = stop.clone();
        tasks.push((
            "node agent",
            tokio::spawn(async move { Ok(agent::run(client, cfg, stop).await?) }),
        ));
    }

    // Run until a signal, or until one part fails (then stop the others too).
    let mut failure = None;
    let mut pending = tasks;
    while !pending.is_empty() && !stop.is_set() {
        let (idx, res) = {
            let futs = pending.iter_mut().map(|(_, h)| h);
            let (res, idx, _) = tokio::select! {
                r = futures::future::select_all(futs) => r,
                _ = stop.wait() => break,
            };
            (idx, res)
        };
        let (name, _) = pending.remove(idx);
        match res {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                failure = Some(e.context(name));
                break;
            }
            Err(e) => {
                failure = Some(anyhow::anyhow!("{name} panicked: {e}"));
                break;
            }
        }
    }
    // Bounded shutdown of what is left.
    trigger.fire();
    let deadline = Duration::from_millis(args.shutdown_timeout_ms);
    let waited = tokio::time::timeout(deadline, async {
        for (name, h) in pending.iter_mut() {
            if let Ok(Err(e)) = h.await {
                tracing::warn!("{name}: {e:#}");
            }
        }
    })
    .await;
    if waited.is_err() {
        tracing::warn!(
            "tasks still busy after {} ms: exiting anyway",
            deadline.as_millis()
        );
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("virt-handler: starting the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let r = rt.block_on(run(args));
    // Tasks that ignore the deadline (a hung API call) must not keep the process alive.
    rt.shutdown_timeout(Duration::from_millis(100));
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("virt-handler: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
