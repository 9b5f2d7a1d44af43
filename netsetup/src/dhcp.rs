//! A minimal DHCPv4 server for exactly one client (the guest): DISCOVER → OFFER,
//! REQUEST → ACK/NAK, INFORM → ACK, over UDP port 67 on one interface (the bridge).
//!
//! Packet handling ([`DhcpServer::handle`]) is pure and unit-tested; [`bind`] opens the port
//! (the privileged part) and [`BoundDhcp::serve`] runs the server on a thread with a bounded
//! receive timeout so it can be stopped; [`spawn`] does both.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::rtnl::prefix_mask;

const BOOTREQUEST: u8 = 1;
const BOOTREPLY: u8 = 2;
const MAGIC: [u8; 4] = [99, 130, 83, 99];
/// Fixed BOOTP header length (up to and including the magic cookie).
const HEADER_LEN: usize = 240;

const DISCOVER: u8 = 1;
const OFFER: u8 = 2;
const REQUEST: u8 = 3;
const ACK: u8 = 5;
const NAK: u8 = 6;
const INFORM: u8 = 8;

const OPT_PAD: u8 = 0;
const OPT_SUBNET: u8 = 1;
const OPT_ROUTER: u8 = 3;
const OPT_DNS: u8 = 6;
const OPT_HOSTNAME: u8 = 12;
const OPT_DOMAIN: u8 = 15;
const OPT_MTU: u8 = 26;
const OPT_BROADCAST: u8 = 28;
const OPT_REQUESTED_IP: u8 = 50;
const OPT_LEASE_TIME: u8 = 51;
const OPT_MSG_TYPE: u8 = 53;
const OPT_SERVER_ID: u8 = 54;
const OPT_DOMAIN_SEARCH: u8 = 119;
const OPT_CLASSLESS_ROUTES: u8 = 121;
const OPT_END: u8 = 255;

/// What the guest is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The guest's address.
    pub ip: Ipv4Addr,
    /// Prefix length of the guest's subnet.
    pub prefix_len: u8,
    /// Default gateway.
    pub router: Option<Ipv4Addr>,
    /// DNS servers.
    pub dns: Vec<Ipv4Addr>,
    /// DNS search domains (the first one is also sent as the domain name).
    pub search: Vec<String>,
    /// Guest host name.
    pub hostname: Option<String>,
    /// Interface MTU.
    pub mtu: Option<u16>,
    /// Lease time in seconds.
    pub lease_secs: u32,
    /// Classless static routes (RFC 3442) `(destination, prefix length, gateway)`; sent when
    /// the router is not inside the guest's subnet (then the router option alone is not
    /// usable by the guest).
    pub routes: Vec<(Ipv4Addr, u8, Ipv4Addr)>,
}

/// The server's state: the one client it serves and the address it answers from.
#[derive(Debug, Clone)]
pub struct DhcpServer {
    /// Server identifier (the bridge's address).
    pub server_ip: Ipv4Addr,
    /// The only client hardware address served.
    pub client_mac: [u8; 6],
    /// The lease handed out.
    pub lease: Lease,
}

/// A request as far as the server cares.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Request<'a> {
    xid: [u8; 4],
    flags: [u8; 2],
    ciaddr: Ipv4Addr,
    giaddr: [u8; 4],
    chaddr: [u8; 16],
    msg_type: u8,
    requested_ip: Option<Ipv4Addr>,
    server_id: Option<Ipv4Addr>,
    _raw: &'a [u8],
}

fn ipv4(b: &[u8]) -> Option<Ipv4Addr> {
    let a: [u8; 4] = b.try_into().ok()?;
    Some(Ipv4Addr::from(a))
}

