//! The virtio-blk device: features, config space, activation, and the two halves of queue
//! processing the event handler drives: [`BlockDevice::process_queue`] (parse chains, hand
//! requests to the device's I/O thread) and [`BlockDevice::process_completions`] (put what the
//! I/O thread finished in the used ring). Disk I/O itself never runs here (`io_thread.rs`).

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use virtio_queue::{Queue, QueueT};
use vmm_sys_util::eventfd::EventFd;

use super::disk::{DiskBackend, SECTOR_SIZE};
use super::io_thread::{Completion, IoThread, IoThreadSetup, Job, SharedDisk};
use super::overlay::Overlay;
use super::request::{self, BlockContext, Popped, MAX_DISCARD_SECTORS, MAX_DISCARD_SEG};
use super::BlockConfig;
use crate::devices::interrupt::IrqLine;
use crate::devices::virtio::common::VirtioCommon;
use crate::devices::virtio::notify::{self, VIRTIO_RING_F_EVENT_IDX};
use crate::devices::virtio::{
    read_config_bytes, VirtioDevice, VirtioError, TYPE_BLOCK, VIRTIO_F_VERSION_1,
};

/// Queue size offered to the driver.
pub const QUEUE_SIZE: u16 = 256;

pub const VIRTIO_BLK_F_SEG_MAX: u32 = 2;
pub const VIRTIO_BLK_F_RO: u32 = 5;
pub const VIRTIO_BLK_F_BLK_SIZE: u32 = 6;
pub const VIRTIO_BLK_F_FLUSH: u32 = 9;
pub const VIRTIO_BLK_F_DISCARD: u32 = 13;
pub const VIRTIO_BLK_F_WRITE_ZEROES: u32 = 14;

/// Size of the config space we expose (`struct virtio_blk_config` up to
/// `write_zeroes_may_unmap` + padding).
const CONFIG_LEN: usize = 60;

/// Name of the I/O thread when none is given.
pub const IO_THREAD_NAME: &str = "blk-io";

/// Plain-data device state (for snapshots).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockDeviceState {
    pub avail_features: u64,
    pub acked_features: u64,
    pub capacity: u64,
    pub read_only: bool,
    pub id: [u8; 20],
    pub needs_reset: bool,
}

/// How the device's I/O thread starts.
#[derive(Default)]
pub struct IoThreadOptions {
    /// Thread name (at most 15 bytes are kept); [`IO_THREAD_NAME`] when `None`.
    pub name: Option<String>,
    /// Runs first on the thread; its failure fails device creation.
    pub setup: Option<IoThreadSetup>,
}

/// A virtio-blk device over any [`DiskBackend`].
pub struct BlockDevice {
    disk: SharedDisk,
    capacity: u64,
    read_only: bool,
    id: [u8; 20],
    io: IoThread,
    /// Requests handed to the I/O thread and not completed yet.
    in_flight: usize,
    common: VirtioCommon,
    config: [u8; CONFIG_LEN],
}

impl BlockDevice {
    /// Open the backend `cfg` names (raw file, read-only file, or base +
    /// overlay) and build the device.
    pub fn from_config(
        cfg: &BlockConfig,
        irq: IrqLine,
        io: IoThreadOptions,
    ) -> Result<Self, VirtioError> {
        Self::with_io_thread(open_backend(cfg)?, cfg.id_bytes(), irq, io)
    }

    /// A device over `disk` answering GET_ID with `id`, with a default I/O thread.
    pub fn new(
        disk: Box<dyn DiskBackend>,
        id: [u8; 20],
        irq: IrqLine,
    ) -> Result<Self, VirtioError> {
        Self::with_io_thread(disk, id, irq, IoThreadOptions::default())
    }

