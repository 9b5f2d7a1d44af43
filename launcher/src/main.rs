//! `virt-launcher`: one VirtualMachineInstance per process, with the VMM embedded.

use std::io::Write;

use clap::{Parser, Subcommand, ValueEnum};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc::channel;
use std::time::Duration;

use launcher::disks::{Layout, PVC_DEVICE_DIR};
use launcher::launch::{self, Console, Options};
use launcher::runner::{self, exit_code, Outcome};
use launcher::vmi::VmiDocument;
use launcher::{caps, console, control, paths, seccomp, teardown};
use microvirt_crds::launcher_document;
use microvirt_crds::termination::Reason;
use vmm::timing::Clock;

/// Runs one VirtualMachineInstance in this process with the embedded microvirt VMM.
#[derive(Parser, Debug)]
#[command(
    name = "virt-launcher",
    version,
    after_help = "Exit status: 0 guest shut down (reset or power-off); 1 guest crashed or VMM \
                  failure; 2 bad usage or invalid VMI; 3 setup failed (disks, kernel, KVM); 4 \
                  guest ignored the shutdown request, stopped after the grace period; 5 stopped \
                  on request."
)]
struct Cli {
    /// Log level: off, error, warn, info, debug or trace.
    #[arg(
        long,
        global = true,
        env = "MICROVIRT_LOG_LEVEL",
        default_value = "info",
        value_name = "LEVEL"
    )]
    log_level: log::LevelFilter,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Boot a VMI (YAML or JSON) on this machine, its console on this terminal.
    ///
    /// Ctrl-C or SIGTERM asks the guest to shut down (the ACPI power button when the guest armed
    /// it, else Ctrl-Alt-Del) and stops it after the grace period (terminationGracePeriodSeconds,
    /// default 30 s); a second signal stops it at once. A VMI without
    /// firmware.kernelBoot.container boots the kernel its first disk's boot configuration names
    /// (GRUB, BLS, extlinux) when that disk has one, else the built-in demo guest (run only; pod
    /// never does); its kernelArgs
    /// pick a scenario (testguest.scenario=echo|ctrlaltdel|halt-forever|blk|...). Local files:
    /// kernelPath/initrdPath and containerDisk.path are paths on this machine (absolute, or
    /// relative to the VMI file's directory; images are not pulled); a persistentVolumeClaim's
    /// claimName is a path when it contains '/', else a name under --pvc-root; a directory
    /// means its disk.img. Interfaces are ignored (no NIC) unless --pod-network; a VMI without
    /// interfaces and networks gets KubeVirt's default, a masquerade interface on the pod
    /// network (autoattachPodInterface: false turns it off).
    Run(RunArgs),
    /// The launcher pod's entry point (docs/launcher-pod.md).
    ///
    /// Environment: MICROVIRT_VMI_FILE (default /var/run/microvirt/vmi/vmi.json), MICROVIRT_ROOT
    /// (default /var/run/microvirt: mounts, sockets, booted marker), MICROVIRT_TERMINATION_LOG
    /// (default /dev/termination-log), MICROVIRT_POD_INTERFACE (default eth0),
    /// MICROVIRT_RESOLV_CONF (default /etc/resolv.conf), MICROVIRT_RESTORE (a snapshot
    /// directory: restore it instead of booting, as run --restore does),
    /// MICROVIRT_RESTORE_PAUSED=1 (stay paused until `unpause`: a VM pool's warm member; the
    /// booted marker is written once restored).
    Pod,
    /// Exit 0 once the guest has booted ($MICROVIRT_ROOT/booted exists). A local check: the
    /// launcher pod's readiness is the node agent's readiness gate, not a probe.
    Probe {
        #[arg(value_enum)]
        what: ProbeWhat,
    },
    /// Print the launcher's status (control socket).
    Status(SocketArg),
    /// Pause the vCPUs.
    Pause(SocketArg),
    /// Resume paused vCPUs.
    #[command(alias = "resume")]
    Unpause(SocketArg),
    /// Ask the guest to shut down (hard stop after the grace period).
    Shutdown(SocketArg),
    /// Stop the VM now.
    Stop(SocketArg),
    /// Attach to the guest console (Ctrl-] detaches).
    Console(SocketArg),
    /// Print where each vCPU is and what it waits for (registers, LAPIC timer, pending
    /// vectors) and the IOAPIC's pins: for a guest that stopped making progress.
    VcpuState(SocketArg),
    /// Pause the VM and write a snapshot into DIR (absent or empty); the VM stays paused
    /// (`resume` continues it). Format: docs/snapshot.md.
    Snapshot {
        /// The snapshot directory.
        dir: PathBuf,
        #[command(flatten)]
        socket: SocketArg,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ProbeWhat {
    /// The guest has booted.
    Ready,
}

#[derive(clap::Args, Debug)]
struct SocketArg {
    /// The control socket [default: $MICROVIRT_ROOT/control.sock]
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ConsoleArg {
    /// This terminal (stdin/stdout).
    Stdio,
    /// A socket: attach with `virt-launcher console` (needs --control-socket).
    Socket,
    /// No console.
    None,
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// The VMI manifest (YAML or JSON).
    vmi: PathBuf,
    /// Seconds the guest gets to shut down (overrides terminationGracePeriodSeconds).
    #[arg(long, value_name = "SECS", value_parser = parse_grace)]
    grace_period: Option<Duration>,
    /// Where the guest console goes.
    #[arg(long, value_enum, default_value = "stdio")]
    console: ConsoleArg,
    /// Serve the control socket here.
    #[arg(long, value_name = "PATH")]
    control_socket: Option<PathBuf>,
    /// Keep overlays, cloud-init images and emptyDisks here [default: a temporary directory
    /// removed at exit]
    #[arg(long, value_name = "DIR")]
    runtime_dir: Option<PathBuf>,
    /// Where persistentVolumeClaim names are looked up [default: the VMI file's directory]
    #[arg(long, value_name = "DIR")]
    pvc_root: Option<PathBuf>,
    /// Write the termination message here, as in pod mode.
    #[arg(long, value_name = "PATH")]
    termination_log: Option<PathBuf>,
    /// Set up the VMI's interface as in a pod (masquerade/bridge on MICROVIRT_POD_INTERFACE,
    /// default eth0) in this network namespace, and remove it at exit. Only inside a
    /// dedicated network namespace: on a host it would bridge or NAT the host's interface.
    #[arg(long)]
    pod_network: bool,
    /// No seccomp filters (debugging only).
    #[arg(long)]
    no_seccomp: bool,
    /// Keep the launcher's capabilities (debugging only).
    #[arg(long)]
    keep_caps: bool,
    /// Start from the snapshot in DIR instead of booting.
    #[arg(long, value_name = "DIR")]
    restore: Option<PathBuf>,
    /// With --restore: keep the VM paused until `resume`.
    #[arg(long, requires = "restore")]
    paused: bool,
    /// The guest init (static) of a VMI with a containerRootfs volume [default: microvirt-init
    /// next to virt-launcher]
    #[arg(long, value_name = "PATH", env = "MICROVIRT_GUEST_INIT")]
    guest_init: Option<PathBuf>,
}

fn parse_grace(v: &str) -> Result<Duration, String> {
    v.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("{v:?} is not a number of seconds"))
}

const DEFAULT_ROOT: &str = "/var/run/microvirt";

struct Logger(log::LevelFilter);

impl log::Log for Logger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= self.0
    }
    fn log(&self, r: &log::Record) {
        // The netlink crates warn about kernel attributes newer than they know; only shown
        // when debugging.
        let noisy = r.target().starts_with("netlink_") && self.0 < log::LevelFilter::Debug;
        if self.enabled(r.metadata()) && !noisy {
            // Never in the middle of a guest console line on the terminal.
            console::emit_line(&format!(
                "virt-launcher: {}: {}",
                r.level().as_str().to_lowercase(),
                r.args()
            ));
        }
    }
    fn flush(&self) {}
}

