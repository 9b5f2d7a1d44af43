//! virtio-mmio transport, version 2 ("modern", virtio 1.2 section 4.2).
//!
//! The transport is a [`BusDevice`]: vCPU threads call it for every register
//! access. It owns feature negotiation, the device-status state machine
//! ([`valid_transition`]), queue setup and reset, and forwards config-space
//! accesses to the device. Queue processing never happens here: the queue
//! notify register is backed by ioeventfds (one per queue, datamatch = queue
//! index) that the device's event-loop subscriber reads. A notify write that
//! does reach the bus (no ioeventfd registered) is forwarded to the same
//! eventfd, so behaviour does not depend on KVM.

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use virtio_queue::{Queue, QueueT};

use super::notify::VIRTIO_RING_F_EVENT_IDX;
use super::{status, VirtioDevice, VirtioInterrupt, VIRTIO_F_VERSION_1};
use crate::devices::bus::BusDevice;
use crate::vstate::memory::GuestMemoryMmap;

pub const REG_MAGIC: u64 = 0x000;
pub const REG_VERSION: u64 = 0x004;
pub const REG_DEVICE_ID: u64 = 0x008;
pub const REG_VENDOR_ID: u64 = 0x00c;
pub const REG_DEVICE_FEATURES: u64 = 0x010;
pub const REG_DEVICE_FEATURES_SEL: u64 = 0x014;
pub const REG_DRIVER_FEATURES: u64 = 0x020;
pub const REG_DRIVER_FEATURES_SEL: u64 = 0x024;
pub const REG_QUEUE_SEL: u64 = 0x030;
pub const REG_QUEUE_NUM_MAX: u64 = 0x034;
pub const REG_QUEUE_NUM: u64 = 0x038;
pub const REG_QUEUE_READY: u64 = 0x044;
/// Queue notify register; KVM ioeventfds sit here (datamatch = queue index).
pub const REG_QUEUE_NOTIFY: u64 = 0x050;
pub const REG_INTERRUPT_STATUS: u64 = 0x060;
pub const REG_INTERRUPT_ACK: u64 = 0x064;
pub const REG_STATUS: u64 = 0x070;
pub const REG_QUEUE_DESC_LOW: u64 = 0x080;
pub const REG_QUEUE_DESC_HIGH: u64 = 0x084;
pub const REG_QUEUE_DRIVER_LOW: u64 = 0x090;
pub const REG_QUEUE_DRIVER_HIGH: u64 = 0x094;
pub const REG_QUEUE_DEVICE_LOW: u64 = 0x0a0;
pub const REG_QUEUE_DEVICE_HIGH: u64 = 0x0a4;
pub const REG_SHM_SEL: u64 = 0x0ac;
pub const REG_SHM_LEN_LOW: u64 = 0x0b0;
pub const REG_SHM_LEN_HIGH: u64 = 0x0b4;
pub const REG_CONFIG_GENERATION: u64 = 0x0fc;
/// Device-specific configuration space starts here.
pub const REG_CONFIG: u64 = 0x100;

/// "virt" in little endian.
pub const MMIO_MAGIC: u32 = 0x7472_6976;
pub const MMIO_VERSION: u32 = 2;
/// Vendor id reported to the guest ("MV", microvirt).
pub const VENDOR_ID: u32 = 0x4d56;

/// Is a driver write moving the device status from `from` to `to` allowed?
///
/// Both values are without the device-owned NEEDS_RESET bit. Allowed:
/// - writing 0 (reset) from any state;
/// - the initialisation sequence one bit at a time:
///   0 → ACKNOWLEDGE → +DRIVER → +FEATURES_OK → +DRIVER_OK;
/// - adding FAILED to any state that does not have it yet.
///
/// Everything else (skipping a step, clearing bits other than by reset,
/// unknown bits) is refused; the transport then ignores the write and logs.
pub fn valid_transition(from: u32, to: u32) -> bool {
    use status::*;
    const A: u32 = ACKNOWLEDGE;
    const AD: u32 = ACKNOWLEDGE | DRIVER;
    const ADF: u32 = AD | FEATURES_OK;
    const ADFO: u32 = ADF | DRIVER_OK;
    if to == 0 {
        return true;
    }
    if from & FAILED == 0 && to == from | FAILED && from & !(ADFO) == 0 {
        return true;
    }
    matches!((from, to), (0, A) | (A, AD) | (AD, ADF) | (ADF, ADFO))
}

/// Plain-data state of one queue (for snapshots).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSnapshot {
    pub max_size: u16,
    pub size: u16,
    pub ready: bool,
    pub desc_table: u64,
    pub avail_ring: u64,
    pub used_ring: u64,
    pub next_avail: u16,
    pub next_used: u16,
    pub event_idx: bool,
}

