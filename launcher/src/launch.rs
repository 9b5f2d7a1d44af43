//! From a VMI document to a [`LaunchConfig`]: kernel (or the built-in demo guest), memory,
//! vCPUs, command line, disks, console, and the paths of the run.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use microvirt_crds::launcher_state::LauncherState;
use vmm::devices::virtio::net::MacAddr;
use vmm::devices::virtio::NetConfig;
use vmm::timing::Clock;
use vmm::{SerialConfig, VmConfig};

use crate::caps;
use crate::demo::DemoKernel;
use crate::disks::{self, DiskError, Layout};
use crate::kernel::{self, KernelError};
use crate::status::Status;
use crate::vmi::{VmiDocument, VmiError};

/// How a launch is run.
pub struct LaunchConfig {
    pub vm: VmConfig,
    pub name: String,
    pub grace: Duration,
    /// Created (with the boot time in ms) when the guest has booted.
    pub booted_marker: Option<PathBuf>,
    /// Serve the control socket here.
    pub control_socket: Option<PathBuf>,
    /// The VMM's serial socket; the launcher's console hub is its client and the control
    /// socket's `console` attaches to the hub.
    pub console_socket: Option<PathBuf>,
    /// Also copy the guest console to stdout (the terminal in `run`, the container log in pod
    /// mode).
    pub console_echo: bool,
    /// Feed stdin to the guest console (`run` on a terminal).
    pub console_stdin: bool,
    /// Stack the VM threads' tighter seccomp filters (the launcher's own is installed
    /// process-wide before this runs).
    pub seccomp: bool,
    /// Print "guest booted in N ms" on stderr.
    pub announce_boot: bool,
    pub status: Status,
    /// When VM preparation began (boot time is measured from here).
    pub start: Clock,
    /// Restore this snapshot instead of booting (the VMI's disks and NIC replace the
    /// snapshot's, in order; its memory and vCPUs must match).
    pub restore: Option<Restore>,
    /// Build the VM and leave it paused until `unpause` (`startStrategy: Paused`).
    pub start_paused: bool,
    /// Default directory of a `snapshot` request that names none.
    pub snapshot_dir: Option<PathBuf>,
    /// `/dev/kvm` and the TAP queues, opened before the launcher gave up root.
    pub kvm: Option<std::fs::File>,
    pub taps: Vec<vmm::devices::virtio::net::tap::Tap>,
}

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error(transparent)]
    Vmi(#[from] VmiError),
    #[error(transparent)]
    Disk(#[from] DiskError),
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error("pod network: {0}")]
    Network(String),
    #[error("{0}")]
    User(String),
    #[error("containerRootfs: {0}")]
    ContainerRootfs(String),
    #[error("runtime directory {path}: {source}")]
    RuntimeDir {
        path: String,
        source: std::io::Error,
    },
}

/// Where the guest console goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Console {
    /// The launcher's stdin/stdout (through the console hub, which keeps the launcher's own
    /// lines from splitting guest lines; also reachable through the control socket).
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
    /// Give a VMI without interfaces and networks the pod network's default interface
    /// ([`crate::vmi::Spec::pod_interfaces`]; run mode). Pod mode does not: the operator
    /// renders that default into the document itself.
    pub default_pod_interface: bool,
    /// Boot the built-in demo guest when the VMI names no `kernelBoot.container` (run mode).
    /// Pod mode never does: a VMI there always names its kernel image (the operator fills in
    /// its default), and the demo guest is asked for through an image that carries it.
    pub demo_guest: bool,
    /// Start from this snapshot instead of booting.
    pub restore: Option<Restore>,
    /// Where a `snapshot` request without a `dir` writes (pod mode: `$MICROVIRT_ROOT/snapshot`,
    /// the mount of a VM pool's snapshot directory).
    pub snapshot_dir: Option<PathBuf>,
    /// Pod mode: become this uid:gid once the privileged setup (pod network, opening
    /// /dev/kvm and the TAP) is done, before any volume is opened.
    pub run_as: Option<(u32, u32)>,
    /// The guest init of VMs booted from an OCI image (`containerRootfs`); None: where
    /// [`crate::oci::find_init`] looks.
    pub guest_init: Option<PathBuf>,
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
    /// The pod network (its DHCP server bound, not started); dropping it stops the DHCP
    /// server (and, unless `keep_network`, removes the network).
    pub network: Option<netsetup::NetSetup>,
    /// Files the VMM opens through `/proc/self/fd/N` (disks, kernel); keep until it has.
    pub held: Vec<File>,
}