fn parse(pkt: &[u8]) -> Option<Request<'_>> {
    if pkt.len() < HEADER_LEN || pkt[0] != BOOTREQUEST || pkt[1] != 1 || pkt[2] != 6 {
        return None;
    }
    if pkt[236..240] != MAGIC {
        return None;
    }
    let mut req = Request {
        xid: pkt[4..8].try_into().ok()?,
        flags: pkt[10..12].try_into().ok()?,
        ciaddr: ipv4(&pkt[12..16])?,
        giaddr: pkt[24..28].try_into().ok()?,
        chaddr: pkt[28..44].try_into().ok()?,
        msg_type: 0,
        requested_ip: None,
        server_id: None,
        _raw: pkt,
    };
    let mut i = HEADER_LEN;
    while i < pkt.len() {
        let code = pkt[i];
        if code == OPT_END {
            break;
        }
        if code == OPT_PAD {
            i += 1;
            continue;
        }
        let len = usize::from(*pkt.get(i + 1)?);
        let val = pkt.get(i + 2..i + 2 + len)?;
        match code {
            OPT_MSG_TYPE if len == 1 => req.msg_type = val[0],
            OPT_REQUESTED_IP => req.requested_ip = ipv4(val),
            OPT_SERVER_ID => req.server_id = ipv4(val),
            _ => {}
        }
        i += 2 + len;
    }
    (req.msg_type != 0).then_some(req)
}

/// Encodes a domain list as RFC 1035 names without compression (RFC 3397).
fn encode_search(domains: &[String]) -> Vec<u8> {
    let mut out = Vec::new();
    for d in domains {
        for label in d.split('.').filter(|l| !l.is_empty()) {
            let l = &label.as_bytes()[..label.len().min(63)];
            out.push(l.len() as u8);
            out.extend_from_slice(l);
        }
        out.push(0);
    }
    out
}

/// Appends an option, splitting values over 255 bytes into several instances (RFC 3396).
fn push_opt(out: &mut Vec<u8>, code: u8, val: &[u8]) {
    if val.is_empty() {
        return;
    }
    for chunk in val.chunks(255) {
        out.push(code);
        out.push(chunk.len() as u8);
        out.extend_from_slice(chunk);
    }
}

impl DhcpServer {
    /// Answers one datagram; `None` when it is not for us or needs no answer.
    pub fn handle(&self, pkt: &[u8]) -> Option<Vec<u8>> {
        let req = parse(pkt)?;
        if req.chaddr[..6] != self.client_mac {
            return None;
        }
        let reply_type = match req.msg_type {
            DISCOVER => OFFER,
            REQUEST => {
                if req.server_id.is_some_and(|s| s != self.server_ip) {
                    return None; // the client chose another server
                }
                let wanted = req.requested_ip.unwrap_or(req.ciaddr);
                if wanted == self.lease.ip {
                    ACK
                } else {
                    NAK
                }
            }
            INFORM => ACK,
            _ => return None, // RELEASE, DECLINE: nothing to answer
        };
        Some(self.reply(&req, reply_type))
    }

    /// Where a reply goes (RFC 2131 4.1): unicast to `ciaddr` when the client already has
    /// its address (renewal, INFORM — a client may then listen on a socket bound to that
    /// address only), else broadcast (the client has no address yet; NAKs always broadcast).
    pub fn reply_destination(request: &[u8], reply: &[u8]) -> SocketAddrV4 {
        let broadcast = SocketAddrV4::new(Ipv4Addr::BROADCAST, 68);
        let is_nak = reply.get(HEADER_LEN..HEADER_LEN + 3) == Some(&[OPT_MSG_TYPE, 1, NAK][..]);
        match parse(request) {
            Some(req) if !req.ciaddr.is_unspecified() && !is_nak => {
                SocketAddrV4::new(req.ciaddr, 68)
            }
            _ => broadcast,
        }
    }

