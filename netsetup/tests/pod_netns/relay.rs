//! The relay that connects the VM namespace through the real TAP
//! (`Fixture::attach_vm_via_tap`): a thread moves frames between the TAP and a packet socket.

use std::thread::JoinHandle;

use anyhow::{bail, ensure, Result};

use crate::tap::VNET_HDR;

/// Opens the TAP as the VMM does (IFF_TAP | IFF_NO_PI | IFF_VNET_HDR).
pub(crate) fn attach_tap(name: &str) -> Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")?;
    let mut ifr = [0u8; 40];
    ifr[..name.len()].copy_from_slice(name.as_bytes());
    ifr[16..18].copy_from_slice(&netsetup::tap::TAP_FLAGS.to_ne_bytes());
    // SAFETY: TUNSETIFF reads/writes a 40-byte ifreq at the pointer, which lives across the call.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), 0x4004_54ca, ifr.as_mut_ptr()) };
    if r < 0 {
        bail!("TUNSETIFF {name}: {}", std::io::Error::last_os_error());
    }
    Ok(f)
}

/// An AF_PACKET socket with virtio-net headers, bound to link `index`.
pub(crate) fn packet_socket(index: u32) -> Result<std::os::fd::OwnedFd> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let proto = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain socket(2); the fd is owned right after.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            i32::from(proto),
        )
    };
    ensure!(
        fd >= 0,
        "packet socket: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: fresh fd owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let one: libc::c_int = 1;
    use std::os::fd::AsRawFd;
    // SAFETY: setsockopt reads one c_int that lives across the call.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_VNET_HDR,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    ensure!(
        r == 0,
        "PACKET_VNET_HDR: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: sockaddr_ll is plain data; zeroed is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto;
    sll.sll_ifindex = index as i32;
    // SAFETY: bind reads a sockaddr_ll of the given size that lives across the call.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    ensure!(
        r == 0,
        "bind packet socket: {}",
        std::io::Error::last_os_error()
    );
    Ok(fd)
}

/// Moves frames (with their virtio-net headers) between a TAP and a packet socket until dropped.
pub(crate) struct Relay {
    pub(crate) stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub(crate) thread: Option<JoinHandle<()>>,
}

impl Relay {
    pub(crate) fn start(tap: std::fs::File, pkt: std::os::fd::OwnedFd) -> Relay {
        use std::os::fd::AsRawFd;
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut buf = vec![0u8; 65536 + VNET_HDR];
            let (t, p) = (tap.as_raw_fd(), pkt.as_raw_fd());
            while !stop2.load(Ordering::SeqCst) {
                let mut fds = [
                    libc::pollfd {
                        fd: t,
                        events: libc::POLLIN,
                        revents: 0,
                    },
                    libc::pollfd {
                        fd: p,
                        events: libc::POLLIN,
                        revents: 0,
                    },
                ];
                // SAFETY: two valid pollfds that live across the call.
                if unsafe { libc::poll(fds.as_mut_ptr(), 2, 100) } <= 0 {
                    continue;
                }
                if fds[0].revents & libc::POLLIN != 0 {
                    // SAFETY: read into our buffer of buf.len() bytes.
                    let n = unsafe { libc::read(t, buf.as_mut_ptr().cast(), buf.len()) };
                    if n > 0 {
                        // SAFETY: write n bytes of our buffer.
                        unsafe { libc::write(p, buf.as_ptr().cast(), n as usize) };
                    }
                }
                if fds[1].revents & libc::POLLIN != 0 {
                    // SAFETY: sockaddr_ll is plain data; zeroed is valid.
                    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
                    let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
                    // SAFETY: recvfrom into our buffer and address struct, sizes given.
                    let n = unsafe {
                        libc::recvfrom(
                            p,
                            buf.as_mut_ptr().cast(),
                            buf.len(),
                            0,
                            (&mut sll as *mut libc::sockaddr_ll).cast(),
                            &mut len,
                        )
                    };
                    // Frames relay0 itself sent (from the TAP) come back as PACKET_OUTGOING.
                    if n > 0 && sll.sll_pkttype != libc::PACKET_OUTGOING {
                        // SAFETY: write n bytes of our buffer.
                        unsafe { libc::write(t, buf.as_ptr().cast(), n as usize) };
                    }
                }
            }
            drop(tap);
            drop(pkt);
        });
        Relay {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
