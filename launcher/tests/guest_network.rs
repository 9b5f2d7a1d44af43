//! Guest networking end to end: `virt-launcher run --pod-network` in a "pod" network namespace
//! (eth0 = a veth to a "node" namespace) boots the built-in test guest with the `net-serve`
//! scenario. The guest's virtio-net driver gets 10.0.2.2 from the launcher's DHCP server, then
//! answers ARP, ping and UDP echo; from the node side the test pings the **pod IP** and sends UDP
//! datagrams to it (masquerade DNAT to the guest) and checks the replies. SIGTERM then shuts
//! the guest down through Ctrl+Alt+Del (exit 0). Needs root, iproute2 and busybox (ping); both
//! namespaces are removed on drop, also when the test fails.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

use microvirt_testsupport::{ScratchNetns, Spawned, TempDir};

const BIN: &str = env!("CARGO_BIN_EXE_virt-launcher");
const NODE_IP: &str = "10.99.0.1";
const POD_IP: &str = "10.99.0.2";

/// The node and pod namespaces, a veth between them; deleted on drop (which removes the veth
/// too).
struct Netns {
    node: ScratchNetns,
    pod: ScratchNetns,
}

impl Netns {
    fn new() -> Self {
        let n = Netns {
            node: ScratchNetns::new("gn-node"),
            pod: ScratchNetns::new("gn-pod"),
        };
        for ns in [&n.node, &n.pod] {
            ns.ip(&["link", "set", "lo", "up"]);
        }
        n.pod.ip(&[
            "link",
            "add",
            "eth0",
            "type",
            "veth",
            "peer",
            "name",
            "veth-pod",
            "netns",
            n.node.name(),
        ]);
        n.node
            .ip(&["addr", "add", &format!("{NODE_IP}/24"), "dev", "veth-pod"]);
        n.node.ip(&["link", "set", "veth-pod", "up"]);
        n.pod
            .ip(&["addr", "add", &format!("{POD_IP}/24"), "dev", "eth0"]);
        n.pod.ip(&["link", "set", "eth0", "up"]);
        n.pod.ip(&["route", "add", "default", "via", NODE_IP]);
        n
    }
}

#[test]
fn guest_gets_dhcp_address_and_answers_ping_and_udp_echo_through_the_pod_ip() {
    let ns = Netns::new();
    let dir = TempDir::new("guestnet");
    let vmi = dir.join("vmi.yaml");
    std::fs::write(
        &vmi,
        "apiVersion: microvirt.io/v1alpha1\nkind: VirtualMachineInstance\nmetadata:\n  name: netserve\n\
         spec:\n  terminationGracePeriodSeconds: 10\n  domain:\n    memory:\n      guest: 32Mi\n    \
         firmware:\n      kernelBoot:\n        kernelArgs: testguest.scenario=net-serve\n    devices:\n      \
         interfaces:\n      - name: default\n        masquerade: {}\n        macAddress: \"02:00:00:aa:bb:cc\"\n  \
         networks:\n  - name: default\n    pod: {}\n",
    )
    .unwrap();
    let resolv = dir.join("resolv.conf");
    std::fs::write(&resolv, "nameserver 10.96.0.10\n").unwrap();
    let mut l = Spawned::spawn(
        ns.pod
            .command(BIN)
            .args(["run", "--pod-network"])
            .arg(&vmi)
            .env("MICROVIRT_RESOLV_CONF", &resolv),
    );

    // DHCP: the guest reports the lease from the launcher's server.
    let t0 = Instant::now();
    l.wait_for_stdout("net-serve: ip=", Duration::from_secs(30));
    let dhcp_ms = t0.elapsed().as_millis();
    let line = l.stdout();
    assert!(
        line.contains("net-serve: ip=10.0.2.2/24 router=10.0.2.1 server=10.0.2.1 udp-echo=7"),
        "{}",
        l.output()
    );

    // Ping the pod IP from the node: DNAT to the guest, which answers.
    let ping = ns
        .node
        .command("busybox")
        .args(["ping", "-c", "3", "-W", "5", POD_IP])
        .output()
        .expect("busybox ping");
    let text = String::from_utf8_lossy(&ping.stdout).into_owned();
    assert!(
        ping.status.success() && text.contains("3 packets received"),
        "ping: {text}{}\n{}",
        String::from_utf8_lossy(&ping.stderr),
        l.output()
    );

    // UDP echo through the pod IP, several sizes.
    let replies = ns.node.run(|| {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let to = SocketAddrV4::new(POD_IP.parse::<Ipv4Addr>().unwrap(), 7);
        let mut got = Vec::new();
        for size in [1usize, 100, 1400] {
            let msg: Vec<u8> = (0..size).map(|i| (i * 7 + size) as u8).collect();
            s.send_to(&msg, to).unwrap();
            let mut buf = [0u8; 2048];
            let r = s
                .recv_from(&mut buf)
                .map(|(n, from)| (buf[..n].to_vec(), from));
            got.push((msg, r.map_err(|e| e.to_string())));
        }
        got
    });
    for (msg, r) in replies {
        let (data, from) = r.unwrap_or_else(|e| panic!("no UDP echo ({e}); {}", l.output()));
        assert_eq!(data, msg);
        assert_eq!(
            from.to_string(),
            format!("{POD_IP}:7"),
            "the reply comes from the pod IP"
        );
    }

    // Graceful shutdown: SIGTERM → Ctrl+Alt+Del (the guest did not arm the ACPI power button)
    // → the guest powers off (ACPI S5) → exit 0.
    // (`ip netns exec` execs the launcher in place: the child is the launcher.)
    l.signal(libc::SIGTERM);
    let (st, _) = l.wait(Duration::from_secs(30));
    assert_eq!(st.code(), Some(0), "{}", l.output());
    assert!(
        l.stdout().contains("ctrl-alt-del received"),
        "{}",
        l.output()
    );
    eprintln!("launcher start -> guest has its DHCP lease: {dhcp_ms} ms");
}
