//! `microvm`: boot a kernel on KVM from the command line or a JSON config.

use std::io::Write;
use std::os::unix::io::{FromRawFd, RawFd};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use vmm::devices::virtio::{BlockConfig, NetConfig};
use vmm::timing::{monotonic_ns, Clock};
use vmm::{Action, BuildOptions, ExitReason, RestoreConfig, SerialConfig, VmConfig, Vmm};

/// Boots a kernel (ELF vmlinux with or without a PVH note, or bzImage) on /dev/kvm.
///
/// Defaults: 128 MiB, 1 vCPU, serial console on stdin/stdout. Disks become /dev/vda,
/// /dev/vdb... in order (overlay=PATH: copy-on-write, the image is never written); nets become
/// eth0, eth1... over the named TAP devices; --rng adds a virtio-rng device (entropy from the
/// host's getrandom, at most 1 MiB/s). The guest's command line is the VMM's defaults followed
/// by --cmdline. SIGTERM/SIGINT ask the guest to shut down (the ACPI power button when the
/// guest armed it, else Ctrl-Alt-Del); a second one stops the VM at once.
///
/// --restore DIR continues the VM saved in DIR (kernel, memory, devices come from there);
/// --disk/--net given with it replace the snapshot's disks/NICs in order (image, overlay path,
/// TAP); --mem-mib/--vcpus, when given, must match the snapshot. Snapshot format and
/// guarantees: docs/snapshot.md.
#[derive(Parser, Debug)]
#[command(
    name = "microvm",
    version,
    args_conflicts_with_subcommands = true,
    after_help = "Exit status: 0 when the guest resets or powers off, 1 on a VM error, 2 on bad \
                  usage or a forced stop."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    args: Args,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Sends one control request (JSON) to a --control-socket and prints the answer (exit 0
    /// when it is ok).
    Control {
        /// The control socket.
        socket: PathBuf,
        /// The request, e.g. '{"cmd":"resume"}'.
        request: String,
    },
}

/// What `microvm` was asked to start.
enum Start {
    Boot(VmConfig),
    Restore { rc: RestoreConfig, paused: bool },
}

#[derive(clap::Args, Debug)]
struct Args {
    /// Read the VM from a JSON file (fields: kernel, initrd, cmdline, default_cmdline, mem_mib,
    /// vcpus, serial, disks, nets, rng, acpi, reboot); the flags below override it.
    #[arg(long, value_name = "FILE.json")]
    config: Option<PathBuf>,
    /// The guest kernel.
    #[arg(long, value_name = "PATH")]
    kernel: Option<PathBuf>,
    /// An initrd.
    #[arg(long, value_name = "PATH")]
    initrd: Option<PathBuf>,
    /// Appended to the VMM's default kernel command line.
    #[arg(long, value_name = "STR")]
    cmdline: Option<String>,
    /// Guest memory in MiB [default: 128]
    #[arg(long, value_name = "N")]
    mem_mib: Option<u64>,
    /// vCPUs [default: 1]
    #[arg(long, value_name = "N")]
    vcpus: Option<u64>,
    /// Serial console: stdio, none or unix:PATH [default: stdio]
    #[arg(long, value_name = "WHERE")]
    serial: Option<SerialConfig>,
    /// Give the guest only --cmdline (no VMM defaults).
    #[arg(long)]
    no_default_cmdline: bool,
    /// A virtio-blk disk (repeatable).
    #[arg(long = "disk", value_name = "path=IMG[,ro][,id=SERIAL][,overlay=PATH]")]
    disks: Vec<BlockConfig>,
    /// A virtio-net device on a TAP (repeatable).
    #[arg(long = "net", value_name = "tap=NAME[,mac=MAC]")]
    nets: Vec<NetConfig>,
    /// A virtio-rng device (entropy from the host's getrandom, at most 1 MiB/s).
    #[arg(long)]
    rng: bool,
    /// No ACPI tables (and no ACPI power button): the guest finds its CPUs in the MP table and
    /// its virtio devices on the command line only. ACPI is on by default.
    #[arg(long)]
    no_acpi: bool,
    /// What a guest reboot does: exit (the VM ends, exit status 0; Firecracker's semantics),
    /// in-place (the guest boots again in this process: vCPUs, devices and RAM reset, the
    /// kernel loaded again; disks, overlays and TAPs kept) or in-place-if-acpi (in place when
    /// the guest runs with ACPI, else exit) [default: exit]
    #[arg(long, value_name = "WHAT")]
    reboot: Option<vmm::config::RebootPolicy>,
    /// Log level: off, error, warn, info, debug or trace.
    #[arg(long, default_value = "info", value_name = "LEVEL")]
    log_level: log::LevelFilter,
    /// Print every VM exit by reason, port and device register at the end (one summary line
    /// is always logged).
    #[arg(long)]
    exit_stats: bool,
    /// Serve the control protocol (JSON lines) on this unix socket: {"cmd":"state"}, pause,
    /// resume, shutdown (power button or Ctrl-Alt-Del), power-button (ACPI), stop, and
    /// {"cmd":"snapshot","dir":"/abs/dir"} (the VM stays paused; resume continues it).
    #[arg(long, value_name = "PATH")]
    control_socket: Option<PathBuf>,
    /// Continue the VM saved in DIR (the snapshot has the kernel and command line).
    #[arg(
        long,
        value_name = "DIR",
        conflicts_with_all = ["config", "kernel", "initrd", "cmdline", "no_default_cmdline", "rng", "no_acpi", "reboot"]
    )]
    restore: Option<PathBuf>,
    /// With --restore: keep the VM paused until a resume.
    #[arg(long)]
    paused: bool,
}

