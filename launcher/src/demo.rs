//! The built-in demo guest: microvirt's test guest (PVH ELF), embedded at build time. A VMI
//! without `firmware.kernelBoot` boots it; its kernel command line (`kernelArgs`) selects a
//! scenario, e.g. `testguest.scenario=echo` (see guest-images/testguest).

use std::fs::File;
use std::io::Write;
use std::os::unix::io::{AsRawFd, FromRawFd};
use std::path::PathBuf;

/// The guest image bytes.
pub static DEMO_GUEST: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/demo-guest.elf"));

/// The demo guest in an anonymous memory file; the VMM loads it from [`DemoKernel::path`].
pub struct DemoKernel {
    file: File,
}

impl DemoKernel {
    pub fn new() -> std::io::Result<Self> {
        let name = c"microvirt-demo-guest";
        // SAFETY: memfd_create with a valid NUL-terminated name; we check the result.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor that only this File owns.
        let mut file = unsafe { File::from_raw_fd(fd) };
        file.write_all(DEMO_GUEST)?;
        Ok(Self { file })
    }

    /// A path the VMM can open while `self` lives.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn embedded_guest_is_an_elf_and_readable_by_path() {
        assert_eq!(&super::DEMO_GUEST[..4], b"\x7fELF");
        let k = super::DemoKernel::new().unwrap();
        assert_eq!(std::fs::read(k.path()).unwrap(), super::DEMO_GUEST);
    }
}
