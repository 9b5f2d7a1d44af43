//! What other threads may ask of a running VMM ([`Action`], snapshots, its state) through a
//! [`VmmController`], and how a run ends ([`ExitReason`], [`RunTimings`]). The VMM thread
//! answers in `event_loop.rs`; `control.rs` puts a socket in front of the controller.

use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

use crate::devices::legacy::boot_timer::BootTime;
use crate::lifecycle::VmState;
use crate::snapshot::{SnapshotSummary, SnapshotWriter};
use crate::vstate::exits::ExitStats;

/// How a VM run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExitReason {
    /// The guest reset the machine (i8042, ACPI reset register or KVM reset event).
    GuestReset,
    /// The guest powered off (ACPI S5) / halted.
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
    /// Press the ACPI power button (the GED raises its interrupt; the guest's `_EVT` notifies
    /// the power button device). Refused when the VM has no ACPI.
    PowerButton,
    /// Ask the guest to shut down the way it listens to: the ACPI power button when the VM has
    /// ACPI and the guest armed the GED's interrupt (its IOAPIC pin is unmasked, as Linux's GED
    /// driver leaves it once bound), else Ctrl-Alt-Del (see [`crate::machine::Machine::power_button_armed`]).
    Shutdown,
    /// Stop now.
    Stop,
}

/// What the VMM thread is asked to do.
pub(crate) enum Request {
    Action(Action),
    State,
    Status,
    Snapshot(SnapshotWriter),
    /// The vCPUs' and the IOAPIC's state, for a person debugging a guest.
    Describe,
}

pub(crate) enum Reply {
    State(VmState),
    Status(VmStatus),
    Snapshot(SnapshotSummary),
    Describe(serde_json::Value),
}

/// The VM's lifecycle state and how often the guest rebooted in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VmStatus {
    pub state: VmState,
    /// In-place reboots so far (`RebootPolicy::InPlace`).
    pub reboots: u64,
}

/// A request and where to send its outcome.
pub(crate) type Envelope = (Request, Option<Sender<Result<Reply, String>>>);

/// A handle to send [`Action`]s (and snapshot requests) to the VMM thread.
#[derive(Clone)]
pub struct VmmController {
    pub(crate) tx: Sender<Envelope>,
    pub(crate) evt: Arc<EventFd>,
    pub(crate) overlay_devices: Arc<Vec<usize>>,
}

impl VmmController {
    /// A controller of no VM: every request answers "the VM is gone". For code that serves a
    /// controller (a control socket) and is tested without a VM.
    pub fn detached() -> std::io::Result<Self> {
        let (tx, _) = channel();
        Ok(Self {
            tx,
            evt: Arc::new(EventFd::new(libc::EFD_NONBLOCK)?),
            overlay_devices: Arc::new(Vec::new()),
        })
    }

    fn call(&self, req: Request) -> Result<Reply, String> {
        let (reply_tx, reply_rx) = channel();
        self.tx
            .send((req, Some(reply_tx)))
            .map_err(|_| "the VM is gone".to_string())?;
        self.evt.write(1).map_err(|e| e.to_string())?;
        reply_rx.recv().map_err(|_| "the VM is gone".to_string())?
    }

    /// Sends `action` and waits for the VMM thread to carry it out; returns the new state.
    pub fn request(&self, action: Action) -> Result<VmState, String> {
        match self.call(Request::Action(action))? {
            Reply::State(s) => Ok(s),
            _ => Err("unexpected reply".into()),
        }
    }

    /// The VM's lifecycle state.
    pub fn state(&self) -> Result<VmState, String> {
        match self.call(Request::State)? {
            Reply::State(s) => Ok(s),
            _ => Err("unexpected reply".into()),
        }
    }

    /// The VM's lifecycle state and reboot count.
    pub fn status(&self) -> Result<VmStatus, String> {
        match self.call(Request::Status)? {
            Reply::Status(s) => Ok(s),
            _ => Err("unexpected reply".into()),
        }
    }

    /// Sends `action` without waiting.
    pub fn send(&self, action: Action) -> Result<(), String> {
        self.tx
            .send((Request::Action(action), None))
            .map_err(|_| "the VM is gone".to_string())?;
        self.evt.write(1).map_err(|e| e.to_string())
    }

    /// Has the VMM thread write a snapshot through `files` (see [`crate::snapshot::create`],
    /// which makes them): pauses a running VM and leaves it paused when the snapshot was
    /// written; on failure a VM that was running runs again.
    pub fn snapshot(&self, files: SnapshotWriter) -> Result<SnapshotSummary, String> {
        match self.call(Request::Snapshot(files))? {
            Reply::Snapshot(s) => Ok(s),
            _ => Err("unexpected reply".into()),
        }
    }

    /// Where each vCPU is and what it waits for (its registers, LAPIC timer and pending
    /// vectors, see [`crate::vstate::persist::describe_vcpu`]) and the IOAPIC's pins: for a
    /// guest that stopped making progress. A running VM is paused for the reading (well under a
    /// millisecond of guest time) and runs again.
    pub fn describe(&self) -> Result<serde_json::Value, String> {
        match self.call(Request::Describe)? {
            Reply::Describe(v) => Ok(v),
            _ => Err("unexpected reply".into()),
        }
    }

    /// Indices of the virtio devices whose disk overlay a snapshot copies (fixed at build).
    pub fn overlay_devices(&self) -> &[usize] {
        &self.overlay_devices
    }
}

/// Timestamps of a run, relative to the build start, and the run's VM exits.
#[derive(Clone, Debug, Default)]
pub struct RunTimings {
    /// Building (or restoring) the VM.
    pub build_us: u64,
    pub first_debug_port_us: Option<u64>,
    pub boot_timer: Option<BootTime>,
    /// The exit status the guest's workload init reported (docs/oci-images.md), if any.
    pub workload_exit_status: Option<u8>,
    /// First KVM_RUN of any vCPU: the guest is running.
    pub first_vcpu_entry_us: Option<u64>,
    /// First return from KVM_RUN: the guest executed instructions.
    pub first_vcpu_exit_us: Option<u64>,
    /// VM exits of the whole run, by reason (see [`ExitStats`]).
    pub exits: ExitStats,
}
