//! Decodes the generated ACPI tables with ACPICA's disassembler (`iasl -d`, Debian
//! `acpica-tools`): every table but the RSDP (which `iasl -d` does not take alone) must
//! disassemble without errors, and the DSDT must name the devices the device manager placed,
//! COM1, the i8042, the power button and the GED. ACPICA's interpreter (`acpiexec`) then
//! evaluates `\_S5_`, the GED's `_EVT` and a device's `_CRS` from the DSDT.
//!
//! `cargo xtask test` installs `acpica-tools`; run alone, this test installs it when it runs
//! as root with apt-get, and otherwise fails saying what to install.
//!
//! `ACPI_IASL_SHOW=DIR` prints the disassembled DSDT and writes every table to `DIR/<SIG>.dat`.

mod common;

use std::path::Path;
use std::process::Command;

use vmm::acpi;
use vmm::device_manager::mmio::MmioDeviceManager;

fn have_iasl() -> bool {
    Command::new("iasl")
        .arg("-v")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn ensure_iasl() {
    if have_iasl() {
        return;
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if root && Path::new("/usr/bin/apt-get").exists() {
        eprintln!("[setup] apt-get install acpica-tools");
        let _ = Command::new("apt-get").args(["update", "-q"]).status();
        let _ = Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args([
                "install",
                "-y",
                "-q",
                "--no-install-recommends",
                "acpica-tools",
            ])
            .status();
    }
    assert!(
        have_iasl(),
        "iasl (ACPICA's compiler/disassembler) is missing: install Debian's acpica-tools \
         (apt-get install acpica-tools) or run `cargo xtask test`, which installs it"
    );
}

/// Disassembles `bytes` as `name.dat` in `dir`; returns the `.dsl` text.
fn disassemble(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let dat = dir.join(format!("{name}.dat"));
    std::fs::write(&dat, bytes).unwrap();
    let out = Command::new("iasl")
        .current_dir(dir)
        .args(["-d", dat.to_str().unwrap()])
        .output()
        .expect("running iasl");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "iasl -d {name}: {text}");
    assert!(!text.contains("Error"), "iasl -d {name}: {text}");
    std::fs::read_to_string(dir.join(format!("{name}.dsl"))).unwrap()
}

#[test]
fn iasl_decodes_every_table() {
    ensure_iasl();
    let dir = common::TempDir::new("acpi-iasl");
    let mut mgr = MmioDeviceManager::new();
    for name in ["blk0", "blk1", "net0", "rng"] {
        mgr.allocate(name).unwrap();
    }
    let t = acpi::create(2, &mgr).unwrap();

    let dsdt = disassemble(&dir, "dsdt", &t.dsdt.bytes);
    if let Some(out) = std::env::var_os("ACPI_IASL_SHOW") {
        eprintln!("{dsdt}");
        for tb in t.all() {
            let sig = String::from_utf8_lossy(&tb.bytes[..4]).replace(' ', "_");
            std::fs::write(Path::new(&out).join(format!("{sig}.dat")), &tb.bytes).unwrap();
        }
    }
    assert_eq!(dsdt.matches("\"LNRO0005\"").count(), 4, "{dsdt}");
    for (i, d) in mgr.devices().iter().enumerate() {
        assert!(dsdt.contains(&format!("Device (V{i:03X})")), "{dsdt}");
        assert!(
            dsdt.contains(&format!("0x{:08X},", d.slot.addr)),
            "slot {:#x}: {dsdt}",
            d.slot.addr
        );
    }
    for needle in [
        "EisaId (\"PNP0501\")",
        "EisaId (\"PNP0303\")",
        "EisaId (\"PNP0C0C\")",
        "\"ACPI0013\"",
        "Method (_EVT, 1, Serialized)",
        "Notify (\\_SB.PWRB, 0x80)",
        "Device (VGEN)",
        "Name (_HID, \"QEMUVGID\")",
        "Name (_CID, \"VM_Gen_Counter\")",
        "Name (_DDN, \"VM_Gen_Counter\")",
        "Method (ADDR, 0, NotSerialized)",
        "Notify (\\_SB.VGEN, 0x80)",
        "Name (_S5, Package",
        "OperationRegion (GDST, SystemIO, 0x0600, One)",
    ] {
        assert!(dsdt.contains(needle), "{needle}: {dsdt}");
    }

    // ACPICA's interpreter (acpiexec, same package) loads the DSDT and runs what a kernel runs:
    // \_S5_ for power-off, the GED's _EVT on its interrupt, a device's _CRS.
    let out = Command::new("acpiexec")
        .current_dir(&*dir)
        .args([
            "-b",
            "evaluate \\_S5_; execute \\_SB.GED._EVT 3; evaluate \\_SB.V003._CRS; evaluate \\_SB.VGEN.ADDR",
            "dsdt.dat",
        ])
        .output()
        .expect("running acpiexec");
    let exec = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "acpiexec: {exec}");
    for bad in ["AE_", "Error", "Exception"] {
        assert!(!exec.contains(bad), "acpiexec: {bad}: {exec}");
    }
    assert!(
        exec.contains("Contains 4 Elements:\n    [Integer] = 0000000000000005"),
        "\\_S5_ = {{5, ..}}: {exec}"
    );
    assert!(exec.contains("Evaluating \\_SB.GED._EVT"), "{exec}");
    // The generation ID's address, as the two 32-bit halves Linux's vmgenid driver reads.
    assert!(
        exec.contains(&format!(
            "Contains 2 Elements:\n    [Integer] = {:016X}\n    [Integer] = 0000000000000000",
            vmm::arch::x86_64::layout::VMGENID_ADDR
        )),
        "\\_SB.VGEN.ADDR: {exec}"
    );
    assert!(
        exec.contains("Evaluation of \\_SB.V003._CRS returned"),
        "{exec}"
    );

    let madt = disassemble(&dir, "apic", &t.madt.bytes);
    assert_eq!(
        madt.matches("Subtable Type : 00 [Processor Local APIC]")
            .count(),
        2,
        "{madt}"
    );
    assert!(madt.contains("[I/O APIC]"), "{madt}");
    assert!(madt.contains("[Interrupt Source Override]"), "{madt}");
    assert!(madt.contains("[Local APIC NMI]"), "{madt}");

    let fadt = disassemble(&dir, "facp", &t.fadt.bytes);
    assert!(
        fadt.contains("Hardware Reduced (V5) : 1"),
        "HW_REDUCED_ACPI: {fadt}"
    );
    assert!(fadt.contains("Reset Register Supported (V2) : 1"), "{fadt}");
    assert!(
        fadt.contains("8042 Present on ports 60/64 (V2) : 1"),
        "{fadt}"
    );

    let xsdt = disassemble(&dir, "xsdt", &t.xsdt.bytes);
    assert_eq!(xsdt.matches("ACPI Table Address").count(), 2, "{xsdt}");
    // iasl -d does not take a bare RSDP ("not a valid ACPI table"); the unit tests check it.
}
