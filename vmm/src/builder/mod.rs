//! Builds a VM paused — from a kernel ([`Vmm::build`]) or from a snapshot ([`Vmm::restore`]):
//! guest memory, the boot image, the devices on their buses and the vCPU threads. Running it
//! is `event_loop.rs`'s job; what other threads may ask of it is in `actions.rs`.

use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, OnceLock};

use event_manager::{MutEventSubscriber, SubscriberOps};
use kvm_bindings::CpuId;
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use vm_memory::GuestAddress;
use vmm_sys_util::eventfd::EventFd;

use crate::acpi;
use crate::arch::x86_64::{boot, cpuid, layout, mptable};
use crate::config::{RebootPolicy, SerialConfig, VmConfig};
use crate::device_manager::mmio::MmioDeviceManager;
use crate::devices::acpi::AcpiPmDevice;
use crate::devices::bus::Bus;
use crate::devices::interrupt::IrqLine;
use crate::devices::legacy::boot_timer::{BootTime, BootTimer};
use crate::devices::legacy::debug_port::DebugPort;
use crate::devices::legacy::i8042::I8042Device;
use crate::devices::legacy::serial::{
    ConsoleIo, OutputQueue, SerialConsole, SerialDevice, SerialOut, StdoutWriter,
};
use crate::devices::virtio::persist::{restore_device, AttachedDevice, DeviceState, PersistError};
use crate::devices::virtio::{self, AttachContext, BlockConfig, NetConfig};
use crate::lifecycle::Lifecycle;
use crate::machine::Machine;
use crate::reboot::{BootImage, Loaded};
use crate::snapshot::host::HostError;
use crate::snapshot::state::MachineInfo;
use crate::snapshot::{LoadedSnapshot, SnapshotError};
use crate::timing::{Clock, Phases};
use crate::vstate::memory::{self, GuestRam};
use crate::vstate::persist as vpersist;
use crate::vstate::vcpu::{self, RunMarks, SaveSpec, Vcpu, VcpuContext};
use crate::vstate::vm;

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
    reset_evt: Arc<EventFd>,
    poweroff_evt: Arc<EventFd>,
    first_debug_port_us: Arc<Mutex<Option<u64>>>,
    boot_time: Arc<Mutex<Option<BootTime>>>,
}

fn legacy_devices(
    p: &mut Parts,
    opts: &BuildOptions,
    serial_cfg: &SerialConfig,
    start: Clock,
    acpi: bool,
    saved: Option<&crate::snapshot::state::MicrovmState>,
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
    let (serial, drained) = match saved {
        Some(s) => SerialDevice::from_state(line, serial_out, &s.serial),
        None => SerialDevice::new(line, serial_out),
    }
    .map_err(|e| VmmError::Device(format!("serial: {e}")))?;
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

    let reset_evt = event_fd()?;
    let mut i8042 = I8042Device::new(reset_evt.clone(), irq(layout::I8042_IRQ)?);
    if let Some(s) = saved {
        i8042.restore_state(&s.i8042);
    }
    let i8042 = Arc::new(Mutex::new(i8042));
    p.pio
        .insert_named(i8042.clone(), u64::from(layout::I8042_PORT), 5, "i8042")
        .map_err(bus_err)?;
    // The ACPI registers (the FADT's and the GED's), handled inline on vCPU threads like the
    // i8042: see devices/acpi.rs.
    let poweroff_evt = event_fd()?;
    let acpi_pm = if acpi {
        let mut pm = AcpiPmDevice::new(
            irq(layout::ACPI_GED_IRQ)?,
            reset_evt.clone(),
            poweroff_evt.clone(),
        );
        if let Some(st) = saved.and_then(|s| s.acpi_pm.as_ref()) {
            pm.restore_state(st);
        }
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
    let boot_time = Arc::new(Mutex::new(None));
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
        reset_evt,
        poweroff_evt,
        first_debug_port_us,
        boot_time,
    })
}