    fn reply(&self, req: &Request<'_>, msg_type: u8) -> Vec<u8> {
        let l = &self.lease;
        let mut out = vec![0u8; HEADER_LEN];
        out[0] = BOOTREPLY;
        out[1] = 1;
        out[2] = 6;
        out[4..8].copy_from_slice(&req.xid);
        out[10..12].copy_from_slice(&req.flags);
        if msg_type == ACK && req.msg_type == INFORM {
            out[12..16].copy_from_slice(&req.ciaddr.octets());
        } else if msg_type != NAK {
            out[16..20].copy_from_slice(&l.ip.octets());
        }
        out[20..24].copy_from_slice(&self.server_ip.octets());
        out[24..28].copy_from_slice(&req.giaddr);
        out[28..44].copy_from_slice(&req.chaddr);
        out[236..240].copy_from_slice(&MAGIC);

        push_opt(&mut out, OPT_MSG_TYPE, &[msg_type]);
        push_opt(&mut out, OPT_SERVER_ID, &self.server_ip.octets());
        if msg_type != NAK {
            if req.msg_type != INFORM {
                push_opt(&mut out, OPT_LEASE_TIME, &l.lease_secs.to_be_bytes());
            }
            let mask = prefix_mask(l.prefix_len);
            push_opt(&mut out, OPT_SUBNET, &mask.to_be_bytes());
            push_opt(
                &mut out,
                OPT_BROADCAST,
                &(u32::from(l.ip) | !mask).to_be_bytes(),
            );
            if let Some(r) = l.router {
                push_opt(&mut out, OPT_ROUTER, &r.octets());
            }
            if !l.routes.is_empty() {
                let mut v = Vec::new();
                for (dst, plen, gw) in &l.routes {
                    let plen = (*plen).min(32);
                    v.push(plen);
                    let sig = usize::from(plen).div_ceil(8);
                    v.extend_from_slice(&dst.octets()[..sig]);
                    v.extend_from_slice(&gw.octets());
                }
                push_opt(&mut out, OPT_CLASSLESS_ROUTES, &v);
            }
            let dns: Vec<u8> = l.dns.iter().flat_map(|d| d.octets()).collect();
            push_opt(&mut out, OPT_DNS, &dns);
            if let Some(h) = &l.hostname {
                push_opt(&mut out, OPT_HOSTNAME, h.as_bytes());
            }
            if let Some(d) = l.search.first() {
                push_opt(&mut out, OPT_DOMAIN, d.as_bytes());
            }
            push_opt(&mut out, OPT_DOMAIN_SEARCH, &encode_search(&l.search));
            if let Some(mtu) = l.mtu {
                push_opt(&mut out, OPT_MTU, &mtu.to_be_bytes());
            }
        }
        out.push(OPT_END);
        // BOOTP minimum message size.
        if out.len() < 300 {
            out.resize(300, 0);
        }
        out
    }
}

/// Errors of the DHCP server socket.
#[derive(Debug, thiserror::Error)]
pub enum DhcpError {
    #[error("DHCP socket on {iface}: {source}")]
    Socket {
        iface: String,
        #[source]
        source: io::Error,
    },
    #[error("DHCP server thread on {iface}: {detail}")]
    ThreadSetup { iface: String, detail: String },
}

/// A running server thread; stopped (and joined) on drop.
pub struct DhcpHandle {
    stop: Arc<AtomicBool>,
    /// A second handle on the server socket, to wake the thread's receive on stop.
    wake: Option<UdpSocket>,
    thread: Option<JoinHandle<()>>,
}

impl DhcpHandle {
    /// Stops the server and waits for its thread (at most one receive timeout).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(w) = self.wake.take() {
            // SAFETY: shutdown(2) on a socket we own; it makes the server thread's blocked
            // receive return at once (the 200 ms timeout remains the fallback).
            unsafe { libc::shutdown(w.as_raw_fd(), libc::SHUT_RDWR) };
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for DhcpHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

fn set_opt(sock: &UdpSocket, level: i32, name: i32, val: &[u8]) -> io::Result<()> {
    // SAFETY: setsockopt reads `val.len()` bytes from `val`, which is live for the call.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            val.as_ptr().cast(),
            val.len() as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A server socket bound to UDP port 67 on one interface, not served yet (see [`bind`]).
pub struct BoundDhcp {
    iface: String,
    sock: UdpSocket,
    server: DhcpServer,
}

/// Binds UDP port 67 on `iface` (in the calling thread's network namespace; needs
/// CAP_NET_BIND_SERVICE) for `server`. Nothing is served until [`BoundDhcp::serve`], so the
/// privileged bind and the thread that parses guest packets can be separated.
pub fn bind(iface: &str, server: DhcpServer) -> Result<BoundDhcp, DhcpError> {
    let err = |source| DhcpError::Socket {
        iface: iface.to_string(),
        source,
    };
    // SAFETY: plain socket(2) call; the fd is owned by the UdpSocket right after.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(err(io::Error::last_os_error()));
    }
    // SAFETY: `fd` is a fresh, valid socket that nothing else owns.
    let sock = unsafe { <UdpSocket as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let one = 1i32.to_ne_bytes();
    set_opt(&sock, libc::SOL_SOCKET, libc::SO_REUSEADDR, &one).map_err(err)?;
    set_opt(&sock, libc::SOL_SOCKET, libc::SO_BROADCAST, &one).map_err(err)?;
    set_opt(
        &sock,
        libc::SOL_SOCKET,
        libc::SO_BINDTODEVICE,
        iface.as_bytes(),
    )
    .map_err(err)?;
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 67u16.to_be(),
        sin_addr: libc::in_addr { s_addr: 0 },
        sin_zero: [0; 8],
    };
    // SAFETY: `addr` is a valid sockaddr_in of the given size, live for the call.
    let r = unsafe {
        libc::bind(
            sock.as_raw_fd(),
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(err(io::Error::last_os_error()));
    }
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .map_err(err)?;
    Ok(BoundDhcp {
        iface: iface.to_string(),
        sock,
        server,
    })
}

impl BoundDhcp {
    /// Serves on a new thread until the handle is stopped or dropped. `init` runs first on
    /// that thread (the launcher restricts the thread there); when it fails the thread ends
    /// and so does this call, with that error.
    pub fn serve(
        self,
        init: impl FnOnce() -> Result<(), String> + Send + 'static,
    ) -> Result<DhcpHandle, DhcpError> {
        let BoundDhcp {
            iface,
            sock,
            server,
        } = self;
        let err = |source| DhcpError::Socket {
            iface: iface.clone(),
            source,
        };
        let wake = sock.try_clone().map_err(err)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("dhcp-server".into())
            .spawn(move || {
                let setup = init();
                let ok = setup.is_ok();
                let _ = ready_tx.send(setup);
                if ok {
                    serve(sock, server, stop2)
                }
            })
            .map_err(err)?;
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(DhcpError::ThreadSetup { iface, detail: e });
            }
            Err(_) => {
                let _ = thread.join();
                return Err(DhcpError::ThreadSetup {
                    iface,
                    detail: "the server thread ended during setup".into(),
                });
            }
        }
        Ok(DhcpHandle {
            stop,
            wake: Some(wake),
            thread: Some(thread),
        })
    }
}