impl From<&Queue> for QueueSnapshot {
    fn from(q: &Queue) -> Self {
        Self {
            max_size: q.max_size(),
            size: q.size(),
            ready: q.ready(),
            desc_table: q.desc_table(),
            avail_ring: q.avail_ring(),
            used_ring: q.used_ring(),
            next_avail: q.next_avail(),
            next_used: q.next_used(),
            event_idx: q.event_idx_enabled(),
        }
    }
}

/// Plain-data state of the transport (for snapshots).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmioTransportState {
    pub device_status: u32,
    pub device_features_sel: u32,
    pub driver_features_sel: u32,
    pub queue_sel: u32,
    pub acked_features: u64,
    pub config_generation: u32,
    pub queues: Vec<QueueSnapshot>,
    /// InterruptStatus register.
    #[serde(default)]
    pub interrupt_status: u32,
    /// The device set DEVICE_NEEDS_RESET.
    #[serde(default)]
    pub needs_reset: bool,
}

/// Why a transport could not be restored.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RestoreError {
    #[error("the snapshot has {saved} queues, the device has {device}")]
    QueueCount { saved: usize, device: usize },
    #[error("queue {index}: {reason}")]
    Queue { index: usize, reason: String },
    #[error("activating the device: {0}")]
    Activate(String),
}

/// The virtio-mmio register block in front of one device.
pub struct MmioTransport {
    device: Arc<Mutex<dyn VirtioDevice>>,
    interrupt: Arc<VirtioInterrupt>,
    mem: GuestMemoryMmap,
    device_status: u32,
    device_features_sel: u32,
    driver_features_sel: u32,
    queue_sel: u32,
    /// What the driver wrote, possibly including unoffered bits (checked at
    /// FEATURES_OK).
    driver_features: u64,
    config_generation: u32,
    queues: Vec<Queue>,
}

impl MmioTransport {
    /// A transport for `device`; `mem` is handed to the device on activation.
    pub fn new(mem: GuestMemoryMmap, device: Arc<Mutex<dyn VirtioDevice>>) -> Self {
        let (interrupt, queues) = {
            let d = device.lock().expect("virtio device lock poisoned");
            let queues = d
                .queue_max_sizes()
                .iter()
                .map(|&s| Queue::new(s).expect("device queue sizes are powers of two"))
                .collect();
            (d.interrupt().clone(), queues)
        };
        Self {
            device,
            interrupt,
            mem,
            device_status: 0,
            device_features_sel: 0,
            driver_features_sel: 0,
            queue_sel: 0,
            driver_features: 0,
            config_generation: 0,
            queues,
        }
    }

    /// Snapshot of the register state. Once the device is active its own copies of the queues
    /// are the live ones (ring positions advance there), so those are reported.
    pub fn state(&self) -> MmioTransportState {
        let live = self.device().live_queues();
        let queues = match live {
            Some(l) if l.len() == self.queues.len() => l,
            _ => self.queues.iter().map(QueueSnapshot::from).collect(),
        };
        MmioTransportState {
            device_status: self.device_status,
            device_features_sel: self.device_features_sel,
            driver_features_sel: self.driver_features_sel,
            queue_sel: self.queue_sel,
            acked_features: self.driver_features,
            config_generation: self.config_generation,
            queues,
            interrupt_status: self.interrupt.status(),
            needs_reset: self.interrupt.needs_reset(),
        }
    }

