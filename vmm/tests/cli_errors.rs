//! Bad input to `microvm` gets a one-line error and a non-zero exit, never a panic.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output};

use microvirt_testsupport::TempDir;

fn microvm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_microvm"))
        .args(args)
        .env_remove("MICROVM_T0_MONO_NS")
        .output()
        .expect("run microvm")
}

/// The error line, asserting there is exactly one and no panic.
fn one_line_error(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure, stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("microvm: error:"))
        .collect();
    assert_eq!(errors.len(), 1, "one error line expected: {stderr}");
    errors[0].to_string()
}

/// A usage error in clap's style (as every microvirt binary reports them): exit 2, `error: `
/// first, a hint to `--help` last, no panic. Returns the error line.
fn usage_error(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    let first = stderr.lines().next().unwrap_or_default();
    assert!(first.starts_with("error: "), "{stderr}");
    assert!(
        stderr
            .trim_end()
            .ends_with("For more information, try '--help'."),
        "{stderr}"
    );
    first.to_string()
}

/// A minimal ELF64 executable whose single PT_LOAD segment spans `memsz` bytes at 1 MiB.
fn synthetic_elf(path: &Path, memsz: u64) {
    let mut f = Vec::new();
    // ELF header
    f.extend_from_slice(b"\x7fELF\x02\x01\x01\0");
    f.extend_from_slice(&[0u8; 8]);
    f.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    f.extend_from_slice(&0x3eu16.to_le_bytes()); // x86-64
    f.extend_from_slice(&1u32.to_le_bytes());
    f.extend_from_slice(&0x10_0000u64.to_le_bytes()); // entry
    f.extend_from_slice(&64u64.to_le_bytes()); // phoff
    f.extend_from_slice(&0u64.to_le_bytes()); // shoff
    f.extend_from_slice(&0u32.to_le_bytes());
    f.extend_from_slice(&64u16.to_le_bytes()); // ehsize
    f.extend_from_slice(&56u16.to_le_bytes()); // phentsize
    f.extend_from_slice(&1u16.to_le_bytes()); // phnum
    f.extend_from_slice(&[0u8; 6]);
    // program header: PT_LOAD, RX, offset 0x1000, vaddr=paddr=1 MiB, filesz 16, memsz
    f.extend_from_slice(&1u32.to_le_bytes());
    f.extend_from_slice(&5u32.to_le_bytes());
    f.extend_from_slice(&0x1000u64.to_le_bytes());
    f.extend_from_slice(&0x10_0000u64.to_le_bytes());
    f.extend_from_slice(&0x10_0000u64.to_le_bytes());
    f.extend_from_slice(&16u64.to_le_bytes());
    f.extend_from_slice(&memsz.to_le_bytes());
    f.extend_from_slice(&0x1000u64.to_le_bytes());
    f.resize(0x1000, 0);
    f.extend_from_slice(&[0xf4; 16]); // hlt
    std::fs::File::create(path).unwrap().write_all(&f).unwrap();
}

#[test]
fn missing_kernel_file() {
    let e = one_line_error(&microvm(&["--kernel", "/nonexistent/vmlinux"]));
    assert!(e.contains("cannot open kernel /nonexistent/vmlinux"), "{e}");
}

#[test]
fn garbage_kernel_file() {
    let d = TempDir::new("garbage");
    let k = d.join("garbage");
    std::fs::write(&k, vec![0x5au8; 8192]).unwrap();
    let e = one_line_error(&microvm(&["--kernel", k.to_str().unwrap()]));
    assert!(e.contains("neither an ELF vmlinux nor a bzImage"), "{e}");
}

#[test]
fn memory_too_small_for_kernel() {
    let d = TempDir::new("big");
    let k = d.join("big.elf");
    synthetic_elf(&k, 64 << 20);
    let e = one_line_error(&microvm(&[
        "--kernel",
        k.to_str().unwrap(),
        "--mem-mib",
        "16",
    ]));
    assert!(
        e.contains("needs 65 MiB of guest memory but the VM has 16 MiB"),
        "{e}"
    );
}

#[test]
fn command_line_too_long() {
    let d = TempDir::new("cmdline");
    let k = d.join("k.elf");
    synthetic_elf(&k, 4096);
    let long = "a".repeat(3000);
    let e = one_line_error(&microvm(&[
        "--kernel",
        k.to_str().unwrap(),
        "--cmdline",
        &long,
    ]));
    assert!(
        e.contains("kernel command line is") && e.contains("limit is 2047"),
        "{e}"
    );
}

#[test]
fn zero_vcpus_and_bad_numbers() {
    let e = one_line_error(&microvm(&["--kernel", "/k", "--vcpus", "0"]));
    assert!(e.contains("vcpus must be between 1 and 32, got 0"), "{e}");
    let e = usage_error(&microvm(&["--kernel", "/k", "--mem-mib", "lots"]));
    assert!(
        e.contains("invalid value 'lots' for '--mem-mib <N>'"),
        "{e}"
    );
    let e = usage_error(&microvm(&["--kernel", "/k", "--serial", "tcp:1"]));
    assert!(e.contains("serial must be"), "{e}");
    let e = usage_error(&microvm(&["--restore", "/snap", "--rng"]));
    assert!(e.contains("cannot be used with"), "{e}");
    let e = usage_error(&microvm(&["--bogus"]));
    assert!(e.contains("unexpected argument '--bogus'"), "{e}");
    let e = usage_error(&microvm(&[]));
    assert!(e.contains("--kernel"), "{e}");
}

#[test]
fn help_and_version() {
    let out = microvm(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for want in [
        "Usage: microvm [OPTIONS]",
        "--kernel <PATH>",
        "--disk <path=IMG",
        "Exit status:",
    ] {
        assert!(help.contains(want), "{want:?} missing in:\n{help}");
    }
    let out = microvm(&["--version"]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("microvm {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn bad_config_file() {
    let d = TempDir::new("config");
    let c = d.join("vm.json");
    std::fs::write(&c, r#"{"kernel": "/k", "memory": 5}"#).unwrap();
    let e = usage_error(&microvm(&["--config", c.to_str().unwrap()]));
    assert!(e.contains("unknown field `memory`"), "{e}");
}

#[test]
fn no_access_to_dev_kvm() {
    // Run as an unprivileged user (nobody) who cannot open /dev/kvm (mode 0600 root).
    let d = TempDir::new("nokvm");
    let k = d.join("k.elf");
    synthetic_elf(&k, 4096);
    // The checkout may live where `nobody` cannot reach (e.g. under /root): run a copy.
    let bin = d.join("microvm");
    std::fs::copy(env!("CARGO_BIN_EXE_microvm"), &bin).unwrap();
    use std::os::unix::fs::PermissionsExt;
    for (p, mode) in [(&*d, 0o755), (&k, 0o644), (&bin, 0o755)] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let mut dir = d.parent();
    while let Some(p) = dir {
        let mode = std::fs::metadata(p).unwrap().permissions().mode();
        assert!(
            mode & 0o001 != 0,
            "{} is not searchable by others",
            p.display()
        );
        dir = p.parent();
    }
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            bin.to_str().unwrap(),
        ])
        .args(["--kernel", k.to_str().unwrap()])
        .output()
        .expect("setpriv (util-linux) is needed for this test");
    let e = one_line_error(&out);
    assert!(e.contains("cannot open /dev/kvm"), "{e}");
}
