//! Ethernet/ARP/IPv4/ICMP/UDP/DHCP frames for the `net-serve` scenario: pure code on byte
//! slices (no hardware access), also compiled into host unit tests by `testguest-build`
//! (`tests/guest_logic.rs`). Every parser bounds-checks with `get`, so a malformed or truncated
//! frame is ignored, never a panic.

pub const ETH_HLEN: usize = 14;
pub const ETHERTYPE_IPV4: u16 = 0x0800;
pub const ETHERTYPE_ARP: u16 = 0x0806;
pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_UDP: u8 = 17;
pub const DHCP_SERVER_PORT: u16 = 67;
pub const DHCP_CLIENT_PORT: u16 = 68;
/// Ethernet minimum frame length without FCS.
pub const MIN_FRAME: usize = 60;
pub const BROADCAST_MAC: [u8; 6] = [0xff; 6];
/// Longest frame handled (1500-byte MTU plus the Ethernet header).
pub const MAX_FRAME: usize = 1514;

const IP_HLEN: usize = 20;
const UDP_HLEN: usize = 8;
const BOOTP_LEN: usize = 236;
const DHCP_MAGIC: [u8; 4] = [99, 130, 83, 99];
const DHCP_DISCOVER: u8 = 1;
const DHCP_OFFER: u8 = 2;
const DHCP_REQUEST: u8 = 3;
const DHCP_ACK: u8 = 5;
const DHCP_NAK: u8 = 6;

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn arr4(b: &[u8], at: usize) -> Option<[u8; 4]> {
    b.get(at..at + 4)?.try_into().ok()
}

fn arr6(b: &[u8], at: usize) -> Option<[u8; 6]> {
    b.get(at..at + 6)?.try_into().ok()
}

/// The Internet checksum (RFC 1071) of `data`, continuing from the partial sum `sum`.
pub fn checksum(data: &[u8], mut sum: u32) -> u16 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An address the DHCP server handed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    pub ip: [u8; 4],
    pub mask: [u8; 4],
    pub router: [u8; 4],
    pub server: [u8; 4],
}

/// A DHCP answer addressed to us.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DhcpReply {
    Offer(Lease),
    Ack(Lease),
    Nak,
}

fn eth_header(out: &mut [u8], dst: [u8; 6], src: [u8; 6], ethertype: u16) {
    out[0..6].copy_from_slice(&dst);
    out[6..12].copy_from_slice(&src);
    out[12..14].copy_from_slice(&ethertype.to_be_bytes());
}

/// IPv4 header (no options, DF, TTL 64) at `out[0..20]` for a payload of `payload` bytes.
fn ip_header(out: &mut [u8], proto: u8, src: [u8; 4], dst: [u8; 4], payload: usize) {
    let total = (IP_HLEN + payload) as u16;
    out[0] = 0x45;
    out[1] = 0;
    out[2..4].copy_from_slice(&total.to_be_bytes());
    out[4..6].copy_from_slice(&[0, 0]);
    out[6..8].copy_from_slice(&[0x40, 0]);
    out[8] = 64;
    out[9] = proto;
    out[10..12].copy_from_slice(&[0, 0]);
    out[12..16].copy_from_slice(&src);
    out[16..20].copy_from_slice(&dst);
    let c = checksum(&out[..IP_HLEN], 0);
    out[10..12].copy_from_slice(&c.to_be_bytes());
}

/// Zero-pads a frame to the Ethernet minimum; returns its length.
fn pad(out: &mut [u8], len: usize) -> usize {
    if len < MIN_FRAME {
        out[len..MIN_FRAME].fill(0);
        MIN_FRAME
    } else {
        len
    }
}

