//! A stock distribution kernel boots unmodified under `microvm`: Debian bookworm's
//! `linux-image-cloud-amd64` with an initramfs made by initramfs-tools, root on a partitioned
//! disk (`tests/testhost/src/stock.rs` builds them from Debian's packages and caches them).
//! That kernel has no MP-table parser and no command-line virtio devices: it finds its second
//! CPU, the IOAPIC, its disks and its NIC only through microvm's ACPI tables. One test-host boot
//! runs the scenarios of `scenarios::STOCK` named in `IN_SUITE`; each test asserts on its own.
//! `stock-no-acpi` (the same kernel without ACPI finds no disk and no second CPU) hung once in
//! the suite under two busy loops (no console output for 470 s after the kernel's PCI line; the
//! root cause is not known) and is left to `cargo xtask testhost stock-no-acpi`.

use std::sync::OnceLock;

use microvirt_testhost::scenarios::{self, Section, SuiteResult};
use microvirt_testhost::stock;

/// The stock scenarios the suite runs. `stock-no-acpi` (it hung once under load, see
/// docs/testing.md) and the `stock-reboot-loop` soak run only as `cargo xtask testhost NAME`.
const IN_SUITE: &[&str] = &["stock-kernel", "stock-power-button", "stock-vmgenid"];

fn suite() -> &'static SuiteResult {
    static SUITE: OnceLock<Result<SuiteResult, String>> = OnceLock::new();
    let r = SUITE.get_or_init(|| {
        let echo = std::env::var_os("MICROVIRT_QUIET").is_none();
        // The Debian guest first: on a cold machine its chroot is made while the guest images'
        // kernel build (prepare) may be running in another test binary.
        let g = stock::build().map_err(|e| format!("building the stock Debian guest: {e}"))?;
        let mut prep = scenarios::prepare().map_err(|e| format!("preparing the test host: {e}"))?;
        prep.guest_files.extend(g.guest_files());
        eprintln!(
            "[stock] {} {} (kernel {}), initramfs {}",
            g.kernel_package,
            g.kernel_version,
            g.release,
            g.initrd.display()
        );
        let selected: Vec<scenarios::Scenario> = scenarios::STOCK
            .iter()
            .copied()
            .filter(|s| IN_SUITE.contains(&s.name))
            .collect();
        let r = scenarios::run_suite(&prep, &selected, echo).map_err(|e| e.to_string())?;
        eprintln!(
            "[stock] ran {} scenarios {} in {:.1} s; log: {}",
            r.sections.len(),
            r.mode,
            r.console.wall_secs,
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
                sec.tail(60)
            );
            sec
        }
        None => panic!(
            "scenario {name} produced no output; console tail:\n{}",
            s.console.lines[s.console.lines.len().saturating_sub(60)..].join("\n")
        ),
    }
}

/// The value of the guest's `microvirt: KEY ...` line (KEY a whole word).
fn guest(sec: &Section, vm: &str, key: &str) -> Option<String> {
    let p = format!("microvirt: {key}");
    sec.vm_lines(vm).into_iter().find_map(|l| {
        let rest = l.trim().strip_prefix(p.as_str())?;
        (rest.is_empty() || rest.starts_with(char::is_whitespace)).then(|| rest.trim().to_string())
    })
}

/// Every `microvirt: KEY ...` line's value.
fn guest_all(sec: &Section, vm: &str, key: &str) -> Vec<String> {
    let p = format!("microvirt: {key} ");
    sec.vm_lines(vm)
        .into_iter()
        .filter_map(|l| l.trim().strip_prefix(p.as_str()).map(|r| r.to_string()))
        .collect()
}

fn out(sec: &Section, vm: &str) -> String {
    sec.vm_lines(vm).join("\n")
}

fn assert_powered_off(sec: &Section, vm: &str) {
    let o = out(sec, vm);
    assert_eq!(
        sec.vm_exit(vm).as_deref(),
        Some("0"),
        "microvm run {vm:?} did not exit 0:\n{o}"
    );
    assert!(
        guest(sec, vm, "poweroff").is_some(),
        "the guest's init never reached its poweroff:\n{o}"
    );
    assert!(
        o.contains("guest powered off; VM stopped"),
        "microvm did not end as an ACPI power-off (S5):\n{o}"
    );
    assert!(
        guest(sec, vm, "still running after poweroff").is_none(),
        "poweroff -f returned:\n{o}"
    );
}

