//! What the launcher's threads share: the VM's status (read and watched through the control
//! socket) and the events the main loop ([`crate::runner::run`]) reacts to. The runner, the
//! control socket and the launch preparation all import it; it imports none of them.

use std::sync::{Arc, Condvar, LockResult, Mutex, MutexGuard};
use std::time::Duration;

use microvirt_crds::launcher_state::LauncherState;
use vmm::builder::RunTimings;
use vmm::devices::legacy::boot_timer::BootTime;
use vmm::devices::legacy::serial::OutputQueue;
use vmm::ExitReason;

/// What the main loop reacts to.
pub enum Event {
    /// SIGTERM, SIGINT or SIGHUP.
    Signal(i32),
    Booted(BootTime),
    /// The guest rebooted in place; the reboot count so far.
    Rebooted(u64),
    /// Graceful shutdown asked through the control socket.
    ShutdownRequested,
    /// Hard stop asked through the control socket.
    StopRequested,
    Exited(Result<(ExitReason, RunTimings), String>),
}

/// State shown by the control socket's `status`.
#[derive(Clone, Debug, Default)]
pub struct Status {
    pub name: String,
    pub state: LauncherState,
    pub boot_time_ms: Option<u64>,
    pub vcpus: u64,
    pub mem_mib: u64,
    pub disks: Vec<String>,
    pub network: String,
    /// The VMM thread (its seccomp mode and capabilities are read from /proc for `status`).
    pub vmm_tid: Option<i32>,
    /// The guest console's output queue (bytes dropped for a reader that was too slow).
    pub console: Option<Arc<OutputQueue>>,
    /// In-place reboots of the guest so far.
    pub reboots: u64,
}

/// The status plus a condition variable that wakes the control socket's `watch` clients.
#[derive(Debug, Default)]
pub struct StatusCell {
    status: Mutex<Status>,
    changed: Condvar,
}

impl StatusCell {
    pub fn new(s: Status) -> Self {
        Self {
            status: Mutex::new(s),
            changed: Condvar::new(),
        }
    }

    /// Read access (and write access that need not wake watchers).
    pub fn lock(&self) -> LockResult<MutexGuard<'_, Status>> {
        self.status.lock()
    }

    /// Changes the status and wakes every waiter of [`StatusCell::wait_while`].
    pub fn update(&self, f: impl FnOnce(&mut Status)) {
        if let Ok(mut s) = self.status.lock() {
            f(&mut s);
        }
        self.changed.notify_all();
    }

    /// Blocks while `unchanged` holds, at most `timeout` (futex only: no new syscalls).
    pub fn wait_while(&self, timeout: Duration, mut unchanged: impl FnMut(&Status) -> bool) {
        if let Ok(g) = self.status.lock() {
            let _ = self
                .changed
                .wait_timeout_while(g, timeout, |s| unchanged(s));
        }
    }
}

pub type SharedStatus = Arc<StatusCell>;

pub fn set_state(status: &SharedStatus, state: LauncherState) {
    status.update(|s| s.state = state);
}
