//! Stopping the guest: soft stop (ACPI power button or Ctrl-Alt-Del), SIGTERM and the grace
//! period, a second signal, in run mode and in pod mode.

use std::time::{Duration, Instant};

use microvirt_crds::termination::{ShutdownOrigin, TerminationMessage};
use microvirt_testsupport::TempDir;

use crate::harness::{demo_vmi, pod_document, run_cmd, Launcher, Pod};

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
