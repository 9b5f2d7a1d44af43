//! End-to-end scenarios: `microvm` boots real Linux guests inside the QEMU-TCG test host (or directly
//! on a host with hardware KVM). Every scenario runs in ONE test-host boot, shared by the tests
//! below; each test asserts on its own scenario's output.

use std::sync::OnceLock;

use microvirt_testhost::scenarios::{self, Section, SuiteResult};

fn suite() -> &'static SuiteResult {
    static SUITE: OnceLock<Result<SuiteResult, String>> = OnceLock::new();
    let r = SUITE.get_or_init(|| {
        let echo = std::env::var_os("MICROVIRT_QUIET").is_none();
        let prep = scenarios::prepare().map_err(|e| format!("preparing the test host: {e}"))?;
        let r = scenarios::run_suite(&prep, scenarios::ALL, echo).map_err(|e| e.to_string())?;
        eprintln!(
            "[e2e] ran {} scenarios {} in {:.1} s (test host ready at {:?} s guest time); log: {}",
            r.sections.len(),
            r.mode,
            r.console.wall_secs,
            r.l1_boot_secs,
            r.console.log.display()
        );
        Ok(r)
    });
    match r {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    }
}

fn section(name: &str) -> &'static Section {
    let s = suite();
    match s.section(name) {
        Some(sec) => {
            assert_eq!(
                sec.rc,
                Some(0),
                "scenario {name} script did not finish cleanly:\n{}",
                sec.tail(40)
            );
            sec
        }
        None => panic!(
            "scenario {name} produced no output; console tail:\n{}",
            s.console.lines[s.console.lines.len().saturating_sub(40)..].join("\n")
        ),
    }
}

fn assert_exit0(sec: &Section, vm: &str) {
    assert_eq!(
        sec.vm_exit(vm).as_deref(),
        Some("0"),
        "microvm run {vm:?} did not exit 0; its output:\n{}",
        sec.vm_lines(vm).join("\n")
    );
}

/// The value of the guest's `microvirt: KEY VALUE` line (KEY a whole word: `read` does not
/// match `ready`).
fn guest(sec: &Section, vm: &str, key: &str) -> Option<String> {
    let p = format!("microvirt: {key}");
    sec.vm_lines(vm).into_iter().find_map(|l| {
        let rest = l.trim().strip_prefix(p.as_str())?;
        let word_ends = key.ends_with(char::is_whitespace)
            || rest.is_empty()
            || rest.starts_with(char::is_whitespace);
        word_ends.then(|| rest.trim().to_string())
    })
}

#[test]
fn boot_initramfs_reaches_init_and_acpi_poweroff_exits_0() {
    let sec = section("boot-initrd");
    let root = guest(sec, "initrd", "root").unwrap_or_default();
    assert!(
        root.ends_with(" rootfs"),
        "init did not run from the initramfs (root {root:?}):\n{}",
        sec.tail(60)
    );
    assert!(
        guest(sec, "initrd", "poweroff").is_some(),
        "init never reached its power-off:\n{}",
        sec.tail(60)
    );
    assert_powered_off(sec, "initrd");
    assert!(
        sec.vm_lines("initrd")
            .iter()
            .any(|l| l.contains("boot-time-ms=")),
        "no boot-timer line from an initramfs boot:\n{}",
        sec.tail(60)
    );
    assert_exit0(sec, "initrd");
}

#[test]
fn boot_vmlinux_root_on_virtio_blk_and_reboot_exits_0() {
    let sec = section("boot");
    assert_eq!(
        guest(sec, "boot", "root").as_deref(),
        Some("/dev/vda ext4"),
        "root not on virtio-blk:\n{}",
        sec.tail(60)
    );
    assert!(
        guest(sec, "boot", "reboot").is_some(),
        "init never reached its reboot:\n{}",
        sec.tail(60)
    );
    assert_acpi_devices(sec, "boot");
    assert!(
        sec.vm_lines("boot")
            .iter()
            .any(|l| l.contains("guest reset; VM stopped")),
        "the reboot did not end the VM as a guest reset:\n{}",
        sec.vm_lines("boot").join("\n")
    );
    assert_exit0(sec, "boot");
}

