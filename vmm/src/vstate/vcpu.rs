//! vCPUs: each runs KVM_RUN on its own thread and dispatches port and MMIO
//! exits to the buses. The VMM thread controls them through a command channel
//! and kicks them out of KVM_RUN with a signal.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use kvm_bindings::{CpuId, KVM_SYSTEM_EVENT_RESET, KVM_SYSTEM_EVENT_SHUTDOWN};
use kvm_ioctls::{VcpuExit, VcpuFd, VmFd};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::signal::{register_signal_handler, Killable, SIGRTMIN};

use super::exits::{self, Access, ExitKind, VcpuExitCounters, VcpuExitReport};
use crate::arch::x86_64::{cpuid, regs};
use crate::devices::bus::Bus;
use crate::devices::interrupt::{PowerOffLine, ResetLine};
use crate::threads::{ThreadHook, VmThread};
use crate::vstate::memory::GuestMemoryMmap;
use crate::vstate::persist::{self, StateError, VcpuCaps, VcpuState};

#[derive(Debug, thiserror::Error)]
pub enum VcpuError {
    #[error("creating vCPU {id}: {source}")]
    Create { id: u8, source: kvm_ioctls::Error },
    #[error("CPUID for vCPU {id}: {source}")]
    Cpuid { id: u8, source: cpuid::CpuidError },
    #[error("KVM_SET_CPUID2 for vCPU {id}: {source}")]
    SetCpuid { id: u8, source: kvm_ioctls::Error },
    #[error("setting up vCPU {id}: {source}")]
    Regs { id: u8, source: regs::RegsError },
    #[error("spawning the vCPU {id} thread: {source}")]
    Spawn { id: u8, source: std::io::Error },
    #[error("installing the vCPU kick signal handler: {0}")]
    Signal(vmm_sys_util::errno::Error),
    #[error("vCPU {0} thread is gone")]
    ThreadGone(u8),
    #[error("vCPU {id} state: {source}")]
    State { id: u8, source: StateError },
    #[error("vCPU {id}: the snapshot's TSC runs at {saved} kHz, this host's at {here} kHz, and KVM cannot scale it")]
    TscFrequency { id: u8, saved: u32, here: u32 },
}

/// How far the host's TSC frequency may be from a snapshot's without scaling (parts per
/// million; crystal tolerances of machines of one model).
pub const TSC_KHZ_TOLERANCE_PPM: u64 = 250;

/// Why a vCPU stopped running the guest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VcpuExitReason {
    /// The guest asked for a reset (KVM system event).
    Reset,
    /// The guest powered off or halted the CPU.
    PowerOff,
    /// Something the VMM cannot continue from (with registers).
    Fault(String),
}

/// When the vCPUs first entered and left the guest, shared by all vCPUs of a VM.
#[derive(Debug)]
pub struct RunMarks {
    /// Time base of the two instants below.
    start: std::time::Instant,
    /// Microseconds from `start` to the first KVM_RUN of any vCPU (u64::MAX: not yet).
    first_entry_us: AtomicU64,
    /// Microseconds from `start` to the first return from KVM_RUN: the guest ran.
    first_exit_us: AtomicU64,
}

impl RunMarks {
    /// Marks measured from `start`.
    pub fn new(start: std::time::Instant) -> Self {
        Self {
            start,
            first_entry_us: AtomicU64::new(u64::MAX),
            first_exit_us: AtomicU64::new(u64::MAX),
        }
    }

