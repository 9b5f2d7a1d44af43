//! End-to-end scenarios: busybox shell scripts (in `tests/testhost/scenarios/`) that run `microvm`
//! inside the test host (or directly on a host with hardware KVM) and print `check ...` lines.
//! One test-host boot runs a whole list of scenarios; their output is split into sections.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::cmd::{self, CmdError};
use crate::images::GuestImages;
use crate::l1::{self, InitramfsSpec, L1Error, L1Kernel};
use crate::qemu::{self, Console, RunError, RunOptions, DONE_MARKER};

/// Shell functions every scenario script gets.
pub const PRELUDE: &str = include_str!("../scenarios/prelude.sh");

/// A scenario: a name and a busybox sh script.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    pub name: &'static str,
    pub script: &'static str,
}

macro_rules! scenario {
    ($name:literal) => {
        Scenario {
            name: $name,
            script: include_str!(concat!("../scenarios/", $name, ".sh")),
        }
    };
}

/// Every scenario, in the order one test-host boot runs them.
pub const ALL: &[Scenario] = &[
    scenario!("boot-initrd"),
    scenario!("boot"),
    scenario!("boot-bzimage"),
    scenario!("persist"),
    scenario!("readonly"),
    scenario!("rng"),
    scenario!("overlay"),
    scenario!("net"),
    scenario!("smp"),
    scenario!("console"),
    scenario!("shutdown"),
    scenario!("snapshot"),
];

/// The stock-kernel scenarios: Debian's own cloud kernel and initramfs-tools initramfs
/// ([`crate::stock`]). They run in a test-host boot of their own (`tests/stock.rs`), after
/// [`add_stock_guest`]; `all` does not include them.
pub const STOCK: &[Scenario] = &[
    scenario!("stock-kernel"),
    scenario!("stock-power-button"),
    scenario!("stock-no-acpi"),
    scenario!("stock-reboot-loop"),
    scenario!("stock-boot-soak"),
    scenario!("stock-vmgenid"),
];

/// Looks a scenario up by name (in [`ALL`] and [`STOCK`]).
pub fn find(name: &str) -> Option<Scenario> {
    ALL.iter().chain(STOCK).copied().find(|s| s.name == name)
}

/// `true` when `sc` needs [`add_stock_guest`].
pub fn needs_stock_guest(sc: &Scenario) -> bool {
    STOCK.iter().any(|s| s.name == sc.name)
}

/// Errors from running scenarios.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error(transparent)]
    Cmd(#[from] CmdError),
    #[error(transparent)]
    L1(#[from] L1Error),
    #[error(transparent)]
    Run(#[from] RunError),
    #[error(transparent)]
    Images(#[from] crate::images::ImagesError),
    #[error("unknown scenario {0:?}")]
    Unknown(String),
    #[error("the test-host kernel was not prepared (Prepared::l1 is None outside direct mode)")]
    NoTestHostKernel,
    #[error(transparent)]
    Stock(#[from] crate::stock::StockError),
    #[error("cargo build of {bin} failed:\n{tail}")]
    Build { bin: String, tail: String },
}

/// The output of one scenario.
#[derive(Debug, Clone, Default)]
pub struct Section {
    /// Exit status of the scenario script (None when its end marker is missing).
    pub rc: Option<i32>,
    pub lines: Vec<String>,
}

impl Section {
    /// Lines that start with `prefix`, with the prefix removed.
    pub fn values<'a>(&'a self, prefix: &str) -> Vec<&'a str> {
        self.lines
            .iter()
            .filter_map(|l| l.trim_start().strip_prefix(prefix))
            .map(str::trim)
            .collect()
    }

    /// First line starting with `prefix`, without it.
    pub fn value<'a>(&'a self, prefix: &str) -> Option<&'a str> {
        self.values(prefix).into_iter().next()
    }

    /// `true` when some line contains `needle`.
    pub fn contains(&self, needle: &str) -> bool {
        self.lines.iter().any(|l| l.contains(needle))
    }

    /// Lines of the guest/VMM run `vm` (prefixed `[vm] ` by the prelude), prefix removed.
    pub fn vm_lines<'a>(&'a self, vm: &str) -> Vec<&'a str> {
        let p = format!("[{vm}] ");
        self.lines
            .iter()
            .filter_map(|l| l.strip_prefix(p.as_str()))
            .collect()
    }

    /// Exit status of `microvm` for run `vm`, from the prelude's "check vm NAME exit=RC" line.
    pub fn vm_exit(&self, vm: &str) -> Option<String> {
        let p = format!("vm {vm} exit=");
        self.values("check ")
            .into_iter()
            .find_map(|v| v.strip_prefix(p.as_str()))
            .map(|v| v.split_whitespace().next().unwrap_or("").to_string())
    }

    /// The last `n` lines, for assertion messages.
    pub fn tail(&self, n: usize) -> String {
        self.lines[self.lines.len().saturating_sub(n)..].join("\n")
    }
}