impl Args {
    /// What to start: a restore, or a boot of [`Args::vm_config`].
    fn start(mut self) -> Result<Start, clap::Error> {
        let Some(dir) = self.restore.take() else {
            if self.paused {
                return Err(Cli::command().error(
                    ErrorKind::MissingRequiredArgument,
                    "--paused only goes with --restore DIR",
                ));
            }
            return self.vm_config().map(Start::Boot);
        };
        let mut rc = RestoreConfig {
            dir,
            disks: self.disks,
            nets: self.nets,
            expect_mem_mib: self.mem_mib,
            expect_vcpus: self.vcpus,
            ..Default::default()
        };
        if let Some(s) = self.serial {
            rc.serial = s;
        }
        Ok(Start::Restore {
            rc,
            paused: self.paused,
        })
    }

    /// The VM configuration: the config file, then the flags; `Err` is a usage error.
    fn vm_config(self) -> Result<VmConfig, clap::Error> {
        let usage = |kind, msg: String| Cli::command().error(kind, msg);
        let mut cfg = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    usage(
                        ErrorKind::Io,
                        format!("cannot read config {}: {e}", path.display()),
                    )
                })?;
                serde_json::from_str(&text).map_err(|e| {
                    usage(
                        ErrorKind::InvalidValue,
                        format!("config {}: {e}", path.display()),
                    )
                })?
            }
            None => VmConfig::new(""),
        };
        if let Some(k) = self.kernel {
            cfg.kernel = k;
        }
        if self.initrd.is_some() {
            cfg.initrd = self.initrd;
        }
        if self.cmdline.is_some() {
            cfg.cmdline = self.cmdline;
        }
        if let Some(m) = self.mem_mib {
            cfg.mem_mib = m;
        }
        if let Some(v) = self.vcpus {
            cfg.vcpus = v;
        }
        if let Some(s) = self.serial {
            cfg.serial = s;
        }
        cfg.disks.extend(self.disks);
        cfg.nets.extend(self.nets);
        if self.no_default_cmdline {
            cfg.default_cmdline = false;
        }
        if self.rng {
            cfg.rng = Some(vmm::devices::virtio::RngConfig::default());
        }
        if self.no_acpi {
            cfg.acpi = false;
        }
        if let Some(r) = self.reboot {
            cfg.reboot = r;
        }
        if cfg.kernel.as_os_str().is_empty() {
            return Err(usage(
                ErrorKind::MissingRequiredArgument,
                "--kernel (or a config file with \"kernel\") is required".into(),
            ));
        }
        Ok(cfg)
    }
}

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

static SIGNAL_PIPE: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(_: libc::c_int) {
    let fd = SIGNAL_PIPE.load(Ordering::Relaxed);
    if fd >= 0 {
        let b = 1u8;
        // SAFETY: write(2) is async-signal-safe; the buffer is a valid byte on our stack.
        unsafe { libc::write(fd, &b as *const u8 as *const libc::c_void, 1) };
    }
}

/// SIGTERM/SIGINT: the first one asks the guest to shut down, the next stops the VM. The
/// handler writes a byte into a pipe that the VMM's event loop watches ([`SignalPipe`]): no
/// thread of its own (docs/boot-time.md, "VMM start-up").
fn forward_signals(vmm: &mut Vmm) -> std::io::Result<()> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 fills the two-element array we pass.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fds[0] is a fresh pipe read end that only this File owns.
    let reader = unsafe { std::fs::File::from_raw_fd(fds[0]) };
    vmm.add_subscriber(Arc::new(Mutex::new(SignalPipe {
        reader,
        count: 0,
        controller: vmm.controller(),
    })));
    SIGNAL_PIPE.store(fds[1], Ordering::Relaxed);
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: installs a handler that only performs an async-signal-safe write.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
    Ok(())
}