    /// A device over `disk` answering GET_ID with `id`; its I/O thread starts as `io` says.
    pub fn with_io_thread(
        disk: Box<dyn DiskBackend>,
        id: [u8; 20],
        irq: IrqLine,
        io: IoThreadOptions,
    ) -> Result<Self, VirtioError> {
        let ro = disk.read_only();
        let capacity = disk.capacity();
        let mut f = (1u64 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_RING_F_EVENT_IDX)
            | (1 << VIRTIO_BLK_F_SEG_MAX)
            | (1 << VIRTIO_BLK_F_BLK_SIZE)
            | (1 << VIRTIO_BLK_F_FLUSH);
        if ro {
            f |= 1 << VIRTIO_BLK_F_RO;
        } else {
            f |= (1 << VIRTIO_BLK_F_DISCARD) | (1 << VIRTIO_BLK_F_WRITE_ZEROES);
        }
        let mut c = [0u8; CONFIG_LEN];
        c[0..8].copy_from_slice(&(capacity / SECTOR_SIZE).to_le_bytes());
        c[12..16].copy_from_slice(&u32::from(QUEUE_SIZE - 2).to_le_bytes()); // seg_max
        c[20..24].copy_from_slice(&(SECTOR_SIZE as u32).to_le_bytes()); // blk_size
        c[34..36].copy_from_slice(&1u16.to_le_bytes()); // num_queues
        c[36..40].copy_from_slice(&MAX_DISCARD_SECTORS.to_le_bytes());
        c[40..44].copy_from_slice(&MAX_DISCARD_SEG.to_le_bytes());
        c[44..48].copy_from_slice(&1u32.to_le_bytes()); // discard_sector_alignment
        c[48..52].copy_from_slice(&MAX_DISCARD_SECTORS.to_le_bytes());
        c[52..56].copy_from_slice(&MAX_DISCARD_SEG.to_le_bytes());
        c[56] = 1; // write_zeroes_may_unmap
        let disk: SharedDisk = Arc::new(Mutex::new(disk));
        let thread = IoThread::spawn(
            io.name.as_deref().unwrap_or(IO_THREAD_NAME),
            disk.clone(),
            BlockContext { id },
            io.setup,
        )?;
        Ok(Self {
            disk,
            capacity,
            read_only: ro,
            id,
            io: thread,
            in_flight: 0,
            common: VirtioCommon::new(f, &[QUEUE_SIZE], irq)?,
            config: c,
        })
    }

    /// Plain-data state.
    pub fn state(&self) -> BlockDeviceState {
        let c = self.common.state();
        BlockDeviceState {
            avail_features: c.avail_features,
            acked_features: c.acked_features,
            capacity: self.capacity,
            read_only: self.read_only,
            id: self.id,
            needs_reset: c.needs_reset,
        }
    }

    /// Takes every available chain (event-loop thread): well-formed requests go to the I/O
    /// thread, malformed ones are answered at once. Marks the device NEEDS_RESET on fatal
    /// guest errors.
    pub fn process_queue(&mut self) {
        let Some(a) = self.common.running() else {
            return;
        };
        // Driver notifications are off while the queue is drained (with EVENT_IDX: the
        // driver adds chains without notifying), and the ring is checked once more after
        // they are back on (notify.rs).
        let (io, in_flight) = (&mut self.io, &mut self.in_flight);
        let mem = a.mem.clone();
        let out = notify::drain(&mut a.queues[0], &mem, |q| {
            let mut pass = request::QueueOutcome::default();
            while let Some(p) = request::pop_request(q, &mem) {
                match p {
                    Popped::Request { head, req } => {
                        let job = Job {
                            head,
                            req,
                            mem: mem.clone(),
                            generation: io.generation(),
                        };
                        if !io.submit(job) {
                            pass.fatal = Some("the I/O thread is gone".to_string());
                            break;
                        }
                        *in_flight += 1;
                    }
                    Popped::Answered { head, len } => {
                        if let Err(e) = q.add_used(&mem, head, len) {
                            pass.fatal = Some(format!("cannot complete chain {head}: {e}"));
                            break;
                        }
                        pass.used += 1;
                    }
                    Popped::Fatal(e) => {
                        pass.fatal = Some(e);
                        break;
                    }
                }
            }
            pass
        })
        .unwrap_or_else(|e| request::QueueOutcome {
            used: 0,
            fatal: Some(format!("queue rings unusable: {e}")),
        });
        self.finish_pass(out.used, out.fatal);
    }