    /// A transport for `device` in the saved `state` (the device's own state already restored).
    /// When the driver had set DRIVER_OK, the device is activated with the saved queues, ring
    /// positions included, and processes whatever the guest queued meanwhile.
    pub fn restore(
        mem: GuestMemoryMmap,
        device: Arc<Mutex<dyn VirtioDevice>>,
        state: &MmioTransportState,
    ) -> Result<Self, RestoreError> {
        let mut t = Self::new(mem, device);
        if state.queues.len() != t.queues.len() {
            return Err(RestoreError::QueueCount {
                saved: state.queues.len(),
                device: t.queues.len(),
            });
        }
        let mut queues = Vec::with_capacity(state.queues.len());
        for (i, (saved, q)) in state.queues.iter().zip(&t.queues).enumerate() {
            if saved.max_size != q.max_size() {
                return Err(RestoreError::Queue {
                    index: i,
                    reason: format!(
                        "max size {} in the snapshot, {} here",
                        saved.max_size,
                        q.max_size()
                    ),
                });
            }
            let qs = virtio_queue::QueueState {
                max_size: saved.max_size,
                next_avail: saved.next_avail,
                next_used: saved.next_used,
                event_idx_enabled: saved.event_idx,
                size: saved.size,
                ready: saved.ready,
                desc_table: saved.desc_table,
                avail_ring: saved.avail_ring,
                used_ring: saved.used_ring,
            };
            queues.push(Queue::try_from(qs).map_err(|e| RestoreError::Queue {
                index: i,
                reason: e.to_string(),
            })?);
        }
        t.queues = queues;
        t.device_status = state.device_status;
        t.device_features_sel = state.device_features_sel;
        t.driver_features_sel = state.driver_features_sel;
        t.queue_sel = state.queue_sel;
        t.driver_features = state.acked_features;
        t.config_generation = state.config_generation;
        let active = state.device_status & status::DRIVER_OK != 0 && !state.needs_reset;
        if active {
            if let Some((i, _)) = t
                .queues
                .iter()
                .enumerate()
                .find(|(_, q)| !q.is_valid(&t.mem))
            {
                return Err(RestoreError::Queue {
                    index: i,
                    reason: "not ready or outside guest memory".into(),
                });
            }
            let queues: Vec<Queue> = t
                .queues
                .iter()
                .map(|q| Queue::try_from(q.state()).expect("a valid queue's state converts back"))
                .collect();
            let mem = t.mem.clone();
            t.device()
                .activate(mem, queues)
                .map_err(|e| RestoreError::Activate(e.to_string()))?;
        }
        t.interrupt
            .restore(state.interrupt_status, state.needs_reset);
        Ok(t)
    }

    /// Status as the driver reads it (with NEEDS_RESET when set by the device).
    pub fn device_status(&self) -> u32 {
        let nr = if self.interrupt.needs_reset() {
            status::NEEDS_RESET
        } else {
            0
        };
        self.device_status | nr
    }

    fn device(&self) -> std::sync::MutexGuard<'_, dyn VirtioDevice + 'static> {
        self.device.lock().expect("virtio device lock poisoned")
    }

    fn queue_config_allowed(&self) -> bool {
        self.device_status & status::FEATURES_OK != 0 && self.device_status & status::DRIVER_OK == 0
    }

    fn selected_queue(&mut self) -> Option<&mut Queue> {
        self.queues.get_mut(self.queue_sel as usize)
    }

    /// Apply `f` to the selected queue if queue setup is allowed now and the
    /// queue is not live; log otherwise.
    fn with_setup_queue(&mut self, what: &str, f: impl FnOnce(&mut Queue)) {
        if !self.queue_config_allowed() {
            crate::guest_log!(
                log::Level::Warn,
                "virtio-mmio: {what} write in status {:#x} ignored",
                self.device_status
            );
            return;
        }
        let sel = self.queue_sel;
        match self.selected_queue() {
            Some(q) if !q.ready() => f(q),
            Some(_) => crate::guest_log!(
                log::Level::Warn,
                "virtio-mmio: {what} write to ready queue {sel} ignored"
            ),
            None => crate::guest_log!(
                log::Level::Warn,
                "virtio-mmio: {what} write to missing queue {sel} ignored"
            ),
        }
    }

    /// Resets the device as the driver's write of 0 to the status register does (an in-place
    /// reboot: the new kernel finds every device as at power-on).
    pub fn reset_device(&mut self) {
        self.reset();
    }

    fn reset(&mut self) {
        self.device().reset();
        for q in &mut self.queues {
            q.reset();
        }
        self.device_status = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.queue_sel = 0;
        self.driver_features = 0;
        self.interrupt.reset();
    }

    fn set_status(&mut self, value: u32) {
        let to = value & !status::NEEDS_RESET;
        let from = self.device_status;
        if !valid_transition(from, to) {
            crate::guest_log!(
                log::Level::Warn,
                "virtio-mmio: invalid status transition {from:#x} -> {to:#x} ignored"
            );
            return;
        }
        if to == 0 {
            self.reset();
            return;
        }
        let added = to & !from;
        if added == status::FEATURES_OK {
            let offered = self.device().avail_features();
            let acked = self.driver_features;
            if acked & !offered != 0 || acked & (1u64 << VIRTIO_F_VERSION_1) == 0 {
                // Leave FEATURES_OK clear: the driver re-reads the status and fails.
                crate::guest_log!(log::Level::Warn,
                    "virtio-mmio: refusing features {acked:#x} (offered {offered:#x}, VERSION_1 required)"
                );
                return;
            }
            self.device().set_acked_features(acked);
        }
        self.device_status = to;
        if added == status::DRIVER_OK {
            self.activate();
        }
    }

