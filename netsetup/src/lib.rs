//! Pod network bindings for `virt-launcher`, configured from Rust: links and addresses through
//! rtnetlink ([`rtnl`]), NAT through nf_tables netlink ([`nft`], encoded here), a built-in
//! DHCP server ([`dhcp`]) and a persistent TAP ([`tap`]) that the VMM opens by name.
//!
//! Call [`setup_pod_network`] in the pod's network namespace (the launcher runs there; tests
//! call it from a thread that entered a namespace). It returns a [`NetSetup`]: the TAP name and
//! guest MAC for the VMM's `NetConfig`, the [`Lease`] the DHCP server hands out, and the
//! teardown. Dropping it (or [`NetSetup::teardown`]) stops the DHCP server and removes every
//! link, address, rule and sysctl change it made.
//!
//! Bindings (KubeVirt semantics):
//! - [`Binding::Masquerade`]: bridge `k6t-eth0` with 10.0.2.1/24, the TAP enslaved to it, DHCP
//!   gives the guest 10.0.2.2/24, router 10.0.2.1 and the pod's DNS. nftables table
//!   `ip microvirt_<tap>`: DNAT of traffic arriving on the pod interface for the pod IP to
//!   10.0.2.2 (all of it, or only the listed TCP/UDP ports), SNAT of the guest's traffic leaving
//!   through the pod interface to the pod IP; `net.ipv4.ip_forward=1`.
//! - [`Binding::Bridge`]: the pod interface's IPv4 address and default route are removed from
//!   it and it is enslaved to `k6t-eth0` together with the TAP; it gets a new random MAC and the
//!   guest gets its original one (unless a MAC is given) plus, by DHCP, the pod IP, prefix and
//!   gateway. The bridge has only the link-local 169.254.75.10/32 for the DHCP server.
//!   Teardown restores address, MAC and default route.
//!
//! Requirements at run time: CAP_NET_ADMIN in the namespace, CAP_NET_BIND_SERVICE (or
//! `net.ipv4.ip_unprivileged_port_start=0`) for the DHCP server's port 67, `/dev/net/tun`;
//! no C library and no external program. Writing
//! `/proc/sys/net/ipv4/ip_forward` needs a writable `/proc/sys`; when it is read-only the
//! setup succeeds only if forwarding is already on.

pub mod dhcp;
pub mod netns;
pub mod nft;
pub mod resolv;
pub mod rtnl;
pub mod tap;

use std::fmt;
use std::fs::File;
use std::net::Ipv4Addr;
use std::path::PathBuf;

pub use dhcp::Lease;

use rtnl::{LinkChange, Rtnl};

/// Name of the bridge in the pod (as KubeVirt's).
pub const BRIDGE_NAME: &str = "k6t-eth0";
/// Masquerade: the bridge's (gateway's) address.
pub const MASQ_GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 1);
/// Masquerade: the guest's address.
pub const MASQ_GUEST: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);
/// Masquerade: prefix length of the guest subnet.
pub const MASQ_PREFIX: u8 = 24;
/// Bridge binding: the bridge's link-local address (DHCP server identifier).
pub const BRIDGE_DHCP_ADDR: Ipv4Addr = Ipv4Addr::new(169, 254, 75, 10);
/// DHCP lease time handed out (the server keeps running, so renewals succeed).
pub const LEASE_SECS: u32 = 86_400;

const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";

/// Errors of [`setup_pod_network`] and [`NetSetup::teardown`].
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error(transparent)]
    Rtnl(#[from] rtnl::RtnlError),
    #[error(transparent)]
    Nft(#[from] nft::NftError),
    #[error(transparent)]
    Tap(#[from] tap::TapError),
    #[error(transparent)]
    Dhcp(#[from] dhcp::DhcpError),
    #[error("pod interface {0} has no IPv4 address")]
    NoPodAddress(String),
    #[error("{BRIDGE_NAME} or the TAP {0} already exists in this network namespace")]
    AlreadySetUp(String),
    #[error("bridge binding needs a default route through {0}")]
    NoDefaultRoute(String),
    #[error(
        "IPv4 forwarding is off in this network namespace and /proc/sys is read-only: the node \
         needs net.ipv4.ip_forward=1 (new namespaces inherit it) or a CNI plugin that sets it \
         in the pod"
    )]
    ForwardingOff,
    #[error("{path}: {source}")]
    Sysctl {
        path: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("network namespace: {0}")]
    Netns(#[source] std::io::Error),
    #[error("teardown incomplete: {0}")]
    Teardown(String),
    #[error("the DHCP server is not waiting to be started")]
    DhcpNotBound,
}

/// Result of this crate.
pub type Result<T> = std::result::Result<T, NetError>;

/// How the guest is connected to the pod network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    /// NAT behind the pod IP (the default).
    Masquerade,
    /// The pod interface bridged to the guest; the guest takes the pod IP.
    Bridge,
}

/// Transport protocol of a forwarded port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Tcp,
    Udp,
}

