//! The test host itself: Debian's kernel boots under QEMU TCG with `-cpu max`, the KVM modules load
//! and /dev/kvm appears; the harness splits sections and reports a timeout with the console tail.

use std::time::Duration;

use microvirt_testhost::{images, l1, qemu, scenarios};

#[test]
fn test_host_boots_with_nested_kvm_and_harness_bounds_it() {
    if qemu::hardware_kvm() && std::env::var_os("MICROVIRT_TESTHOST").is_none() {
        // Direct mode: the scenarios use this host's KVM; check it is usable instead.
        assert!(std::fs::metadata("/dev/kvm").is_ok());
        return;
    }
    microvirt_testhost::cmd::ensure_packages(scenarios::HOST_PACKAGES).expect("packages");
    let (imgs, _) = images::build().expect("guest images");
    let kernel = l1::kernel().expect("test-host kernel");
    let dir = std::env::temp_dir().join(format!("microvirt-harness-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("workdir");
    let body = "echo \"=== begin kvm\"\nls -l /dev/kvm\ngrep -c svm /proc/cpuinfo\necho \"=== end kvm rc=$?\"\n";
    let initramfs = dir.join("l1.cpio");
    l1::build_initramfs(
        &l1::InitramfsSpec {
            kernel: &kernel,
            images: &imgs,
            binaries: Vec::new(),
            with_qemu: false,
            files: Vec::new(),
            copies: Vec::new(),
            init: scenarios::l1_init(body),
        },
        &initramfs,
    )
    .expect("initramfs");
    let monitor = dir.join("qemu-monitor.sock");
    let console = qemu::run_console(
        qemu::qemu_tcg_command(
            &kernel.vmlinuz,
            &initramfs,
            qemu::TEST_HOST_APPEND,
            "2G",
            &monitor,
        ),
        &qemu::RunOptions {
            name: "l1".into(),
            timeout: Duration::from_secs(300),
            log: dir.join("console.log"),
            echo: true,
            done_marker: qemu::DONE_MARKER.into(),
            monitor: Some(monitor),
            silence: None,
        },
    )
    .expect("test host run");
    let sections = scenarios::split_sections(&console.lines);
    let kvm = sections.get("kvm").expect("kvm section");
    assert_eq!(kvm.rc, Some(0));
    assert!(
        kvm.lines
            .iter()
            .any(|l| l.starts_with("crw") && l.contains("/dev/kvm")),
        "no /dev/kvm in the test host:\n{}",
        console.lines.join("\n")
    );
    assert!(!console
        .lines
        .iter()
        .any(|l| l.contains("insmod") && l.contains("failed")));

    // A run that never prints the marker is cut off at the timeout and reports its tail.
    let err = qemu::run_console(
        {
            let mut c = std::process::Command::new("sh");
            c.arg("-c").arg("echo first; echo last-line; sleep 30");
            c
        },
        &qemu::RunOptions {
            name: "stuck".into(),
            timeout: Duration::from_secs(2),
            log: dir.join("stuck.log"),
            echo: false,
            done_marker: "never".into(),
            monitor: None,
            silence: None,
        },
    )
    .expect_err("must time out");
    let msg = err.to_string();
    assert!(
        msg.contains("timed out after 2 s") && msg.contains("last-line"),
        "{msg}"
    );

    // A test host that never finishes is cut off too, and QEMU's monitor says where its CPUs
    // were: an idle test host (a shell in `sleep`) is in its own kernel's idle loop, which spins
    // (`idle=poll`, qemu::TEST_HOST_APPEND) rather than halts.
    l1::build_initramfs(
        &l1::InitramfsSpec {
            kernel: &kernel,
            images: &imgs,
            binaries: Vec::new(),
            with_qemu: false,
            files: Vec::new(),
            copies: Vec::new(),
            init: scenarios::l1_init("echo \"=== idle\"\nsleep 600\n"),
        },
        &initramfs,
    )
    .expect("initramfs");
    let monitor = dir.join("qemu-monitor.sock");
    let err = qemu::run_console(
        qemu::qemu_tcg_command(
            &kernel.vmlinuz,
            &initramfs,
            qemu::TEST_HOST_APPEND,
            "2G",
            &monitor,
        ),
        &qemu::RunOptions {
            name: "idle".into(),
            timeout: Duration::from_secs(60),
            log: dir.join("idle.log"),
            echo: true,
            done_marker: qemu::DONE_MARKER.into(),
            monitor: Some(monitor),
            silence: None,
        },
    )
    .expect_err("must time out");
    let tail = match err {
        qemu::RunError::Timeout { tail, .. } => tail,
        e => panic!("not a timeout: {e}"),
    };
    assert!(tail.contains("=== idle"), "{tail}");
    let samples: Vec<&str> = tail.lines().filter(|l| l.starts_with("sample ")).collect();
    assert_eq!(samples.len(), 3 * qemu::TEST_HOST_CPUS, "{tail}");
    assert!(
        samples.iter().all(|l| l.contains("HLT=0")
            && l.ends_with("in the test host's kernel text (nokaslr)")),
        "{tail}"
    );
    let log = std::fs::read_to_string(dir.join("idle.log")).expect("idle log");
    assert!(log.contains("--- info lapic 1"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}