    fn activate(&mut self) {
        if let Some((i, _)) = self
            .queues
            .iter()
            .enumerate()
            .find(|(_, q)| !q.is_valid(&self.mem))
        {
            crate::guest_log!(
                log::Level::Error,
                "virtio-mmio: DRIVER_OK with queue {i} not ready or outside guest memory"
            );
            self.interrupt.set_needs_reset();
            return;
        }
        let event_idx = self.driver_features & (1u64 << VIRTIO_RING_F_EVENT_IDX) != 0;
        for q in &mut self.queues {
            q.set_event_idx(event_idx);
        }
        let queues: Vec<Queue> = self
            .queues
            .iter()
            .map(|q| Queue::try_from(q.state()).expect("a valid queue's state converts back"))
            .collect();
        let mem = self.mem.clone();
        if let Err(e) = self.device().activate(mem, queues) {
            crate::guest_log!(
                log::Level::Error,
                "virtio-mmio: device activation failed: {e}"
            );
            self.interrupt.set_needs_reset();
        }
    }

    fn read_reg(&mut self, offset: u64) -> u32 {
        match offset {
            REG_MAGIC => MMIO_MAGIC,
            REG_VERSION => MMIO_VERSION,
            REG_DEVICE_ID => self.device().device_type(),
            REG_VENDOR_ID => VENDOR_ID,
            REG_DEVICE_FEATURES => {
                let f = self.device().avail_features();
                match self.device_features_sel {
                    0 => f as u32,
                    1 => (f >> 32) as u32,
                    _ => 0,
                }
            }
            REG_QUEUE_NUM_MAX => self.selected_queue().map_or(0, |q| u32::from(q.max_size())),
            REG_QUEUE_READY => self.selected_queue().map_or(0, |q| u32::from(q.ready())),
            REG_INTERRUPT_STATUS => self.interrupt.status(),
            REG_STATUS => self.device_status(),
            REG_SHM_LEN_LOW | REG_SHM_LEN_HIGH => u32::MAX, // no shared memory regions
            REG_CONFIG_GENERATION => self.config_generation,
            _ => {
                crate::guest_log!(
                    log::Level::Warn,
                    "virtio-mmio: read of unknown/write-only register {offset:#x}"
                );
                0
            }
        }
    }

    fn write_reg(&mut self, offset: u64, v: u32) {
        match offset {
            REG_DEVICE_FEATURES_SEL => self.device_features_sel = v,
            REG_DRIVER_FEATURES => {
                if self.device_status != status::ACKNOWLEDGE | status::DRIVER {
                    crate::guest_log!(
                        log::Level::Warn,
                        "virtio-mmio: feature write in status {:#x} ignored",
                        self.device_status
                    );
                    return;
                }
                match self.driver_features_sel {
                    0 => {
                        self.driver_features = (self.driver_features & !0xffff_ffff) | u64::from(v)
                    }
                    1 => {
                        self.driver_features =
                            (self.driver_features & 0xffff_ffff) | (u64::from(v) << 32)
                    }
                    s if v != 0 => crate::guest_log!(
                        log::Level::Warn,
                        "virtio-mmio: features {v:#x} in page {s} ignored"
                    ),
                    _ => {}
                }
            }
            REG_DRIVER_FEATURES_SEL => self.driver_features_sel = v,
            REG_QUEUE_SEL => self.queue_sel = v,
            REG_QUEUE_NUM => self.with_setup_queue("QueueNum", |q| {
                if let Ok(size) = u16::try_from(v) {
                    if q.try_set_size(size).is_ok() {
                        return;
                    }
                }
                crate::guest_log!(
                    log::Level::Warn,
                    "virtio-mmio: invalid queue size {v} ignored"
                );
            }),
            REG_QUEUE_READY => {
                if v == 1 {
                    self.with_setup_queue("QueueReady", |q| q.set_ready(true));
                } else if v == 0 && self.queue_config_allowed() {
                    if let Some(q) = self.selected_queue() {
                        q.set_ready(false);
                    }
                }
            }
            REG_QUEUE_NOTIFY => self.notify(v),
            REG_INTERRUPT_ACK => self.interrupt.ack(v),
            REG_STATUS => self.set_status(v),
            REG_QUEUE_DESC_LOW => {
                self.with_setup_queue("QueueDescLow", |q| q.set_desc_table_address(Some(v), None))
            }
            REG_QUEUE_DESC_HIGH => {
                self.with_setup_queue("QueueDescHigh", |q| q.set_desc_table_address(None, Some(v)))
            }
            REG_QUEUE_DRIVER_LOW => self.with_setup_queue("QueueDriverLow", |q| {
                q.set_avail_ring_address(Some(v), None)
            }),
            REG_QUEUE_DRIVER_HIGH => self.with_setup_queue("QueueDriverHigh", |q| {
                q.set_avail_ring_address(None, Some(v))
            }),
            REG_QUEUE_DEVICE_LOW => {
                self.with_setup_queue("QueueDeviceLow", |q| q.set_used_ring_address(Some(v), None))
            }
            REG_QUEUE_DEVICE_HIGH => self.with_setup_queue("QueueDeviceHigh", |q| {
                q.set_used_ring_address(None, Some(v))
            }),
            REG_SHM_SEL => {}
            _ => crate::guest_log!(
                log::Level::Warn,
                "virtio-mmio: write {v:#x} to unknown/read-only register {offset:#x}"
            ),
        }
    }