fn root_dir() -> PathBuf {
    std::env::var_os("MICROVIRT_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_ROOT))
}

fn write_termination_log(path: Option<&Path>, outcome: &Outcome) {
    if let Some(p) = path {
        if let Err(e) = std::fs::write(p, outcome.termination_message()) {
            log::error!(
                "cannot write the termination message to {}: {e}",
                p.display()
            );
        }
    }
}

/// Boots `doc` and returns the outcome (setup errors included).
///
/// Order matters for least privilege: everything that needs privileges (disks, the pod
/// network, binding the DHCP port, forking the run-mode teardown helper) happens while the
/// launcher is a single thread; then it drops every capability and installs its seccomp
/// filter on all threads; only then are threads started (DHCP server, signals, VMM, vCPUs,
/// control, console), and each inherits both.
fn launch(doc: &VmiDocument, opts: &Options, keep_caps: bool, start: Clock) -> Outcome {
    let (tx, rx) = channel();
    if let Err(e) = runner::block_signals() {
        return Outcome::setup_failed(format!("blocking signals: {e}"));
    }
    let mut prepared = match launch::prepare(doc, opts, start) {
        Ok(p) => p,
        Err(
            e @ launch::LaunchError::Kernel(launcher::kernel::KernelError::NoBootableKernel(_)),
        ) => return Outcome::no_bootable_kernel(e.to_string()),
        Err(e) => return Outcome::setup_failed(e.to_string()),
    };
    // `run --pod-network` removes the network at exit, which needs CAP_NET_ADMIN: a helper
    // process keeps that capability for it. Pod mode leaves the network to the pod.
    let mut teardown = None;
    if let Some(net) = prepared.network.as_mut().filter(|_| !opts.keep_network) {
        match teardown::spawn(net) {
            Ok(t) => teardown = Some(t),
            Err(e) => return Outcome::setup_failed(format!("pod network teardown helper: {e}")),
        }
    }
    if !keep_caps {
        if let Err(e) = caps::drop_all() {
            return Outcome::setup_failed(format!("dropping capabilities: {e}"));
        }
    }
    if opts.seccomp {
        if let Err(e) = seccomp::apply_launcher_filter(seccomp::Mismatch::KillProcess) {
            return Outcome::setup_failed(format!("seccomp: {e}"));
        }
    }
    if let Some(net) = prepared.network.as_mut() {
        let filter = opts.seccomp;
        let started = net.start_dhcp(move || {
            if filter {
                seccomp::apply_thread_filter(seccomp::Role::Dhcp, seccomp::Mismatch::KillProcess)
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        });
        if let Err(e) = started {
            return Outcome::setup_failed(format!("pod network: {e}"));
        }
    }
    if let Err(e) = runner::forward_signals(tx.clone()) {
        return Outcome::setup_failed(format!("signal thread: {e}"));
    }
    log::info!(
        "booting {} ({} vCPU(s), {} MiB{}, {} disk(s))",
        prepared.config.name,
        prepared.config.vm.vcpus,
        prepared.config.vm.mem_mib,
        if prepared.demo.is_some() {
            ", built-in demo guest"
        } else {
            ""
        },
        prepared.config.vm.disks.len()
    );
    let outcome = runner::run(prepared.config, tx, rx);
    drop(prepared.demo);
    drop(prepared.held);
    drop(prepared.network);
    if let Some(t) = teardown {
        if let Err(e) = t.finish() {
            log::warn!("pod network teardown: {e}");
        }
    }
    outcome
}

fn cmd_run(a: RunArgs, start: Clock) -> ExitCode {
    let doc = match VmiDocument::load(&a.vmi) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("virt-launcher: error: {e}");
            return ExitCode::from(exit_code::USAGE);
        }
    };
    let base_dir = launch::base_dir_of(&a.vmi);
    let (runtime_dir, ours) = match a.runtime_dir {
        Some(d) => (d, false),
        // A new private directory: nothing planted in /tmp can be in the way.
        None => match paths::private_dir(
            &std::env::temp_dir(),
            &format!("virt-launcher-{}", doc.name()),
        ) {
            Ok(d) => (d, true),
            Err(e) => {
                return finish(
                    Outcome::setup_failed(format!("runtime directory: {e}")),
                    a.termination_log.as_deref(),
                )
            }
        },
    };
    let console = match a.console {
        ConsoleArg::Stdio => Console::Stdio,
        ConsoleArg::Socket => Console::Socket,
        ConsoleArg::None => Console::None,
    };
    let opts = Options {
        layout: Layout::Local {
            pvc_root: a.pvc_root.unwrap_or_else(|| base_dir.clone()),
            base_dir,
        },
        runtime_dir: runtime_dir.clone(),
        console,
        console_echo: false,
        control_socket: a.control_socket,
        booted_marker: None,
        grace: a.grace_period,
        grace_reserve: Duration::ZERO,
        seccomp: !a.no_seccomp,
        announce_boot: true,
        pod_network: a.pod_network,
        keep_network: false,
        snapshot_dir: None,
        restore: a.restore.map(|dir| launch::Restore {
            dir,
            paused: a.paused,
        }),
        demo_guest: true,
        guest_init: a.guest_init,
        default_pod_interface: true,
        run_as: None,
    };
    // Keys go to the guest as typed (the guest echoes); Ctrl-C still means shut down.
    let raw = (console == Console::Stdio)
        .then(|| control::RawTerminal::enter_keep_signals(libc::STDIN_FILENO))
        .flatten();
    let outcome = launch(&doc, &opts, a.keep_caps, start);
    drop(raw);
    if ours {
        let _ = std::fs::remove_dir_all(&runtime_dir);
    }
    finish(outcome, a.termination_log.as_deref())
}