/// Output of a suite run.
#[derive(Debug, Clone)]
pub struct SuiteResult {
    pub sections: BTreeMap<String, Section>,
    pub console: Console,
    /// How the scenarios ran: "test host (QEMU TCG)" or "directly (hardware KVM)".
    pub mode: String,
    /// Test-host seconds from QEMU start to the first scenario (None when direct).
    pub l1_boot_secs: Option<f64>,
}

impl SuiteResult {
    pub fn section(&self, name: &str) -> Option<&Section> {
        self.sections.get(name)
    }
}

/// Splits console lines into scenario sections by the init's `=== begin NAME` / `=== end NAME rc=N` lines.
pub fn split_sections(lines: &[String]) -> BTreeMap<String, Section> {
    let mut out: BTreeMap<String, Section> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in lines {
        let l = line.trim();
        if let Some(name) = l.strip_prefix("=== begin ") {
            current = Some(name.trim().to_string());
            out.entry(name.trim().to_string()).or_default();
            continue;
        }
        if let Some(rest) = l.strip_prefix("=== end ") {
            let mut it = rest.split_whitespace();
            let name = it.next().unwrap_or_default();
            let rc = it
                .next()
                .and_then(|r| r.strip_prefix("rc="))
                .and_then(|r| r.parse().ok());
            if let Some(s) = out.get_mut(name) {
                s.rc = rc;
            }
            current = None;
            continue;
        }
        if let Some(name) = &current {
            if let Some(s) = out.get_mut(name) {
                s.lines.push(line.clone());
            }
        }
    }
    out
}

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
}

/// Builds a release binary of this workspace and returns its path.
pub fn cargo_build_release(package: &str, bin: &str) -> Result<PathBuf, ScenarioError> {
    cargo_build(package, bin, false)
}

/// The target triple static binaries are built for (`--target` keeps `crt-static` away from
/// build scripts and proc-macros, which cannot be linked statically).
pub const STATIC_TARGET: &str = "x86_64-unknown-linux-gnu";

/// Builds a statically linked (static-pie, glibc) release binary and returns its path, under
/// `target/x86_64-unknown-linux-gnu/release/`. No dynamic loader runs at exec: the VMM reaches
/// `main()` sooner (docs/boot-time.md). Its relative relocations are packed (`DT_RELR`, glibc
/// ≥ 2.36 relocates a static-pie with them): 2.7k relocations take 2 KiB instead of 64 KiB
/// that every start reads and keeps resident.
pub fn cargo_build_release_static(package: &str, bin: &str) -> Result<PathBuf, ScenarioError> {
    cargo_build(package, bin, true)
}

