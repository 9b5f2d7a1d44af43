//! From a VMI document to a [`LaunchConfig`]: kernel (or the built-in demo guest), memory,
//! vCPUs, command line, disks, console, and the paths of the run.

use std::path::{Path, PathBuf};
use std::time::Duration;

use vmm::devices::virtio::net::MacAddr;
use vmm::devices::virtio::NetConfig;
use vmm::timing::Clock;
use vmm::{SerialConfig, VmConfig};

use crate::demo::DemoKernel;
use crate::disks::{self, DiskError, Layout};
use crate::runner::{LaunchConfig, Status};
use crate::vmi::{VmiDocument, VmiError};

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error(transparent)]
    Vmi(#[from] VmiError),
    #[error(transparent)]
    Disk(#[from] DiskError),
    #[error("firmware.kernelBoot.container: {0}")]
    Kernel(String),
    #[error("the built-in demo guest: {0}")]
    Demo(std::io::Error),
    #[error("pod network: {0}")]
    Network(String),
    #[error("runtime directory {path}: {source}")]
    RuntimeDir {
        path: String,
        source: std::io::Error,
    },
}

/// Where the guest console goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Console {
    /// The launcher's stdin/stdout.
    Stdio,
    /// `<runtime dir>/console.sock`, reachable through the control socket's `console`.
    Socket,
    None,
}

/// Mode-specific choices.
#[derive(Clone, Debug)]
pub struct Options {
    pub layout: Layout,
    /// Runtime directory: sockets, overlays, cloud-init images, the booted marker (pod mode).
    pub runtime_dir: PathBuf,
    pub console: Console,
    /// With [`Console::Socket`]: also copy the guest console to stdout.
    pub console_echo: bool,
    pub control_socket: Option<PathBuf>,
    pub booted_marker: Option<PathBuf>,
    /// Overrides the VMI's terminationGracePeriodSeconds.
    pub grace: Option<Duration>,
    /// Time kept back from the grace period so the launcher exits (and reports) before the
    /// kubelet's SIGKILL.
    pub grace_reserve: Duration,
    pub seccomp: bool,
    pub announce_boot: bool,
    /// Set up the pod network (netsetup) for the VMI's interface in this network namespace.
    /// Pod mode only by default: on a host it would bridge or NAT the host's own interface.
    pub pod_network: bool,
    /// Keep the network configuration when the launcher exits (pod mode: the namespace goes
    /// away with the pod).
    pub keep_network: bool,
    /// Boot the built-in demo guest when the VMI names no `kernelBoot.container` (run mode).
    /// Pod mode never does: a VMI there always names its kernel image (the operator fills in
    /// its default), and the demo guest is asked for through an image that carries it.
    pub demo_guest: bool,
    /// Start from this snapshot instead of booting.
    pub restore: Option<Restore>,
    /// Where a `snapshot` request without a `dir` writes (pod mode: `$MICROVIRT_ROOT/snapshot`,
    /// the mount of a VM pool's snapshot directory).
    pub snapshot_dir: Option<PathBuf>,
}

/// `run --restore DIR [--paused]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restore {
    pub dir: PathBuf,
    /// Keep the restored VM paused until the control socket's `resume`.
    pub paused: bool,
}

/// A prepared launch; keep it alive until the VM has ended (it owns the demo kernel file).
pub struct Prepared {
    pub config: LaunchConfig,
    pub demo: Option<DemoKernel>,
    /// The pod network; dropping it stops the DHCP server (and, in run mode, removes it).
    pub network: Option<netsetup::NetSetup>,
}

/// Sets up the pod network for the VMI's interface (at most one) and returns the VMM's NIC.
fn setup_network(
    doc: &VmiDocument,
    opts: &Options,
) -> Result<(Option<netsetup::NetSetup>, Vec<NetConfig>, String), LaunchError> {
    let ifaces = &doc.spec.domain.devices.interfaces;
    if ifaces.is_empty() {
        return Ok((None, Vec::new(), "none".into()));
    }
    if !opts.pod_network {
        log::warn!(
            "the VMI has interfaces, but pod networking is only set up in pod mode (or with \
             --pod-network): the guest boots without a network interface"
        );
        return Ok((
            None,
            Vec::new(),
            "none (interfaces ignored outside pod mode)".into(),
        ));
    }
    let [iface] = ifaces.as_slice() else {
        return Err(LaunchError::Network(format!(
            "{} interfaces: only one is supported",
            ifaces.len()
        )));
    };
    let binding = if iface.bridge.is_some() {
        netsetup::Binding::Bridge
    } else {
        netsetup::Binding::Masquerade
    };
    let mac = match &iface.mac_address {
        Some(m) => Some(
            m.parse::<netsetup::MacAddr>()
                .map_err(|e| LaunchError::Network(e.to_string()))?,
        ),
        None => None,
    };
    let mut ports = Vec::new();
    for p in &iface.ports {
        let protocol = match p.protocol.as_deref().unwrap_or("TCP") {
            "TCP" => netsetup::Protocol::Tcp,
            "UDP" => netsetup::Protocol::Udp,
            o => return Err(LaunchError::Network(format!("port protocol {o:?}"))),
        };
        let port = u16::try_from(p.port)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| LaunchError::Network(format!("port {} out of range", p.port)))?;
        ports.push(netsetup::PortForward { protocol, port });
    }
    let env_or = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_string());
    let spec = netsetup::InterfaceSpec {
        pod_interface: env_or("MICROVIRT_POD_INTERFACE", "eth0"),
        tap_name: "tap0".into(),
        mac,
        ports,
        hostname: Some(doc.name().to_string()),
        resolv_conf: PathBuf::from(env_or("MICROVIRT_RESOLV_CONF", "/etc/resolv.conf")),
    };
    let mut setup = netsetup::setup_pod_network(binding, &spec)
        .map_err(|e| LaunchError::Network(e.to_string()))?;
    if opts.keep_network {
        setup.keep_on_drop();
    }
    let lease = setup.lease();
    let summary = format!(
        "{binding:?} tap {} mac {} guest {}/{} pod-ip {}",
        setup.tap_name(),
        setup.guest_mac(),
        lease.ip,
        lease.prefix_len,
        setup.pod_ip()
    );
    let nic = NetConfig {
        tap: setup.tap_name().to_string(),
        mac: Some(MacAddr(setup.guest_mac().0)),
    };
    Ok((Some(setup), vec![nic], summary))
}

