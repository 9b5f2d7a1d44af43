//! `dhcp_parse`: the built-in DHCP server's packet handling ([`DhcpServer::handle`] and
//! [`DhcpServer::reply_destination`]) on datagrams a guest can send: raw bytes, or a BOOTP
//! header that passes the basic checks followed by fuzzed options. The lease the server hands
//! out varies too (long search lists, many routes and DNS servers, odd prefix lengths).
//!
//! Checked against a reference reading of RFC 2131/2132 written here:
//! - the server answers exactly the packets it should: a BOOTREQUEST for Ethernet with the magic
//!   cookie, well-formed options (a truncated option makes the packet invalid), a message type,
//!   from the one client MAC it serves; DISCOVER gets OFFER; REQUEST gets ACK when the requested
//!   address (option 50, else `ciaddr`) is the lease's and NAK otherwise, and no answer when it
//!   names another server; INFORM gets ACK; anything else gets no answer;
//! - every reply is a BOOTREPLY echoing `xid`, `flags`, `giaddr` and `chaddr`, carrying the
//!   lease address in `yiaddr` (none for NAK and INFORM), the server address in `siaddr`, at
//!   least 300 bytes, options that parse to the END option with only padding after it;
//! - the options, reassembled per RFC 3396 where long ones were split, say exactly what the lease
//!   says: message type and server id once each, lease time, subnet mask, broadcast, router,
//!   DNS servers, host name, domain, the search list (RFC 1035 names), MTU and classless routes
//!   (RFC 3442); a NAK carries nothing but the type and server id;
//! - replies go to `ciaddr:68` when the client has an address and the reply is not a NAK, and
//!   to the broadcast address otherwise.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4};

use netsetup::dhcp::{DhcpServer, Lease};

use crate::input::Input;

const MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
const MAGIC: [u8; 4] = [99, 130, 83, 99];

/// What the reference reading of a request finds.
#[derive(Debug)]
struct Req {
    xid: [u8; 4],
    flags: [u8; 2],
    ciaddr: Ipv4Addr,
    giaddr: [u8; 4],
    chaddr: [u8; 16],
    msg_type: u8,
    requested_ip: Option<Ipv4Addr>,
    server_id: Option<Ipv4Addr>,
}

fn ip(b: &[u8]) -> Option<Ipv4Addr> {
    <[u8; 4]>::try_from(b).ok().map(Ipv4Addr::from)
}

/// RFC 2131/2132 as the server is documented to read requests: options are type-length-value
/// after the cookie up to END or the end of the packet; PAD is one byte; an option running past
/// the end makes the packet invalid; a repeated option counts as its last instance.
fn reference_parse(p: &[u8]) -> Option<Req> {
    if p.len() < 240 || p[0] != 1 || p[1] != 1 || p[2] != 6 || p[236..240] != MAGIC {
        return None;
    }
    let mut r = Req {
        xid: p[4..8].try_into().ok()?,
        flags: p[10..12].try_into().ok()?,
        ciaddr: ip(&p[12..16])?,
        giaddr: p[24..28].try_into().ok()?,
        chaddr: p[28..44].try_into().ok()?,
        msg_type: 0,
        requested_ip: None,
        server_id: None,
    };
    let mut i = 240;
    while i < p.len() {
        match p[i] {
            255 => break,
            0 => i += 1,
            code => {
                let len = usize::from(*p.get(i + 1)?);
                let val = p.get(i + 2..i + 2 + len)?;
                match code {
                    53 if len == 1 => r.msg_type = val[0],
                    50 => r.requested_ip = ip(val),
                    54 => r.server_id = ip(val),
                    _ => {}
                }
                i += 2 + len;
            }
        }
    }
    (r.msg_type != 0).then_some(r)
}

/// Options of a reply, each code's instances concatenated (RFC 3396), with instance counts.
fn reply_options(reply: &[u8]) -> BTreeMap<u8, (usize, Vec<u8>)> {
    let mut out: BTreeMap<u8, (usize, Vec<u8>)> = BTreeMap::new();
    let mut i = 240;
    loop {
        assert!(
            i < reply.len(),
            "reply options run past the end without END"
        );
        match reply[i] {
            255 => {
                assert!(
                    reply[i + 1..].iter().all(|&b| b == 0),
                    "bytes after the END option are not padding"
                );
                return out;
            }
            0 => i += 1,
            code => {
                let len = usize::from(reply[i + 1]);
                let val = reply
                    .get(i + 2..i + 2 + len)
                    .unwrap_or_else(|| panic!("reply option {code} runs past the end"));
                assert!(len > 0, "empty reply option {code}");
                let e = out.entry(code).or_default();
                e.0 += 1;
                e.1.extend_from_slice(val);
                i += 2 + len;
            }
        }
    }
}