    fn mark(slot: &AtomicU64, start: std::time::Instant) {
        if slot.load(Ordering::Relaxed) == u64::MAX {
            let us = start.elapsed().as_micros() as u64;
            let _ = slot.compare_exchange(u64::MAX, us, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// First KVM_RUN entry, in microseconds from the start.
    pub fn first_entry_us(&self) -> Option<u64> {
        Some(self.first_entry_us.load(Ordering::Relaxed)).filter(|&v| v != u64::MAX)
    }

    /// First KVM_RUN exit, in microseconds from the start.
    pub fn first_exit_us(&self) -> Option<u64> {
        Some(self.first_exit_us.load(Ordering::Relaxed)).filter(|&v| v != u64::MAX)
    }
}

impl Default for RunMarks {
    fn default() -> Self {
        Self::new(std::time::Instant::now())
    }
}

/// Stack of a vCPU thread. Exit handling needs little; a stack well below 2 MiB also keeps a
/// host with transparent huge pages `always` from backing it with a 2 MiB page.
pub const VCPU_STACK_SIZE: usize = 256 << 10;

/// An exit the vCPU cannot continue from, detached from the kvm_run borrow.
enum Unhandled {
    Shutdown,
    FailEntry(u64, u32),
    InternalError,
    Other(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VcpuCmd {
    Resume,
    Pause,
    Stop,
    /// Read the vCPU's KVM state (only while paused); answered on the state channel.
    SaveState,
    /// Put the vCPU back into its boot state (only while paused; an in-place reboot);
    /// answered on the reset channel.
    Reset,
    /// Turn the guest's paravirtual MSRs off (only while paused; an in-place reboot, before
    /// guest RAM is cleared: [`persist::paravirt_off`]); answered on the reset channel.
    ParavirtOff,
}

/// A configured vCPU, not yet running.
pub struct Vcpu {
    id: u8,
    fd: VcpuFd,
    pio: Arc<Bus>,
    mmio: Arc<Bus>,
    marks: Arc<RunMarks>,
    exits: VcpuExitCounters,
    save_spec: Arc<OnceLock<SaveSpec>>,
    /// The state it was built in, kept for in-place reboots ([`VcpuCmd::Reset`]).
    boot_state: Option<Box<VcpuState>>,
    reset: ResetLine,
    poweroff: PowerOffLine,
}

/// Everything the vCPUs need from the VM.
pub struct VcpuContext<'a> {
    pub vm: &'a VmFd,
    pub mem: &'a GuestMemoryMmap,
    pub base_cpuid: &'a CpuId,
    pub count: u8,
    pub pio: Arc<Bus>,
    pub mmio: Arc<Bus>,
    /// First guest entry and exit of the VM's vCPUs.
    pub marks: Arc<RunMarks>,
    /// What a snapshot saves; filled in (once, from /dev/kvm) by the first snapshot.
    pub save_spec: Arc<OnceLock<SaveSpec>>,
    /// The machine's reset line: a vCPU does not enter the guest while it is raised.
    pub reset: ResetLine,
    /// The guest's ACPI power-off: once raised, no vCPU enters the guest again.
    pub poweroff: PowerOffLine,
}

/// What to read from a vCPU for a snapshot: which MSRs, which optional state.
#[derive(Clone, Debug, Default)]
pub struct SaveSpec {
    pub msr_indices: Vec<u32>,
    pub caps: VcpuCaps,
}

impl Vcpu {
    /// Creates vCPU `id` with normalized CPUID, MSRs, FPU and LAPIC LINT setup.
    /// The boot CPU (id 0) also gets the entry registers for `protocol` at `entry`.
    /// `keep_boot_state` reads the whole state back (`ctx.save_spec` must be set) for
    /// [`VcpuCmd::Reset`].
    pub fn new(
        ctx: &VcpuContext<'_>,
        id: u8,
        boot: Option<(regs::BootProtocol, u64)>,
        keep_boot_state: bool,
    ) -> Result<Self, VcpuError> {
        let fd = Self::prepare_fd(ctx.vm, ctx.base_cpuid, id, ctx.count)?;
        Self::from_prepared(ctx, id, fd, boot, keep_boot_state)
    }

    /// The part of [`Vcpu::new`] that needs neither guest memory nor devices, so that it can run
    /// on another thread while those are built: `KVM_CREATE_VCPU` (after the irqchip), the
    /// vCPU's CPUID (from `base_cpuid`), its MSRs, FPU and LAPIC LINT pins.
    pub fn prepare_fd(
        vm: &VmFd,
        base_cpuid: &CpuId,
        id: u8,
        count: u8,
    ) -> Result<VcpuFd, VcpuError> {
        let fd = vm
            .create_vcpu(u64::from(id))
            .map_err(|source| VcpuError::Create { id, source })?;
        let mut cpuid = base_cpuid.clone();
        cpuid::normalize(&mut cpuid, id, count)
            .map_err(|source| VcpuError::Cpuid { id, source })?;
        fd.set_cpuid2(&cpuid)
            .map_err(|source| VcpuError::SetCpuid { id, source })?;
        let r = |source| VcpuError::Regs { id, source };
        regs::setup_msrs(&fd).map_err(r)?;
        regs::setup_fpu(&fd).map_err(r)?;
        regs::setup_lint(&fd).map_err(r)?;
        Ok(fd)
    }

    /// The rest of [`Vcpu::new`] for a vCPU from [`Vcpu::prepare_fd`]: the boot vCPU's
    /// registers (entry point, segments, the page tables in guest memory) and, for in-place
    /// reboots, the state it is built in.
    pub fn from_prepared(
        ctx: &VcpuContext<'_>,
        id: u8,
        fd: VcpuFd,
        boot: Option<(regs::BootProtocol, u64)>,
        keep_boot_state: bool,
    ) -> Result<Self, VcpuError> {
        let r = |source| VcpuError::Regs { id, source };
        if let Some((protocol, entry)) = boot {
            regs::setup_regs(&fd, protocol, entry).map_err(r)?;
            regs::setup_sregs(ctx.mem, &fd, protocol).map_err(r)?;
        }
        let mut v = Self::with_fd(ctx, id, fd);
        if keep_boot_state {
            let spec = ctx.save_spec.get().ok_or(VcpuError::State {
                id,
                source: StateError::List("MSRs to save (not set up)"),
            })?;
            let st = persist::save_vcpu(&v.fd, id, &spec.msr_indices, spec.caps)
                .map_err(|source| VcpuError::State { id, source })?;
            v.boot_state = Some(Box::new(st));
        }
        Ok(v)
    }

    fn with_fd(ctx: &VcpuContext<'_>, id: u8, fd: VcpuFd) -> Self {
        Self {
            id,
            fd,
            pio: ctx.pio.clone(),
            mmio: ctx.mmio.clone(),
            marks: ctx.marks.clone(),
            exits: VcpuExitCounters::default(),
            save_spec: ctx.save_spec.clone(),
            boot_state: None,
            reset: ctx.reset.clone(),
            poweroff: ctx.poweroff.clone(),
        }
    }

    /// Creates vCPU `state.id` and writes the saved state into it (the TSC advanced by
    /// `tsc_delta` ticks). It has never run when this returns.
    /// The vCPU runs its TSC at the saved frequency: KVM scales it when it can
    /// (`tsc_scaling`); otherwise the host's may differ by at most [`TSC_KHZ_TOLERANCE_PPM`].
    pub fn restore(
        ctx: &VcpuContext<'_>,
        state: &VcpuState,
        tsc_delta: u64,
        tsc_scaling: bool,
    ) -> Result<Self, VcpuError> {
        let id = state.id;
        let fd = ctx
            .vm
            .create_vcpu(u64::from(id))
            .map_err(|source| VcpuError::Create { id, source })?;
        if let (Some(saved), Ok(here)) = (state.tsc_khz, fd.get_tsc_khz()) {
            let diff_ppm = u64::from(saved.abs_diff(here)) * 1_000_000 / u64::from(saved.max(1));
            if diff_ppm > TSC_KHZ_TOLERANCE_PPM {
                if !tsc_scaling {
                    return Err(VcpuError::TscFrequency { id, saved, here });
                }
                fd.set_tsc_khz(saved)
                    .map_err(|_| VcpuError::TscFrequency { id, saved, here })?;
            }
        }
        persist::restore_vcpu(&fd, state, tsc_delta)
            .map_err(|source| VcpuError::State { id, source })?;
        Ok(Self::with_fd(ctx, id, fd))
    }

    #[inline(never)]
    fn describe_state(&self) -> String {
        let regs = self.fd.get_regs();
        let sregs = self.fd.get_sregs();
        match (regs, sregs) {
            (Ok(r), Ok(s)) => format!(
                "rip={:#x} rsp={:#x} rflags={:#x} rax={:#x} rbx={:#x} rcx={:#x} rdx={:#x} \
                 cr0={:#x} cr2={:#x} cr3={:#x} cr4={:#x} efer={:#x} cs={:#x}",
                r.rip,
                r.rsp,
                r.rflags,
                r.rax,
                r.rbx,
                r.rcx,
                r.rdx,
                s.cr0,
                s.cr2,
                s.cr3,
                s.cr4,
                s.efer,
                s.cs.selector
            ),
            (Err(e), _) | (_, Err(e)) => format!("registers unavailable: {e}"),
        }
    }

    /// One KVM_RUN. `Ok(None)` means keep running.
    fn run_once(&mut self) -> Option<VcpuExitReason> {
        RunMarks::mark(&self.marks.first_entry_us, self.marks.start);
        let result = self.fd.run();
        RunMarks::mark(&self.marks.first_exit_us, self.marks.start);
        let exit = match result {
            Ok(exit) => exit,
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                self.exits.count(ExitKind::Interrupted);
                return None;
            }
            Err(e) => {
                self.exits.count(ExitKind::Other);
                return Some(VcpuExitReason::Fault(format!("KVM_RUN failed: {e}")));
            }
        };
        match exit {
            VcpuExit::IoIn(port, data) => {
                self.exits.pio(port, Access::Read);
                if !self.pio.read(u64::from(port), data) {
                    crate::guest_log!(
                        log::Level::Debug,
                        "vcpu{}: read of unknown port {port:#x}",
                        self.id
                    );
                }
                None
            }
            VcpuExit::IoOut(port, data) => {
                self.exits.pio(port, Access::Write);
                if !self.pio.write(u64::from(port), data) {
                    crate::guest_log!(
                        log::Level::Debug,
                        "vcpu{}: write to unknown port {port:#x}",
                        self.id
                    );
                }
                None
            }
            VcpuExit::MmioRead(addr, data) => {
                self.exits.mmio(addr, Access::Read);
                if !self.mmio.read(addr, data) {
                    crate::guest_log!(
                        log::Level::Debug,
                        "vcpu{}: read of unknown MMIO {addr:#x}",
                        self.id
                    );
                }
                None
            }
            VcpuExit::MmioWrite(addr, data) => {
                self.exits.mmio(addr, Access::Write);
                if !self.mmio.write(addr, data) {
                    crate::guest_log!(
                        log::Level::Debug,
                        "vcpu{}: write to unknown MMIO {addr:#x}",
                        self.id
                    );
                }
                None
            }
            VcpuExit::Hlt => {
                self.exits.count(ExitKind::Hlt);
                log::info!("vcpu{}: guest halted", self.id);
                Some(VcpuExitReason::PowerOff)
            }
            VcpuExit::SystemEvent(kind, _) => {
                self.exits.count(ExitKind::SystemEvent);
                self.system_event(kind)
            }
            VcpuExit::Shutdown => {
                self.exits.count(ExitKind::Other);
                if self.reset.is_raised() {
                    // The guest asked for a reset (another vCPU's request, seen after this
                    // one left the guest) and went on to a triple fault: the same reset.
                    log::debug!("vcpu{}: triple fault with a reset requested", self.id);
                    return None;
                }
                self.fault(Unhandled::Shutdown)
            }
            VcpuExit::FailEntry(reason, cpu) => {
                self.exits.count(ExitKind::Other);
                self.fault(Unhandled::FailEntry(reason, cpu))
            }
            VcpuExit::InternalError => {
                self.exits.count(ExitKind::Other);
                self.fault(Unhandled::InternalError)
            }
            other => {
                let what = format!("{other:?}");
                self.exits.count(ExitKind::Other);
                self.fault(Unhandled::Other(what))
            }
        }
    }

    fn system_event(&self, kind: u32) -> Option<VcpuExitReason> {
        match kind {
            KVM_SYSTEM_EVENT_RESET => Some(VcpuExitReason::Reset),
            KVM_SYSTEM_EVENT_SHUTDOWN => Some(VcpuExitReason::PowerOff),
            other => Some(VcpuExitReason::Fault(format!(
                "unexpected KVM system event {other}"
            ))),
        }
    }

    fn fault(&mut self, exit: Unhandled) -> Option<VcpuExitReason> {
        match exit {
            Unhandled::Shutdown => Some(VcpuExitReason::Fault(format!(
                "vCPU {} triple fault (KVM_EXIT_SHUTDOWN): {}",
                self.id,
                self.describe_state()
            ))),
            Unhandled::FailEntry(reason, cpu) => Some(VcpuExitReason::Fault(format!(
                "vCPU {} failed to enter the guest (KVM_EXIT_FAIL_ENTRY, hardware reason {reason:#x}, cpu {cpu}): {}",
                self.id,
                self.describe_state()
            ))),
            Unhandled::InternalError => {
                // SAFETY: on KVM_EXIT_INTERNAL_ERROR the kernel filled the `internal` member of the union.
                let internal = unsafe { self.fd.get_kvm_run().__bindgen_anon_1.internal };
                let n = (internal.ndata as usize).min(internal.data.len());
                Some(VcpuExitReason::Fault(format!(
                    "vCPU {} KVM internal error (KVM_EXIT_INTERNAL_ERROR, suberror {}, data {:x?}): {}",
                    self.id,
                    internal.suberror,
                    &internal.data[..n],
                    self.describe_state()
                )))
            }
            Unhandled::Other(what) => {
                Some(VcpuExitReason::Fault(format!(
                    "vCPU {} unexpected exit {what}: {}",
                    self.id,
                    self.describe_state()
                )))
            }
        }
    }

    /// Finishes an instruction whose port or MMIO access was handed to us (an `in` still has
    /// to receive its data, an `out` to be stepped over): KVM does that on the next KVM_RUN.
    /// With `immediate_exit` set that KVM_RUN completes the access and returns at once without
    /// running the guest. Saved state then never holds half an instruction, which a restored
    /// vCPU would execute a second time (a second UART write, a second read of a FIFO).
    #[inline(never)]
    fn complete_pending_io(&mut self) {
        self.fd.set_kvm_immediate_exit(1);
        match self.fd.run() {
            Err(e) if e.errno() == libc::EINTR => {}
            Err(e) => log::warn!("vcpu{}: completing pending I/O: {e}", self.id),
            Ok(exit) => log::warn!(
                "vcpu{}: KVM_RUN with immediate_exit returned {exit:?}",
                self.id
            ),
        }
        self.fd.set_kvm_immediate_exit(0);
    }

    /// Starts the vCPU thread, paused. Exits are reported on `exits` and `exit_evt`.
    /// `hook` runs first on the new thread (see [`crate::threads::ThreadHook`]).
    pub fn start_paused(
        self,
        exits: Sender<(u8, VcpuExitReason)>,
        exit_evt: Arc<EventFd>,
        hook: Option<ThreadHook>,
    ) -> Result<VcpuHandle, VcpuError> {
        let id = self.id;
        let (cmd_tx, cmd_rx) = channel();
        let (ack_tx, ack_rx) = channel();
        let (state_tx, state_rx) = channel();
        let (reset_tx, reset_rx) = channel();
        let thread = std::thread::Builder::new()
            .name(format!("vcpu{id}"))
            .stack_size(VCPU_STACK_SIZE)
            .spawn(move || {
                let setup = match hook {
                    Some(h) => h(VmThread::Vcpu(id)),
                    None => Ok(()),
                };
                self.thread_main(
                    cmd_rx,
                    ack_tx,
                    Replies {
                        states: state_tx,
                        resets: reset_tx,
                    },
                    exits,
                    exit_evt,
                    setup,
                )
            })
            .map_err(|source| VcpuError::Spawn { id, source })?;
        Ok(VcpuHandle {
            id,
            thread: Some(thread),
            cmd: cmd_tx,
            ack: ack_rx,
            states: state_rx,
            resets: reset_rx,
            report: None,
        })
    }

    fn thread_main(
        mut self,
        cmds: Receiver<VcpuCmd>,
        ack: Sender<VcpuCmd>,
        replies: Replies,
        exits: Sender<(u8, VcpuExitReason)>,
        exit_evt: Arc<EventFd>,
        setup: Result<(), String>,
    ) -> VcpuExitReport {
        let mut running = false;
        let mut exited = false;
        if let Err(e) = setup {
            // Never enters the guest; the VMM ends the VM with this fault.
            exited = true;
            let _ = exits.send((
                self.id,
                VcpuExitReason::Fault(format!("vCPU {} thread setup: {e}", self.id)),
            ));
            let _ = exit_evt.write(1);
        }
        loop {
            let cmd = if running {
                match cmds.try_recv() {
                    Ok(c) => Some(c),
                    Err(TryRecvError::Empty) => None,
                    Err(TryRecvError::Disconnected) => Some(VcpuCmd::Stop),
                }
            } else {
                Some(cmds.recv().unwrap_or(VcpuCmd::Stop))
            };
            match cmd {
                Some(VcpuCmd::Stop) => {
                    let _ = ack.send(VcpuCmd::Stop);
                    return self.exit_report();
                }
                Some(VcpuCmd::Pause) => {
                    if running {
                        // Tell a guest using kvm-clock that it is being stopped, so a long
                        // pause does not look like a soft lockup (EINVAL without kvm-clock).
                        let _ = self.fd.kvmclock_ctrl();
                    }
                    running = false;
                    let _ = ack.send(VcpuCmd::Pause);
                    continue;
                }
                Some(VcpuCmd::SaveState) => {
                    self.save_state_reply(running, exited, &replies.states);
                    continue;
                }
                Some(VcpuCmd::Reset) => {
                    let r = if running {
                        Err(VcpuError::State {
                            id: self.id,
                            source: StateError::List("reset of a running vCPU"),
                        })
                    } else {
                        self.reset_to_boot()
                    };
                    if r.is_ok() {
                        // Runs again with the next Resume, whatever made it leave the guest.
                        exited = false;
                    }
                    let _ = replies.resets.send(r);
                    continue;
                }
                Some(VcpuCmd::ParavirtOff) => {
                    let r = if running {
                        Err(VcpuError::State {
                            id: self.id,
                            source: StateError::List("paravirtual MSRs of a running vCPU"),
                        })
                    } else {
                        self.paravirt_off()
                    };
                    let _ = replies.resets.send(r);
                    continue;
                }
                Some(VcpuCmd::Resume) => {
                    // A vCPU that already left the guest stays out until stopped.
                    running = !exited;
                    let _ = ack.send(VcpuCmd::Resume);
                    continue;
                }
                None => {}
            }
            if let Some(reason) = self.run_once() {
                exited = true;
                running = false;
                let _ = exits.send((self.id, reason));
                let _ = exit_evt.write(1);
            } else if self.reset.is_raised() || self.poweroff.is_raised() {
                // Held out of the guest until the event loop pauses, resets and resumes it, or
                // ends the VM: a guest carries on after asking for a reset or powering off
                // (ResetLine, PowerOffLine).
                running = false;
            }
        }
    }
}

impl Vcpu {
    /// Answers [`VcpuCmd::SaveState`]. Out of line, like the other seldom commands
    /// ([`Vcpu::reset_to_boot`], [`Vcpu::paravirt_off`]) and the exit report: their KVM state
    /// structures would otherwise sit in the frame of the thread's loop, and the stack probes
    /// of a large frame touch every page of it, so each vCPU thread would keep ~40 KiB of stack
    /// resident for what it seldom or never does (docs/boot-time.md, "VMM memory").
    #[inline(never)]
    fn save_state_reply(
        &mut self,
        running: bool,
        exited: bool,
        to: &Sender<Result<VcpuState, VcpuError>>,
    ) {
        let immediate_exit = self.save_spec.get().is_some_and(|s| s.caps.immediate_exit);
        if !running && !exited && immediate_exit {
            self.complete_pending_io();
        }
        let r = match (running, self.save_spec.get()) {
            (false, Some(spec)) => {
                persist::save_vcpu(&self.fd, self.id, &spec.msr_indices, spec.caps).map_err(
                    |source| VcpuError::State {
                        id: self.id,
                        source,
                    },
                )
            }
            (true, _) => Err(VcpuError::State {
                id: self.id,
                source: StateError::List("state of a running vCPU"),
            }),
            (false, None) => Err(VcpuError::State {
                id: self.id,
                source: StateError::List("MSRs to save (not set up)"),
            }),
        };
        let _ = to.send(r);
    }
}

/// Where the vCPU thread answers [`VcpuCmd::SaveState`] and [`VcpuCmd::Reset`].
struct Replies {
    states: Sender<Result<VcpuState, VcpuError>>,
    resets: Sender<Result<(), VcpuError>>,
}

impl Vcpu {
    /// Back to the state the vCPU was built in. An I/O access KVM handed out last is completed
    /// first (as for a snapshot), so the next KVM_RUN does not finish it on the new registers.
    #[inline(never)]
    fn reset_to_boot(&mut self) -> Result<(), VcpuError> {
        if self.save_spec.get().is_some_and(|s| s.caps.immediate_exit) {
            self.complete_pending_io();
        }
        self.with_boot_state(persist::reset_vcpu)
    }

    /// Turns the guest's paravirtual MSRs off (their boot values).
    #[inline(never)]
    fn paravirt_off(&mut self) -> Result<(), VcpuError> {
        self.with_boot_state(persist::paravirt_off)
    }

    /// Writes (part of) the kept boot state into the vCPU with `write`.
    fn with_boot_state(
        &self,
        write: fn(&VcpuFd, &VcpuState) -> Result<(), StateError>,
    ) -> Result<(), VcpuError> {
        let id = self.id;
        let Some(boot) = &self.boot_state else {
            return Err(VcpuError::State {
                id,
                source: StateError::List("boot state (not kept)"),
            });
        };
        write(&self.fd, boot).map_err(|source| VcpuError::State { id, source })
    }

    /// This vCPU's exit counters and KVM's statistics (read now, once).
    #[inline(never)]
    fn exit_report(self) -> VcpuExitReport {
        let kvm = match exits::read_kvm_stats(&self.fd) {
            Ok(v) => v,
            Err(e) => {
                log::debug!("vcpu{}: no KVM statistics: {e}", self.id);
                Vec::new()
            }
        };
        VcpuExitReport {
            counters: self.exits,
            kvm,
        }
    }
}

extern "C" fn kick_handler(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

/// Installs the (no-op) handler of the signal that interrupts KVM_RUN.
pub fn install_kick_handler() -> Result<(), VcpuError> {
    register_signal_handler(SIGRTMIN(), kick_handler).map_err(VcpuError::Signal)
}

/// The VMM side of a vCPU thread.
pub struct VcpuHandle {
    id: u8,
    thread: Option<JoinHandle<VcpuExitReport>>,
    cmd: Sender<VcpuCmd>,
    ack: Receiver<VcpuCmd>,
    states: Receiver<Result<VcpuState, VcpuError>>,
    resets: Receiver<Result<(), VcpuError>>,
    report: Option<VcpuExitReport>,
}

impl VcpuHandle {
    pub fn id(&self) -> u8 {
        self.id
    }

    /// Reads the vCPU's KVM state on its thread. The vCPU must be paused.
    pub fn save_state(&mut self) -> Result<VcpuState, VcpuError> {
        self.cmd
            .send(VcpuCmd::SaveState)
            .map_err(|_| VcpuError::ThreadGone(self.id))?;
        self.states
            .recv()
            .map_err(|_| VcpuError::ThreadGone(self.id))?
    }

    /// Puts the vCPU back into its boot state on its thread. The vCPU must be paused.
    pub fn reset(&mut self) -> Result<(), VcpuError> {
        self.reset_cmd(VcpuCmd::Reset)
    }

    /// Turns the guest's paravirtual MSRs off on the vCPU's thread (see
    /// [`persist::paravirt_off`]). The vCPU must be paused.
    pub fn paravirt_off(&mut self) -> Result<(), VcpuError> {
        self.reset_cmd(VcpuCmd::ParavirtOff)
    }

    fn reset_cmd(&mut self, cmd: VcpuCmd) -> Result<(), VcpuError> {
        self.cmd
            .send(cmd)
            .map_err(|_| VcpuError::ThreadGone(self.id))?;
        self.resets
            .recv()
            .map_err(|_| VcpuError::ThreadGone(self.id))?
    }

    /// Sends `cmd` and waits for the thread to acknowledge it. Pause and Stop may find
    /// the thread inside KVM_RUN, so it is kicked out with a signal until it answers;
    /// Resume only ever reaches a thread waiting for commands.
    pub fn command(&mut self, cmd: VcpuCmd) -> Result<(), VcpuError> {
        if cmd == VcpuCmd::SaveState {
            return self.save_state().map(|_| ());
        }
        if cmd == VcpuCmd::Reset || cmd == VcpuCmd::ParavirtOff {
            return self.reset_cmd(cmd);
        }
        self.cmd
            .send(cmd)
            .map_err(|_| VcpuError::ThreadGone(self.id))?;
        if cmd == VcpuCmd::Resume {
            return self
                .ack
                .recv()
                .map(|_| ())
                .map_err(|_| VcpuError::ThreadGone(self.id));
        }
        loop {
            if let Some(t) = &self.thread {
                // A signal that lands while the thread is outside KVM_RUN is lost,
                // so keep kicking until the acknowledgement arrives.
                let _ = t.kill(SIGRTMIN());
            }
            match self.ack.recv_timeout(Duration::from_millis(1)) {
                Ok(_) => return Ok(()),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return Err(VcpuError::ThreadGone(self.id)),
            }
        }
    }

    /// Stops and joins the thread (keeping its exit report).
    pub fn stop(&mut self) {
        let _ = self.command(VcpuCmd::Stop);
        if let Some(t) = self.thread.take() {
            self.report = t.join().ok();
        }
    }

    /// The exit report of a stopped vCPU (once).
    pub fn take_report(&mut self) -> Option<VcpuExitReport> {
        self.report.take()
    }
}

impl Drop for VcpuHandle {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.stop();
        }
    }
}