fn kernel_path(layout: &Layout, p: &str) -> Result<PathBuf, LaunchError> {
    match layout {
        Layout::Pod { root, .. } => disks::inside(&root.join("kernel-boot"), p, "kernel-boot")
            .map_err(|e| LaunchError::Kernel(e.to_string())),
        Layout::Local { base_dir, .. } => Ok(disks::local(base_dir, p)),
    }
}

/// Prepares the disks and the VM configuration for `doc`.
pub fn prepare(doc: &VmiDocument, opts: &Options, start: Clock) -> Result<Prepared, LaunchError> {
    std::fs::create_dir_all(&opts.runtime_dir).map_err(|source| LaunchError::RuntimeDir {
        path: opts.runtime_dir.display().to_string(),
        source,
    })?;
    let mut demo = None;
    let kb = doc.kernel_boot();
    let mut vm =
        match kb.and_then(|k| k.container.as_ref()) {
            None if !opts.demo_guest => return Err(LaunchError::Kernel(
                "none given, and a pod never boots the built-in demo guest (the operator fills \
                 in its --default-kernel-image; the image microvirt/demo-kernel:dev carries the \
                 demo guest)"
                    .into(),
            )),
            None => {
                let d = DemoKernel::new().map_err(LaunchError::Demo)?;
                let vm = VmConfig::new(d.path());
                demo = Some(d);
                vm
            }
            Some(c) => {
                let k = c
                    .kernel_path
                    .as_deref()
                    .ok_or_else(|| LaunchError::Kernel("kernelPath is required".into()))?;
                let mut vm = VmConfig::new(kernel_path(&opts.layout, k)?);
                if let Some(i) = c.initrd_path.as_deref() {
                    vm.initrd = Some(kernel_path(&opts.layout, i)?);
                }
                for p in std::iter::once(&vm.kernel).chain(vm.initrd.as_ref()) {
                    if !p.is_file() {
                        return Err(LaunchError::Kernel(format!(
                            "{} is not a file",
                            p.display()
                        )));
                    }
                }
                vm
            }
        };
    vm.cmdline = kb.and_then(|k| k.kernel_args.clone());
    vm.mem_mib = doc.guest_memory_bytes()?.div_ceil(1 << 20);
    vm.vcpus = doc.vcpus();
    let console_socket = opts.runtime_dir.join("console.sock");
    vm.serial = match opts.console {
        Console::Stdio => SerialConfig::Stdio,
        Console::Socket => SerialConfig::Unix(console_socket.clone()),
        Console::None => SerialConfig::None,
    };
    let prepared = disks::prepare(doc, &opts.layout, &opts.runtime_dir)?;
    vm.disks = prepared.iter().map(|d| d.config.clone()).collect();
    vm.rng = doc
        .spec
        .domain
        .devices
        .rng
        .as_ref()
        .map(|_| vmm::devices::virtio::RngConfig::default());

    let (net_setup, nics, network) = setup_network(doc, opts)?;
    vm.nets = nics;
    let grace = opts
        .grace
        .unwrap_or_else(|| Duration::from_secs(doc.grace_period_seconds()));
    let grace = grace.saturating_sub(opts.grace_reserve.min(grace / 2));
    let status = Status {
        name: doc.name().to_string(),
        state: String::new(),
        boot_time_ms: None,
        vcpus: vm.vcpus,
        mem_mib: vm.mem_mib,
        disks: prepared
            .iter()
            .map(|d| format!("{}:{:?}:{}", d.name, d.kind, d.config))
            .collect(),
        network,
        vmm_tid: None,
    };
    Ok(Prepared {
        config: LaunchConfig {
            vm,
            name: doc.name().to_string(),
            grace,
            booted_marker: opts.booted_marker.clone(),
            control_socket: opts.control_socket.clone(),
            console_socket: (opts.console == Console::Socket).then_some(console_socket),
            console_echo: opts.console_echo,
            seccomp: opts.seccomp,
            announce_boot: opts.announce_boot,
            status,
            start,
            restore: opts.restore.clone(),
            snapshot_dir: opts.snapshot_dir.clone(),
        },
        demo,
        network: net_setup,
    })
}

/// The directory of a VMI file (for relative paths in it).
pub fn base_dir_of(vmi_file: &Path) -> PathBuf {
    let dir = vmi_file.parent().unwrap_or(Path::new("."));
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf())
}