fn mask(prefix: u8) -> u32 {
    match prefix {
        0 => 0,
        p if p >= 32 => u32::MAX,
        p => u32::MAX << (32 - u32::from(p)),
    }
}

/// RFC 1035 names (no compression) back to dotted domains.
fn decode_names(mut b: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let mut labels: Vec<String> = Vec::new();
    while let Some((&n, rest)) = b.split_first() {
        if n == 0 {
            out.push(labels.join("."));
            labels.clear();
            b = rest;
            continue;
        }
        assert!(n <= 63, "label of {n} bytes in the search list");
        let n = usize::from(n);
        assert!(rest.len() >= n, "search list label runs past the option");
        labels.push(String::from_utf8_lossy(&rest[..n]).into_owned());
        b = &rest[n..];
    }
    assert!(
        labels.is_empty(),
        "search list name without its terminating zero label"
    );
    out
}

fn lease(inp: &mut Input) -> (Ipv4Addr, Lease) {
    let server_ip = Ipv4Addr::new(10, 0, 2, 1);
    let mut l = Lease {
        ip: Ipv4Addr::new(10, 0, 2, 2),
        prefix_len: 24,
        router: Some(server_ip),
        dns: vec![Ipv4Addr::new(10, 96, 0, 10)],
        search: vec!["default.svc.cluster.local".into(), "cluster.local".into()],
        hostname: Some("vmi".into()),
        mtu: Some(1500),
        lease_secs: 86400,
        routes: Vec::new(),
    };
    let sel = inp.u8();
    if sel & 1 == 0 {
        return (server_ip, l);
    }
    l.ip = Ipv4Addr::from(inp.u32());
    l.prefix_len = inp.u8() % 41;
    l.router = (sel & 2 != 0).then(|| Ipv4Addr::from(inp.u32()));
    l.dns = (0..inp.u8() % 80)
        .map(|_| Ipv4Addr::from(inp.u32()))
        .collect();
    let name = |inp: &mut Input| -> String {
        let n = usize::from(inp.u8() % 120);
        inp.bytes(n)
            .iter()
            .map(|&b| match b % 40 {
                0..=25 => (b'a' + b % 40) as char,
                26..=35 => (b'0' + b % 40 - 26) as char,
                36 | 37 => '.',
                _ => '-',
            })
            .collect()
    };
    l.search = (0..inp.u8() % 8).map(|_| name(inp)).collect();
    l.hostname = (sel & 4 != 0).then(|| name(inp)).filter(|h| !h.is_empty());
    l.mtu = (sel & 8 != 0).then(|| inp.u16());
    l.lease_secs = inp.u32();
    l.routes = (0..inp.u8() % 70)
        .map(|_| {
            (
                Ipv4Addr::from(inp.u32()),
                inp.u8() % 40,
                Ipv4Addr::from(inp.u32()),
            )
        })
        .collect();
    (server_ip, l)
}

