//! Snapshot state of the virtio-mmio transport: its registers and each queue as plain data,
//! why a saved state cannot be restored, and the transport's [`Persist`].

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use virtio_queue::{Queue, QueueT};

use super::MmioTransport;
use crate::devices::virtio::{status, VirtioDevice};
use crate::persist::Persist;
use crate::vstate::memory::GuestMemoryMmap;

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

/// What a restored transport gets: guest memory and the device behind it (its own state
/// already restored).
pub struct TransportArgs {
    pub mem: GuestMemoryMmap,
    pub device: Arc<Mutex<dyn VirtioDevice>>,
}

impl Persist for MmioTransport {
    type State = MmioTransportState;
    type Args<'a> = TransportArgs;
    type Error = RestoreError;

    /// Snapshot of the register state. Once the device is active its own copies of the queues
    /// are the live ones (ring positions advance there), so those are reported.
    fn save(&self) -> MmioTransportState {
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
    fn restore(args: TransportArgs, state: &MmioTransportState) -> Result<Self, RestoreError> {
        let mut t = Self::new(args.mem, args.device);
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
}