fn finish(outcome: Outcome, termination_log: Option<&Path>) -> ExitCode {
    let _ = std::io::stdout().flush();
    write_termination_log(termination_log, &outcome);
    if outcome.exit_code() == exit_code::CLEAN {
        log::info!("{}", outcome.message);
    } else {
        console::emit_line(&format!("virt-launcher: {}", outcome.message));
    }
    ExitCode::from(outcome.exit_code())
}

/// `MICROVIRT_LAUNCHER_USER=UID:GID` (pod mode): the user to become after the privileged
/// setup. Nothing to do when the launcher already runs as that user.
fn launcher_user() -> Result<Option<(u32, u32)>, String> {
    let Ok(v) = std::env::var("MICROVIRT_LAUNCHER_USER") else {
        return Ok(None);
    };
    let parsed = v
        .split_once(':')
        .and_then(|(u, g)| Some((u.parse::<u32>().ok()?, g.parse::<u32>().ok()?)));
    let Some((uid, gid)) = parsed.filter(|(u, _)| *u != 0) else {
        return Err(format!(
            "MICROVIRT_LAUNCHER_USER={v:?} is not UID:GID with a UID other than 0"
        ));
    };
    // SAFETY: geteuid/getegid have no preconditions.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    match euid {
        0 => Ok(Some((uid, gid))),
        u if u == uid && egid == gid => Ok(None),
        u => Err(format!(
            "MICROVIRT_LAUNCHER_USER={v}: the launcher runs as uid {u}, and only root can become another user"
        )),
    }
}

