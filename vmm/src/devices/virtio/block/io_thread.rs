//! The I/O thread of one virtio-blk device.
//!
//! Every blocking disk operation — `pread`/`pwrite` straight into guest memory, `fdatasync`,
//! `fallocate` — runs here, never on the VMM event-loop thread, so a slow disk delays only its
//! own requests: the event loop keeps serving every other device (and this device's queue
//! notifications) meanwhile.
//!
//! - The event loop parses chains ([`super::request::pop_request`]) and sends each well-formed
//!   request as a [`Job`]; the thread executes jobs in order
//!   ([`super::request::execute_and_answer`]: data, then the status byte), sends a
//!   [`Completion`] back and writes the completion eventfd, on which the event loop puts the
//!   chain in the used ring. One thread per disk and FIFO order: a FLUSH covers every write
//!   submitted before it.
//! - A job carries the generation it was submitted in. A device reset starts a new
//!   generation: jobs of an older one that have not started are not executed (they come back
//!   as [`Completion::Cancelled`]); the reset then waits for the one that may be running,
//!   because it writes into guest buffers the driver owns again once the reset is done.
//! - The disk is shared with the event loop behind a mutex that only this thread takes while
//!   requests are in flight; the event loop takes it (flush, overlay copy) only once nothing is
//!   in flight (snapshots).
//! - The thread runs an optional setup first (the launcher installs a seccomp filter for it:
//!   no `openat`, only the I/O system calls); a failed setup fails device creation.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use vmm_sys_util::eventfd::EventFd;

use super::disk::DiskBackend;
use super::request::{execute_and_answer, BlockContext, ChainOutcome, Request};
use crate::devices::virtio::VirtioError;
use crate::vstate::memory::GuestMemoryMmap;

/// Runs first on a new I/O thread (e.g. installs its seccomp filter).
pub type IoThreadSetup = Box<dyn FnOnce() -> Result<(), String> + Send>;

/// The disk as the device and its I/O thread share it.
pub type SharedDisk = Arc<Mutex<Box<dyn DiskBackend>>>;

/// One request for the I/O thread.
pub struct Job {
    pub head: u16,
    pub req: Request,
    pub mem: GuestMemoryMmap,
    pub generation: u64,
}

/// What the I/O thread did with a job.
#[derive(Debug, PartialEq, Eq)]
pub enum Completion {
    /// Executed, status written: put `head` in the used ring with `len`.
    Done { head: u16, len: u32 },
    /// The status byte could not be written: the device needs a reset.
    Fatal { head: u16, error: String },
    /// Submitted before a reset and not started: nothing was done.
    Cancelled,
}

/// The I/O thread ended (it panicked): nothing more completes.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("the disk's I/O thread is gone")]
pub struct IoThreadGone;

/// Handle of a running I/O thread.
pub struct IoThread {
    jobs: Option<Sender<Job>>,
    completions: Receiver<Completion>,
    done_evt: EventFd,
    generation: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl IoThread {
    /// Starts the thread `name` over `disk`; returns once its `setup` ran (and fails if it
    /// failed).
    pub fn spawn(
        name: &str,
        disk: SharedDisk,
        ctx: BlockContext,
        setup: Option<IoThreadSetup>,
    ) -> Result<Self, VirtioError> {
        let done_evt = EventFd::new(libc::EFD_NONBLOCK).map_err(VirtioError::EventFd)?;
        let signal = done_evt.try_clone().map_err(VirtioError::EventFd)?;
        let (job_tx, job_rx) = channel::<Job>();
        let (done_tx, done_rx) = channel::<Completion>();
        let (ready_tx, ready_rx) = channel::<Result<(), String>>();
        let generation = Arc::new(AtomicU64::new(0));
        let current = generation.clone();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let ready = setup.map_or(Ok(()), |s| s());
                let ok = ready.is_ok();
                let _ = ready_tx.send(ready);
                if ok {
                    run(&job_rx, &done_tx, &signal, &disk, &ctx, &current);
                }
            })
            .map_err(|e| VirtioError::IoThread(format!("cannot start {name}: {e}")))?;
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(VirtioError::IoThread(format!("{name}: setup: {e}")));
            }
            Err(_) => {
                let _ = thread.join();
                return Err(VirtioError::IoThread(format!("{name} ended during setup")));
            }
        }
        Ok(Self {
            jobs: Some(job_tx),
            completions: done_rx,
            done_evt,
            generation,
            thread: Some(thread),
        })
    }

    /// Signalled (readable) when completions are waiting.
    pub fn completion_event(&self) -> &EventFd {
        &self.done_evt
    }

    /// The generation new jobs belong to.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Queues a job; false when the thread is gone.
    pub fn submit(&self, job: Job) -> bool {
        self.jobs.as_ref().is_some_and(|j| j.send(job).is_ok())
    }

    /// A completion, if one is waiting.
    pub fn try_completion(&self) -> Result<Option<Completion>, IoThreadGone> {
        match self.completions.try_recv() {
            Ok(c) => Ok(Some(c)),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => Err(IoThreadGone),
        }
    }

    /// Waits for the next completion.
    pub fn wait_completion(&self) -> Result<Completion, IoThreadGone> {
        self.completions.recv().map_err(|_| IoThreadGone)
    }

    /// Starts a new generation: jobs submitted before that have not started are cancelled.
    pub fn cancel_pending(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }
}

impl Drop for IoThread {
    fn drop(&mut self) {
        // Closing the job channel ends the thread once it finished what it was doing.
        self.generation.fetch_add(1, Ordering::SeqCst);
        drop(self.jobs.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The thread's loop: execute jobs in order until the device drops its sender.
fn run(
    jobs: &Receiver<Job>,
    done: &Sender<Completion>,
    signal: &EventFd,
    disk: &SharedDisk,
    ctx: &BlockContext,
    generation: &AtomicU64,
) {
    while let Ok(job) = jobs.recv() {
        let c = if job.generation != generation.load(Ordering::SeqCst) {
            Completion::Cancelled
        } else {
            let mut d = disk.lock().unwrap_or_else(|p| p.into_inner());
            match execute_and_answer(&job.req, &job.mem, d.as_mut(), ctx) {
                ChainOutcome::Done { len, .. } => Completion::Done {
                    head: job.head,
                    len,
                },
                ChainOutcome::Fatal(e) => Completion::Fatal {
                    head: job.head,
                    error: e.to_string(),
                },
            }
        };
        if done.send(c).is_err() {
            return;
        }
        if let Err(e) = signal.write(1) {
            log::error!("virtio-blk I/O thread: cannot signal a completion: {e}");
        }
    }
}
