//! Run mode: booting the demo guest, guest reboots and crashes, refused input, the command line
//! and the console on a terminal.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use microvirt_crds::termination::TerminationMessage;
use microvirt_testsupport::TempDir;

use crate::harness::{demo_vmi, run_cmd, Launcher, BIN};

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