/// A port forwarded to the guest (masquerade).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortForward {
    pub protocol: Protocol,
    pub port: u16,
}

/// The guest NIC's MAC address: the workspace's one MAC type (`microvirt_crds::mac`).
pub use microvirt_crds::mac::{MacAddr, MacParseError};

/// A random locally administered unicast MAC address (`x2:..`).
pub fn random_local_mac() -> MacAddr {
    let mut b = [0u8; 6];
    // SAFETY: getrandom writes at most `b.len()` bytes into `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        // Practically unreachable; fall back to time and pid, still locally administered.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0) as u64
            ^ u64::from(std::process::id());
        b.copy_from_slice(&t.to_le_bytes()[..6]);
    }
    MacAddr::locally_administered(b)
}

/// What to set up, from the VMI's interface (and the pod).
#[derive(Debug, Clone)]
pub struct InterfaceSpec {
    /// The pod's interface (default `eth0`).
    pub pod_interface: String,
    /// Name of the TAP to create for the VMM (default `tap0`).
    pub tap_name: String,
    /// Guest MAC (`macAddress`); default: random (masquerade) or the pod interface's (bridge).
    pub mac: Option<MacAddr>,
    /// Masquerade: forward only these ports (empty = everything addressed to the pod IP).
    pub ports: Vec<PortForward>,
    /// Host name handed to the guest by DHCP (the VMI name).
    pub hostname: Option<String>,
    /// The pod's resolver configuration (default `/etc/resolv.conf`).
    pub resolv_conf: PathBuf,
}

impl Default for InterfaceSpec {
    fn default() -> Self {
        Self {
            pod_interface: "eth0".into(),
            tap_name: "tap0".into(),
            mac: None,
            ports: Vec::new(),
            hostname: None,
            resolv_conf: PathBuf::from("/etc/resolv.conf"),
        }
    }
}

/// One thing to undo, in reverse order of creation.
#[derive(Debug)]
enum Undo {
    DelLink {
        index: u32,
        name: String,
    },
    DelNftTable(String),
    RestoreIpForward(String),
    /// Bridge binding: give the pod interface back its MAC, address and default route.
    RestorePodIface {
        index: u32,
        mac: Option<[u8; 6]>,
        addr: (Ipv4Addr, u8),
        gateway: Ipv4Addr,
    },
}

/// A configured pod network. Drop (or [`NetSetup::teardown`]) removes it.
pub struct NetSetup {
    tap: String,
    mac: MacAddr,
    lease: Lease,
    pod_ip: Ipv4Addr,
    binding: Binding,
    rtnl: Rtnl,
    netns: File,
    undo: Vec<Undo>,
    dhcp: DhcpState,
    undo_on_drop: bool,
}

/// The DHCP server of a [`NetSetup`].
enum DhcpState {
    None,
    /// Port 67 bound, not served yet ([`prepare_pod_network`]).
    Bound(dhcp::BoundDhcp),
    Running(dhcp::DhcpHandle),
}

impl DhcpState {
    /// Stops a running server and closes the socket.
    fn stop(&mut self) {
        if let DhcpState::Running(h) = self {
            h.stop();
        }
        *self = DhcpState::None;
    }
}

impl fmt::Debug for NetSetup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NetSetup")
            .field("tap", &self.tap)
            .field("mac", &self.mac)
            .field("lease", &self.lease)
            .field("pod_ip", &self.pod_ip)
            .field("binding", &self.binding)
            .field("undo", &self.undo)
            .finish()
    }
}

