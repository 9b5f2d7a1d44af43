//! The bridge binding: the VM gets the pod's IP and the pod is restored, also with a Calico-style
//! gateway off the pod's subnet.

use std::net::{Ipv4Addr, SocketAddr};

use anyhow::{ensure, Context, Result};
use netsetup::{Binding, InterfaceSpec};

use crate::fixture::{ip, resolv, setup, tcp_client, tcp_server, Fixture, NODE_IP, POD_IP};

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
