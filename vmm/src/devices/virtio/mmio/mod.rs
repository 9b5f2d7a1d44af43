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
//!
//! The register layout is in `regs.rs`, the transport's snapshot state in `persist.rs`.

use std::sync::{Arc, Mutex};

use virtio_queue::{Queue, QueueT};

use super::notify::VIRTIO_RING_F_EVENT_IDX;
use super::{status, VirtioDevice, VirtioInterrupt, VIRTIO_F_VERSION_1};
use crate::devices::bus::BusDevice;
use crate::vstate::memory::GuestMemoryMmap;

mod persist;
mod regs;
#[cfg(test)]
mod tests;

pub use persist::{MmioTransportState, QueueSnapshot, RestoreError, TransportArgs};
pub use regs::*;

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
