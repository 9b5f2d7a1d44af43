//! Comparison benchmark inside the test host: the same kernel, rootfs and command line booted by
//! `microvm` and by `qemu-system-x86_64 -M microvm -accel kvm`, several runs each; medians of the
//! time from VMM process start to the first guest instruction, to the init's first console line,
//! to the guest's ready line and to the VMM's exit after the guest rebooted; KVM's exit counters of
//! each VM by reason; the VMM's RSS; and microvm's own exit table (port I/O and MMIO by device
//! register).
//!
//! Then snapshot/restore of that Linux guest with `microvm`: the guest is snapshotted in the
//! middle of `sleep 2; echo restored-output; exit` typed on its console, and restored several
//! times after the sleep's end has passed in real time (restore advances the guest's clocks,
//! so the sleep is over at once): `microvm-restore` rows measure process start → the guest's
//! first output after restore, with the VMM's own restore time and main → first guest exit.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::l1::{self, InitramfsSpec};
use crate::qemu::{self, RunOptions, DONE_MARKER};
use crate::scenarios::{self, Prepared, ScenarioError};

/// Guest memory used by both VMMs.
pub const GUEST_MIB: u32 = 256;

/// KVM exit statistics shown in the exit table, in this order.
pub const EXIT_COLUMNS: &[&str] = &[
    "exits",
    "io_exits",
    "mmio_exits",
    "halt_exits",
    "irq_window_exits",
    "irq_exits",
    "signal_exits",
    "request_irq_exits",
    "insn_emulation",
    "hypercalls",
    "irq_injections",
    "pf_fixed",
    "pages_4k",
    "pages_2m",
];

/// One measured boot.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    pub vmm: String,
    pub exit: i32,
    /// VMM process start → the first guest entry (`kvm_entry` trace event).
    pub first_entry_ms: Option<f64>,
    /// VMM process start → init's first console line.
    pub init_ms: Option<f64>,
    /// VMM process start → the guest's `microvirt: ready` line.
    pub ready_ms: Option<f64>,
    /// VMM process start → VMM exit (after the guest rebooted).
    pub wall_ms: f64,
    pub rss_kib: u64,
    pub vmm_rss_kib: u64,
    /// microvm's own boot-timer figure.
    pub boot_time_ms: Option<f64>,
    /// Restores: process start → the guest's first output after the restore.
    pub restored_ms: Option<f64>,
    /// Restores: the VMM's restore time and main → first guest exit.
    pub restore_ms: Option<f64>,
    pub first_exit_ms: Option<f64>,
    /// KVM's counters of the VM (`kvm.NAME=N`).
    pub kvm: BTreeMap<String, u64>,
}

/// Medians per VMM.
#[derive(Debug, Clone)]
pub struct Summary {
    pub vmm: String,
    pub runs: usize,
    pub ok: usize,
    pub first_entry_ms: Option<f64>,
    pub init_ms: Option<f64>,
    pub ready_ms: Option<f64>,
    pub wall_ms: Option<f64>,
    pub rss_kib: Option<f64>,
    pub vmm_rss_kib: Option<f64>,
    pub boot_time_ms: Option<f64>,
    pub restored_ms: Option<f64>,
    pub restore_ms: Option<f64>,
    pub first_exit_ms: Option<f64>,
    pub kvm: BTreeMap<String, f64>,
}

/// The median (the mean of the middle two for an even count); `None` when empty.
pub fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Parses a `bootwatch ...` result line.
pub fn parse_sample(vmm: &str, line: &str) -> Option<Sample> {
    let rest = line.trim().strip_prefix("bootwatch ")?;
    let mut s = Sample {
        vmm: vmm.to_string(),
        exit: -1,
        ..Default::default()
    };
    let mut saw_exit = false;
    for kv in rest.split_whitespace() {
        let (k, v) = kv.split_once('=')?;
        match k {
            "exit" => {
                s.exit = v.parse().ok()?;
                saw_exit = true;
            }
            "first-entry-ms" => s.first_entry_ms = v.parse().ok(),
            "marker.init-ms" => s.init_ms = v.parse().ok(),
            "marker.ready-ms" => s.ready_ms = v.parse().ok(),
            "wall-ms" => s.wall_ms = v.parse().ok()?,
            "rss-kib" => s.rss_kib = v.parse().ok()?,
            "vmm-rss-kib" => s.vmm_rss_kib = v.parse().ok()?,
            "boot-time-ms" => s.boot_time_ms = v.parse().ok(),
            "marker.restored-ms" => s.restored_ms = v.parse().ok(),
            "restore-ms" => s.restore_ms = v.parse().ok(),
            "first-exit-ms" => s.first_exit_ms = v.parse().ok(),
            k => {
                if let (Some(name), Ok(n)) = (k.strip_prefix("kvm."), v.parse()) {
                    s.kvm.insert(name.to_string(), n);
                }
            }
        }
    }
    saw_exit.then_some(s)
}

