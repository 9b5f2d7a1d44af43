//! Real network namespaces: a "node" netns, a "pod" netns whose eth0 is a veth to the node,
//! and a "VM" netns whose vm0 (a veth stand-in for the guest's virtio-net, carrying the guest
//! MAC) is either a port of the pod's k6t-eth0 bridge or connected through the real TAP by a
//! relay (see `attach_vm_via_tap`). `ip` builds only this fixture; the code under test
//! configures everything through netlink. Needs root, iproute2 and busybox (udhcpc).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use microvirt_testsupport::{ScratchNetns, TempDir};
use netsetup::{netns, Binding, InterfaceSpec, PortForward, Protocol};

const NODE_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 1);
const POD_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 2);
const GUEST_MAC: &str = "02:00:00:00:00:42";

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip")?;
    ensure!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Four scratch namespaces named after the test; deleted on drop.
struct Fixture {
    node: String,
    pod: String,
    vm: String,
    /// Holds relay0, the VM link's peer for the TAP relay: no addresses, so its kernel stack
    /// never answers the VM (which would bypass the TAP).
    wire: String,
    /// The namespaces named above (wire, vm, pod, node: deleted in that order).
    _netns: Vec<ScratchNetns>,
    dir: TempDir,
}

impl Fixture {
    /// The namespaces and the node↔pod veth, without addresses.
    fn bare(tag: &str) -> Result<Self> {
        let netns: Vec<ScratchNetns> = ["wire", "vm", "pod", "node"]
            .iter()
            .map(|role| ScratchNetns::new(&format!("{tag}-{role}")))
            .collect();
        let name = |i: usize| netns[i].name().to_string();
        let f = Fixture {
            node: name(3),
            pod: name(2),
            vm: name(1),
            wire: name(0),
            dir: TempDir::new(&format!("netsetup-{tag}")),
            _netns: netns,
        };
        for ns in [&f.node, &f.pod, &f.vm, &f.wire] {
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        ip(&[
            "link", "add", "eth0", "netns", &f.pod, "type", "veth", "peer", "name", "veth-pod",
            "netns", &f.node,
        ])?;
        ip(&["-n", &f.node, "link", "set", "veth-pod", "up"])?;
        ip(&["-n", &f.pod, "link", "set", "eth0", "up"])?;
        Ok(f)
    }

    /// Pod on a shared /24 with the node (192.168.77.2 via 192.168.77.1).
    fn new(tag: &str) -> Result<Self> {
        let f = Self::bare(tag)?;
        ip(&[
            "-n",
            &f.node,
            "addr",
            "add",
            "192.168.77.1/24",
            "dev",
            "veth-pod",
        ])?;
        ip(&[
            "-n",
            &f.pod,
            "addr",
            "add",
            "192.168.77.2/24",
            "dev",
            "eth0",
        ])?;
        ip(&[
            "-n",
            &f.pod,
            "route",
            "add",
            "default",
            "via",
            "192.168.77.1",
        ])?;
        Ok(f)
    }

    /// Calico-style pod: a /32 address and a gateway outside it (169.254.1.1, on-link).
    fn new_calico(tag: &str) -> Result<Self> {
        let f = Self::bare(tag)?;
        ip(&[
            "-n",
            &f.node,
            "addr",
            "add",
            "169.254.1.1/32",
            "dev",
            "veth-pod",
        ])?;
        ip(&[
            "-n",
            &f.node,
            "route",
            "add",
            "10.244.1.7/32",
            "dev",
            "veth-pod",
        ])?;
        ip(&["-n", &f.pod, "addr", "add", "10.244.1.7/32", "dev", "eth0"])?;
        ip(&[
            "-n",
            &f.pod,
            "route",
            "add",
            "169.254.1.1/32",
            "dev",
            "eth0",
            "scope",
            "link",
        ])?;
        ip(&[
            "-n",
            &f.pod,
            "route",
            "add",
            "default",
            "via",
            "169.254.1.1",
            "dev",
            "eth0",
        ])?;
        Ok(f)
    }

    fn path(ns: &str) -> PathBuf {
        Path::new("/run/netns").join(ns)
    }

    fn in_ns<T: Send>(&self, ns: &str, f: impl FnOnce() -> T + Send) -> Result<T> {
        Ok(netns::run_in_path(&Self::path(ns), f)?)
    }

    /// The guest stand-in: veth vm0 (guest MAC) in the VM netns, its peer a bridge port.
    fn attach_vm(&self, mac: &str) -> Result<()> {
        ip(&[
            "link", "add", "vm0", "netns", &self.vm, "address", mac, "type", "veth", "peer",
            "name", "vmport", "netns", &self.pod,
        ])?;
        ip(&["-n", &self.vm, "link", "set", "vm0", "up"])?;
        ip(&[
            "-n", &self.pod, "link", "set", "vmport", "master", "k6t-eth0", "up",
        ])?;
        Ok(())
    }

    /// The guest behind the real TAP: veth vm0 (guest MAC, VM netns) ↔ relay0 (a netns of its
    /// own, no addresses), and a relay thread moving frames between the TAP (opened in the pod
    /// netns with the VMM's flags) and relay0 (AF_PACKET with PACKET_VNET_HDR, so both sides
    /// speak virtio-net headers) — what the VMM's virtio-net device does between the TAP and
    /// the guest.
    fn attach_vm_via_tap(&self, mac: &str, tap: &str) -> Result<Relay> {
        ip(&[
            "link", "add", "vm0", "netns", &self.vm, "address", mac, "type", "veth", "peer",
            "name", "relay0", "netns", &self.wire,
        ])?;
        ip(&["-n", &self.vm, "link", "set", "vm0", "up"])?;
        ip(&[
            "-n", &self.wire, "link", "set", "relay0", "promisc", "on", "up",
        ])?;
        let tap = tap.to_string();
        let tapf = self.in_ns(&self.pod, move || attach_tap(&tap))??;
        let pkt = self.in_ns(&self.wire, || -> Result<_> {
            let index = netsetup::rtnl::Rtnl::open()?.link("relay0")?.index;
            packet_socket(index)
        })??;
        Ok(Relay::start(tapf, pkt))
    }

    /// Runs busybox udhcpc in the VM netns; its script records the lease and configures vm0.
    fn dhcp_client(&self) -> Result<HashMap<String, String>> {
        let script = self.dir.join("udhcpc.sh");
        let out = self.dir.join("lease.env");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\ncase \"$1\" in\nbound|renew)\n  env > {out}.tmp && mv {out}.tmp {out}\n  \
                 ip addr add \"$ip/$mask\" dev \"$interface\"\n  \
                 if [ -n \"$staticroutes\" ]; then\n    set -- $staticroutes\n    \
                 while [ $# -ge 2 ]; do\n      if [ \"$2\" = 0.0.0.0 ]; then ip route add \"$1\" dev \"$interface\"; \
                 else ip route add \"$1\" via \"$2\" dev \"$interface\"; fi\n      shift 2\n    done\n  \
                 else ip route add default via \"$router\"; fi\n  ;;\nesac\n",
                out = out.display()
            ),
        )?;
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        let st = Command::new("timeout")
            .args(["60", "ip", "netns", "exec", &self.vm, "busybox", "udhcpc"])
            .args([
                "-i",
                "vm0",
                "-f",
                "-q",
                "-n",
                "-t",
                "10",
                "-T",
                "1",
                "-x",
                "hostname:ignored",
            ])
            .arg("-s")
            .arg(&script)
            .status()
            .context("running busybox udhcpc")?;
        ensure!(st.success(), "udhcpc failed: {st}");
        let env = std::fs::read_to_string(&out).context("udhcpc script wrote no lease")?;
        Ok(env
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect())
    }

    fn links(&self, ns: &str) -> Result<Vec<netsetup::rtnl::Link>> {
        self.in_ns(ns, || -> Result<_> {
            Ok(netsetup::rtnl::Rtnl::open()?.links()?)
        })?
    }
}

