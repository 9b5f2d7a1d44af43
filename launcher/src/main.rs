//! `virt-launcher`: one VirtualMachineInstance per process, with the VMM embedded.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc::channel;
use std::time::Duration;

use launcher::disks::{Layout, PVC_DEVICE_DIR};
use launcher::launch::{self, Console, Options};
use launcher::runner::{self, exit_code, Outcome};
use launcher::vmi::VmiDocument;
use launcher::{caps, control};
use vmm::timing::Clock;

const USAGE: &str = "\
usage:
  virt-launcher run VMI.yaml [--grace-period SECS] [--console stdio|socket|none]
                [--control-socket PATH] [--runtime-dir DIR] [--pvc-root DIR]
                [--termination-log PATH] [--pod-network] [--no-seccomp] [--keep-caps]
                [--restore DIR [--paused]] [--log-level LEVEL]
  virt-launcher pod
  virt-launcher probe ready
  virt-launcher status|pause|unpause|resume|shutdown|stop [--socket PATH]
  virt-launcher snapshot DIR [--socket PATH]
  virt-launcher console [--socket PATH]

run: boots the VMI (YAML or JSON) on this machine. The console is the terminal; Ctrl-C or
  SIGTERM asks the guest to shut down (Ctrl-Alt-Del) and stops it after the grace period
  (terminationGracePeriodSeconds, default 30 s; --grace-period overrides); a second signal
  stops it at once. A VMI without firmware.kernelBoot.container boots the built-in demo guest
  (run only; pod never does); kernelArgs pick its scenario
  (testguest.scenario=echo|ctrlaltdel|halt-forever|blk|...).
  Local files: kernelPath/initrdPath and containerDisk.path are paths on this machine
  (absolute, or relative to the VMI file's directory; images are not pulled); a
  persistentVolumeClaim's claimName is a path when it contains '/', else a name under
  --pvc-root (default: the VMI file's directory); a directory means its disk.img.
  Interfaces are ignored (no NIC) unless --pod-network: then the VMI's interface is set up
  as in a pod (masquerade/bridge on MICROVIRT_POD_INTERFACE, default eth0) in this network
  namespace and removed at exit; use it inside a dedicated namespace only.
pod: the launcher pod's entry point (docs/launcher-pod.md). Environment:
  MICROVIRT_VMI_FILE (default /var/run/microvirt/vmi/vmi.json), MICROVIRT_ROOT (default
  /var/run/microvirt: mounts, sockets, booted marker), MICROVIRT_TERMINATION_LOG (default
  /dev/termination-log), MICROVIRT_POD_INTERFACE (default eth0), MICROVIRT_RESOLV_CONF
  (default /etc/resolv.conf), MICROVIRT_RESTORE (a snapshot directory: restore it instead of
  booting, as --restore does), MICROVIRT_RESTORE_PAUSED=1 (stay paused until `unpause`; the
  readiness probe passes once restored: a VM pool's warm member).
  --restore DIR starts the VMI from the snapshot in DIR instead of booting it: the VMI's
  memory and CPUs must match the snapshot's, its disks and interface take the place of the
  snapshot's (a containerDisk's overlay becomes a copy of the one saved in DIR); --paused
  keeps it paused until `resume`.
probe ready: exit 0 once the guest has booted ($MICROVIRT_ROOT/booted exists).
snapshot DIR: pause the VM and write a snapshot into DIR (absent or empty); the VM stays
  paused (`resume` continues it). Format: docs/snapshot.md.
status|pause|unpause|shutdown|stop|console: talk to a launcher's control socket (default
  $MICROVIRT_ROOT/control.sock). console: Ctrl-] detaches.

exit status: 0 guest shut down (reset or power-off); 1 guest crashed or VMM failure; 2 bad
usage or invalid VMI; 3 setup failed (disks, kernel, KVM); 4 guest ignored the shutdown
request, stopped after the grace period; 5 stopped on request.";

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
            let mut e = std::io::stderr().lock();
            let _ = writeln!(
                e,
                "virt-launcher: {}: {}",
                r.level().as_str().to_lowercase(),
                r.args()
            );
        }
    }
    fn flush(&self) {}
}

