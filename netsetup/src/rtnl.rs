//! A small synchronous rtnetlink client (links, IPv4 addresses, IPv4 routes) over one
//! `NETLINK_ROUTE` socket. The socket belongs to the network namespace of the thread that
//! opened it, so every request acts there whichever thread sends it later.

use std::io;
use std::net::{IpAddr, Ipv4Addr};

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL,
    NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkFlags, LinkInfo, LinkMessage};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

/// Errors of the rtnetlink client.
#[derive(Debug, thiserror::Error)]
pub enum RtnlError {
    #[error("netlink socket: {0}")]
    Socket(#[source] io::Error),
    #[error("netlink {what}: {source}")]
    Request {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("netlink reply to {what} could not be decoded: {detail}")]
    Decode { what: String, detail: String },
    #[error("no network interface named {0:?}")]
    NoSuchLink(String),
}

type Result<T> = std::result::Result<T, RtnlError>;

/// What we need to know about a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mac: Option<[u8; 6]>,
    pub mtu: Option<u32>,
    /// Index of the bridge (controller) the link is enslaved to.
    pub controller: Option<u32>,
    pub up: bool,
}

/// An rtnetlink socket in the namespace it was opened in.
pub struct Rtnl {
    sock: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl Rtnl {
    /// Opens a `NETLINK_ROUTE` socket in the calling thread's network namespace.
    pub fn open() -> Result<Self> {
        let mut sock = Socket::new(NETLINK_ROUTE).map_err(RtnlError::Socket)?;
        sock.bind_auto().map_err(RtnlError::Socket)?;
        sock.connect(&SocketAddr::new(0, 0))
            .map_err(RtnlError::Socket)?;
        Ok(Self {
            sock,
            seq: 0,
            buf: Vec::with_capacity(1 << 16),
        })
    }

    /// Sends one request and collects the reply messages until the ACK (or, for dumps, DONE).
    fn request(
        &mut self,
        what: &str,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> Result<Vec<RouteNetlinkMessage>> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | flags;
        header.sequence_number = seq;
        let mut nl = NetlinkMessage::new(header, NetlinkPayload::from(msg));
        nl.finalize();
        let mut out = vec![0u8; nl.buffer_len()];
        nl.serialize(&mut out);
        self.sock
            .send(&out, 0)
            .map_err(|source| RtnlError::Request {
                what: what.to_string(),
                source,
            })?;

        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let mut replies = Vec::new();
        // Bounded: the kernel answers every request with a finite series of datagrams that ends
        // in DONE or an error/ACK; 10 000 datagrams is far beyond any dump we make.
        for _ in 0..10_000 {
            self.buf.clear();
            let n = self
                .sock
                .recv(&mut self.buf, 0)
                .map_err(|source| RtnlError::Request {
                    what: what.to_string(),
                    source,
                })?;
            let mut off = 0usize;
            while off < n {
                let bytes = &self.buf[off..n];
                let msg =
                    NetlinkMessage::<RouteNetlinkMessage>::deserialize(bytes).map_err(|e| {
                        RtnlError::Decode {
                            what: what.to_string(),
                            detail: e.to_string(),
                        }
                    })?;
                let len = msg.header.length as usize;
                if len == 0 {
                    return Err(RtnlError::Decode {
                        what: what.to_string(),
                        detail: "zero-length message".into(),
                    });
                }
                off += (len + 3) & !3;
                if msg.header.sequence_number != seq {
                    continue;
                }
                match msg.payload {
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            None => Ok(replies),
                            Some(_) => Err(RtnlError::Request {
                                what: what.to_string(),
                                source: e.to_io(),
                            }),
                        };
                    }
                    NetlinkPayload::Done(_) => return Ok(replies),
                    NetlinkPayload::InnerMessage(m) => {
                        replies.push(m);
                        if !dump && flags & NLM_F_ACK == 0 {
                            return Ok(replies);
                        }
                    }
                    _ => {}
                }
            }
        }
        Err(RtnlError::Decode {
            what: what.to_string(),
            detail: "reply never ended".into(),
        })
    }

    /// Looks a link up by name; `None` when it does not exist.
    pub fn link_by_name(&mut self, name: &str) -> Result<Option<Link>> {
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        match self.request(
            &format!("get link {name}"),
            RouteNetlinkMessage::GetLink(msg),
            0,
        ) {
            Ok(replies) => Ok(replies.into_iter().find_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(to_link(&l)),
                _ => None,
            })),
            Err(RtnlError::Request { source, .. })
                if source.raw_os_error() == Some(libc::ENODEV) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Like [`Rtnl::link_by_name`] but a missing link is an error.
    pub fn link(&mut self, name: &str) -> Result<Link> {
        self.link_by_name(name)?
            .ok_or_else(|| RtnlError::NoSuchLink(name.to_string()))
    }

    /// All links of the namespace.
    pub fn links(&mut self) -> Result<Vec<Link>> {
        let msg = LinkMessage::default();
        let replies = self.request("dump links", RouteNetlinkMessage::GetLink(msg), NLM_F_DUMP)?;
        Ok(replies
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(to_link(l)),
                _ => None,
            })
            .collect())
    }

    /// Creates a bridge (STP off, so ports forward at once) with the given MTU and MAC.
    pub fn add_bridge(&mut self, name: &str, mtu: Option<u32>, mac: Option<[u8; 6]>) -> Result<()> {
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        if let Some(mtu) = mtu {
            msg.attributes.push(LinkAttribute::Mtu(mtu));
        }
        if let Some(mac) = mac {
            msg.attributes.push(LinkAttribute::Address(mac.to_vec()));
        }
        msg.attributes
            .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(
                InfoKind::Bridge,
            )]));
        self.request(
            &format!("create bridge {name}"),
            RouteNetlinkMessage::NewLink(msg),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        )?;
        Ok(())
    }

    /// Changes a link: administrative state, controller (bridge; 0 = none), MTU, MAC.
    pub fn set_link(&mut self, index: u32, change: &LinkChange) -> Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        if let Some(up) = change.up {
            msg.header.change_mask = LinkFlags::Up;
            if up {
                msg.header.flags = LinkFlags::Up;
            }
        }
        if let Some(c) = change.controller {
            msg.attributes.push(LinkAttribute::Controller(c));
        }
        if let Some(mtu) = change.mtu {
            msg.attributes.push(LinkAttribute::Mtu(mtu));
        }
        if let Some(mac) = change.mac {
            msg.attributes.push(LinkAttribute::Address(mac.to_vec()));
        }
        self.request(
            &format!("set link {index} {change:?}"),
            RouteNetlinkMessage::SetLink(msg),
            NLM_F_ACK,
        )?;
        Ok(())
    }

    /// Deletes a link.
    pub fn del_link(&mut self, index: u32) -> Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        self.request(
            &format!("delete link {index}"),
            RouteNetlinkMessage::DelLink(msg),
            NLM_F_ACK,
        )?;
        Ok(())
    }

    fn addr_msg(index: u32, addr: Ipv4Addr, prefix_len: u8) -> AddressMessage {
        let mut msg = AddressMessage::default();
        msg.header.family = AddressFamily::Inet;
        msg.header.prefix_len = prefix_len;
        msg.header.index = index;
        msg.attributes
            .push(AddressAttribute::Local(IpAddr::V4(addr)));
        msg.attributes
            .push(AddressAttribute::Address(IpAddr::V4(addr)));
        if prefix_len < 31 {
            let mask = prefix_mask(prefix_len);
            let bcast = Ipv4Addr::from(u32::from(addr) | !mask);
            msg.attributes.push(AddressAttribute::Broadcast(bcast));
        }
        msg
    }

    /// Adds an IPv4 address to a link.
    pub fn add_addr(&mut self, index: u32, addr: Ipv4Addr, prefix_len: u8) -> Result<()> {
        self.request(
            &format!("add address {addr}/{prefix_len} to link {index}"),
            RouteNetlinkMessage::NewAddress(Self::addr_msg(index, addr, prefix_len)),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        )?;
        Ok(())
    }

    /// Removes an IPv4 address from a link.
    pub fn del_addr(&mut self, index: u32, addr: Ipv4Addr, prefix_len: u8) -> Result<()> {
        self.request(
            &format!("delete address {addr}/{prefix_len} from link {index}"),
            RouteNetlinkMessage::DelAddress(Self::addr_msg(index, addr, prefix_len)),
            NLM_F_ACK,
        )?;
        Ok(())
    }

    /// The IPv4 addresses (with prefix lengths) of a link.
    pub fn ipv4_addrs(&mut self, index: u32) -> Result<Vec<(Ipv4Addr, u8)>> {
        let mut msg = AddressMessage::default();
        msg.header.family = AddressFamily::Inet;
        let replies = self.request(
            "dump addresses",
            RouteNetlinkMessage::GetAddress(msg),
            NLM_F_DUMP,
        )?;
        let mut out = Vec::new();
        for m in replies {
            if let RouteNetlinkMessage::NewAddress(a) = m {
                if a.header.index != index {
                    continue;
                }
                for attr in &a.attributes {
                    if let AddressAttribute::Local(IpAddr::V4(ip)) = attr {
                        out.push((*ip, a.header.prefix_len));
                    }
                }
            }
        }
        Ok(out)
    }

    /// The IPv4 default route of the main table: (gateway, output link index).
    pub fn default_route_v4(&mut self) -> Result<Option<(Ipv4Addr, u32)>> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = AddressFamily::Inet;
        let replies = self.request(
            "dump routes",
            RouteNetlinkMessage::GetRoute(msg),
            NLM_F_DUMP,
        )?;
        for m in replies {
            if let RouteNetlinkMessage::NewRoute(r) = m {
                if r.header.destination_prefix_length != 0
                    || r.header.table != RouteHeader::RT_TABLE_MAIN
                {
                    continue;
                }
                let mut gw = None;
                let mut oif = None;
                for attr in &r.attributes {
                    match attr {
                        RouteAttribute::Gateway(RouteAddress::Inet(g)) => gw = Some(*g),
                        RouteAttribute::Oif(i) => oif = Some(*i),
                        _ => {}
                    }
                }
                if let (Some(g), Some(i)) = (gw, oif) {
                    return Ok(Some((g, i)));
                }
            }
        }
        Ok(None)
    }

    /// Adds an IPv4 route `dst/prefix_len` through `gateway` (or on-link when `None`) on a link.
    pub fn add_route_v4(
        &mut self,
        dst: Ipv4Addr,
        prefix_len: u8,
        gateway: Option<Ipv4Addr>,
        oif: u32,
    ) -> Result<()> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = AddressFamily::Inet;
        msg.header.destination_prefix_length = prefix_len;
        msg.header.table = RouteHeader::RT_TABLE_MAIN;
        msg.header.protocol = RouteProtocol::Boot;
        msg.header.kind = RouteType::Unicast;
        msg.header.scope = if gateway.is_some() {
            RouteScope::Universe
        } else {
            RouteScope::Link
        };
        if prefix_len > 0 {
            msg.attributes
                .push(RouteAttribute::Destination(RouteAddress::Inet(dst)));
        }
        if let Some(gw) = gateway {
            msg.attributes
                .push(RouteAttribute::Gateway(RouteAddress::Inet(gw)));
        }
        msg.attributes.push(RouteAttribute::Oif(oif));
        self.request(
            &format!("add route {dst}/{prefix_len} via {gateway:?} dev {oif}"),
            RouteNetlinkMessage::NewRoute(msg),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        )?;
        Ok(())
    }
}

