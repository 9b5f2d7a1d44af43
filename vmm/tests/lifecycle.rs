//! The lifecycle through the library API on a real VM: build paused, resume,
//! pause/resume (kicking vCPUs out of KVM_RUN), refused transitions, stop.

mod common;
use common::{guest, wait_for};

use std::sync::{Arc, Mutex};
use std::time::Duration;

use vmm::builder::RunTimings;
use vmm::devices::legacy::serial::SerialOut;
use vmm::lifecycle::VmState;
use vmm::{Action, BuildOptions, ExitReason, SerialConfig, VmConfig, Vmm};

#[test]
fn pause_resume_ctrl_alt_del_and_stop() {
    let out = Arc::new(Mutex::new(Vec::new()));
    let mut cfg = VmConfig::new(&guest().pvh);
    cfg.vcpus = 2;
    cfg.serial = SerialConfig::None;
    cfg.cmdline = Some("testguest.scenario=halt-forever".into());
    let (boot_tx, boot_rx) = std::sync::mpsc::channel();
    let opts = BuildOptions {
        serial_out: Some(SerialOut::Buffer(out.clone())),
        boot_notify: Some(boot_tx),
        ..Default::default()
    };
    let vmm = Vmm::build(&cfg, opts).expect("build");
    assert!(vmm.cmdline().ends_with("testguest.scenario=halt-forever"));
    let ctl = vmm.controller();
    // Nothing runs before run(): the VM is built paused.
    std::thread::sleep(Duration::from_millis(50));
    assert!(out.lock().unwrap().is_empty(), "guest ran before resume");
    let vm_thread = std::thread::spawn(move || vmm.run());

    let booted = boot_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("boot-timer event");
    assert!(booted.wall_us > 0);
    wait_for(&out, "halting");

    // `vcpus` (describe) on the running VM: both vCPUs halt with interrupts off (the scenario's
    // `cli; hlt`), in long mode; the VM runs again afterwards.
    let d = ctl.describe().expect("describe");
    assert_eq!(d["state"], "running", "{d}");
    let vcpus = d["vcpus"].as_array().expect("vcpus");
    assert_eq!(vcpus.len(), 2, "{d}");
    for (i, v) in vcpus.iter().enumerate() {
        assert_eq!(v["id"], i, "{d}");
        assert!(
            v["rip"].as_str().is_some_and(|r| r.starts_with("0x")),
            "{d}"
        );
        assert_eq!(v["mp_state"], "halted", "{d}");
        assert_eq!(v["interrupts_enabled"], false, "{d}");
        assert!(v["lapic"]["irr"].is_array(), "{d}");
    }
    assert!(d["ioapic"]["unmasked"].is_array(), "{d}");
    assert_eq!(ctl.state(), Ok(VmState::Running));

    // Pause while the vCPUs sit halted inside KVM_RUN: they must be kicked out.
    assert_eq!(ctl.request(Action::Pause), Ok(VmState::Paused));
    // Described while paused, it stays paused.
    assert_eq!(ctl.describe().expect("describe")["state"], "paused");
    assert_eq!(ctl.state(), Ok(VmState::Paused));
    assert!(ctl
        .request(Action::Pause)
        .unwrap_err()
        .contains("cannot go from paused to paused"));
    assert!(ctl
        .request(Action::CtrlAltDel)
        .unwrap_err()
        .contains("paused"));
    assert_eq!(ctl.request(Action::Resume), Ok(VmState::Running));
    assert_eq!(ctl.request(Action::Pause), Ok(VmState::Paused));
    assert_eq!(ctl.request(Action::Resume), Ok(VmState::Running));
    // The halted guest ignores Ctrl-Alt-Del; the request itself is accepted.
    assert_eq!(ctl.request(Action::CtrlAltDel), Ok(VmState::Running));
    assert_eq!(ctl.request(Action::Stop), Ok(VmState::Stopped));

    let (reason, timings): (ExitReason, RunTimings) = vm_thread.join().unwrap().expect("run");
    assert_eq!(reason, ExitReason::Stopped);
    assert_eq!(timings.boot_timer.map(|b| b.wall_us), Some(booted.wall_us));
    assert!(timings.build_us > 0);
    // The VMM thread is gone: further requests fail cleanly.
    assert!(ctl.request(Action::Resume).is_err());
    let text = String::from_utf8_lossy(&out.lock().unwrap()).to_string();
    assert!(text.contains("cpus: 2/2"), "{text}");
}

#[test]
fn guest_reset_ends_run_with_reset() {
    let out = Arc::new(Mutex::new(Vec::new()));
    let mut cfg = VmConfig::new(&guest().linux64);
    cfg.serial = SerialConfig::None;
    // Without ACPI the test guest ends with the i8042 reset (with it, with an S5 power-off).
    cfg.acpi = false;
    let opts = BuildOptions {
        serial_out: Some(SerialOut::Buffer(out.clone())),
        ..Default::default()
    };
    let (reason, _) = Vmm::build(&cfg, opts).unwrap().run().unwrap();
    assert_eq!(reason, ExitReason::GuestReset);
    assert!(String::from_utf8_lossy(&out.lock().unwrap()).contains("boot-timer: written"));
}

#[test]
fn thread_hook_runs_on_each_vm_thread_and_a_failure_ends_the_vm() {
    use vmm::VmThread;
    type Seen = Vec<(VmThread, Option<String>)>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let s = seen.clone();
    let mut cfg = VmConfig::new(&guest().linux64);
    cfg.vcpus = 2;
    cfg.serial = SerialConfig::None;
    let opts = BuildOptions {
        serial_out: Some(SerialOut::Buffer(Arc::default())),
        thread_hook: Some(Arc::new(move |t| {
            let name = std::thread::current().name().map(str::to_string);
            s.lock().unwrap().push((t, name));
            Ok(())
        })),
        ..Default::default()
    };
    let vmm = Vmm::build(&cfg, opts).unwrap();
    let (reason, _) = std::thread::Builder::new()
        .name("vmm-test".into())
        .spawn(move || vmm.run())
        .unwrap()
        .join()
        .unwrap()
        .unwrap();
    assert_eq!(reason, ExitReason::GuestPowerOff);
    let mut got = seen.lock().unwrap().clone();
    got.sort_by_key(|(t, _)| format!("{t:?}"));
    assert_eq!(
        got,
        vec![
            (VmThread::Vcpu(0), Some("vcpu0".to_string())),
            (VmThread::Vcpu(1), Some("vcpu1".to_string())),
            (VmThread::Vmm, Some("vmm-test".to_string())),
        ]
    );

    // A vCPU whose setup fails never runs the guest: the VM ends with that fault (the guest
    // would otherwise halt forever).
    cfg.cmdline = Some("testguest.scenario=halt-forever".into());
    let opts = BuildOptions {
        serial_out: Some(SerialOut::Buffer(Arc::default())),
        thread_hook: Some(Arc::new(|t| match t {
            VmThread::Vcpu(1) => Err("no filter for you".into()),
            _ => Ok(()),
        })),
        ..Default::default()
    };
    let (reason, _) = Vmm::build(&cfg, opts).unwrap().run().unwrap();
    match reason {
        ExitReason::Fault(m) => {
            assert!(m.contains("vCPU 1 thread setup: no filter for you"), "{m}")
        }
        other => panic!("{other:?}"),
    }
}
