//! The fixture: the node, pod and VM namespaces built with `ip`, and TCP, DHCP and leftover checks
//! run inside them.

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
use netsetup::{netns, Binding, InterfaceSpec};

use crate::relay::{attach_tap, packet_socket, Relay};

pub(crate) const NODE_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 1);
pub(crate) const POD_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 2);
pub(crate) const GUEST_MAC: &str = "02:00:00:00:00:42";

pub(crate) fn ip(args: &[&str]) -> Result<()> {
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
pub(crate) struct Fixture {
    pub(crate) node: String,
    pub(crate) pod: String,
    pub(crate) vm: String,
    /// Holds relay0, the VM link's peer for the TAP relay: no addresses, so its kernel stack
    /// never answers the VM (which would bypass the TAP).
    pub(crate) wire: String,
    /// The namespaces named above (wire, vm, pod, node: deleted in that order).
    pub(crate) _netns: Vec<ScratchNetns>,
    pub(crate) dir: TempDir,
}

impl Fixture {
    /// The namespaces and the node↔pod veth, without addresses.
    pub(crate) fn bare(tag: &str) -> Result<Self> {
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
    pub(crate) fn new(tag: &str) -> Result<Self> {
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
    pub(crate) fn new_calico(tag: &str) -> Result<Self> {
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

    pub(crate) fn path(ns: &str) -> PathBuf {
        Path::new("/run/netns").join(ns)
    }

    pub(crate) fn in_ns<T: Send>(&self, ns: &str, f: impl FnOnce() -> T + Send) -> Result<T> {
        Ok(netns::run_in_path(&Self::path(ns), f)?)
    }

    /// The guest stand-in: veth vm0 (guest MAC) in the VM netns, its peer a bridge port.
    pub(crate) fn attach_vm(&self, mac: &str) -> Result<()> {
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
    pub(crate) fn attach_vm_via_tap(&self, mac: &str, tap: &str) -> Result<Relay> {
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
    pub(crate) fn dhcp_client(&self) -> Result<HashMap<String, String>> {
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

    pub(crate) fn links(&self, ns: &str) -> Result<Vec<netsetup::rtnl::Link>> {
        self.in_ns(ns, || -> Result<_> {
            Ok(netsetup::rtnl::Rtnl::open()?.links()?)
        })?
    }
}

/// A TCP server in `ns` on `addr` that answers each of up to `n` connections with
/// `"<tag> peer=<client ip>"`; stops after `n` connections or 20 s.
pub(crate) fn tcp_server(
    ns: &str,
    addr: SocketAddr,
    tag: &'static str,
    n: usize,
) -> Result<JoinHandle<()>> {
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
pub(crate) fn tcp_client(ns: &str, addr: SocketAddr) -> Result<std::io::Result<String>> {
    netns::run_in_path(&Fixture::path(ns), || {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    })
    .map_err(Into::into)
}

pub(crate) fn ip_forward(fx: &Fixture) -> Result<String> {
    Ok(fx
        .in_ns(&fx.pod, || {
            std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward")
        })??
        .trim()
        .to_string())
}

pub(crate) fn resolv(fx: &Fixture) -> Result<PathBuf> {
    let p = fx.dir.join("resolv.conf");
    std::fs::write(
        &p,
        "search ns1.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n",
    )?;
    Ok(p)
}

pub(crate) fn setup(
    fx: &Fixture,
    binding: Binding,
    spec: InterfaceSpec,
) -> Result<netsetup::NetSetup> {
    Ok(fx.in_ns(&fx.pod, || netsetup::setup_pod_network(binding, &spec))??)
}

pub(crate) fn check_no_leftovers(fx: &Fixture, forward_before: &str) -> Result<()> {
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

/// Sends 4 MiB from the node to an echo-less sink in the VM through the pod IP and returns the
/// byte count the VM received.
pub(crate) fn bulk_echo(fx: &Fixture) -> Result<usize> {
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
pub(crate) fn renew(mac: &str) -> Result<u8> {
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