    /// Puts the requests the I/O thread finished in the used ring (event-loop thread).
    pub fn process_completions(&mut self) {
        let mut used = 0;
        let mut fatal = None;
        loop {
            match self.io.try_completion() {
                Ok(Some(c)) => {
                    self.in_flight = self.in_flight.saturating_sub(1);
                    self.complete(c, &mut used, &mut fatal);
                }
                Ok(None) => break,
                Err(e) => {
                    self.in_flight = 0;
                    fatal = Some(e.to_string());
                    break;
                }
            }
        }
        self.finish_pass(used, fatal);
    }

    /// Completes what the guest queued and waits for every request in flight, then flushes
    /// the disk: afterwards the rings hold nothing half done (snapshots; vCPUs paused).
    pub fn quiesce(&mut self) -> Result<(), VirtioError> {
        self.process_queue();
        let (mut used, mut fatal) = (0, None);
        self.wait_in_flight(|me, c| me.complete(c, &mut used, &mut fatal));
        self.finish_pass(used, fatal);
        self.flush_disk()
    }

    /// Number of requests the I/O thread has not completed yet.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Waits for every request in flight, handing each completion to `f`.
    fn wait_in_flight(&mut self, mut f: impl FnMut(&mut Self, Completion)) {
        while self.in_flight > 0 {
            match self.io.wait_completion() {
                Ok(c) => {
                    self.in_flight -= 1;
                    f(self, c);
                }
                Err(e) => {
                    self.in_flight = 0;
                    log::error!("virtio-blk: {e}; device needs reset");
                    self.common.mark_broken();
                }
            }
        }
    }

    fn complete(&mut self, c: Completion, used: &mut u32, fatal: &mut Option<String>) {
        match c {
            Completion::Done { head, len } => {
                let Some(a) = self.common.active_mut() else {
                    return;
                };
                if fatal.is_some() {
                    return;
                }
                match a.queues[0].add_used(&a.mem, head, len) {
                    Ok(()) => *used += 1,
                    Err(e) => *fatal = Some(format!("cannot complete chain {head}: {e}")),
                }
            }
            Completion::Fatal { head, error } => {
                *fatal = Some(format!("chain {head}: {error}"));
            }
            Completion::Cancelled => {}
        }
    }

    /// Interrupts the guest for `used` new used-ring entries; `fatal` marks NEEDS_RESET.
    fn finish_pass(&mut self, used: u32, fatal: Option<String>) {
        if used > 0 {
            self.common.interrupt_if_needed(0);
        }
        if let Some(f) = fatal {
            log::error!("virtio-blk: {f}; device needs reset");
            self.common.mark_broken();
        }
    }
}

/// Opens the backend `cfg` names.
pub(super) fn open_backend(cfg: &BlockConfig) -> Result<Box<dyn DiskBackend>, VirtioError> {
    Ok(match &cfg.overlay {
        Some(o) => Box::new(Overlay::open(&cfg.path, o)?),
        None => super::open::open_disk(&cfg.path, cfg.read_only)?,
    })
}

impl VirtioDevice for BlockDevice {
    fn device_type(&self) -> u32 {
        TYPE_BLOCK
    }
    fn common(&self) -> &VirtioCommon {
        &self.common
    }
    fn common_mut(&mut self) -> &mut VirtioCommon {
        &mut self.common
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config, offset, data);
    }
    // activate: VirtioCommon's (its queue kick also picks up requests queued before
    // DRIVER_OK: not allowed, but harmless).
    /// Requests not started yet are dropped; one the I/O thread is executing is waited for,
    /// because it writes into buffers the driver owns again after the reset.
    fn reset(&mut self) {
        self.io.cancel_pending();
        self.wait_in_flight(|_, _| {});
        self.common.reset();
    }
}