/// A change to a link for [`Rtnl::set_link`]; `None` fields are left alone.
#[derive(Debug, Default, Clone, Copy)]
pub struct LinkChange {
    pub up: Option<bool>,
    pub controller: Option<u32>,
    pub mtu: Option<u32>,
    pub mac: Option<[u8; 6]>,
}

/// The netmask of an IPv4 prefix length, as a host-order `u32`.
pub fn prefix_mask(prefix_len: u8) -> u32 {
    match prefix_len {
        0 => 0,
        p if p >= 32 => u32::MAX,
        p => u32::MAX << (32 - u32::from(p)),
    }
}

fn to_link(l: &LinkMessage) -> Link {
    let mut link = Link {
        index: l.header.index,
        name: String::new(),
        mac: None,
        mtu: None,
        controller: None,
        up: l.header.flags.contains(LinkFlags::Up),
    };
    for attr in &l.attributes {
        match attr {
            LinkAttribute::IfName(n) => link.name = n.clone(),
            LinkAttribute::Address(a) if a.len() == 6 => {
                let mut m = [0u8; 6];
                m.copy_from_slice(a);
                link.mac = Some(m);
            }
            LinkAttribute::Mtu(m) => link.mtu = Some(*m),
            LinkAttribute::Controller(c) if *c != 0 => link.controller = Some(*c),
            _ => {}
        }
    }
    link
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks() {
        assert_eq!(prefix_mask(0), 0);
        assert_eq!(prefix_mask(24), 0xffff_ff00);
        assert_eq!(prefix_mask(32), u32::MAX);
        assert_eq!(prefix_mask(40), u32::MAX);
        assert_eq!(prefix_mask(1), 0x8000_0000);
    }
}