    /// A QueueNotify write that KVM did not turn into an ioeventfd signal.
    fn notify(&mut self, queue: u32) {
        let d = self.device();
        match d.queue_events().get(queue as usize) {
            Some(evt) => {
                if let Err(e) = evt.write(1) {
                    crate::guest_log!(
                        log::Level::Error,
                        "virtio-mmio: cannot signal queue {queue}: {e}"
                    );
                }
            }
            None => crate::guest_log!(
                log::Level::Warn,
                "virtio-mmio: notify for missing queue {queue} ignored"
            ),
        }
    }
}

/// The name of the virtio-mmio register at `offset` (exit statistics).
pub fn register_name(offset: u64) -> Option<&'static str> {
    Some(match offset {
        REG_MAGIC => "MagicValue",
        REG_VERSION => "Version",
        REG_DEVICE_ID => "DeviceID",
        REG_VENDOR_ID => "VendorID",
        REG_DEVICE_FEATURES => "DeviceFeatures",
        REG_DEVICE_FEATURES_SEL => "DeviceFeaturesSel",
        REG_DRIVER_FEATURES => "DriverFeatures",
        REG_DRIVER_FEATURES_SEL => "DriverFeaturesSel",
        REG_QUEUE_SEL => "QueueSel",
        REG_QUEUE_NUM_MAX => "QueueNumMax",
        REG_QUEUE_NUM => "QueueNum",
        REG_QUEUE_READY => "QueueReady",
        REG_QUEUE_NOTIFY => "QueueNotify",
        REG_INTERRUPT_STATUS => "InterruptStatus",
        REG_INTERRUPT_ACK => "InterruptACK",
        REG_STATUS => "Status",
        REG_QUEUE_DESC_LOW | REG_QUEUE_DESC_HIGH => "QueueDesc",
        REG_QUEUE_DRIVER_LOW | REG_QUEUE_DRIVER_HIGH => "QueueDriver",
        REG_QUEUE_DEVICE_LOW | REG_QUEUE_DEVICE_HIGH => "QueueDevice",
        REG_SHM_SEL | REG_SHM_LEN_LOW | REG_SHM_LEN_HIGH => "SHM",
        REG_CONFIG_GENERATION => "ConfigGeneration",
        o if o >= REG_CONFIG => "config",
        _ => return None,
    })
}

