//! virtio-mmio transport and virtio devices (block, net, rng).
//!
//! Threading model:
//! - Register accesses (feature negotiation, status, queue setup, config space)
//!   arrive on vCPU threads through the MMIO [`Bus`] and are handled by
//!   [`mmio::MmioTransport`].
//! - Queue notifications are ioeventfds registered with KVM at `base + 0x50`
//!   (datamatch = queue index). Each device is an `event_manager` subscriber
//!   and processes its queues on the VMM event-loop thread only.
//! - Interrupts leave through an [`IrqLine`] (irqfd); the interrupt status
//!   register is shared lock-free between both sides ([`VirtioInterrupt`]).
//!
//! Every device embeds a [`common::VirtioCommon`] (features, queue sizes and eventfds, the
//! interrupt, the queues while active, the NEEDS_RESET flag); the [`VirtioDevice`] trait's
//! default methods answer the transport from it, so a device writes only its config space,
//! what it does at reset beyond the common part, and its queue processing.
//!
//! Queue processing is pure code (`block::request`, `net::frames`, `rng::queue`) over
//! `virtio_queue` chains so it can be unit-tested and fuzzed without KVM. Disk I/O runs on a
//! per-disk I/O thread (`block::io_thread`), never on the event loop.
//!
//! The devices know nothing of where they sit in the VM: the device manager
//! (`device_manager/attach.rs`) gives each its MMIO slot and GSI and wires it in.

pub mod block;
pub mod common;
pub mod mmio;
pub mod net;
pub mod notify;
pub mod persist;
pub mod rng;
pub mod testing;

use std::sync::{Arc, Mutex};

use event_manager::{EventManager, MutEventSubscriber};
use virtio_queue::Queue;
use vmm_sys_util::eventfd::EventFd;

use crate::devices::bus::BusError;
use crate::vstate::memory::GuestMemoryMmap;

pub use block::{BlockConfig, BlockConfigError};
pub use common::VirtioInterrupt;
pub use net::{NetConfig, NetConfigError};
pub use rng::RngConfig;

/// virtio device type ids (virtio 1.2, 5).
pub const TYPE_NET: u32 = 1;
/// virtio-blk device id.
pub const TYPE_BLOCK: u32 = 2;
/// virtio-rng (entropy) device id.
pub const TYPE_RNG: u32 = 4;

/// Device status bits (virtio 1.2, 2.1).
pub mod status {
    pub const ACKNOWLEDGE: u32 = 1;
    pub const DRIVER: u32 = 2;
    pub const DRIVER_OK: u32 = 4;
    pub const FEATURES_OK: u32 = 8;
    pub const NEEDS_RESET: u32 = 0x40;
    pub const FAILED: u32 = 0x80;
}

/// Feature bit: modern (version 1) device. Every device offers it and the
/// transport refuses FEATURES_OK unless the driver accepts it.
pub const VIRTIO_F_VERSION_1: u32 = 32;

/// Interrupt status bit: a used ring was updated.
pub const INT_VRING: u32 = 1;
/// Interrupt status bit: configuration (or NEEDS_RESET) changed.
pub const INT_CONFIG: u32 = 2;

