//! The VMM thread's event loop: a built [`Vmm`] runs here ([`Vmm::run`]) until the VM ends.
//! The control subscriber carries out the [`Action`]s and snapshot requests other threads
//! send (`actions.rs`), guest resets (in place when the VM keeps a boot image) and vCPU exits,
//! while device I/O runs on the same loop.

use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber, SubscriberOps};
use vmm_sys_util::eventfd::EventFd;

use crate::actions::{
    Action, Envelope, ExitReason, Reply, Request, RunTimings, VmStatus, VmmController,
};
use crate::devices::bus::Bus;
use crate::devices::interrupt::{PowerOffLine, ResetLine};
use crate::devices::legacy::boot_timer::{BootTime, GuestSignals};
use crate::devices::legacy::serial::OutputQueue;
use crate::devices::virtio::VmmEventManager;
use crate::lifecycle::{InvalidTransition, Lifecycle, VmState};
use crate::machine::Machine;
use crate::reboot::BootImage;
use crate::snapshot::{SnapshotSummary, SnapshotWriter};
use crate::threads::{ThreadHook, VmThread};
use crate::timing::{cpu_time_us, Clock};
use crate::vstate::exits::{AddressNames, ExitStats};
use crate::vstate::vcpu::{RunMarks, VcpuCmd, VcpuExitReason, VcpuHandle};

/// Why [`Vmm::run`] failed (the VM has ended either way).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Lifecycle(#[from] InvalidTransition),
    #[error("event loop: {0}")]
    EventLoop(String),
    #[error("VMM thread setup: {0}")]
    ThreadSetup(String),
}

/// Names exit addresses after the devices on the buses.
struct BusNames<'a> {
    pio: &'a Bus,
    mmio: &'a Bus,
}

impl AddressNames for BusNames<'_> {
    fn pio_name(&self, port: u16) -> Option<(String, String)> {
        self.pio.describe(u64::from(port))
    }
    fn mmio_name(&self, addr: u64) -> Option<(String, String)> {
        self.mmio.describe(addr)
    }
}

/// The state the control subscriber acts on.
pub(crate) struct Control {
    pub(crate) lifecycle: Lifecycle,
    pub(crate) vcpus: Vec<VcpuHandle>,
    pub(crate) machine: Machine,
    /// Raised by the i8042 and the ACPI reset register; lowered once a reboot paused the vCPUs.
    pub(crate) reset: ResetLine,
    /// Raised by the ACPI sleep control register on S5 (the vCPUs stay out of the guest).
    pub(crate) poweroff: PowerOffLine,
    pub(crate) vcpu_exit_evt: Arc<EventFd>,
    pub(crate) vcpu_exits: Receiver<(u8, VcpuExitReason)>,
    pub(crate) action_evt: Arc<EventFd>,
    pub(crate) actions: Receiver<Envelope>,
    pub(crate) exit: Option<ExitReason>,
    /// A restored VM tells `boot_notify` when its vCPUs first run.
    pub(crate) restored_notify: Option<(Clock, Sender<BootTime>)>,
    /// What an in-place reboot loads again; `None`: a guest reboot ends the VM.
    pub(crate) boot_image: Option<BootImage>,
    /// With a boot image: whether a reboot happens in place only when the guest uses ACPI.
    pub(crate) in_place_if_acpi: bool,
    /// The guest armed the GED at some point since it last booted (latched by the event loop's
    /// [`ACPI_POLL_MS`] tick: Linux frees the GED's interrupt in its `shutdown` hook, so the pin
    /// is masked again by the time the guest resets).
    pub(crate) acpi_seen: bool,
    pub(crate) reboots: u64,
    pub(crate) reboot_notify: Option<Sender<u64>>,
}

/// How often the event loop looks whether the guest armed the GED, until it has.
const ACPI_POLL_MS: i32 = 500;

/// Whether a guest reset reboots in place (given a boot image): always, or with
/// `in-place-if-acpi` when the guest armed the GED since it booted (`seen`) or has it armed now.
fn reboot_in_place(if_acpi: bool, seen: bool, armed_now: impl FnOnce() -> bool) -> bool {
    !if_acpi || seen || armed_now()
}