/// A DHCPDISCOVER (`request` None) or DHCPREQUEST for `request` = (offered ip, server id),
/// broadcast from 0.0.0.0:68. `out` must hold [`MAX_FRAME`] bytes. Returns the frame length.
pub fn dhcp_client_frame(
    out: &mut [u8],
    mac: [u8; 6],
    xid: [u8; 4],
    request: Option<([u8; 4], [u8; 4])>,
) -> usize {
    let udp_at = ETH_HLEN + IP_HLEN;
    let bootp_at = udp_at + UDP_HLEN;
    let opts_at = bootp_at + BOOTP_LEN;
    out[bootp_at..opts_at].fill(0);
    let b = &mut out[bootp_at..];
    b[0] = 1; // BOOTREQUEST
    b[1] = 1; // Ethernet
    b[2] = 6;
    b[4..8].copy_from_slice(&xid);
    b[10] = 0x80; // broadcast replies: we have no address yet
    b[28..34].copy_from_slice(&mac);
    let mut i = opts_at;
    let mut put = |out: &mut [u8], bytes: &[u8]| {
        out[i..i + bytes.len()].copy_from_slice(bytes);
        i += bytes.len();
    };
    put(out, &DHCP_MAGIC);
    match request {
        None => put(out, &[53, 1, DHCP_DISCOVER]),
        Some((ip, server)) => {
            put(out, &[53, 1, DHCP_REQUEST]);
            put(out, &[50, 4]);
            put(out, &ip);
            put(out, &[54, 4]);
            put(out, &server);
        }
    }
    put(out, &[55, 3, 1, 3, 6]); // parameter request: mask, router, DNS
    put(out, &[255]);
    let udp_len = i - udp_at;
    let u = &mut out[udp_at..];
    u[0..2].copy_from_slice(&DHCP_CLIENT_PORT.to_be_bytes());
    u[2..4].copy_from_slice(&DHCP_SERVER_PORT.to_be_bytes());
    u[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
    u[6..8].copy_from_slice(&[0, 0]); // no UDP checksum (allowed for IPv4)
    ip_header(&mut out[ETH_HLEN..], IPPROTO_UDP, [0; 4], [255; 4], udp_len);
    eth_header(out, BROADCAST_MAC, mac, ETHERTYPE_IPV4);
    pad(out, i)
}

/// An IPv4 packet's protocol, source, destination and payload.
type Ipv4Packet<'a> = (u8, [u8; 4], [u8; 4], &'a [u8]);

/// The IPv4 packet in a frame, or None when the frame is not a well-formed, unfragmented IPv4
/// packet with a valid header checksum.
fn ipv4(frame: &[u8]) -> Option<Ipv4Packet<'_>> {
    if be16(frame, 12)? != ETHERTYPE_IPV4 {
        return None;
    }
    let ip = frame.get(ETH_HLEN..)?;
    let vihl = *ip.first()?;
    let ihl = usize::from(vihl & 0x0f) * 4;
    if vihl >> 4 != 4 || ihl < IP_HLEN {
        return None;
    }
    let total = usize::from(be16(ip, 2)?);
    if total < ihl || total > ip.len() {
        return None;
    }
    let frag = be16(ip, 6)?;
    if frag & 0x3fff != 0 {
        return None; // fragments (MF or an offset) are not reassembled
    }
    if checksum(ip.get(..ihl)?, 0) != 0 {
        return None;
    }
    Some((
        *ip.get(9)?,
        arr4(ip, 12)?,
        arr4(ip, 16)?,
        ip.get(ihl..total)?,
    ))
}

/// Parses a DHCP answer for `mac`/`xid`.
pub fn parse_dhcp(frame: &[u8], mac: [u8; 6], xid: [u8; 4]) -> Option<DhcpReply> {
    let (proto, _, _, udp) = ipv4(frame)?;
    if proto != IPPROTO_UDP
        || be16(udp, 0)? != DHCP_SERVER_PORT
        || be16(udp, 2)? != DHCP_CLIENT_PORT
    {
        return None;
    }
    let ulen = usize::from(be16(udp, 4)?);
    let b = udp.get(UDP_HLEN..ulen)?;
    if *b.first()? != 2 || arr4(b, 4)? != xid || arr6(b, 28)? != mac {
        return None;
    }
    if b.get(BOOTP_LEN..BOOTP_LEN + 4)? != DHCP_MAGIC {
        return None;
    }
    let mut lease = Lease {
        ip: arr4(b, 16)?,
        mask: [0; 4],
        router: [0; 4],
        server: arr4(b, 20)?,
    };
    let mut msg = 0u8;
    let mut i = BOOTP_LEN + 4;
    while let Some(&code) = b.get(i) {
        match code {
            255 => break,
            0 => {
                i += 1;
                continue;
            }
            _ => {}
        }
        let len = usize::from(*b.get(i + 1)?);
        let val = b.get(i + 2..i + 2 + len)?;
        match (code, len) {
            (53, 1) => msg = val[0],
            (1, 4) => lease.mask = arr4(val, 0)?,
            (3, l) if l >= 4 => lease.router = arr4(val, 0)?,
            (54, 4) => lease.server = arr4(val, 0)?,
            _ => {}
        }
        i += 2 + len;
    }
    match msg {
        DHCP_OFFER if lease.ip != [0; 4] => Some(DhcpReply::Offer(lease)),
        DHCP_ACK if lease.ip != [0; 4] => Some(DhcpReply::Ack(lease)),
        DHCP_NAK => Some(DhcpReply::Nak),
        _ => None,
    }
}

