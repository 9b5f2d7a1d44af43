//! `virt-launcher` end to end on this machine's /dev/kvm with the built-in demo guest (the test
//! guest embedded in the binary): run mode, signals and the grace period, crashes, pod mode
//! with a fake pod filesystem, the control socket, and disks from volumes.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use microvirt_crds::termination::{ShutdownOrigin, TerminationMessage};
use microvirt_testsupport::{ScratchNetns, Spawned, TempDir};

const BIN: &str = env!("CARGO_BIN_EXE_virt-launcher");

/// A running launcher, its stdout and stderr collected as they arrive; killed if still
/// running when its test ends.
type Launcher = Spawned;

fn demo_vmi(dir: &Path, name: &str, kernel_args: &str, extra_spec: &str) -> PathBuf {
    let p = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &p,
        format!(
            "apiVersion: microvirt.io/v1alpha1\nkind: VirtualMachineInstance\n\
             metadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 10\n  domain:\n    \
             memory: {{guest: 32Mi}}\n    firmware: {{kernelBoot: {{kernelArgs: \"{kernel_args}\"}}}}\n{extra_spec}"
        ),
    )
    .unwrap();
    p
}

fn run_cmd(vmi: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.arg("run").arg(vmi).args(extra);
    c
}

#[test]
fn run_example_demo_vmi_with_two_vcpus() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/demo-vmi.yaml");
    let t = TempDir::new("example");
    let log = t.path().join("termination-log");
    let mut l = Launcher::spawn(
        Command::new(BIN)
            .arg("run")
            .arg(&example)
            .arg("--termination-log")
            .arg(&log),
    );
    let (st, _) = l.wait(Duration::from_secs(30));
    let out = l.stdout();
    assert_eq!(
        st.code(),
        Some(0),
        "stdout:\n{out}\nstderr:\n{}",
        l.stderr()
    );
    for line in [
        "microvirt-testguest: entry=pvh",
        "cpus: 2/2",
        "boot-timer: written",
        "end",
    ] {
        assert!(out.contains(line), "missing {line:?} in:\n{out}");
    }
    assert!(l.stderr().contains("guest booted in"), "{}", l.stderr());
    let msg = std::fs::read_to_string(&log).unwrap();
    let mut lines = msg.lines();
    assert_eq!(lines.next(), Some("guest powered off"));
    assert!(msg.contains("reason=GuestShutdown\n"), "{msg}");
    assert!(msg.contains("exitCode=0\n"), "{msg}");
    // The guest powered off by itself: nobody asked the launcher to stop it.
    assert_eq!(
        TerminationMessage::parse(&msg).shutdown_requested,
        None,
        "{msg}"
    );
    let boot_ms: u64 = msg
        .lines()
        .find_map(|l| l.strip_prefix("bootTimeMs="))
        .expect("bootTimeMs line")
        .parse()
        .unwrap();
    assert!(boot_ms < 10_000, "{boot_ms}");
}

#[test]
fn soft_stop_presses_the_power_button_with_acpi_and_sends_ctrl_alt_del_without() {
    let t = TempDir::new("button");
    // ACPI on (the default): the guest armed the power button, so SIGTERM presses it and the
    // guest powers off through S5.
    let vmi = demo_vmi(
        t.path(),
        "button",
        "testguest.scenario=ctrlaltdel testguest.acpi_button=1",
        "",
    );
    let log = t.path().join("log");
    let mut l = Launcher::spawn(&mut run_cmd(
        &vmi,
        &["--termination-log", log.to_str().unwrap()],
    ));
    l.wait_for_stdout("waiting for ctrl-alt-del", Duration::from_secs(20));
    assert!(
        l.stdout().contains("acpi: power button armed"),
        "{}",
        l.stdout()
    );
    l.signal(libc::SIGTERM);
    let (st, _) = l.wait(Duration::from_secs(20));
    assert_eq!(st.code(), Some(0), "stderr:\n{}", l.stderr());
    let out = l.stdout();
    assert!(out.contains("acpi: power button pressed"), "{out}");
    assert!(
        out.contains("acpi: powering off through port 0x601"),
        "{out}"
    );
    assert!(!out.contains("ctrl-alt-del received"), "{out}");
    assert!(
        l.stderr()
            .contains("asking the guest to shut down: ACPI power button"),
        "{}",
        l.stderr()
    );
    let msg = std::fs::read_to_string(&log).unwrap();
    assert!(
        msg.starts_with("guest powered off after the shutdown request\n"),
        "{msg}"
    );

    // ACPI off (KubeVirt's domain.features.acpi.enabled: false): Ctrl-Alt-Del. The guest
    // cannot power off without ACPI: it resets, and a guest without ACPI ends the VM that way.
    let vmi = demo_vmi(
        t.path(),
        "noacpi",
        "testguest.scenario=ctrlaltdel testguest.acpi_button=1",
        "    features: {acpi: {enabled: false}}\n",
    );
    let log = t.path().join("log2");
    let mut l = Launcher::spawn(&mut run_cmd(
        &vmi,
        &["--termination-log", log.to_str().unwrap()],
    ));
    l.wait_for_stdout("waiting for ctrl-alt-del", Duration::from_secs(20));
    l.signal(libc::SIGTERM);
    let (st, _) = l.wait(Duration::from_secs(20));
    let (out, err) = (l.stdout(), l.stderr());
    assert_eq!(st.code(), Some(0), "stdout:\n{out}\nstderr:\n{err}");
    assert!(!out.contains("acpi: power button armed"), "{out}");
    assert!(out.contains("ctrl-alt-del received"), "{out}");
    assert!(
        err.contains("asking the guest to shut down: Ctrl-Alt-Del (the VM has no ACPI)"),
        "{err}"
    );
    let msg = std::fs::read_to_string(&log).unwrap();
    assert!(
        msg.starts_with("guest reset after the shutdown request\n"),
        "{msg}"
    );
}

