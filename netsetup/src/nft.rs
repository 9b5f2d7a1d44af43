//! nftables over nf_tables netlink (`NETLINK_NETFILTER`), encoded here: no C library and no
//! `nft` process. Only what the masquerade binding needs: an `ip` table with NAT and filter
//! base chains and rules built from `meta`, `payload`, `cmp` (`==`, `!=`), `immediate` (data
//! and verdicts) and `nat` expressions, applied as one transaction (batch); deleting a table;
//! listing table names.
//!
//! Everything acts in the network namespace of the thread that calls it (each call opens its
//! own socket).

use std::fmt;
use std::io;
use std::net::Ipv4Addr;
use std::time::Duration;

use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};

/// Errors of the nftables layer.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("nf_tables netlink socket: {0}")]
    Socket(#[source] io::Error),
    #[error("nf_tables {what}: {source}")]
    Request {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("nf_tables reply to {0} is malformed")]
    Malformed(String),
}

type Result<T> = std::result::Result<T, NftError>;

// linux/netfilter/nfnetlink.h, nf_tables.h, netfilter.h
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 16;
const NFNL_MSG_BATCH_END: u16 = 17;
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_GETTABLE: u16 = 1;
const NFT_MSG_DELTABLE: u16 = 2;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_NEWRULE: u16 = 6;
const NFPROTO_IPV4: u8 = 2;

const NFTA_TABLE_NAME: u16 = 1;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_META_DREG: u16 = 1;
const NFTA_META_KEY: u16 = 2;
const NFTA_CMP_SREG: u16 = 1;
const NFTA_CMP_OP: u16 = 2;
const NFTA_CMP_DATA: u16 = 3;
const NFT_CMP_EQ: u32 = 0;
const NFT_CMP_NEQ: u32 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFT_REG_VERDICT: u32 = 0;
const NF_DROP: u32 = 0;
const NF_ACCEPT: u32 = 1;
const NFTA_PAYLOAD_DREG: u16 = 1;
const NFTA_PAYLOAD_BASE: u16 = 2;
const NFTA_PAYLOAD_OFFSET: u16 = 3;
const NFTA_PAYLOAD_LEN: u16 = 4;
const NFTA_IMMEDIATE_DREG: u16 = 1;
const NFTA_IMMEDIATE_DATA: u16 = 2;
const NFTA_NAT_TYPE: u16 = 1;
const NFTA_NAT_FAMILY: u16 = 2;
const NFTA_NAT_REG_ADDR_MIN: u16 = 3;
const NFT_REG_1: u32 = 1;

const NLA_F_NESTED: u16 = 1 << 15;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;

/// Netfilter hooks (`enum nf_inet_hooks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    Prerouting = 0,
    Input = 1,
    Forward = 2,
    Output = 3,
    Postrouting = 4,
}

/// `meta` keys used here (`enum nft_meta_keys`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaKey {
    IifName = 6,
    OifName = 7,
    L4Proto = 16,
}

/// Payload bases (`enum nft_payload_bases`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadBase {
    Network = 1,
    Transport = 2,
}

/// NAT kinds (`enum nft_nat_types`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NatKind {
    Snat = 0,
    Dnat = 1,
}

/// What a rule decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Accept,
    Drop,
}

/// The type of a base chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainType {
    Nat,
    Filter,
}

/// One rule expression; every data expression uses register 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    /// Load a meta value into register 1.
    Meta(MetaKey),
    /// Load `len` bytes at `offset` of a header into register 1.
    Payload {
        base: PayloadBase,
        offset: u32,
        len: u32,
    },
    /// Continue only if register 1 equals the bytes.
    CmpEq(Vec<u8>),
    /// Continue only if register 1 differs from the bytes.
    CmpNeq(Vec<u8>),
    /// End the rule with this verdict.
    Verdict(Verdict),
    /// Put the bytes into register 1.
    Immediate(Vec<u8>),
    /// IPv4 NAT to the address in register 1.
    Nat(NatKind),
}