/// Sets up the pod network for the VMI's interface (at most one) and returns the VMM's NIC.
fn setup_network(
    doc: &VmiDocument,
    opts: &Options,
) -> Result<(Option<netsetup::NetSetup>, Vec<NetConfig>, String), LaunchError> {
    // Pod mode: the operator already rendered the default interface into the document.
    let ifaces: std::borrow::Cow<'_, [crate::vmi::Interface]> = if opts.default_pod_interface {
        doc.spec.pod_interfaces()
    } else {
        std::borrow::Cow::Borrowed(&doc.spec.domain.devices.interfaces)
    };
    if ifaces.is_empty() {
        return Ok((None, Vec::new(), "none".into()));
    }
    let defaulted = doc.spec.domain.devices.interfaces.is_empty();
    if !opts.pod_network && defaulted {
        log::info!(
            "the VMI declares no interfaces: KubeVirt would give it the pod network \
             (autoattachPodInterface), which run sets up only with --pod-network: no NIC"
        );
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
    if defaulted {
        log::info!(
            "the VMI declares no interfaces: it gets the pod network by default (masquerade, \
             as KubeVirt's autoattachPodInterface)"
        );
    }
    let [iface] = &*ifaces else {
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
            m.parse::<MacAddr>()
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
        hostname: Some(doc.hostname().to_string()),
        resolv_conf: PathBuf::from(env_or("MICROVIRT_RESOLV_CONF", "/etc/resolv.conf")),
    };
    // The DHCP server only binds its port here; the launcher starts it once it has dropped
    // its capabilities and installed its seccomp filter (see `main.rs`).
    let mut setup = netsetup::prepare_pod_network(binding, &spec)
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
        mac: Some(setup.guest_mac()),
    };
    Ok((Some(setup), vec![nic], summary))
}

/// Mode of a VM pool builder's snapshot directory once the launcher has handed it to its
/// group: the launcher (after [`caps::become_user`]) writes the snapshot into it, the node
/// agent (group 107 too) removes it when no pool uses it; nobody else gets in; new files
/// keep the group (set-group-ID).
const SNAPSHOT_DIR_MODE: u32 = 0o2770;

/// Makes a VM pool builder's snapshot mount writable for the launcher's group `gid`.
///
/// The mount is a hostPath the kubelet created (root:root, 0755), and the launcher writes the
/// snapshot only after it gave up root. While it is still uid 0 it owns the directory, so it
/// may — without CAP_CHOWN or CAP_FOWNER — give it to a group it belongs to (the pod's
/// `fsGroup`, `gid`) and make it group-writable. Anything else (no such directory, a
/// read-only mount, another owner) is left as it is: a snapshot request then fails with the
/// directory's error.
fn share_snapshot_dir(dir: &Path, gid: u32) {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let Ok(m) = std::fs::metadata(dir) else {
        return;
    };
    if !m.is_dir() || (m.gid() == gid && m.mode() & 0o7777 == SNAPSHOT_DIR_MODE) {
        return;
    }
    let r = std::os::unix::fs::chown(dir, None, Some(gid)).and_then(|()| {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(SNAPSHOT_DIR_MODE))
    });
    match r {
        Ok(()) => log::info!(
            "snapshot directory {} handed to group {gid} (mode {SNAPSHOT_DIR_MODE:o})",
            dir.display()
        ),
        Err(e) => log::warn!(
            "snapshot directory {}: cannot hand it to group {gid}: {e}",
            dir.display()
        ),
    }
}

