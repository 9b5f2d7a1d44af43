//! Builds a VM paused — from a kernel ([`Vmm::build`], `build.rs`) or from a snapshot
//! ([`Vmm::restore`], `restore.rs`): guest memory, the boot image, the devices on their buses and
//! the vCPU threads. This file holds the embedding API (options, errors) and what both share: the
//! legacy devices and the final assembly. Running the VM is `event_loop.rs`'s job; what other
//! threads may ask of it is in `actions.rs`.

use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, OnceLock};

use event_manager::{MutEventSubscriber, SubscriberOps};
use kvm_ioctls::{Kvm, VmFd};
use vmm_sys_util::eventfd::EventFd;

use crate::acpi;
use crate::arch::x86_64::{boot, layout, mptable};
use crate::config::SerialConfig;
use crate::device_manager::attach::{AttachError, AttachedDevice, Devices};
use crate::device_manager::persist::{DeviceStates, PersistError};
use crate::devices::acpi::{AcpiPmArgs, AcpiPmDevice};
use crate::devices::bus::Bus;
use crate::devices::interrupt::{IrqLine, PowerOffLine, ResetLine};
use crate::devices::legacy::boot_timer::{BootTime, BootTimer, GuestSignals};
use crate::devices::legacy::debug_port::DebugPort;
use crate::devices::legacy::i8042::{I8042Args, I8042Device};
use crate::devices::legacy::serial::{
    ConsoleIo, OutputQueue, SerialArgs, SerialConsole, SerialDevice, SerialOut, StdoutWriter,
};
use crate::devices::virtio::{self, BlockConfig, NetConfig};
use crate::lifecycle::Lifecycle;
use crate::machine::Machine;
use crate::persist::Persist;
use crate::reboot::BootImage;
use crate::snapshot::host::HostError;
use crate::snapshot::state::MachineInfo;
use crate::snapshot::SnapshotError;
use crate::timing::Clock;
use crate::vstate::memory::GuestRam;
use crate::vstate::vcpu::{self, RunMarks, SaveSpec, Vcpu};
use crate::vstate::vm;

mod build;
mod restore;

/// The command line the VMM starts from (the user's is appended); every argument and why it is
/// there: vmm/README.md. Nothing here may disable what a distribution's initramfs needs (no
/// `nomodule`: it sets `modules_disabled=1`, and Debian's initramfs loads `virtio_mmio` and
/// `virtio_blk` as modules).
pub const DEFAULT_CMDLINE: &str =
    "reboot=k panic=1 pci=off i8042.noaux i8042.nomux i8042.dumbkbd swiotlb=noforce";