impl Expr {
    /// `meta iifname/oifname == name` (interface names compare as 16 NUL-padded bytes).
    pub fn ifname_eq(key: MetaKey, name: &str) -> [Expr; 2] {
        let mut b = vec![0u8; libc::IFNAMSIZ];
        let n = name.len().min(libc::IFNAMSIZ - 1);
        b[..n].copy_from_slice(&name.as_bytes()[..n]);
        [Expr::Meta(key), Expr::CmpEq(b)]
    }
    /// `ip saddr != a`.
    pub fn ip_saddr_neq(a: Ipv4Addr) -> [Expr; 2] {
        [
            Expr::Payload {
                base: PayloadBase::Network,
                offset: 12,
                len: 4,
            },
            Expr::CmpNeq(a.octets().to_vec()),
        ]
    }
    /// `ip saddr == a` (`src = true`) or `ip daddr == a`.
    pub fn ip_addr_eq(src: bool, a: Ipv4Addr) -> [Expr; 2] {
        [
            Expr::Payload {
                base: PayloadBase::Network,
                offset: if src { 12 } else { 16 },
                len: 4,
            },
            Expr::CmpEq(a.octets().to_vec()),
        ]
    }
    /// `meta l4proto == proto` and `th dport == port`.
    pub fn dport_eq(proto: u8, port: u16) -> [Expr; 4] {
        [
            Expr::Meta(MetaKey::L4Proto),
            Expr::CmpEq(vec![proto]),
            Expr::Payload {
                base: PayloadBase::Transport,
                offset: 2,
                len: 2,
            },
            Expr::CmpEq(port.to_be_bytes().to_vec()),
        ]
    }
    /// `snat|dnat to a`.
    pub fn nat_to(kind: NatKind, a: Ipv4Addr) -> [Expr; 2] {
        [Expr::Immediate(a.octets().to_vec()), Expr::Nat(kind)]
    }
}

/// A base chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    pub name: String,
    pub kind: ChainType,
    pub hook: Hook,
    pub priority: i32,
}

/// A rule in a chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub chain: String,
    pub exprs: Vec<Expr>,
}

/// An `ip` family table with base chains and their rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub name: String,
    pub chains: Vec<Chain>,
    pub rules: Vec<Rule>,
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Meta(k) => write!(f, "meta {k:?} => r1"),
            Expr::Payload { base, offset, len } => {
                write!(f, "payload {base:?} @{offset}/{len} => r1")
            }
            Expr::CmpEq(d) => write!(f, "cmp r1 == {d:02x?}"),
            Expr::CmpNeq(d) => write!(f, "cmp r1 != {d:02x?}"),
            Expr::Verdict(v) => write!(f, "{v:?}"),
            Expr::Immediate(d) => write!(f, "immediate {d:02x?} => r1"),
            Expr::Nat(k) => write!(f, "{k:?} to r1"),
        }
    }
}

/// Appends a netlink attribute (payload padded to 4 bytes).
fn attr(buf: &mut Vec<u8>, ty: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(buf.len().next_multiple_of(4), 0);
}

fn attr_str(buf: &mut Vec<u8>, ty: u16, s: &str) {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    attr(buf, ty, &v);
}

fn attr_u32(buf: &mut Vec<u8>, ty: u16, v: u32) {
    attr(buf, ty, &v.to_be_bytes());
}

/// Appends a nested attribute whose content `f` writes.
fn nested(buf: &mut Vec<u8>, ty: u16, f: impl FnOnce(&mut Vec<u8>)) {
    let mut inner = Vec::new();
    f(&mut inner);
    attr(buf, ty | NLA_F_NESTED, &inner);
}

fn data_value(buf: &mut Vec<u8>, ty: u16, d: &[u8]) {
    nested(buf, ty, |b| attr(b, NFTA_DATA_VALUE, d));
}

