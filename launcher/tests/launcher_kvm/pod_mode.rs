//! Pod mode: readiness, the control socket, the console and the termination message, and a bad
//! or missing VMI document.

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use microvirt_testsupport::Spawned;

use crate::harness::{pod_document, Launcher, Pod};

#[test]
fn pod_mode_readiness_control_socket_console_and_termination_message() {
    let pod = Pod::new(
        "pod",
        &pod_document("echo-vmi", "testguest.scenario=echo", 6),
    );
    assert!(!pod.probe_ready(), "not ready before the launcher runs");
    let mut l = Launcher::spawn(&mut pod.cmd(&["pod"]));
    let end = Instant::now() + Duration::from_secs(20);
    while !pod.probe_ready() {
        assert!(Instant::now() < end, "never ready; stderr:\n{}", l.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    let marker = std::fs::read_to_string(pod.root().join("booted")).unwrap();
    assert!(marker.trim().parse::<u64>().is_ok(), "{marker:?}");

    let st = pod.control("status");
    assert_eq!(st["name"], "echo-vmi");
    assert_eq!(st["state"], "running");
    assert_eq!(st["booted"], true);
    assert_eq!(st["vcpus"], 2, "the operator's vcpus win");
    assert_eq!(st["memMiB"], 32, "the operator's guestMemoryBytes win");
    assert_eq!(
        st["vmmSeccomp"], 2,
        "the VMM thread runs under a seccomp filter"
    );
    assert_eq!(st["capEff"], "0000000000000000", "capabilities dropped");
    // `vcpu-state` under the launcher's seccomp filters: both vCPUs read, the VM runs on.
    let d = pod.control("vcpu-state");
    assert_eq!(d["ok"], true, "{d}");
    let vcpus = d["describe"]["vcpus"].as_array().expect("vcpus");
    assert_eq!(vcpus.len(), 2, "{d}");
    assert!(vcpus.iter().all(|v| v["rip"].is_string()), "{d}");
    assert_eq!(pod.control("status")["state"], "running");
    assert_eq!(pod.control("pause")["state"], "paused");
    assert_eq!(pod.control("status")["state"], "paused");
    let again = pod.cmd(&["pause"]).output().unwrap();
    assert!(!again.status.success(), "pausing a paused VM is refused");
    assert_eq!(pod.control("unpause")["state"], "running");

    // Console round trip: the echo guest answers each line; `quit` makes it reset.
    let mut console = Spawned::spawn_with_stdin(&mut pod.cmd(&["console"]));
    // A second console at the same time only watches.
    let mut watcher = Spawned::spawn(&mut pod.cmd(&["console"]));
    let mut stdin = console.stdin().take().unwrap();
    use std::io::Write;
    watcher.wait_for_stdout("echo: ready", Duration::from_secs(10));
    console.wait_for_stdout("echo: ready", Duration::from_secs(10));
    stdin.write_all(b"hello launcher\n").unwrap();
    console.wait_for_stdout("echo: hello launcher", Duration::from_secs(10));
    // The console replays recent output: the guest's banner is there too.
    assert!(console.stdout().contains("echo: ready"));
    stdin.write_all(b"quit\n").unwrap();
    let (st, _) = l.wait(Duration::from_secs(20));
    assert_eq!(st.code(), Some(0), "stderr:\n{}", l.stderr());
    let (cst, _) = console.wait(Duration::from_secs(20));
    assert!(
        cst.success(),
        "console client ends when the VM does: {cst:?}"
    );
    assert!(console.stdout().contains("echo: bye"));
    assert!(watcher.wait(Duration::from_secs(20)).0.success());
    assert!(watcher.stdout().contains("echo: hello launcher"));
    // The launcher's stdout (the container log) carries the guest console too.
    let log = l.stdout();
    assert!(log.contains("microvirt-testguest: entry=pvh"), "{log}");
    assert!(log.contains("echo: hello launcher"), "{log}");

    let msg = std::fs::read_to_string(pod.term_log()).unwrap();
    assert!(msg.starts_with("guest powered off\n"), "{msg}");
    assert!(msg.contains("bootTimeMs="), "{msg}");
    assert!(!pod.root().join("control.sock").exists(), "socket removed");
    // The cloud-init seed was built in the runtime directory.
    let seed = std::fs::read(pod.root().join("run/seed.cidata.img")).unwrap();
    assert_eq!(&seed[43..54], b"CIDATA     ");
}

#[test]
fn pod_mode_bad_document_writes_the_reason() {
    let pod = Pod::new("podbad", "{not json");
    let out = pod.cmd(&["pod"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.status.signal().is_none());
    let msg = std::fs::read_to_string(pod.term_log()).unwrap();
    assert!(msg.starts_with("invalid VMI document: "), "{msg}");
}

#[test]
fn pod_mode_never_boots_the_demo_guest_unasked() {
    // A VMI document without kernelBoot.container (the run mode's demo-guest case) and no
    // defaultKernel: the operator runs without a default kernel image.
    let mut doc: serde_json::Value =
        serde_json::from_str(&pod_document("nokernel", "testguest.scenario=basic", 5)).unwrap();
    doc["spec"]["domain"]["firmware"]["kernelBoot"]
        .as_object_mut()
        .unwrap()
        .remove("container");
    let pod = Pod::new("podnokernel", &doc.to_string());
    let out = pod.cmd(&["pod"]).output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let msg = std::fs::read_to_string(pod.term_log()).unwrap();
    assert!(msg.contains("never boots the built-in demo guest"), "{msg}");
    // Its only disk (the cloud-init seed, a bare VFAT file system) holds no kernel either.
    assert!(msg.contains("no partition table"), "{msg}");
    assert!(msg.contains("reason=NoBootableKernel"), "{msg}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("testguest"));
    assert!(!pod.probe_ready());
}
