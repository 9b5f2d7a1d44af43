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
//! The builder calls one function per device kind: [`attach_block`], [`attach_net`] and
//! [`attach_rng`].

pub mod block;
pub mod common;
pub mod mmio;
pub mod net;
pub mod notify;
pub mod persist;
pub mod rng;
pub mod testing;

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};

use event_manager::{EventManager, MutEventSubscriber, SubscriberOps};
use kvm_ioctls::{IoEventAddress, VmFd};
use virtio_queue::Queue;
use vmm_sys_util::eventfd::EventFd;

use crate::device_manager::mmio::{MmioDeviceManager, MmioError, MmioSlot};
use crate::devices::bus::{Bus, BusError};
use crate::devices::interrupt::IrqLine;
use crate::persist::Persist;
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

/// Errors of the virtio devices and their attach functions.
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
    #[error("MMIO slot allocation: {0}")]
    Slot(#[from] MmioError),
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

/// A device attached to the VM: its slot, its transport on the MMIO bus and the device.
pub struct Attached<D> {
    pub slot: MmioSlot,
    pub transport: Arc<Mutex<mmio::MmioTransport>>,
    pub device: Arc<Mutex<D>>,
}

/// What attaching a device touches.
pub struct AttachContext<'a> {
    pub vm: &'a VmFd,
    pub mem: &'a GuestMemoryMmap,
    pub mmio_bus: &'a mut Bus,
    pub mgr: &'a mut MmioDeviceManager,
    pub evmgr: &'a mut VmmEventManager,
}

/// Attach one virtio-blk disk (see [`BlockConfig`]).
///
/// Opens the image (read-only when `ro`, with a copy-on-write overlay when
/// `overlay=` is set), creates the device (its I/O thread starts as `io` says) and its
/// MMIO transport, takes the
/// next MMIO slot and GSI from `mgr`, registers the irqfd and the queue
/// ioeventfds with KVM, inserts the transport into `mmio_bus` and adds the
/// device to the event loop. Nothing is committed to `mgr` (and so to the
/// kernel command line) unless every step succeeded.
pub fn attach_block(
    vm: &VmFd,
    mem: &GuestMemoryMmap,
    mmio_bus: &mut Bus,
    mgr: &mut MmioDeviceManager,
    evmgr: &mut VmmEventManager,
    cfg: &BlockConfig,
    io: block::IoThreadOptions,
) -> Result<Attached<block::BlockDevice>, VirtioError> {
    let ctx = AttachContext {
        vm,
        mem,
        mmio_bus,
        mgr,
        evmgr,
    };
    attach_new(ctx, block_name(cfg), |irq| {
        block::BlockDevice::from_config(cfg, irq, io)
    })
}

/// Attach one virtio-net device over a TAP interface (see [`NetConfig`]).
///
/// Uses `opened` when the embedder opened the TAP already (before giving up the privileges to
/// open it), else opens `/dev/net/tun` for `tap=NAME` with IFF_TAP | IFF_NO_PI |
/// IFF_VNET_HDR; probes which offloads the TAP supports (they are offered to the guest), then
/// proceeds like [`attach_block`].
pub fn attach_net(
    vm: &VmFd,
    mem: &GuestMemoryMmap,
    mmio_bus: &mut Bus,
    mgr: &mut MmioDeviceManager,
    evmgr: &mut VmmEventManager,
    cfg: &NetConfig,
    opened: Option<net::tap::Tap>,
) -> Result<Attached<net::NetDevice>, VirtioError> {
    let ctx = AttachContext {
        vm,
        mem,
        mmio_bus,
        mgr,
        evmgr,
    };
    attach_new(ctx, net_name(cfg), |irq| match opened {
        Some(tap) => net::NetDevice::new(Box::new(tap), cfg.mac, irq),
        None => net::NetDevice::from_config(cfg, irq),
    })
}