impl Vmm {
    /// Builds the whole VM, paused: nothing guest-visible has run when this returns.
    pub fn build(cfg: &VmConfig, opts: BuildOptions) -> Result<Vmm, VmmError> {
        let start = opts.start.unwrap_or_else(Clock::now);
        cfg.validate()?;
        let vcpu_count = cfg.vcpu_count();
        let mem_size = cfg.mem_mib << 20;

        let mut phases = Phases::new(start.wall);
        let mut opts = opts;
        let kvm = match opts.kvm.take() {
            Some(f) => vm::kvm_from_file(f)?,
            None => vm::open_kvm()?,
        };
        // KVM_GET_SUPPORTED_CPUID takes a while (hundreds of CPUID instructions, each a trap when
        // the host is itself virtualized): ask on the side while the VM is created. The same
        // helper thread then creates and sets up the vCPUs (below).
        let tsc_deadline = kvm.check_extension(kvm_ioctls::Cap::TscDeadlineTimer);
        let mut helper = vm::supported_cpuid_async::<Result<Vec<VcpuFd>, vcpu::VcpuError>>();
        phases.mark("open-kvm");
        let regions = boot::memory_regions(mem_size);
        let ram = GuestRam::create(&regions).map_err(|e| VmmError::GuestMemory {
            mib: cfg.mem_mib,
            detail: e.to_string(),
        })?;
        let mem = ram.memory().clone();
        phases.mark("guest-memory");
        let vm = Arc::new(vm::create_vm(&kvm, &mem, &mut phases)?);
        // With the irqchip in place the vCPUs can be created: the helper thread does their own
        // set-up (KVM_CREATE_VCPU, CPUID, MSRs, FPU, LAPIC; each vCPU ioctl costs tens of
        // microseconds on a nested host) while this thread loads the kernel and builds the
        // devices. docs/boot-time.md, "VMM start-up".
        let helper_vm = vm.clone();
        helper.then(move |supported| {
            let mut base = supported.clone();
            if tsc_deadline {
                cpuid::enable_tsc_deadline(&mut base);
            }
            (0..vcpu_count)
                .map(|id| Vcpu::prepare_fd(&helper_vm, &base, id, vcpu_count))
                .collect()
        });

        // Kernel, initrd, command line, boot information, MP table. The files stay open for
        // in-place reboots (reboot.rs), which load them again.
        let kernel_shown = cfg.kernel.display().to_string();
        let mut kernel_file = boot::open_kernel(&cfg.kernel)?;
        let kernel = boot::load_kernel_file(&mem, mem_size, &mut kernel_file, &kernel_shown)?;
        let (initrd, initrd_file) = match &cfg.initrd {
            Some(p) => {
                let shown = p.display().to_string();
                let mut f =
                    std::fs::File::open(p).map_err(|source| boot::BootError::ReadInitrd {
                        path: shown.clone(),
                        source,
                    })?;
                let at = boot::load_initrd_file(&mem, mem_size, &mut f, &shown, &kernel)?;
                (Some(at), Some((f, shown)))
            }
            None => (None, None),
        };
        phases.mark("load-kernel");
        let mut p = Parts::new(kvm, vm, ram)?;

        // virtio devices: the device manager assigns slots and IRQs, in config order.
        let mut mmio_mgr = MmioDeviceManager::new();
        for (i, disk) in cfg.disks.iter().enumerate() {
            let a = virtio::attach_block(
                &p.vm,
                &mem,
                &mut p.mmio,
                &mut mmio_mgr,
                &mut p.event_manager,
                disk,
                block_io(i),
            )?;
            p.virtio.push(AttachedDevice::Block {
                slot: a.slot,
                config: disk.clone(),
                transport: a.transport,
                device: a.device,
            });
        }
        let mut taps = std::mem::take(&mut opts.taps);
        for net in &cfg.nets {
            let opened = taps
                .iter()
                .position(|t| t.name() == net.tap)
                .map(|i| taps.swap_remove(i));
            let a = virtio::attach_net(
                &p.vm,
                &mem,
                &mut p.mmio,
                &mut mmio_mgr,
                &mut p.event_manager,
                net,
                opened,
            )?;
            p.virtio.push(AttachedDevice::Net {
                slot: a.slot,
                config: net.clone(),
                transport: a.transport,
                device: a.device,
            });
        }
        if cfg.rng.is_some() {
            let a = virtio::attach_rng(
                &p.vm,
                &mem,
                &mut p.mmio,
                &mut mmio_mgr,
                &mut p.event_manager,
            )?;
            p.virtio.push(AttachedDevice::Rng {
                slot: a.slot,
                transport: a.transport,
                device: a.device,
            });
        }

        phases.mark("virtio-devices");
        // The device manager's list is the one source for both the command line's
        // virtio_mmio.device= entries and the DSDT. With ACPI on, the MP table and the
        // command-line entries stay: kernels without ACPI (or without
        // CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES) still find CPUs and devices, and a kernel with
        // both ignores the MP table once it has a MADT. A kernel that has ACPI and the
        // command-line devices registers each device twice; the second registration should
        // fail on the MMIO region the first claimed (a log line, not a lost device; not yet
        // seen with a real kernel). vmm/README.md ("ACPI").
        let cmdline = compose_cmdline(cfg, &mmio_mgr.cmdline_entries());
        boot::write_cmdline(&mem, &cmdline)?;
        // With ACPI, the DSDT's \_SB.VGEN points at a random VM generation ID (acpi/vmgenid.rs).
        let (rsdp, vmgenid) = if cfg.acpi {
            let tables = acpi::create(vcpu_count, &mmio_mgr)?;
            tables.write(&mem)?;
            let genid = acpi::vmgenid::install(&mem)?;
            (Some(tables.rsdp_addr()), Some(genid))
        } else {
            (None, None)
        };
        boot::write_boot_info(&mem, &kernel, mem_size, cmdline.len(), initrd, rsdp)?;
        mptable::setup(&mem, vcpu_count)?;

        let legacy = legacy_devices(&mut p, &opts, &cfg.serial, start, cfg.acpi, None)?;
        phases.mark("boot-info+legacy-devices");

        // vCPUs, created paused.
        vcpu::install_kick_handler()?;
        let (mut base_cpuid, prepared) = helper.wait(&p.kvm).map_err(VmmError::Cpuid)?;
        if tsc_deadline {
            cpuid::enable_tsc_deadline(&mut base_cpuid);
        }
        let prepared = prepared.transpose()?;
        phases.mark("helper-wait");
        let marks = Arc::new(RunMarks::new(start.wall));
        let save_spec = Arc::new(OnceLock::new());
        // In-place reboots put every vCPU back into the state it is built in, read back in
        // full (the MSR list comes from /dev/kvm, as for a snapshot).
        let in_place = cfg.reboot != RebootPolicy::Exit;
        if in_place {
            let caps = vpersist::VcpuCaps::probe(&p.kvm);
            let msr_indices = vpersist::msrs_to_save(&p.kvm)
                .map_err(|e| VmmError::Kvm(format!("MSR list: {e}")))?;
            let _ = save_spec.set(SaveSpec { msr_indices, caps });
        }
        let info = MachineInfo {
            mem_mib: cfg.mem_mib,
            vcpus: vcpu_count,
            cmdline: cmdline.clone(),
            memory_regions: regions.iter().map(|r| (r.0 .0, r.1 as u64)).collect(),
            acpi: cfg.acpi,
            vmgenid,
        };
        let ctx = VcpuContext {
            vm: &p.vm,
            mem: &mem,
            base_cpuid: &base_cpuid,
            count: vcpu_count,
            pio: Arc::new(p.pio.clone()),
            mmio: Arc::new(p.mmio.clone()),
            marks: marks.clone(),
            save_spec: save_spec.clone(),
        };
        let mut vcpus = Vec::with_capacity(vcpu_count as usize);
        let (kernel_protocol, kernel_entry) = (kernel.protocol, kernel.entry);
        // Without the helper thread, the whole set-up happens here.
        let mut prepared = prepared.map(Vec::into_iter);
        for id in 0..vcpu_count {
            let boot = (id == 0).then_some((kernel_protocol, kernel_entry));
            let fd = match prepared.as_mut().and_then(Iterator::next) {
                Some(fd) => fd,
                None => Vcpu::prepare_fd(&p.vm, &base_cpuid, id, vcpu_count)?,
            };
            vcpus.push(Vcpu::from_prepared(&ctx, id, fd, boot, in_place)?);
        }
        phases.mark("vcpus");
        let boot_image = if in_place {
            let loaded = Loaded {
                kernel: kernel_file,
                kernel_shown,
                kernel_loaded: kernel,
                initrd: initrd_file,
                initrd_at: initrd,
            };
            let image = BootImage::capture(loaded, &p.ram, mem_size, &p.vm)
                .map_err(|e| VmmError::Kvm(e.to_string()))?;
            phases.mark("boot-image");
            log::debug!(
                "in-place reboots: {} KiB of low memory kept",
                image.kept_bytes() >> 10
            );
            Some(image)
        } else {
            None
        };
        let aligned = memory::huge_page_aligned(&mem);
        let (protocol, entry) = (kernel_protocol, kernel_entry);
        let vmm = Self::assemble(
            p,
            legacy,
            vcpus,
            save_spec,
            info,
            start,
            marks,
            None,
            opts.thread_hook,
            Reboots {
                image: boot_image,
                if_acpi: cfg.reboot == RebootPolicy::InPlaceIfAcpi,
                notify: opts.reboot_notify,
            },
        )?;
        phases.mark("threads+control");
        log::debug!(
            "built VM: {} vCPU(s), {} MiB (2 MiB aligned: {aligned}), {:?} entry {:#x}, in {} us: {phases}",
            vcpu_count,
            cfg.mem_mib,
            protocol,
            entry,
            vmm.timings.build_us,
        );
        Ok(vmm)
    }

