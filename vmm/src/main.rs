//! `microvm`: boot a kernel on KVM from the command line or a JSON config.

use std::io::Write;
use std::os::unix::io::{AsRawFd, FromRawFd, RawFd};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicI32, Ordering};

use vmm::timing::{monotonic_ns, Clock};
use vmm::{Action, BuildOptions, ExitReason, RestoreConfig, VmConfig, Vmm};

const USAGE: &str = "\
usage: microvm --kernel PATH [--initrd PATH] [--cmdline STR] [--mem-mib N] [--vcpus N]
               [--serial stdio|none|unix:PATH] [--no-default-cmdline] [--log-level LEVEL]
               [--disk path=IMG[,ro][,id=SERIAL][,overlay=PATH]]... [--net tap=NAME[,mac=MAC]]...
               [--rng] [--control-socket PATH] [--exit-stats]
       microvm --config FILE.json [same flags to override]
       microvm --restore DIR [--paused] [--serial ...] [--disk ...]... [--net ...]...
               [--mem-mib N] [--vcpus N] [--control-socket PATH] [--log-level LEVEL]
               [--exit-stats]
       microvm control SOCKET REQUEST_JSON

Boots PATH (ELF vmlinux with or without a PVH note, or bzImage) on /dev/kvm.
Defaults: 128 MiB, 1 vCPU, serial console on stdin/stdout. Disks become
/dev/vda, /dev/vdb... in order (overlay=PATH: copy-on-write, the image is never
written); nets become eth0, eth1... over the named TAP devices; --rng adds a virtio-rng
device (entropy from the host's getrandom, at most 1 MiB/s). The guest's command line
is the VMM's defaults followed by --cmdline. Exit status: 0 when the guest resets or
powers off, 1 on a VM error, 2 on bad usage or a forced stop. SIGTERM/SIGINT ask the
guest to shut down (Ctrl-Alt-Del); a second one stops the VM at once.

--control-socket PATH serves the control protocol (JSON lines): {\"cmd\":\"state\"},
pause, resume, shutdown, stop, and {\"cmd\":\"snapshot\",\"dir\":\"/abs/dir\"} (the VM
stays paused; resume continues it). `microvm control SOCKET '{\"cmd\":\"resume\"}'` sends
one request and prints the answer (exit 0 when ok).

--restore DIR continues the VM saved in DIR (kernel, memory, devices come from there);
--paused keeps it paused until a resume. --disk/--net given with --restore replace the
snapshot's disks/NICs in order (image, overlay path, TAP); --mem-mib/--vcpus, when
given, must match the snapshot. Snapshot format and guarantees: docs/snapshot.md.

At the end one line sums up the VM exits; --exit-stats prints them all by
reason, port and device register.";

struct Logger(log::LevelFilter);

impl log::Log for Logger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= self.0
    }
    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            // One write per line, so lines from different threads never interleave.
            let line = format!(
                "microvm: {}: {}\n",
                r.level().as_str().to_lowercase(),
                r.args()
            );
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
        }
    }
    fn flush(&self) {}
}

/// What `microvm` was asked to start.
enum Start {
    Boot(VmConfig),
    Restore { rc: RestoreConfig, paused: bool },
}

enum Cli {
    Run {
        start: Start,
        control_socket: Option<PathBuf>,
        level: log::LevelFilter,
        exit_stats: bool,
    },
    Control {
        socket: PathBuf,
        request: String,
    },
    Help,
    Version,
}