/// Attach the virtio-rng device (entropy from the host's `getrandom`), like
/// [`attach_block`].
pub fn attach_rng(
    vm: &VmFd,
    mem: &GuestMemoryMmap,
    mmio_bus: &mut Bus,
    mgr: &mut MmioDeviceManager,
    evmgr: &mut VmmEventManager,
) -> Result<Attached<rng::RngDevice>, VirtioError> {
    let ctx = AttachContext {
        vm,
        mem,
        mmio_bus,
        mgr,
        evmgr,
    };
    attach_new(ctx, RNG_NAME.into(), rng::RngDevice::new)
}

/// Creates a device with `make` on the IRQ line of `ctx.mgr`'s next slot and attaches it there
/// ([`attach_device`]).
fn attach_new<D: VirtioSubscriberDevice + 'static>(
    mut ctx: AttachContext<'_>,
    name: String,
    make: impl FnOnce(IrqLine) -> Result<D, VirtioError>,
) -> Result<Attached<D>, VirtioError> {
    let slot = ctx.mgr.peek_next()?;
    let irq = IrqLine::new(slot.irq).map_err(VirtioError::EventFd)?;
    let dev = make(irq)?;
    attach_device(&mut ctx, Arc::new(Mutex::new(dev)), slot, name, None)
}

/// Device-manager name of the virtio-rng device.
pub(crate) const RNG_NAME: &str = "virtio-rng";

pub(crate) fn block_name(cfg: &BlockConfig) -> String {
    format!("virtio-blk({})", cfg.path.display())
}

pub(crate) fn net_name(cfg: &NetConfig) -> String {
    format!("virtio-net({})", cfg.tap)
}

/// Wires `dev` into the VM at `slot` (which must be `ctx.mgr`'s next one): irqfd, queue
/// ioeventfds, a transport on the MMIO bus — fresh, or in the snapshot's `restore` state — and
/// the event loop.
pub(crate) fn attach_device<D: VirtioSubscriberDevice + 'static>(
    ctx: &mut AttachContext<'_>,
    dev: Arc<Mutex<D>>,
    slot: MmioSlot,
    name: String,
    restore: Option<&mmio::MmioTransportState>,
) -> Result<Attached<D>, VirtioError> {
    {
        let d = dev.lock().expect("fresh device lock");
        let irq = d.interrupt().irq();
        ctx.vm
            .register_irqfd(irq.eventfd(), slot.irq)
            .map_err(|source| VirtioError::Irqfd {
                gsi: slot.irq,
                source,
            })?;
        let notify = slot.addr + mmio::REG_QUEUE_NOTIFY;
        for (i, evt) in d.queue_events().iter().enumerate() {
            ctx.vm
                .register_ioevent(evt, &IoEventAddress::Mmio(notify), i as u32)
                .map_err(|source| VirtioError::Ioeventfd {
                    addr: notify,
                    queue: i,
                    source,
                })?;
        }
        log::debug!(
            "{name}: irqfd {} -> GSI {}, {} queue ioeventfds at {notify:#x}",
            irq.eventfd().as_raw_fd(),
            slot.irq,
            d.queue_events().len()
        );
    }
    let vdev: Arc<Mutex<dyn VirtioDevice>> = dev.clone();
    let transport = match restore {
        None => mmio::MmioTransport::new(ctx.mem.clone(), vdev),
        Some(state) => {
            let args = mmio::TransportArgs {
                mem: ctx.mem.clone(),
                device: vdev,
            };
            mmio::MmioTransport::restore(args, state)
                .map_err(|e| VirtioError::Restore(format!("{name}: {e}")))?
        }
    };
    let transport = Arc::new(Mutex::new(transport));
    ctx.mmio_bus
        .insert_named(transport.clone(), slot.addr, slot.len, name.clone())?;
    let sub: Arc<Mutex<dyn MutEventSubscriber + Send>> = dev.clone();
    ctx.evmgr.add_subscriber(sub);
    // Cannot fail: `slot` came from `peek_next` and nothing was allocated since.
    ctx.mgr.commit(slot, name)?;
    Ok(Attached {
        slot,
        transport,
        device: dev,
    })
}

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