impl BlockDevice {
    /// FLUSH the backend (snapshots: every completed write is on disk). Call with nothing in
    /// flight (after [`BlockDevice::quiesce`]).
    pub fn flush_disk(&mut self) -> Result<(), VirtioError> {
        Ok(self.lock_disk().flush()?)
    }

    /// The disk, for the event loop's own use while nothing is in flight.
    pub(super) fn lock_disk(&self) -> std::sync::MutexGuard<'_, Box<dyn DiskBackend>> {
        self.disk.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Signalled when the I/O thread completed requests.
    pub fn completion_event(&self) -> &EventFd {
        self.io.completion_event()
    }

    /// The queue the device is processing, if active (tests, benches).
    pub fn active_queue(&self) -> Option<&Queue> {
        self.common.active().map(|a| &a.queues[0])
    }

    /// Whether a fatal guest error stopped the device.
    pub fn is_broken(&self) -> bool {
        self.common.is_broken()
    }

    /// Used-ring position (tests).
    pub fn next_used(&self) -> Option<u16> {
        self.active_queue().map(|q| q.next_used())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::block::disk::{DiskError, GuestSlice, MemDisk};
    use crate::devices::virtio::block::request::{VIRTIO_BLK_S_OK, VIRTIO_BLK_T_OUT};
    use crate::devices::virtio::test_utils::{mem, TestQueue};
    use crate::devices::virtio::{INT_VRING, VIRTIO_F_VERSION_1};
    use crate::vstate::memory::GuestMemoryMmap;
    use std::sync::Condvar;
    use std::time::Duration;
    use vm_memory::{Bytes, GuestAddress};

    /// A [`MemDisk`] whose writes wait while its gate is closed, recording which thread ran
    /// them.
    #[derive(Default)]
    struct Gate {
        open: Mutex<bool>,
        cv: Condvar,
        /// Writes started, and the threads they ran on.
        started: Mutex<Vec<Option<String>>>,
    }

    impl Gate {
        fn open(&self) {
            *self.open.lock().unwrap() = true;
            self.cv.notify_all();
        }
        fn started(&self) -> usize {
            self.started.lock().unwrap().len()
        }
        fn wait_started(&self, n: usize) {
            for _ in 0..2000 {
                if self.started() >= n {
                    return;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            panic!("{n} writes never started");
        }
    }

    struct GatedDisk {
        disk: MemDisk,
        gate: Arc<Gate>,
    }

    impl DiskBackend for GatedDisk {
        fn capacity(&self) -> u64 {
            self.disk.capacity()
        }
        fn read_only(&self) -> bool {
            false
        }
        fn read_at(&mut self, offset: u64, dst: &GuestSlice) -> Result<(), DiskError> {
            self.disk.read_at(offset, dst)
        }
        fn write_at(&mut self, offset: u64, src: &GuestSlice) -> Result<(), DiskError> {
            let name = std::thread::current().name().map(str::to_string);
            self.gate.started.lock().unwrap().push(name);
            let mut open = self.gate.open.lock().unwrap();
            while !*open {
                open = self.gate.cv.wait(open).unwrap();
            }
            self.disk.write_at(offset, src)
        }
        fn flush(&mut self) -> Result<(), DiskError> {
            self.disk.flush()
        }
        fn discard(&mut self, offset: u64, len: u64) -> Result<(), DiskError> {
            self.disk.discard(offset, len)
        }
        fn write_zeroes(&mut self, offset: u64, len: u64) -> Result<(), DiskError> {
            self.disk.write_zeroes(offset, len)
        }
    }

    const HDRS: u64 = 0x10000;
    const DATA: u64 = 0x20000;
    const STATUS: u64 = 0x30000;

    /// An active device over a closed gate, and a queue at 0x1000.
    fn gated(m: &GuestMemoryMmap) -> (BlockDevice, Arc<Gate>, TestQueue<'_>) {
        let gate = Arc::new(Gate::default());
        let disk = GatedDisk {
            disk: MemDisk::new(1 << 20, false),
            gate: gate.clone(),
        };
        let io = IoThreadOptions {
            name: Some("blk-io-test".into()),
            setup: None,
        };
        let mut d =
            BlockDevice::with_io_thread(Box::new(disk), [0; 20], IrqLine::new(5).unwrap(), io)
                .unwrap();
        let tq = TestQueue::new(m, 0x1000, 16);
        d.set_acked_features(1 << VIRTIO_F_VERSION_1);
        d.activate(m.clone(), vec![tq.queue()]).unwrap();
        (d, gate, tq)
    }

    /// Makes request `i` available: write 512 bytes of `i` to sector `i`.
    fn add_write(m: &GuestMemoryMmap, tq: &mut TestQueue<'_>, i: u64) {
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&VIRTIO_BLK_T_OUT.to_le_bytes());
        h[8..16].copy_from_slice(&i.to_le_bytes());
        m.write_slice(&h, GuestAddress(HDRS + 16 * i)).unwrap();
        m.write_slice(&[i as u8; 512], GuestAddress(DATA + 512 * i))
            .unwrap();
        m.write_obj(0xeeu8, GuestAddress(STATUS + i)).unwrap();
        tq.add_chain(&[
            (HDRS + 16 * i, 16, false),
            (DATA + 512 * i, 512, false),
            (STATUS + i, 1, true),
        ]);
    }

    /// Waits (at most 10 s) until the completion eventfd is readable.
    fn wait_completion_event(d: &BlockDevice) {
        let mut p = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(d.completion_event()),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, 10_000) };
        assert_eq!(n, 1, "no completion signalled");
    }

