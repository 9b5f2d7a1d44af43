//! Runs one VM: the VMM on its own thread (plus its vCPU threads), driven from the launcher's
//! main thread through the VMM's action channel; signals, boot notification, the control
//! socket and the grace-period timer all arrive as [`Event`]s on one channel.

use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use microvirt_crds::launcher_state::LauncherState;
use microvirt_crds::termination::{Reason, ShutdownOrigin, TerminationMessage};
use vmm::devices::legacy::boot_timer::BootTime;
use vmm::devices::legacy::serial::OutputQueue;
use vmm::devices::virtio::NetConfig;
use vmm::{
    Action, BuildOptions, ExitReason, RestoreConfig, ThreadHook, VmConfig, VmThread, Vmm,
    VmmController,
};

use crate::console::ConsoleHub;
use crate::control::{self, ControlServer};
use crate::launch::LaunchConfig;
use crate::seccomp;
use crate::status::{set_state, Event, SharedStatus, StatusCell};

/// Process exit codes (documented in README and `virt-launcher --help`), kept with the operator
/// in `microvirt_crds::termination`; each [`Reason`] has one.
pub use microvirt_crds::termination::exit_code;

/// Why the launcher ended and what it reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// One line for humans (the termination message's first line).
    pub message: String,
    /// Machine-readable reason; it gives the exit code ([`Outcome::exit_code`]).
    pub reason: Reason,
    pub boot_time_ms: Option<u64>,
    /// Set when the launcher was asked to stop the VM (signal or control socket), whatever the
    /// guest did then: the operator tells such a stop from one the guest chose.
    pub shutdown_requested: Option<ShutdownOrigin>,
}

impl Outcome {
    pub fn setup_failed(msg: impl Into<String>) -> Self {
        Self {
            message: format!("setup failed: {}", msg.into()),
            reason: Reason::SetupFailed,
            boot_time_ms: None,
            shutdown_requested: None,
        }
    }

    /// The boot disk holds nothing to boot (and no fallback kernel applies): exit code 3,
    /// reason `NoBootableKernel`, which the operator copies to the VMI's reason.
    pub fn no_bootable_kernel(msg: impl Into<String>) -> Self {
        Self {
            message: msg.into(),
            reason: Reason::NoBootableKernel,
            boot_time_ms: None,
            shutdown_requested: None,
        }
    }

    /// The process exit code: the reason's ([`Reason::exit_code`]).
    pub fn exit_code(&self) -> u8 {
        self.reason.exit_code()
    }

    /// The termination message (format: `microvirt_crds::termination`): the first line (at most
    /// 256 bytes), then `reason=`, `exitCode=`, `bootTimeMs=` and `shutdownRequested=` lines.
    pub fn termination_message(&self) -> String {
        TerminationMessage {
            message: self.message.clone(),
            reason: Some(self.reason.to_string()),
            exit_code: Some(i32::from(self.exit_code())),
            boot_time_ms: self.boot_time_ms,
            shutdown_requested: self.shutdown_requested,
        }
        .render()
    }
}

fn launcher_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialise it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t we own; the signal numbers are valid.
    unsafe {
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
    }
    set
}

/// Blocks SIGTERM, SIGINT and SIGHUP in this thread and every thread it spawns later; they
/// stay pending until [`forward_signals`] takes them. Call before spawning any thread.
pub fn block_signals() -> std::io::Result<()> {
    let set = launcher_signals();
    // SAFETY: changes this thread's signal mask with a valid set.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Forwards the signals blocked by [`block_signals`] to `events` from a dedicated thread.
pub fn forward_signals(events: Sender<Event>) -> std::io::Result<()> {
    let set = launcher_signals();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || loop {
            let mut sig: libc::c_int = 0;
            // SAFETY: waits for one of the blocked signals in `set`, writing its number to `sig`.
            let rc = unsafe { libc::sigwait(&set, &mut sig) };
            if rc != 0 {
                continue;
            }
            if events.send(Event::Signal(sig)).is_err() {
                return;
            }
        })?;
    Ok(())
}

/// The snapshot's disks and NIC are replaced by the VMI's, in order: each launch has its own
/// overlay (a copy of the snapshot's is made there) and TAP. The guest keeps its MAC.
fn restore_config(vm: &VmConfig, r: &crate::launch::Restore) -> RestoreConfig {
    RestoreConfig {
        dir: r.dir.clone(),
        disks: vm.disks.clone(),
        nets: vm
            .nets
            .iter()
            .map(|n| NetConfig {
                tap: n.tap.clone(),
                mac: None,
            })
            .collect(),
        serial: vm.serial.clone(),
        expect_mem_mib: Some(vm.mem_mib),
        expect_vcpus: Some(vm.vcpus),
    }
}