/// Medians over the successful samples of each VMM (exit 0 and the init line seen, or for
/// restores the guest's output after the restore).
pub fn summarize(samples: &[Sample]) -> Vec<Summary> {
    let mut names: Vec<&str> = Vec::new();
    for s in samples {
        if !names.contains(&s.vmm.as_str()) {
            names.push(&s.vmm);
        }
    }
    names
        .into_iter()
        .map(|n| {
            let all: Vec<&Sample> = samples.iter().filter(|s| s.vmm == n).collect();
            let ok: Vec<&Sample> = all
                .iter()
                .copied()
                .filter(|s| s.exit == 0 && (s.init_ms.is_some() || s.restored_ms.is_some()))
                .collect();
            let mut kvm = BTreeMap::new();
            let keys: std::collections::BTreeSet<&String> =
                ok.iter().flat_map(|s| s.kvm.keys()).collect();
            for k in keys {
                if let Some(m) = median(
                    ok.iter()
                        .filter_map(|s| s.kvm.get(k).map(|v| *v as f64))
                        .collect(),
                ) {
                    kvm.insert(k.clone(), m);
                }
            }
            Summary {
                vmm: n.to_string(),
                runs: all.len(),
                ok: ok.len(),
                first_entry_ms: median(ok.iter().filter_map(|s| s.first_entry_ms).collect()),
                init_ms: median(ok.iter().filter_map(|s| s.init_ms).collect()),
                ready_ms: median(ok.iter().filter_map(|s| s.ready_ms).collect()),
                wall_ms: median(ok.iter().map(|s| s.wall_ms).collect()),
                rss_kib: median(ok.iter().map(|s| s.rss_kib as f64).collect()),
                vmm_rss_kib: median(ok.iter().map(|s| s.vmm_rss_kib as f64).collect()),
                boot_time_ms: median(ok.iter().filter_map(|s| s.boot_time_ms).collect()),
                restored_ms: median(ok.iter().filter_map(|s| s.restored_ms).collect()),
                restore_ms: median(ok.iter().filter_map(|s| s.restore_ms).collect()),
                first_exit_ms: median(ok.iter().filter_map(|s| s.first_exit_ms).collect()),
                kvm,
            }
        })
        .collect()
}

fn fmt(v: Option<f64>, div: f64, prec: usize) -> String {
    v.map_or("n/a".to_string(), |x| format!("{:.*}", prec, x / div))
}

/// The Markdown table of restores (rows with a `restored` figure).
pub fn restore_table(summaries: &[Summary]) -> String {
    let mut s = String::from(
        "| VMM | ok/runs | start → first output after restore (ms) | restore (own, ms) | main → first guest exit (ms) | start → exit (ms) | RSS total (MiB) | RSS w/o guest RAM (MiB) |\n|---|---|---|---|---|---|---|---|\n",
    );
    for m in summaries.iter().filter(|m| m.restored_ms.is_some()) {
        s.push_str(&format!(
            "| {} | {}/{} | {} | {} | {} | {} | {} | {} |\n",
            m.vmm,
            m.ok,
            m.runs,
            fmt(m.restored_ms, 1.0, 1),
            fmt(m.restore_ms, 1.0, 1),
            fmt(m.first_exit_ms, 1.0, 1),
            fmt(m.wall_ms, 1.0, 1),
            fmt(m.rss_kib, 1024.0, 1),
            fmt(m.vmm_rss_kib, 1024.0, 1),
        ));
    }
    s
}