    #[test]
    fn requests_run_on_the_io_thread_and_complete_through_its_eventfd() {
        let m = mem();
        let (mut d, gate, mut tq) = gated(&m);
        add_write(&m, &mut tq, 0);
        add_write(&m, &mut tq, 1);
        // Submitting does not wait for the disk (its writes are blocked).
        d.process_queue();
        assert_eq!(d.in_flight(), 2);
        gate.wait_started(1);
        assert_eq!(tq.used_idx(), 0);
        assert_eq!(d.interrupt().status() & INT_VRING, 0);
        gate.open();
        while d.in_flight() > 0 {
            wait_completion_event(&d);
            let _ = d.completion_event().read();
            d.process_completions();
        }
        assert_eq!(tq.used_idx(), 2);
        assert_ne!(d.interrupt().status() & INT_VRING, 0);
        for i in 0..2 {
            assert_eq!(
                m.read_obj::<u8>(GuestAddress(STATUS + i)).unwrap(),
                VIRTIO_BLK_S_OK
            );
        }
        let threads = gate.started.lock().unwrap().clone();
        assert_eq!(threads, vec![Some("blk-io-test".to_string()); 2]);
    }

    #[test]
    fn quiesce_waits_for_every_request_in_flight() {
        let m = mem();
        let (mut d, gate, mut tq) = gated(&m);
        for i in 0..3 {
            add_write(&m, &mut tq, i);
        }
        d.process_queue();
        gate.wait_started(1);
        let g = gate.clone();
        let opener = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            g.open();
        });
        d.quiesce().unwrap();
        assert!(
            *gate.open.lock().unwrap(),
            "quiesce returned before the disk finished"
        );
        assert_eq!(d.in_flight(), 0);
        assert_eq!(tq.used_idx(), 3);
        assert_eq!(gate.started(), 3);
        opener.join().unwrap();
    }

    #[test]
    fn reset_drops_requests_not_started_and_waits_for_the_running_one() {
        let m = mem();
        let (mut d, gate, mut tq) = gated(&m);
        for i in 0..3 {
            add_write(&m, &mut tq, i);
        }
        d.process_queue();
        gate.wait_started(1);
        let g = gate.clone();
        let opener = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            g.open();
        });
        d.reset();
        assert!(
            *gate.open.lock().unwrap(),
            "reset returned while a write was running"
        );
        assert_eq!(d.in_flight(), 0);
        // The running write finished; the two queued after it were never executed; nothing
        // was put in the used ring of the queue the driver reset.
        assert_eq!(gate.started(), 1);
        assert_eq!(tq.used_idx(), 0);
        assert_eq!(m.read_obj::<u8>(GuestAddress(STATUS + 1)).unwrap(), 0xee);
        opener.join().unwrap();
        // The device works again after the driver sets it up anew.
        let mut tq = TestQueue::new(&m, 0x1000, 16);
        d.activate(m.clone(), vec![tq.queue()]).unwrap();
        add_write(&m, &mut tq, 2);
        d.quiesce().unwrap();
        assert_eq!(tq.used_idx(), 1);
        assert_eq!(
            m.read_obj::<u8>(GuestAddress(STATUS + 2)).unwrap(),
            VIRTIO_BLK_S_OK
        );
    }

    #[test]
    fn a_failed_io_thread_setup_fails_the_device() {
        let io = IoThreadOptions {
            name: Some("blk-io-bad".into()),
            setup: Some(Box::new(|| Err("no filter".into()))),
        };
        let e = BlockDevice::with_io_thread(
            Box::new(MemDisk::new(4096, false)),
            [0; 20],
            IrqLine::new(5).unwrap(),
            io,
        )
        .err()
        .expect("device created");
        assert_eq!(
            e.to_string(),
            "disk I/O thread: blk-io-bad: setup: no filter"
        );
    }

    fn cfg_u32(d: &BlockDevice, off: u64) -> u32 {
        let mut b = [0u8; 4];
        d.read_config(off, &mut b);
        u32::from_le_bytes(b)
    }

    #[test]
    fn features_and_config_space() {
        let d = BlockDevice::new(
            Box::new(MemDisk::new(1 << 20, false)),
            [0; 20],
            IrqLine::new(5).unwrap(),
        )
        .unwrap();
        let f = d.avail_features();
        for b in [
            VIRTIO_F_VERSION_1,
            VIRTIO_RING_F_EVENT_IDX,
            VIRTIO_BLK_F_FLUSH,
            VIRTIO_BLK_F_DISCARD,
            VIRTIO_BLK_F_WRITE_ZEROES,
            VIRTIO_BLK_F_SEG_MAX,
        ] {
            assert_ne!(f & (1 << b), 0, "bit {b}");
        }
        assert_eq!(f & (1 << VIRTIO_BLK_F_RO), 0);
        let mut cap = [0u8; 8];
        d.read_config(0, &mut cap);
        assert_eq!(u64::from_le_bytes(cap), 2048);
        assert_eq!(cfg_u32(&d, 12), 254); // seg_max
        assert_eq!(cfg_u32(&d, 40), MAX_DISCARD_SEG);
        // Reads past the config space are zero, never a panic.
        assert_eq!(cfg_u32(&d, 0xf00), 0);
        assert_eq!(cfg_u32(&d, u64::MAX - 1), 0);
        let ro = BlockDevice::new(
            Box::new(MemDisk::new(4096, true)),
            [0; 20],
            IrqLine::new(5).unwrap(),
        )
        .unwrap();
        let f = ro.avail_features();
        assert_ne!(f & (1 << VIRTIO_BLK_F_RO), 0);
        assert_eq!(f & (1 << VIRTIO_BLK_F_DISCARD), 0);
        assert_eq!(f & (1 << VIRTIO_BLK_F_WRITE_ZEROES), 0);
    }
}
