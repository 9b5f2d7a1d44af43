//! In-place reboots on /dev/kvm with the test guest's `reboot` scenario: the guest counts its
//! boots on a disk (which the reboot keeps), checks that a word it wrote into RAM before the
//! reboot reads zero after it, and reboots through the i8042 or the ACPI reset register; every
//! boot prints the test guest's banner from one `microvm` process. With the default
//! (`--reboot exit`) the first reboot ends the VM; a triple fault stays a crash either way.

mod common;
use common::*;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use vmm::config::RebootPolicy;
use vmm::devices::legacy::serial::SerialOut;
use vmm::lifecycle::VmState;
use vmm::{Action, BuildOptions, ExitReason, SerialConfig, VmConfig, Vmm};

/// A zeroed 1 MiB disk image in `dir`.
fn disk(dir: &std::path::Path) -> std::path::PathBuf {
    let p = dir.join("disk.img");
    std::fs::write(&p, vec![0u8; 1 << 20]).unwrap();
    p
}

fn count(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

fn check_reboots(r: &Run, entry: &str, reboots: usize, cpus: u32) {
    r.assert_ok();
    let banner = format!("microvirt-testguest: entry={entry}");
    assert_eq!(count(&r.stdout, &banner), reboots + 1, "{}", r.stdout);
    for boot in 1..=reboots + 1 {
        assert!(
            r.stdout
                .contains(&format!("reboot: boot={boot} ram=clear\n")),
            "boot {boot}:\n{}\nstderr:\n{}",
            r.stdout,
            r.stderr
        );
    }
    assert!(!r.stdout.contains("NOT-CLEARED"), "{}", r.stdout);
    assert_eq!(
        count(&r.stdout, &format!("cpus: {cpus}/{cpus}\n")),
        reboots + 1,
        "{}",
        r.stdout
    );
    assert!(
        r.stdout
            .contains(&format!("reboot: done after {reboots} reboots")),
        "{}",
        r.stdout
    );
    for n in 1..=reboots {
        assert!(
            r.stderr
                .contains(&format!("guest rebooted in place (reboot {n};")),
            "{}",
            r.stderr
        );
    }
    assert!(
        r.stderr.contains("guest powered off; VM stopped"),
        "{}",
        r.stderr
    );
}

/// The PVH test guest (64 MiB) on a fresh zeroed `img` with `--reboot policy`.
fn pvh_on_fresh_disk(img: &std::path::Path, policy: &str, cmdline: &str) -> Run {
    std::fs::write(img, vec![0u8; 1 << 20]).unwrap();
    run(
        &[
            "--kernel",
            guest().pvh.to_str().unwrap(),
            "--mem-mib",
            "64",
            "--disk",
            &format!("path={}", img.display()),
            "--reboot",
            policy,
            "--cmdline",
            cmdline,
        ],
        b"",
    )
}

#[test]
fn reboots_in_place_through_the_i8042_with_cleared_ram_and_the_disk_kept() {
    let d = TempDir::new("reboot-i8042");
    let img = disk(&d);
    // An initrd is loaded again on every boot: the guest sums it each time.
    let initrd = d.join("initrd");
    std::fs::write(&initrd, (0..3000u32).map(|i| i as u8).collect::<Vec<_>>()).unwrap();
    let r = run(
        &[
            "--kernel",
            guest().pvh.to_str().unwrap(),
            "--mem-mib",
            "64",
            "--initrd",
            initrd.to_str().unwrap(),
            "--disk",
            &format!("path={}", img.display()),
            "--reboot",
            "in-place",
            "--cmdline",
            "testguest.scenario=reboot testguest.reboots=3",
        ],
        b"",
    );
    check_reboots(&r, "pvh", 3, 1);
    let initrd_line = r.line("initrd:");
    assert_eq!(
        count(&r.stdout, &format!("initrd: {initrd_line}\n")),
        4,
        "{}",
        r.stdout
    );
    // The disk holds what the last boot wrote: the magic word and the count 4.
    let data = std::fs::read(&img).unwrap();
    assert_eq!(&data[..8], b"mvrboots");
    assert_eq!(u64::from_le_bytes(data[8..16].try_into().unwrap()), 4);
}

#[test]
fn reboots_in_place_through_the_acpi_reset_register_with_two_vcpus() {
    let d = TempDir::new("reboot-acpi");
    let img = disk(&d);
    for kernel in [&guest().linux64, &guest().bzimage] {
        std::fs::write(&img, vec![0u8; 1 << 20]).unwrap();
        let r = run(
            &[
                "--kernel",
                kernel.to_str().unwrap(),
                "--vcpus",
                "2",
                "--mem-mib",
                "64",
                "--disk",
                &format!("path={}", img.display()),
                "--reboot",
                "in-place",
                "--cmdline",
                "testguest.scenario=reboot testguest.reboots=2 testguest.reboot_via=acpi",
            ],
            b"",
        );
        check_reboots(&r, "linux64", 2, 2);
        assert_eq!(
            count(
                &r.stdout,
                "reboot: rebooting via the ACPI reset register 0x603"
            ),
            2,
            "{}",
            r.stdout
        );
    }
}

#[test]
fn exit_on_reboot_is_the_default() {
    let d = TempDir::new("reboot-exit");
    let img = disk(&d);
    let r = run(
        &[
            "--kernel",
            guest().pvh.to_str().unwrap(),
            "--mem-mib",
            "64",
            "--disk",
            &format!("path={}", img.display()),
            "--cmdline",
            "testguest.scenario=reboot testguest.reboots=3",
        ],
        b"",
    );
    r.assert_ok();
    assert_eq!(count(&r.stdout, "microvirt-testguest: entry="), 1);
    assert!(r.stdout.contains("reboot: rebooting via the i8042"));
    assert!(r.stderr.contains("guest reset; VM stopped"), "{}", r.stderr);
    assert!(!r.stderr.contains("rebooted in place"), "{}", r.stderr);
}

/// A guest that pulses the reset line many times per reboot (Linux's keyboard reboot writes it
/// up to ten times, and it may still be writing while the VMM starts the reboot) gets one reboot
/// of them: the requests left from the old boot neither reboot the new one again nor, with
/// `in-place-if-acpi`, end the VM as "not using ACPI" before the new boot armed the GED (seen in
/// the launcher's cloud-image test once the test host had two CPUs: five i8042 resets, one
/// reboot, then the VM ended).
#[test]
fn repeated_reset_requests_make_one_reboot() {
    let d = TempDir::new("reboot-repeated");
    let img = disk(&d);
    for mode in ["in-place", "in-place-if-acpi"] {
        let r = pvh_on_fresh_disk(
            &img,
            mode,
            "testguest.scenario=reboot testguest.reboots=2 testguest.resets=10 \
             testguest.acpi_button=1",
        );
        check_reboots(&r, "pvh", 2, 1);
        assert!(
            !r.stderr.contains("the guest does not use ACPI"),
            "{mode}: {}",
            r.stderr
        );
    }
}

/// A guest does not wait for its reset: Linux's reboot pulses the i8042 for ~2 ms, then tries
/// the next method and ends with a triple fault. When the VMM took longer to stop the vCPUs (a
/// busy host; CI's test host, where the Linux guest's reboot ended as "vCPU 0 triple fault"),
/// the VM ended as a crash. The vCPU that asked now stays out of the guest until the reboot:
/// the guest here triple-faults right after asking, and every reboot still happens.
#[test]
fn a_guest_that_does_not_wait_for_its_reset_still_reboots() {
    let d = TempDir::new("reboot-no-wait");
    let img = disk(&d);
    for via in ["i8042", "acpi"] {
        let r = pvh_on_fresh_disk(
            &img,
            "in-place",
            &format!(
                "testguest.scenario=reboot testguest.reboots=3 testguest.reboot_via={via} \
                 testguest.after_reset=triple-fault"
            ),
        );
        check_reboots(&r, "pvh", 3, 1);
        assert!(!r.stderr.contains("triple fault"), "{via}: {}", r.stderr);
    }
}

/// `in-place-if-acpi` (the launcher's): a guest that armed the GED (as a kernel with ACPI does)
/// reboots in place; one that did not ends the VM with its reset.
#[test]
fn in_place_if_acpi_follows_the_guest() {
    let d = TempDir::new("reboot-if-acpi");
    let img = disk(&d);
    for (args, reboots) in [
        (
            "testguest.scenario=reboot testguest.reboots=2 testguest.acpi_button=1",
            2,
        ),
        ("testguest.scenario=reboot testguest.reboots=2", 0),
    ] {
        let r = pvh_on_fresh_disk(&img, "in-place-if-acpi", args);
        if reboots > 0 {
            check_reboots(&r, "pvh", reboots, 1);
        } else {
            r.assert_ok();
            assert_eq!(count(&r.stdout, "microvirt-testguest: entry="), 1);
            assert!(
                r.stderr.contains("the guest does not use ACPI"),
                "{}",
                r.stderr
            );
            assert!(r.stderr.contains("guest reset; VM stopped"), "{}", r.stderr);
        }
    }
}

#[test]
fn a_triple_fault_stays_a_crash_with_in_place_reboots() {
    let r = run(
        &[
            "--kernel",
            guest().pvh.to_str().unwrap(),
            "--reboot",
            "in-place",
            "--cmdline",
            "testguest.scenario=triple-fault testguest.fault=ud2",
        ],
        b"",
    );
    assert_eq!(r.status.code(), Some(1), "{}\n{}", r.stdout, r.stderr);
    assert_eq!(count(&r.stdout, "microvirt-testguest: entry="), 1);
    assert!(r.stderr.contains("triple fault"), "{}", r.stderr);
}

/// The library API: the controller counts reboots, the reboot notification arrives, and a
/// snapshot of a VM that rebooted restores (the saved state is the current boot's).
#[test]
fn reboot_count_notification_and_a_snapshot_after_a_reboot() {
    let d = TempDir::new("reboot-snap");
    let img = disk(&d);
    let out = Arc::new(Mutex::new(Vec::new()));
    let mut cfg = VmConfig::new(&guest().pvh);
    cfg.mem_mib = 64;
    cfg.vcpus = 2;
    cfg.serial = SerialConfig::None;
    cfg.reboot = RebootPolicy::InPlace;
    cfg.disks = vec![format!("path={}", img.display()).parse().unwrap()];
    cfg.cmdline =
        Some("testguest.scenario=reboot testguest.reboots=1 testguest.reboot_then=halt".into());
    let (reboot_tx, reboot_rx) = std::sync::mpsc::channel();
    let opts = BuildOptions {
        serial_out: Some(SerialOut::Buffer(out.clone())),
        reboot_notify: Some(reboot_tx),
        ..Default::default()
    };
    let vmm = Vmm::build(&cfg, opts).expect("build");
    let ctl = vmm.controller();
    let vm_thread = std::thread::spawn(move || vmm.run());
    assert_eq!(reboot_rx.recv_timeout(Duration::from_secs(30)), Ok(1));
    wait_for(&out, "reboot: halting");
    let st = ctl.status().unwrap();
    assert_eq!((st.state, st.reboots), (VmState::Running, 1));
    let text = String::from_utf8_lossy(&out.lock().unwrap()).to_string();
    assert!(text.contains("reboot: boot=2 ram=clear"), "{text}");

    let snap = d.join("snap");
    vmm::snapshot::create(&ctl, &snap).expect("snapshot after a reboot");
    assert_eq!(ctl.request(Action::Stop), Ok(VmState::Stopped));
    assert_eq!(vm_thread.join().unwrap().unwrap().0, ExitReason::Stopped);

    // The restore continues the second boot: the guest sits halted, its vCPUs resume.
    let rc = vmm::RestoreConfig {
        dir: snap.clone(),
        serial: SerialConfig::None,
        ..Default::default()
    };
    let restored = Vmm::restore(
        &rc,
        BuildOptions {
            serial_out: Some(SerialOut::Buffer(Arc::default())),
            ..Default::default()
        },
    )
    .expect("restore the rebooted VM");
    let ctl2 = restored.controller();
    let t = std::thread::spawn(move || restored.run());
    assert_eq!(ctl2.status().map(|s| s.reboots), Ok(0));
    assert_eq!(ctl2.state(), Ok(VmState::Running));
    assert_eq!(ctl2.request(Action::Stop), Ok(VmState::Stopped));
    assert_eq!(t.join().unwrap().unwrap().0, ExitReason::Stopped);
}