/// What the VMM thread hands back once the VM is built.
type Built = (VmmController, i32, Option<Arc<OutputQueue>>);

fn spawn_vmm(cfg: &mut LaunchConfig, events: Sender<Event>) -> Result<Built, String> {
    let (ready_tx, ready_rx) = channel::<Result<Built, String>>();
    let (boot_tx, boot_rx) = channel::<BootTime>();
    let (reboot_tx, reboot_rx) = channel::<u64>();
    let vm = cfg.vm.clone();
    let start = cfg.start;
    let kvm = cfg.kvm.take();
    let taps = std::mem::take(&mut cfg.taps);
    let use_seccomp = cfg.seccomp;
    let restore = cfg.restore.clone();
    let start_paused = cfg.start_paused;
    let exit_events = events.clone();
    std::thread::Builder::new()
        .name("vmm".into())
        .spawn(move || {
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            // The VM is built under the launcher's filter; once built, the VMM thread and
            // each vCPU thread stack their own tighter one (no files, sockets or threads).
            let thread_hook: Option<ThreadHook> = use_seccomp.then(|| {
                Arc::new(|t: VmThread| {
                    let role = match t {
                        VmThread::Vmm => seccomp::Role::Vmm,
                        VmThread::Vcpu(_) => seccomp::Role::Vcpu,
                    };
                    seccomp::apply_thread_filter(role, seccomp::Mismatch::KillProcess)
                        .map_err(|e| e.to_string())
                }) as ThreadHook
            });
            let opts = BuildOptions {
                start: Some(start),
                serial_out: None,
                boot_notify: Some(boot_tx),
                thread_hook,
                kvm,
                taps,
                reboot_notify: Some(reboot_tx),
            };
            let built = match &restore {
                None => Vmm::build(&vm, opts),
                Some(r) => Vmm::restore(&restore_config(&vm, r), opts),
            };
            let vmm = match built {
                Ok(v) => v,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return;
                }
            };
            let _ = ready_tx.send(Ok((vmm.controller(), tid, vmm.console_output())));
            let r = if start_paused || restore.as_ref().is_some_and(|r| r.paused) {
                vmm.run_paused()
            } else {
                vmm.run()
            }
            .map_err(|e| e.to_string());
            let _ = exit_events.send(Event::Exited(r));
        })
        .map_err(|e| format!("spawning the VMM thread: {e}"))?;
    let reboot_events = events.clone();
    std::thread::Builder::new()
        .name("boot-notify".into())
        .spawn(move || {
            for t in boot_rx {
                if events.send(Event::Booted(t)).is_err() {
                    return;
                }
            }
        })
        .map_err(|e| format!("spawning the boot thread: {e}"))?;
    std::thread::Builder::new()
        .name("reboot-notify".into())
        .spawn(move || {
            for n in reboot_rx {
                if reboot_events.send(Event::Rebooted(n)).is_err() {
                    return;
                }
            }
        })
        .map_err(|e| format!("spawning the reboot thread: {e}"))?;
    ready_rx
        .recv()
        .map_err(|_| "the VMM thread ended during build".to_string())?
}

/// Records the boot: status, announcement, booted marker. Returns the boot time in ms.
fn on_booted(cfg: &LaunchConfig, status: &SharedStatus, t: BootTime) -> u64 {
    let ms = t.wall_us / 1000;
    status.update(|s| s.boot_time_ms = Some(ms));
    if cfg.announce_boot {
        crate::console::emit_line(&format!(
            "virt-launcher: guest {} in {}.{:03} ms (cpu {} ms)",
            if cfg.restore.is_some() {
                "restored and running"
            } else {
                "booted"
            },
            t.wall_us / 1000,
            t.wall_us % 1000,
            t.cpu_us / 1000
        ));
    }
    if let Some(m) = &cfg.booted_marker {
        if let Err(e) = std::fs::write(m, format!("{ms}\n")) {
            log::error!("cannot write the booted marker {}: {e}", m.display());
        }
    }
    ms
}

/// Why the VM was stopped by the launcher.
#[derive(Clone, Copy, PartialEq, Eq)]
enum StopCause {
    GraceExpired,
    Requested,
}