fn cmd_pod(start: Clock) -> ExitCode {
    let root = root_dir();
    let vmi_file = std::env::var_os(launcher_document::DOCUMENT_FILE_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("vmi").join(launcher_document::DOCUMENT_FILE));
    let term_log = std::env::var_os("MICROVIRT_TERMINATION_LOG")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/dev/termination-log"));
    let doc = match VmiDocument::load(&vmi_file) {
        Ok(d) => d,
        Err(e) => {
            let o = Outcome {
                message: format!("invalid VMI document: {e}"),
                reason: Reason::InvalidVmi,
                boot_time_ms: None,
                shutdown_requested: None,
            };
            return finish(o, Some(&term_log));
        }
    };
    // A VM pool's warm member restores a snapshot (paused) instead of booting.
    let restore = std::env::var_os("MICROVIRT_RESTORE")
        .filter(|d| !d.is_empty())
        .map(|dir| launch::Restore {
            dir: PathBuf::from(dir),
            paused: std::env::var("MICROVIRT_RESTORE_PAUSED").is_ok_and(|v| v == "1"),
        });
    let run_as = match launcher_user() {
        Ok(u) => u,
        Err(e) => {
            let o = Outcome {
                message: e,
                reason: Reason::InvalidVmi,
                boot_time_ms: None,
                shutdown_requested: None,
            };
            return finish(o, Some(&term_log));
        }
    };
    let opts = Options {
        layout: Layout::Pod {
            root: root.clone(),
            pvc_devices: std::env::var_os("MICROVIRT_PVC_DEVICE_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(PVC_DEVICE_DIR)),
        },
        runtime_dir: root.join("run"),
        console: Console::Socket,
        console_echo: true,
        control_socket: Some(root.join("control.sock")),
        booted_marker: Some(root.join("booted")),
        grace: None,
        grace_reserve: Duration::from_secs(2),
        seccomp: true,
        announce_boot: true,
        pod_network: true,
        keep_network: true,
        restore,
        snapshot_dir: Some(root.join("snapshot")),
        demo_guest: false,
        guest_init: None,
        default_pod_interface: false,
        run_as,
    };
    let outcome = launch(&doc, &opts, false, start);
    finish(outcome, Some(&term_log))
}

/// One malloc arena for every thread: glibc gives each thread that allocates an arena of its
/// own, a few resident pages each, and the launcher's threads (signals, console, control, DHCP,
/// VMM, vCPUs) allocate little and seldom (docs/boot-time.md, "VMM memory").
fn one_malloc_arena() {
    // SAFETY: mallopt only sets a malloc parameter; called before any other thread exists.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
}

fn main() -> ExitCode {
    let start = Clock::now();
    one_malloc_arena();
    let cli = Cli::parse();
    log::set_max_level(cli.log_level);
    let _ = log::set_boxed_logger(Box::new(Logger(cli.log_level)));
    let socket = |a: SocketArg| a.socket.unwrap_or_else(|| root_dir().join("control.sock"));
    let (cmd, socket) = match cli.cmd {
        Cmd::Run(a) => return cmd_run(a, start),
        Cmd::Pod => return cmd_pod(start),
        Cmd::Probe {
            what: ProbeWhat::Ready,
        } => {
            return if root_dir().join("booted").exists() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Cmd::Snapshot { dir, socket: a } => {
            let socket = socket(a);
            let dir = match std::path::absolute(&dir) {
                Ok(d) => d,
                Err(e) => {
                    eprintln!("virt-launcher: snapshot directory {}: {e}", dir.display());
                    return ExitCode::from(2);
                }
            };
            return answer(
                &socket,
                vmm::control::request(
                    &socket,
                    &serde_json::json!({"cmd": "snapshot", "dir": dir.display().to_string()}),
                ),
            );
        }
        Cmd::Console(a) => {
            let socket = socket(a);
            return match control::attach_console(&socket) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("virt-launcher: console: {e}");
                    ExitCode::from(1)
                }
            };
        }
        Cmd::Status(a) => ("status", socket(a)),
        Cmd::Pause(a) => ("pause", socket(a)),
        Cmd::Unpause(a) => ("unpause", socket(a)),
        Cmd::Shutdown(a) => ("shutdown", socket(a)),
        Cmd::Stop(a) => ("stop", socket(a)),
        Cmd::VcpuState(a) => ("vcpu-state", socket(a)),
    };
    answer(&socket, control::request(&socket, cmd))
}