fn packet(inp: &mut Input, server_ip: Ipv4Addr, lease_ip: Ipv4Addr) -> Vec<u8> {
    if inp.u8().is_multiple_of(4) {
        return inp.rest().to_vec();
    }
    let mut p = vec![0u8; 240];
    let odd = inp.u8();
    p[0] = if odd == 255 { inp.u8() } else { 1 };
    p[1] = if odd == 254 { inp.u8() } else { 1 };
    p[2] = if odd == 253 { inp.u8() } else { 6 };
    p[3] = inp.u8() % 4; // hops
    p[4..8].copy_from_slice(&inp.u32().to_le_bytes());
    p[10] = inp.u8() & 0x80;
    p[12..16].copy_from_slice(&match inp.u8() % 4 {
        0 | 1 => [0; 4],
        2 => lease_ip.octets(),
        _ => inp.u32().to_be_bytes(),
    });
    p[24..28].copy_from_slice(&if inp.u8().is_multiple_of(8) {
        inp.u32().to_be_bytes()
    } else {
        [0; 4]
    });
    let mac = if inp.u8().is_multiple_of(16) {
        let b = inp.bytes(6);
        let mut m = [0u8; 6];
        m[..b.len()].copy_from_slice(b);
        m
    } else {
        MAC
    };
    p[28..34].copy_from_slice(&mac);
    p[236..240].copy_from_slice(&MAGIC);
    if odd == 252 {
        p[236 + usize::from(inp.u8() % 4)] ^= 1;
    }
    let n = inp.u8() % 12;
    for _ in 0..n {
        match inp.u8() % 10 {
            0..=2 => {
                p.extend_from_slice(&[53, 1, [1, 3, 8, 3, 1, 2, 4, 7][usize::from(inp.u8() % 8)]])
            }
            3 => {
                p.extend_from_slice(&[50, 4]);
                p.extend_from_slice(&if inp.bool() {
                    lease_ip.octets()
                } else {
                    inp.u32().to_be_bytes()
                });
            }
            4 => {
                p.extend_from_slice(&[54, 4]);
                p.extend_from_slice(&if inp.bool() {
                    server_ip.octets()
                } else {
                    inp.u32().to_be_bytes()
                });
            }
            5 => p.push(0),
            6 => p.push(255),
            _ => {
                let code = inp.u8();
                let len = inp.u8();
                p.push(code);
                p.push(len);
                let v = inp.bytes(usize::from(len % 64));
                p.extend_from_slice(v);
            }
        }
    }
    if inp.u8().is_multiple_of(4) {
        p.push(255);
    }
    p
}

