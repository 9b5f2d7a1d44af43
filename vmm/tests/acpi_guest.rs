//! The test guest reads the ACPI tables as a guest kernel would (RSDP from the boot
//! information, XSDT, every table's checksum, MADT local APICs, DSDT and `\_S5_`) and powers off
//! through the FADT's sleep control register; the power button reaches it through the GED.

mod common;
use common::*;

use std::sync::{Arc, Mutex};

use vmm::devices::legacy::serial::SerialOut;
use vmm::lifecycle::VmState;
use vmm::{Action, BuildOptions, ExitReason, SerialConfig, VmConfig, Vmm};

fn check_tables(r: &Run, cpus: u32) {
    assert_eq!(
        r.line("acpi: rsdp="),
        "0xe0000 via=bootinfo checksum=ok",
        "{}",
        r.stdout
    );
    assert_eq!(r.line("acpi: xsdt entries="), "2: FACP APIC");
    assert_eq!(r.line("acpi: madt"), format!("lapics={cpus} ioapics=1"));
    let dsdt = r.line("acpi: dsdt len=");
    assert!(dsdt.ends_with(" checksum=ok s5=5"), "{dsdt}");
    assert_eq!(r.line("acpi: tables="), "2 bad=0");
    assert_eq!(r.line("acpi: powering off through port"), "0x601");
    // MP table too (kept for kernels without ACPI).
    assert_eq!(r.line("cpus:"), format!("{cpus}/{cpus}"));
    assert!(
        r.stderr.contains("guest powered off; VM stopped"),
        "{}",
        r.stderr
    );
}

#[test]
fn guest_finds_the_tables_and_powers_off_through_s5_both_protocols() {
    for (kernel, vcpus) in [
        (&guest().pvh, "2"),
        (&guest().linux64, "2"),
        (&guest().pvh, "1"),
    ] {
        let r = run(
            &[
                "--kernel",
                kernel.to_str().unwrap(),
                "--vcpus",
                vcpus,
                "--disk",
                &format!("path={}", kernel.display()),
                "--rng",
                "--cmdline",
                "testguest.scenario=acpi",
            ],
            b"",
        );
        r.assert_ok();
        check_tables(&r, vcpus.parse().unwrap());
    }
}

#[test]
fn without_acpi_there_is_no_rsdp_and_the_mp_table_remains() {
    let r = run(
        &[
            "--kernel",
            guest().pvh.to_str().unwrap(),
            "--vcpus",
            "2",
            "--no-acpi",
            "--cmdline",
            "testguest.scenario=acpi",
        ],
        b"",
    );
    r.assert_ok();
    assert!(r.stdout.contains("acpi: no rsdp"), "{}", r.stdout);
    assert_eq!(r.line("cpus:"), "2/2");
    assert!(r.stderr.contains("guest reset; VM stopped"), "{}", r.stderr);
}

#[test]
fn power_button_reaches_the_guest_which_powers_off() {
    let out = Arc::new(Mutex::new(Vec::new()));
    let mut cfg = VmConfig::new(&guest().pvh);
    cfg.vcpus = 2;
    cfg.serial = SerialConfig::None;
    cfg.cmdline = Some("testguest.scenario=acpi testguest.acpi_button=1".into());
    let opts = BuildOptions {
        serial_out: Some(SerialOut::Buffer(out.clone())),
        ..Default::default()
    };
    let vmm = Vmm::build(&cfg, opts).expect("build");
    let ctl = vmm.controller();
    let vm_thread = std::thread::spawn(move || vmm.run_paused());
    // Paused: refused.
    assert!(ctl
        .request(Action::PowerButton)
        .unwrap_err()
        .contains("cannot press the power button of a paused VM"));
    assert_eq!(ctl.request(Action::Resume), Ok(VmState::Running));
    wait_for(&out, "acpi: waiting for the power button");
    assert_eq!(ctl.request(Action::PowerButton), Ok(VmState::Running));
    let (reason, _) = vm_thread.join().unwrap().expect("run");
    assert_eq!(reason, ExitReason::GuestPowerOff);
    let text = String::from_utf8_lossy(&out.lock().unwrap()).to_string();
    assert!(text.contains("acpi: power button pressed"), "{text}");
}

#[test]
fn power_button_is_refused_without_acpi() {
    let out = Arc::new(Mutex::new(Vec::new()));
    let mut cfg = VmConfig::new(&guest().pvh);
    cfg.acpi = false;
    cfg.serial = SerialConfig::None;
    cfg.cmdline = Some("testguest.scenario=halt-forever".into());
    let opts = BuildOptions {
        serial_out: Some(SerialOut::Buffer(out.clone())),
        ..Default::default()
    };
    let vmm = Vmm::build(&cfg, opts).expect("build");
    let ctl = vmm.controller();
    let vm_thread = std::thread::spawn(move || vmm.run());
    wait_for(&out, "halting");
    assert!(ctl
        .request(Action::PowerButton)
        .unwrap_err()
        .contains("no ACPI"));
    assert_eq!(ctl.request(Action::Stop), Ok(VmState::Stopped));
    let (reason, _) = vm_thread.join().unwrap().expect("run");
    assert_eq!(reason, ExitReason::Stopped);
}
