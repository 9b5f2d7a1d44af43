//! From a VMI document to a [`LaunchConfig`]: kernel (or the built-in demo guest), memory,
//! vCPUs, command line, disks, console, and the paths of the run.

use std::path::{Path, PathBuf};
use std::time::Duration;

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
    pub control_socket: Option<PathBuf>,
    pub booted_marker: Option<PathBuf>,
    /// Overrides the VMI's terminationGracePeriodSeconds.
    pub grace: Option<Duration>,
    /// Time kept back from the grace period so the launcher exits (and reports) before the
    /// kubelet's SIGKILL.
    pub grace_reserve: Duration,
    pub seccomp: bool,
    pub announce_boot: bool,
}

/// A prepared launch; keep it alive until the VM has ended (it owns the demo kernel file).
pub struct Prepared {
    pub config: LaunchConfig,
    pub demo: Option<DemoKernel>,
}

fn kernel_path(layout: &Layout, p: &str) -> Result<PathBuf, LaunchError> {
    match layout {
        Layout::Pod { root } => disks::inside(&root.join("kernel-boot"), p, "kernel-boot")
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
    let mut vm = match kb.and_then(|k| k.container.as_ref()) {
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

    let network = if doc.spec.domain.devices.interfaces.is_empty() && doc.spec.networks.is_empty() {
        "none".to_string()
    } else {
        log::warn!(
            "the VMI has interfaces/networks, but this launcher has no pod networking yet: \
             the guest boots without a network interface"
        );
        "none (interfaces ignored: pod networking is not implemented yet)".to_string()
    };
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
            seccomp: opts.seccomp,
            announce_boot: opts.announce_boot,
            status,
            start,
        },
        demo,
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
