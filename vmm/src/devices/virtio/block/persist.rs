//! Snapshot state of a virtio-blk device.
//!
//! Saved: the disk's configuration (image path, read-only, serial, overlay path), the offered
//! and acked features, the capacity and the broken (NEEDS_RESET) flag. Queue positions are the
//! transport's part. The disk's contents are not saved: they are the user's, except a
//! copy-on-write overlay, which the snapshot keeps as a file of its own
//! ([`BlockDevice::save_overlay`]) and restore copies to the new VM's overlay path.

use std::fs::File;

use serde::{Deserialize, Serialize};

use super::device::{BlockDevice, BlockDeviceState, IoThreadOptions};
use super::disk::DiskBackend;
use super::open::open_disk;
use super::overlay::Overlay;
use super::BlockConfig;
use crate::devices::interrupt::IrqLine;
use crate::devices::virtio::persist::{restore_state, CommonState, FeaturesError};
use crate::devices::virtio::VirtioError;
use crate::persist::Persist;

/// A virtio-blk device in a snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockState {
    pub config: BlockConfig,
    pub device: BlockDeviceState,
    /// The overlay's copy in the snapshot directory (file name), for overlay disks.
    pub overlay_file: Option<String>,
}

impl BlockDevice {
    /// Writes this disk's overlay (flushed) to `out`; returns the bytes copied. Call with
    /// nothing in flight (after [`BlockDevice::quiesce`]).
    pub fn save_overlay(&mut self, out: &File) -> Result<u64, VirtioError> {
        let mut disk = self.lock_disk();
        disk.flush()?;
        Ok(disk.save_overlay(out)?)
    }
}

/// What a restored disk gets from the new VM: the configuration to open (the snapshot's or its
/// replacement), the snapshot's copy of its overlay, its interrupt line and how its I/O thread
/// starts.
pub struct BlockArgs<'a> {
    pub config: &'a BlockConfig,
    pub saved_overlay: Option<&'a File>,
    pub irq: IrqLine,
    pub io: IoThreadOptions,
}

/// Why a disk could not be restored.
#[derive(Debug, thiserror::Error)]
pub enum BlockRestoreError {
    #[error(transparent)]
    Virtio(#[from] VirtioError),
    #[error("disk {path} has {actual} bytes, the snapshot's disk had {expected}")]
    Capacity {
        path: String,
        actual: u64,
        expected: u64,
    },
    #[error("disk {path}: the snapshot's disk was {}", if *expected { "read-only" } else { "writable" })]
    ReadOnly { path: String, expected: bool },
    #[error(transparent)]
    Features(#[from] FeaturesError),
}

impl Persist for BlockDevice {
    type State = BlockDeviceState;
    type Args<'a> = BlockArgs<'a>;
    type Error = BlockRestoreError;

    fn save(&self) -> BlockDeviceState {
        self.state()
    }

    /// Opens the backend `args.config` names — for an overlay disk, the overlay becomes a copy of
    /// `args.saved_overlay` — and gives the device the saved `state`. The disk must have the saved
    /// capacity and read-only setting. The I/O thread starts as `args.io` says.
    fn restore(args: BlockArgs<'_>, state: &BlockDeviceState) -> Result<Self, BlockRestoreError> {
        let BlockArgs {
            config: cfg,
            saved_overlay,
            irq,
            io,
        } = args;
        let disk: Box<dyn DiskBackend> = match (&cfg.overlay, saved_overlay) {
            (Some(o), Some(saved)) => {
                Box::new(Overlay::restore(&cfg.path, o, saved).map_err(VirtioError::Disk)?)
            }
            (Some(o), None) => Box::new(Overlay::open(&cfg.path, o).map_err(VirtioError::Disk)?),
            (None, _) => open_disk(&cfg.path, cfg.read_only).map_err(VirtioError::Disk)?,
        };
        let path = cfg.path.display().to_string();
        if disk.capacity() != state.capacity {
            return Err(BlockRestoreError::Capacity {
                path,
                actual: disk.capacity(),
                expected: state.capacity,
            });
        }
        if disk.read_only() != state.read_only {
            return Err(BlockRestoreError::ReadOnly {
                path,
                expected: state.read_only,
            });
        }
        let mut dev = BlockDevice::with_io_thread(disk, cfg.id_bytes(), irq, io)?;
        let saved = CommonState {
            avail_features: state.avail_features,
            acked_features: state.acked_features,
            needs_reset: state.needs_reset,
        };
        restore_state(&mut dev, &format!("virtio-blk {path}"), saved)?;
        Ok(dev)
    }
}