fn parse_args(args: &[String]) -> Result<Cli, String> {
    if args.first().map(String::as_str) == Some("control") {
        return match &args[1..] {
            [socket, request] => Ok(Cli::Control {
                socket: PathBuf::from(socket),
                request: request.clone(),
            }),
            _ => Err("control takes two arguments: SOCKET REQUEST_JSON".into()),
        };
    }
    let mut config: Option<VmConfig> = None;
    let mut overrides: Vec<(String, String)> = Vec::new();
    let mut no_default_cmdline = false;
    let mut rng = false;
    let mut exit_stats = false;
    let mut level = log::LevelFilter::Info;
    let mut restore: Option<PathBuf> = None;
    let mut paused = false;
    let mut control_socket = None;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(Cli::Help),
            "-V" | "--version" => return Ok(Cli::Version),
            "--config" => {
                let path = value("--config")?;
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| format!("cannot read config {path}: {e}"))?;
                config =
                    Some(serde_json::from_str(&text).map_err(|e| format!("config {path}: {e}"))?);
            }
            "--no-default-cmdline" => no_default_cmdline = true,
            "--rng" => rng = true,
            "--restore" => restore = Some(PathBuf::from(value("--restore")?)),
            "--paused" => paused = true,
            "--control-socket" => control_socket = Some(PathBuf::from(value("--control-socket")?)),
            "--exit-stats" => exit_stats = true,
            "--log-level" => {
                let v = value("--log-level")?;
                level = v
                    .parse()
                    .map_err(|_| format!("--log-level: unknown level {v:?}"))?;
            }
            "--kernel" | "--initrd" | "--cmdline" | "--mem-mib" | "--vcpus" | "--serial"
            | "--disk" | "--net" => {
                let v = value(flag)?;
                overrides.push((flag.clone(), v));
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if rng && restore.is_some() {
        return Err(
            "--rng cannot be used with --restore (the snapshot has the guest's devices)".into(),
        );
    }
    if paused && restore.is_none() {
        return Err("--paused only goes with --restore".into());
    }
    if let Some(dir) = restore {
        return parse_restore(dir, overrides, config.is_some() || no_default_cmdline).map(|rc| {
            Cli::Run {
                start: Start::Restore { rc, paused },
                control_socket,
                level,
                exit_stats,
            }
        });
    }
    let mut cfg = config.unwrap_or_else(|| VmConfig::new(""));
    for (flag, v) in overrides {
        let number = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag}: {v:?} is not a number"))
        };
        match flag.as_str() {
            "--kernel" => cfg.kernel = PathBuf::from(v),
            "--initrd" => cfg.initrd = Some(PathBuf::from(v)),
            "--cmdline" => cfg.cmdline = Some(v),
            "--mem-mib" => cfg.mem_mib = number(&v)?,
            "--vcpus" => cfg.vcpus = number(&v)?,
            "--serial" => cfg.serial = v.parse().map_err(|e| format!("--serial: {e}"))?,
            "--disk" => cfg
                .disks
                .push(v.parse().map_err(|e| format!("--disk {v}: {e}"))?),
            "--net" => cfg
                .nets
                .push(v.parse().map_err(|e| format!("--net {v}: {e}"))?),
            _ => unreachable!("only listed flags are collected"),
        }
    }
    if no_default_cmdline {
        cfg.default_cmdline = false;
    }
    if rng {
        cfg.rng = Some(vmm::devices::virtio::RngConfig::default());
    }
    if cfg.kernel.as_os_str().is_empty() {
        return Err("--kernel (or a config file with \"kernel\") is required".into());
    }
    Ok(Cli::Run {
        start: Start::Boot(cfg),
        control_socket,
        level,
        exit_stats,
    })
}

/// `--restore DIR` with the flags that may go with it.
fn parse_restore(
    dir: PathBuf,
    overrides: Vec<(String, String)>,
    boot_config: bool,
) -> Result<RestoreConfig, String> {
    if boot_config {
        return Err("--restore takes the kernel and command line from the snapshot: no --config or --no-default-cmdline".into());
    }
    let mut rc = RestoreConfig {
        dir,
        ..Default::default()
    };
    for (flag, v) in overrides {
        let number = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag}: {v:?} is not a number"))
        };
        match flag.as_str() {
            "--kernel" | "--initrd" | "--cmdline" => {
                return Err(format!(
                    "{flag} cannot be used with --restore (the snapshot has the guest's kernel and command line)"
                ))
            }
            "--mem-mib" => rc.expect_mem_mib = Some(number(&v)?),
            "--vcpus" => rc.expect_vcpus = Some(number(&v)?),
            "--serial" => rc.serial = v.parse().map_err(|e| format!("--serial: {e}"))?,
            "--disk" => rc
                .disks
                .push(v.parse().map_err(|e| format!("--disk {v}: {e}"))?),
            "--net" => rc
                .nets
                .push(v.parse().map_err(|e| format!("--net {v}: {e}"))?),
            _ => unreachable!("only listed flags are collected"),
        }
    }
    Ok(rc)
}

static SIGNAL_PIPE: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(_: libc::c_int) {
    let fd = SIGNAL_PIPE.load(Ordering::Relaxed);
    if fd >= 0 {
        let b = 1u8;
        // SAFETY: write(2) is async-signal-safe; the buffer is a valid byte on our stack.
        unsafe { libc::write(fd, &b as *const u8 as *const libc::c_void, 1) };
    }
}