/// Prints a control answer; exit 0 when it says `ok`.
fn answer(socket: &Path, r: std::io::Result<serde_json::Value>) -> ExitCode {
    match r {
        Ok(v) => {
            println!("{v}");
            if v.get("ok") == Some(&serde_json::Value::Bool(true)) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("virt-launcher: {}: {e}", socket.display());
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_arguments() {
        let c = Cli::try_parse_from([
            "virt-launcher",
            "run",
            "vmi.yaml",
            "--grace-period",
            "1.5",
            "--console",
            "socket",
            "--pod-network",
            "--log-level",
            "debug",
        ])
        .unwrap();
        assert_eq!(c.log_level, log::LevelFilter::Debug);
        let Cmd::Run(a) = c.cmd else { panic!() };
        assert_eq!(a.grace_period, Some(Duration::from_millis(1500)));
        assert_eq!(a.console, ConsoleArg::Socket);
        assert!(a.pod_network && !a.no_seccomp && !a.keep_caps);
        for bad in [
            &["virt-launcher", "run"][..],
            &["virt-launcher", "run", "x", "--grace-period", "-1"],
            &["virt-launcher", "run", "x", "--console", "tty"],
            &["virt-launcher", "probe", "alive"],
            &["virt-launcher", "status", "extra"],
            &["virt-launcher", "frobnicate"],
        ] {
            let e = Cli::try_parse_from(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad:?}");
        }
        let c = Cli::try_parse_from(["virt-launcher", "resume", "--socket", "/s"]).unwrap();
        assert!(matches!(c.cmd, Cmd::Unpause(SocketArg { socket: Some(_) })));
        let c = Cli::try_parse_from(["virt-launcher", "run", "x", "--restore", "/d", "--paused"])
            .unwrap();
        let Cmd::Run(a) = c.cmd else { panic!() };
        assert_eq!(a.restore.as_deref(), Some(Path::new("/d")));
        assert!(a.paused);
        assert!(Cli::try_parse_from(["virt-launcher", "run", "x", "--paused"]).is_err());
        let c = Cli::try_parse_from(["virt-launcher", "snapshot", "/d", "--socket", "/s"]).unwrap();
        assert!(matches!(c.cmd, Cmd::Snapshot { .. }));
        assert!(Cli::try_parse_from(["virt-launcher", "snapshot"]).is_err());
    }
}
