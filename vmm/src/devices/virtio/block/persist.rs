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
use crate::devices::virtio::common::{self, CommonState};
use crate::devices::virtio::persist_error::PersistError;
use crate::devices::virtio::VirtioError;

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

    /// Opens the backend `cfg` names — for an overlay disk, the overlay becomes a copy of
    /// `saved_overlay` — and gives the device the saved `state`. The disk must have the saved
    /// capacity and read-only setting. The I/O thread starts as `io` says.
    pub fn restore(
        cfg: &BlockConfig,
        saved_overlay: Option<&File>,
        irq: IrqLine,
        state: &BlockDeviceState,
        io: IoThreadOptions,
    ) -> Result<Self, PersistError> {
        let disk: Box<dyn DiskBackend> = match (&cfg.overlay, saved_overlay) {
            (Some(o), Some(saved)) => {
                Box::new(Overlay::restore(&cfg.path, o, saved).map_err(VirtioError::Disk)?)
            }
            (Some(o), None) => Box::new(Overlay::open(&cfg.path, o).map_err(VirtioError::Disk)?),
            (None, _) => open_disk(&cfg.path, cfg.read_only).map_err(VirtioError::Disk)?,
        };
        let path = cfg.path.display().to_string();
        if disk.capacity() != state.capacity {
            return Err(PersistError::DiskCapacity {
                path,
                actual: disk.capacity(),
                expected: state.capacity,
            });
        }
        if disk.read_only() != state.read_only {
            return Err(PersistError::DiskReadOnly {
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
        common::restore_state(&mut dev, &format!("virtio-blk {path}"), saved)?;
        Ok(dev)
    }
}