/// SIGTERM/SIGINT: first one asks the guest to shut down, the next stops the VM.
fn forward_signals(controller: vmm::VmmController) -> std::io::Result<()> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 fills the two-element array we pass.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    SIGNAL_PIPE.store(fds[1], Ordering::Relaxed);
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: installs a handler that only performs an async-signal-safe write.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
    // SAFETY: fds[0] is a fresh pipe read end that only this File owns.
    let mut reader = unsafe { std::fs::File::from_raw_fd(fds[0]) };
    std::thread::Builder::new()
        .name("signals".into())
        .stack_size(64 << 10)
        .spawn(move || {
            use std::io::Read;
            let mut count = 0;
            let mut b = [0u8; 1];
            while reader.read(&mut b).map(|n| n == 1).unwrap_or(false) {
                count += 1;
                let action = if count == 1 {
                    Action::CtrlAltDel
                } else {
                    Action::Stop
                };
                log::info!("signal received: {action:?}");
                if controller.send(action).is_err() {
                    break;
                }
            }
            let _ = reader.as_raw_fd();
        })?;
    Ok(())
}

fn control_client(socket: &std::path::Path, request: &str) -> ExitCode {
    let req: serde_json::Value = match serde_json::from_str(request) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("microvm: error: request is not JSON: {e}");
            return ExitCode::from(2);
        }
    };
    match vmm::control::request(socket, &req) {
        Ok(v) => {
            println!("{v}");
            if v.get("ok") == Some(&serde_json::Value::Bool(true)) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("microvm: error: {}: {e}", socket.display());
            ExitCode::from(1)
        }
    }
}

fn main() -> ExitCode {
    let start = Clock::now();
    let start_mono = monotonic_ns();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (what, control_socket, level, exit_stats) = match parse_args(&args) {
        Ok(Cli::Run {
            start,
            control_socket,
            level,
            exit_stats,
        }) => (start, control_socket, level, exit_stats),
        Ok(Cli::Control { socket, request }) => return control_client(&socket, &request),
        Ok(Cli::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Ok(Cli::Version) => {
            println!("microvm {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("microvm: error: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    log::set_max_level(level);
    let _ = log::set_boxed_logger(Box::new(Logger(level)));

    let opts = BuildOptions {
        start: Some(start),
        ..Default::default()
    };
    let (built, paused) = match &what {
        Start::Boot(cfg) => (Vmm::build(cfg, opts), false),
        Start::Restore { rc, paused } => (Vmm::restore(rc, opts), *paused),
    };
    let vmm = match built {
        Ok(v) => v,
        Err(e) => {
            eprintln!("microvm: error: {e}");
            return ExitCode::from(1);
        }
    };
    // The control socket's thread opens and renames snapshot files; the VMM thread (this one)
    // only writes through the descriptors it is handed.
    let _control = match &control_socket {
        Some(p) => match vmm::control::serve(p, vmm.controller()) {
            Ok(s) => Some(s),
            Err(e) => {
                eprintln!("microvm: error: control socket {}: {e}", p.display());
                return ExitCode::from(1);
            }
        },
        None => None,
    };
    if let Err(e) = forward_signals(vmm.controller()) {
        log::warn!("signals will not be forwarded: {e}");
    }
    let restored = vmm.is_restored();
    let result = if paused { vmm.run_paused() } else { vmm.run() };
    match result {
        Ok((reason, timings)) => {
            let _ = std::io::stdout().flush();
            // Optional reference point from a benchmark harness: CLOCK_MONOTONIC ns at spawn.
            let spawn_offset_us = std::env::var("MICROVM_T0_MONO_NS")
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .map(|t0| start_mono.saturating_sub(t0) / 1000);
            let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
            log::debug!(
                "timings: spawn-to-main-us={} {}-us={} first-vcpu-entry-us={} first-vcpu-exit-us={} first-guest-io-us={} boot-timer-us={} boot-timer-cpu-us={}",
                opt(spawn_offset_us),
                if restored { "restore" } else { "build" },
                timings.build_us,
                opt(timings.first_vcpu_entry_us),
                opt(timings.first_vcpu_exit_us),
                opt(timings.first_debug_port_us),
                opt(timings.boot_timer.map(|b| b.wall_us)),
                opt(timings.boot_timer.map(|b| b.cpu_us)),
            );
            log::info!("exits: {}", timings.exits.summary());
            if exit_stats {
                eprint!("{}", timings.exits.table());
            }
            match &reason {
                ExitReason::GuestReset => log::info!("guest reset; VM stopped"),
                ExitReason::GuestPowerOff => log::info!("guest powered off; VM stopped"),
                ExitReason::Stopped => log::warn!("VM stopped before the guest shut down"),
                ExitReason::Fault(msg) => eprintln!("microvm: error: {msg}"),
            }
            ExitCode::from(reason.exit_code() as u8)
        }
        Err(e) => {
            eprintln!("microvm: error: {e}");
            ExitCode::from(1)
        }
    }
}