const EV_RESET: u32 = 0;
const EV_VCPU_EXIT: u32 = 1;
const EV_ACTION: u32 = 2;
const EV_POWEROFF: u32 = 3;

impl Control {
    fn set_vcpus(&mut self, cmd: VcpuCmd) -> Result<(), String> {
        for v in &mut self.vcpus {
            v.command(cmd).map_err(|e| e.to_string())?;
        }
        if cmd == VcpuCmd::Resume {
            if let Some((start, tx)) = self.restored_notify.take() {
                let _ = tx.send(BootTime {
                    wall_us: start.wall.elapsed().as_micros() as u64,
                    cpu_us: cpu_time_us().saturating_sub(start.cpu_us),
                });
            }
        }
        Ok(())
    }

    /// A guest-initiated reboot: in place when the VM keeps a boot image, else the VM ends.
    fn guest_reset(&mut self) {
        if self.exit.is_some() || self.lifecycle.state() == VmState::Stopped {
            return;
        }
        if self.boot_image.is_none() {
            self.finish(ExitReason::GuestReset);
            return;
        }
        if !reboot_in_place(self.in_place_if_acpi, self.acpi_seen, || {
            self.machine.power_button_armed()
        }) {
            log::info!("the guest does not use ACPI (it cannot power off): its reboot ends the VM");
            self.finish(ExitReason::GuestReset);
            return;
        }
        if let Err(e) = self.reboot() {
            log::error!("in-place reboot failed: {e}");
            self.finish(ExitReason::Fault(format!("in-place reboot failed: {e}")));
        }
    }

    /// Resets the VM to its boot state and runs it again (or leaves it paused when it was):
    /// every vCPU leaves the guest and turns its paravirtual MSRs off (else KVM may still write
    /// the old kernel's steal-time flag into the new kernel's RAM), the devices reset, the boot
    /// image puts irqchip and RAM back (reboot.rs), every vCPU goes back to its boot state.
    fn reboot(&mut self) -> Result<(), String> {
        let back_to = self.lifecycle.state();
        self.lifecycle
            .transition(VmState::Rebooting)
            .map_err(|e| e.to_string())?;
        let t0 = Instant::now();
        self.set_vcpus(VcpuCmd::Pause)?;
        // Reset requests the old boot made before its vCPUs stopped belong to this reboot: a
        // guest pulses the reset line more than once (Linux's keyboard reboot writes it up to
        // ten times per round) and other vCPUs may still be writing while the loop starts the
        // reboot. Left raised, one would reboot the new boot at once, or end the VM as "not
        // using ACPI" before the new boot armed the GED; lowering it lets the vCPUs run again.
        self.reset.lower();
        for v in &mut self.vcpus {
            v.paravirt_off().map_err(|e| e.to_string())?;
        }
        self.machine.reset_devices()?;
        let mut image = self.boot_image.take().ok_or("no boot image")?;
        let loaded = image.load(&self.machine.ram, &self.machine.vm);
        self.boot_image = Some(image);
        loaded.map_err(|e| e.to_string())?;
        for v in &mut self.vcpus {
            v.reset().map_err(|e| e.to_string())?;
        }
        self.reboots += 1;
        self.acpi_seen = false;
        // A guest can reboot in a loop: rate-limited like every line a guest triggers.
        crate::guest_log!(
            log::Level::Info,
            "guest rebooted in place (reboot {}; reset in {} us)",
            self.reboots,
            t0.elapsed().as_micros()
        );
        if let Some(tx) = &self.reboot_notify {
            let _ = tx.send(self.reboots);
        }
        self.lifecycle
            .transition(back_to)
            .map_err(|e| e.to_string())?;
        if back_to == VmState::Running {
            self.set_vcpus(VcpuCmd::Resume)?;
        }
        Ok(())
    }

    fn finish(&mut self, reason: ExitReason) {
        if self.exit.is_none() {
            self.exit = Some(reason);
        }
        if self.lifecycle.state() != VmState::Stopped {
            let _ = self.lifecycle.transition(VmState::Stopped);
        }
        for v in &mut self.vcpus {
            v.stop();
        }
    }

