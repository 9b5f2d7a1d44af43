//! Shared by the virtio integration tests: an AF_PACKET responder inside a scratch network
//! namespace that answers `microvirt ping N` frames (ethertype 0x88b5) with `microvirt pong N`.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

pub use microvirt_testsupport::ScratchNetns;

pub const ETH_P: u16 = 0x88b5;

/// In a thread inside the namespace: answer every `microvirt ping N` frame
/// on `ifname` with `microvirt pong N` back to the sender.
pub fn responder(
    ns: &ScratchNetns,
    ifname: &str,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<u32> {
    let ifname = ifname.to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    let h = ns.spawn(move || {
        // SAFETY: plain socket syscall.
        let s = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(ETH_P.to_be())) };
        assert!(s >= 0);
        let cname = std::ffi::CString::new(ifname).unwrap();
        // SAFETY: NUL-terminated name.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) } as i32;
        assert!(ifindex > 0);
        // SAFETY: zeroed sockaddr_ll is valid; we fill the fields we need.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = ETH_P.to_be();
        sll.sll_ifindex = ifindex;
        // SAFETY: sll is a valid sockaddr_ll of the given size.
        let r = unsafe {
            libc::bind(
                s,
                &sll as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert_eq!(r, 0);
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 50_000,
        };
        // SAFETY: valid timeval pointer and size.
        unsafe {
            libc::setsockopt(
                s,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const _ as *const libc::c_void,
                16,
            );
        }
        tx.send(()).unwrap();
        let mut answered = 0;
        let mut buf = [0u8; 2048];
        while !stop.load(Ordering::SeqCst) {
            // SAFETY: buf is valid for its length.
            let n = unsafe { libc::recv(s, buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 14 {
                continue;
            }
            let f = &buf[..n as usize];
            let Some(num) = f[14..].strip_prefix(b"microvirt ping ") else {
                continue;
            };
            let num: Vec<u8> = num
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .copied()
                .collect();
            let mut reply = Vec::new();
            reply.extend_from_slice(&f[6..12]); // to the sender
            reply.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x99]);
            reply.extend_from_slice(&ETH_P.to_be_bytes());
            reply.extend_from_slice(b"microvirt pong ");
            reply.extend_from_slice(&num);
            reply.resize(60, 0);
            // SAFETY: reply is valid for its length; socket bound to the interface.
            let w = unsafe {
                libc::sendto(
                    s,
                    reply.as_ptr().cast(),
                    reply.len(),
                    0,
                    &sll as *const _ as *const libc::sockaddr,
                    std::mem::size_of::<libc::sockaddr_ll>() as u32,
                )
            };
            assert_eq!(w as usize, reply.len());
            answered += 1;
        }
        // SAFETY: closing our socket.
        unsafe { libc::close(s) };
        answered
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("responder ready");
    h
}