fn root_dir() -> PathBuf {
    std::env::var_os("MICROVIRT_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_ROOT))
}

struct RunArgs {
    vmi: PathBuf,
    grace: Option<Duration>,
    console: Console,
    control_socket: Option<PathBuf>,
    runtime_dir: Option<PathBuf>,
    pvc_root: Option<PathBuf>,
    termination_log: Option<PathBuf>,
    seccomp: bool,
    keep_caps: bool,
    pod_network: bool,
    restore: Option<PathBuf>,
    paused: bool,
}

enum Cmd {
    Run(RunArgs),
    Pod,
    ProbeReady,
    Control { cmd: String, socket: PathBuf },
    Snapshot { dir: PathBuf, socket: PathBuf },
    Console { socket: PathBuf },
    Help,
}

fn parse(args: &[String]) -> Result<(Cmd, log::LevelFilter), String> {
    let mut level = std::env::var("MICROVIRT_LOG_LEVEL")
        .ok()
        .and_then(|l| l.parse().ok())
        .unwrap_or(log::LevelFilter::Info);
    let mut positional = Vec::new();
    let mut run = RunArgs {
        vmi: PathBuf::new(),
        grace: None,
        console: Console::Stdio,
        control_socket: None,
        runtime_dir: None,
        pvc_root: None,
        termination_log: None,
        seccomp: true,
        keep_caps: false,
        pod_network: false,
        restore: None,
        paused: false,
    };
    let mut socket = root_dir().join("control.sock");
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{a} needs a value"))
        };
        match a.as_str() {
            "-h" | "--help" => return Ok((Cmd::Help, level)),
            "--grace-period" => {
                let v = value()?;
                let secs: f64 = v
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s >= 0.0)
                    .ok_or_else(|| format!("--grace-period: {v:?} is not a number of seconds"))?;
                run.grace = Some(Duration::from_secs_f64(secs));
            }
            "--console" => {
                run.console = match value()?.as_str() {
                    "stdio" => Console::Stdio,
                    "socket" => Console::Socket,
                    "none" => Console::None,
                    o => return Err(format!("--console: {o:?} is not stdio, socket or none")),
                }
            }
            "--control-socket" => run.control_socket = Some(value()?.into()),
            "--runtime-dir" => run.runtime_dir = Some(value()?.into()),
            "--pvc-root" => run.pvc_root = Some(value()?.into()),
            "--termination-log" => run.termination_log = Some(value()?.into()),
            "--no-seccomp" => run.seccomp = false,
            "--keep-caps" => run.keep_caps = true,
            "--pod-network" => run.pod_network = true,
            "--restore" => run.restore = Some(value()?.into()),
            "--paused" => run.paused = true,
            "--socket" => socket = value()?.into(),
            "--log-level" => {
                let v = value()?;
                level = v.parse().map_err(|_| format!("--log-level: {v:?}"))?;
            }
            s if s.starts_with('-') => return Err(format!("unknown option {s:?}")),
            s => positional.push(s.to_string()),
        }
    }
    let mut pos = positional.into_iter();
    let cmd = match pos.next().as_deref() {
        Some("run") => {
            run.vmi = pos.next().ok_or("run needs a VMI file")?.into();
            if run.paused && run.restore.is_none() {
                return Err("--paused only goes with --restore".into());
            }
            Cmd::Run(run)
        }
        Some("snapshot") => {
            let dir: PathBuf = pos.next().ok_or("snapshot needs a directory")?.into();
            let dir = std::path::absolute(&dir)
                .map_err(|e| format!("snapshot directory {}: {e}", dir.display()))?;
            Cmd::Snapshot {
                dir,
                socket: socket.clone(),
            }
        }
        Some("pod") => Cmd::Pod,
        Some("probe") => match pos.next().as_deref() {
            Some("ready") => Cmd::ProbeReady,
            _ => return Err("probe takes one argument: ready".into()),
        },
        Some(c @ ("status" | "pause" | "unpause" | "resume" | "shutdown" | "stop")) => {
            Cmd::Control {
                cmd: c.to_string(),
                socket: socket.clone(),
            }
        }
        Some("console") => Cmd::Console { socket },
        Some("help") => Cmd::Help,
        Some(other) => return Err(format!("unknown command {other:?}")),
        None => return Err("no command given".into()),
    };
    if let Some(extra) = pos.next() {
        return Err(format!("unexpected argument {extra:?}"));
    }
    Ok((cmd, level))
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
fn launch(doc: &VmiDocument, opts: &Options, keep_caps: bool, start: Clock) -> Outcome {
    let (tx, rx) = channel();
    if let Err(e) = runner::block_signals() {
        return Outcome::setup_failed(format!("blocking signals: {e}"));
    }
    let prepared = match launch::prepare(doc, opts, start) {
        Ok(p) => p,
        Err(e) => return Outcome::setup_failed(e.to_string()),
    };
    // The pod network was set up in prepare(), while the launcher still had CAP_NET_ADMIN.
    // `run --pod-network` removes it again at exit, which needs CAP_NET_ADMIN then: keep the
    // capabilities in that (local, debugging) case; pod mode leaves the network to the pod.
    let teardown_pending = prepared.network.is_some() && !opts.keep_network;
    if teardown_pending && !keep_caps {
        log::info!("keeping capabilities: the pod network is removed at exit");
    }
    if !keep_caps && !teardown_pending {
        if let Err(e) = caps::drop_all() {
            return Outcome::setup_failed(format!("dropping capabilities: {e}"));
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
    drop(prepared.network);
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
        None => (
            std::env::temp_dir().join(format!(
                "virt-launcher-{}-{}",
                doc.name(),
                std::process::id()
            )),
            true,
        ),
    };
    let opts = Options {
        layout: Layout::Local {
            pvc_root: a.pvc_root.unwrap_or_else(|| base_dir.clone()),
            base_dir,
        },
        runtime_dir: runtime_dir.clone(),
        console: a.console,
        console_echo: false,
        control_socket: a.control_socket,
        booted_marker: None,
        grace: a.grace,
        grace_reserve: Duration::ZERO,
        seccomp: a.seccomp,
        announce_boot: true,
        pod_network: a.pod_network,
        keep_network: false,
        snapshot_dir: None,
        restore: a.restore.map(|dir| launch::Restore {
            dir,
            paused: a.paused,
        }),
        demo_guest: true,
    };
    // Keys go to the guest as typed (the guest echoes); Ctrl-C still means shut down.
    let raw = (a.console == Console::Stdio)
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
    if outcome.exit_code == exit_code::CLEAN {
        log::info!("{}", outcome.message);
    } else {
        eprintln!("virt-launcher: {}", outcome.message);
    }
    ExitCode::from(outcome.exit_code)
}

fn cmd_pod(start: Clock) -> ExitCode {
    let root = root_dir();
    let vmi_file = std::env::var_os("MICROVIRT_VMI_FILE")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("vmi/vmi.json"));
    let term_log = std::env::var_os("MICROVIRT_TERMINATION_LOG")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/dev/termination-log"));
    let doc = match VmiDocument::load(&vmi_file) {
        Ok(d) => d,
        Err(e) => {
            let o = Outcome {
                exit_code: exit_code::USAGE,
                message: format!("invalid VMI document: {e}"),
                reason: "InvalidVMI",
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
    };
    let outcome = launch(&doc, &opts, false, start);
    finish(outcome, Some(&term_log))
}

fn main() -> ExitCode {
    let start = Clock::now();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (cmd, level) = match parse(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("virt-launcher: error: {e}\n{USAGE}");
            return ExitCode::from(exit_code::USAGE);
        }
    };
    log::set_max_level(level);
    let _ = log::set_boxed_logger(Box::new(Logger(level)));
    match cmd {
        Cmd::Help => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Cmd::Run(a) => cmd_run(a, start),
        Cmd::Pod => cmd_pod(start),
        Cmd::ProbeReady => {
            if root_dir().join("booted").exists() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Cmd::Snapshot { dir, socket } => answer(
            &socket,
            control::request_value(
                &socket,
                &serde_json::json!({"cmd": "snapshot", "dir": dir.display().to_string()}),
            ),
        ),
        Cmd::Control { cmd, socket } => answer(&socket, control::request(&socket, &cmd)),
        Cmd::Console { socket } => match control::attach_console(&socket) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("virt-launcher: console: {e}");
                ExitCode::from(1)
            }
        },
    }
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