    fn apply(&mut self, action: Action) -> Result<VmState, String> {
        match action {
            Action::Pause => {
                self.lifecycle
                    .transition(VmState::Paused)
                    .map_err(|e| e.to_string())?;
                self.set_vcpus(VcpuCmd::Pause)?;
            }
            Action::Resume => {
                self.lifecycle
                    .transition(VmState::Running)
                    .map_err(|e| e.to_string())?;
                self.set_vcpus(VcpuCmd::Resume)?;
            }
            Action::CtrlAltDel => {
                if self.lifecycle.state() != VmState::Running {
                    return Err(format!(
                        "cannot send Ctrl-Alt-Del to a {} VM",
                        self.lifecycle.state()
                    ));
                }
                self.machine
                    .devices
                    .i8042
                    .lock()
                    .expect("i8042 lock")
                    .trigger_ctrl_alt_del();
            }
            Action::PowerButton => {
                if self.lifecycle.state() != VmState::Running {
                    return Err(format!(
                        "cannot press the power button of a {} VM",
                        self.lifecycle.state()
                    ));
                }
                let Some(pm) = &self.machine.devices.acpi_pm else {
                    return Err("the VM has no ACPI, so no power button".into());
                };
                pm.lock()
                    .expect("ACPI lock")
                    .press_power_button()
                    .map_err(|e| format!("power button: {e}"))?;
            }
            Action::Shutdown => {
                if self.machine.power_button_armed() {
                    log::info!("asking the guest to shut down: ACPI power button");
                    return self.apply(Action::PowerButton);
                }
                log::info!(
                    "asking the guest to shut down: Ctrl-Alt-Del ({})",
                    if self.machine.devices.acpi_pm.is_some() {
                        "the guest has not armed the ACPI power button"
                    } else {
                        "the VM has no ACPI"
                    }
                );
                return self.apply(Action::CtrlAltDel);
            }
            Action::Stop => {
                if self.lifecycle.state() == VmState::Stopped {
                    return Err("the VM is already stopped".into());
                }
                self.finish(ExitReason::Stopped);
            }
        }
        Ok(self.lifecycle.state())
    }

    /// The vCPUs' state and the IOAPIC's pins ([`crate::actions::VmmController::describe`]):
    /// a running VM is paused for the reading and runs again.
    fn describe(&mut self) -> Result<serde_json::Value, String> {
        let state = self.lifecycle.state();
        if state == VmState::Stopped {
            return Err("the VM is stopped".into());
        }
        self.machine
            .ensure_save_spec(crate::vstate::persist::VcpuCaps::probe(&self.machine.kvm))?;
        let was_running = state == VmState::Running;
        if was_running {
            self.apply(Action::Pause)?;
        }
        let vcpus: Vec<serde_json::Value> = self
            .vcpus
            .iter_mut()
            .map(|v| match v.save_state() {
                Ok(s) => crate::vstate::persist::describe_vcpu(&s),
                Err(e) => serde_json::json!({"id": v.id(), "error": e.to_string()}),
            })
            .collect();
        let ioapic = self.machine.describe_ioapic();
        if was_running {
            self.apply(Action::Resume)?;
        }
        Ok(serde_json::json!({"state": state.to_string(), "vcpus": vcpus, "ioapic": ioapic}))
    }

    /// Pauses the VM if it runs, writes the snapshot and leaves the VM paused; on failure a VM
    /// that was running runs again.
    fn snapshot(&mut self, files: SnapshotWriter) -> Result<SnapshotSummary, String> {
        let state = self.lifecycle.state();
        if state == VmState::Stopped {
            return Err("the VM is stopped".into());
        }
        let was_running = state == VmState::Running;
        let paused_at = Instant::now();
        if was_running {
            self.apply(Action::Pause)?;
        }
        let result = self.machine.save(&mut self.vcpus, files);
        match result {
            Ok(mut s) => {
                s.was_running = was_running;
                if was_running {
                    s.paused_us = paused_at.elapsed().as_micros() as u64;
                }
                log::info!(
                    "snapshot written in {} ms: {} MiB of RAM, {} KiB touched, {} KiB memory file data, {} KiB overlays",
                    s.write_us / 1000,
                    s.ram_bytes >> 20,
                    s.touched_bytes >> 10,
                    s.memory_bytes >> 10,
                    s.overlay_bytes >> 10
                );
                Ok(s)
            }
            Err(e) => {
                if was_running {
                    if let Err(r) = self.apply(Action::Resume) {
                        log::error!("resuming after a failed snapshot: {r}");
                    }
                }
                Err(format!("snapshot failed: {e}"))
            }
        }
    }
}