#[test]
fn boot_bzimage_root_on_virtio_blk_and_acpi_poweroff_exits_0() {
    let sec = section("boot-bzimage");
    assert_eq!(
        guest(sec, "bzimage", "root").as_deref(),
        Some("/dev/vda ext4"),
        "{}",
        sec.tail(60)
    );
    assert_acpi_devices(sec, "bzimage");
    assert!(
        guest(sec, "bzimage", "poweroff").is_some(),
        "init never reached its power-off:\n{}",
        sec.tail(60)
    );
    assert_powered_off(sec, "bzimage");
}

/// The shipped kernel ran with ACPI: it found the VMM's tables, its one virtio disk is bound
/// once, the VM generation ID driver is bound, and the kernel log has no ACPI error or warning.
/// The disk is both in the DSDT and on the command line (`virtio_mmio.device=`, for kernels
/// without ACPI): the kernel registers it twice, and the second registration — the command
/// line's `virtio-mmio.0` — fails on the MMIO region the first one holds (-EBUSY). That one line
/// per device is the only failure allowed.
fn assert_acpi_devices(sec: &Section, vm: &str) {
    let lines = sec.vm_lines(vm).join("\n");
    let tables = guest(sec, vm, "acpi").unwrap_or_default();
    for t in ["APIC", "DSDT", "FACP"] {
        assert!(
            tables.split_whitespace().any(|w| w == t),
            "{vm}: ACPI table {t} not in {tables:?}:\n{lines}"
        );
    }
    assert_eq!(
        guest(sec, vm, "virtio-bound").as_deref(),
        Some("1"),
        "{vm}: the virtio disk is not bound exactly once:\n{lines}"
    );
    assert_eq!(
        guest(sec, vm, "vmgenid").as_deref(),
        Some("1"),
        "{vm}: the vmgenid driver is not bound:\n{lines}"
    );
    let prefix = "microvirt: klog-problem ";
    let (duplicates, others): (Vec<&str>, Vec<&str>) = sec
        .vm_lines(vm)
        .into_iter()
        .filter_map(|l| l.trim().strip_prefix(prefix))
        .partition(|l| l.ends_with("virtio-mmio: probe of virtio-mmio.0 failed with error -16"));
    assert!(
        others.is_empty(),
        "{vm}: the kernel log has problems: {others:?}\n{lines}"
    );
    assert_eq!(
        duplicates.len(),
        1,
        "{vm}: expected the command line's copy of the disk to fail its probe once:\n{lines}"
    );
}

/// The guest's power-off ended the VM as a shutdown (S5), exit 0.
fn assert_powered_off(sec: &Section, vm: &str) {
    assert!(
        sec.vm_lines(vm)
            .iter()
            .any(|l| l.contains("guest powered off")),
        "{vm}: the VM did not end as a guest power-off:\n{}",
        sec.vm_lines(vm).join("\n")
    );
}

#[test]
fn boot_time_line_present_and_plausible() {
    let sec = section("boot");
    let line = sec
        .vm_lines("boot")
        .into_iter()
        .find(|l| l.contains("boot-time-ms="))
        .unwrap_or_else(|| panic!("no boot-time-ms line from microvm:\n{}", sec.tail(60)));
    let field = |k: &str| -> f64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {k} number in {line:?}"))
    };
    let wall = field("boot-time-ms=");
    let cpu = field("cpu-ms=");
    // Nested under TCG a boot takes seconds; a value outside (0, 60 s] is a broken timer.
    assert!(
        wall > 0.0 && wall <= 60_000.0,
        "implausible boot-time-ms {wall}"
    );
    assert!(
        cpu >= 0.0 && cpu <= wall * 4.0 + 50.0,
        "implausible cpu-ms {cpu} (wall {wall})"
    );
    // The init writes the boot timer when the guest is ready: after its first line, right
    // before its `ready` line (docs/boot-time.md).
    let lines = sec.vm_lines("boot");
    let pos = |what: &str| {
        lines
            .iter()
            .position(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no {what:?} line:\n{}", sec.tail(60)))
    };
    assert!(pos("microvirt: init up") < pos("boot-time-ms="));
    assert!(pos("microvirt: ready") < pos("microvirt: scenario boot"));
    // ...and the timer cannot be later than the VMM's exit.
    let start: f64 = sec
        .values("check vm boot start ")
        .first()
        .and_then(|v| v.parse().ok())
        .expect("start uptime");
    let end: f64 = sec
        .values("check vm boot exit=0 end ")
        .first()
        .and_then(|v| v.parse().ok())
        .expect("end uptime");
    assert!(
        wall <= (end - start) * 1000.0 + 20.0,
        "boot-time-ms {wall} exceeds the whole run ({:.0} ms)",
        (end - start) * 1000.0
    );
}

