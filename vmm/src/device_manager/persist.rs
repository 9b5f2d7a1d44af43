//! What the device manager saves of the devices and how it restores them: per virtio device
//! its MMIO slot, the transport's state and the device's own (each device's `Persist`), and the
//! device re-attached at the same slot.

use std::fs::File;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::attach::{
    attach_device, block_name, net_name, AttachContext, AttachError, AttachedDevice, RNG_NAME,
};
use super::mmio::MmioSlot;
use crate::devices::interrupt::IrqLine;
use crate::devices::virtio::block::persist::{BlockArgs, BlockRestoreError, BlockState};
use crate::devices::virtio::block::{BlockConfig, BlockDevice, IoThreadOptions};
use crate::devices::virtio::mmio::MmioTransportState;
use crate::devices::virtio::net::persist::{NetArgs, NetRestoreError, NetState};
use crate::devices::virtio::net::{NetConfig, NetDevice};
use crate::devices::virtio::rng::persist::{RngRestoreError, RngState};
use crate::devices::virtio::rng::RngDevice;
use crate::devices::virtio::VirtioError;
use crate::persist::Persist;

/// One device's kind-specific state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum DeviceState {
    Block(BlockState),
    Net(NetState),
    Rng(RngState),
}

/// One virtio device in a snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VirtioDeviceState {
    pub slot: MmioSlot,
    pub transport: MmioTransportState,
    pub device: DeviceState,
}

impl AttachedDevice {
    /// The device's state. `overlay_file` names the snapshot's copy of a disk overlay.
    pub fn save(&self, overlay_file: Option<String>) -> VirtioDeviceState {
        match self {
            AttachedDevice::Block {
                slot,
                config,
                transport,
                device,
            } => VirtioDeviceState {
                slot: *slot,
                transport: transport.lock().expect("transport lock").save(),
                device: DeviceState::Block(BlockState {
                    config: config.clone(),
                    device: device.lock().expect("virtio-blk lock").save(),
                    overlay_file,
                }),
            },
            AttachedDevice::Net {
                slot,
                config,
                transport,
                device,
            } => VirtioDeviceState {
                slot: *slot,
                transport: transport.lock().expect("transport lock").save(),
                device: DeviceState::Net(NetState {
                    config: config.clone(),
                    saved: device.lock().expect("virtio-net lock").save(),
                }),
            },
            AttachedDevice::Rng {
                slot,
                transport,
                device,
            } => VirtioDeviceState {
                slot: *slot,
                transport: transport.lock().expect("transport lock").save(),
                device: DeviceState::Rng(device.lock().expect("virtio-rng lock").save()),
            },
        }
    }

    /// A disk with a copy-on-write overlay: writes the overlay to `out`.
    pub fn save_overlay(&self, out: &File) -> Result<u64, PersistError> {
        match self {
            AttachedDevice::Block { config, device, .. } => device
                .lock()
                .expect("virtio-blk lock")
                .save_overlay(out)
                .map_err(|source| PersistError::SaveOverlay {
                    path: config.path.display().to_string(),
                    source,
                }),
            AttachedDevice::Net { .. } | AttachedDevice::Rng { .. } => Err(PersistError::Virtio(
                VirtioError::Disk(crate::devices::virtio::block::DiskError::NotAnOverlay),
            )),
        }
    }
}

/// Re-creates device `index` of a snapshot in `state`, at the same slot, with its saved
/// configuration or the override (`block` for a disk, `net` for a NIC). `saved_overlay` is the
/// snapshot's copy of a disk's overlay; a disk's I/O thread starts as `block_io` says.
/// A NIC whose TAP is among `taps` (opened by the embedder) takes it.
#[allow(clippy::too_many_arguments)]
pub fn restore_device(
    ctx: &mut AttachContext<'_>,
    index: usize,
    state: &VirtioDeviceState,
    block: Option<&BlockConfig>,
    saved_overlay: Option<&File>,
    net: Option<&NetConfig>,
    block_io: IoThreadOptions,
    taps: &mut Vec<crate::devices::virtio::net::tap::Tap>,
) -> Result<AttachedDevice, PersistError> {
    let slot = ctx.mgr.peek_next().map_err(AttachError::Slot)?;
    if slot != state.slot {
        return Err(PersistError::Slot {
            index,
            saved: state.slot.addr,
            saved_irq: state.slot.irq,
            here: slot.addr,
            here_irq: slot.irq,
        });
    }
    let irq = IrqLine::new(slot.irq).map_err(VirtioError::EventFd)?;
    match &state.device {
        DeviceState::Block(b) => {
            let cfg = block.unwrap_or(&b.config);
            if b.config.overlay.is_some() {
                if cfg.overlay.is_none() {
                    return Err(PersistError::OverlayRequired(index));
                }
                if saved_overlay.is_none() {
                    return Err(PersistError::NoOverlayCopy(index));
                }
            }
            let args = BlockArgs {
                config: cfg,
                saved_overlay,
                irq,
                io: block_io,
            };
            let dev = BlockDevice::restore(args, &b.device)?;
            let a = attach_device(
                ctx,
                Arc::new(Mutex::new(dev)),
                slot,
                block_name(cfg),
                Some(&state.transport),
            )?;
            Ok(AttachedDevice::Block {
                slot,
                config: cfg.clone(),
                transport: a.transport,
                device: a.device,
            })
        }
        DeviceState::Net(n) => {
            let cfg = net.unwrap_or(&n.config);
            let opened = taps
                .iter()
                .position(|t| t.name() == cfg.tap)
                .map(|i| taps.swap_remove(i));
            let args = NetArgs {
                config: cfg,
                irq,
                opened,
            };
            let dev = NetDevice::restore(args, &n.saved)?;
            let a = attach_device(
                ctx,
                Arc::new(Mutex::new(dev)),
                slot,
                net_name(cfg),
                Some(&state.transport),
            )?;
            Ok(AttachedDevice::Net {
                slot,
                config: NetConfig {
                    tap: cfg.tap.clone(),
                    mac: n.saved.device.mac,
                },
                transport: a.transport,
                device: a.device,
            })
        }
        DeviceState::Rng(r) => {
            let dev = RngDevice::restore(irq, r)?;
            let a = attach_device(
                ctx,
                Arc::new(Mutex::new(dev)),
                slot,
                RNG_NAME.into(),
                Some(&state.transport),
            )?;
            Ok(AttachedDevice::Rng {
                slot,
                transport: a.transport,
                device: a.device,
            })
        }
    }
}

/// Why a device could not be saved or restored.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    #[error(transparent)]
    Virtio(#[from] VirtioError),
    #[error(transparent)]
    Attach(#[from] AttachError),
    #[error(transparent)]
    Block(#[from] BlockRestoreError),
    #[error(transparent)]
    Net(#[from] NetRestoreError),
    #[error(transparent)]
    Rng(#[from] RngRestoreError),
    #[error("device {index}: the snapshot has it at {saved:#x}/GSI {saved_irq}, this VM at {here:#x}/GSI {here_irq}")]
    Slot {
        index: usize,
        saved: u64,
        saved_irq: u32,
        here: u64,
        here_irq: u32,
    },
    #[error("disk {0}: the snapshot has no copy of its overlay")]
    NoOverlayCopy(usize),
    #[error(
        "disk {0} wrote to a copy-on-write overlay: the restored disk needs one too (overlay=PATH)"
    )]
    OverlayRequired(usize),
    #[error("saving the overlay of {path}: {source}")]
    SaveOverlay { path: String, source: VirtioError },
}
