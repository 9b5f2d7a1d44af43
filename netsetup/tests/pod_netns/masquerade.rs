//! The masquerade binding: DHCP, DNAT and SNAT, the port allow-list, spoofed guest packets,
//! teardown, and a missing pod interface.

use std::net::{Ipv4Addr, SocketAddr};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use netsetup::{netns, Binding, InterfaceSpec, PortForward, Protocol};

use crate::fixture::{
    bulk_echo, check_no_leftovers, ip, ip_forward, renew, resolv, setup, tcp_client, tcp_server,
    Fixture, GUEST_MAC, NODE_IP, POD_IP,
};

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
