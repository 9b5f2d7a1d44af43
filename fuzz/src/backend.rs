//! A fake TAP for virtio-net: one end of a non-blocking `SOCK_SEQPACKET` socket pair, which keeps
//! frame boundaries like a TAP does, with the harness holding the other end (frames it sends
//! arrive at the device as received frames; frames the device sends arrive at the harness).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use vmm::devices::virtio::net::device::NetBackend;
use vmm::devices::virtio::net::tap::FrameIo;

/// The device's end.
pub struct PairBackend {
    fd: OwnedFd,
    offloads: u32,
}

/// The harness's end.
pub struct HostEnd {
    fd: OwnedFd,
    buf: std::cell::RefCell<Vec<u8>>,
}

/// A connected pair; the device end claims to support the TUN_F_* `offloads`.
pub fn pair(offloads: u32) -> (PairBackend, HostEnd) {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors socketpair writes.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    assert_eq!(r, 0, "socketpair: {}", io::Error::last_os_error());
    // SAFETY: both descriptors were just created by socketpair and are owned by nobody else.
    let (a, b) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    (
        PairBackend { fd: a, offloads },
        HostEnd {
            fd: b,
            buf: std::cell::RefCell::new(vec![0u8; 70_000]),
        },
    )
}

fn send(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for `buf.len()` bytes for the duration of the call.
    let r = unsafe {
        libc::send(
            fd,
            buf.as_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

fn recv(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the duration of the call.
    let r = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

impl FrameIo for PairBackend {
    fn read_frame(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        recv(self.fd.as_raw_fd(), buf)
    }
    fn write_frame(&mut self, buf: &[u8]) -> io::Result<usize> {
        send(self.fd.as_raw_fd(), buf)
    }
}

impl NetBackend for PairBackend {
    fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
    fn supported_offloads(&self) -> u32 {
        self.offloads
    }
    fn set_offloads(&mut self, tun: u32) -> Result<(), String> {
        if tun & !self.offloads != 0 {
            return Err(format!("offloads {tun:#x} not supported"));
        }
        Ok(())
    }
}

impl HostEnd {
    /// Send one frame to the device; `false` when the socket is full.
    pub fn send(&self, frame: &[u8]) -> bool {
        match send(self.fd.as_raw_fd(), frame) {
            Ok(n) => {
                assert_eq!(n, frame.len(), "a seqpacket send is all or nothing");
                true
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => false,
            Err(e) => panic!("sending a frame to the device: {e}"),
        }
    }

    /// Receive one frame the device sent, if any.
    pub fn recv(&self) -> Option<Vec<u8>> {
        let mut buf = self.buf.borrow_mut();
        match recv(self.fd.as_raw_fd(), &mut buf) {
            Ok(n) => Some(buf[..n].to_vec()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
            Err(e) => panic!("receiving a frame from the device: {e}"),
        }
    }
}
