//! Persistent TAP devices (`/dev/net/tun`, `IFF_TAP | IFF_NO_PI | IFF_VNET_HDR`, one queue).
//! The device outlives the file descriptor that made it (`TUNSETPERSIST`), so the VMM can open
//! it by name later with the same flags; deleting the link (rtnetlink) removes it.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::AsRawFd;

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETPERSIST: libc::c_ulong = 0x4004_54cb;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;

/// Errors of TAP creation.
#[derive(Debug, thiserror::Error)]
pub enum TapError {
    #[error("TAP name {0:?} is empty or longer than 15 bytes")]
    Name(String),
    #[error("open /dev/net/tun: {0}")]
    Open(#[source] io::Error),
    #[error("TUNSETIFF {name}: {source}")]
    SetIff {
        name: String,
        #[source]
        source: io::Error,
    },
    #[error("TUNSETPERSIST {name}: {source}")]
    Persist {
        name: String,
        #[source]
        source: io::Error,
    },
}

/// The flags the TAP is created with; the VMM must open it with the same ones.
pub const TAP_FLAGS: libc::c_short = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;

/// Creates the persistent TAP `name` in the calling thread's network namespace.
pub fn create_persistent_tap(name: &str) -> Result<(), TapError> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
        return Err(TapError::Name(name.to_string()));
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .map_err(TapError::Open)?;
    // struct ifreq: 16-byte name, then the flags (short) in the union; 40 bytes on x86_64.
    let mut ifr = [0u8; 40];
    ifr[..name.len()].copy_from_slice(name.as_bytes());
    ifr[16..18].copy_from_slice(&TAP_FLAGS.to_ne_bytes());
    // SAFETY: TUNSETIFF reads and writes a 40-byte `struct ifreq` at the pointer; `ifr` is 40
    // bytes and lives across the call.
    let r = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF, ifr.as_mut_ptr()) };
    if r < 0 {
        return Err(TapError::SetIff {
            name: name.to_string(),
            source: io::Error::last_os_error(),
        });
    }
    // SAFETY: TUNSETPERSIST takes an integer argument by value; the fd is a TUN fd bound above.
    let r = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETPERSIST, 1 as libc::c_ulong) };
    if r < 0 {
        return Err(TapError::Persist {
            name: name.to_string(),
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}