/// A guest that runs with ACPI (it armed the power button, as a kernel with ACPI does)
/// reboots in place: the launcher keeps running, logs and counts each reboot. A guest without
/// ACPI cannot power off: its reset ends the VM.
#[test]
fn a_guest_reboot_keeps_the_vm_running_and_is_counted() {
    const DISK: &str = "    devices: {disks: [{name: scratch}]}\n  volumes: [{name: scratch, emptyDisk: {capacity: 1Mi}}]\n";
    let t = TempDir::new("reboot");
    let vmi = demo_vmi(
        t.path(),
        "reboots",
        "testguest.scenario=reboot testguest.reboots=2 testguest.reboot_then=halt testguest.acpi_button=1",
        DISK,
    );
    let sock = t.path().join("control.sock");
    let mut l = Launcher::spawn(&mut run_cmd(
        &vmi,
        &["--control-socket", sock.to_str().unwrap()],
    ));
    l.wait_for_stdout("reboot: halting", Duration::from_secs(30));
    let out = l.stdout();
    assert_eq!(
        out.matches("microvirt-testguest: entry=").count(),
        3,
        "{out}"
    );
    for boot in 1..=3 {
        assert!(
            out.contains(&format!("reboot: boot={boot} ram=clear")),
            "{out}"
        );
    }
    // The launcher learns of a reboot from the VMM thread: wait for it to have counted both.
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let st = vmm::control::request(&sock, &serde_json::json!({"cmd": "status"})).unwrap();
        assert_eq!(st["state"], "running", "{st}");
        if st["reboots"] == 2 {
            break;
        }
        assert!(Instant::now() < end, "reboots never counted 2: {st}");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Each reboot is logged (before it is counted; the log reaches the test through a pipe).
    for n in [1, 2] {
        let line = format!("the guest rebooted in place (reboot {n})");
        while !l.stderr().contains(&line) {
            assert!(Instant::now() < end, "no {line:?} in:\n{}", l.stderr());
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let stop = vmm::control::request(&sock, &serde_json::json!({"cmd": "stop"})).unwrap();
    assert_eq!(stop["ok"], true, "{stop}");
    let (st, _) = l.wait(Duration::from_secs(20));
    assert_eq!(st.code(), Some(5), "stderr:\n{}", l.stderr());

    // The same guest without arming ACPI: its first reboot ends the VM.
    let vmi = demo_vmi(
        t.path(),
        "noacpi-reboot",
        "testguest.scenario=reboot testguest.reboots=2",
        DISK,
    );
    let log = t.path().join("log");
    let mut l = Launcher::spawn(&mut run_cmd(
        &vmi,
        &["--termination-log", log.to_str().unwrap()],
    ));
    let (st, _) = l.wait(Duration::from_secs(30));
    let out = l.stdout();
    assert_eq!(
        st.code(),
        Some(0),
        "stdout:\n{out}\nstderr:\n{}",
        l.stderr()
    );
    assert_eq!(
        out.matches("microvirt-testguest: entry=").count(),
        1,
        "{out}"
    );
    assert!(out.contains("reboot: rebooting via the i8042"), "{out}");
    let msg = std::fs::read_to_string(&log).unwrap();
    assert!(msg.starts_with("guest reset\n"), "{msg}");
}

#[test]
fn sigterm_shuts_the_guest_down_within_the_grace_period() {
    let t = TempDir::new("sigterm");
    let vmi = demo_vmi(t.path(), "cad", "testguest.scenario=ctrlaltdel", "");
    let log = t.path().join("log");
    let mut l = Launcher::spawn(&mut run_cmd(
        &vmi,
        &["--termination-log", log.to_str().unwrap()],
    ));
    l.wait_for_stdout("waiting for ctrl-alt-del", Duration::from_secs(20));
    l.signal(libc::SIGTERM);
    let (st, took) = l.wait(Duration::from_secs(20));
    assert_eq!(st.code(), Some(0), "stderr:\n{}", l.stderr());
    assert!(took < Duration::from_secs(10), "took {took:?} (grace 10 s)");
    assert!(
        l.stdout().contains("ctrl-alt-del received"),
        "{}",
        l.stdout()
    );
    let msg = std::fs::read_to_string(&log).unwrap();
    assert!(
        msg.starts_with("guest powered off after the shutdown request\n"),
        "{msg}"
    );
    let parsed = TerminationMessage::parse(&msg);
    assert_eq!(parsed.exit_code, Some(0), "{msg}");
    assert_eq!(
        parsed.shutdown_requested,
        Some(ShutdownOrigin::Signal),
        "{msg}"
    );
}

#[test]
fn a_guest_that_ignores_sigterm_is_stopped_after_the_grace_period() {
    let t = TempDir::new("halt");
    let vmi = demo_vmi(t.path(), "halt", "testguest.scenario=halt-forever", "");
    let log = t.path().join("log");
    let mut l = Launcher::spawn(&mut run_cmd(
        &vmi,
        &[
            "--grace-period",
            "1",
            "--termination-log",
            log.to_str().unwrap(),
        ],
    ));
    l.wait_for_stdout("halting", Duration::from_secs(20));
    l.signal(libc::SIGTERM);
    let (st, took) = l.wait(Duration::from_secs(20));
    assert_eq!(st.code(), Some(4), "stderr:\n{}", l.stderr());
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "took {took:?} with a 1 s grace period"
    );
    let msg = std::fs::read_to_string(&log).unwrap();
    assert!(
        msg.starts_with("guest did not shut down within the 1 s grace period; VM stopped\n"),
        "{msg}"
    );
    assert!(msg.contains("reason=GracePeriodExpired\n"), "{msg}");
    assert!(msg.contains("bootTimeMs="), "{msg}");
}

#[test]
fn a_second_signal_stops_at_once() {
    let t = TempDir::new("twice");
    let vmi = demo_vmi(t.path(), "twice", "testguest.scenario=halt-forever", "");
    let mut l = Launcher::spawn(&mut run_cmd(&vmi, &["--grace-period", "60"]));
    l.wait_for_stdout("halting", Duration::from_secs(20));
    l.signal(libc::SIGINT);
    // Two SIGINTs pending at once are one signal: send the second only after the launcher
    // handled the first (a fixed pause was not enough on a busy machine).
    let end = Instant::now() + Duration::from_secs(20);
    while !l.stderr().contains("asking the guest to shut down") {
        assert!(
            Instant::now() < end,
            "the first SIGINT was not handled; stderr:\n{}",
            l.stderr()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    l.signal(libc::SIGINT);
    let (st, took) = l.wait(Duration::from_secs(20));
    assert_eq!(st.code(), Some(5), "stderr:\n{}", l.stderr());
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn a_guest_crash_gives_a_non_zero_exit_and_the_reason() {
    let t = TempDir::new("crash");
    let vmi = demo_vmi(
        t.path(),
        "crash",
        "testguest.scenario=triple-fault testguest.fault=ud2",
        "",
    );
    let log = t.path().join("log");
    let mut l = Launcher::spawn(&mut run_cmd(
        &vmi,
        &["--termination-log", log.to_str().unwrap()],
    ));
    let (st, _) = l.wait(Duration::from_secs(20));
    assert_eq!(st.code(), Some(1), "stderr:\n{}", l.stderr());
    assert!(l.stdout().contains("triple-fault: now"), "{}", l.stdout());
    let msg = std::fs::read_to_string(&log).unwrap();
    let first = msg.lines().next().unwrap();
    assert!(first.starts_with("guest crashed: "), "{msg}");
    assert!(first.len() <= 256);
    assert!(msg.contains("reason=GuestCrashed\n"), "{msg}");
}

#[test]
fn invalid_input_is_refused_with_exit_codes_2_and_3() {
    let t = TempDir::new("bad");
    let p = t.path().join("bad.yaml");
    std::fs::write(&p, "kind: Pod\n").unwrap();
    let out = Command::new(BIN).arg("run").arg(&p).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected VirtualMachineInstance"));
    let vmi = demo_vmi(
        t.path(),
        "nodisk",
        "",
        "    devices: {disks: [{name: d}]}\n  volumes: [{name: d, containerDisk: {image: x, path: missing.img}}]\n",
    );
    let out = Command::new(BIN).arg("run").arg(&vmi).output().unwrap();
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("missing.img") && err.contains("not a file"),
        "{err}"
    );
}

/// The test guest's blk pattern: 64-bit word `w` of sector `s`.
fn pattern(s: u64, w: u64) -> u64 {
    0x6d76_0000_0000_0000 ^ (s << 32) ^ (w << 8) ^ s.wrapping_mul(0x9e37_79b9)
}

fn word(img: &[u8], sector: u64, w: u64) -> u64 {
    let off = (sector * 512 + w * 8) as usize;
    u64::from_le_bytes(img[off..off + 8].try_into().unwrap())
}

fn blk_vmi(dir: &Path, name: &str) -> PathBuf {
    demo_vmi(
        dir,
        name,
        "testguest.scenario=blk",
        "    devices:\n      disks:\n        - {name: root, serial: root-disk}\n        - {name: data}\n        - {name: scratch}\n        - {name: seed}\n  volumes:\n    - {name: root, containerDisk: {image: local, path: base.img}}\n    - {name: data, persistentVolumeClaim: {claimName: pvc}}\n    - {name: scratch, emptyDisk: {capacity: 3Mi}}\n    - {name: seed, cloudInitNoCloud: {userData: \"#cloud-config\"}}\n",
    )
}

#[test]
fn disks_from_volumes_overlay_isolation_pvc_persistence_empty_disk() {
    let t = TempDir::new("disks");
    let base = t.path().join("base.img");
    let base_bytes: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 253) as u8).collect();
    std::fs::write(&base, &base_bytes).unwrap();
    std::fs::create_dir_all(t.path().join("pvc")).unwrap();
    let pvc = t.path().join("pvc/disk.img");
    std::fs::write(&pvc, vec![0u8; 2 << 20]).unwrap();
    let vmi = blk_vmi(t.path(), "disks");

    // Two launchers at once on one containerDisk image, each with its own runtime directory.
    // The PVC is used by the first only (a second writer would be refused by the lock), so
    // the second VMI names a PVC of its own.
    std::fs::create_dir_all(t.path().join("pvc2")).unwrap();
    std::fs::write(t.path().join("pvc2/disk.img"), vec![0u8; 1 << 20]).unwrap();
    let vmi2 = t.path().join("disks2.yaml");
    std::fs::write(
        &vmi2,
        std::fs::read_to_string(&vmi)
            .unwrap()
            .replace("claimName: pvc}", "claimName: pvc2}")
            .replace("name: disks}", "name: disks2}"),
    )
    .unwrap();
    let rt1 = t.path().join("rt1");
    let rt2 = t.path().join("rt2");
    let mut a = Launcher::spawn(&mut run_cmd(
        &vmi,
        &["--runtime-dir", rt1.to_str().unwrap()],
    ));
    let mut b = Launcher::spawn(&mut run_cmd(
        &vmi2,
        &["--runtime-dir", rt2.to_str().unwrap()],
    ));
    for l in [&mut a, &mut b] {
        let (st, _) = l.wait(Duration::from_secs(30));
        assert_eq!(
            st.code(),
            Some(0),
            "stdout:\n{}\nstderr:\n{}",
            l.stdout(),
            l.stderr()
        );
        let out = l.stdout();
        // Order = spec order: vda root (serial), vdb data, vdc scratch (3 MiB), vdd seed (ro).
        for line in [
            "blk0: capacity=2048 ro=0 id=root-disk",
            "blk0: write-flush-read ok",
            "blk1: write-flush-read ok",
            "blk2: capacity=6144 ro=0 id=",
            "blk2: write-flush-read ok",
            "blk3: ro-write status=1",
        ] {
            assert!(out.contains(line), "missing {line:?}:\n{out}");
        }
        assert!(
            out.contains("blk3: capacity=") && out.contains(" ro=1 "),
            "{out}"
        );
    }
    // The image is untouched; each VMI's writes are in its own overlay.
    assert_eq!(std::fs::read(&base).unwrap(), base_bytes);
    for rt in [&rt1, &rt2] {
        let ov = std::fs::read(rt.join("root.overlay")).unwrap();
        assert_eq!(&ov[..8], b"MVOVRLY1");
    }
    // The PVC kept the guest's writes (sectors 1..=8 hold the pattern).
    let img = std::fs::read(&pvc).unwrap();
    for s in 1..=8 {
        assert_eq!(word(&img, s, 0), pattern(s, 0), "sector {s}");
        assert_eq!(word(&img, s, 63), pattern(s, 63), "sector {s}");
    }
    // A second run of the same VMI starts from a fresh overlay (stateless containerDisk)
    // while the PVC still holds the data of the first run.
    std::fs::write(rt1.join("root.overlay"), b"stale, must be replaced").unwrap();
    let mut c = Launcher::spawn(&mut run_cmd(
        &vmi,
        &["--runtime-dir", rt1.to_str().unwrap()],
    ));
    let (st, _) = c.wait(Duration::from_secs(30));
    assert_eq!(st.code(), Some(0), "{}", c.stderr());
    assert_eq!(
        &std::fs::read(rt1.join("root.overlay")).unwrap()[..8],
        b"MVOVRLY1"
    );
    assert_eq!(std::fs::read(&pvc).unwrap(), img);
}

/// A fake pod filesystem: MICROVIRT_ROOT with vmi/vmi.json, the kernelBoot image's mount
/// with the demo guest at boot/vmlinux (as in microvirt/demo-kernel:dev), a termination log
/// path.
struct Pod {
    dir: TempDir,
}

impl Pod {
    fn new(tag: &str, vmi_json: &str) -> Self {
        let dir = TempDir::new(tag);
        std::fs::create_dir_all(dir.path().join("root/vmi")).unwrap();
        std::fs::write(dir.path().join("root/vmi/vmi.json"), vmi_json).unwrap();
        std::fs::create_dir_all(dir.path().join("root/kernel-boot/boot")).unwrap();
        std::fs::write(
            dir.path().join("root/kernel-boot/boot/vmlinux"),
            launcher::demo::DEMO_GUEST,
        )
        .unwrap();
        Pod { dir }
    }
    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }
    fn term_log(&self) -> PathBuf {
        self.dir.path().join("termination-log")
    }
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args)
            .env("MICROVIRT_ROOT", self.root())
            .env("MICROVIRT_TERMINATION_LOG", self.term_log());
        c
    }
    fn control(&self, cmd: &str) -> serde_json::Value {
        let out = self.cmd(&[cmd]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let v: serde_json::Value = serde_json::from_str(text.trim())
            .unwrap_or_else(|e| panic!("{cmd}: {e}: {text:?} {:?}", out.stderr));
        assert_eq!(out.status.success(), v["ok"] == true, "{v}");
        v
    }
    fn probe_ready(&self) -> bool {
        self.cmd(&["probe", "ready"]).status().unwrap().success()
    }
}