#[test]
fn stock_debian_kernel_finds_cpus_disks_and_nic_through_acpi_and_powers_off() {
    let sec = section("stock-kernel");
    let o = out(sec, "stock");
    let kernel = guest(sec, "stock", "kernel").unwrap_or_default();
    assert!(
        kernel.ends_with("-cloud-amd64"),
        "not Debian's cloud kernel ({kernel:?}):\n{o}"
    );
    assert_eq!(
        guest(sec, "stock", "root").as_deref(),
        Some("/dev/vda1 ext4"),
        "the root is not the first partition of virtio-blk disk 1:\n{o}"
    );
    assert_eq!(
        guest(sec, "stock", "cpus online").as_deref(),
        Some("0-1 nproc 2"),
        "the second vCPU is not online (MADT):\n{o}"
    );
    let block: Vec<String> = guest(sec, "stock", "block")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    for dev in ["vda", "vda1", "vdb"] {
        assert!(
            block.iter().any(|b| b == dev),
            "no {dev} in {block:?}:\n{o}"
        );
    }
    let net = guest(sec, "stock", "net").unwrap_or_default();
    assert!(
        net.split_whitespace().any(|n| n == "eth0"),
        "no eth0 ({net:?}):\n{o}"
    );
    let tables = guest(sec, "stock", "acpi-tables").unwrap_or_default();
    for t in ["APIC", "DSDT", "FACP"] {
        assert!(
            tables.split_whitespace().any(|x| x == t),
            "no {t} in /sys/firmware/acpi/tables ({tables:?}):\n{o}"
        );
    }
    // Each of the three virtio devices once, each on a LNRO0005 platform device of the DSDT:
    // nothing registered twice, nothing left without a driver.
    let virtio = guest_all(sec, "stock", "virtio");
    assert_eq!(virtio.len(), 3, "virtio devices {virtio:?}:\n{o}");
    for drv in ["virtio_blk", "virtio_net"] {
        assert!(
            virtio.iter().any(|v| v.contains(&format!("driver={drv} "))),
            "no virtio device bound to {drv}: {virtio:?}"
        );
    }
    assert!(
        virtio.iter().all(|v| v.contains("parent=LNRO0005:")),
        "a virtio device not described by the DSDT: {virtio:?}"
    );
    assert_eq!(
        guest(sec, "stock", "virtio-mmio-probed").as_deref(),
        Some("3"),
        "{o}"
    );
    assert_powered_off(sec, "stock");
}

#[test]
fn stock_kernel_log_has_no_acpi_errors_or_warnings() {
    let sec = section("stock-kernel");
    let o = out(sec, "stock");
    assert!(
        guest(sec, "stock", "klog-end").is_some(),
        "the init did not get to print the kernel log:\n{o}"
    );
    let klog = guest_all(sec, "stock", "klog");
    // The kernel saw our tables, and nothing in them made it complain.
    assert!(
        klog.iter()
            .any(|l| l.contains("ACPI: RSDP 0x00000000000E0000")),
        "the kernel did not find the RSDP:\n{}",
        klog.join("\n")
    );
    let bad: Vec<&String> = klog
        .iter()
        .filter(|l| {
            l.contains("ACPI BIOS Error")
                || l.contains("ACPI Error")
                || l.contains("ACPI Warning")
                || l.contains("ACPI BIOS Warning")
                || l.contains("FW_BUG")
                || l.contains("[Firmware Bug]")
        })
        .collect();
    assert!(
        bad.is_empty(),
        "ACPI complaints in the kernel log: {bad:#?}"
    );
    // The console shows the kernel's errors even with `quiet`.
    for l in sec.vm_lines("stock") {
        assert!(
            !l.contains("ACPI BIOS Error") && !l.contains("ACPI Error"),
            "ACPI error on the console: {l}"
        );
    }
}

#[test]
fn the_power_button_reaches_the_stock_guest() {
    let sec = section("stock-power-button");
    let o = out(sec, "button");
    assert!(
        guest(sec, "button", "power-button waiting on").is_some(),
        "the guest has no ACPI \"Power Button\" input device:\n{o}"
    );
    let control = sec.values("check control ").join("\n");
    assert!(
        control.contains("\"ok\":true"),
        "microvm refused the power-button request: {control}\n{o}"
    );
    assert!(
        guest(sec, "button", "power-button pressed").is_some(),
        "the guest never saw KEY_POWER:\n{o}"
    );
    assert_powered_off(sec, "button");
}

/// Two restores of one snapshot: the stock guest reads three different VM generation IDs (the
/// booted VM's, each restore's) at the address the DSDT's `VGEN.ADDR` names.
#[test]
fn restores_of_one_snapshot_show_the_stock_guest_new_generation_ids() {
    let sec = section("stock-vmgenid");
    let checks = sec.values("check ");
    let snap = checks.iter().filter(|c| c.starts_with("snapshot ")).count();
    assert!(
        checks
            .iter()
            .any(|c| c.starts_with("snapshot ") && c.contains("\"ok\":true")),
        "the snapshot failed ({snap} answers): {checks:?}\n{}",
        out(sec, "gen")
    );
    let first = guest_all(sec, "gen", "vmgenid");
    assert_eq!(first.len(), 1, "{:?}\n{}", first, out(sec, "gen"));
    let mut ids = first.clone();
    for r in ["r1", "r2"] {
        let seen = guest_all(sec, r, "vmgenid");
        assert_eq!(
            seen.len(),
            1,
            "restore {r}: the guest did not print one new ID: {seen:?}\n{}",
            out(sec, r)
        );
        ids.extend(seen);
    }
    for id in &ids {
        assert!(
            id.len() == 32 && id.chars().all(|c| c.is_ascii_hexdigit()) && id != &"0".repeat(32),
            "not a 16-byte ID read from the guest's memory: {id:?} (all: {ids:?})"
        );
    }
    assert!(
        ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2],
        "the IDs are not all different: {ids:?}"
    );
}