/// The read end of the signal pipe, in the VMM's event loop.
struct SignalPipe {
    reader: std::fs::File,
    count: u32,
    controller: vmm::VmmController,
}

impl MutEventSubscriber for SignalPipe {
    fn init(&mut self, ops: &mut EventOps) {
        if let Err(e) = ops.add(Events::new(&self.reader, EventSet::IN)) {
            log::warn!("signals will not be forwarded: {e}");
        }
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        use std::io::Read;
        let mut b = [0u8; 1];
        if self.reader.read(&mut b).map(|n| n == 1).unwrap_or(false) {
            self.count += 1;
            let action = if self.count == 1 {
                Action::Shutdown
            } else {
                Action::Stop
            };
            log::info!("signal received: {action:?}");
            if self.controller.send(action).is_ok() {
                return;
            }
        }
        let _ = ops.remove(events);
    }
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

/// One malloc arena for every thread. glibc gives each thread that allocates an arena of its
/// own (the CPUID helper's, then the vCPU's), a few resident pages each;
/// the VMM's threads allocate little and seldom, so sharing the main one costs nothing
/// measurable and saves ~16–20 KiB of RSS (docs/boot-time.md, "VMM memory").
fn one_malloc_arena() {
    // SAFETY: mallopt only sets a malloc parameter; called before any other thread exists.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
}

fn main() -> ExitCode {
    let start = Clock::now();
    let start_mono = monotonic_ns();
    one_malloc_arena();
    let (what, control_socket, level, exit_stats) = match Cli::parse() {
        Cli {
            command: Some(Command::Control { socket, request }),
            ..
        } => return control_client(&socket, &request),
        Cli { args, .. } => {
            let level = args.log_level;
            let control_socket = args.control_socket.clone();
            let exit_stats = args.exit_stats;
            match args.start() {
                Ok(w) => (w, control_socket, level, exit_stats),
                Err(e) => e.exit(),
            }
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
    let mut vmm = match built {
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
    if let Err(e) = forward_signals(&mut vmm) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn restore_and_control() {
        let c = Cli::try_parse_from([
            "microvm",
            "--restore",
            "/snap",
            "--paused",
            "--mem-mib",
            "64",
            "--disk",
            "path=/a.img",
            "--control-socket",
            "/c.sock",
        ])
        .unwrap();
        assert_eq!(c.args.control_socket.as_deref(), Some(Path::new("/c.sock")));
        match c.args.start().unwrap() {
            Start::Restore { rc, paused } => {
                assert!(paused);
                assert_eq!(rc.dir, Path::new("/snap"));
                assert_eq!(rc.expect_mem_mib, Some(64));
                assert_eq!(rc.disks.len(), 1);
            }
            Start::Boot(_) => panic!("a restore"),
        }
        for bad in [
            &["microvm", "--restore", "/snap", "--kernel", "/k"][..],
            &["microvm", "--kernel", "/k", "--paused"],
        ] {
            let e = Cli::try_parse_from(bad)
                .and_then(|c| c.args.start().map(|_| ()))
                .unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad:?}");
        }
        let c = Cli::try_parse_from(["microvm", "control", "/c.sock", "{}"]).unwrap();
        assert!(matches!(c.command, Some(Command::Control { .. })));
    }

    #[test]
    fn flags_override_and_repeat() {
        let a = Cli::try_parse_from([
            "microvm",
            "--kernel",
            "/k",
            "--vcpus",
            "2",
            "--disk",
            "path=/a.img,ro",
            "--disk",
            "path=/b.img",
            "--serial",
            "unix:/s",
            "--no-default-cmdline",
        ])
        .unwrap();
        let cfg = a.args.vm_config().unwrap();
        assert_eq!(cfg.vcpus, 2);
        assert_eq!(cfg.disks.len(), 2);
        assert!(cfg.disks[0].read_only);
        assert_eq!(cfg.serial, SerialConfig::Unix("/s".into()));
        assert!(!cfg.default_cmdline);
        let e = Cli::try_parse_from(["microvm"])
            .unwrap()
            .args
            .vm_config()
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
        assert_eq!(e.exit_code(), 2);
    }
}
