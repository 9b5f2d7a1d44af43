//! Builds a VM paused (memory, kernel, devices, vCPUs), then runs it on the
//! calling thread: the VMM thread runs the event loop (device I/O, control
//! actions, vCPU exits) while each vCPU runs on its own thread.

use std::os::unix::net::UnixListener;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};

use event_manager::{EventManager, EventOps, EventSet, Events, MutEventSubscriber, SubscriberOps};
use kvm_bindings::KVM_MAX_CPUID_ENTRIES;
use kvm_ioctls::VmFd;
use vmm_sys_util::eventfd::EventFd;

use crate::arch::x86_64::{boot, layout, mptable};
use crate::config::{SerialConfig, VmConfig};
use crate::device_manager::mmio::MmioDeviceManager;
use crate::devices::bus::Bus;
use crate::devices::interrupt::IrqLine;
use crate::devices::legacy::boot_timer::{BootTime, BootTimer};
use crate::devices::legacy::debug_port::DebugPort;
use crate::devices::legacy::i8042::I8042Device;
use crate::devices::legacy::serial::{
    InputSource, SerialDevice, SerialInput, SerialOut, SocketConsole,
};
use crate::devices::virtio;
use crate::lifecycle::{InvalidTransition, Lifecycle, VmState};
use crate::timing::Clock;
use crate::vstate::memory::GuestMemoryMmap;
use crate::vstate::vcpu::{
    self, ExitStats, Vcpu, VcpuCmd, VcpuContext, VcpuExitReason, VcpuHandle,
};
use crate::vstate::vm;

/// The command line the VMM starts from (the user's is appended).
pub const DEFAULT_CMDLINE: &str =
    "reboot=k panic=1 pci=off nomodule i8042.noaux i8042.nomux i8042.dumbkbd swiotlb=noforce";

pub type Subscriber = Arc<Mutex<dyn MutEventSubscriber + Send>>;
pub type VmmEventManager = EventManager<Subscriber>;