/// Prepares the disks and the VM configuration for `doc`.
pub fn prepare(doc: &VmiDocument, opts: &Options, start: Clock) -> Result<Prepared, LaunchError> {
    // The privileged part: the pod network; with `run_as`, /dev/kvm, the TAP and Block
    // claims' devices are opened now and the launcher gives up root before it touches any
    // other volume.
    let (net_setup, nics, network) = setup_network(doc, opts)?;
    let mut kvm = None;
    let mut taps = Vec::new();
    let mut block_devices = disks::BlockDevices::default();
    if let Some((uid, gid)) = opts.run_as {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            .map_err(|e| LaunchError::User(format!("opening /dev/kvm: {e}")))?;
        kvm = Some(f);
        for nic in &nics {
            let tap = vmm::devices::virtio::net::tap::Tap::open(&nic.tap)
                .map_err(|e| LaunchError::Network(e.to_string()))?;
            taps.push(tap);
        }
        block_devices = disks::open_block_devices(doc, &opts.layout)?;
        if opts.restore.is_none() {
            if let Some(dir) = &opts.snapshot_dir {
                share_snapshot_dir(dir, gid);
            }
        }
        caps::become_user(uid, gid)
            .map_err(|e| LaunchError::User(format!("becoming {uid}:{gid}: {e}")))?;
        log::info!("running as {uid}:{gid}");
    }
    std::fs::create_dir_all(&opts.runtime_dir).map_err(|source| LaunchError::RuntimeDir {
        path: opts.runtime_dir.display().to_string(),
        source,
    })?;
    let mut held = Vec::new();
    let mut prepared = disks::prepare_with(doc, &opts.layout, &opts.runtime_dir, block_devices)?;
    let chosen = kernel::choose(
        doc,
        &opts.layout,
        opts.demo_guest,
        prepared.first(),
        &opts.runtime_dir,
        opts.restore.is_none(),
    )?;
    let mut chosen = chosen;
    if opts.restore.is_none() {
        container_rootfs_boot(doc, &prepared, &mut chosen, opts, !nics.is_empty())?;
    }
    log::info!("kernel: {}", chosen.summary);
    let mut vm = VmConfig::new(&chosen.kernel);
    vm.initrd = chosen.initrd;
    vm.cmdline = chosen.cmdline;
    held.extend(chosen.held);
    let demo = chosen.demo;
    vm.mem_mib = doc.guest_memory_bytes()?.div_ceil(1 << 20);
    vm.vcpus = doc.vcpus()?;
    vm.acpi = doc.acpi();
    // A guest that runs with ACPI reboots in this process: the VMI stays Running (KubeVirt's
    // behaviour); the launcher logs and counts each reboot (`status`'s `reboots`). A guest
    // without ACPI cannot power off, so its reset ends the VM (launcher/README.md).
    vm.reboot = vmm::config::RebootPolicy::InPlaceIfAcpi;
    let console_socket = opts.runtime_dir.join("console.sock");
    vm.serial = match opts.console {
        Console::Stdio | Console::Socket => SerialConfig::Unix(console_socket.clone()),
        Console::None => SerialConfig::None,
    };
    vm.disks = prepared.iter().map(|d| d.config.clone()).collect();
    vm.rng = doc
        .spec
        .domain
        .devices
        .rng
        .as_ref()
        .map(|_| vmm::devices::virtio::RngConfig::default());
    for d in &mut prepared {
        held.append(&mut d.held);
    }

    vm.nets = nics;
    let grace = opts
        .grace
        .unwrap_or_else(|| Duration::from_secs(doc.grace_period_seconds()));
    let grace = grace.saturating_sub(opts.grace_reserve.min(grace / 2));
    let status = Status {
        name: doc.name().to_string(),
        // `run` sets it again as it starts (nothing reads it before).
        state: LauncherState::Starting,
        boot_time_ms: None,
        vcpus: vm.vcpus,
        mem_mib: vm.mem_mib,
        disks: prepared
            .iter()
            .map(|d| format!("{}:{:?}:{}", d.name, d.kind, d.shown))
            .collect(),
        network,
        vmm_tid: None,
        console: None,
        reboots: 0,
    };
    Ok(Prepared {
        config: LaunchConfig {
            vm,
            name: doc.name().to_string(),
            grace,
            booted_marker: opts.booted_marker.clone(),
            control_socket: opts.control_socket.clone(),
            console_socket: (opts.console != Console::None).then_some(console_socket),
            console_echo: opts.console_echo || opts.console == Console::Stdio,
            console_stdin: opts.console == Console::Stdio,
            seccomp: opts.seccomp,
            announce_boot: opts.announce_boot,
            status,
            start,
            restore: opts.restore.clone(),
            start_paused: opts.restore.is_none() && doc.start_paused(),
            snapshot_dir: opts.snapshot_dir.clone(),
            kvm,
            taps,
        },
        demo,
        network: net_setup,
        held,
    })
}

