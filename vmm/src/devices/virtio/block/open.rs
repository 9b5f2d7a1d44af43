//! Opening a disk image by its format: the one place that knows every backend (raw and qcow2),
//! so that neither backend module imports the other's.

use std::fs::File;
use std::path::Path;

use super::disk::{open_image, DiskBackend, DiskError, RawFile};
use super::qcow2::{is_qcow2, Qcow2};

/// The read-only backend for the opened image `file`: qcow2 when it starts with the qcow2
/// magic number, else raw. (Overlay bases and `ro` disks.)
pub fn read_only_backend(file: File, path: &Path) -> Result<Box<dyn DiskBackend>, DiskError> {
    if is_qcow2(&file)? {
        Ok(Box::new(Qcow2::from_file(file, path)?))
    } else {
        Ok(Box::new(RawFile::from_file(file, true)?))
    }
}

/// Opens the disk at `path` without an overlay: a read-only disk is raw or qcow2 (by its magic
/// number), a writable disk is raw. A writable image that starts with the qcow2 magic is
/// refused: it is not written as raw (that would corrupt the qcow2 image), and the format of a
/// disk the guest can write is never probed (the guest could otherwise turn its raw disk into
/// a qcow2 image that the host then interprets).
pub fn open_disk(path: &Path, read_only: bool) -> Result<Box<dyn DiskBackend>, DiskError> {
    let file = open_image(path, read_only)?;
    if read_only {
        return read_only_backend(file, path);
    }
    if is_qcow2(&file)? {
        return Err(DiskError::Qcow2 {
            path: path.display().to_string(),
            reason: "a qcow2 image is only read: use it read-only (ro) or under a copy-on-write \
                     overlay (overlay=PATH), or convert it to raw (qemu-img convert -O raw IN OUT)"
                .into(),
        });
    }
    Ok(Box::new(RawFile::from_file(file, false)?))
}