/// A TCP server in `ns` on `addr` that answers each of up to `n` connections with
/// `"<tag> peer=<client ip>"`; stops after `n` connections or 20 s.
fn tcp_server(ns: &str, addr: SocketAddr, tag: &'static str, n: usize) -> Result<JoinHandle<()>> {
    let (tx, rx) = mpsc::channel();
    let path = Fixture::path(ns);
    let h = std::thread::spawn(move || {
        let l = netns::run_in_path(&path, || TcpListener::bind(addr));
        let l = match l {
            Ok(Ok(l)) => l,
            Ok(Err(e)) | Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
        };
        l.set_nonblocking(true).expect("nonblocking listener");
        let _ = tx.send(Ok(()));
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut served = 0;
        while served < n && Instant::now() < deadline {
            match l.accept() {
                Ok((mut s, peer)) => {
                    let _ = s.set_nonblocking(false);
                    let _ = write!(s, "{tag} peer={}", peer.ip());
                    served += 1;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(10))
        .context("server did not start")??;
    Ok(h)
}

/// Connects from `ns` to `addr` and returns what the server said.
fn tcp_client(ns: &str, addr: SocketAddr) -> Result<std::io::Result<String>> {
    netns::run_in_path(&Fixture::path(ns), || {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    })
    .map_err(Into::into)
}

fn ip_forward(fx: &Fixture) -> Result<String> {
    Ok(fx
        .in_ns(&fx.pod, || {
            std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward")
        })??
        .trim()
        .to_string())
}

fn resolv(fx: &Fixture) -> Result<PathBuf> {
    let p = fx.dir.join("resolv.conf");
    std::fs::write(
        &p,
        "search ns1.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n",
    )?;
    Ok(p)
}

fn setup(fx: &Fixture, binding: Binding, spec: InterfaceSpec) -> Result<netsetup::NetSetup> {
    Ok(fx.in_ns(&fx.pod, || netsetup::setup_pod_network(binding, &spec))??)
}

fn check_no_leftovers(fx: &Fixture, forward_before: &str) -> Result<()> {
    let names: Vec<String> = fx.links(&fx.pod)?.into_iter().map(|l| l.name).collect();
    ensure!(
        !names.iter().any(|n| n == "k6t-eth0" || n == "tap0"),
        "links left behind: {names:?}"
    );
    let tables = fx.in_ns(&fx.pod, netsetup::nft::ip_tables)??;
    ensure!(tables.is_empty(), "nftables tables left behind: {tables:?}");
    ensure!(ip_forward(fx)? == forward_before, "ip_forward not restored");
    Ok(())
}

#[test]
fn masquerade_dhcp_dnat_snat_and_teardown() -> Result<()> {
    let fx = Fixture::new("masq")?;
    let forward_before = ip_forward(&fx)?;
    let spec = InterfaceSpec {
        mac: Some(GUEST_MAC.parse()?),
        hostname: Some("vm1".into()),
        resolv_conf: resolv(&fx)?,
        ..Default::default()
    };
    let net = setup(&fx, Binding::Masquerade, spec)?;
    assert_eq!(net.tap_name(), "tap0");
    assert_eq!(net.guest_mac().to_string(), GUEST_MAC);
    assert_eq!(net.pod_ip(), POD_IP);
    assert_eq!(net.lease().ip, Ipv4Addr::new(10, 0, 2, 2));
    assert_eq!(ip_forward(&fx)?, "1");
    let tables = fx.in_ns(&fx.pod, netsetup::nft::ip_tables)??;
    assert_eq!(tables, vec!["microvirt_tap0".to_string()]);

    // The TAP is a port of the bridge, and the VMM can attach to it with its flags.
    let links = fx.links(&fx.pod)?;
    let br = links
        .iter()
        .find(|l| l.name == "k6t-eth0")
        .context("no bridge")?;
    let tap = links.iter().find(|l| l.name == "tap0").context("no tap")?;
    assert_eq!(tap.controller, Some(br.index));

    // The guest sits behind the real TAP (see `attach_vm_via_tap`).
    let relay = fx.attach_vm_via_tap(GUEST_MAC, net.tap_name())?;
    let lease = fx.dhcp_client()?;
    assert_eq!(lease["ip"], "10.0.2.2");
    assert_eq!(lease["router"], "10.0.2.1");
    assert_eq!(lease["subnet"], "255.255.255.0");
    assert_eq!(lease["dns"].trim(), "10.96.0.10");
    assert_eq!(lease["serverid"], "10.0.2.1");
    assert_eq!(lease["hostname"], "vm1");
    assert_eq!(lease["domain"], "ns1.svc.cluster.local");
    assert_eq!(
        lease["search"],
        "ns1.svc.cluster.local svc.cluster.local cluster.local"
    );
    assert_eq!(lease["lease"], "86400");
    assert_eq!(lease["mtu"], "1500");
    // A renewal as systemd-networkd makes it: unicast from a socket bound to the leased
    // address; the ACK must come back to that socket (unicast, not broadcast).
    let ack = fx.in_ns(&fx.vm, || renew(GUEST_MAC))??;
    assert_eq!(ack, 5, "DHCPACK");

    // Inbound: node → pod IP reaches the VM (DNAT), client address preserved.
    let srv = tcp_server(&fx.vm, "10.0.2.2:8080".parse()?, "vm", 1)?;
    let got = tcp_client(&fx.node, SocketAddr::from((POD_IP, 8080)))??;
    assert_eq!(got, format!("vm peer={NODE_IP}"));
    srv.join().expect("server thread");

    // Outbound: VM → node is seen with the pod IP as source (SNAT).
    let srv = tcp_server(&fx.node, SocketAddr::from((NODE_IP, 9090)), "node", 1)?;
    let got = tcp_client(&fx.vm, SocketAddr::from((NODE_IP, 9090)))??;
    assert_eq!(got, format!("node peer={POD_IP}"));
    srv.join().expect("server thread");

    // A bulk transfer through the TAP (GSO frames from the VM side, MTU frames back).
    let big = bulk_echo(&fx)?;
    assert_eq!(big, 4 << 20);

    // Teardown from another thread (not in the pod netns) removes everything.
    drop(relay);
    net.teardown()?;
    check_no_leftovers(&fx, &forward_before)?;
    // The pod keeps its own address.
    let addrs = fx.in_ns(&fx.pod, || -> Result<_> {
        let mut r = netsetup::rtnl::Rtnl::open()?;
        let eth0 = r.link("eth0")?;
        Ok(r.ipv4_addrs(eth0.index)?)
    })??;
    assert_eq!(addrs, vec![(POD_IP, 24)]);
    Ok(())
}

#[test]
fn masquerade_port_allow_list_and_drop_cleans_up() -> Result<()> {
    let fx = Fixture::new("ports")?;
    let forward_before = ip_forward(&fx)?;
    let spec = InterfaceSpec {
        mac: Some(GUEST_MAC.parse()?),
        ports: vec![PortForward {
            protocol: Protocol::Tcp,
            port: 8080,
        }],
        resolv_conf: resolv(&fx)?,
        ..Default::default()
    };
    let net = setup(&fx, Binding::Masquerade, spec.clone())?;
    // A second setup in the same namespace is refused and leaves the first intact.
    let again = setup(&fx, Binding::Masquerade, spec);
    assert!(
        matches!(again, Err(ref e) if e.to_string().contains("already exists")),
        "{again:?}"
    );

    fx.attach_vm(GUEST_MAC)?;
    let lease = fx.dhcp_client()?;
    assert_eq!(lease["ip"], "10.0.2.2");

    let vm8080 = tcp_server(&fx.vm, "10.0.2.2:8080".parse()?, "vm", 1)?;
    let vm8081 = tcp_server(&fx.vm, "10.0.2.2:8081".parse()?, "vm", 1)?;
    let pod8081 = tcp_server(&fx.pod, SocketAddr::from((POD_IP, 8081)), "pod", 1)?;
    assert_eq!(
        tcp_client(&fx.node, SocketAddr::from((POD_IP, 8080)))??,
        format!("vm peer={NODE_IP}")
    );
    // 8081 is not forwarded: the pod itself answers.
    assert_eq!(
        tcp_client(&fx.node, SocketAddr::from((POD_IP, 8081)))??,
        format!("pod peer={NODE_IP}")
    );
    vm8080.join().expect("server");
    pod8081.join().expect("server");
    // Unblock the unused VM listener, then check it got nothing from outside.
    let from_vm = tcp_client(&fx.vm, "10.0.2.2:8081".parse()?)??;
    assert_eq!(from_vm, "vm peer=10.0.2.2");
    vm8081.join().expect("server");

    drop(net);
    check_no_leftovers(&fx, &forward_before)?;
    Ok(())
}

/// Receives UDP datagrams in `ns` on `addr` for `secs` seconds; returns (source, payload).
fn udp_sink(ns: &str, addr: SocketAddr, secs: u64) -> Result<JoinHandle<Vec<(Ipv4Addr, String)>>> {
    let sock = netns::run_in_path(&Fixture::path(ns), || std::net::UdpSocket::bind(addr))??;
    sock.set_read_timeout(Some(Duration::from_millis(100)))?;
    Ok(std::thread::spawn(move || {
        let mut got = Vec::new();
        let end = Instant::now() + Duration::from_secs(secs);
        let mut buf = [0u8; 256];
        while Instant::now() < end {
            if let Ok((n, SocketAddr::V4(from))) = sock.recv_from(&mut buf) {
                got.push((*from.ip(), String::from_utf8_lossy(&buf[..n]).into_owned()));
            }
        }
        got
    }))
}

/// Sends `msg` from `ns`, from source address `src`, to `dst` (three times: UDP is lossy).
fn udp_send(ns: &str, src: Ipv4Addr, dst: SocketAddr, msg: &str) -> Result<()> {
    netns::run_in_path(&Fixture::path(ns), || -> std::io::Result<()> {
        let s = std::net::UdpSocket::bind((src, 0))?;
        for _ in 0..3 {
            s.send_to(msg.as_bytes(), dst)?;
        }
        Ok(())
    })??;
    Ok(())
}

#[test]
fn masquerade_drops_guest_packets_with_a_foreign_source() -> Result<()> {
    let fx = Fixture::new("spoof")?;
    let spec = InterfaceSpec {
        mac: Some(GUEST_MAC.parse()?),
        resolv_conf: resolv(&fx)?,
        ..Default::default()
    };
    let net = setup(&fx, Binding::Masquerade, spec)?;
    fx.attach_vm(GUEST_MAC)?;
    // DHCP from 0.0.0.0 still reaches the server.
    let lease = fx.dhcp_client()?;
    assert_eq!(lease["ip"], "10.0.2.2");
    // The guest claims a second address: another pod's, or one of its own subnet.
    let spoofed = [Ipv4Addr::new(192, 168, 77, 9), Ipv4Addr::new(10, 0, 2, 77)];
    for a in spoofed {
        ip(&[
            "-n",
            &fx.vm,
            "addr",
            "add",
            &format!("{a}/32"),
            "dev",
            "vm0",
        ])?;
    }
    let node = udp_sink(&fx.node, SocketAddr::from((NODE_IP, 9000)), 2)?;
    let pod = udp_sink(&fx.pod, "10.0.2.1:9001".parse()?, 2)?;
    std::thread::sleep(Duration::from_millis(100));
    for src in [netsetup::MASQ_GUEST, spoofed[0], spoofed[1]] {
        udp_send(
            &fx.vm,
            src,
            SocketAddr::from((NODE_IP, 9000)),
            &format!("from {src}"),
        )?;
        udp_send(
            &fx.vm,
            src,
            "10.0.2.1:9001".parse()?,
            &format!("from {src}"),
        )?;
    }
    let node = node.join().expect("node sink");
    let pod = pod.join().expect("pod sink");
    // Forwarded (SNAT to the pod IP) and delivered to the pod: only the guest's own address.
    assert!(
        node.iter()
            .any(|(f, m)| *f == POD_IP && m == "from 10.0.2.2"),
        "{node:?}"
    );
    assert!(
        pod.iter()
            .any(|(f, m)| *f == netsetup::MASQ_GUEST && m == "from 10.0.2.2"),
        "{pod:?}"
    );
    for a in spoofed {
        let m = format!("from {a}");
        assert!(!node.iter().any(|(_, got)| *got == m), "{node:?}");
        assert!(!pod.iter().any(|(_, got)| *got == m), "{pod:?}");
    }
    drop(net);
    Ok(())
}

#[test]
fn bridge_binding_gives_the_vm_the_pod_ip_and_restores_the_pod() -> Result<()> {
    let fx = Fixture::new("br")?;
    let eth0_before = fx
        .links(&fx.pod)?
        .into_iter()
        .find(|l| l.name == "eth0")
        .context("eth0")?;
    let spec = InterfaceSpec {
        hostname: Some("vm2".into()),
        resolv_conf: resolv(&fx)?,
        ..Default::default()
    };
    let net = setup(&fx, Binding::Bridge, spec)?;
    // The guest takes eth0's MAC and IP; eth0 gets a new MAC and is a bridge port.
    assert_eq!(Some(net.guest_mac().0), eth0_before.mac);
    assert_eq!(net.lease().ip, POD_IP);
    assert_eq!(net.lease().router, Some(NODE_IP));
    let links = fx.links(&fx.pod)?;
    let br = links
        .iter()
        .find(|l| l.name == "k6t-eth0")
        .context("bridge")?;
    let eth0 = links.iter().find(|l| l.name == "eth0").context("eth0")?;
    assert_eq!(eth0.controller, Some(br.index));
    assert_ne!(eth0.mac, eth0_before.mac);

    let mac = net.guest_mac().to_string();
    fx.attach_vm(&mac)?;
    let lease = fx.dhcp_client()?;
    assert_eq!(lease["ip"], POD_IP.to_string());
    assert_eq!(lease["router"], NODE_IP.to_string());
    assert_eq!(lease["subnet"], "255.255.255.0");
    assert_eq!(lease["hostname"], "vm2");

    // The node reaches the VM at the pod IP directly, and the VM reaches the node.
    let srv = tcp_server(&fx.vm, SocketAddr::from((POD_IP, 8080)), "vm", 1)?;
    assert_eq!(
        tcp_client(&fx.node, SocketAddr::from((POD_IP, 8080)))??,
        format!("vm peer={NODE_IP}")
    );
    srv.join().expect("server");
    let srv = tcp_server(&fx.node, SocketAddr::from((NODE_IP, 9090)), "node", 1)?;
    assert_eq!(
        tcp_client(&fx.vm, SocketAddr::from((NODE_IP, 9090)))??,
        format!("node peer={POD_IP}")
    );
    srv.join().expect("server");

    net.teardown()?;
    // Take the stand-in away so the pod's address is unique again, then check the pod.
    ip(&["-n", &fx.vm, "link", "del", "vm0"])?;
    let after = fx.links(&fx.pod)?;
    ensure!(
        !after
            .iter()
            .any(|l| l.name == "k6t-eth0" || l.name == "tap0"),
        "links left: {after:?}"
    );
    let eth0 = after.iter().find(|l| l.name == "eth0").context("eth0")?;
    assert_eq!(eth0.mac, eth0_before.mac);
    assert_eq!(eth0.controller, None);
    let (addrs, route) = fx.in_ns(&fx.pod, || -> Result<_> {
        let mut r = netsetup::rtnl::Rtnl::open()?;
        let i = r.link("eth0")?.index;
        Ok((r.ipv4_addrs(i)?, r.default_route_v4()?))
    })??;
    assert_eq!(addrs, vec![(POD_IP, 24)]);
    assert_eq!(route, Some((NODE_IP, eth0.index)));
    // And the pod works again from the node.
    let srv = tcp_server(&fx.pod, SocketAddr::from((POD_IP, 8080)), "pod", 1)?;
    assert_eq!(
        tcp_client(&fx.node, SocketAddr::from((POD_IP, 8080)))??,
        format!("pod peer={NODE_IP}")
    );
    srv.join().expect("server");
    Ok(())
}

#[test]
fn missing_pod_interface_is_an_error_and_leaves_nothing() -> Result<()> {
    let fx = Fixture::new("err")?;
    let spec = InterfaceSpec {
        pod_interface: "nope0".into(),
        resolv_conf: resolv(&fx)?,
        ..Default::default()
    };
    let r = setup(&fx, Binding::Masquerade, spec);
    assert!(
        matches!(r, Err(ref e) if e.to_string().contains("nope0")),
        "{r:?}"
    );
    let names: Vec<String> = fx.links(&fx.pod)?.into_iter().map(|l| l.name).collect();
    ensure!(
        !names.iter().any(|n| n == "k6t-eth0" || n == "tap0"),
        "{names:?}"
    );
    Ok(())
}

/// Opens the TAP as the VMM does (IFF_TAP | IFF_NO_PI | IFF_VNET_HDR).
fn attach_tap(name: &str) -> Result<std::fs::File> {
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

/// The virtio-net header the TAP prepends with IFF_VNET_HDR (default size, 10 bytes).
const VNET_HDR: usize = 10;

fn checksum(data: &[u8]) -> u16 {
    let mut sum = 0u32;
    for c in data.chunks(2) {
        let w = if c.len() == 2 {
            u16::from_be_bytes([c[0], c[1]])
        } else {
            u16::from(c[0]) << 8
        };
        sum += u32::from(w);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A broadcast DHCP request frame from `mac`, as a guest's DHCP client sends it.
fn dhcp_frame(mac: [u8; 6], xid: [u8; 4], msg_type: u8, opts: &[(u8, &[u8])]) -> Vec<u8> {
    let mut dhcp = vec![0u8; 240];
    dhcp[0] = 1;
    dhcp[1] = 1;
    dhcp[2] = 6;
    dhcp[4..8].copy_from_slice(&xid);
    dhcp[10] = 0x80; // broadcast flag
    dhcp[28..34].copy_from_slice(&mac);
    dhcp[236..240].copy_from_slice(&[99, 130, 83, 99]);
    dhcp.extend_from_slice(&[53, 1, msg_type]);
    for (c, v) in opts {
        dhcp.push(*c);
        dhcp.push(v.len() as u8);
        dhcp.extend_from_slice(v);
    }
    dhcp.push(255);
    dhcp.resize(300, 0);
    let udp_len = (8 + dhcp.len()) as u16;
    let mut udp = Vec::new();
    udp.extend_from_slice(&68u16.to_be_bytes());
    udp.extend_from_slice(&67u16.to_be_bytes());
    udp.extend_from_slice(&udp_len.to_be_bytes());
    udp.extend_from_slice(&[0, 0]); // no UDP checksum (allowed for IPv4)
    udp.extend_from_slice(&dhcp);
    let mut iph = vec![
        0x45, 0, 0, 0, 0, 0, 0, 0, 64, 17, 0, 0, 0, 0, 0, 0, 255, 255, 255, 255,
    ];
    iph[2..4].copy_from_slice(&(20 + udp_len).to_be_bytes());
    let c = checksum(&iph);
    iph[10..12].copy_from_slice(&c.to_be_bytes());
    let mut frame = vec![0u8; VNET_HDR];
    frame.extend_from_slice(&[0xff; 6]);
    frame.extend_from_slice(&mac);
    frame.extend_from_slice(&[0x08, 0x00]);
    frame.extend_from_slice(&iph);
    frame.extend_from_slice(&udp);
    frame
}

/// Reads frames from the TAP until a DHCP reply with `xid` arrives (at most `wait`); returns
/// (message type, yiaddr).
fn read_dhcp_reply(
    tap: &mut std::fs::File,
    xid: [u8; 4],
    wait: Duration,
) -> Result<(u8, Ipv4Addr)> {
    use std::os::fd::AsRawFd;
    let deadline = Instant::now() + wait;
    let mut buf = [0u8; 2048];
    while Instant::now() < deadline {
        let mut pfd = libc::pollfd {
            fd: tap.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let r = unsafe { libc::poll(&mut pfd, 1, 200) };
        if r <= 0 {
            continue;
        }
        let n = tap.read(&mut buf)?;
        let f = &buf[VNET_HDR.min(n)..n];
        // Ethernet + IPv4 (IHL 5) + UDP to port 68.
        if f.len() < 14 + 20 + 8 + 240 || f[12..14] != [0x08, 0x00] || f[14 + 9] != 17 {
            continue;
        }
        let udp = &f[34..];
        if udp[2..4] != 68u16.to_be_bytes() {
            continue;
        }
        let d = &udp[8..];
        if d[0] != 2 || d[4..8] != xid {
            continue;
        }
        let yiaddr = Ipv4Addr::new(d[16], d[17], d[18], d[19]);
        let mut i = 240;
        while i + 2 < d.len() && d[i] != 255 {
            if d[i] == 0 {
                i += 1;
                continue;
            }
            if d[i] == 53 {
                return Ok((d[i + 2], yiaddr));
            }
            i += 2 + usize::from(d[i + 1]);
        }
    }
    bail!("no DHCP reply on the TAP")
}

#[test]
fn dhcp_through_the_tap_as_the_vmm_sees_it() -> Result<()> {
    let fx = Fixture::new("tap")?;
    let mac: netsetup::MacAddr = GUEST_MAC.parse()?;
    let spec = InterfaceSpec {
        mac: Some(mac),
        resolv_conf: resolv(&fx)?,
        ..Default::default()
    };
    let net = setup(&fx, Binding::Masquerade, spec)?;
    let mut tap = fx.in_ns(&fx.pod, || attach_tap(net.tap_name()))??;
    let xid = [0xde, 0xad, 0xbe, 0xef];
    // The bridge port may take a moment to come up after attaching: resend DISCOVER.
    let mut offer = None;
    for _ in 0..5 {
        tap.write_all(&dhcp_frame(mac.0, xid, 1, &[]))?;
        if let Ok(r) = read_dhcp_reply(&mut tap, xid, Duration::from_secs(2)) {
            offer = Some(r);
            break;
        }
    }
    assert_eq!(offer, Some((2, Ipv4Addr::new(10, 0, 2, 2))), "OFFER");
    tap.write_all(&dhcp_frame(
        mac.0,
        xid,
        3,
        &[(50, &[10, 0, 2, 2]), (54, &[10, 0, 2, 1])],
    ))?;
    assert_eq!(
        read_dhcp_reply(&mut tap, xid, Duration::from_secs(5))?,
        (5, Ipv4Addr::new(10, 0, 2, 2)),
        "ACK"
    );
    // Another MAC gets nothing.
    let other = [0x02, 0, 0, 0, 0, 0x99];
    tap.write_all(&dhcp_frame(other, [1, 1, 1, 1], 1, &[]))?;
    assert!(read_dhcp_reply(&mut tap, [1, 1, 1, 1], Duration::from_secs(1)).is_err());
    drop(tap);
    net.teardown()?;
    Ok(())
}

const CAP_NET_BIND_SERVICE: u32 = 10;
const CAP_NET_ADMIN: u32 = 12;

/// Limits the calling thread's effective and permitted capabilities to `caps`.
fn limit_thread_caps(caps: &[u32]) -> std::io::Result<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = Header {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    for c in caps {
        let d = &mut data[(*c / 32) as usize];
        d.effective |= 1 << (c % 32);
        d.permitted |= 1 << (c % 32);
    }
    // SAFETY: capset reads a v3 header and two data structs that live across the call; pid 0
    // is the calling thread only.
    let r = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[test]
fn launcher_privileges_suffice_net_admin_and_net_bind_service() -> Result<()> {
    let fx = Fixture::new("caps")?;
    let spec = InterfaceSpec {
        mac: Some(GUEST_MAC.parse()?),
        resolv_conf: resolv(&fx)?,
        ..Default::default()
    };
    // Only CAP_NET_ADMIN: everything but the DHCP server's port 67 works, and the partial
    // setup is rolled back with the same privileges.
    let r = fx.in_ns(&fx.pod, || -> Result<_> {
        limit_thread_caps(&[CAP_NET_ADMIN])?;
        Ok(netsetup::setup_pod_network(Binding::Masquerade, &spec))
    })??;
    let err = r.expect_err("port 67 needs CAP_NET_BIND_SERVICE");
    assert!(
        err.to_string().contains("DHCP socket") && err.to_string().contains("ermission"),
        "{err}"
    );
    let names: Vec<String> = fx.links(&fx.pod)?.into_iter().map(|l| l.name).collect();
    ensure!(
        !names.iter().any(|n| n == "k6t-eth0" || n == "tap0"),
        "{names:?}"
    );
    ensure!(fx.in_ns(&fx.pod, netsetup::nft::ip_tables)??.is_empty());

    // CAP_NET_ADMIN + CAP_NET_BIND_SERVICE (the launcher container's set): full setup, and the
    // guest gets its lease.
    let mut net = fx.in_ns(&fx.pod, || -> Result<_> {
        limit_thread_caps(&[CAP_NET_ADMIN, CAP_NET_BIND_SERVICE])?;
        Ok(netsetup::setup_pod_network(Binding::Masquerade, &spec)?)
    })??;
    fx.attach_vm(GUEST_MAC)?;
    assert_eq!(fx.dhcp_client()?["ip"], "10.0.2.2");
    // keep_on_drop: dropping stops the DHCP server but leaves the links and rules (the pod's
    // namespace goes away with the pod).
    net.keep_on_drop();
    drop(net);
    let names: Vec<String> = fx.links(&fx.pod)?.into_iter().map(|l| l.name).collect();
    ensure!(names.iter().any(|n| n == "k6t-eth0"), "{names:?}");
    ensure!(fx.in_ns(&fx.pod, netsetup::nft::ip_tables)??.len() == 1);
    Ok(())
}

/// An AF_PACKET socket with virtio-net headers, bound to link `index`.
fn packet_socket(index: u32) -> Result<std::os::fd::OwnedFd> {
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
struct Relay {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Relay {
    fn start(tap: std::fs::File, pkt: std::os::fd::OwnedFd) -> Relay {
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

/// Sends 4 MiB from the node to an echo-less sink in the VM through the pod IP and returns the
/// byte count the VM received.
fn bulk_echo(fx: &Fixture) -> Result<usize> {
    let (tx, rx) = mpsc::channel();
    let path = Fixture::path(&fx.vm);
    let h = std::thread::spawn(move || -> Result<usize> {
        let l = netns::run_in_path(&path, || TcpListener::bind("10.0.2.2:7070"))??;
        tx.send(()).ok();
        l.set_nonblocking(true)?;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match l.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false)?;
                    s.set_read_timeout(Some(Duration::from_secs(10)))?;
                    let mut total = 0;
                    let mut buf = vec![0u8; 65536];
                    loop {
                        let n = s.read(&mut buf)?;
                        if n == 0 {
                            return Ok(total);
                        }
                        ensure!(buf[..n].iter().all(|&b| b == 0x5a), "corrupted data");
                        total += n;
                    }
                }
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => return Err(e.into()),
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(10))
        .context("sink did not start")?;
    fx.in_ns(&fx.node, || -> Result<()> {
        let mut s =
            TcpStream::connect_timeout(&SocketAddr::from((POD_IP, 7070)), Duration::from_secs(5))?;
        s.set_write_timeout(Some(Duration::from_secs(10)))?;
        let chunk = vec![0x5au8; 1 << 20];
        for _ in 0..4 {
            s.write_all(&chunk)?;
        }
        Ok(())
    })??;
    h.join().map_err(|_| anyhow::anyhow!("sink panicked"))?
}

/// Sends a DHCPREQUEST (ciaddr = 10.0.2.2) from 10.0.2.2:68 to 10.0.2.1:67 and returns the
/// message type of the reply received on that socket.
fn renew(mac: &str) -> Result<u8> {
    let mac: netsetup::MacAddr = mac.parse()?;
    let sock = std::net::UdpSocket::bind("10.0.2.2:68")?;
    sock.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut p = vec![0u8; 240];
    p[0] = 1;
    p[1] = 1;
    p[2] = 6;
    p[4..8].copy_from_slice(&[9, 9, 9, 9]);
    p[12..16].copy_from_slice(&[10, 0, 2, 2]);
    p[28..34].copy_from_slice(&mac.0);
    p[236..240].copy_from_slice(&[99, 130, 83, 99]);
    p.extend_from_slice(&[53, 1, 3, 255]);
    sock.send_to(&p, "10.0.2.1:67")?;
    let mut buf = [0u8; 1500];
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let (n, _) = sock.recv_from(&mut buf)?;
        if n > 243 && buf[0] == 2 && buf[4..8] == [9, 9, 9, 9] && buf[240] == 53 {
            return Ok(buf[242]);
        }
    }
    bail!("no reply to the renewal")
}

#[test]
fn bridge_binding_with_a_calico_style_off_subnet_gateway() -> Result<()> {
    let fx = Fixture::new_calico("calico")?;
    let pod_ip = Ipv4Addr::new(10, 244, 1, 7);
    let gw = Ipv4Addr::new(169, 254, 1, 1);
    let spec = InterfaceSpec {
        resolv_conf: resolv(&fx)?,
        ..Default::default()
    };
    let net = setup(&fx, Binding::Bridge, spec)?;
    assert_eq!(net.lease().ip, pod_ip);
    assert_eq!(net.lease().prefix_len, 32);
    assert_eq!(net.lease().router, Some(gw));

    let mac = net.guest_mac().to_string();
    let relay = fx.attach_vm_via_tap(&mac, net.tap_name())?;
    let lease = fx.dhcp_client()?;
    assert_eq!(lease["ip"], pod_ip.to_string());
    assert_eq!(lease["subnet"], "255.255.255.255");
    // RFC 3442 routes: the gateway on-link, then the default route through it.
    assert_eq!(
        lease["staticroutes"],
        "169.254.1.1/32 0.0.0.0 0.0.0.0/0 169.254.1.1"
    );

    let srv = tcp_server(&fx.vm, SocketAddr::from((pod_ip, 8080)), "vm", 1)?;
    assert_eq!(
        tcp_client(&fx.node, SocketAddr::from((pod_ip, 8080)))??,
        format!("vm peer={gw}")
    );
    srv.join().expect("server");
    let srv = tcp_server(&fx.node, SocketAddr::from((gw, 9090)), "node", 1)?;
    assert_eq!(
        tcp_client(&fx.vm, SocketAddr::from((gw, 9090)))??,
        format!("node peer={pod_ip}")
    );
    srv.join().expect("server");

    drop(relay);
    net.teardown()?;
    ip(&["-n", &fx.vm, "link", "del", "vm0"])?;
    let (addrs, route) = fx.in_ns(&fx.pod, || -> Result<_> {
        let mut r = netsetup::rtnl::Rtnl::open()?;
        let i = r.link("eth0")?.index;
        Ok((r.ipv4_addrs(i)?, r.default_route_v4()?.map(|(g, _)| g)))
    })??;
    assert_eq!(addrs, vec![(pod_ip, 32)]);
    assert_eq!(route, Some(gw));
    let srv = tcp_server(&fx.pod, SocketAddr::from((pod_ip, 8080)), "pod", 1)?;
    assert_eq!(
        tcp_client(&fx.node, SocketAddr::from((pod_ip, 8080)))??,
        format!("pod peer={gw}")
    );
    srv.join().expect("server");
    Ok(())
}
