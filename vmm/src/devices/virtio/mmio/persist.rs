//! Snapshot state of the virtio-mmio transport: its registers and each queue as plain data,
//! and why a saved state cannot be restored.

use serde::{Deserialize, Serialize};
use virtio_queue::{Queue, QueueT};

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