/// The `NFTA_EXPR_NAME` and `NFTA_EXPR_DATA` of an expression.
fn encode_expr(e: &Expr, b: &mut Vec<u8>) {
    let name = match e {
        Expr::Meta(_) => "meta",
        Expr::Payload { .. } => "payload",
        Expr::CmpEq(_) | Expr::CmpNeq(_) => "cmp",
        Expr::Immediate(_) | Expr::Verdict(_) => "immediate",
        Expr::Nat(_) => "nat",
    };
    attr_str(b, NFTA_EXPR_NAME, name);
    nested(b, NFTA_EXPR_DATA, |d| match e {
        Expr::Meta(k) => {
            attr_u32(d, NFTA_META_DREG, NFT_REG_1);
            attr_u32(d, NFTA_META_KEY, *k as u32);
        }
        Expr::Payload { base, offset, len } => {
            attr_u32(d, NFTA_PAYLOAD_DREG, NFT_REG_1);
            attr_u32(d, NFTA_PAYLOAD_BASE, *base as u32);
            attr_u32(d, NFTA_PAYLOAD_OFFSET, *offset);
            attr_u32(d, NFTA_PAYLOAD_LEN, *len);
        }
        Expr::CmpEq(v) | Expr::CmpNeq(v) => {
            let op = if matches!(e, Expr::CmpEq(_)) {
                NFT_CMP_EQ
            } else {
                NFT_CMP_NEQ
            };
            attr_u32(d, NFTA_CMP_SREG, NFT_REG_1);
            attr_u32(d, NFTA_CMP_OP, op);
            data_value(d, NFTA_CMP_DATA, v);
        }
        Expr::Verdict(v) => {
            let code = match v {
                Verdict::Accept => NF_ACCEPT,
                Verdict::Drop => NF_DROP,
            };
            attr_u32(d, NFTA_IMMEDIATE_DREG, NFT_REG_VERDICT);
            nested(d, NFTA_IMMEDIATE_DATA, |x| {
                nested(x, NFTA_DATA_VERDICT, |v| {
                    attr_u32(v, NFTA_VERDICT_CODE, code)
                })
            });
        }
        Expr::Immediate(v) => {
            attr_u32(d, NFTA_IMMEDIATE_DREG, NFT_REG_1);
            data_value(d, NFTA_IMMEDIATE_DATA, v);
        }
        Expr::Nat(k) => {
            attr_u32(d, NFTA_NAT_TYPE, *k as u32);
            attr_u32(d, NFTA_NAT_FAMILY, u32::from(NFPROTO_IPV4));
            attr_u32(d, NFTA_NAT_REG_ADDR_MIN, NFT_REG_1);
        }
    });
}

/// Builds netlink messages: header + `nfgenmsg` + attributes.
struct Msgs {
    buf: Vec<u8>,
    seq: u32,
    acked: Vec<u32>,
}

impl Msgs {
    fn new(seq: u32) -> Self {
        Self {
            buf: Vec::new(),
            seq,
            acked: Vec::new(),
        }
    }