/// Boots the VM and runs it to the end. `events`/`rx` is the main loop's channel (signals may
/// already be forwarded into it).
pub fn run(
    cfg: LaunchConfig,
    events: Sender<Event>,
    rx: std::sync::mpsc::Receiver<Event>,
) -> Outcome {
    let status: SharedStatus = Arc::new(StatusCell::new(cfg.status.clone()));
    set_state(&status, LauncherState::Starting);
    if let Some(m) = &cfg.booted_marker {
        let _ = std::fs::remove_file(m);
    }
    let mut cfg = cfg;
    let (controller, tid, console) = match spawn_vmm(&mut cfg, events.clone()) {
        Ok(c) => c,
        Err(e) => return Outcome::setup_failed(e),
    };
    status.update(|s| {
        let paused = cfg.start_paused || cfg.restore.as_ref().is_some_and(|r| r.paused);
        s.state = if paused {
            LauncherState::Paused
        } else {
            LauncherState::Running
        };
        s.vmm_tid = Some(tid);
        s.console = console.clone();
    });
    let hub = match &cfg.console_socket {
        Some(p) => match ConsoleHub::start(
            p,
            cfg.console_echo,
            cfg.console_stdin,
            Duration::from_secs(5),
        ) {
            Ok(h) => Some(h),
            Err(e) => {
                let _ = controller.request(Action::Stop);
                return Outcome::setup_failed(format!("console socket {}: {e}", p.display()));
            }
        },
        None => None,
    };
    let _server: Option<ControlServer> = match &cfg.control_socket {
        Some(path) => match control::serve(
            path,
            control::Context {
                controller: controller.clone(),
                status: status.clone(),
                events: events.clone(),
                console: hub.clone(),
                snapshot_dir: cfg.snapshot_dir.clone(),
            },
        ) {
            Ok(s) => Some(s),
            Err(e) => {
                let _ = controller.request(Action::Stop);
                return Outcome::setup_failed(format!("control socket {}: {e}", path.display()));
            }
        },
        None => None,
    };

    if cfg.restore.as_ref().is_some_and(|r| r.paused) {
        // A paused restore (a VM pool's warm member) is ready to be resumed now: its guest had
        // booted when the snapshot was taken. The node agent makes a paused warm member's pod
        // Ready (its readiness gate), so the pool can claim it; the guest's own "booted" (first
        // vCPU run) comes with the resume.
        if let Some(m) = &cfg.booted_marker {
            if let Err(e) = std::fs::write(m, "restored\n") {
                log::error!("cannot write the booted marker {}: {e}", m.display());
            }
        }
        log::info!("restored paused; waiting for unpause");
    }
    if cfg.start_paused {
        // Built, not run: the guest has not executed an instruction; `unpause` starts it.
        log::info!("startStrategy Paused: the VM is built and paused; waiting for unpause");
    }

    let mut deadline: Option<Instant> = None;
    let mut shutdown_requested = false;
    // Who first asked for the VM to stop (the termination message reports it).
    let mut requested_by: Option<ShutdownOrigin> = None;
    let mut stop_cause: Option<StopCause> = None;
    let mut boot_ms: Option<u64> = None;
    let result = loop {
        let ev = match deadline {
            Some(d) => match rx.recv_timeout(d.saturating_duration_since(Instant::now())) {
                Ok(ev) => ev,
                Err(RecvTimeoutError::Timeout) => {
                    log::warn!(
                        "the guest did not shut down within {} s; stopping the VM",
                        cfg.grace.as_secs_f64()
                    );
                    stop_cause.get_or_insert(StopCause::GraceExpired);
                    deadline = None;
                    let _ = controller.send(Action::Stop);
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break Err("event channel closed".into()),
            },
            None => match rx.recv() {
                Ok(ev) => ev,
                Err(_) => break Err("event channel closed".into()),
            },
        };
        let origin = match &ev {
            Event::Signal(_) => Some(ShutdownOrigin::Signal),
            Event::ShutdownRequested | Event::StopRequested => Some(ShutdownOrigin::Control),
            Event::Booted(_) | Event::Rebooted(_) | Event::Exited(_) => None,
        };
        requested_by = requested_by.or(origin);
        match ev {
            Event::Booted(t) => {
                if boot_ms.is_none() {
                    boot_ms = Some(on_booted(&cfg, &status, t));
                }
            }
            Event::Rebooted(n) => {
                // Rate-limited: a guest can reboot in a loop (the count stays exact).
                vmm::guest_log!(
                    log::Level::Info,
                    "the guest rebooted in place (reboot {n}); the VM keeps running"
                );
                status.update(|s| s.reboots = n);
            }
            Event::Signal(_) | Event::ShutdownRequested if !shutdown_requested => {
                shutdown_requested = true;
                log::info!(
                    "asking the guest to shut down (grace period {} s)",
                    cfg.grace.as_secs_f64()
                );
                let was_paused = status
                    .lock()
                    .map(|s| s.state == LauncherState::Paused)
                    .unwrap_or(false);
                set_state(&status, LauncherState::ShuttingDown);
                if was_paused {
                    // A paused guest cannot react; resume it first.
                    let _ = controller.request(Action::Resume);
                }
                // The ACPI power button when the guest armed it (a systemd guest powers off),
                // else Ctrl-Alt-Del (the VMM logs which).
                if let Err(e) = controller.request(Action::Shutdown) {
                    log::warn!("shutdown request: {e}");
                }
                deadline = Some(Instant::now() + cfg.grace);
            }
            Event::Signal(_) | Event::StopRequested => {
                log::warn!("stopping the VM now");
                stop_cause.get_or_insert(StopCause::Requested);
                deadline = None;
                let _ = controller.send(Action::Stop);
            }
            Event::ShutdownRequested => {}
            Event::Exited(r) => break r,
        }
    };
    // The guest's last output reaches the terminal before the launcher's closing lines.
    if let Some(h) = &hub {
        h.wait_closed(Duration::from_secs(2));
    }
    // The boot notification may still be in flight when the VM ends right after booting;
    // the run's own timings have it.
    if let (None, Ok((_, timings))) = (boot_ms, &result) {
        if let Some(t) = timings.boot_timer {
            boot_ms = Some(on_booted(&cfg, &status, t));
        }
    }
    if let Ok((_, timings)) = &result {
        log::info!("VM exits: {}", timings.exits.summary());
    }
    set_state(&status, LauncherState::Stopped);
    if let Some(dropped) = console.as_ref().map(|q| q.dropped()).filter(|d| *d > 0) {
        log::warn!("{dropped} bytes of guest console output were dropped: the console reader did not keep up");
    }
    if let Some(p) = &cfg.control_socket {
        let _ = std::fs::remove_file(p);
    }
    let workload = result
        .as_ref()
        .ok()
        .and_then(|(_, t)| t.workload_exit_status);
    let (reason, message) = match result {
        // A VM booted from an OCI image ends with its workload (docs/oci-images.md): a non-zero
        // status fails it, as it fails a Job's pod.
        Ok((ExitReason::GuestReset | ExitReason::GuestPowerOff, _)) if workload.is_some() => {
            let status = workload.unwrap_or_default();
            (
                if status == 0 {
                    Reason::GuestShutdown
                } else {
                    Reason::WorkloadFailed
                },
                format!("workload exited with status {status}"),
            )
        }
        Ok((ExitReason::GuestReset, _)) => (
            Reason::GuestShutdown,
            if shutdown_requested {
                "guest reset after the shutdown request".to_string()
            } else {
                "guest reset".to_string()
            },
        ),
        Ok((ExitReason::GuestPowerOff, _)) => (
            Reason::GuestShutdown,
            if shutdown_requested {
                "guest powered off after the shutdown request".to_string()
            } else {
                "guest powered off".to_string()
            },
        ),
        Ok((ExitReason::Stopped, _)) => match stop_cause {
            Some(StopCause::GraceExpired) => (
                Reason::GracePeriodExpired,
                format!(
                    "guest did not shut down within the {} s grace period; VM stopped",
                    cfg.grace.as_secs()
                ),
            ),
            _ => (Reason::Stopped, "VM stopped on request".to_string()),
        },
        Ok((ExitReason::Fault(msg), _)) => (Reason::GuestCrashed, format!("guest crashed: {msg}")),
        Err(e) => (Reason::VmmFailed, format!("VMM failed: {e}")),
    };
    Outcome {
        message,
        reason,
        boot_time_ms: boot_ms,
        shutdown_requested: requested_by,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn termination_message_format() {
        let o = Outcome {
            message: format!("guest crashed: {}\nsecond line", "x".repeat(300)),
            reason: Reason::GuestCrashed,
            boot_time_ms: Some(12),
            shutdown_requested: Some(ShutdownOrigin::Signal),
        };
        let m = o.termination_message();
        let lines: Vec<&str> = m.lines().collect();
        assert_eq!(lines[0].len(), 256);
        assert!(lines[0].starts_with("guest crashed: xxx"));
        assert_eq!(
            &lines[1..],
            [
                "reason=GuestCrashed",
                "exitCode=1",
                "bootTimeMs=12",
                "shutdownRequested=signal"
            ]
        );
        let s = Outcome::setup_failed("no kernel");
        assert_eq!(s.exit_code(), exit_code::SETUP);
        assert_eq!(
            s.termination_message(),
            "setup failed: no kernel\nreason=SetupFailed\nexitCode=3\n"
        );
    }
}