pub fn run(data: &[u8]) {
    let mut inp = Input::new(data);
    let (server_ip, lease) = lease(&mut inp);
    let pkt = packet(&mut inp, server_ip, lease.ip);
    let server = DhcpServer {
        server_ip,
        client_mac: MAC,
        lease: lease.clone(),
    };
    let reply = server.handle(&pkt);
    trace!(
        "dhcp: {}-byte packet, reply {:?}",
        pkt.len(),
        reply.as_ref().and_then(|r| r.get(240..243))
    );
    let req = reference_parse(&pkt);
    let expected_type = req.as_ref().and_then(|r| {
        if r.chaddr[..6] != MAC {
            return None;
        }
        match r.msg_type {
            1 => Some(2),
            3 if r.server_id.is_some_and(|s| s != server_ip) => None,
            3 => Some(if r.requested_ip.unwrap_or(r.ciaddr) == lease.ip {
                5
            } else {
                6
            }),
            8 => Some(5),
            _ => None,
        }
    });
    let dest_broadcast = SocketAddrV4::new(Ipv4Addr::BROADCAST, 68);
    let Some(reply) = reply else {
        assert_eq!(
            expected_type, None,
            "no answer to a request that needs one: {req:?}"
        );
        // Never panics, whatever the "reply".
        let _ = DhcpServer::reply_destination(&pkt, &pkt);
        return;
    };
    let req = req.unwrap_or_else(|| panic!("answered a packet that is not a valid request"));
    let t = expected_type.unwrap_or_else(|| panic!("answered {req:?}, which needs no answer"));
    // Header.
    assert!(
        reply.len() >= 300,
        "reply of {} bytes, BOOTP minimum is 300",
        reply.len()
    );
    assert_eq!(&reply[0..4], &[2, 1, 6, 0], "op/htype/hlen/hops");
    assert_eq!(reply[4..8], req.xid, "xid");
    assert_eq!(reply[8..10], [0, 0], "secs");
    assert_eq!(reply[10..12], req.flags, "flags");
    let inform = req.msg_type == 8;
    let ciaddr = if inform {
        req.ciaddr
    } else {
        Ipv4Addr::UNSPECIFIED
    };
    let yiaddr = if t == 6 || inform {
        Ipv4Addr::UNSPECIFIED
    } else {
        lease.ip
    };
    assert_eq!(ip(&reply[12..16]), Some(ciaddr), "ciaddr");
    assert_eq!(ip(&reply[16..20]), Some(yiaddr), "yiaddr");
    assert_eq!(ip(&reply[20..24]), Some(server_ip), "siaddr");
    assert_eq!(reply[24..28], req.giaddr, "giaddr");
    assert_eq!(reply[28..44], req.chaddr, "chaddr");
    assert!(reply[44..236].iter().all(|&b| b == 0), "sname/file");
    assert_eq!(reply[236..240], MAGIC, "magic cookie");
    // Options.
    let opts = reply_options(&reply);
    let one = |code: u8| -> Option<&Vec<u8>> {
        opts.get(&code).map(|(n, v)| {
            assert_eq!(*n, 1, "option {code} appears {n} times");
            v
        })
    };
    assert_eq!(one(53).map(Vec::as_slice), Some(&[t][..]), "message type");
    assert_eq!(
        one(54).map(Vec::as_slice),
        Some(&server_ip.octets()[..]),
        "server id"
    );
    if t == 6 {
        assert_eq!(
            opts.keys().copied().collect::<Vec<_>>(),
            vec![53, 54],
            "a NAK carries only type and server id"
        );
    } else {
        let get = |code: u8| opts.get(&code).map(|(_, v)| v.clone());
        let m = mask(lease.prefix_len);
        assert_eq!(
            get(51),
            (!inform).then(|| lease.lease_secs.to_be_bytes().to_vec()),
            "lease time"
        );
        assert_eq!(get(1), Some(m.to_be_bytes().to_vec()), "subnet mask");
        assert_eq!(
            get(28),
            Some((u32::from(lease.ip) | !m).to_be_bytes().to_vec()),
            "broadcast"
        );
        assert_eq!(get(3), lease.router.map(|r| r.octets().to_vec()), "router");
        let dns: Vec<u8> = lease.dns.iter().flat_map(|d| d.octets()).collect();
        assert_eq!(get(6), (!dns.is_empty()).then_some(dns), "DNS servers");
        assert_eq!(
            get(12),
            lease.hostname.as_ref().map(|h| h.as_bytes().to_vec()),
            "host name"
        );
        assert_eq!(
            get(15),
            lease
                .search
                .first()
                .map(|d| d.as_bytes().to_vec())
                .filter(|d| !d.is_empty()),
            "domain"
        );
        let want_search: Vec<String> = lease
            .search
            .iter()
            .map(|d| {
                d.split('.')
                    .filter(|l| !l.is_empty())
                    .map(|l| &l[..l.len().min(63)])
                    .collect::<Vec<_>>()
                    .join(".")
            })
            .collect();
        match get(119) {
            Some(v) => assert_eq!(decode_names(&v), want_search, "domain search list"),
            None => assert!(lease.search.is_empty(), "search list missing"),
        }
        assert_eq!(get(26), lease.mtu.map(|m| m.to_be_bytes().to_vec()), "MTU");
        match get(121) {
            Some(v) => {
                let mut routes = Vec::new();
                let mut b = &v[..];
                while let Some((&plen, rest)) = b.split_first() {
                    assert!(plen <= 32, "classless route prefix {plen}");
                    let sig = usize::from(plen).div_ceil(8);
                    assert!(
                        rest.len() >= sig + 4,
                        "classless route runs past the option"
                    );
                    let mut dst = [0u8; 4];
                    dst[..sig].copy_from_slice(&rest[..sig]);
                    routes.push((dst, plen, ip(&rest[sig..sig + 4]).expect("4 bytes")));
                    b = &rest[sig + 4..];
                }
                let want: Vec<_> = lease
                    .routes
                    .iter()
                    .map(|(d, p, g)| {
                        let p = (*p).min(32);
                        let sig = usize::from(p).div_ceil(8);
                        let mut dst = [0u8; 4];
                        dst[..sig].copy_from_slice(&d.octets()[..sig]);
                        (dst, p, *g)
                    })
                    .collect();
                assert_eq!(routes, want, "classless static routes");
            }
            None => assert!(lease.routes.is_empty(), "classless routes missing"),
        }
    }
    // Destination.
    let dest = DhcpServer::reply_destination(&pkt, &reply);
    let unicast = !req.ciaddr.is_unspecified() && t != 6;
    let want = if unicast {
        SocketAddrV4::new(req.ciaddr, 68)
    } else {
        dest_broadcast
    };
    assert_eq!(dest, want, "reply destination");
}