impl MutEventSubscriber for Control {
    fn init(&mut self, ops: &mut EventOps) {
        for (evt, data) in [
            (self.reset.eventfd(), EV_RESET),
            (self.poweroff.eventfd(), EV_POWEROFF),
            (self.vcpu_exit_evt.as_ref(), EV_VCPU_EXIT),
            (self.action_evt.as_ref(), EV_ACTION),
        ] {
            if let Err(e) = ops.add(Events::with_data(evt, data, EventSet::IN)) {
                log::error!("event loop: cannot watch control event {data}: {e}");
            }
        }
    }

    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        match events.data() {
            EV_RESET => {
                let _ = self.reset.eventfd().read();
                self.guest_reset();
            }
            EV_POWEROFF => {
                let _ = self.poweroff.eventfd().read();
                self.finish(ExitReason::GuestPowerOff);
            }
            EV_VCPU_EXIT => {
                let _ = self.vcpu_exit_evt.read();
                // One reset per batch: several vCPUs of one boot may each stop for it.
                let mut reset = false;
                while let Ok((id, reason)) = self.vcpu_exits.try_recv() {
                    let r = match reason {
                        VcpuExitReason::Reset => {
                            if !reset {
                                reset = true;
                                self.guest_reset();
                            }
                            continue;
                        }
                        VcpuExitReason::PowerOff => ExitReason::GuestPowerOff,
                        VcpuExitReason::Fault(msg) => {
                            log::debug!("vcpu{id} fault");
                            ExitReason::Fault(msg)
                        }
                    };
                    self.finish(r);
                }
            }
            EV_ACTION => {
                let _ = self.action_evt.read();
                while let Ok((req, reply)) = self.actions.try_recv() {
                    let result = match req {
                        Request::Action(action) => {
                            let r = self.apply(action);
                            if let Err(e) = &r {
                                log::warn!("action {action:?} refused: {e}");
                            }
                            r.map(Reply::State)
                        }
                        Request::State => Ok(Reply::State(self.lifecycle.state())),
                        Request::Status => Ok(Reply::Status(VmStatus {
                            state: self.lifecycle.state(),
                            reboots: self.reboots,
                        })),
                        Request::Snapshot(files) => {
                            let r = self.snapshot(files);
                            if let Err(e) = &r {
                                log::warn!("{e}");
                            }
                            r.map(Reply::Snapshot)
                        }
                        Request::Describe => self.describe().map(Reply::Describe),
                    };
                    if let Some(r) = reply {
                        let _ = r.send(result);
                    }
                }
            }
            _ => {}
        }
    }
}

/// A built VM, paused until [`Vmm::run`] (or [`Vmm::run_paused`] and a `Resume`).
pub struct Vmm {
    pub(crate) control: Arc<Mutex<Control>>,
    pub(crate) event_manager: VmmEventManager,
    pub(crate) controller: VmmController,
    pub(crate) marks: Arc<RunMarks>,
    /// The buses, to name the addresses of exits.
    pub(crate) pio: Bus,
    pub(crate) mmio: Bus,
    pub(crate) timings: RunTimings,
    pub(crate) first_debug_port_us: Arc<Mutex<Option<u64>>>,
    pub(crate) boot_time: Arc<Mutex<GuestSignals>>,
    pub(crate) cmdline: String,
    pub(crate) restored: bool,
    pub(crate) thread_hook: Option<ThreadHook>,
    pub(crate) console_queue: Option<Arc<OutputQueue>>,
}

impl Vmm {
    /// A handle other threads use to pause, resume, stop or snapshot this VM.
    pub fn controller(&self) -> VmmController {
        self.controller.clone()
    }

    /// The serial console's output queue (stdio and socket consoles): bytes dropped because
    /// the reader was too slow, bytes waiting.
    pub fn console_output(&self) -> Option<Arc<OutputQueue>> {
        self.console_queue.clone()
    }

    /// The full kernel command line the guest received.
    pub fn cmdline(&self) -> &str {
        &self.cmdline
    }

    /// Whether this VM came from a snapshot.
    pub fn is_restored(&self) -> bool {
        self.restored
    }