/// The Markdown table of boot times and memory (rows without a `restored` figure).
pub fn table(summaries: &[Summary]) -> String {
    let mut s = String::from(
        "| VMM | ok/runs | start → first guest instruction (ms) | → init line (ms) | → ready (ms) | → exit after reboot (ms) | boot-time-ms (own) | RSS total (MiB) | RSS w/o guest RAM (MiB) |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for m in summaries.iter().filter(|m| m.restored_ms.is_none()) {
        s.push_str(&format!(
            "| {} | {}/{} | {} | {} | {} | {} | {} | {} | {} |\n",
            m.vmm,
            m.ok,
            m.runs,
            fmt(m.first_entry_ms, 1.0, 1),
            fmt(m.init_ms, 1.0, 1),
            fmt(m.ready_ms, 1.0, 1),
            fmt(m.wall_ms, 1.0, 1),
            fmt(m.boot_time_ms, 1.0, 1),
            fmt(m.rss_kib, 1024.0, 1),
            fmt(m.vmm_rss_kib, 1024.0, 1),
        ));
    }
    s
}

/// The Markdown table of KVM's exit counters per boot (medians).
pub fn exit_table(summaries: &[Summary]) -> String {
    let mut s = String::from("| VMM |");
    let mut sep = String::from("|---|");
    for c in EXIT_COLUMNS {
        s.push_str(&format!(" {c} |"));
        sep.push_str("---|");
    }
    s.push('\n');
    s.push_str(&sep);
    s.push('\n');
    for m in summaries.iter().filter(|m| m.restored_ms.is_none()) {
        s.push_str(&format!("| {} |", m.vmm));
        for c in EXIT_COLUMNS {
            s.push_str(&format!(" {} |", fmt(m.kvm.get(*c).copied(), 1.0, 0)));
        }
        s.push('\n');
    }
    s
}

/// How the guest gets its root filesystem in the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootMode {
    /// ext4 image on virtio-blk (`root=/dev/vda`).
    Disk,
    /// The same tree as an initramfs (no devices at all).
    Initrd,
}

/// What to boot.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub runs: usize,
    pub root: RootMode,
    /// A kernel to boot instead of the shipped guest kernel (ELF vmlinux with a PVH note for
    /// both VMMs' direct boot).
    pub kernel: Option<PathBuf>,
    /// Appended to both command lines.
    pub append: String,
    /// Also boot once more under microvm with `initcall_debug` and print the kernel log
    /// breakdown ([`crate::bootlog`]).
    pub boot_log: bool,
    /// Only the restores, no boot comparison.
    pub snapshot_only: bool,
    /// The test host's `transparent_hugepage/shmem_enabled` mode for the run (e.g. `advise`):
    /// microvm's guest RAM is a memfd, which gets huge pages only as that knob allows (QEMU's
    /// anonymous RAM follows `enabled`). `None` keeps the kernel's default.
    pub shmem_thp: Option<String>,
    /// Another `microvm` binary (e.g. a build of an older revision) booted as `microvm-base`
    /// with the same kernel, rootfs and command line, interleaved with the others. It gets no
    /// `--exit-stats` (older builds lack it); KVM's counters are sampled for it like for QEMU.
    pub baseline_microvm: Option<PathBuf>,
    /// Leave QEMU out (only the microvm binaries; saves about half of the test host's time).
    pub no_qemu: bool,
    /// Leave the restores out.
    pub boot_only: bool,
    /// Also boot `microvm` with these kernel arguments appended (e.g. `acpi=off`), as
    /// `microvm-variant`, interleaved with the others: the same VMM and kernel, one switch apart.
    pub variant_append: Option<String>,
}

/// Modes `transparent_hugepage/shmem_enabled` takes.
pub const SHMEM_THP_MODES: &[&str] = &["always", "within_size", "advise", "never", "deny", "force"];

/// The kernel command line every VMM gets on top of its own machine defaults: the shipped guest
/// image's recommended arguments (see docs/guest-images.md), then the benchmark's.
pub const GUEST_ARGS: &str = "";