#[test]
fn disk_write_persists_to_next_boot() {
    let sec = section("persist");
    let token = sec.value("check token ").expect("token line").to_string();
    assert_eq!(
        guest(sec, "write", "wrote").as_deref(),
        Some(token.as_str()),
        "{}",
        sec.tail(60)
    );
    assert_exit0(sec, "write");
    assert_eq!(
        guest(sec, "read", "read").as_deref(),
        Some(token.as_str()),
        "the second boot did not see the file:\n{}",
        sec.tail(60)
    );
    assert_exit0(sec, "read");
}

#[test]
fn rng_device_is_the_linux_guests_hardware_rng() {
    let sec = section("rng");
    assert_eq!(
        guest(sec, "rng", "hwrng ").as_deref(),
        Some("virtio_rng.0"),
        "{}",
        sec.vm_lines("rng").join("\n")
    );
    // Two reads of 32 bytes (64 hex digits each) that differ.
    assert_eq!(
        guest(sec, "rng", "hwrng-read ").as_deref(),
        Some("64 differ"),
        "{}",
        sec.vm_lines("rng").join("\n")
    );
    assert_exit0(sec, "rng");
}

#[test]
fn readonly_disk_refuses_writes() {
    let sec = section("readonly");
    let lines = sec.vm_lines("ro").join("\n");
    assert!(
        lines.contains("microvirt: vdb ro=1"),
        "vdb not read-only:\n{lines}"
    );
    assert!(lines.contains("microvirt: ro-read ok"), "{lines}");
    assert!(lines.contains("microvirt: ro-write refused"), "{lines}");
    assert!(
        lines.contains("microvirt: ro-mount-write refused"),
        "{lines}"
    );
    assert_eq!(
        sec.value("check data-before "),
        sec.value("check data-after "),
        "read-only image changed"
    );
    assert_exit0(sec, "ro");
}

#[test]
fn overlay_disk_leaves_base_unchanged() {
    let sec = section("overlay");
    let token = sec.value("check token ").expect("token line");
    assert_eq!(
        guest(sec, "overlay", "overlay wrote").as_deref(),
        Some(token),
        "{}",
        sec.tail(60)
    );
    assert_exit0(sec, "overlay");
    let before = sec.value("check base-before ").expect("hash before");
    assert_eq!(
        Some(before),
        sec.value("check base-after "),
        "base image changed"
    );
}

#[test]
fn network_tcp_both_ways_over_tap() {
    let sec = section("net");
    assert!(
        !sec.contains("check tunctl failed"),
        "could not create the TAP:\n{}",
        sec.tail(40)
    );
    assert_eq!(
        guest(sec, "net", "eth0").as_deref(),
        Some("10.0.2.2/24"),
        "guest address:\n{}",
        sec.tail(60)
    );
    assert_eq!(
        sec.value("check host got"),
        Some("hello-from-guest"),
        "guest → host TCP:\n{}",
        sec.tail(60)
    );
    assert_eq!(
        guest(sec, "net", "net got").as_deref(),
        Some("hello-from-host"),
        "host → guest TCP:\n{}",
        sec.tail(60)
    );
    assert_exit0(sec, "net");
}

#[test]
fn smp_guest_sees_two_cpus() {
    let sec = section("smp");
    assert_eq!(
        guest(sec, "smp", "nproc").as_deref(),
        Some("2"),
        "{}",
        sec.tail(60)
    );
    assert_eq!(guest(sec, "smp", "cpuinfo").as_deref(), Some("2"));
    assert_exit0(sec, "smp");
}

#[test]
fn serial_console_runs_typed_commands_short_and_longer_than_the_fifo() {
    let sec = section("console");
    for vm in ["console", "console-noacpi"] {
        let lines = sec.vm_lines(vm);
        assert!(
            lines.iter().any(|l| l.trim() == "typed-42"),
            "{vm}: the typed command's output did not come back:\n{}",
            lines.join("\n")
        );
        // 180 characters and its newline, in a line of ~210 bytes typed at once.
        assert!(
            lines.iter().any(|l| l.trim() == "long-181"),
            "{vm}: the long typed command's output did not come back:\n{}",
            lines.join("\n")
        );
        assert_exit0(sec, vm);
    }
}