    /// Restores the VM saved in `rc.dir`, paused: the state of every vCPU and device is in
    /// place and guest memory is mapped from the snapshot's memory file (private, loaded on
    /// demand); nothing of the guest has run when this returns, and [`Vmm::run`] continues it
    /// where it was. Every check (files, checksum, version, host CPU and KVM, memory size, disks,
    /// overrides) happens before the guest could run; an error leaves nothing behind and the
    /// snapshot's files as they were.
    pub fn restore(rc: &RestoreConfig, opts: BuildOptions) -> Result<Vmm, VmmError> {
        let start = opts.start.unwrap_or_else(Clock::now);
        let snap = LoadedSnapshot::open(&rc.dir)?;
        let st = &snap.state;
        let dir = rc.dir.display().to_string();
        let mismatch = |detail: String| VmmError::Mismatch {
            dir: dir.clone(),
            detail,
        };
        if let Some(m) = rc.expect_mem_mib.filter(|m| *m != st.machine.mem_mib) {
            return Err(mismatch(format!(
                "memory size mismatch: the snapshot has {} MiB, {m} MiB asked for",
                st.machine.mem_mib
            )));
        }
        if let Some(v) = rc
            .expect_vcpus
            .filter(|v| *v != u64::from(st.machine.vcpus))
        {
            return Err(mismatch(format!(
                "vCPU count mismatch: the snapshot has {}, {v} asked for",
                st.machine.vcpus
            )));
        }
        let mut opts = opts;
        let kvm = match opts.kvm.take() {
            Some(f) => vm::kvm_from_file(f)?,
            None => vm::open_kvm()?,
        };
        st.host.check(&kvm).map_err(|source| VmmError::Host {
            dir: dir.clone(),
            source,
        })?;
        let (n_disks, n_nets) = st.devices.iter().fold((0, 0), |(b, n), d| match d.device {
            DeviceState::Block(_) => (b + 1, n),
            DeviceState::Net(_) => (b, n + 1),
            DeviceState::Rng(_) => (b, n),
        });
        if rc.disks.len() > n_disks || rc.nets.len() > n_nets {
            return Err(mismatch(format!(
                "{} disk and {} NIC replacements given; the snapshot has {n_disks} disk(s) and {n_nets} NIC(s)",
                rc.disks.len(),
                rc.nets.len()
            )));
        }
        // Which configuration each device gets; every disk image must exist before anything
        // is built.
        let mut plan: Vec<(Option<&BlockConfig>, Option<&NetConfig>)> = Vec::new();
        let (mut bi, mut ni) = (0, 0);
        for (i, d) in st.devices.iter().enumerate() {
            match &d.device {
                DeviceState::Block(b) => {
                    let over = rc.disks.get(bi);
                    bi += 1;
                    let path = &over.unwrap_or(&b.config).path;
                    if let Err(e) = std::fs::metadata(path) {
                        return Err(VmmError::RestoreDevice {
                            dir: dir.clone(),
                            index: i,
                            source: PersistError::Virtio(virtio::VirtioError::OpenImage {
                                path: path.display().to_string(),
                                source: e,
                            }),
                        });
                    }
                    plan.push((over, None));
                }
                DeviceState::Net(_) => {
                    plan.push((None, rc.nets.get(ni)));
                    ni += 1;
                }
                DeviceState::Rng(_) => plan.push((None, None)),
            }
        }

        let regions: Vec<(GuestAddress, usize)> = st
            .machine
            .memory_regions
            .iter()
            .map(|&(a, l)| (GuestAddress(a), l as usize))
            .collect();
        let memory = snap.memory.try_clone().map_err(|e| VmmError::GuestMemory {
            mib: st.machine.mem_mib,
            detail: e.to_string(),
        })?;
        let ram = GuestRam::from_snapshot(memory, &regions).map_err(|e| VmmError::GuestMemory {
            mib: st.machine.mem_mib,
            detail: e.to_string(),
        })?;
        let mem = ram.memory().clone();
        let mut phases = Phases::new(start.wall);
        let vm = Arc::new(vm::create_vm(&kvm, &mem, &mut phases)?);
        // Real time since the snapshot: the guest's clocks advance by it (vstate/persist.rs).
        let elapsed_ns = vpersist::realtime_ns().saturating_sub(st.vm.realtime_ns);
        vpersist::restore_vm(&vm, &st.vm, elapsed_ns).map_err(|e| VmmError::RestoreState {
            dir: dir.clone(),
            detail: e.to_string(),
        })?;
        let mut p = Parts::new(kvm, vm, ram)?;
        // Overlays written for this VM are removed again if the restore fails.
        let mut written_overlays = OverlayCleanup(Vec::new());
        let mut mmio_mgr = MmioDeviceManager::new();
        for (i, (d, (block, net))) in st.devices.iter().zip(plan).enumerate() {
            let saved_overlay = snap.overlay(i);
            let mut ctx = AttachContext {
                vm: &p.vm,
                mem: &mem,
                mmio_bus: &mut p.mmio,
                mgr: &mut mmio_mgr,
                evmgr: &mut p.event_manager,
            };
            let target_overlay = match &d.device {
                DeviceState::Block(b) => block.unwrap_or(&b.config).overlay.clone(),
                DeviceState::Net(_) | DeviceState::Rng(_) => None,
            };
            if let Some(o) = target_overlay.filter(|o| !o.exists()) {
                written_overlays.0.push(o);
            }
            let a = restore_device(
                &mut ctx,
                i,
                d,
                block,
                saved_overlay,
                net,
                block_io(i),
                &mut opts.taps,
            )
            .map_err(|source| VmmError::RestoreDevice {
                dir: dir.clone(),
                index: i,
                source,
            })?;
            p.virtio.push(a);
        }
        let legacy = legacy_devices(&mut p, &opts, &rc.serial, start, st.machine.acpi, Some(st))?;
        phases.mark("devices");
        // Every restore is a possible copy: a new VM generation ID before any vCPU runs, and
        // the GED event that notifies the guest, raised once the vCPUs' interrupt controllers
        // are back (raise_pending_interrupts below).
        if let (Some(addr), Some(pm)) = (st.machine.vmgenid, &legacy.acpi_pm) {
            let id = acpi::vmgenid::GenerationId::random()?;
            id.write(&mem, addr)?;
            pm.lock().expect("ACPI lock").queue_generation_change();
            log::debug!("new VM generation ID {id} at {addr:#x}");
        }
        phases.mark("vmgenid");

        vcpu::install_kick_handler()?;
        // Restored vCPUs take their CPUID from the snapshot.
        let no_cpuid = CpuId::new(0).map_err(|e| VmmError::Kvm(format!("CPUID table: {e:?}")))?;
        let marks = Arc::new(RunMarks::new(start.wall));
        let save_spec = Arc::new(OnceLock::new());
        let ctx = VcpuContext {
            vm: &p.vm,
            mem: &mem,
            base_cpuid: &no_cpuid,
            count: st.machine.vcpus,
            pio: Arc::new(p.pio.clone()),
            mmio: Arc::new(p.mmio.clone()),
            marks: marks.clone(),
            save_spec: save_spec.clone(),
        };
        let tsc_scaling = p.kvm.check_extension(kvm_ioctls::Cap::TscControl);
        let mut vcpus = Vec::with_capacity(st.vcpus.len());
        for vs in &st.vcpus {
            let khz = vs.tsc_khz.unwrap_or(0);
            let v = Vcpu::restore(&ctx, vs, vpersist::tsc_ticks(elapsed_ns, khz), tsc_scaling)?;
            vcpus.push(v);
        }
        let info = st.machine.clone();
        let notify = opts.boot_notify.clone().map(|tx| (start, tx));
        // A restored VM has no kernel to load again: a guest reboot ends it.
        let vmm = Self::assemble(
            p,
            legacy,
            vcpus,
            save_spec,
            info,
            start,
            marks,
            notify,
            opts.thread_hook,
            Reboots {
                image: None,
                if_acpi: false,
                notify: None,
            },
        )?;
        vmm.control
            .lock()
            .expect("control lock")
            .machine
            .raise_pending_interrupts();
        written_overlays.0.clear();
        log::info!(
            "restored a snapshot taken {} ms ago; the guest's clocks advanced by that",
            elapsed_ns / 1_000_000
        );
        log::debug!(
            "restored VM from {}: {} vCPU(s), {} MiB (2 MiB aligned: {}); {phases}",
            rc.dir.display(),
            st.machine.vcpus,
            st.machine.mem_mib,
            memory::huge_page_aligned(&mem),
        );
        Ok(Vmm {
            restored: true,
            ..vmm
        })
    }

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
            serial: legacy.serial,
            i8042: legacy.i8042,
            acpi_pm: legacy.acpi_pm,
            virtio: p.virtio,
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
            reset_evt: legacy.reset_evt,
            poweroff_evt: legacy.poweroff_evt,
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

/// Removes overlay files a failed restore created.
struct OverlayCleanup(Vec<PathBuf>);

impl Drop for OverlayCleanup {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
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
        assert!(!c.split(' ').any(|a| a == "nomodule"), "{c}");
        assert!(c.ends_with("virtio_mmio.device=4K@0xc0001000:5 quiet"));
        cfg.serial = SerialConfig::None;
        cfg.default_cmdline = false;
        assert_eq!(compose_cmdline(&cfg, &[]), "quiet");
        assert_eq!(ExitReason::GuestReset.exit_code(), 0);
        assert_ne!(ExitReason::Fault("x".into()).exit_code(), 0);
    }
}