fn pod_document(name: &str, kernel_args: &str, grace: u32) -> String {
    serde_json::json!({
        "apiVersion": "microvirt.io/v1alpha1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": "default", "uid": "0000-1111"},
        "spec": {
            "terminationGracePeriodSeconds": grace,
            "domain": {
                "cpu": {"cores": 4},
                "memory": {"guest": "1Gi"},
                "firmware": {"kernelBoot": {
                    "kernelArgs": kernel_args,
                    "container": {"image": "microvirt/demo-kernel:dev", "kernelPath": "/boot/vmlinux"}
                }},
                "devices": {"disks": [{"name": "seed", "disk": {"bus": "virtio"}}]}
            },
            "volumes": [{"name": "seed", "cloudInitNoCloud": {"userData": "#cloud-config\n"}}]
        },
        "guestMemoryBytes": 33554432u64,
        "vcpus": 2
    })
    .to_string()
}

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
fn pod_mode_sigterm_and_grace_period_from_the_vmi() {
    // terminationGracePeriodSeconds 3: the launcher keeps back min(2 s, half) to report
    // before the kubelet's SIGKILL, so it stops the guest after 1.5 s.
    let pod = Pod::new(
        "podterm",
        &pod_document("halt", "testguest.scenario=halt-forever", 3),
    );
    let mut l = Launcher::spawn(&mut pod.cmd(&["pod"]));
    let end = Instant::now() + Duration::from_secs(20);
    while !pod.probe_ready() {
        assert!(Instant::now() < end, "never ready; stderr:\n{}", l.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(pod.control("shutdown")["state"], "shutting-down");
    let (st, took) = l.wait(Duration::from_secs(20));
    assert_eq!(st.code(), Some(4), "stderr:\n{}", l.stderr());
    assert!(took < Duration::from_secs(3), "{took:?}");
    let msg = std::fs::read_to_string(pod.term_log()).unwrap();
    assert!(
        msg.contains("reason=GracePeriodExpired\nexitCode=4\n"),
        "{msg}"
    );
    assert_eq!(
        TerminationMessage::parse(&msg).shutdown_requested,
        Some(ShutdownOrigin::Control),
        "{msg}"
    );
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

#[test]
fn pod_mode_sigterm_resumes_a_paused_guest_and_shuts_it_down() {
    let pod = Pod::new(
        "podpaused",
        &pod_document("cad", "testguest.scenario=ctrlaltdel", 10),
    );
    let mut l = Launcher::spawn(&mut pod.cmd(&["pod"]));
    let end = Instant::now() + Duration::from_secs(20);
    while !pod.probe_ready() {
        assert!(Instant::now() < end, "never ready; stderr:\n{}", l.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(pod.control("pause")["state"], "paused");
    l.signal(libc::SIGTERM);
    let (st, took) = l.wait(Duration::from_secs(20));
    assert_eq!(st.code(), Some(0), "stderr:\n{}", l.stderr());
    assert!(took < Duration::from_secs(8), "{took:?}");
    let msg = std::fs::read_to_string(pod.term_log()).unwrap();
    assert!(
        msg.starts_with("guest powered off after the shutdown request\n"),
        "{msg}"
    );
    // Exit 0 (the guest shut down cleanly), but the kubelet asked for it: the operator must
    // not take this for a guest that chose to stop (docs/launcher-pod.md).
    assert_eq!(
        TerminationMessage::parse(&msg).shutdown_requested,
        Some(ShutdownOrigin::Signal),
        "{msg}"
    );
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

/// A loop block device over a file (`losetup`), detached on drop.
struct LoopDevice(PathBuf);

impl LoopDevice {
    fn attach(file: &Path) -> Self {
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(file)
            .output()
            .expect("run losetup");
        assert!(
            out.status.success(),
            "losetup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        LoopDevice(String::from_utf8_lossy(&out.stdout).trim().into())
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

/// A qcow2 containerDisk (zlib-compressed clusters, made by Debian's qemu-img) under the
/// launcher's seccomp filters: the guest reads the raw source's first 4 KiB, sees the virtual
/// size and writes to the overlay; a second disk reads the same image read-only.
#[test]
fn a_qcow2_container_disk_under_the_filters() {
    let t = TempDir::new("qcow2");
    let raw = t.path().join("src.raw");
    let data: Vec<u8> = (0..(3usize << 20))
        .map(|i| {
            if (i >> 16) % 3 == 2 {
                0
            } else {
                (i / 5 % 241) as u8
            }
        })
        .collect();
    std::fs::write(&raw, &data).unwrap();
    let img = t.path().join("cloud.qcow2");
    let out = Command::new("qemu-img")
        .args(["convert", "-q", "-c", "-f", "raw", "-O", "qcow2"])
        .arg(&raw)
        .arg(&img)
        .output()
        .expect("qemu-img (Debian qemu-utils; `cargo xtask test` installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = std::fs::read(&img).unwrap();
    let vmi = demo_vmi(
        t.path(),
        "qcow2",
        "testguest.scenario=blk",
        "    devices:\n      disks:\n        - {name: root}\n        - {name: copy, disk: {readonly: true}}\n  volumes:\n    - {name: root, containerDisk: {image: local, path: cloud.qcow2}}\n    - {name: copy, containerDisk: {image: local, path: cloud.qcow2}}\n",
    );
    let mut l = Launcher::spawn(&mut run_cmd(&vmi, &[]));
    let (st, _) = l.wait(Duration::from_secs(30));
    assert_eq!(st.code(), Some(0), "{}\n{}", l.stdout(), l.stderr());
    let out = l.stdout();
    let fnv = data[..4096].iter().fold(0x811c_9dc5u32, |h, &x| {
        (h ^ u32::from(x)).wrapping_mul(0x0100_0193)
    });
    let sectors = data.len() / 512;
    for line in [
        format!("blk0: capacity={sectors} ro=0 id="),
        format!("blk0: head status=0 fnv1a={fnv:08x}"),
        "blk0: write-flush-read ok".to_string(),
        format!("blk1: capacity={sectors} ro=1 id="),
        format!("blk1: head status=0 fnv1a={fnv:08x}"),
        "blk1: ro-write status=1".to_string(),
    ] {
        assert!(out.contains(&line), "missing {line:?}:\n{out}");
    }
    assert!(
        std::fs::read(&img).unwrap() == before,
        "containerDisk image modified"
    );
}

/// A persistentVolumeClaim that is a block device (what a `volumeMode: Block` claim is) has
/// its real size, and `devices.rng: {}` gives the guest entropy.
#[test]
fn a_block_device_pvc_and_rng() {
    let t = TempDir::new("blockpvc");
    let backing = t.path().join("backing.img");
    std::fs::write(&backing, vec![0u8; 2 << 20]).unwrap();
    let lo = LoopDevice::attach(&backing);
    let spec = format!(
        "    devices:\n      rng: {{}}\n      disks:\n        - {{name: data}}\n  volumes:\n    - {{name: data, persistentVolumeClaim: {{claimName: {}}}}}\n",
        lo.0.display()
    );
    let vmi = demo_vmi(t.path(), "blockpvc", "testguest.scenario=blk", &spec);
    let mut l = Launcher::spawn(&mut run_cmd(&vmi, &[]));
    let (st, _) = l.wait(Duration::from_secs(30));
    assert_eq!(st.code(), Some(0), "{}\n{}", l.stdout(), l.stderr());
    let out = l.stdout();
    for line in ["blk0: capacity=4096 ro=0 id=", "blk0: write-flush-read ok"] {
        assert!(out.contains(line), "missing {line:?}:\n{out}");
    }
    drop(lo);
    let img = std::fs::read(&backing).unwrap();
    for s in 1..=8 {
        assert_eq!(word(&img, s, 0), pattern(s, 0), "sector {s}");
    }
    // The same VMI's rng device, read by the guest.
    let vmi = demo_vmi(
        t.path(),
        "rng",
        "testguest.scenario=rng",
        "    devices:\n      rng: {}\n",
    );
    let mut l = Launcher::spawn(&mut run_cmd(&vmi, &[]));
    let (st, _) = l.wait(Duration::from_secs(30));
    assert_eq!(st.code(), Some(0), "{}\n{}", l.stdout(), l.stderr());
    let out = l.stdout();
    assert!(out.contains("rng: read 64 bytes nonzero="), "{out}");
    assert!(out.contains(" differ=1"), "{out}");
    assert!(out.contains("rng: readonly-buffer len=0"), "{out}");
    // Without it, no device.
    let vmi = demo_vmi(t.path(), "norng", "testguest.scenario=rng", "");
    let mut l = Launcher::spawn(&mut run_cmd(&vmi, &[]));
    let (st, _) = l.wait(Duration::from_secs(30));
    assert_eq!(st.code(), Some(0), "{}\n{}", l.stdout(), l.stderr());
    assert!(l.stdout().contains("rng: no device"), "{}", l.stdout());
}

/// The security fields of one `/proc/<pid>/task/<tid>/status`.
#[derive(Debug)]
struct TaskSecurity {
    name: String,
    cap_eff: String,
    no_new_privs: String,
    seccomp: String,
    filters: u32,
}

fn task_security(pid: u32) -> Vec<TaskSecurity> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let Ok(text) = std::fs::read_to_string(e.unwrap().path().join("status")) else {
            continue; // the thread ended meanwhile
        };
        let field = |f: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{f}:")))
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        out.push(TaskSecurity {
            name: field("Name"),
            cap_eff: field("CapEff"),
            no_new_privs: field("NoNewPrivs"),
            seccomp: field("Seccomp"),
            filters: field("Seccomp_filters").parse().unwrap_or(0),
        });
    }
    out
}

/// Every thread: no capabilities, no_new_privs, a seccomp filter; the VM's threads and the
/// DHCP server have a tighter filter stacked on the launcher's. Returns the thread names.
fn assert_all_threads_locked_down(pid: u32) -> Vec<String> {
    let tasks = task_security(pid);
    let main_filters = tasks.iter().map(|t| t.filters).min().unwrap();
    for t in &tasks {
        assert_eq!(t.cap_eff, "0000000000000000", "{t:?}\nall: {tasks:#?}");
        assert_eq!(t.no_new_privs, "1", "{t:?}\nall: {tasks:#?}");
        assert_eq!(t.seccomp, "2", "{t:?}\nall: {tasks:#?}");
        if t.name.starts_with("vcpu") || t.name == "vmm" || t.name == "dhcp-server" {
            assert!(t.filters > main_filters, "{t:?}\nall: {tasks:#?}");
        }
    }
    tasks.into_iter().map(|t| t.name).collect()
}

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

#[test]
fn cli_help_version_and_usage_errors_in_clap_style() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for want in [
        "Usage: virt-launcher [OPTIONS] <COMMAND>",
        "run",
        "pod",
        "probe",
        "console",
        "--log-level <LEVEL>",
        "Exit status:",
    ] {
        assert!(help.contains(want), "{want:?} missing in:\n{help}");
    }
    let out = Command::new(BIN).args(["run", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("--grace-period <SECS>"), "{help}");
    let out = Command::new(BIN).arg("--version").output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("virt-launcher {}", env!("CARGO_PKG_VERSION"))
    );
    for (args, want) in [
        (
            &["run"][..],
            "the following required arguments were not provided",
        ),
        (
            &["run", "x.yaml", "--grace-period", "soon"],
            "is not a number of seconds",
        ),
        (&["frobnicate"], "unrecognized subcommand 'frobnicate'"),
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(want),
            "{args:?}: {err}"
        );
        assert!(
            err.trim_end()
                .ends_with("For more information, try '--help'."),
            "{args:?}: {err}"
        );
    }
}

/// `run` with its console on a terminal (a pty through `script`): the launcher's own lines
/// ("guest booted in …", its log) share the terminal with the guest console, and must never
/// land in the middle of a guest line. The demo guest writes the boot timer and then prints
/// "boot-timer: written", so the launcher's boot line races with that guest line every run.
#[test]
fn run_on_a_terminal_never_splits_a_guest_line() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/demo-vmi.yaml");
    for run in 0..12 {
        let out = Command::new("script")
            .args([
                "-qec",
                &format!("{BIN} run {}", example.display()),
                "/dev/null",
            ])
            .stdin(Stdio::null())
            .output()
            .expect("script (util-linux) runs the launcher on a pty");
        let text = String::from_utf8_lossy(&out.stdout).replace('\r', "");
        assert_eq!(out.status.code(), Some(0), "run {run}:\n{text}");
        for line in text.lines() {
            if let Some(at) = line.find("virt-launcher:") {
                assert_eq!(
                    at, 0,
                    "run {run}: a launcher line inside a guest line: {line:?}\n{text}"
                );
            }
        }
        for want in ["boot-timer: written", "end"] {
            assert!(
                text.lines().any(|l| l == want),
                "run {run}: no intact {want:?} line:\n{text}"
            );
        }
        assert!(
            text.lines()
                .any(|l| l.starts_with("virt-launcher: guest booted in ")),
            "run {run}:\n{text}"
        );
        assert_eq!(
            text.lines().last(),
            Some("virt-launcher: info: guest powered off"),
            "run {run}: the launcher's closing line comes last:\n{text}"
        );
    }
}

/// Names that become paths: an emptyDisk named `../pvcs/data` would be created as
/// `<root>/empty-disks/../pvcs/data/disk.img`, i.e. truncate the PVC's image. The launcher
/// refuses such names (pod mode and local YAML alike) before touching any file.
#[test]
fn volume_and_disk_names_that_are_not_dns_labels_are_refused() {
    let mut doc: serde_json::Value =
        serde_json::from_str(&pod_document("names", "testguest.scenario=basic", 5)).unwrap();
    doc["spec"]["domain"]["devices"]["disks"] =
        serde_json::json!([{"name": "data"}, {"name": "../pvcs/data"}]);
    doc["spec"]["volumes"] = serde_json::json!([
        {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
        {"name": "../pvcs/data", "emptyDisk": {"capacity": "1Mi"}}
    ]);
    let pod = Pod::new("names", &doc.to_string());
    let img = pod.root().join("pvcs/data/disk.img");
    std::fs::create_dir_all(img.parent().unwrap()).unwrap();
    let content = vec![0x5au8; 8 << 20];
    std::fs::write(&img, &content).unwrap();
    let out = pod.cmd(&["pod"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let msg = std::fs::read_to_string(pod.term_log()).unwrap();
    assert!(
        msg.starts_with("invalid VMI document: ")
            && msg
                .contains("spec.domain.devices.disks[1].name \"../pvcs/data\" must be a DNS label"),
        "{msg}"
    );
    assert!(msg.contains("reason=InvalidVMI\n"), "{msg}");
    assert_eq!(
        std::fs::read(&img).unwrap(),
        content,
        "the PVC image is untouched"
    );

    // Local YAML: the same check, for every path-bearing name.
    let t = TempDir::new("names-run");
    for (what, extra) in [
        (
            "spec.volumes[0].name",
            "    devices: {disks: []}\n  volumes: [{name: ../x, emptyDisk: {capacity: 1Mi}}]\n",
        ),
        (
            "spec.domain.devices.disks[0].name",
            "    devices: {disks: [{name: Root}]}\n  volumes: [{name: root, emptyDisk: {capacity: 1Mi}}]\n",
        ),
    ] {
        let vmi = demo_vmi(t.path(), "names", "", extra);
        let out = Command::new(BIN).arg("run").arg(&vmi).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{what}: {err}");
        assert!(err.contains(what) && err.contains("must be a DNS label"), "{what}: {err}");
    }
    let vmi = t.path().join("badname.yaml");
    std::fs::write(&vmi, "metadata: {name: ../../etc}\n").unwrap();
    let out = Command::new(BIN).arg("run").arg(&vmi).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("metadata.name") && err.contains("DNS subdomain"),
        "{err}"
    );
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