/// Errors of the virtio devices (and of wiring them into a VM: `device_manager/attach.rs`).
#[derive(Debug, thiserror::Error)]
pub enum VirtioError {
    #[error("cannot open disk image {path}: {source}")]
    OpenImage {
        path: String,
        source: std::io::Error,
    },
    #[error("disk backend: {0}")]
    Disk(#[from] block::DiskError),
    #[error("tap device: {0}")]
    Tap(#[from] net::TapError),
    #[error("cannot create eventfd: {0}")]
    EventFd(std::io::Error),
    #[error("cannot register irqfd for GSI {gsi}: {source}")]
    Irqfd { gsi: u32, source: kvm_ioctls::Error },
    #[error("cannot register ioeventfd at {addr:#x} for queue {queue}: {source}")]
    Ioeventfd {
        addr: u64,
        queue: usize,
        source: kvm_ioctls::Error,
    },
    #[error("MMIO bus: {0}")]
    Bus(#[from] BusError),
    #[error("cannot add the device to the event loop: {0}")]
    EventLoop(event_manager::Error),
    #[error("restoring {0}")]
    Restore(String),
    #[error("disk I/O thread: {0}")]
    IoThread(String),
}

/// What the virtio-mmio transport needs from a device.
///
/// The transport owns the queue configuration until the driver sets
/// DRIVER_OK; then it hands copies of the queues to [`VirtioDevice::activate`]
/// and the device processes them on the event-loop thread.
pub trait VirtioDevice: Send {
    /// virtio device id ([`TYPE_BLOCK`], [`TYPE_NET`]).
    fn device_type(&self) -> u32;
    /// The state every device shares; the default methods below answer from it.
    fn common(&self) -> &common::VirtioCommon;
    /// Mutable access to [`VirtioDevice::common`].
    fn common_mut(&mut self) -> &mut common::VirtioCommon;
    /// Maximum size of each queue (powers of two).
    fn queue_max_sizes(&self) -> &[u16] {
        self.common().queue_max_sizes()
    }
    /// Features the device offers (including [`VIRTIO_F_VERSION_1`]).
    fn avail_features(&self) -> u64 {
        self.common().avail_features()
    }
    /// Features the driver accepted (a subset of `avail_features`), once
    /// FEATURES_OK was accepted by the transport.
    fn set_acked_features(&mut self, features: u64) {
        self.common_mut().set_acked_features(features);
    }
    /// Read `data.len()` bytes of the device configuration space at `offset`.
    /// Bytes beyond the config space read as zero.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Driver write to the configuration space; ignored by default.
    fn write_config(&mut self, offset: u64, data: &[u8]) {
        crate::guest_log!(
            log::Level::Warn,
            "virtio: ignored config write at {offset:#x} ({} bytes)",
            data.len()
        );
    }
    /// The driver set DRIVER_OK: start processing `queues` (already validated). By default
    /// [`common::VirtioCommon::activate`] keeps them and kicks every queue's eventfd.
    fn activate(&mut self, mem: GuestMemoryMmap, queues: Vec<Queue>) -> Result<(), ActivateError> {
        self.common_mut().activate(mem, queues)
    }
    /// The driver wrote 0 to Status: stop processing and drop queues. The
    /// device must be able to be activated again afterwards. A device with state of its own
    /// overrides it and calls [`common::VirtioCommon::reset`].
    fn reset(&mut self) {
        self.common_mut().reset();
    }
    /// True between `activate` and `reset`.
    fn is_activated(&self) -> bool {
        self.common().is_activated()
    }
    /// One eventfd per queue; the attach function registers them as KVM
    /// ioeventfds, the device's event handler listens to them.
    fn queue_events(&self) -> &[EventFd] {
        self.common().queue_events()
    }
    /// The interrupt state shared with the transport.
    fn interrupt(&self) -> &Arc<VirtioInterrupt> {
        self.common().interrupt()
    }
    /// While active: the device's own queues, whose ring positions are the live ones.
    fn live_queues(&self) -> Option<Vec<mmio::QueueSnapshot>> {
        self.common().live_queues()
    }
}

/// Why a device refused activation.
#[derive(Debug, thiserror::Error)]
pub enum ActivateError {
    #[error("wrong number of queues: expected {expected}, got {got}")]
    QueueCount { expected: usize, got: usize },
    #[error("backend: {0}")]
    Backend(String),
    #[error("cannot signal the event loop: {0}")]
    EventFd(std::io::Error),
}

/// One virtio device as the builder holds it: the device is both the
/// transport's backend and an event-loop subscriber.
pub trait VirtioSubscriberDevice: VirtioDevice + MutEventSubscriber {}
impl<T: VirtioDevice + MutEventSubscriber> VirtioSubscriberDevice for T {}

/// The event manager type the VMM event-loop thread runs.
pub type VmmEventManager = EventManager<Arc<Mutex<dyn MutEventSubscriber + Send>>>;

/// Collect the descriptors of a chain, detecting chains the iterator cut
/// short (descriptor loops, chains longer than the queue, next index out of
/// the table, unreadable descriptor table entries).
pub(crate) fn collect_chain<M>(
    chain: virtio_queue::DescriptorChain<M>,
) -> Result<Vec<virtio_queue::desc::split::Descriptor>, ChainError>
where
    M: std::ops::Deref,
    M::Target: vm_memory::GuestMemory,
{
    let mut descs = Vec::new();
    for d in chain {
        descs.push(d);
    }
    match descs.last() {
        None => Err(ChainError::Empty),
        Some(last) if last.has_next() => Err(ChainError::Truncated(descs.len())),
        Some(_) => Ok(descs),
    }
}

/// A descriptor chain that cannot be walked.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ChainError {
    #[error("descriptor chain head is unreadable or out of the table")]
    Empty,
    #[error("descriptor chain broken after {0} descriptors (loop, too long, or bad next index)")]
    Truncated(usize),
}

#[cfg(test)]
pub(crate) mod test_utils;

/// Copy `data.len()` bytes of `config` at `offset` into `data`; bytes past
/// the end of `config` read as zero. Never panics on guest offsets.
pub fn read_config_bytes(config: &[u8], offset: u64, data: &mut [u8]) {
    for (i, b) in data.iter_mut().enumerate() {
        *b = usize::try_from(offset)
            .ok()
            .and_then(|o| o.checked_add(i))
            .and_then(|o| config.get(o))
            .copied()
            .unwrap_or(0);
    }
}
