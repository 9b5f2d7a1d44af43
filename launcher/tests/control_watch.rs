//! The control socket's `watch` command (what the node agent `virt-handler` follows): the
//! current status at once, a new line on every state change, several watchers at once,
//! commands on other connections, and the stream's end when the launcher exits. Boots the
//! built-in test guest (`halt-forever`) in pod mode on /dev/kvm.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use microvirt_testsupport::{Spawned, TempDir};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_virt-launcher");

fn watch(sock: &Path) -> (UnixStream, BufReader<UnixStream>) {
    let mut s = UnixStream::connect(sock).expect("connecting to control.sock");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(b"{\"cmd\":\"watch\"}\n").unwrap();
    let r = BufReader::new(s.try_clone().unwrap());
    (s, r)
}

fn line(r: &mut BufReader<UnixStream>) -> Option<Value> {
    let mut l = String::new();
    match r.read_line(&mut l) {
        Ok(0) => None,
        Ok(_) => Some(serde_json::from_str(&l).unwrap_or_else(|e| panic!("{l:?}: {e}"))),
        Err(e) => panic!("reading the watch stream: {e}"),
    }
}

fn request(sock: &Path, cmd: &str) -> Value {
    let mut s = UnixStream::connect(sock).unwrap();
    s.write_all(format!("{{\"cmd\":\"{cmd}\"}}\n").as_bytes())
        .unwrap();
    let mut l = String::new();
    BufReader::new(s).read_line(&mut l).unwrap();
    serde_json::from_str(&l).unwrap()
}

#[test]
fn watch_streams_state_changes_until_the_launcher_exits() {
    let dir = TempDir::new("watch");
    let root = dir.join("root");
    std::fs::create_dir_all(root.join("vmi")).unwrap();
    // The kernelBoot image's mount with the demo guest (a pod never boots the built-in one).
    std::fs::create_dir_all(root.join("kernel-boot/boot")).unwrap();
    std::fs::write(
        root.join("kernel-boot/boot/vmlinux"),
        launcher::demo::DEMO_GUEST,
    )
    .unwrap();
    let doc = serde_json::json!({
        "apiVersion": "microvirt.io/v1alpha1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "w", "namespace": "default", "uid": "u-1"},
        "spec": {"domain": {"firmware": {"kernelBoot": {
            "kernelArgs": "testguest.scenario=halt-forever",
            "container": {"image": "microvirt/demo-kernel:dev", "kernelPath": "/boot/vmlinux"}
        }}}},
        "guestMemoryBytes": 33554432u64,
        "vcpus": 1
    });
    std::fs::write(root.join("vmi/vmi.json"), doc.to_string()).unwrap();
    let mut l = Spawned::spawn(
        Command::new(BIN)
            .arg("pod")
            .env("MICROVIRT_ROOT", &root)
            .env("MICROVIRT_TERMINATION_LOG", dir.join("term")),
    );
    let sock = root.join("control.sock");
    let t0 = Instant::now();
    while !root.join("booted").exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the guest never booted; {}",
            l.output()
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    // The current status at once, with the same fields as `status`.
    let (_w1, mut r1) = watch(&sock);
    let first = line(&mut r1).unwrap();
    assert_eq!(first["ok"], true, "{first}");
    assert_eq!(first["state"], "running");
    assert_eq!(first["booted"], true);
    assert_eq!(first["name"], "w");
    assert!(first["bootTimeMs"].is_u64(), "{first}");

    // A change is streamed; a second watcher starts from the current state.
    assert_eq!(request(&sock, "pause")["state"], "paused");
    assert_eq!(line(&mut r1).unwrap()["state"], "paused");
    let (_w2, mut r2) = watch(&sock);
    assert_eq!(line(&mut r2).unwrap()["state"], "paused");
    assert_eq!(request(&sock, "unpause")["state"], "running");
    assert_eq!(line(&mut r1).unwrap()["state"], "running");
    assert_eq!(line(&mut r2).unwrap()["state"], "running");
    // `status` on another connection is unaffected and does not disturb the watchers.
    assert_eq!(request(&sock, "status")["state"], "running");

    // Stop: the streams end (after a last "stopped" line when it gets out in time).
    request(&sock, "stop");
    for r in [&mut r1, &mut r2] {
        while let Some(v) = line(r) {
            assert!(
                ["stopping", "stopped", "running"].contains(&v["state"].as_str().unwrap()),
                "{v}"
            );
        }
    }
    let (st, _) = l.wait(Duration::from_secs(20));
    assert_eq!(st.code(), Some(5), "{}", l.output());
}

/// `startStrategy: Paused` (KubeVirt's): the launcher builds the VM and keeps its vCPUs stopped
/// — the guest never runs, so it never boots — until `unpause`, after which it boots as usual.
#[test]
fn start_strategy_paused_builds_the_vm_and_waits_for_unpause() {
    let dir = TempDir::new("startpaused");
    let root = dir.join("root");
    std::fs::create_dir_all(root.join("vmi")).unwrap();
    std::fs::create_dir_all(root.join("kernel-boot/boot")).unwrap();
    std::fs::write(
        root.join("kernel-boot/boot/vmlinux"),
        launcher::demo::DEMO_GUEST,
    )
    .unwrap();
    let doc = serde_json::json!({
        "apiVersion": "microvirt.io/v1alpha1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "p", "namespace": "default", "uid": "u-2"},
        "spec": {"startStrategy": "Paused", "domain": {"firmware": {"kernelBoot": {
            "kernelArgs": "testguest.scenario=halt-forever",
            "container": {"image": "microvirt/demo-kernel:dev", "kernelPath": "/boot/vmlinux"}
        }}}},
        "guestMemoryBytes": 33554432u64,
        "vcpus": 1
    });
    std::fs::write(root.join("vmi/vmi.json"), doc.to_string()).unwrap();
    let mut l = Spawned::spawn(
        Command::new(BIN)
            .arg("pod")
            .env("MICROVIRT_ROOT", &root)
            .env("MICROVIRT_TERMINATION_LOG", dir.join("term")),
    );
    let sock = root.join("control.sock");
    let t0 = Instant::now();
    while UnixStream::connect(&sock).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the control socket never came up; {}",
            l.output()
        );
        assert!(
            l.try_wait().is_none(),
            "the launcher exited; {}",
            l.output()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The watch's first line is the state once the VM is built: paused, not booted.
    let (_w, mut r) = watch(&sock);
    let first = line(&mut r).unwrap();
    assert_eq!(first["state"], "paused", "{first}");
    assert_eq!(first["booted"], false, "{first}");
    // Watched until the stream says running: no guest instruction ran before the unpause, so
    // the guest cannot have booted.
    assert!(!root.join("booted").exists());
    assert_eq!(request(&sock, "unpause")["state"], "running");
    assert_eq!(line(&mut r).unwrap()["state"], "running");
    let t0 = Instant::now();
    while !root.join("booted").exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the guest never booted after unpause; {}",
            l.output()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(request(&sock, "status")["booted"], true);
    request(&sock, "stop");
    let (st, _) = l.wait(Duration::from_secs(20));
    assert_eq!(st.code(), Some(5), "{}", l.output());
}