impl NetSetup {
    /// The TAP for the VMM (`NetConfig::tap`); open it with IFF_TAP|IFF_NO_PI|IFF_VNET_HDR.
    pub fn tap_name(&self) -> &str {
        &self.tap
    }
    /// The guest's MAC (`NetConfig::mac`).
    pub fn guest_mac(&self) -> MacAddr {
        self.mac
    }
    /// The lease the DHCP server hands the guest.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }
    /// The pod's IPv4 address (the VMI's `status.interfaces[0].ipAddress`).
    pub fn pod_ip(&self) -> Ipv4Addr {
        self.pod_ip
    }
    /// The binding that was set up.
    pub fn binding(&self) -> Binding {
        self.binding
    }

    /// Makes drop leave the configuration in place (the DHCP server still stops). For the
    /// launcher pod: the pod's network namespace disappears with the pod, and once the
    /// launcher has dropped CAP_NET_ADMIN an undo could not run anyway.
    /// [`NetSetup::teardown`] still undoes everything.
    pub fn keep_on_drop(&mut self) {
        self.undo_on_drop = false;
    }

    /// Stops the DHCP server and undoes every change; tries all steps and reports the failures.
    pub fn teardown(mut self) -> Result<()> {
        self.undo_all()
    }

    /// Starts the DHCP server of a network made by [`prepare_pod_network`]. `init` runs first
    /// on the server's thread (the launcher drops that thread's privileges there); the
    /// server only starts when it succeeds.
    pub fn start_dhcp(
        &mut self,
        init: impl FnOnce() -> std::result::Result<(), String> + Send + 'static,
    ) -> Result<()> {
        match std::mem::replace(&mut self.dhcp, DhcpState::None) {
            DhcpState::Bound(b) => {
                self.dhcp = DhcpState::Running(b.serve(init)?);
                Ok(())
            }
            other => {
                self.dhcp = other;
                Err(NetError::DhcpNotBound)
            }
        }
    }