#[derive(Debug, thiserror::Error)]
pub enum VmmError {
    #[error("invalid configuration: {0}")]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Vm(#[from] vm::VmError),
    #[error(transparent)]
    Vcpu(#[from] vcpu::VcpuError),
    #[error(transparent)]
    Boot(#[from] boot::BootError),
    #[error(transparent)]
    Mptable(#[from] mptable::MptableError),
    #[error("allocating {mib} MiB of guest memory: {detail}")]
    GuestMemory { mib: u64, detail: String },
    #[error("KVM_GET_SUPPORTED_CPUID: {0}")]
    Cpuid(kvm_ioctls::Error),
    #[error("registering irqfd for GSI {gsi}: {source}")]
    Irqfd { gsi: u32, source: kvm_ioctls::Error },
    #[error("device setup: {0}")]
    Device(String),
    #[error("serial socket {path}: {source}")]
    SerialSocket {
        path: String,
        source: std::io::Error,
    },
    #[error("event loop: {0}")]
    EventLoop(String),
    #[error(transparent)]
    Lifecycle(#[from] InvalidTransition),
    #[error(transparent)]
    Virtio(#[from] virtio::VirtioError),
}

/// How a VM run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExitReason {
    /// The guest reset the machine (i8042 or KVM reset event).
    GuestReset,
    /// The guest powered off / halted.
    GuestPowerOff,
    /// A `Stop` action ended the VM.
    Stopped,
    /// A vCPU hit something the VMM cannot continue from.
    Fault(String),
}

impl ExitReason {
    /// Process exit status for this reason: 0 when the guest shut itself down.
    pub fn exit_code(&self) -> i32 {
        match self {
            ExitReason::GuestReset | ExitReason::GuestPowerOff => 0,
            ExitReason::Stopped => 2,
            ExitReason::Fault(_) => 1,
        }
    }
}

/// Requests other threads can send to a running VMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Pause,
    Resume,
    /// Ask the guest to shut down (Ctrl-Alt-Del through the i8042).
    CtrlAltDel,
    /// Stop now.
    Stop,
}

/// An action and where to send its outcome.
type ActionRequest = (Action, Option<Sender<Result<VmState, String>>>);

/// A handle to send [`Action`]s to the VMM thread.
#[derive(Clone)]
pub struct VmmController {
    tx: Sender<ActionRequest>,
    evt: Arc<EventFd>,
}

impl VmmController {
    /// Sends `action` and waits for the VMM thread to carry it out; returns the new state.
    pub fn request(&self, action: Action) -> Result<VmState, String> {
        let (reply_tx, reply_rx) = channel();
        self.tx
            .send((action, Some(reply_tx)))
            .map_err(|_| "the VM is gone".to_string())?;
        self.evt.write(1).map_err(|e| e.to_string())?;
        reply_rx.recv().map_err(|_| "the VM is gone".to_string())?
    }

    /// Sends `action` without waiting.
    pub fn send(&self, action: Action) -> Result<(), String> {
        self.tx
            .send((action, None))
            .map_err(|_| "the VM is gone".to_string())?;
        self.evt.write(1).map_err(|e| e.to_string())
    }
}

/// Options for embedding the VMM (the launcher) and for tests.
#[derive(Default)]
pub struct BuildOptions {
    /// When the VM build started (boot time is measured from here). Defaults to now.
    pub start: Option<Clock>,
    /// Replaces where serial output goes (e.g. an in-memory buffer).
    pub serial_out: Option<SerialOut>,
    /// Receives the boot-timer event.
    pub boot_notify: Option<Sender<BootTime>>,
}

/// Timestamps of a run, relative to the build start.
#[derive(Clone, Debug, Default)]
pub struct RunTimings {
    pub build_us: u64,
    pub first_debug_port_us: Option<u64>,
    pub boot_timer: Option<BootTime>,
}

/// The state the control subscriber acts on.
struct Control {
    lifecycle: Lifecycle,
    vcpus: Vec<VcpuHandle>,
    i8042: Arc<Mutex<I8042Device>>,
    reset_evt: Arc<EventFd>,
    vcpu_exit_evt: Arc<EventFd>,
    vcpu_exits: Receiver<(u8, VcpuExitReason)>,
    action_evt: Arc<EventFd>,
    actions: Receiver<ActionRequest>,
    exit: Option<ExitReason>,
}

const EV_RESET: u32 = 0;
const EV_VCPU_EXIT: u32 = 1;
const EV_ACTION: u32 = 2;

impl Control {
    fn set_vcpus(&mut self, cmd: VcpuCmd) -> Result<(), String> {
        for v in &mut self.vcpus {
            v.command(cmd).map_err(|e| e.to_string())?;
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
                self.i8042
                    .lock()
                    .expect("i8042 lock")
                    .trigger_ctrl_alt_del();
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
}

impl MutEventSubscriber for Control {
    fn init(&mut self, ops: &mut EventOps) {
        for (evt, data) in [
            (&self.reset_evt, EV_RESET),
            (&self.vcpu_exit_evt, EV_VCPU_EXIT),
            (&self.action_evt, EV_ACTION),
        ] {
            if let Err(e) = ops.add(Events::with_data(evt.as_ref(), data, EventSet::IN)) {
                log::error!("event loop: cannot watch control event {data}: {e}");
            }
        }
    }

    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        match events.data() {
            EV_RESET => {
                let _ = self.reset_evt.read();
                self.finish(ExitReason::GuestReset);
            }
            EV_VCPU_EXIT => {
                let _ = self.vcpu_exit_evt.read();
                while let Ok((id, reason)) = self.vcpu_exits.try_recv() {
                    let r = match reason {
                        VcpuExitReason::Reset => ExitReason::GuestReset,
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
                while let Ok((action, reply)) = self.actions.try_recv() {
                    let result = self.apply(action);
                    if let Err(e) = &result {
                        log::warn!("action {action:?} refused: {e}");
                    }
                    if let Some(r) = reply {
                        let _ = r.send(result);
                    }
                }
            }
            _ => {}
        }
    }
}

/// A built VM, paused until [`Vmm::run`].
pub struct Vmm {
    control: Arc<Mutex<Control>>,
    event_manager: VmmEventManager,
    controller: VmmController,
    stats: Arc<ExitStats>,
    timings: RunTimings,
    first_debug_port_us: Arc<Mutex<Option<u64>>>,
    boot_time: Arc<Mutex<Option<BootTime>>>,
    cmdline: String,
    // Keep the VM and its memory alive for as long as vCPUs may run (dropped last).
    _vm: Arc<VmFd>,
    _mem: GuestMemoryMmap,
}

fn compose_cmdline(cfg: &VmConfig, device_entries: &[String]) -> String {
    let mut parts: Vec<String> = Vec::new();
    if cfg.default_cmdline {
        if cfg.serial != SerialConfig::None {
            parts.push("console=ttyS0".into());
        }
        parts.push(DEFAULT_CMDLINE.into());
    }
    parts.extend(device_entries.iter().cloned());
    if let Some(user) = cfg
        .cmdline
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        parts.push(user.to_string());
    }
    parts.join(" ")
}

impl Vmm {
    /// Builds the whole VM, paused: nothing guest-visible has run when this returns.
    pub fn build(cfg: &VmConfig, opts: BuildOptions) -> Result<Vmm, VmmError> {
        let start = opts.start.unwrap_or_else(Clock::now);
        cfg.validate()?;
        let vcpu_count = cfg.vcpu_count();
        let mem_size = cfg.mem_mib << 20;

        let kvm = vm::open_kvm()?;
        let mem = GuestMemoryMmap::from_ranges(&boot::memory_regions(mem_size)).map_err(|e| {
            VmmError::GuestMemory {
                mib: cfg.mem_mib,
                detail: e.to_string(),
            }
        })?;
        let vm = Arc::new(vm::create_vm(&kvm, &mem)?);

        // Kernel, initrd, command line, boot information, MP table.
        let kernel = boot::load_kernel(&mem, mem_size, &cfg.kernel)?;
        let initrd = match &cfg.initrd {
            Some(p) => Some(boot::load_initrd(&mem, mem_size, p, &kernel)?),
            None => None,
        };
        let mut event_manager =
            VmmEventManager::new().map_err(|e| VmmError::EventLoop(e.to_string()))?;
        let mut pio = Bus::new();
        let mut mmio = Bus::new();

        // virtio devices: the device manager assigns slots and IRQs, in config order.
        let mut mmio_mgr = MmioDeviceManager::new();
        for disk in &cfg.disks {
            virtio::attach_block(
                &vm,
                &mem,
                &mut mmio,
                &mut mmio_mgr,
                &mut event_manager,
                disk,
            )?;
        }
        for net in &cfg.nets {
            virtio::attach_net(&vm, &mem, &mut mmio, &mut mmio_mgr, &mut event_manager, net)?;
        }

        let cmdline = compose_cmdline(cfg, &mmio_mgr.cmdline_entries());
        boot::write_cmdline(&mem, &cmdline)?;
        boot::write_boot_info(&mem, &kernel, mem_size, cmdline.len(), initrd)?;
        mptable::setup(&mem, vcpu_count)?;

        // Legacy devices.
        let irq = |gsi: u32| -> Result<IrqLine, VmmError> {
            let line = IrqLine::new(gsi).map_err(|e| VmmError::Device(format!("eventfd: {e}")))?;
            vm.register_irqfd(line.eventfd(), gsi)
                .map_err(|source| VmmError::Irqfd { gsi, source })?;
            Ok(line)
        };
        let (serial_out, input) = match (&opts.serial_out, &cfg.serial) {
            (Some(out), _) => (out.clone(), InputSource::None),
            (None, SerialConfig::Stdio) => (SerialOut::Stdout, InputSource::Stdin),
            (None, SerialConfig::None) => (SerialOut::Sink, InputSource::None),
            (None, SerialConfig::Unix(path)) => {
                let shown = path.display().to_string();
                let _ = std::fs::remove_file(path);
                let listener =
                    UnixListener::bind(path).map_err(|source| VmmError::SerialSocket {
                        path: shown.clone(),
                        source,
                    })?;
                listener
                    .set_nonblocking(true)
                    .map_err(|source| VmmError::SerialSocket {
                        path: shown,
                        source,
                    })?;
                let console = Arc::new(Mutex::new(SocketConsole::default()));
                (
                    SerialOut::Socket(console.clone()),
                    InputSource::Socket { listener, console },
                )
            }
        };
        let (serial, drained) = SerialDevice::new(irq(layout::SERIAL_IRQ)?, serial_out)
            .map_err(|e| VmmError::Device(format!("serial: {e}")))?;
        let serial = Arc::new(Mutex::new(serial));
        let bus_err = |e: crate::devices::bus::BusError| VmmError::Device(e.to_string());
        pio.insert(serial.clone(), u64::from(layout::SERIAL_PORT), 8)
            .map_err(bus_err)?;
        event_manager.add_subscriber(Arc::new(Mutex::new(SerialInput::new(
            serial, input, drained,
        ))));

        let reset_evt = Arc::new(
            EventFd::new(libc::EFD_NONBLOCK).map_err(|e| VmmError::Device(e.to_string()))?,
        );
        let i8042 = Arc::new(Mutex::new(I8042Device::new(
            reset_evt.clone(),
            irq(layout::I8042_IRQ)?,
        )));
        pio.insert(i8042.clone(), u64::from(layout::I8042_PORT), 5)
            .map_err(bus_err)?;
        let first_debug_port_us = Arc::new(Mutex::new(None));
        pio.insert(
            Arc::new(Mutex::new(DebugPort::new(
                start,
                first_debug_port_us.clone(),
            ))),
            0x80,
            1,
        )
        .map_err(bus_err)?;
        let boot_time = Arc::new(Mutex::new(None));
        mmio.insert(
            Arc::new(Mutex::new(BootTimer::new(
                start,
                opts.boot_notify,
                boot_time.clone(),
            ))),
            layout::BOOT_TIMER_ADDR,
            layout::BOOT_TIMER_SIZE,
        )
        .map_err(bus_err)?;

        // vCPUs, created paused.
        vcpu::install_kick_handler()?;
        let base_cpuid = kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(VmmError::Cpuid)?;
        let stats = Arc::new(ExitStats::default());
        let ctx = VcpuContext {
            vm: &vm,
            mem: &mem,
            base_cpuid: &base_cpuid,
            count: vcpu_count,
            pio: Arc::new(pio),
            mmio: Arc::new(mmio),
            stats: stats.clone(),
        };
        let (exit_tx, exit_rx) = channel();
        let vcpu_exit_evt = Arc::new(
            EventFd::new(libc::EFD_NONBLOCK).map_err(|e| VmmError::Device(e.to_string()))?,
        );
        let mut vcpus = Vec::with_capacity(vcpu_count as usize);
        for id in 0..vcpu_count {
            let boot = (id == 0).then_some((kernel.protocol, kernel.entry));
            let v = Vcpu::new(&ctx, id, boot)?;
            vcpus.push(v.start_paused(exit_tx.clone(), vcpu_exit_evt.clone())?);
        }

        let (action_tx, action_rx) = channel();
        let action_evt = Arc::new(
            EventFd::new(libc::EFD_NONBLOCK).map_err(|e| VmmError::Device(e.to_string()))?,
        );
        let control = Arc::new(Mutex::new(Control {
            lifecycle: Lifecycle::default(),
            vcpus,
            i8042,
            reset_evt,
            vcpu_exit_evt,
            vcpu_exits: exit_rx,
            action_evt: action_evt.clone(),
            actions: action_rx,
            exit: None,
        }));
        event_manager.add_subscriber(control.clone());
        let timings = RunTimings {
            build_us: start.wall.elapsed().as_micros() as u64,
            ..Default::default()
        };
        log::debug!(
            "built VM: {} vCPU(s), {} MiB, {:?} entry {:#x}, in {} us",
            vcpu_count,
            cfg.mem_mib,
            kernel.protocol,
            kernel.entry,
            timings.build_us
        );
        Ok(Vmm {
            control,
            event_manager,
            controller: VmmController {
                tx: action_tx,
                evt: action_evt,
            },
            stats,
            timings,
            first_debug_port_us,
            boot_time,
            cmdline,
            _vm: vm,
            _mem: mem,
        })
    }

    /// A handle other threads use to pause, resume or stop this VM.
    pub fn controller(&self) -> VmmController {
        self.controller.clone()
    }

    /// The full kernel command line the guest received.
    pub fn cmdline(&self) -> &str {
        &self.cmdline
    }

    /// Resumes the vCPUs and runs the event loop on this thread until the VM ends.
    pub fn run(mut self) -> Result<(ExitReason, RunTimings), VmmError> {
        {
            let mut c = self.control.lock().expect("control lock");
            c.lifecycle.transition(VmState::Running)?;
            c.set_vcpus(VcpuCmd::Resume).map_err(VmmError::EventLoop)?;
        }
        let reason = loop {
            if let Some(r) = self.control.lock().expect("control lock").exit.clone() {
                break r;
            }
            if let Err(e) = self.event_manager.run() {
                let mut c = self.control.lock().expect("control lock");
                c.finish(ExitReason::Fault(format!("event loop failed: {e}")));
                return Err(VmmError::EventLoop(e.to_string()));
            }
        };
        let unknown_pio = self.stats.unknown_pio.load(Ordering::Relaxed);
        let unknown_mmio = self.stats.unknown_mmio.load(Ordering::Relaxed);
        if unknown_pio + unknown_mmio > 0 {
            log::debug!("unknown accesses ignored: {unknown_pio} port I/O, {unknown_mmio} MMIO");
        }
        self.timings.first_debug_port_us = *self.first_debug_port_us.lock().expect("lock");
        self.timings.boot_timer = *self.boot_time.lock().expect("lock");
        Ok((reason, self.timings))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmdline_composition() {
        let mut cfg = VmConfig::new("/k");
        cfg.cmdline = Some(" quiet ".into());
        let c = compose_cmdline(&cfg, &["virtio_mmio.device=4K@0xc0001000:5".into()]);
        assert!(c.starts_with("console=ttyS0 reboot=k"));
        assert!(c.ends_with("virtio_mmio.device=4K@0xc0001000:5 quiet"));
        cfg.serial = SerialConfig::None;
        cfg.default_cmdline = false;
        assert_eq!(compose_cmdline(&cfg, &[]), "quiet");
        assert_eq!(ExitReason::GuestReset.exit_code(), 0);
        assert_ne!(ExitReason::Fault("x".into()).exit_code(), 0);
    }
}
