//! Wires virtio devices into the VM: each takes the next MMIO slot and GSI from the
//! [`MmioDeviceManager`], its irqfd and queue ioeventfds are registered with KVM, its transport
//! goes on the MMIO bus and the device into the event loop. [`AttachedDevice`] is a virtio
//! device as the VMM then holds it. The devices themselves (`devices/virtio/`) know nothing of
//! slots. [`Devices`] are all the devices a snapshot saves.

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};

use event_manager::{MutEventSubscriber, SubscriberOps};
use kvm_ioctls::{IoEventAddress, VmFd};

use super::mmio::{MmioDeviceManager, MmioError, MmioSlot};
use crate::devices::acpi::AcpiPmDevice;
use crate::devices::bus::Bus;
use crate::devices::interrupt::IrqLine;
use crate::devices::legacy::i8042::I8042Device;
use crate::devices::legacy::serial::SerialDevice;
use crate::devices::virtio::block::{BlockConfig, BlockDevice};
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::virtio::net::{NetConfig, NetDevice};
use crate::devices::virtio::rng::RngDevice;
use crate::devices::virtio::{
    block, mmio, net, rng, VirtioDevice, VirtioError, VirtioInterrupt, VirtioSubscriberDevice,
    VmmEventManager,
};
use crate::persist::Persist;
use crate::vstate::memory::GuestMemoryMmap;

/// Why a device could not be attached.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("MMIO slot allocation: {0}")]
    Slot(#[from] MmioError),
    #[error(transparent)]
    Virtio(#[from] VirtioError),
}

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
) -> Result<Attached<block::BlockDevice>, AttachError> {
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
) -> Result<Attached<net::NetDevice>, AttachError> {
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
) -> Result<Attached<rng::RngDevice>, AttachError> {
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
) -> Result<Attached<D>, AttachError> {
    let slot = ctx.mgr.peek_next()?;
    let irq = IrqLine::new(slot.irq).map_err(VirtioError::EventFd)?;
    let dev = make(irq)?;
    attach_device(&mut ctx, Arc::new(Mutex::new(dev)), slot, name, None)
}

/// Device-manager name of the virtio-rng device.
pub const RNG_NAME: &str = "virtio-rng";

pub fn block_name(cfg: &BlockConfig) -> String {
    format!("virtio-blk({})", cfg.path.display())
}

pub fn net_name(cfg: &NetConfig) -> String {
    format!("virtio-net({})", cfg.tap)
}

/// Wires `dev` into the VM at `slot` (which must be `ctx.mgr`'s next one): irqfd, queue
/// ioeventfds, a transport on the MMIO bus — fresh, or in the snapshot's `restore` state — and
/// the event loop.
pub fn attach_device<D: VirtioSubscriberDevice + 'static>(
    ctx: &mut AttachContext<'_>,
    dev: Arc<Mutex<D>>,
    slot: MmioSlot,
    name: String,
    restore: Option<&mmio::MmioTransportState>,
) -> Result<Attached<D>, AttachError> {
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
        .insert_named(transport.clone(), slot.addr, slot.len, name.clone())
        .map_err(VirtioError::Bus)?;
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

/// The devices of a VM whose state a snapshot saves (`persist.rs`), as the VMM holds them.
pub struct Devices {
    pub serial: Arc<Mutex<SerialDevice>>,
    pub i8042: Arc<Mutex<I8042Device>>,
    /// The ACPI registers, when the VM has ACPI.
    pub acpi_pm: Option<Arc<Mutex<AcpiPmDevice>>>,
    /// virtio devices in slot order.
    pub virtio: Vec<AttachedDevice>,
}

/// A virtio device as the VMM holds it.
pub enum AttachedDevice {
    Block {
        slot: MmioSlot,
        config: BlockConfig,
        transport: Arc<Mutex<MmioTransport>>,
        device: Arc<Mutex<BlockDevice>>,
    },
    Net {
        slot: MmioSlot,
        config: NetConfig,
        transport: Arc<Mutex<MmioTransport>>,
        device: Arc<Mutex<NetDevice>>,
    },
    Rng {
        slot: MmioSlot,
        transport: Arc<Mutex<MmioTransport>>,
        device: Arc<Mutex<RngDevice>>,
    },
}

impl AttachedDevice {
    /// Finishes the guest's outstanding work so the rings hold nothing half done: every
    /// request already queued is completed (a disk's requests in flight on its I/O thread are
    /// waited for), written data is flushed to the disk, queued frames are sent. virtio-rng
    /// completes requests as it takes them: chains the rate limit holds back stay available.
    /// Runs on the VMM thread with the vCPUs paused.
    pub fn quiesce(&self) -> Result<(), VirtioError> {
        match self {
            AttachedDevice::Block { device, .. } => {
                device.lock().expect("virtio-blk lock").quiesce()?;
            }
            AttachedDevice::Net { device, .. } => {
                let mut d = device.lock().expect("virtio-net lock");
                d.process_tx();
                d.process_rx();
            }
            AttachedDevice::Rng { .. } => {}
        }
        Ok(())
    }

    /// Resets the device and its transport (an in-place reboot): a disk's request in flight is
    /// waited for, queued work is dropped; the disk, overlay and TAP stay open.
    pub fn reset(&self) {
        self.transport()
            .lock()
            .expect("virtio-mmio lock")
            .reset_device();
    }

    /// The interrupt state shared by the device and its transport.
    pub fn interrupt(&self) -> Arc<VirtioInterrupt> {
        match self {
            AttachedDevice::Block { device, .. } => {
                device.lock().expect("virtio-blk lock").interrupt().clone()
            }
            AttachedDevice::Net { device, .. } => {
                device.lock().expect("virtio-net lock").interrupt().clone()
            }
            AttachedDevice::Rng { device, .. } => {
                device.lock().expect("virtio-rng lock").interrupt().clone()
            }
        }
    }

    /// The device's virtio-mmio transport on the bus.
    pub fn transport(&self) -> &Arc<Mutex<MmioTransport>> {
        match self {
            AttachedDevice::Block { transport, .. }
            | AttachedDevice::Net { transport, .. }
            | AttachedDevice::Rng { transport, .. } => transport,
        }
    }

    pub fn slot(&self) -> MmioSlot {
        match self {
            AttachedDevice::Block { slot, .. }
            | AttachedDevice::Net { slot, .. }
            | AttachedDevice::Rng { slot, .. } => *slot,
        }
    }

    /// Whether this is a disk with a copy-on-write overlay.
    pub fn has_overlay(&self) -> bool {
        matches!(self, AttachedDevice::Block { config, .. } if config.overlay.is_some())
    }
}