fn cargo_build(package: &str, bin: &str, static_link: bool) -> Result<PathBuf, ScenarioError> {
    let root = workspace_root();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let target = if target.is_absolute() {
        target
    } else {
        root.join(target)
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut c = Command::new(cargo);
    c.current_dir(&root).env("CARGO_TARGET_DIR", &target).args([
        "build",
        "--release",
        "-p",
        package,
        "--bin",
        bin,
    ]);
    let out_dir = if static_link {
        c.args(["--target", STATIC_TARGET]).env(
            "RUSTFLAGS",
            format!(
                "{} -C target-feature=+crt-static -C link-arg=-Wl,-z,pack-relative-relocs",
                std::env::var("RUSTFLAGS").unwrap_or_default()
            )
            .trim(),
        );
        target.join(STATIC_TARGET).join("release")
    } else {
        target.join("release")
    };
    eprintln!(
        "[testhost] cargo build --release -p {package} --bin {bin}{}",
        if static_link { " (static)" } else { "" }
    );
    let out = c.output().map_err(|source| CmdError::Spawn {
        program: "cargo".into(),
        source,
    })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().collect();
        return Err(ScenarioError::Build {
            bin: bin.into(),
            tail: lines[lines.len().saturating_sub(30)..].join("\n"),
        });
    }
    Ok(out_dir.join(bin))
}

/// The `microvm` binary: `$MICROVIRT_MICROVM`, or a static release build of the `vmm` package.
pub fn microvm_binary() -> Result<PathBuf, ScenarioError> {
    if let Some(p) = std::env::var_os("MICROVIRT_MICROVM") {
        return Ok(PathBuf::from(p));
    }
    cargo_build_release_static("vmm", "microvm")
}

/// Everything a suite needs on the host.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub images: GuestImages,
    pub microvm: PathBuf,
    /// Test-host kernel (None in direct mode).
    pub l1: Option<L1Kernel>,
    pub direct: bool,
    pub workdir: PathBuf,
    /// More guest files for the scenarios: `(environment variable, file here)`; in the test
    /// host the file is copied to `/guest/extra/` and the variable names that copy.
    pub guest_files: Vec<(String, PathBuf)>,
    /// More programs for the test host, copied to `/bin/` with their shared libraries (the
    /// direct mode uses this machine's).
    pub host_binaries: Vec<PathBuf>,
    /// Set when a run failed: the work dir (with its console log) then outlives `self`.
    keep_workdir: std::cell::Cell<bool>,
}

/// Keeps the work dir of every test-host run (console logs) for diagnosis.
pub const KEEP_WORKDIR_ENV: &str = "MICROVIRT_KEEP_TESTHOST_DIR";

