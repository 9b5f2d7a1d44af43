//! Pod networking: masquerade set up in the pod's network namespace, in pod mode and in run mode.

use std::process::Command;
use std::time::{Duration, Instant};

use microvirt_testsupport::{ScratchNetns, Spawned, TempDir};

use crate::harness::{assert_all_threads_locked_down, demo_vmi, pod_document, Launcher, Pod, BIN};

/// A scratch network namespace standing in for a pod's: `eth0` (one end of a veth) holds the
/// pod IP.
fn pod_netns(tag: &str) -> ScratchNetns {
    let ns = ScratchNetns::new(tag);
    ns.sh(
        "ip link set lo up && ip link add eth0 type veth peer name peer0 && ip link set peer0 up \
           && ip addr add 10.244.2.5/24 dev eth0 && ip link set eth0 up",
    );
    ns
}

#[test]
fn pod_mode_sets_up_masquerade_networking_in_the_pod_namespace() {
    let mut doc: serde_json::Value =
        serde_json::from_str(&pod_document("net-vmi", "testguest.scenario=echo", 5)).unwrap();
    doc["spec"]["domain"]["devices"]["interfaces"] = serde_json::json!([
        {"name": "default", "masquerade": {}, "macAddress": "02:00:00:aa:bb:cc", "ports": [{"port": 80}]}
    ]);
    doc["spec"]["networks"] = serde_json::json!([{"name": "default", "pod": {}}]);
    let pod = Pod::new("podnet", &doc.to_string());
    let resolv = pod.dir.path().join("resolv.conf");
    std::fs::write(
        &resolv,
        "nameserver 10.96.0.10\nsearch default.svc.cluster.local\n",
    )
    .unwrap();
    // A fresh network namespace standing in for the pod's, with an `eth0` holding the pod IP;
    // the launcher runs with the pod's capabilities only (bounding set NET_ADMIN +
    // NET_BIND_SERVICE: the DHCP server binds port 67).
    let script = format!(
        "ip link set lo up && ip link add eth0 type veth peer name peer0 && ip link set peer0 up && ip addr add 10.244.1.7/24 dev eth0 \
         && ip link set eth0 up && exec setpriv --bounding-set -all,+net_admin,+net_bind_service {BIN} pod"
    );
    let mut l = Launcher::spawn(
        Command::new("unshare")
            .args(["--net", "sh", "-c", &script])
            .env("MICROVIRT_ROOT", pod.root())
            .env("MICROVIRT_TERMINATION_LOG", pod.term_log())
            .env("MICROVIRT_RESOLV_CONF", &resolv),
    );
    let end = Instant::now() + Duration::from_secs(20);
    while !pod.probe_ready() {
        assert!(Instant::now() < end, "never ready; stderr:\n{}", l.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    let st = pod.control("status");
    assert_eq!(
        st["network"],
        "Masquerade tap tap0 mac 02:00:00:aa:bb:cc guest 10.0.2.2/24 pod-ip 10.244.1.7",
        "{st}"
    );
    assert_eq!(
        st["capEff"], "0000000000000000",
        "dropped after network setup"
    );
    // The guest got a virtio-net device (its command line names the MMIO slot).
    let mut console = Spawned::spawn_with_stdin(&mut pod.cmd(&["console"]));
    let mut stdin = console.stdin().take().unwrap();
    use std::io::Write;
    console.wait_for_stdout("echo: ready", Duration::from_secs(10));
    assert!(
        console
            .stdout()
            .contains("virtio_mmio.device=4K@0xc0001000:5"),
        "{:?}",
        console.stdout()
    );
    stdin.write_all(b"quit\n").unwrap();
    let (st, _) = l.wait(Duration::from_secs(20));
    assert_eq!(st.code(), Some(0), "stderr:\n{}", l.stderr());
    let _ = console.wait(Duration::from_secs(20));
}

#[test]
fn run_pod_network_threads_are_unprivileged_and_a_helper_removes_the_network() {
    let ns = pod_netns("runnet");
    let t = TempDir::new("runnet");
    let vmi = demo_vmi(
        t.path(),
        "runnet",
        "testguest.scenario=echo",
        "    devices: {interfaces: [{name: default, masquerade: {}}]}\n  networks: [{name: default, pod: {}}]\n",
    );
    let sock = t.path().join("control.sock");
    let resolv = t.path().join("resolv.conf");
    std::fs::write(&resolv, "nameserver 10.96.0.10\n").unwrap();
    let mut l = Launcher::spawn(
        ns.command(BIN)
            .arg("run")
            .arg(&vmi)
            .args(["--pod-network", "--console", "socket", "--control-socket"])
            .arg(&sock)
            .env("MICROVIRT_RESOLV_CONF", &resolv),
    );
    let end = Instant::now() + Duration::from_secs(20);
    let status = |cmd: &str| {
        let out = Command::new(BIN)
            .args([cmd, "--socket"])
            .arg(&sock)
            .output()
            .unwrap();
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap_or_default()
    };
    while status("status")["booted"] != true {
        assert!(
            Instant::now() < end,
            "never booted; stderr:\n{}",
            l.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(ns.sh("ip -o link").contains("k6t-eth0"));
    assert_all_threads_locked_down(l.id());
    // The teardown helper: a child process that kept only CAP_NET_ADMIN.
    let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", l.id())).unwrap();
    let helper: u32 = children.split_whitespace().next().unwrap().parse().unwrap();
    let text = std::fs::read_to_string(format!("/proc/{helper}/status")).unwrap();
    assert!(text.contains("Name:\tnet-teardown\n"), "{text}");
    assert!(text.contains("CapEff:\t0000000000001000\n"), "{text}");
    assert!(text.contains("NoNewPrivs:\t1\n"), "{text}");
    assert_eq!(status("stop")["ok"], true);
    let (st, _) = l.wait(Duration::from_secs(20));
    assert_eq!(st.code(), Some(5), "stderr:\n{}", l.stderr());
    // The launcher waited for the helper: the network is gone already.
    let links = ns.sh("ip -o link");
    assert!(
        !links.contains("k6t-eth0") && !links.contains("tap0"),
        "{links}"
    );
    assert!(!std::path::Path::new(&format!("/proc/{helper}")).exists());
}