    fn undo_all(&mut self) -> Result<()> {
        self.dhcp.stop();
        let mut failures = Vec::new();
        while let Some(step) = self.undo.pop() {
            if let Err(e) = undo_step(&mut self.rtnl, &self.netns, &step) {
                failures.push(format!("{step:?}: {e}"));
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(NetError::Teardown(failures.join("; ")))
        }
    }
}

impl Drop for NetSetup {
    fn drop(&mut self) {
        if !self.undo_on_drop {
            self.dhcp.stop();
            return;
        }
        if let Err(e) = self.undo_all() {
            log::warn!("pod network teardown: {e}");
        }
    }
}

fn undo_step(rtnl: &mut Rtnl, netns: &File, step: &Undo) -> Result<()> {
    match step {
        Undo::DelLink { index, name } => {
            // Only delete it if the index still names the link we made.
            if rtnl.link_by_name(name)?.is_some_and(|l| l.index == *index) {
                rtnl.del_link(*index)?;
            }
        }
        Undo::DelNftTable(table) => {
            netns::run_in(netns, || nft::delete_table(table)).map_err(NetError::Netns)??;
        }
        Undo::RestoreIpForward(old) => {
            let old = old.clone();
            netns::run_in(netns, move || std::fs::write(IP_FORWARD, old))
                .map_err(NetError::Netns)?
                .map_err(|source| NetError::Sysctl {
                    path: IP_FORWARD,
                    source,
                })?;
        }
        Undo::RestorePodIface {
            index,
            mac,
            addr,
            gateway,
        } => {
            rtnl.set_link(
                *index,
                &LinkChange {
                    up: Some(false),
                    controller: Some(0),
                    ..Default::default()
                },
            )?;
            if let Some(mac) = mac {
                rtnl.set_link(
                    *index,
                    &LinkChange {
                        mac: Some(*mac),
                        ..Default::default()
                    },
                )?;
            }
            rtnl.set_link(
                *index,
                &LinkChange {
                    up: Some(true),
                    ..Default::default()
                },
            )?;
            if !rtnl.ipv4_addrs(*index)?.contains(addr) {
                rtnl.add_addr(*index, addr.0, addr.1)?;
            }
            if rtnl.default_route_v4()?.is_none() {
                if !in_subnet(*gateway, addr.0, addr.1) {
                    rtnl.add_route_v4(*gateway, 32, None, *index)?;
                }
                rtnl.add_route_v4(Ipv4Addr::UNSPECIFIED, 0, Some(*gateway), *index)?;
            }
        }
    }
    Ok(())
}

fn in_subnet(ip: Ipv4Addr, net: Ipv4Addr, prefix_len: u8) -> bool {
    let m = rtnl::prefix_mask(prefix_len);
    u32::from(ip) & m == u32::from(net) & m
}

/// The nftables table name for a TAP (`microvirt_<tap>`, characters outside `[A-Za-z0-9_]`
/// replaced by `_`).
pub fn nft_table_name(tap: &str) -> String {
    let s: String = tap
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("microvirt_{s}")
}

/// The masquerade ruleset: table `ip <table>` with a `prerouting` NAT chain (priority -100)
/// that DNATs traffic arriving on `pod_iface` for the pod IP to the guest (only `ports` when
/// given, one rule per port), a `postrouting` NAT chain (priority 100) that SNATs the guest's
/// traffic leaving through `pod_iface` to the pod IP, and an `antispoof` filter chain
/// (prerouting, priority -300, before connection tracking) that drops what arrives from the
/// guest's bridge with another source address than the guest's (DHCP from 0.0.0.0 aside).
/// In nft syntax:
///
/// ```text
/// table ip microvirt_tap0 {
///   chain prerouting { type nat hook prerouting priority -100;
///     iifname "eth0" ip daddr POD_IP [meta l4proto tcp th dport 22] dnat to 10.0.2.2 }
///   chain postrouting { type nat hook postrouting priority 100;
///     ip saddr 10.0.2.2 oifname "eth0" snat to POD_IP }
///   chain antispoof { type filter hook prerouting priority -300;
///     iifname "k6t-eth0" ip saddr 0.0.0.0 meta l4proto udp th dport 67 accept
///     iifname "k6t-eth0" ip saddr != 10.0.2.2 drop }
/// }
/// ```
pub fn masquerade_ruleset(
    table: &str,
    pod_iface: &str,
    pod_ip: Ipv4Addr,
    guest_ip: Ipv4Addr,
    ports: &[PortForward],
) -> nft::Table {
    use nft::{Expr, MetaKey, NatKind};
    let inbound = |extra: &[Expr]| {
        let mut e: Vec<Expr> = Vec::new();
        e.extend(Expr::ifname_eq(MetaKey::IifName, pod_iface));
        e.extend(Expr::ip_addr_eq(false, pod_ip));
        e.extend_from_slice(extra);
        e.extend(Expr::nat_to(NatKind::Dnat, guest_ip));
        nft::Rule {
            chain: "prerouting".into(),
            exprs: e,
        }
    };
    let mut rules = Vec::new();
    if ports.is_empty() {
        rules.push(inbound(&[]));
    } else {
        let mut list: Vec<(u8, u16)> = ports
            .iter()
            .map(|p| {
                let proto = match p.protocol {
                    Protocol::Tcp => libc::IPPROTO_TCP as u8,
                    Protocol::Udp => libc::IPPROTO_UDP as u8,
                };
                (proto, p.port)
            })
            .collect();
        list.sort_unstable();
        list.dedup();
        for (proto, port) in list {
            rules.push(inbound(&Expr::dport_eq(proto, port)));
        }
    }
    let mut out: Vec<Expr> = Vec::new();
    out.extend(Expr::ip_addr_eq(true, guest_ip));
    out.extend(Expr::ifname_eq(MetaKey::OifName, pod_iface));
    out.extend(Expr::nat_to(NatKind::Snat, pod_ip));
    rules.push(nft::Rule {
        chain: "postrouting".into(),
        exprs: out,
    });
    // Anti-spoofing: what the guest sends must come from its own address (DHCP requests
    // from 0.0.0.0 aside), or it is dropped before connection tracking sees it.
    let mut dhcp: Vec<Expr> = Vec::new();
    dhcp.extend(Expr::ifname_eq(MetaKey::IifName, BRIDGE_NAME));
    dhcp.extend(Expr::ip_addr_eq(true, Ipv4Addr::UNSPECIFIED));
    dhcp.extend(Expr::dport_eq(libc::IPPROTO_UDP as u8, 67));
    dhcp.push(Expr::Verdict(nft::Verdict::Accept));
    let mut spoof: Vec<Expr> = Vec::new();
    spoof.extend(Expr::ifname_eq(MetaKey::IifName, BRIDGE_NAME));
    spoof.extend(Expr::ip_saddr_neq(guest_ip));
    spoof.push(Expr::Verdict(nft::Verdict::Drop));
    for exprs in [dhcp, spoof] {
        rules.push(nft::Rule {
            chain: "antispoof".into(),
            exprs,
        });
    }
    nft::Table {
        name: table.to_string(),
        chains: vec![
            nft::Chain {
                name: "prerouting".into(),
                kind: nft::ChainType::Nat,
                hook: nft::Hook::Prerouting,
                priority: -100,
            },
            nft::Chain {
                name: "postrouting".into(),
                kind: nft::ChainType::Nat,
                hook: nft::Hook::Postrouting,
                priority: 100,
            },
            nft::Chain {
                name: "antispoof".into(),
                kind: nft::ChainType::Filter,
                hook: nft::Hook::Prerouting,
                priority: -300,
            },
        ],
        rules,
    }
}

/// Sets up the pod network for one guest interface in the calling thread's network namespace
/// and starts the DHCP server.
///
/// On failure everything made so far is removed again.
pub fn setup_pod_network(binding: Binding, iface: &InterfaceSpec) -> Result<NetSetup> {
    let mut setup = prepare_pod_network(binding, iface)?;
    setup.start_dhcp(|| Ok(()))?;
    Ok(setup)
}

/// Like [`setup_pod_network`], but the DHCP server only binds its port (the part that needs
/// privileges); [`NetSetup::start_dhcp`] starts serving. The launcher starts it after it
/// dropped its capabilities, so the server thread never has any.
pub fn prepare_pod_network(binding: Binding, iface: &InterfaceSpec) -> Result<NetSetup> {
    let netns = netns::current().map_err(NetError::Netns)?;
    let mut rtnl = Rtnl::open()?;
    if rtnl.link_by_name(BRIDGE_NAME)?.is_some() || rtnl.link_by_name(&iface.tap_name)?.is_some() {
        return Err(NetError::AlreadySetUp(iface.tap_name.clone()));
    }
    let pod = rtnl.link(&iface.pod_interface)?;
    let (pod_ip, pod_prefix) = rtnl
        .ipv4_addrs(pod.index)?
        .into_iter()
        .next()
        .ok_or_else(|| NetError::NoPodAddress(iface.pod_interface.clone()))?;
    let mtu = pod.mtu.unwrap_or(1500);
    let dns = std::fs::read_to_string(&iface.resolv_conf)
        .map(|t| resolv::parse_resolv_conf(&t))
        .unwrap_or_else(|e| {
            log::warn!(
                "{}: {e}; the guest gets no DNS",
                iface.resolv_conf.display()
            );
            resolv::DnsConfig::default()
        });
    let mut setup = NetSetup {
        tap: iface.tap_name.clone(),
        mac: iface.mac.unwrap_or_else(random_local_mac),
        lease: Lease {
            ip: MASQ_GUEST,
            prefix_len: MASQ_PREFIX,
            router: Some(MASQ_GATEWAY),
            dns: dns.servers,
            search: dns.search,
            hostname: iface.hostname.clone(),
            mtu: u16::try_from(mtu).ok(),
            lease_secs: LEASE_SECS,
            routes: Vec::new(),
        },
        pod_ip,
        binding,
        rtnl,
        netns,
        undo: Vec::new(),
        dhcp: DhcpState::None,
        undo_on_drop: true,
    };
    // On error `setup` is dropped, which undoes what was recorded so far.
    match binding {
        Binding::Masquerade => setup_masquerade(&mut setup, iface, mtu)?,
        Binding::Bridge => setup_bridge(&mut setup, iface, &pod, (pod_ip, pod_prefix), mtu)?,
    }
    let server_ip = match binding {
        Binding::Masquerade => MASQ_GATEWAY,
        Binding::Bridge => BRIDGE_DHCP_ADDR,
    };
    setup.dhcp = DhcpState::Bound(dhcp::bind(
        BRIDGE_NAME,
        dhcp::DhcpServer {
            server_ip,
            client_mac: setup.mac.0,
            lease: setup.lease.clone(),
        },
    )?);
    log::info!(
        "pod network ({binding:?}): tap {} mac {} lease {}/{} pod ip {}",
        setup.tap,
        setup.mac,
        setup.lease.ip,
        setup.lease.prefix_len,
        setup.pod_ip
    );
    Ok(setup)
}

fn add_bridge_and_tap(s: &mut NetSetup, tap: &str, mtu: u32) -> Result<u32> {
    s.rtnl.add_bridge(BRIDGE_NAME, Some(mtu), None)?;
    let br = s.rtnl.link(BRIDGE_NAME)?;
    s.undo.push(Undo::DelLink {
        index: br.index,
        name: BRIDGE_NAME.into(),
    });
    tap::create_persistent_tap(tap)?;
    let t = s.rtnl.link(tap)?;
    s.undo.push(Undo::DelLink {
        index: t.index,
        name: tap.into(),
    });
    s.rtnl.set_link(
        t.index,
        &LinkChange {
            mtu: Some(mtu),
            controller: Some(br.index),
            ..Default::default()
        },
    )?;
    s.rtnl.set_link(
        t.index,
        &LinkChange {
            up: Some(true),
            ..Default::default()
        },
    )?;
    Ok(br.index)
}

fn setup_masquerade(s: &mut NetSetup, iface: &InterfaceSpec, mtu: u32) -> Result<()> {
    let br = add_bridge_and_tap(s, &iface.tap_name, mtu)?;
    s.rtnl.add_addr(br, MASQ_GATEWAY, MASQ_PREFIX)?;
    s.rtnl.set_link(
        br,
        &LinkChange {
            up: Some(true),
            ..Default::default()
        },
    )?;

    let old = std::fs::read_to_string(IP_FORWARD).map_err(|source| NetError::Sysctl {
        path: IP_FORWARD,
        source,
    })?;
    if old.trim() != "1" {
        std::fs::write(IP_FORWARD, "1").map_err(|source| match source.raw_os_error() {
            // An unprivileged container's /proc/sys is read-only: the namespace must come with
            // forwarding on (it inherits the node's net.ipv4.ip_forward).
            Some(libc::EROFS) => NetError::ForwardingOff,
            _ => NetError::Sysctl {
                path: IP_FORWARD,
                source,
            },
        })?;
        s.undo.push(Undo::RestoreIpForward(old.trim().to_string()));
    }

    let table = nft_table_name(&iface.tap_name);
    let rules = masquerade_ruleset(
        &table,
        &iface.pod_interface,
        s.pod_ip,
        MASQ_GUEST,
        &iface.ports,
    );
    nft::apply(&rules)?;
    s.undo.push(Undo::DelNftTable(table));
    Ok(())
}

fn setup_bridge(
    s: &mut NetSetup,
    iface: &InterfaceSpec,
    pod: &rtnl::Link,
    (pod_ip, prefix): (Ipv4Addr, u8),
    mtu: u32,
) -> Result<()> {
    let gateway = match s.rtnl.default_route_v4()? {
        Some((gw, oif)) if oif == pod.index => gw,
        _ => return Err(NetError::NoDefaultRoute(iface.pod_interface.clone())),
    };
    // The guest takes the pod interface's identity: its MAC (unless one is given), IP and
    // gateway; the pod interface becomes a plain bridge port with a new MAC.
    if iface.mac.is_none() {
        if let Some(m) = pod.mac {
            s.mac = MacAddr(m);
        }
    }
    s.lease.ip = pod_ip;
    s.lease.prefix_len = prefix;
    s.lease.router = Some(gateway);
    if !in_subnet(gateway, pod_ip, prefix) {
        s.lease.routes = vec![
            (gateway, 32, Ipv4Addr::UNSPECIFIED),
            (Ipv4Addr::UNSPECIFIED, 0, gateway),
        ];
    }
    s.undo.push(Undo::RestorePodIface {
        index: pod.index,
        mac: pod.mac,
        addr: (pod_ip, prefix),
        gateway,
    });
    s.rtnl.del_addr(pod.index, pod_ip, prefix)?;
    s.rtnl.set_link(
        pod.index,
        &LinkChange {
            up: Some(false),
            ..Default::default()
        },
    )?;
    s.rtnl.set_link(
        pod.index,
        &LinkChange {
            mac: Some(random_local_mac().0),
            ..Default::default()
        },
    )?;
    let br = add_bridge_and_tap(s, &iface.tap_name, mtu)?;
    s.rtnl.add_addr(br, BRIDGE_DHCP_ADDR, 32)?;
    s.rtnl.set_link(
        pod.index,
        &LinkChange {
            controller: Some(br),
            ..Default::default()
        },
    )?;
    for index in [pod.index, br] {
        s.rtnl.set_link(
            index,
            &LinkChange {
                up: Some(true),
                ..Default::default()
            },
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_local_macs_are_locally_administered_unicast_and_differ() {
        let (a, b) = (random_local_mac(), random_local_mac());
        assert_eq!(a.0[0] & 0x03, 0x02, "locally administered unicast");
        assert_eq!(b.0[0] & 0x03, 0x02, "locally administered unicast");
        assert_ne!(a, b, "two random addresses");
    }

    #[test]
    fn ruleset_all_ports() {
        use nft::{Expr, MetaKey, NatKind};
        let pod = Ipv4Addr::new(10, 244, 0, 5);
        let t = masquerade_ruleset("microvirt_tap0", "eth0", pod, MASQ_GUEST, &[]);
        assert_eq!(t.name, "microvirt_tap0");
        assert_eq!(t.chains.len(), 3);
        assert_eq!(
            (t.chains[2].kind, t.chains[2].hook, t.chains[2].priority),
            (nft::ChainType::Filter, nft::Hook::Prerouting, -300)
        );
        assert_eq!(
            (t.chains[0].hook, t.chains[0].priority),
            (nft::Hook::Prerouting, -100)
        );
        assert_eq!(
            (t.chains[1].hook, t.chains[1].priority),
            (nft::Hook::Postrouting, 100)
        );
        assert_eq!(t.rules.len(), 4);
        let mut want: Vec<Expr> = Vec::new();
        want.extend(Expr::ifname_eq(MetaKey::IifName, "eth0"));
        want.extend(Expr::ip_addr_eq(false, pod));
        want.extend(Expr::nat_to(NatKind::Dnat, MASQ_GUEST));
        assert_eq!(t.rules[0].chain, "prerouting");
        assert_eq!(t.rules[0].exprs, want);
        let mut want: Vec<Expr> = Vec::new();
        want.extend(Expr::ip_addr_eq(true, MASQ_GUEST));
        want.extend(Expr::ifname_eq(MetaKey::OifName, "eth0"));
        want.extend(Expr::nat_to(NatKind::Snat, pod));
        assert_eq!(t.rules[1].chain, "postrouting");
        assert_eq!(t.rules[1].exprs, want);
        let mut want: Vec<Expr> = Vec::new();
        want.extend(Expr::ifname_eq(MetaKey::IifName, BRIDGE_NAME));
        want.extend(Expr::ip_saddr_neq(MASQ_GUEST));
        want.push(Expr::Verdict(nft::Verdict::Drop));
        assert_eq!(t.rules[3].chain, "antispoof");
        assert_eq!(t.rules[3].exprs, want);
        assert_eq!(
            t.rules[2].exprs.last(),
            Some(&Expr::Verdict(nft::Verdict::Accept))
        );
    }

    #[test]
    fn ruleset_port_allow_list() {
        let p = |protocol, port| PortForward { protocol, port };
        let t = masquerade_ruleset(
            "t",
            "eth0",
            Ipv4Addr::new(10, 244, 0, 5),
            MASQ_GUEST,
            &[
                p(Protocol::Tcp, 8080),
                p(Protocol::Tcp, 22),
                p(Protocol::Tcp, 22),
                p(Protocol::Udp, 53),
            ],
        );
        // One DNAT rule per distinct port, then the SNAT rule and the two anti-spoofing rules.
        assert_eq!(t.rules.len(), 6);
        let ports: Vec<Vec<nft::Expr>> = t.rules[..3]
            .iter()
            .map(|r| r.exprs[4..8].to_vec())
            .collect();
        assert_eq!(
            ports,
            vec![
                nft::Expr::dport_eq(6, 22).to_vec(),
                nft::Expr::dport_eq(6, 8080).to_vec(),
                nft::Expr::dport_eq(17, 53).to_vec(),
            ]
        );
    }

    #[test]
    fn table_names_and_subnets() {
        assert_eq!(nft_table_name("tap0"), "microvirt_tap0");
        assert_eq!(nft_table_name("tap-x.1"), "microvirt_tap_x_1");
        assert!(in_subnet(Ipv4Addr::new(10, 0, 2, 1), MASQ_GUEST, 24));
        assert!(!in_subnet(
            Ipv4Addr::new(169, 254, 1, 1),
            Ipv4Addr::new(10, 244, 1, 7),
            32
        ));
    }
}