/// Binds UDP port 67 on `iface` (in the calling thread's network namespace) and serves
/// `server` on a new thread until the handle is stopped or dropped.
pub fn spawn(iface: &str, server: DhcpServer) -> Result<DhcpHandle, DhcpError> {
    bind(iface, server)?.serve(|| Ok(()))
}

fn serve(sock: UdpSocket, server: DhcpServer, stop: Arc<AtomicBool>) {
    let mut buf = [0u8; 1500];
    while !stop.load(Ordering::SeqCst) {
        let n = match sock.recv_from(&mut buf) {
            Ok((n, _)) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) if stop.load(Ordering::SeqCst) => break,
            Err(e) => {
                log::warn!("dhcp: receive failed: {e}");
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
        };
        if let Some(reply) = server.handle(&buf[..n]) {
            log::debug!(
                "dhcp: reply type {} to {:02x?}",
                reply[242],
                server.client_mac
            );
            let dest = DhcpServer::reply_destination(&buf[..n], &reply);
            if let Err(e) = sock.send_to(&reply, dest) {
                log::warn!("dhcp: send failed: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x42];

    fn server() -> DhcpServer {
        DhcpServer {
            server_ip: Ipv4Addr::new(10, 0, 2, 1),
            client_mac: MAC,
            lease: Lease {
                ip: Ipv4Addr::new(10, 0, 2, 2),
                prefix_len: 24,
                router: Some(Ipv4Addr::new(10, 0, 2, 1)),
                dns: vec![Ipv4Addr::new(10, 96, 0, 10)],
                search: vec!["ns.svc.cluster.local".into(), "cluster.local".into()],
                hostname: Some("vm1".into()),
                mtu: Some(1450),
                lease_secs: 86400,
                routes: vec![],
            },
        }
    }

    fn request(msg_type: u8, mac: [u8; 6], opts: &[(u8, &[u8])]) -> Vec<u8> {
        let mut p = vec![0u8; HEADER_LEN];
        p[0] = BOOTREQUEST;
        p[1] = 1;
        p[2] = 6;
        p[4..8].copy_from_slice(&[1, 2, 3, 4]);
        p[28..34].copy_from_slice(&mac);
        p[236..240].copy_from_slice(&MAGIC);
        p.extend_from_slice(&[OPT_MSG_TYPE, 1, msg_type]);
        for (c, v) in opts {
            p.push(*c);
            p.push(v.len() as u8);
            p.extend_from_slice(v);
        }
        p.push(OPT_END);
        p
    }

    fn options(reply: &[u8]) -> Vec<(u8, Vec<u8>)> {
        let mut out = Vec::new();
        let mut i = HEADER_LEN;
        while reply[i] != OPT_END {
            let len = reply[i + 1] as usize;
            out.push((reply[i], reply[i + 2..i + 2 + len].to_vec()));
            i += 2 + len;
        }
        out
    }

    fn opt(reply: &[u8], code: u8) -> Option<Vec<u8>> {
        options(reply)
            .into_iter()
            .find(|(c, _)| *c == code)
            .map(|(_, v)| v)
    }

    #[test]
    fn discover_gets_offer_with_all_options() {
        let r = server().handle(&request(DISCOVER, MAC, &[])).unwrap();
        assert_eq!(r[0], BOOTREPLY);
        assert_eq!(&r[4..8], &[1, 2, 3, 4]);
        assert_eq!(&r[16..20], &[10, 0, 2, 2]);
        assert_eq!(&r[28..34], &MAC);
        assert!(r.len() >= 300);
        assert_eq!(opt(&r, OPT_MSG_TYPE).unwrap(), vec![OFFER]);
        assert_eq!(opt(&r, OPT_SERVER_ID).unwrap(), vec![10, 0, 2, 1]);
        assert_eq!(opt(&r, OPT_SUBNET).unwrap(), vec![255, 255, 255, 0]);
        assert_eq!(opt(&r, OPT_ROUTER).unwrap(), vec![10, 0, 2, 1]);
        assert_eq!(opt(&r, OPT_DNS).unwrap(), vec![10, 96, 0, 10]);
        assert_eq!(opt(&r, OPT_HOSTNAME).unwrap(), b"vm1".to_vec());
        assert_eq!(
            opt(&r, OPT_DOMAIN).unwrap(),
            b"ns.svc.cluster.local".to_vec()
        );
        assert_eq!(opt(&r, OPT_MTU).unwrap(), 1450u16.to_be_bytes().to_vec());
        assert_eq!(
            opt(&r, OPT_LEASE_TIME).unwrap(),
            86400u32.to_be_bytes().to_vec()
        );
        assert_eq!(opt(&r, OPT_BROADCAST).unwrap(), vec![10, 0, 2, 255]);
        let search = opt(&r, OPT_DOMAIN_SEARCH).unwrap();
        assert_eq!(
            search,
            b"\x02ns\x03svc\x07cluster\x05local\x00\x07cluster\x05local\x00".to_vec()
        );
        assert!(opt(&r, OPT_CLASSLESS_ROUTES).is_none());
    }

    #[test]
    fn request_ack_nak_and_other_server() {
        let s = server();
        let r = s
            .handle(&request(
                REQUEST,
                MAC,
                &[
                    (OPT_REQUESTED_IP, &[10, 0, 2, 2]),
                    (OPT_SERVER_ID, &[10, 0, 2, 1]),
                ],
            ))
            .unwrap();
        assert_eq!(opt(&r, OPT_MSG_TYPE).unwrap(), vec![ACK]);
        assert_eq!(&r[16..20], &[10, 0, 2, 2]);
        let r = s
            .handle(&request(
                REQUEST,
                MAC,
                &[(OPT_REQUESTED_IP, &[10, 0, 2, 9])],
            ))
            .unwrap();
        assert_eq!(opt(&r, OPT_MSG_TYPE).unwrap(), vec![NAK]);
        assert_eq!(&r[16..20], &[0, 0, 0, 0]);
        assert!(opt(&r, OPT_ROUTER).is_none());
        // Selecting another server: silence.
        assert!(s
            .handle(&request(
                REQUEST,
                MAC,
                &[
                    (OPT_REQUESTED_IP, &[10, 0, 2, 2]),
                    (OPT_SERVER_ID, &[10, 0, 2, 7])
                ]
            ))
            .is_none());
        // Renewal: no requested-IP option, ciaddr set.
        let mut p = request(REQUEST, MAC, &[]);
        p[12..16].copy_from_slice(&[10, 0, 2, 2]);
        assert_eq!(
            opt(&s.handle(&p).unwrap(), OPT_MSG_TYPE).unwrap(),
            vec![ACK]
        );
    }

    #[test]
    fn foreign_and_malformed_packets_are_ignored() {
        let s = server();
        assert!(s
            .handle(&request(DISCOVER, [2, 0, 0, 0, 0, 1], &[]))
            .is_none());
        assert!(s.handle(&[]).is_none());
        assert!(s.handle(&[1u8; 100]).is_none());
        let mut p = request(DISCOVER, MAC, &[]);
        p[236] = 0; // bad magic
        assert!(s.handle(&p).is_none());
        // Option running past the end.
        let mut p = request(DISCOVER, MAC, &[]);
        p.pop();
        p.extend_from_slice(&[OPT_HOSTNAME, 200, b'x']);
        assert!(s.handle(&p).is_none());
        // No message type.
        let mut p = request(DISCOVER, MAC, &[]);
        p.truncate(HEADER_LEN);
        p.push(OPT_END);
        assert!(s.handle(&p).is_none());
        // Release: no answer.
        assert!(s.handle(&request(7, MAC, &[])).is_none());
        // A reply (op 2) is not a request.
        let mut p = request(DISCOVER, MAC, &[]);
        p[0] = BOOTREPLY;
        assert!(s.handle(&p).is_none());
    }

    #[test]
    fn classless_routes_when_router_off_subnet() {
        let mut s = server();
        s.lease.ip = Ipv4Addr::new(10, 244, 1, 7);
        s.lease.prefix_len = 32;
        s.lease.router = Some(Ipv4Addr::new(169, 254, 1, 1));
        s.lease.routes = vec![
            (Ipv4Addr::new(169, 254, 1, 1), 32, Ipv4Addr::UNSPECIFIED),
            (Ipv4Addr::UNSPECIFIED, 0, Ipv4Addr::new(169, 254, 1, 1)),
        ];
        let r = s.handle(&request(DISCOVER, MAC, &[])).unwrap();
        assert_eq!(
            opt(&r, OPT_CLASSLESS_ROUTES).unwrap(),
            vec![32, 169, 254, 1, 1, 0, 0, 0, 0, 0, 169, 254, 1, 1]
        );
        assert_eq!(opt(&r, OPT_SUBNET).unwrap(), vec![255, 255, 255, 255]);
    }

    #[test]
    fn replies_broadcast_until_the_client_has_its_address() {
        let s = server();
        let bcast = SocketAddrV4::new(Ipv4Addr::BROADCAST, 68);
        let d = request(DISCOVER, MAC, &[]);
        assert_eq!(
            DhcpServer::reply_destination(&d, &s.handle(&d).unwrap()),
            bcast
        );
        let mut renew = request(REQUEST, MAC, &[]);
        renew[12..16].copy_from_slice(&[10, 0, 2, 2]);
        assert_eq!(
            DhcpServer::reply_destination(&renew, &s.handle(&renew).unwrap()),
            SocketAddrV4::new(Ipv4Addr::new(10, 0, 2, 2), 68)
        );
        // A NAK to a client renewing an address it may not keep: broadcast.
        let mut wrong = request(REQUEST, MAC, &[]);
        wrong[12..16].copy_from_slice(&[10, 0, 2, 9]);
        let nak = s.handle(&wrong).unwrap();
        assert_eq!(opt(&nak, OPT_MSG_TYPE).unwrap(), vec![NAK]);
        assert_eq!(DhcpServer::reply_destination(&wrong, &nak), bcast);
        assert_eq!(DhcpServer::reply_destination(&[], &[]), bcast);
    }

    #[test]
    fn inform_gets_ack_without_lease() {
        let mut p = request(INFORM, MAC, &[]);
        p[12..16].copy_from_slice(&[10, 0, 2, 2]);
        let r = server().handle(&p).unwrap();
        assert_eq!(opt(&r, OPT_MSG_TYPE).unwrap(), vec![ACK]);
        assert_eq!(&r[12..16], &[10, 0, 2, 2]);
        assert_eq!(&r[16..20], &[0, 0, 0, 0]);
        assert!(opt(&r, OPT_LEASE_TIME).is_none());
    }

    #[test]
    fn long_search_list_is_split() {
        let mut out = Vec::new();
        push_opt(&mut out, OPT_DOMAIN_SEARCH, &[7u8; 300]);
        assert_eq!(out.len(), 2 + 255 + 2 + 45);
        assert_eq!(out[1], 255);
        assert_eq!(out[257], OPT_DOMAIN_SEARCH);
        assert_eq!(out[258], 45);
    }
}