    /// How long building (or restoring) took, in microseconds.
    pub fn build_us(&self) -> u64 {
        self.timings.build_us
    }

    /// Resumes the vCPUs and runs the event loop on this thread until the VM ends.
    pub fn run(self) -> Result<(ExitReason, RunTimings), RunError> {
        self.run_with(VmState::Running)
    }

    /// Runs the event loop with the vCPUs paused: the VM waits for a `Resume` action, which only
    /// has to start the vCPUs (used for restores kept ready to go).
    pub fn run_paused(self) -> Result<(ExitReason, RunTimings), RunError> {
        self.run_with(VmState::Paused)
    }

    /// Adds `subscriber` to the event loop that [`Vmm::run`] runs on the calling thread:
    /// its events are handled there, between the VM's own (`microvm` watches its signal pipe
    /// this way, without a thread of its own).
    pub fn add_subscriber(&mut self, subscriber: Arc<Mutex<dyn MutEventSubscriber + Send>>) {
        self.event_manager.add_subscriber(subscriber);
    }

    fn run_with(mut self, first: VmState) -> Result<(ExitReason, RunTimings), RunError> {
        if let Some(hook) = self.thread_hook.take() {
            if let Err(e) = hook(VmThread::Vmm) {
                let mut c = self.control.lock().expect("control lock");
                c.finish(ExitReason::Fault(format!("VMM thread setup: {e}")));
                return Err(RunError::ThreadSetup(e));
            }
        }
        {
            let mut c = self.control.lock().expect("control lock");
            c.lifecycle.transition(first)?;
            if first == VmState::Running {
                c.set_vcpus(VcpuCmd::Resume).map_err(RunError::EventLoop)?;
            }
        }
        let reason = loop {
            if let Some(r) = self.control.lock().expect("control lock").exit.clone() {
                break r;
            }
            // Until the guest armed the GED, look every ACPI_POLL_MS whether it has (for
            // `in-place-if-acpi`); otherwise wait for events only.
            let poll = {
                let mut c = self.control.lock().expect("control lock");
                if c.in_place_if_acpi && c.boot_image.is_some() && !c.acpi_seen {
                    c.acpi_seen = c.machine.power_button_armed();
                }
                c.in_place_if_acpi && c.boot_image.is_some() && !c.acpi_seen
            };
            let ran = if poll {
                self.event_manager.run_with_timeout(ACPI_POLL_MS)
            } else {
                self.event_manager.run()
            };
            if let Err(e) = ran {
                let mut c = self.control.lock().expect("control lock");
                c.finish(ExitReason::Fault(format!("event loop failed: {e}")));
                return Err(RunError::EventLoop(e.to_string()));
            }
        };
        // Give the console reader the guest's last output (bounded: a reader that does not
        // read is not waited for).
        if let Some(q) = &self.console_queue {
            let end = std::time::Instant::now() + std::time::Duration::from_millis(500);
            while q.pending() > 0 && std::time::Instant::now() < end {
                if self.event_manager.run_with_timeout(10).is_err() {
                    break;
                }
            }
        }
        let reports: Vec<_> = {
            let mut c = self.control.lock().expect("control lock");
            c.vcpus.iter_mut().filter_map(|v| v.take_report()).collect()
        };
        self.timings.exits = ExitStats::collect(
            &reports,
            &BusNames {
                pio: &self.pio,
                mmio: &self.mmio,
            },
        );
        self.timings.first_debug_port_us = *self.first_debug_port_us.lock().expect("lock");
        let signals = *self.boot_time.lock().expect("lock");
        self.timings.boot_timer = signals.boot;
        self.timings.workload_exit_status = signals.exit_status;
        self.timings.first_vcpu_entry_us = self.marks.first_entry_us();
        self.timings.first_vcpu_exit_us = self.marks.first_exit_us();
        Ok((reason, self.timings))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guest_that_armed_the_ged_once_reboots_in_place() {
        // Linux masks the GED's pin again in its shutdown hook before it resets: what it did
        // earlier in the boot counts.
        assert!(reboot_in_place(true, true, || false));
        assert!(reboot_in_place(true, false, || true));
        assert!(!reboot_in_place(true, false, || false));
        assert!(reboot_in_place(false, false, || false));
    }
}