pub type Subscriber = Arc<Mutex<dyn MutEventSubscriber + Send>>;
pub use crate::devices::virtio::VmmEventManager;

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
    #[error(transparent)]
    Acpi(#[from] acpi::AcpiError),
    #[error(transparent)]
    VmGenId(#[from] acpi::vmgenid::VmGenIdError),
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
    Virtio(#[from] virtio::VirtioError),
    #[error(transparent)]
    Attach(#[from] AttachError),
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error("snapshot {dir}: {source}")]
    Host { dir: String, source: HostError },
    #[error("snapshot {dir}: {detail}")]
    Mismatch { dir: String, detail: String },
    #[error("snapshot {dir}: device {index}: {source}")]
    RestoreDevice {
        dir: String,
        index: usize,
        source: PersistError,
    },
    #[error("snapshot {dir}: {detail}")]
    RestoreState { dir: String, detail: String },
    #[error("KVM: {0}")]
    Kvm(String),
}

pub use crate::actions::{Action, ExitReason, RunTimings, VmStatus, VmmController};
use crate::event_loop::Control;
pub use crate::event_loop::{RunError, Vmm};
pub use crate::threads::{ThreadHook, VmThread};

/// Options for embedding the VMM (the launcher) and for tests.
#[derive(Default)]
pub struct BuildOptions {
    /// When the VM build started (boot time is measured from here). Defaults to now.
    pub start: Option<Clock>,
    /// Replaces where serial output goes (e.g. an in-memory buffer).
    pub serial_out: Option<SerialOut>,
    /// Receives the boot-timer event; for a restored VM, the moment its vCPUs first run.
    pub boot_notify: Option<Sender<BootTime>>,
    /// Per-thread setup once the VM is built (see [`ThreadHook`]).
    pub thread_hook: Option<ThreadHook>,
    /// `/dev/kvm`, opened by the embedder (default: opened here).
    pub kvm: Option<std::fs::File>,
    /// TAP queues opened by the embedder (`Tap::open`), used for the `nets` with the same
    /// TAP name; the others are opened here.
    pub taps: Vec<crate::devices::virtio::net::tap::Tap>,
    /// Receives the reboot count after each in-place reboot (`RebootPolicy::InPlace`).
    pub reboot_notify: Option<Sender<u64>>,
}

/// How to restore a VM from a snapshot ([`Vmm::restore`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestoreConfig {
    /// The snapshot directory.
    pub dir: PathBuf,
    /// Replacements, in order, for the snapshot's disks (its virtio-blk devices in slot
    /// order): image path, overlay path (the saved overlay is copied there), serial. Disks
    /// without an entry keep the snapshot's configuration.
    pub disks: Vec<BlockConfig>,
    /// Replacements, in order, for the snapshot's NICs: the TAP to attach to.
    pub nets: Vec<NetConfig>,
    /// Where the console goes (the snapshot does not record it).
    pub serial: SerialConfig,
    /// When given, the snapshot's RAM must be this size.
    pub expect_mem_mib: Option<u64>,
    /// When given, the snapshot must have this many vCPUs.
    pub expect_vcpus: Option<u64>,
}

/// Where the serial console's output goes and its input comes from.
/// The serial device's output, the console's I/O and the output queue (when the event loop
/// writes the output: stdout or a socket client).
fn serial_io(
    override_out: &Option<SerialOut>,
    serial: &SerialConfig,
) -> Result<(SerialOut, ConsoleIo, Option<Arc<OutputQueue>>), VmmError> {
    let queue = |replay: bool| {
        OutputQueue::new(replay)
            .map(Arc::new)
            .map_err(|e| VmmError::Device(format!("serial: {e}")))
    };
    Ok(match (override_out, serial) {
        (Some(out), _) => (out.clone(), ConsoleIo::None, None),
        (None, SerialConfig::Stdio) => {
            let out = StdoutWriter::open()
                .map_err(|e| VmmError::Device(format!("serial: stdout: {e}")))?;
            let q = queue(false)?;
            (
                SerialOut::Queue(q.clone()),
                ConsoleIo::Stdio { out },
                Some(q),
            )
        }
        (None, SerialConfig::None) => (SerialOut::Sink, ConsoleIo::None, None),
        (None, SerialConfig::Unix(path)) => {
            let shown = path.display().to_string();
            let _ = std::fs::remove_file(path);
            let listener = UnixListener::bind(path).map_err(|source| VmmError::SerialSocket {
                path: shown.clone(),
                source,
            })?;
            listener
                .set_nonblocking(true)
                .map_err(|source| VmmError::SerialSocket {
                    path: shown,
                    source,
                })?;
            let q = queue(true)?;
            (
                SerialOut::Queue(q.clone()),
                ConsoleIo::Socket { listener },
                Some(q),
            )
        }
    })
}

fn event_fd() -> Result<Arc<EventFd>, VmmError> {
    EventFd::new(libc::EFD_NONBLOCK)
        .map(Arc::new)
        .map_err(|e| VmmError::Device(e.to_string()))
}

/// What building and restoring share once the VM, memory and virtio devices exist.
struct Parts {
    kvm: Kvm,
    vm: Arc<VmFd>,
    ram: GuestRam,
    pio: Bus,
    mmio: Bus,
    event_manager: VmmEventManager,
    virtio: Vec<AttachedDevice>,
}

impl Parts {
    /// The VM and its memory, with empty buses and event loop and no virtio device yet.
    fn new(kvm: Kvm, vm: Arc<VmFd>, ram: GuestRam) -> Result<Parts, VmmError> {
        Ok(Parts {
            kvm,
            vm,
            ram,
            pio: Bus::new(),
            mmio: Bus::new(),
            event_manager: VmmEventManager::new()
                .map_err(|e| VmmError::EventLoop(e.to_string()))?,
            virtio: Vec::new(),
        })
    }
}

/// The legacy devices; the serial and i8042 come from a snapshot when `saved` is given.
struct Legacy {
    serial: Arc<Mutex<SerialDevice>>,
    console_queue: Option<Arc<OutputQueue>>,
    i8042: Arc<Mutex<I8042Device>>,
    /// The ACPI registers, when the VM has ACPI.
    acpi_pm: Option<Arc<Mutex<AcpiPmDevice>>>,
    reset: ResetLine,
    poweroff: PowerOffLine,
    first_debug_port_us: Arc<Mutex<Option<u64>>>,
    boot_time: Arc<Mutex<GuestSignals>>,
}

fn legacy_devices(
    p: &mut Parts,
    opts: &BuildOptions,
    serial_cfg: &SerialConfig,
    start: Clock,
    acpi: bool,
    saved: Option<&DeviceStates>,
) -> Result<Legacy, VmmError> {
    let vm = p.vm.clone();
    let irq = |gsi: u32| -> Result<IrqLine, VmmError> {
        let line = IrqLine::new(gsi).map_err(|e| VmmError::Device(format!("eventfd: {e}")))?;
        vm.register_irqfd(line.eventfd(), gsi)
            .map_err(|source| VmmError::Irqfd { gsi, source })?;
        Ok(line)
    };
    let (serial_out, console_io, console_queue) = serial_io(&opts.serial_out, serial_cfg)?;
    let line = irq(layout::SERIAL_IRQ)?;
    let serial_err = |e: &dyn std::fmt::Display| VmmError::Device(format!("serial: {e}"));
    let (serial, drained) = match saved {
        Some(s) => {
            let args = SerialArgs {
                irq: line,
                out: serial_out,
            };
            let d = SerialDevice::restore(args, &s.serial).map_err(|e| serial_err(&e))?;
            let drained = d.fifo_drained();
            (d, drained)
        }
        None => SerialDevice::new(line, serial_out).map_err(|e| serial_err(&e))?,
    };
    let serial = Arc::new(Mutex::new(serial));
    let bus_err = |e: crate::devices::bus::BusError| VmmError::Device(e.to_string());
    p.pio
        .insert_named(serial.clone(), u64::from(layout::SERIAL_PORT), 8, "serial")
        .map_err(bus_err)?;
    p.event_manager
        .add_subscriber(Arc::new(Mutex::new(SerialConsole::new(
            serial.clone(),
            console_io,
            drained,
            console_queue.clone(),
        ))));

    let reset = ResetLine::new().map_err(|e| VmmError::Device(format!("eventfd: {e}")))?;
    let i8042_irq = irq(layout::I8042_IRQ)?;
    let i8042 = match saved {
        Some(s) => {
            let args = I8042Args {
                reset: reset.clone(),
                irq: i8042_irq,
            };
            let Ok(d) = I8042Device::restore(args, &s.i8042);
            d
        }
        None => I8042Device::new(reset.clone(), i8042_irq),
    };
    let i8042 = Arc::new(Mutex::new(i8042));
    p.pio
        .insert_named(i8042.clone(), u64::from(layout::I8042_PORT), 5, "i8042")
        .map_err(bus_err)?;
    // The ACPI registers (the FADT's and the GED's), handled inline on vCPU threads like the
    // i8042: see devices/acpi.rs.
    let poweroff = PowerOffLine::new().map_err(|e| VmmError::Device(format!("eventfd: {e}")))?;
    let acpi_pm = if acpi {
        let args = AcpiPmArgs {
            ged_irq: irq(layout::ACPI_GED_IRQ)?,
            reset: reset.clone(),
            poweroff: poweroff.clone(),
        };
        let pm = match saved.and_then(|s| s.acpi_pm.as_ref()) {
            Some(st) => {
                let Ok(pm) = AcpiPmDevice::restore(args, st);
                pm
            }
            None => AcpiPmDevice::new(args.ged_irq, args.reset, args.poweroff),
        };
        let pm = Arc::new(Mutex::new(pm));
        p.pio
            .insert_named(
                pm.clone(),
                u64::from(layout::ACPI_PM_PORT),
                u64::from(layout::ACPI_PM_PORT_LEN),
                "acpi",
            )
            .map_err(bus_err)?;
        Some(pm)
    } else {
        None
    };
    let first_debug_port_us = Arc::new(Mutex::new(None));
    p.pio
        .insert_named(
            Arc::new(Mutex::new(DebugPort::new(
                start,
                first_debug_port_us.clone(),
            ))),
            0x80,
            1,
            "post-code",
        )
        .map_err(bus_err)?;
    let boot_time = Arc::new(Mutex::new(GuestSignals::default()));
    let notify = if saved.is_some() {
        None
    } else {
        opts.boot_notify.clone()
    };
    p.mmio
        .insert_named(
            Arc::new(Mutex::new(BootTimer::new(start, notify, boot_time.clone()))),
            layout::BOOT_TIMER_ADDR,
            layout::BOOT_TIMER_SIZE,
            "boot-timer",
        )
        .map_err(bus_err)?;
    Ok(Legacy {
        serial,
        console_queue,
        i8042,
        acpi_pm,
        reset,
        poweroff,
        first_debug_port_us,
        boot_time,
    })
}

impl Vmm {
    #[allow(clippy::too_many_arguments)]
    fn assemble(
        mut p: Parts,
        legacy: Legacy,
        vcpus: Vec<Vcpu>,
        save_spec: Arc<OnceLock<SaveSpec>>,
        info: MachineInfo,
        start: Clock,
        marks: Arc<RunMarks>,
        restored_notify: Option<(Clock, Sender<BootTime>)>,
        thread_hook: Option<ThreadHook>,
        reboots: Reboots,
    ) -> Result<Vmm, VmmError> {
        let (exit_tx, exit_rx) = channel();
        let vcpu_exit_evt = event_fd()?;
        let mut handles = Vec::with_capacity(vcpus.len());
        for v in vcpus {
            handles.push(v.start_paused(
                exit_tx.clone(),
                vcpu_exit_evt.clone(),
                thread_hook.clone(),
            )?);
        }
        let cmdline = info.cmdline.clone();
        let (pio, mmio) = (p.pio.clone(), p.mmio.clone());
        let machine = Machine {
            kvm: p.kvm,
            vm: p.vm.clone(),
            ram: p.ram,
            devices: Devices {
                serial: legacy.serial,
                i8042: legacy.i8042,
                acpi_pm: legacy.acpi_pm,
                virtio: p.virtio,
            },
            info,
            save_spec,
        };
        let overlay_devices = Arc::new(machine.overlay_devices());
        let (action_tx, action_rx) = channel();
        let action_evt = event_fd()?;
        let control = Arc::new(Mutex::new(Control {
            lifecycle: Lifecycle::default(),
            vcpus: handles,
            machine,
            reset: legacy.reset,
            poweroff: legacy.poweroff,
            vcpu_exit_evt,
            vcpu_exits: exit_rx,
            action_evt: action_evt.clone(),
            actions: action_rx,
            exit: None,
            restored_notify,
            boot_image: reboots.image,
            in_place_if_acpi: reboots.if_acpi,
            acpi_seen: false,
            reboots: 0,
            reboot_notify: reboots.notify,
        }));
        p.event_manager.add_subscriber(control.clone());
        let timings = RunTimings {
            build_us: start.wall.elapsed().as_micros() as u64,
            ..Default::default()
        };
        Ok(Vmm {
            control,
            event_manager: p.event_manager,
            controller: VmmController {
                tx: action_tx,
                evt: action_evt,
                overlay_devices,
            },
            marks,
            pio,
            mmio,
            timings,
            first_debug_port_us: legacy.first_debug_port_us,
            boot_time: legacy.boot_time,
            cmdline,
            restored: false,
            thread_hook,
            console_queue: legacy.console_queue,
        })
    }
}

/// How the I/O thread of disk `index` (its virtio device index) starts.
fn block_io(index: usize) -> virtio::block::IoThreadOptions {
    virtio::block::IoThreadOptions {
        name: Some(format!("blk-io{index}")),
        setup: None,
    }
}

/// In-place reboots of an assembled VM: the boot image (none: a reboot ends the VM) and who
/// is told of each.
struct Reboots {
    image: Option<BootImage>,
    if_acpi: bool,
    notify: Option<Sender<u64>>,
}