impl Drop for Prepared {
    /// Removes the per-process work dir (test-host initramfs, console logs), unless a run
    /// failed (its error names the log in there) or `$MICROVIRT_KEEP_TESTHOST_DIR` is set.
    fn drop(&mut self) {
        if self.keep_workdir.get() || std::env::var_os(KEEP_WORKDIR_ENV).is_some() {
            eprintln!("[testhost] kept {}", self.workdir.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.workdir);
    }
}

impl Prepared {
    /// Keeps the work dir after `self` is dropped (a failed run's console log is in it).
    pub fn keep_workdir(&self) {
        self.keep_workdir.set(true);
    }
}

/// Packages the test host needs on this machine.
pub const HOST_PACKAGES: &[&str] = &["qemu-system-x86", "busybox-static", "cpio", "xz-utils"];

/// Builds/fetches images, the microvm binary and (unless hardware KVM is present) the test-host kernel.
/// `$MICROVIRT_TESTHOST=1` forces the test host even with hardware KVM.
pub fn prepare() -> Result<Prepared, ScenarioError> {
    let direct = qemu::hardware_kvm() && std::env::var_os("MICROVIRT_TESTHOST").is_none();
    if !direct {
        cmd::ensure_packages(HOST_PACKAGES)?;
    }
    let (images, _) = crate::images::build()?;
    let microvm = microvm_binary()?;
    let l1 = if direct { None } else { Some(l1::kernel()?) };
    let workdir = std::env::temp_dir().join(format!("microvirt-testhost-{}", std::process::id()));
    cmd::mkdirs(&workdir)?;
    Ok(Prepared {
        images,
        microvm,
        l1,
        direct,
        workdir,
        guest_files: Vec::new(),
        host_binaries: Vec::new(),
        keep_workdir: std::cell::Cell::new(false),
    })
}

/// Builds (or finds cached) the stock Debian guest and adds its files to `prep`
/// (`$STOCK_VMLINUZ`, `$STOCK_INITRD`, `$STOCK_DISK` in the scenarios).
pub fn add_stock_guest(prep: &mut Prepared) -> Result<crate::stock::StockGuest, ScenarioError> {
    let g = crate::stock::build()?;
    prep.guest_files.extend(g.guest_files());
    Ok(g)
}

/// The path of a [`Prepared::guest_files`] entry inside the test host.
fn guest_file_path(var: &str) -> String {
    format!("/guest/extra/{}", var.to_ascii_lowercase())
}

/// The generated test-host init: load KVM, start a once-a-minute "=== l1 alive T" heartbeat, then
/// run `body` (shell), then power off.
pub fn l1_init(body: &str) -> String {
    let mods: String = l1::MODULES.iter().map(|(n, _)| format!(" {n}")).collect();
    let params: String = l1::MODULE_PARAMS
        .iter()
        .map(|(n, p)| format!("{n}) p=\"{p}\" ;; "))
        .collect();
    format!(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /tmp /dev/pts /run
mount -t tmpfs tmp /tmp
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
echo "=== l1 up $(cut -d' ' -f1 /proc/uptime)"
grep -q svm /proc/cpuinfo || echo "=== l1: no svm flag"
for m in{mods}; do
	case $m in {params}*) p= ;; esac
	insmod /mods/$m.ko $p || echo "=== l1: insmod $m $p failed"
done
[ -c /dev/kvm ] || echo "=== l1: no /dev/kvm"
echo "=== l1 kvm-amd npt=$(cat /sys/module/kvm_amd/parameters/npt 2>/dev/null)"
ip link set lo up
export MICROVM=/bin/microvm VMLINUX=/guest/vmlinux BZIMAGE=/guest/bzImage ROOTFS=/guest/rootfs.ext4 INITRD=/guest/rootfs.cpio
echo "=== l1 ready $(cut -d' ' -f1 /proc/uptime)"
# A heartbeat: when the console goes quiet, these lines tell a test host that still runs from
# one that froze (the QEMU monitor dump at the timeout then says where its CPU is).
( while sleep {HEARTBEAT_SECS}; do echo "=== l1 alive $(cut -d' ' -f1 /proc/uptime)"; done ) &
{body}
echo "{DONE_MARKER} $(cut -d' ' -f1 /proc/uptime)"
poweroff -f
"#
    )
}

/// The shell body that runs `scenarios` one after another, each in its own work directory.
pub fn scenarios_body(scenarios: &[Scenario], script_dir: &str) -> String {
    let mut s = String::new();
    for sc in scenarios {
        s.push_str(&format!(
            "echo \"=== begin {n}\"\nexport WORK=/tmp/work-{n}\nmkdir -p \"$WORK\" && cd \"$WORK\" && sh {d}/{n}.sh\necho \"=== end {n} rc=$?\"\ncd /\nrm -rf /tmp/work-{n}\n",
            n = sc.name,
            d = script_dir,
        ));
    }
    s
}

fn script_file(sc: &Scenario) -> String {
    format!("{PRELUDE}\n# ---- {}.sh ----\n{}", sc.name, sc.script)
}

/// The silent seconds and the console log of a run that timed out because the test host itself
/// froze (silent for [`FROZEN_SECS`], heartbeat included); None for any other outcome.
pub fn test_host_froze(e: &ScenarioError) -> Option<(u64, &Path)> {
    match e {
        ScenarioError::Run(RunError::Timeout {
            silent_secs, log, ..
        }) if *silent_secs >= FROZEN_SECS => Some((*silent_secs, log.as_path())),
        _ => None,
    }
}