    fn push(&mut self, ty: u16, flags: u16, family: u8, res_id: u16, attrs: &[u8]) {
        self.seq = self.seq.wrapping_add(1);
        if flags & NLM_F_ACK != 0 {
            self.acked.push(self.seq);
        }
        let len = 16 + 4 + attrs.len();
        self.buf.extend_from_slice(&(len as u32).to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(&flags.to_ne_bytes());
        self.buf.extend_from_slice(&self.seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.push(family);
        self.buf.push(0); // NFNETLINK_V0
        self.buf.extend_from_slice(&res_id.to_be_bytes());
        self.buf.extend_from_slice(attrs);
    }

    fn nft(&mut self, msg: u16, flags: u16, attrs: &[u8]) {
        self.push(
            (NFNL_SUBSYS_NFTABLES << 8) | msg,
            NLM_F_REQUEST | NLM_F_ACK | flags,
            NFPROTO_IPV4,
            0,
            attrs,
        );
    }

    /// Wraps the messages pushed by `f` in a BATCH_BEGIN/BATCH_END transaction.
    fn batch(seq: u32, f: impl FnOnce(&mut Msgs)) -> Msgs {
        let mut m = Msgs::new(seq);
        m.push(
            NFNL_MSG_BATCH_BEGIN,
            NLM_F_REQUEST,
            0,
            NFNL_SUBSYS_NFTABLES,
            &[],
        );
        f(&mut m);
        m.push(
            NFNL_MSG_BATCH_END,
            NLM_F_REQUEST,
            0,
            NFNL_SUBSYS_NFTABLES,
            &[],
        );
        m
    }
}

fn table_msgs(t: &Table, m: &mut Msgs) {
    let mut a = Vec::new();
    attr_str(&mut a, NFTA_TABLE_NAME, &t.name);
    m.nft(NFT_MSG_NEWTABLE, NLM_F_CREATE, &a);
    for c in &t.chains {
        let mut a = Vec::new();
        attr_str(&mut a, NFTA_CHAIN_TABLE, &t.name);
        attr_str(&mut a, NFTA_CHAIN_NAME, &c.name);
        nested(&mut a, NFTA_CHAIN_HOOK, |h| {
            attr_u32(h, NFTA_HOOK_HOOKNUM, c.hook as u32);
            attr_u32(h, NFTA_HOOK_PRIORITY, c.priority as u32);
        });
        let kind = match c.kind {
            ChainType::Nat => "nat",
            ChainType::Filter => "filter",
        };
        attr_str(&mut a, NFTA_CHAIN_TYPE, kind);
        m.nft(NFT_MSG_NEWCHAIN, NLM_F_CREATE, &a);
    }
    for r in &t.rules {
        let mut a = Vec::new();
        attr_str(&mut a, NFTA_RULE_TABLE, &t.name);
        attr_str(&mut a, NFTA_RULE_CHAIN, &r.chain);
        nested(&mut a, NFTA_RULE_EXPRESSIONS, |l| {
            for e in &r.exprs {
                nested(l, NFTA_LIST_ELEM, |x| encode_expr(e, x));
            }
        });
        m.nft(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, &a);
    }
}

fn open() -> Result<Socket> {
    let mut s = Socket::new(NETLINK_NETFILTER).map_err(NftError::Socket)?;
    s.bind_auto().map_err(NftError::Socket)?;
    s.connect(&SocketAddr::new(0, 0))
        .map_err(NftError::Socket)?;
    let tv = libc::timeval {
        tv_sec: Duration::from_secs(5).as_secs() as libc::time_t,
        tv_usec: 0,
    };
    // SAFETY: setsockopt reads one timeval that lives across the call.
    let r = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&s),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(NftError::Socket(io::Error::last_os_error()));
    }
    Ok(s)
}

/// One received netlink message: (type, seq, payload).
fn parse_msgs(buf: &[u8]) -> Option<Vec<(u16, u32, &[u8])>> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + 16 <= buf.len() {
        let len = u32::from_ne_bytes(buf[off..off + 4].try_into().ok()?) as usize;
        if len < 16 || off + len > buf.len() {
            return None;
        }
        let ty = u16::from_ne_bytes(buf[off + 4..off + 6].try_into().ok()?);
        let seq = u32::from_ne_bytes(buf[off + 8..off + 12].try_into().ok()?);
        out.push((ty, seq, &buf[off + 16..off + len]));
        off += len.next_multiple_of(4);
    }
    Some(out)
}

/// Sends messages and waits for every requested ACK (or the first error).
fn transact(what: &str, m: Msgs) -> Result<()> {
    let sock = open()?;
    let req = |source| NftError::Request {
        what: what.to_string(),
        source,
    };
    sock.send(&m.buf, 0).map_err(req)?;
    let mut pending = m.acked;
    let mut buf = Vec::with_capacity(1 << 16);
    // Bounded: one datagram per ACK at most, plus slack.
    for _ in 0..pending.len() + 64 {
        if pending.is_empty() {
            return Ok(());
        }
        buf.clear();
        sock.recv(&mut buf, 0).map_err(req)?;
        for (ty, seq, payload) in
            parse_msgs(&buf).ok_or_else(|| NftError::Malformed(what.to_string()))?
        {
            if ty != NLMSG_ERROR {
                continue;
            }
            let code = payload
                .get(..4)
                .and_then(|b| b.try_into().ok())
                .map(i32::from_ne_bytes)
                .ok_or_else(|| NftError::Malformed(what.to_string()))?;
            if code != 0 {
                return Err(req(io::Error::from_raw_os_error(-code)));
            }
            pending.retain(|s| *s != seq);
        }
    }
    if pending.is_empty() {
        Ok(())
    } else {
        Err(NftError::Malformed(what.to_string()))
    }
}

