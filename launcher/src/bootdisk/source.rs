//! Where a boot disk's bytes come from: the VMM's read-only disk backends (raw or qcow2), or a
//! byte slice (tests, fuzzing).

use vmm::devices::virtio::block::disk::{read_into, DiskBackend};

/// Random-access reads of a disk of [`Source::size`] bytes.
pub trait Source {
    fn size(&self) -> u64;
    /// Fills `buf` from `offset`; reading past the end is an error (one line).
    fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), String>;
}

fn check(offset: u64, len: usize, size: u64) -> Result<(), String> {
    match offset.checked_add(len as u64) {
        Some(end) if end <= size => Ok(()),
        _ => Err(format!(
            "read of {len} bytes at {offset} is past the end of the disk ({size} bytes)"
        )),
    }
}

impl Source for &[u8] {
    fn size(&self) -> u64 {
        self.len() as u64
    }
    fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        check(offset, buf.len(), self.size())?;
        let o = offset as usize;
        buf.copy_from_slice(&self[o..o + buf.len()]);
        Ok(())
    }
}

/// A VMM disk backend (see `vmm::devices::virtio::block::open`).
pub struct Backend(pub Box<dyn DiskBackend>);

impl Source for Backend {
    fn size(&self) -> u64 {
        self.0.capacity()
    }
    fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        check(offset, buf.len(), self.size())?;
        read_into(self.0.as_mut(), offset, buf).map_err(|e| e.to_string())
    }
}

impl Source for Vec<u8> {
    fn size(&self) -> u64 {
        self.len() as u64
    }
    fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        self.as_slice().read(offset, buf)
    }
}