/// What [`respond`] answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    Arp,
    Ping,
    UdpEcho,
}

/// Answers a frame addressed to `mac`/`ip` (or an ARP broadcast for `ip`): ARP request →
/// reply, ICMP echo request → echo reply, UDP datagram to `udp_port` → the same payload back
/// (ports swapped, no UDP checksum). Writes the answer to `out` ([`MAX_FRAME`] bytes) and
/// returns (its length, what it was); None for anything else.
pub fn respond(
    frame: &[u8],
    mac: [u8; 6],
    ip: [u8; 4],
    udp_port: u16,
    out: &mut [u8],
) -> Option<(usize, Answer)> {
    if frame.len() > MAX_FRAME || out.len() < MAX_FRAME {
        return None;
    }
    let dst = arr6(frame, 0)?;
    let src = arr6(frame, 6)?;
    if dst != mac && dst != BROADCAST_MAC {
        return None;
    }
    match be16(frame, 12)? {
        ETHERTYPE_ARP => {
            let a = frame.get(ETH_HLEN..ETH_HLEN + 28)?;
            // Ethernet/IPv4 request for our address.
            if be16(a, 0)? != 1 || be16(a, 2)? != ETHERTYPE_IPV4 || a[4] != 6 || a[5] != 4 {
                return None;
            }
            if be16(a, 6)? != 1 || arr4(a, 24)? != ip {
                return None;
            }
            let (sha, spa) = (arr6(a, 8)?, arr4(a, 14)?);
            eth_header(out, sha, mac, ETHERTYPE_ARP);
            let r = &mut out[ETH_HLEN..ETH_HLEN + 28];
            r[0..6].copy_from_slice(&[0, 1, 8, 0, 6, 4]);
            r[6..8].copy_from_slice(&2u16.to_be_bytes());
            r[8..14].copy_from_slice(&mac);
            r[14..18].copy_from_slice(&ip);
            r[18..24].copy_from_slice(&sha);
            r[24..28].copy_from_slice(&spa);
            Some((pad(out, ETH_HLEN + 28), Answer::Arp))
        }
        ETHERTYPE_IPV4 => {
            if dst != mac {
                return None;
            }
            let (proto, from, to, payload) = ipv4(frame)?;
            if to != ip {
                return None;
            }
            let at = ETH_HLEN + IP_HLEN;
            let answer = match proto {
                IPPROTO_ICMP => {
                    // Echo request (type 8, code 0) with a valid checksum.
                    if payload.len() < 8 || payload[0] != 8 || payload[1] != 0 {
                        return None;
                    }
                    if checksum(payload, 0) != 0 {
                        return None;
                    }
                    let r = &mut out[at..at + payload.len()];
                    r.copy_from_slice(payload);
                    r[0] = 0; // echo reply
                    r[2..4].copy_from_slice(&[0, 0]);
                    let c = checksum(r, 0);
                    r[2..4].copy_from_slice(&c.to_be_bytes());
                    Answer::Ping
                }
                IPPROTO_UDP => {
                    let ulen = usize::from(be16(payload, 4)?);
                    if ulen < UDP_HLEN || ulen > payload.len() || be16(payload, 2)? != udp_port {
                        return None;
                    }
                    let r = &mut out[at..at + ulen];
                    r.copy_from_slice(&payload[..ulen]);
                    r[0..2].copy_from_slice(&payload[2..4]);
                    r[2..4].copy_from_slice(&payload[0..2]);
                    r[6..8].copy_from_slice(&[0, 0]);
                    Answer::UdpEcho
                }
                _ => return None,
            };
            let len = match answer {
                Answer::Ping => payload.len(),
                _ => usize::from(be16(payload, 4)?),
            };
            ip_header(&mut out[ETH_HLEN..], proto, ip, from, len);
            eth_header(out, src, mac, ETHERTYPE_IPV4);
            Some((pad(out, at + len), answer))
        }
        _ => None,
    }
}