/// The microvm and QEMU command lines (busybox sh), same kernel, memory, root and command line.
///
/// QEMU's microvm machine: `acpi=on` as microvm (the guest finds its virtio-mmio devices in the
/// DSDT and powers off through S5 at the end), and `reboot=t` because it has no i8042 (with
/// `reboot=k` a guest falls back to a BIOS jump and qboot boots it again, forever). The rest of
/// microvm's default command line is given to QEMU's guest too.
fn commands(o: &BenchOptions) -> (String, String, String) {
    let (mvm_root, qemu_root, root_args) = match o.root {
        RootMode::Disk => (
            "--disk path=$WORK/root.ext4",
            "-drive id=root,file=$WORK/root.ext4,format=raw,if=none -device virtio-blk-device,drive=root",
            "root=/dev/vda rw",
        ),
        RootMode::Initrd => (
            "--initrd /guest/rootfs.cpio",
            "-initrd /guest/rootfs.cpio",
            "",
        ),
    };
    let cmdline = [
        GUEST_ARGS,
        root_args,
        "quiet microvirt.scenario=quick",
        o.append.as_str(),
    ]
    .iter()
    .filter(|s| !s.is_empty())
    .copied()
    .collect::<Vec<_>>()
    .join(" ");
    let microvm = format!(
        "/bin/microvm --exit-stats --kernel $KERNEL --mem-mib {GUEST_MIB} {mvm_root} --cmdline '{cmdline}'"
    );
    let baseline = format!(
        "/bin/{BASELINE_BIN} --kernel $KERNEL --mem-mib {GUEST_MIB} {mvm_root} --cmdline '{cmdline}'"
    );
    let qemu = format!(
        "/bin/qemu-system-x86_64 -L /usr/share/qemu -M microvm,acpi=on,x-option-roms=off,rtc=off -accel kvm -cpu host -m {GUEST_MIB} -smp 1 \
         -nodefaults -no-user-config -nographic -serial stdio -monitor none -no-reboot \
         -kernel $KERNEL -append 'console=ttyS0 reboot=t panic=1 pci=off i8042.noaux i8042.nomux i8042.dumbkbd swiotlb=noforce {cmdline}' \
         {qemu_root}"
    );
    (microvm, qemu, baseline)
}

/// The `microvm` command of the [`VARIANT_NAME`] row: microvm's own, with
/// [`BenchOptions::variant_append`] after the rest of its command line.
fn variant_command(o: &BenchOptions) -> Option<String> {
    let extra = o.variant_append.as_ref()?;
    let (v, _, _) = commands(&BenchOptions {
        append: format!("{} {extra}", o.append).trim().to_string(),
        ..o.clone()
    });
    Some(v)
}

/// The baseline binary's name inside the test host (`/bin/<name>`).
const BASELINE_BIN: &str = "microvm-base";
/// The row of `microvm` booted with [`BenchOptions::variant_append`].
pub const VARIANT_NAME: &str = "microvm-variant";

/// The test-host shell that snapshots a Linux guest in the middle of `sleep 2; echo
/// restored-output; exit` and then restores it `runs` times (plus a warm-up) under `bootwatch`.
fn snapshot_body(runs: usize) -> String {
    let mut s = format!(
        r#"mkfifo $WORK/in.fifo
(
	i=0
	until grep -q "microvirt: shell ready" $WORK/snapvm.log 2>/dev/null; do
		i=$((i + 1)); [ $i -ge 600 ] && break; sleep 0.2
	done
	sleep 1
	printf 'sleep 2; echo restored-output; exit\n'
	i=0
	until grep -q "echo restored-output" $WORK/snapvm.log 2>/dev/null; do
		i=$((i + 1)); [ $i -ge 100 ] && break; sleep 0.1
	done
	sleep 0.3
	/bin/microvm control $WORK/ctl.sock '{{"cmd":"snapshot","dir":"/tmp/bench/snap"}}' > $WORK/snap.json 2>&1
	/bin/microvm control $WORK/ctl.sock '{{"cmd":"stop"}}' > /dev/null 2>&1
	sleep 30
) > $WORK/in.fifo &
/bin/microvm --kernel /guest/vmlinux --mem-mib {GUEST_MIB} --disk path=$WORK/root.ext4,overlay=$WORK/snap.ovl \
	--control-socket $WORK/ctl.sock --cmdline 'root=/dev/vda rw quiet microvirt.scenario=console' \
	< $WORK/in.fifo > $WORK/snapvm.log 2>&1
echo "=== snapshot $(cat $WORK/snap.json)"
sleep 3
"#
    );
    for i in 0..=runs {
        let tag = if i == 0 { "warmup" } else { "sample" };
        s.push_str(&format!(
            "echo \"=== {tag} microvm-restore $(/bin/bootwatch --marker restored=restored-output --guest-mib {GUEST_MIB} --timeout 120 -- /bin/microvm --restore /tmp/bench/snap --disk path=$WORK/root.ext4,overlay=$WORK/restored.ovl --log-level debug | grep '^bootwatch ')\"\n"
        ));
    }
    s
}

