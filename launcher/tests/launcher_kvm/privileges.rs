//! Privileges: every launcher thread runs without capabilities and under the seccomp filters, and
//! pod mode gives up root after setup.

use std::process::Command;
use std::time::{Duration, Instant};

use microvirt_testsupport::Spawned;

use crate::harness::{
    assert_all_threads_locked_down, pod_document, Launcher, LoopDevice, Pod, BIN,
};

#[test]
fn every_launcher_thread_is_unprivileged_and_filtered_with_pod_networking() {
    let mut doc: serde_json::Value =
        serde_json::from_str(&pod_document("locked", "testguest.scenario=echo", 5)).unwrap();
    doc["spec"]["domain"]["devices"]["interfaces"] =
        serde_json::json!([{"name": "default", "masquerade": {}}]);
    doc["spec"]["networks"] = serde_json::json!([{"name": "default", "pod": {}}]);
    let pod = Pod::new("locked", &doc.to_string());
    let resolv = pod.dir.path().join("resolv.conf");
    std::fs::write(&resolv, "nameserver 10.96.0.10\n").unwrap();
    let script = format!(
        "ip link set lo up && ip link add eth0 type veth peer name peer0 && ip link set peer0 up \
         && ip addr add 10.244.1.9/24 dev eth0 && ip link set eth0 up \
         && exec setpriv --bounding-set -all,+net_admin,+net_bind_service {BIN} pod"
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
    // A console attached and a control request in flight: every kind of thread exists.
    let mut console = Spawned::spawn_with_stdin(&mut pod.cmd(&["console"]));
    console.wait_for_stdout("echo: ready", Duration::from_secs(10));
    let st = pod.control("status");
    assert!(
        st["network"].as_str().unwrap().starts_with("Masquerade"),
        "{st}"
    );
    // What the launcher reports about itself...
    let threads = st["threads"].as_array().unwrap();
    for t in threads {
        assert_eq!(t["capEff"], "0000000000000000", "{t}");
        assert_eq!(t["noNewPrivs"], 1, "{t}");
        assert_eq!(t["seccomp"], 2, "{t}");
    }
    // ...and what /proc shows from outside.
    let names = assert_all_threads_locked_down(l.id());
    for want in [
        "virt-launcher",
        "dhcp-server",
        "signals",
        "vmm",
        "vcpu0",
        "vcpu1",
        "boot-notify",
        "console-out",
        "control",
        "control-conn",
    ] {
        assert!(names.iter().any(|n| n == want), "no {want} in {names:?}");
    }
    use std::io::Write;
    console
        .stdin()
        .take()
        .unwrap()
        .write_all(b"quit\n")
        .unwrap();
    let (st, _) = l.wait(Duration::from_secs(20));
    assert_eq!(st.code(), Some(0), "stderr:\n{}", l.stderr());
}

/// Pod mode as the operator runs it: root with only NET_ADMIN, NET_BIND_SERVICE, SETUID and
/// SETGID, `MICROVIRT_LAUNCHER_USER=107:107`, volumes as the kubelet mounts them (emptyDirs
/// 0777, the cloud-init data in Secret mounts, nothing of it in the VMI document). The
/// launcher sets up the pod network and opens /dev/kvm (0600 root here) and the TAP as root,
/// then becomes 107:107: every thread runs as 107 with no capability, and the guest boots
/// with its NIC, disks and the cloud-init data from the mounts.
#[test]
fn pod_mode_gives_up_root_after_setup_and_reads_cloud_init_from_secret_mounts() {
    use std::os::unix::fs::PermissionsExt;
    let mut doc: serde_json::Value =
        serde_json::from_str(&pod_document("nonroot", "testguest.scenario=echo", 5)).unwrap();
    doc["spec"]["domain"]["devices"]["disks"] =
        serde_json::json!([{"name": "seed"}, {"name": "scratch"}, {"name": "data"}]);
    doc["spec"]["volumes"] = serde_json::json!([
        {"name": "seed", "cloudInitNoCloud": {"secretRef": {"name": "user-data"}}},
        {"name": "scratch", "emptyDisk": {"capacity": "1Mi"}},
        {"name": "data", "persistentVolumeClaim": {"claimName": "block-claim"}}
    ]);
    doc["spec"]["domain"]["devices"]["interfaces"] =
        serde_json::json!([{"name": "default", "masquerade": {}}]);
    doc["spec"]["networks"] = serde_json::json!([{"name": "default", "pod": {}}]);
    let pod = Pod::new("nonroot", &doc.to_string());
    let root = pod.root();
    // What the kubelet provides: emptyDirs (0777), Secret files, a writable termination log.
    for d in [root.clone(), root.join("empty-disks/scratch")] {
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let secret_dir = root.join("cloud-init/seed/userdata");
    std::fs::create_dir_all(&secret_dir).unwrap();
    std::fs::write(
        secret_dir.join("userData"),
        "#cloud-config\nfrom-the-secret: yes\n",
    )
    .unwrap();
    std::fs::write(pod.term_log(), "").unwrap();
    std::fs::set_permissions(pod.term_log(), std::fs::Permissions::from_mode(0o666)).unwrap();
    // A volumeMode: Block claim: a device node only root may open (0600 root:root, as the
    // container runtime makes it), opened before the launcher becomes 107.
    let backing = pod.dir.path().join("block.img");
    std::fs::write(&backing, vec![0u8; 1 << 20]).unwrap();
    let lo = LoopDevice::attach(&backing);
    let devs = pod.dir.path().join("pvc-devices");
    std::fs::create_dir_all(&devs).unwrap();
    let rdev = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&lo.0).unwrap().rdev()
    };
    let node = std::ffi::CString::new(devs.join("data").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string; creates a device node in the test's directory.
    let r = unsafe { libc::mknod(node.as_ptr(), libc::S_IFBLK | 0o600, rdev) };
    assert_eq!(r, 0, "mknod: {}", std::io::Error::last_os_error());
    let resolv = pod.dir.path().join("resolv.conf");
    std::fs::write(&resolv, "nameserver 10.96.0.10\n").unwrap();
    let script = format!(
        "ip link set lo up && ip link add eth0 type veth peer name peer0 && ip link set peer0 up \
         && ip addr add 10.244.1.11/24 dev eth0 && ip link set eth0 up \
         && exec setpriv --bounding-set -all,+net_admin,+net_bind_service,+setuid,+setgid {BIN} pod"
    );
    let mut l = Launcher::spawn(
        Command::new("unshare")
            .args(["--net", "sh", "-c", &script])
            .env("MICROVIRT_ROOT", &root)
            .env("MICROVIRT_TERMINATION_LOG", pod.term_log())
            .env("MICROVIRT_RESOLV_CONF", &resolv)
            .env("MICROVIRT_LAUNCHER_USER", "107:107")
            .env("MICROVIRT_PVC_DEVICE_DIR", &devs),
    );
    let end = Instant::now() + Duration::from_secs(20);
    while !pod.probe_ready() {
        assert!(Instant::now() < end, "never ready; stderr:\n{}", l.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    let st = pod.control("status");
    assert!(
        st["network"].as_str().unwrap().starts_with("Masquerade"),
        "{st}"
    );
    // The control socket's clients (the node agent, `kubectl exec`) are root without any
    // capability: group 107 (the pod's fsGroup, the agent's supplementalGroups) lets them in,
    // nothing else does.
    let sock = root.join("control.sock");
    let sock_s = sock.display().to_string();
    let as_root_without_caps = |groups: &str| {
        Command::new("setpriv")
            .args([
                "--reuid=0",
                "--regid=0",
                groups,
                "--inh-caps=-all",
                "--ambient-caps=-all",
                "--bounding-set=-all",
                BIN,
                "status",
                "--socket",
                &sock_s,
            ])
            .output()
            .unwrap()
    };
    let out = as_root_without_caps("--groups=107");
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"ok\":true"));
    let out = as_root_without_caps("--clear-groups");
    assert!(!out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
        "{out:?}"
    );
    let mut console = Spawned::spawn_with_stdin(&mut pod.cmd(&["console"]));
    console.wait_for_stdout("echo: ready", Duration::from_secs(10));
    // The guest has its NIC (the TAP opened before the switch) and the three disks (the Block
    // claim's device opened before it).
    let text = console.stdout();
    assert!(
        text.contains("virtio_mmio.device=4K@0xc0001000:5")
            && text.contains("virtio_mmio.device=4K@0xc0004000:8"),
        "{text}"
    );
    let pid = l.id();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let s = std::fs::read_to_string(t.unwrap().path().join("status")).unwrap_or_default();
        if s.is_empty() {
            continue;
        }
        for want in [
            "Uid:\t107\t107\t107\t107\n",
            "Gid:\t107\t107\t107\t107\n",
            "CapEff:\t0000000000000000\n",
            "CapPrm:\t0000000000000000\n",
            "NoNewPrivs:\t1\n",
            "Seccomp:\t2\n",
        ] {
            assert!(s.contains(want), "{want:?} missing:\n{s}");
        }
    }
    use std::io::Write;
    console
        .stdin()
        .take()
        .unwrap()
        .write_all(b"quit\n")
        .unwrap();
    let (st, _) = l.wait(Duration::from_secs(20));
    assert_eq!(st.code(), Some(0), "stderr:\n{}", l.stderr());
    // Files the launcher made belong to 107; the seed holds the Secret's user data.
    use std::os::unix::fs::MetadataExt;
    for f in ["run", "run/seed.cidata.img", "empty-disks/scratch/disk.img"] {
        let m = std::fs::metadata(root.join(f)).unwrap();
        assert_eq!((m.uid(), m.gid()), (107, 107), "{f}");
    }
    let seed = std::fs::read(root.join("run/seed.cidata.img")).unwrap();
    let needle = b"from-the-secret: yes";
    assert!(seed.windows(needle.len()).any(|w| w == needle));
    let msg = std::fs::read_to_string(pod.term_log()).unwrap();
    assert!(msg.contains("reason=GuestShutdown\n"), "{msg}");
}