/// A VMI with a `containerRootfs` disk boots the chosen Linux kernel with an initramfs of the
/// launcher's: the guest init and the workload (docs/oci-images.md). `dhcp`: the VM has a NIC,
/// which the kernel configures (`ip=dhcp`) before the init runs.
fn container_rootfs_boot(
    doc: &VmiDocument,
    prepared: &[disks::PreparedDisk],
    chosen: &mut kernel::Chosen,
    opts: &Options,
    dhcp: bool,
) -> Result<(), LaunchError> {
    let err = LaunchError::ContainerRootfs;
    let mut rootfs = prepared
        .iter()
        .enumerate()
        .filter(|(_, d)| d.kind == disks::DiskKind::ContainerRootfs);
    let Some((index, disk)) = rootfs.next() else {
        return Ok(());
    };
    if rootfs.next().is_some() {
        return Err(err("only one containerRootfs disk per VMI".into()));
    }
    if chosen.demo.is_some() {
        return Err(err(
            "it boots a Linux kernel: name one with spec.domain.firmware.kernelBoot.container.kernelPath".into(),
        ));
    }
    if chosen.initrd.is_some() {
        return Err(err(
            "kernelBoot.container.initrdPath cannot be used with it: the launcher builds the initramfs (the guest init and the workload)".into(),
        ));
    }
    let letter = u8::try_from(index)
        .ok()
        .filter(|i| *i < 26)
        .map(|i| (b'a' + i) as char)
        .ok_or_else(|| err(format!("disk {:?} is beyond /dev/vdz", disk.name)))?;
    let vol = doc
        .spec
        .volumes
        .iter()
        .find(|v| v.name == disk.name)
        .and_then(|v| v.container_rootfs.as_ref())
        .ok_or_else(|| err(format!("no containerRootfs volume {:?}", disk.name)))?;
    // The configuration read with the image's files when the disk was prepared.
    let image = disk
        .image
        .as_ref()
        .ok_or_else(|| err(format!("disk {:?} has no image configuration", disk.name)))?;
    let workload = crate::oci::workload(image, vol, &format!("/dev/vd{letter}"), doc.hostname())
        .map_err(|e| err(format!("volume {:?}: {e}", disk.name)))?;
    let init = crate::oci::find_init(opts.guest_init.as_deref()).map_err(err)?;
    let init = std::fs::read(&init).map_err(|e| err(format!("{}: {e}", init.display())))?;
    let rel = PathBuf::from(format!("{}.initramfs", disk.name));
    let path = opts.runtime_dir.join(&rel);
    let mut f = crate::paths::open_beneath(&opts.runtime_dir, &rel, crate::paths::OpenMode::Create)
        .map_err(|e| err(format!("{}: {e}", path.display())))?;
    std::io::Write::write_all(&mut f, &crate::oci::initramfs(&init, &workload))
        .map_err(|e| err(format!("{}: {e}", path.display())))?;
    chosen.initrd = Some(crate::paths::proc_path(&f));
    chosen.held.push(f);
    // The initramfs is the root: no root= (the init mounts the image); the kernel's DHCP
    // client configures the NIC and leaves the lease's name servers for the init.
    let mut args: Vec<&str> = chosen
        .cmdline
        .as_deref()
        .unwrap_or("")
        .split_ascii_whitespace()
        .filter(|w| !w.starts_with("root=") && !w.starts_with("rdinit=") && !w.starts_with("ip="))
        .collect();
    args.push("rdinit=/init");
    if dhcp {
        args.push("ip=dhcp");
    }
    chosen.cmdline = Some(args.join(" "));
    chosen.summary = format!(
        "{} with the guest init; workload {:?} on /dev/vd{letter}",
        chosen.summary, workload.argv
    );
    Ok(())
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