#[test]
fn sigterm_powers_the_linux_guest_off_through_the_acpi_power_button() {
    let sec = section("shutdown");
    assert!(
        guest(sec, "shutdown", "waiting for shutdown").is_some(),
        "the guest never reached its idle loop:\n{}",
        sec.tail(60)
    );
    let lines = sec.vm_lines("shutdown").join("\n");
    assert!(
        lines.contains("ACPI power button"),
        "microvm did not press the power button:\n{lines}"
    );
    assert!(
        guest(sec, "shutdown", "power-button").is_some(),
        "the guest's init never saw the power button:\n{lines}"
    );
    assert!(guest(sec, "shutdown", "poweroff").is_some(), "{lines}");
    assert_powered_off(sec, "shutdown");
    assert_exit0(sec, "shutdown");
}

#[test]
fn sigterm_without_acpi_falls_back_to_ctrl_alt_del() {
    let sec = section("shutdown");
    let lines = sec.vm_lines("shutdown-noacpi").join("\n");
    assert!(
        guest(sec, "shutdown-noacpi", "waiting for shutdown").is_some(),
        "the guest never reached its idle loop:\n{}",
        sec.tail(60)
    );
    assert!(
        guest(sec, "shutdown-noacpi", "ctrl-alt-del").is_some(),
        "the guest's init never saw Ctrl-Alt-Del:\n{lines}"
    );
    assert!(guest(sec, "shutdown-noacpi", "reboot").is_some(), "{lines}");
    assert_exit0(sec, "shutdown-noacpi");
}

#[test]
fn snapshot_restore_linux_console_disk_network_wall_clock_and_rng_reseed() {
    let sec = section("snapshot");
    let snap = sec.value("check snapshot ").unwrap_or_default();
    assert!(
        snap.contains("\"ok\":true") && snap.contains("\"state\":\"paused\""),
        "snapshot through the control socket failed: {snap}\n{}",
        sec.tail(60)
    );
    let files = sec.value("check snapshot-files ").unwrap_or_default();
    for f in ["disk0.overlay", "memory", "vmstate"] {
        assert!(
            files.split_whitespace().any(|x| x == f),
            "{f} missing: {files}"
        );
    }
    // The original resumed after the snapshot and shut down on its own.
    assert_exit0(sec, "first");
    assert_exit0(sec, "second");
    let second = sec.vm_lines("second");
    let has = |needle: &str| second.iter().any(|l| l.trim() == needle);
    assert!(
        !second.iter().any(|l| l.contains("microvirt: init up")),
        "the restored guest booted again:\n{}",
        second.join("\n")
    );
    assert!(
        has("typed-42"),
        "the typed command did not run:\n{}",
        second.join("\n")
    );
    assert!(
        has("before-snapshot"),
        "the file written before the snapshot is gone:\n{}",
        second.join("\n")
    );
    let first = sec.vm_lines("first");
    assert!(
        first.iter().any(|l| l.trim() == "vm-forks-0"),
        "before the snapshot the kernel should not have reseeded for a VM fork:\n{}",
        first.join("\n")
    );
    assert!(
        has("vm-forks-1"),
        "the restored kernel did not reseed its RNG for the new VM generation ID once:\n{}",
        second.join("\n")
    );
    assert!(
        has("disk-after-restore"),
        "root disk write after restore:\n{}",
        second.join("\n")
    );
    assert!(
        has("net-sent"),
        "TCP from the restored guest:\n{}",
        second.join("\n")
    );
    assert_eq!(
        sec.value("check host got ").map(str::trim),
        Some("hello-after-restore")
    );
    let times = sec.value("check host-time ").unwrap_or_default();
    let mut t = times.split_whitespace().map(|v| v.parse::<i64>());
    let (host, guest) = match (t.next(), t.next()) {
        (Some(Ok(h)), Some(Ok(g))) => (h, g),
        _ => panic!("no guest time:\n{}", second.join("\n")),
    };
    assert!(
        (-1..=3).contains(&(host - guest)),
        "guest wall clock {guest}, test host {host} when the line arrived (5 s passed between \
         snapshot and restore: without the clock advance the guest is that much behind)"
    );
}