/// Creates the table with its chains and rules in one transaction (all or nothing).
pub fn apply(t: &Table) -> Result<()> {
    let m = Msgs::batch(0, |m| table_msgs(t, m));
    transact(&format!("add table ip {}", t.name), m)
}

/// Deletes an `ip` table with everything in it.
pub fn delete_table(name: &str) -> Result<()> {
    let mut a = Vec::new();
    attr_str(&mut a, NFTA_TABLE_NAME, name);
    let m = Msgs::batch(0, |m| m.nft(NFT_MSG_DELTABLE, 0, &a));
    transact(&format!("delete table ip {name}"), m)
}

/// Names of the `ip` family tables of the calling thread's network namespace.
pub fn ip_tables() -> Result<Vec<String>> {
    let what = "list tables";
    let sock = open()?;
    let mut m = Msgs::new(0);
    m.push(
        (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETTABLE,
        NLM_F_REQUEST | NLM_F_DUMP,
        NFPROTO_IPV4,
        0,
        &[],
    );
    let req = |source| NftError::Request {
        what: what.to_string(),
        source,
    };
    sock.send(&m.buf, 0).map_err(req)?;
    let mut names = Vec::new();
    let mut buf = Vec::with_capacity(1 << 16);
    for _ in 0..10_000 {
        buf.clear();
        sock.recv(&mut buf, 0).map_err(req)?;
        for (ty, _, payload) in
            parse_msgs(&buf).ok_or_else(|| NftError::Malformed(what.to_string()))?
        {
            match ty {
                NLMSG_DONE => return Ok(names),
                NLMSG_ERROR => {
                    let code = payload
                        .get(..4)
                        .and_then(|b| b.try_into().ok())
                        .map(i32::from_ne_bytes)
                        .unwrap_or(0);
                    return if code == 0 {
                        Ok(names)
                    } else {
                        Err(req(io::Error::from_raw_os_error(-code)))
                    };
                }
                t if t == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWTABLE => {
                    // nfgenmsg, then attributes.
                    let mut off = 4;
                    while off + 4 <= payload.len() {
                        let len = usize::from(u16::from_ne_bytes([payload[off], payload[off + 1]]));
                        let aty = u16::from_ne_bytes([payload[off + 2], payload[off + 3]]);
                        if len < 4 || off + len > payload.len() {
                            break;
                        }
                        if aty & !NLA_F_NESTED == NFTA_TABLE_NAME {
                            let v = &payload[off + 4..off + len];
                            let v = v.split(|b| *b == 0).next().unwrap_or(v);
                            names.push(String::from_utf8_lossy(v).into_owned());
                        }
                        off += len.next_multiple_of(4);
                    }
                }
                _ => {}
            }
        }
    }
    Err(NftError::Malformed(what.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_padded_and_nested() {
        let mut b = Vec::new();
        attr_str(&mut b, 1, "nat");
        assert_eq!(b, [8, 0, 1, 0, b'n', b'a', b't', 0]);
        let mut b = Vec::new();
        attr_str(&mut b, 3, "eth0");
        assert_eq!(b.len(), 12, "4 + 5 bytes padded to 12");
        let mut b = Vec::new();
        data_value(&mut b, NFTA_CMP_DATA, &[10, 0, 2, 2]);
        assert_eq!(b, [12, 0, 3, 0x80, 8, 0, 1, 0, 10, 0, 2, 2]);
    }

    #[test]
    fn meta_expression_encoding() {
        let mut b = Vec::new();
        encode_expr(&Expr::Meta(MetaKey::IifName), &mut b);
        #[rustfmt::skip]
        let want = [
            9, 0, 1, 0, b'm', b'e', b't', b'a', 0, 0, 0, 0, // NFTA_EXPR_NAME "meta"
            20, 0, 2, 0x80,                                  // NFTA_EXPR_DATA (nested)
            8, 0, 1, 0, 0, 0, 0, 1,                          //   DREG = 1 (big endian)
            8, 0, 2, 0, 0, 0, 0, 6,                          //   KEY = iifname
        ];
        assert_eq!(b, want);
    }

    #[test]
    fn batch_framing() {
        let t = Table {
            name: "t".into(),
            chains: vec![Chain {
                name: "pre".into(),
                kind: ChainType::Nat,
                hook: Hook::Prerouting,
                priority: -100,
            }],
            rules: vec![],
        };
        let m = Msgs::batch(0, |m| table_msgs(&t, m));
        let msgs = parse_msgs(&m.buf).unwrap();
        let types: Vec<u16> = msgs.iter().map(|(t, _, _)| *t).collect();
        assert_eq!(types, vec![16, 0x0a00, 0x0a03, 17]);
        // Batch begin names the nf_tables subsystem (res_id, big endian).
        assert_eq!(msgs[0].2, &[0, 0, 0, 10]);
        // Only the table and chain ask for ACKs.
        assert_eq!(m.acked, vec![2, 3]);
        // The chain's priority is a big-endian two's complement u32.
        let chain = msgs[2].2;
        let prio = (-100i32 as u32).to_be_bytes();
        assert!(chain.windows(4).any(|w| w == prio));
    }

    #[test]
    fn neq_and_verdict_encoding() {
        let mut b = Vec::new();
        encode_expr(&Expr::CmpNeq(vec![10, 0, 2, 2]), &mut b);
        #[rustfmt::skip]
        let want = [
            8, 0, 1, 0, b'c', b'm', b'p', 0,                // NFTA_EXPR_NAME "cmp"
            32, 0, 2, 0x80,                                  // NFTA_EXPR_DATA (nested)
            8, 0, 1, 0, 0, 0, 0, 1,                          //   SREG = 1
            8, 0, 2, 0, 0, 0, 0, 1,                          //   OP = NEQ
            12, 0, 3, 0x80, 8, 0, 1, 0, 10, 0, 2, 2,         //   DATA { VALUE }
        ];
        assert_eq!(b, want);
        let mut b = Vec::new();
        encode_expr(&Expr::Verdict(Verdict::Drop), &mut b);
        #[rustfmt::skip]
        let want = [
            14, 0, 1, 0, b'i', b'm', b'm', b'e', b'd', b'i', b'a', b't', b'e', 0, 0, 0,
            28, 0, 2, 0x80,                                  // NFTA_EXPR_DATA (nested)
            8, 0, 1, 0, 0, 0, 0, 0,                          //   DREG = verdict
            16, 0, 2, 0x80,                                  //   DATA (nested)
            12, 0, 2, 0x80,                                  //     VERDICT (nested)
            8, 0, 1, 0, 0, 0, 0, 0,                          //       CODE = NF_DROP
        ];
        assert_eq!(b, want);
    }

    #[test]
    fn helpers() {
        let [m, c] = Expr::ifname_eq(MetaKey::OifName, "eth0");
        assert_eq!(m, Expr::Meta(MetaKey::OifName));
        assert_eq!(c, Expr::CmpEq(b"eth0\0\0\0\0\0\0\0\0\0\0\0\0".to_vec()));
        let [p, c] = Expr::ip_addr_eq(true, Ipv4Addr::new(10, 0, 2, 2));
        assert_eq!(
            p,
            Expr::Payload {
                base: PayloadBase::Network,
                offset: 12,
                len: 4
            }
        );
        assert_eq!(c, Expr::CmpEq(vec![10, 0, 2, 2]));
        let d = Expr::dport_eq(6, 8080);
        assert_eq!(d[1], Expr::CmpEq(vec![6]));
        assert_eq!(d[3], Expr::CmpEq(vec![0x1f, 0x90]));
        assert_eq!(parse_msgs(&[1, 2, 3]).unwrap(), vec![]);
        assert!(parse_msgs(&[200, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).is_none());
    }
}