/// The result of a benchmark run.
pub struct BenchRun {
    pub samples: Vec<Sample>,
    /// microvm's `--exit-stats` table of its last sample.
    pub microvm_exit_table: Vec<String>,
    /// The output of the `--boot-log` boot (kernel log and microvm's exit table).
    pub boot_log: Vec<String>,
    /// The same boot under QEMU (its kernel log).
    pub qemu_boot_log: Vec<String>,
    /// The test host's THP settings during the run.
    pub thp: String,
    pub log: PathBuf,
}

/// Runs the comparison; returns every sample and the test-host console log path.
pub fn run(prep: &Prepared, o: &BenchOptions, echo: bool) -> Result<BenchRun, ScenarioError> {
    let bootwatch = scenarios::cargo_build_release("microvirt-testhost", "bootwatch")?;
    let (microvm, qemu_cmd, baseline_cmd) = commands(o);
    let mut binaries = vec![prep.microvm.clone(), bootwatch];
    if let Some(b) = &o.baseline_microvm {
        // Binaries land in /bin under their file name: copy it to a file named microvm-base.
        let dest = prep.workdir.join(BASELINE_BIN);
        std::fs::copy(b, &dest).map_err(|source| crate::cmd::CmdError::Io {
            what: "copying",
            path: b.clone(),
            source,
        })?;
        binaries.push(dest);
    }
    let variant_cmd = variant_command(o);
    let mut vmms = vec![("microvm", &microvm)];
    if o.baseline_microvm.is_some() {
        vmms.push((BASELINE_BIN, &baseline_cmd));
    }
    if let Some(v) = &variant_cmd {
        vmms.push((VARIANT_NAME, v));
    }
    if !o.no_qemu {
        vmms.push(("qemu-microvm", &qemu_cmd));
    }
    let mut files = Vec::new();
    let kernel_path = match &o.kernel {
        Some(k) => {
            let data = std::fs::read(k).map_err(|source| crate::cmd::CmdError::Io {
                what: "reading",
                path: k.clone(),
                source,
            })?;
            files.push(("guest/bench-kernel".to_string(), data));
            "/guest/bench-kernel"
        }
        None => "/guest/vmlinux",
    };
    let mut body = format!(
        "export WORK=/tmp/bench KERNEL={kernel_path}\nmkdir -p $WORK\ncp /guest/rootfs.ext4 $WORK/root.ext4\necho \"=== load $(cat /proc/loadavg)\"\n"
    );
    // Only known modes reach the shell (the caller checks against SHMEM_THP_MODES).
    if let Some(m) = o
        .shmem_thp
        .as_ref()
        .filter(|m| SHMEM_THP_MODES.contains(&m.as_str()))
    {
        body.push_str(&format!(
            "echo {m} > /sys/kernel/mm/transparent_hugepage/shmem_enabled\n"
        ));
    }
    body.push_str("echo \"=== thp enabled: $(cat /sys/kernel/mm/transparent_hugepage/enabled); shmem_enabled: $(cat /sys/kernel/mm/transparent_hugepage/shmem_enabled); defrag: $(cat /sys/kernel/mm/transparent_hugepage/defrag)\"\n");
    // Interleave the VMMs so that drift in the test host affects both alike; one warm-up each.
    for i in (0..=o.runs).filter(|_| !o.snapshot_only) {
        for (name, c) in &vmms {
            let tag = if i == 0 { "warmup" } else { "sample" };
            body.push_str(&format!(
                "/bin/bootwatch --guest-mib {GUEST_MIB} --timeout 120 --kvm-stats --first-entry -- {c} > $WORK/out\n\
                 grep '^bootwatch-exits ' $WORK/out | sed 's/^/=== {tag} {name} /'\n\
                 echo \"=== {tag} {name} $(grep '^bootwatch ' $WORK/out)\"\n"
            ));
        }
    }
    if o.boot_log && !o.snapshot_only {
        let (mvm, qemu, _) = commands(&BenchOptions {
            append: format!("{} initcall_debug microvirt.scenario=dmesg", o.append),
            ..o.clone()
        });
        body.push_str(&format!(
            "{mvm} --log-level debug 2>&1 | sed 's/^/=== bootlog /'\n"
        ));
        if !o.no_qemu {
            body.push_str(&format!("{qemu} 2>&1 | sed 's/^/=== qbootlog /'\n"));
        }
    }
    if !o.boot_only {
        body.push_str(&snapshot_body(o.runs));
    }
    // The comparison always runs in the test host, so both VMMs see the same nested KVM.
    let kernel = match &prep.l1 {
        Some(k) => k.clone(),
        None => l1::kernel()?,
    };
    let kernel = &kernel;
    let initramfs = prep.workdir.join("l1-bench.cpio");
    eprintln!("[bench] building the test-host initramfs (with qemu-system-x86_64)");
    l1::build_initramfs(
        &InitramfsSpec {
            kernel,
            images: &prep.images,
            binaries,
            with_qemu: true,
            files,
            copies: Vec::new(),
            init: scenarios::l1_init(&body),
        },
        &initramfs,
    )?;
    eprintln!(
        "[bench] booting the test host; {} runs per VMM (+1 warm-up each)",
        o.runs
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
            name: "bench".into(),
            timeout: std::time::Duration::from_secs(300 + 360 * o.runs as u64),
            log: prep.workdir.join("bench-console.log"),
            echo,
            done_marker: DONE_MARKER.into(),
            monitor: Some(monitor),
            silence: None,
        },
    )?;
    let _ = std::fs::remove_file(&initramfs);
    let mut samples = Vec::new();
    let mut table: Vec<String> = Vec::new();
    let mut current: Vec<String> = Vec::new();
    let mut boot_log = Vec::new();
    let mut qemu_boot_log = Vec::new();
    let mut thp = String::new();
    for l in &console.lines {
        if let Some((_, r)) = l.split_once("=== snapshot ") {
            eprintln!("[bench] snapshot: {r}");
        }
        if let Some((_, r)) = l.split_once("=== thp ") {
            thp = r.trim().to_string();
        }
        if let Some((_, r)) = l.split_once("=== bootlog ") {
            boot_log.push(r.to_string());
            continue;
        }
        if let Some((_, r)) = l.split_once("=== qbootlog ") {
            qemu_boot_log.push(r.to_string());
            continue;
        }
        let Some(rest) = l.trim_end().split_once("=== sample ").map(|(_, r)| r) else {
            continue;
        };
        let Some((name, result)) = rest.split_once(' ') else {
            continue;
        };
        if let Some(t) = result.strip_prefix("bootwatch-exits ") {
            if name == "microvm" {
                current.push(t.to_string());
            }
            continue;
        }
        if name == "microvm" && !current.is_empty() {
            table = std::mem::take(&mut current);
        }
        samples.push(parse_sample(name, result).unwrap_or(Sample {
            vmm: name.to_string(),
            exit: -1,
            ..Default::default()
        }));
    }
    Ok(BenchRun {
        samples,
        microvm_exit_table: table,
        boot_log,
        qemu_boot_log,
        thp,
        log: console.log,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One boot run, disk root, `foo=1` appended, no QEMU, no restores.
    fn options() -> BenchOptions {
        BenchOptions {
            runs: 1,
            root: RootMode::Disk,
            kernel: None,
            append: "foo=1".into(),
            boot_log: false,
            snapshot_only: false,
            shmem_thp: None,
            baseline_microvm: None,
            no_qemu: true,
            boot_only: true,
            variant_append: None,
        }
    }

    #[test]
    fn baseline_boots_the_same_guest_without_exit_stats() {
        let o = BenchOptions {
            baseline_microvm: Some("/old/microvm".into()),
            ..options()
        };
        let (microvm, qemu, baseline) = commands(&o);
        assert!(
            microvm.starts_with("/bin/microvm --exit-stats "),
            "{microvm}"
        );
        assert!(
            baseline.starts_with("/bin/microvm-base --kernel "),
            "{baseline}"
        );
        assert!(!baseline.contains("--exit-stats"), "{baseline}");
        // Everything after the binary and --exit-stats is the same: kernel, memory, disk,
        // command line.
        assert_eq!(
            microvm.strip_prefix("/bin/microvm --exit-stats"),
            baseline.strip_prefix("/bin/microvm-base")
        );
        assert!(baseline.contains("foo=1") && qemu.contains("foo=1"));
    }

    #[test]
    fn the_variant_is_microvm_with_its_arguments_last() {
        let mut o = options();
        assert_eq!(variant_command(&o), None);
        o.variant_append = Some("acpi=off".into());
        let (microvm, _, _) = commands(&o);
        let variant = variant_command(&o).expect("a variant");
        assert_eq!(
            variant,
            microvm.replace("foo=1'", "foo=1 acpi=off'"),
            "{microvm}\n{variant}"
        );
        assert!(!microvm.contains("acpi=off"), "{microvm}");
    }

    #[test]
    fn parses_and_summarizes() {
        let a = parse_sample(
            "microvm",
            "bootwatch exit=0 wall-ms=300.0 rss-kib=2048 vmm-rss-kib=1024 boot-time-ms=90 first-entry-ms=1.5 marker.init-ms=100.0 marker.ready-ms=120.0 kvm.exits=1000 kvm.io_exits=10",
        )
        .expect("parses");
        assert_eq!(a.exit, 0);
        assert_eq!(a.init_ms, Some(100.0));
        assert_eq!(a.ready_ms, Some(120.0));
        assert_eq!(a.first_entry_ms, Some(1.5));
        assert_eq!(a.boot_time_ms, Some(90.0));
        assert_eq!(a.kvm["exits"], 1000);
        let mut b = a.clone();
        b.init_ms = Some(300.0);
        b.kvm.insert("exits".into(), 3000);
        let mut c = a.clone();
        c.init_ms = Some(200.0);
        c.kvm.insert("exits".into(), 2000);
        let mut failed = a.clone();
        failed.exit = 1;
        let none = parse_sample(
            "microvm",
            "bootwatch exit=0 wall-ms=1 rss-kib=1 vmm-rss-kib=1 boot-time-ms=none first-entry-ms=none marker.init-ms=none marker.ready-ms=none",
        )
        .unwrap();
        assert_eq!(none.init_ms, None);
        let s = summarize(&[a, b, c, failed, none]);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].runs, 5);
        assert_eq!(s[0].ok, 3);
        assert_eq!(s[0].init_ms, Some(200.0));
        assert_eq!(s[0].kvm["exits"], 2000.0);
        assert!(
            table(&s).contains("| microvm | 3/5 | 1.5 | 200.0 | 120.0 |"),
            "{}",
            table(&s)
        );
        assert!(exit_table(&s).contains("| microvm | 2000 | 10 | n/a |"));
        let r = parse_sample(
            "microvm-restore",
            "bootwatch exit=0 wall-ms=50.0 rss-kib=2048 vmm-rss-kib=1024 boot-time-ms=none first-entry-ms=none restore-ms=3.5 first-exit-ms=4.0 marker.restored-ms=20.0",
        )
        .unwrap();
        assert_eq!(
            (r.restored_ms, r.restore_ms, r.first_exit_ms),
            (Some(20.0), Some(3.5), Some(4.0))
        );
        let rs = summarize(&[r]);
        assert_eq!(rs[0].ok, 1);
        assert!(
            restore_table(&rs).contains("| microvm-restore | 1/1 | 20.0 | 3.5 | 4.0 | 50.0 |"),
            "{}",
            restore_table(&rs)
        );
        assert!(!table(&rs).contains("microvm-restore"));
        assert!(parse_sample("x", "garbage").is_none());
        assert!(parse_sample("x", "bootwatch wall-ms=1").is_none());
    }
}