impl BusDevice for MmioTransport {
    fn register_name(&self, offset: u64) -> Option<&'static str> {
        register_name(offset)
    }

    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset >= REG_CONFIG {
            self.device().read_config(offset - REG_CONFIG, data);
            return;
        }
        if data.len() != 4 || !offset.is_multiple_of(4) {
            crate::guest_log!(
                log::Level::Warn,
                "virtio-mmio: {}-byte read at {offset:#x} ignored",
                data.len()
            );
            data.fill(0);
            return;
        }
        let v = self.read_reg(offset);
        data.copy_from_slice(&v.to_le_bytes());
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset >= REG_CONFIG {
            self.device().write_config(offset - REG_CONFIG, data);
            return;
        }
        if data.len() != 4 || !offset.is_multiple_of(4) {
            crate::guest_log!(
                log::Level::Warn,
                "virtio-mmio: {}-byte write at {offset:#x} ignored",
                data.len()
            );
            return;
        }
        let v = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
        self.write_reg(offset, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::test_utils::{mem, DummyDevice};
    use status::*;

    #[test]
    fn status_transitions_exhaustive() {
        const ADFO: u32 = ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK;
        let mut expected = std::collections::HashSet::new();
        for from in 0..=0xffu32 {
            expected.insert((from, 0u32));
        }
        expected.insert((0, ACKNOWLEDGE));
        expected.insert((ACKNOWLEDGE, ACKNOWLEDGE | DRIVER));
        expected.insert((ACKNOWLEDGE | DRIVER, ACKNOWLEDGE | DRIVER | FEATURES_OK));
        expected.insert((ACKNOWLEDGE | DRIVER | FEATURES_OK, ADFO));
        // FAILED may be added to any state made only of the four init bits.
        for from in 0..=0xffu32 {
            if from & !ADFO == 0 {
                expected.insert((from, from | FAILED));
            }
        }
        for from in 0..=0xffu32 {
            for to in 0..=0xffu32 {
                assert_eq!(
                    valid_transition(from, to),
                    expected.contains(&(from, to)),
                    "{from:#x} -> {to:#x}"
                );
            }
        }
    }

    fn rd(t: &mut MmioTransport, off: u64) -> u32 {
        let mut b = [0u8; 4];
        t.read(off, &mut b);
        u32::from_le_bytes(b)
    }
    fn wr(t: &mut MmioTransport, off: u64, v: u32) {
        t.write(off, &v.to_le_bytes());
    }

    fn transport() -> (MmioTransport, Arc<Mutex<DummyDevice>>) {
        let d = Arc::new(Mutex::new(DummyDevice::new(&[16, 8])));
        let t = MmioTransport::new(mem(), d.clone());
        (t, d)
    }

    fn setup_queue(t: &mut MmioTransport, i: u32, base: u64, size: u32) {
        wr(t, REG_QUEUE_SEL, i);
        wr(t, REG_QUEUE_NUM, size);
        wr(t, REG_QUEUE_DESC_LOW, base as u32);
        wr(t, REG_QUEUE_DESC_HIGH, (base >> 32) as u32);
        wr(t, REG_QUEUE_DRIVER_LOW, (base + 0x1000) as u32);
        wr(t, REG_QUEUE_DEVICE_LOW, (base + 0x2000) as u32);
        wr(t, REG_QUEUE_READY, 1);
    }

    fn negotiate(t: &mut MmioTransport) {
        wr(t, REG_STATUS, ACKNOWLEDGE);
        wr(t, REG_STATUS, ACKNOWLEDGE | DRIVER);
        wr(t, REG_DRIVER_FEATURES_SEL, 1);
        wr(t, REG_DRIVER_FEATURES, 1); // VERSION_1
        wr(t, REG_DRIVER_FEATURES_SEL, 0);
        wr(t, REG_DRIVER_FEATURES, 1 << 3);
        wr(t, REG_STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK);
    }

    #[test]
    fn a_guest_hammering_bad_registers_cannot_flood_the_log() {
        use crate::logging::{capture, BURST};
        let (mut t, _) = transport();
        let lines = capture::lines_of(|| {
            for i in 0..10_000 {
                wr(&mut t, 0xf0, i);
                let _ = rd(&mut t, 0xf4);
                wr(&mut t, REG_QUEUE_SEL, 9);
                wr(&mut t, REG_QUEUE_NUM, 4);
            }
        });
        // Three call sites (unknown write, unknown read, queue write too early), each limited.
        assert!(
            lines.len() <= 3 * BURST as usize,
            "{} lines, first {:?}",
            lines.len(),
            &lines[..5.min(lines.len())]
        );
        assert!(lines
            .iter()
            .any(|l| l.contains("unknown/read-only register 0xf0")));
        assert!(lines
            .iter()
            .any(|l| l.contains("unknown/write-only register 0xf4")));
        assert!(lines.iter().any(|l| l.contains("QueueNum write")));
    }

    #[test]
    fn identification_registers() {
        let (mut t, _) = transport();
        assert_eq!(rd(&mut t, REG_MAGIC), 0x7472_6976);
        assert_eq!(rd(&mut t, REG_VERSION), 2);
        assert_eq!(rd(&mut t, REG_DEVICE_ID), 42);
        wr(&mut t, REG_DEVICE_FEATURES_SEL, 0);
        assert_eq!(rd(&mut t, REG_DEVICE_FEATURES), 1 << 3);
        wr(&mut t, REG_DEVICE_FEATURES_SEL, 1);
        assert_eq!(rd(&mut t, REG_DEVICE_FEATURES), 1);
        wr(&mut t, REG_DEVICE_FEATURES_SEL, 2);
        assert_eq!(rd(&mut t, REG_DEVICE_FEATURES), 0);
        wr(&mut t, REG_QUEUE_SEL, 1);
        assert_eq!(rd(&mut t, REG_QUEUE_NUM_MAX), 8);
        wr(&mut t, REG_QUEUE_SEL, 7);
        assert_eq!(rd(&mut t, REG_QUEUE_NUM_MAX), 0);
        // Narrow register accesses are ignored and read as zero.
        let mut b = [0xffu8; 2];
        t.read(REG_MAGIC, &mut b);
        assert_eq!(b, [0, 0]);
    }

    #[test]
    fn full_init_activates_and_reset_deactivates() {
        let (mut t, d) = transport();
        negotiate(&mut t);
        assert_eq!(rd(&mut t, REG_STATUS), ACKNOWLEDGE | DRIVER | FEATURES_OK);
        assert_eq!(
            d.lock().unwrap().common.acked_features(),
            (1 << 32) | (1 << 3)
        );
        setup_queue(&mut t, 0, 0x10000, 16);
        setup_queue(&mut t, 1, 0x20000, 4);
        wr(
            &mut t,
            REG_STATUS,
            ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK,
        );
        assert_eq!(
            rd(&mut t, REG_STATUS),
            ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK
        );
        {
            let dev = d.lock().unwrap();
            assert!(dev.active);
            assert_eq!(dev.activated_queues[1].size(), 4);
            assert_eq!(dev.activated_queues[0].desc_table(), 0x10000);
        }
        let st = t.state();
        assert_eq!(st.queues[1].size, 4);
        assert!(st.queues[0].ready);
        // Queue setup after DRIVER_OK is refused.
        wr(&mut t, REG_QUEUE_SEL, 0);
        wr(&mut t, REG_QUEUE_DESC_LOW, 0x5000);
        assert_eq!(t.state().queues[0].desc_table, 0x10000);
        // Reset.
        wr(&mut t, REG_STATUS, 0);
        assert_eq!(rd(&mut t, REG_STATUS), 0);
        assert!(!d.lock().unwrap().active);
        assert_eq!(
            t.state().queues[0],
            QueueSnapshot {
                max_size: 16,
                size: 16,
                ..Default::default()
            }
            .with_default_addrs()
        );
        // And it can be brought up again.
        negotiate(&mut t);
        setup_queue(&mut t, 0, 0x10000, 16);
        setup_queue(&mut t, 1, 0x20000, 8);
        wr(
            &mut t,
            REG_STATUS,
            ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK,
        );
        assert!(d.lock().unwrap().active);
    }

    #[test]
    fn event_idx_follows_the_driver_and_is_part_of_the_queue_state() {
        use crate::devices::virtio::notify::VIRTIO_RING_F_EVENT_IDX;
        for acked in [false, true] {
            let d = Arc::new(Mutex::new(DummyDevice::with_features(
                &[16, 8],
                1 << VIRTIO_RING_F_EVENT_IDX,
            )));
            let mut t = MmioTransport::new(mem(), d.clone());
            wr(&mut t, REG_STATUS, ACKNOWLEDGE);
            wr(&mut t, REG_STATUS, ACKNOWLEDGE | DRIVER);
            wr(&mut t, REG_DRIVER_FEATURES_SEL, 1);
            wr(&mut t, REG_DRIVER_FEATURES, 1);
            wr(&mut t, REG_DRIVER_FEATURES_SEL, 0);
            wr(
                &mut t,
                REG_DRIVER_FEATURES,
                if acked {
                    1 << VIRTIO_RING_F_EVENT_IDX
                } else {
                    0
                },
            );
            wr(&mut t, REG_STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK);
            setup_queue(&mut t, 0, 0x10000, 16);
            setup_queue(&mut t, 1, 0x20000, 8);
            wr(
                &mut t,
                REG_STATUS,
                ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK,
            );
            let dev = d.lock().unwrap();
            assert!(dev.active);
            for q in &dev.activated_queues {
                assert_eq!(q.event_idx_enabled(), acked);
            }
            drop(dev);
            let saved = t.state();
            assert!(saved.queues.iter().all(|q| q.event_idx == acked));
            // A restored device gets it back: its queues suppress notifications and
            // interrupts exactly as the driver expects.
            let d2 = Arc::new(Mutex::new(DummyDevice::with_features(
                &[16, 8],
                1 << VIRTIO_RING_F_EVENT_IDX,
            )));
            let restored = MmioTransport::restore(mem(), d2.clone(), &saved).unwrap();
            let dev2 = d2.lock().unwrap();
            assert!(dev2.active);
            assert_eq!(dev2.activated_queues.len(), 2);
            for q in &dev2.activated_queues {
                assert_eq!(q.event_idx_enabled(), acked);
            }
            drop(dev2);
            assert_eq!(restored.state().queues, saved.queues);
            // A reset forgets it.
            wr(&mut t, REG_STATUS, 0);
            assert!(t.state().queues.iter().all(|q| !q.event_idx));
        }
    }

    impl QueueSnapshot {
        fn with_default_addrs(self) -> Self {
            let q = Queue::new(self.max_size).unwrap();
            Self {
                desc_table: q.desc_table(),
                avail_ring: q.avail_ring(),
                used_ring: q.used_ring(),
                ..self
            }
        }
    }

    #[test]
    fn features_refused_without_version_1_or_with_unoffered_bits() {
        let (mut t, _) = transport();
        wr(&mut t, REG_STATUS, ACKNOWLEDGE);
        wr(&mut t, REG_STATUS, ACKNOWLEDGE | DRIVER);
        wr(&mut t, REG_DRIVER_FEATURES, 1 << 3);
        wr(&mut t, REG_STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK);
        assert_eq!(rd(&mut t, REG_STATUS), ACKNOWLEDGE | DRIVER);
        wr(&mut t, REG_DRIVER_FEATURES_SEL, 1);
        wr(&mut t, REG_DRIVER_FEATURES, 1 | 2); // VERSION_1 + an unoffered bit
        wr(&mut t, REG_STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK);
        assert_eq!(rd(&mut t, REG_STATUS), ACKNOWLEDGE | DRIVER);
        wr(&mut t, REG_DRIVER_FEATURES, 1);
        wr(&mut t, REG_STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK);
        assert_eq!(rd(&mut t, REG_STATUS), ACKNOWLEDGE | DRIVER | FEATURES_OK);
        // Features are frozen after FEATURES_OK.
        assert_eq!(t.state().acked_features, (1 << 32) | (1 << 3));
        wr(&mut t, REG_DRIVER_FEATURES_SEL, 0);
        wr(&mut t, REG_DRIVER_FEATURES, 0);
        assert_eq!(t.state().acked_features, (1 << 32) | (1 << 3));
    }

    #[test]
    fn invalid_transitions_ignored() {
        let (mut t, d) = transport();
        wr(&mut t, REG_STATUS, DRIVER_OK);
        assert_eq!(rd(&mut t, REG_STATUS), 0);
        wr(&mut t, REG_STATUS, ACKNOWLEDGE);
        wr(
            &mut t,
            REG_STATUS,
            ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK,
        );
        assert_eq!(rd(&mut t, REG_STATUS), ACKNOWLEDGE);
        assert!(!d.lock().unwrap().active);
        wr(&mut t, REG_STATUS, ACKNOWLEDGE | FAILED);
        assert_eq!(rd(&mut t, REG_STATUS), ACKNOWLEDGE | FAILED);
    }

    #[test]
    fn queue_setup_rules_and_bad_sizes() {
        let (mut t, _) = transport();
        // Before FEATURES_OK queue writes are ignored.
        wr(&mut t, REG_QUEUE_NUM, 4);
        assert_eq!(t.state().queues[0].size, 16);
        negotiate(&mut t);
        wr(&mut t, REG_QUEUE_NUM, 3); // not a power of two
        assert_eq!(t.state().queues[0].size, 16);
        wr(&mut t, REG_QUEUE_NUM, 32); // above max
        assert_eq!(t.state().queues[0].size, 16);
        wr(&mut t, REG_QUEUE_NUM, 0x10004); // does not fit u16
        assert_eq!(t.state().queues[0].size, 16);
        wr(&mut t, REG_QUEUE_NUM, 4);
        assert_eq!(t.state().queues[0].size, 4);
        wr(&mut t, REG_QUEUE_SEL, 9);
        wr(&mut t, REG_QUEUE_NUM, 4); // missing queue: ignored, no panic
        wr(&mut t, REG_QUEUE_READY, 1);
    }

    #[test]
    fn driver_ok_with_invalid_queue_sets_needs_reset() {
        let (mut t, d) = transport();
        negotiate(&mut t);
        setup_queue(&mut t, 0, 0x10000, 16);
        // Queue 1 points outside guest memory.
        setup_queue(&mut t, 1, 0x7fff_0000_0000, 8);
        wr(
            &mut t,
            REG_STATUS,
            ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK,
        );
        assert!(!d.lock().unwrap().active);
        assert_eq!(rd(&mut t, REG_STATUS) & NEEDS_RESET, NEEDS_RESET);
        assert_eq!(
            rd(&mut t, REG_INTERRUPT_STATUS),
            crate::devices::virtio::INT_CONFIG
        );
        wr(
            &mut t,
            REG_INTERRUPT_ACK,
            crate::devices::virtio::INT_CONFIG,
        );
        assert_eq!(rd(&mut t, REG_INTERRUPT_STATUS), 0);
        // Reset clears NEEDS_RESET.
        wr(&mut t, REG_STATUS, NEEDS_RESET); // driver echoes the bit: treated as 0 = reset
        assert_eq!(rd(&mut t, REG_STATUS), 0);
    }

    #[test]
    fn notify_reaching_the_bus_signals_the_queue_eventfd() {
        let (mut t, d) = transport();
        wr(&mut t, REG_QUEUE_NOTIFY, 1);
        assert_eq!(d.lock().unwrap().queue_events()[1].read().unwrap(), 1);
        wr(&mut t, REG_QUEUE_NOTIFY, 5); // missing queue: ignored
    }

    #[test]
    fn config_space_is_forwarded() {
        let (mut t, d) = transport();
        let mut b = [0u8; 2];
        t.read(REG_CONFIG + 1, &mut b);
        assert_eq!(b, [1, 2]);
        t.write(REG_CONFIG + 3, &[9]);
        assert_eq!(d.lock().unwrap().config[3], 9);
    }
}