/// The test host's heartbeat period (`=== l1 alive` lines).
pub const HEARTBEAT_SECS: u64 = 60;
/// A test host whose console stayed silent this long froze: its heartbeat stopped too (four
/// missed; the test host's clock may lag the wall clock under load). Its run ends then, and
/// [`run_suite`] runs the suite once more.
pub const FROZEN_SECS: u64 = 240;

/// Test-host (QEMU TCG) console timeout: a fixed allowance for booting plus, per scenario,
/// 150 s or the `VM_TIMEOUT=` its script gives its VMs, whichever is more (a scenario that boots
/// a stock Linux guest twice needs minutes on a busy machine). `MICROVIRT_TESTHOST_TIMEOUT`
/// (seconds) overrides it. Only a scenario that hangs waits this long.
pub fn suite_timeout(scenarios: &[Scenario]) -> Duration {
    let secs = std::env::var("MICROVIRT_TESTHOST_TIMEOUT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| 120 + scenarios.iter().map(scenario_allowance).sum::<u64>());
    Duration::from_secs(secs)
}

fn scenario_allowance(sc: &Scenario) -> u64 {
    let vm_timeout = sc
        .script
        .lines()
        .filter_map(|l| l.trim().strip_prefix("VM_TIMEOUT="))
        .filter_map(|v| v.trim().parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    vm_timeout.max(150)
}

/// Runs `scenarios` in one test-host boot (or directly on hardware KVM) and splits the output.
pub fn run_suite(
    prep: &Prepared,
    scenarios: &[Scenario],
    echo: bool,
) -> Result<SuiteResult, ScenarioError> {
    let r = if prep.direct {
        run_direct(prep, scenarios, echo)
    } else {
        match run_in_test_host(prep, scenarios, echo) {
            Err(e) if test_host_froze(&e).is_some() => {
                let (silent_secs, log) = test_host_froze(&e).expect("checked");
                // Not even the test host's own heartbeat came: the test host froze (docs/
                // testing.md, "the test host froze": QEMU TCG's nested-SVM fault, not the
                // scenario). Once more; a scenario that freezes it every time still fails.
                // Straight to stderr, past the test harness's capture: a retry that then
                // passes must still show in the suite's log.
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "[testhost] the test host froze: no console line, not even its {HEARTBEAT_SECS} s heartbeat, for the last {silent_secs} s ({}); running the suite once more. The frozen run:\n{e}",
                    log.display()
                );
                run_in_test_host(prep, scenarios, echo)
            }
            r => r,
        }
    };
    if r.is_err() {
        prep.keep_workdir();
    }
    r
}

/// Boots the test host (QEMU TCG) with `scenarios` in its init.
fn run_in_test_host(
    prep: &Prepared,
    scenarios: &[Scenario],
    echo: bool,
) -> Result<SuiteResult, ScenarioError> {
    let Some(kernel) = prep.l1.as_ref() else {
        return Err(ScenarioError::NoTestHostKernel);
    };
    let files = scenarios
        .iter()
        .map(|sc| {
            (
                format!("/scenarios/{}.sh", sc.name),
                script_file(sc).into_bytes(),
            )
        })
        .collect();
    let exports: String = prep
        .guest_files
        .iter()
        .map(|(var, _)| format!("export {var}={}\n", guest_file_path(var)))
        .collect();
    let init = l1_init(&format!(
        "{exports}{}",
        scenarios_body(scenarios, "/scenarios")
    ));
    let initramfs = prep.workdir.join("l1.cpio");
    eprintln!("[testhost] building the test-host initramfs");
    l1::build_initramfs(
        &InitramfsSpec {
            kernel,
            images: &prep.images,
            binaries: std::iter::once(prep.microvm.clone())
                .chain(prep.host_binaries.iter().cloned())
                .collect(),
            with_qemu: false,
            files,
            copies: prep
                .guest_files
                .iter()
                .map(|(var, path)| (guest_file_path(var), path.clone()))
                .collect(),
            init,
        },
        &initramfs,
    )?;
    let names: Vec<&str> = scenarios.iter().map(|s| s.name).collect();
    eprintln!(
        "[testhost] booting the test host (QEMU TCG, -cpu max) for: {}",
        names.join(" ")
    );
    let monitor = prep.workdir.join("qemu-monitor.sock");
    let console = qemu::run_console(
        qemu::qemu_tcg_command(
            &kernel.vmlinuz,
            &initramfs,
            crate::qemu::TEST_HOST_APPEND,
            "2G",
            &monitor,
        ),
        &RunOptions {
            name: "l1".into(),
            timeout: suite_timeout(scenarios),
            log: prep.workdir.join("testhost-console.log"),
            echo,
            done_marker: DONE_MARKER.into(),
            monitor: Some(monitor),
            // Its heartbeat keeps a live test host's console busy: a silent one froze, and its
            // run ends then instead of at the suite's timeout (tens of minutes for e2e).
            silence: Some(Duration::from_secs(FROZEN_SECS)),
        },
    )?;
    let _ = std::fs::remove_file(&initramfs);
    let l1_boot_secs = l1_ready_secs(&console);
    Ok(SuiteResult {
        sections: split_sections(&console.lines),
        console,
        mode: "test host (QEMU TCG, -cpu max, nested KVM)".into(),
        l1_boot_secs,
    })
}

/// Guest-uptime seconds at which the test host finished loading KVM (from "=== l1 ready T").
fn l1_ready_secs(console: &Console) -> Option<f64> {
    console
        .lines
        .iter()
        .find_map(|l| l.trim().strip_prefix("=== l1 ready "))
        .and_then(|v| v.trim().parse().ok())
}

/// Runs the scenarios with the host's own /dev/kvm (hardware virtualization present).
fn run_direct(
    prep: &Prepared,
    scenarios: &[Scenario],
    echo: bool,
) -> Result<SuiteResult, ScenarioError> {
    let dir = prep.workdir.join("direct");
    cmd::mkdirs(&dir)?;
    for sc in scenarios {
        cmd::write(&dir.join(format!("{}.sh", sc.name)), script_file(sc))?;
    }
    let body = scenarios_body(scenarios, &dir.to_string_lossy())
        .replace("/tmp/work-", &format!("{}/work-", dir.display()));
    let exports: String = prep
        .guest_files
        .iter()
        .map(|(var, path)| format!("export {var}={}\n", cmd::quote(path)))
        .collect();
    let script = format!(
        "export MICROVM={m} VMLINUX={v} BZIMAGE={b} ROOTFS={r} INITRD={i}\n{exports}{body}\necho \"{DONE_MARKER}\"\n",
        m = cmd::quote(&prep.microvm),
        v = cmd::quote(&prep.images.vmlinux),
        b = cmd::quote(&prep.images.bzimage),
        r = cmd::quote(&prep.images.rootfs),
        i = cmd::quote(&prep.images.initrd),
    );
    // The scripts use busybox applets (tunctl, nc, ...): put them first on PATH.
    let bin = dir.join("bin");
    cmd::mkdirs(&bin)?;
    cmd::run(Command::new("busybox").arg("--install").arg("-s").arg(&bin))?;
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut c = Command::new("sh");
    c.arg("-c").arg(script).env("PATH", path);
    let console = qemu::run_console(
        c,
        &RunOptions {
            name: "host".into(),
            timeout: suite_timeout(scenarios),
            log: prep.workdir.join("direct-console.log"),
            echo,
            done_marker: DONE_MARKER.into(),
            monitor: None,
            silence: None,
        },
    )?;
    Ok(SuiteResult {
        sections: split_sections(&console.lines),
        console,
        mode: "directly (hardware KVM)".into(),
        l1_boot_secs: None,
    })
}

/// Resolves scenario names (`all` or empty → every scenario of [`ALL`]; `stock` → every
/// scenario of [`STOCK`]).
pub fn select(names: &[String]) -> Result<Vec<Scenario>, ScenarioError> {
    if names.is_empty() || names.iter().any(|n| n == "all") {
        return Ok(ALL.to_vec());
    }
    let mut out = Vec::new();
    for n in names {
        if n == "stock" {
            out.extend_from_slice(STOCK);
        } else {
            out.push(find(n).ok_or_else(|| ScenarioError::Unknown(n.clone()))?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_silent_timeout_is_a_frozen_test_host() {
        let timeout = |silent_secs| {
            ScenarioError::Run(RunError::Timeout {
                what: "l1".into(),
                secs: 420,
                silent_secs,
                log: "/tmp/l1.log".into(),
                tail: String::new(),
            })
        };
        // The heartbeat comes every HEARTBEAT_SECS: two missed ones and more mean a freeze.
        const { assert!(FROZEN_SECS > 2 * HEARTBEAT_SECS) };
        assert_eq!(
            test_host_froze(&timeout(FROZEN_SECS)),
            Some((FROZEN_SECS, Path::new("/tmp/l1.log")))
        );
        // A scenario that hangs while the test host lives: its heartbeat keeps the console busy.
        assert_eq!(test_host_froze(&timeout(HEARTBEAT_SECS)), None);
        let incomplete = ScenarioError::Run(RunError::Incomplete {
            what: "l1".into(),
            status: "exit 1".into(),
            log: "/tmp/l1.log".into(),
            tail: String::new(),
        });
        assert_eq!(test_host_froze(&incomplete), None);
    }

    #[test]
    fn splits_sections_with_status() {
        let lines: Vec<String> = [
            "noise",
            "=== begin a",
            "check x 1",
            "[vm] microvirt: root /dev/vda ext4",
            "check vm vm exit=0 end 3.5",
            "=== end a rc=0",
            "between",
            "=== begin b",
            "partial",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let s = split_sections(&lines);
        let a = &s["a"];
        assert_eq!(a.rc, Some(0));
        assert_eq!(a.value("check x "), Some("1"));
        assert_eq!(a.vm_lines("vm"), vec!["microvirt: root /dev/vda ext4"]);
        assert_eq!(a.vm_exit("vm").as_deref(), Some("0"));
        assert_eq!(s["b"].rc, None);
        assert_eq!(s["b"].lines, vec!["partial".to_string()]);
        assert!(!s.contains_key("between"));
    }

    #[test]
    fn a_scenario_gets_the_vm_timeout_its_script_gives() {
        let sc = |script| Scenario { name: "t", script };
        assert_eq!(scenario_allowance(&sc("vm a --kernel k")), 150);
        assert_eq!(scenario_allowance(&sc("VM_TIMEOUT=60\nvm a")), 150);
        assert_eq!(scenario_allowance(&sc("x\n\tVM_TIMEOUT=600\nvm a")), 600);
        assert_eq!(
            scenario_allowance(&find("stock-reboot-loop").unwrap()),
            1500
        );
    }

    #[test]
    fn every_scenario_script_is_selectable() {
        assert_eq!(select(&[]).expect("all").len(), ALL.len());
        assert!(select(&["nope".into()]).is_err());
        assert_eq!(select(&["stock".into()]).expect("stock").len(), STOCK.len());
        assert!(STOCK.iter().all(needs_stock_guest));
        assert!(!ALL.iter().any(needs_stock_guest));
        for sc in ALL.iter().chain(STOCK) {
            assert!(sc.script.contains("vm "), "{} never runs a VM", sc.name);
        }
        let init = l1_init(&scenarios_body(&ALL[..1], "/scenarios"));
        assert!(init.contains("insmod /mods/$m.ko $p") && init.contains(DONE_MARKER));
        assert!(init.contains("case $m in kvm-amd) p=\"npt=0\" ;; *) p= ;; esac"));
        // The generated script parses (the host's sh; the test host runs busybox sh).
        let check = std::process::Command::new("sh")
            .args(["-n", "-c", &init])
            .output()
            .expect("sh");
        assert!(
            check.status.success(),
            "{}",
            String::from_utf8_lossy(&check.stderr)
        );
    }
}
