//! TAP devices: `/dev/net/tun` with IFF_TAP | IFF_NO_PI | IFF_VNET_HDR,
//! a 12-byte virtio-net header (virtio 1.x layout), non-blocking I/O, and
//! offload probing/negotiation (TUNSETOFFLOAD).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

// From <linux/if_tun.h>: _IOW('T', n, int|unsigned int).
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const TUNSETVNETHDRSZ: libc::c_ulong = 0x4004_54d8;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;

/// TUNSETOFFLOAD bits.
pub const TUN_F_CSUM: u32 = 0x01;
pub const TUN_F_TSO4: u32 = 0x02;
pub const TUN_F_TSO6: u32 = 0x04;

/// virtio-net header size for VIRTIO_F_VERSION_1 (includes num_buffers).
pub const VNET_HDR_LEN: usize = 12;
/// Longest interface name (IFNAMSIZ - 1).
pub const MAX_IFNAME: usize = 15;

#[derive(Debug, thiserror::Error)]
pub enum TapError {
    #[error("invalid TAP name {0:?} (1..=15 bytes, no '/', whitespace or NUL)")]
    BadName(String),
    #[error("cannot open /dev/net/tun: {0}")]
    OpenTun(io::Error),
    #[error("TUNSETIFF {name}: {source}")]
    SetIff { name: String, source: io::Error },
    #[error("TUNSETVNETHDRSZ: {0}")]
    VnetHdrSize(io::Error),
    #[error("TUNSETOFFLOAD {flags:#x}: {source}")]
    SetOffload { flags: u32, source: io::Error },
}

/// Check a TAP interface name.
pub fn valid_ifname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_IFNAME
        && !name
            .bytes()
            .any(|b| b == b'/' || b == 0 || b.is_ascii_whitespace())
}

/// An open TAP queue.
#[derive(Debug)]
pub struct Tap {
    file: File,
    name: String,
    /// TUN_F_* bits the kernel accepted when probed.
    supported_offloads: u32,
}

impl Tap {
    /// Attach to (or create) the TAP interface `name`.
    pub fn open(name: &str) -> Result<Self, TapError> {
        if !valid_ifname(name) {
            return Err(TapError::BadName(name.into()));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")
            .map_err(TapError::OpenTun)?;
        // struct ifreq: char ifr_name[16]; union { short ifr_flags; ... } (24 bytes).
        let mut ifr = [0u8; 40];
        ifr[..name.len()].copy_from_slice(name.as_bytes());
        let flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
        ifr[16..18].copy_from_slice(&flags.to_ne_bytes());
        // SAFETY: TUNSETIFF reads and writes a `struct ifreq` (40 bytes on
        // x86_64) at the pointer; `ifr` is 40 bytes and lives across the call.
        let r = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF, ifr.as_mut_ptr()) };
        if r < 0 {
            return Err(TapError::SetIff {
                name: name.into(),
                source: io::Error::last_os_error(),
            });
        }
        let hdr: libc::c_int = VNET_HDR_LEN as libc::c_int;
        // SAFETY: TUNSETVNETHDRSZ reads one int at the pointer.
        let r = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETVNETHDRSZ, &hdr) };
        if r < 0 {
            return Err(TapError::VnetHdrSize(io::Error::last_os_error()));
        }
        let end = ifr[..16].iter().position(|&b| b == 0).unwrap_or(16);
        let real_name = String::from_utf8_lossy(&ifr[..end]).into_owned();
        let mut tap = Tap {
            file,
            name: real_name,
            supported_offloads: 0,
        };
        tap.supported_offloads = tap.probe_offloads();
        Ok(tap)
    }

    fn probe_offloads(&self) -> u32 {
        let candidates = [
            TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6,
            TUN_F_CSUM | TUN_F_TSO4,
            TUN_F_CSUM,
        ];
        let found = candidates
            .into_iter()
            .find(|&f| self.set_offload(f).is_ok())
            .unwrap_or(0);
        // Nothing enabled until the driver negotiates.
        if let Err(e) = self.set_offload(0) {
            crate::guest_log!(
                log::Level::Warn,
                "tap {}: cannot clear offloads: {e}",
                self.name
            );
        }
        found
    }

    /// Tell the kernel which offloads the guest accepts on receive.
    pub fn set_offload(&self, flags: u32) -> Result<(), TapError> {
        let f: libc::c_uint = flags;
        // SAFETY: TUNSETOFFLOAD takes the flags as the integer argument itself.
        let r = unsafe { libc::ioctl(self.file.as_raw_fd(), TUNSETOFFLOAD, f as libc::c_ulong) };
        if r < 0 {
            return Err(TapError::SetOffload {
                flags,
                source: io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// Interface name the kernel reports.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// TUN_F_* bits the TAP supports.
    pub fn supported_offloads(&self) -> u32 {
        self.supported_offloads
    }
}

impl AsRawFd for Tap {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

/// Where frames (with their virtio-net header) come from and go to.
pub trait FrameIo: Send {
    /// Read one frame; `WouldBlock` when none is waiting.
    fn read_frame(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    /// Send one frame.
    fn write_frame(&mut self, buf: &[u8]) -> io::Result<usize>;
}

impl FrameIo for Tap {
    fn read_frame(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.file.read(buf)
    }
    fn write_frame(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(valid_ifname("tap0"));
        assert!(valid_ifname("abcdefghijklmno"));
        assert!(!valid_ifname("abcdefghijklmnop"));
        assert!(!valid_ifname(""));
        assert!(!valid_ifname("a/b"));
        assert!(!valid_ifname("a b"));
        assert!(matches!(Tap::open("bad name"), Err(TapError::BadName(_))));
    }

    /// Needs root and /dev/net/tun (this machine has both).
    #[test]
    fn real_tap_opens_negotiates_offloads_and_is_nonblocking() {
        let name = format!("mvt{}", std::process::id() % 100_000);
        let mut tap = Tap::open(&name).expect("open a TAP (root + /dev/net/tun required)");
        assert_eq!(tap.name(), name);
        // Linux TAPs support checksum and TSO offloads.
        assert_eq!(tap.supported_offloads() & TUN_F_CSUM, TUN_F_CSUM);
        assert_eq!(tap.supported_offloads() & TUN_F_TSO4, TUN_F_TSO4);
        tap.set_offload(TUN_F_CSUM | TUN_F_TSO4).unwrap();
        tap.set_offload(0).unwrap();
        // TSO without CSUM is refused by the kernel.
        assert!(tap.set_offload(TUN_F_TSO4).is_err());
        // Nothing to read: non-blocking.
        let mut buf = [0u8; 2048];
        assert_eq!(
            tap.read_frame(&mut buf).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        // A frame with a zero vnet header: refused while the link is down,
        // accepted once it is up.
        let mut frame = vec![0u8; VNET_HDR_LEN + 60];
        frame[VNET_HDR_LEN..VNET_HDR_LEN + 6].copy_from_slice(&[0xff; 6]);
        frame[VNET_HDR_LEN + 12..VNET_HDR_LEN + 14].copy_from_slice(&[0x88, 0xb5]);
        assert_eq!(
            tap.write_frame(&frame).unwrap_err().raw_os_error(),
            Some(libc::EIO)
        );
        let st = std::process::Command::new("ip")
            .args(["link", "set", &name, "up"])
            .status()
            .unwrap();
        assert!(st.success());
        assert_eq!(tap.write_frame(&frame).unwrap(), frame.len());
    }
}
