//! Why a virtio device could not be saved or restored: one error for the aggregate
//! (`persist.rs`) and each device's `persist.rs`, kept in a leaf so the device files do not
//! import the aggregate that imports them.

use super::VirtioError;

/// Why a device could not be saved or restored.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    #[error(transparent)]
    Virtio(#[from] VirtioError),
    #[error("disk {path} has {actual} bytes, the snapshot's disk had {expected}")]
    DiskCapacity {
        path: String,
        actual: u64,
        expected: u64,
    },
    #[error("disk {path}: the snapshot's disk was {}", if *expected { "read-only" } else { "writable" })]
    DiskReadOnly { path: String, expected: bool },
    #[error("{what} does not offer features {acked:#x} the guest acked (offers {offered:#x})")]
    Features {
        what: String,
        acked: u64,
        offered: u64,
    },
    #[error("MAC {asked} asked for, but the guest's NIC has MAC {saved}")]
    Mac { asked: String, saved: String },
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
