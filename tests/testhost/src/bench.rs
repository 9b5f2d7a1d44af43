//! Comparison benchmark inside the test host: the same kernel and rootfs booted by `microvm` and by
//! `qemu-system-x86_64 -M microvm -accel kvm`, several runs each; medians of the time from VMM
//! process start to the guest init's first console line, and of the VMM's RSS.
//!
//! Then snapshot/restore of that Linux guest with `microvm`: the guest is snapshotted in the
//! middle of `sleep 2; echo restored-output; exit` typed on its console, and restored several
//! times after the sleep's end has passed in real time (restore advances the guest's clocks,
//! so the sleep is over at once): `microvm-restore` rows measure process start → the guest's
//! first output after restore, with the VMM's own restore time and main → first guest exit.

use std::path::PathBuf;

use crate::l1::{self, InitramfsSpec};
use crate::qemu::{self, RunOptions, DONE_MARKER};
use crate::scenarios::{self, Prepared, ScenarioError};

/// Guest memory used by both VMMs.
pub const GUEST_MIB: u32 = 256;

/// One measured boot.
#[derive(Debug, Clone)]
pub struct Sample {
    pub vmm: String,
    pub exit: i32,
    /// VMM process start → init's first console line.
    pub marker_ms: Option<f64>,
    pub wall_ms: f64,
    pub rss_kib: u64,
    pub vmm_rss_kib: u64,
    /// microvm's own boot-timer figure.
    pub boot_time_ms: Option<f64>,
    /// Restores: the VMM's restore time and main → first guest exit.
    pub restore_ms: Option<f64>,
    pub first_exit_ms: Option<f64>,
}

/// Medians per VMM.
#[derive(Debug, Clone)]
pub struct Summary {
    pub vmm: String,
    pub runs: usize,
    pub ok: usize,
    pub marker_ms: Option<f64>,
    pub wall_ms: Option<f64>,
    pub rss_kib: Option<f64>,
    pub vmm_rss_kib: Option<f64>,
    pub boot_time_ms: Option<f64>,
    pub restore_ms: Option<f64>,
    pub first_exit_ms: Option<f64>,
}

fn median(mut v: Vec<f64>) -> Option<f64> {
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
        marker_ms: None,
        wall_ms: 0.0,
        rss_kib: 0,
        vmm_rss_kib: 0,
        boot_time_ms: None,
        restore_ms: None,
        first_exit_ms: None,
    };
    for kv in rest.split_whitespace() {
        let (k, v) = kv.split_once('=')?;
        match k {
            "exit" => s.exit = v.parse().ok()?,
            "marker-ms" => s.marker_ms = v.parse().ok(),
            "wall-ms" => s.wall_ms = v.parse().ok()?,
            "rss-kib" => s.rss_kib = v.parse().ok()?,
            "vmm-rss-kib" => s.vmm_rss_kib = v.parse().ok()?,
            "boot-time-ms" => s.boot_time_ms = v.parse().ok(),
            "restore-ms" => s.restore_ms = v.parse().ok(),
            "first-exit-ms" => s.first_exit_ms = v.parse().ok(),
            _ => {}
        }
    }
    Some(s)
}

/// Medians over the successful samples of each VMM.
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
                .filter(|s| s.exit == 0 && s.marker_ms.is_some())
                .collect();
            Summary {
                vmm: n.to_string(),
                runs: all.len(),
                ok: ok.len(),
                marker_ms: median(ok.iter().filter_map(|s| s.marker_ms).collect()),
                wall_ms: median(ok.iter().map(|s| s.wall_ms).collect()),
                rss_kib: median(ok.iter().map(|s| s.rss_kib as f64).collect()),
                vmm_rss_kib: median(ok.iter().map(|s| s.vmm_rss_kib as f64).collect()),
                boot_time_ms: median(ok.iter().filter_map(|s| s.boot_time_ms).collect()),
                restore_ms: median(ok.iter().filter_map(|s| s.restore_ms).collect()),
                first_exit_ms: median(ok.iter().filter_map(|s| s.first_exit_ms).collect()),
            }
        })
        .collect()
}

/// A Markdown table of the summaries.
pub fn table(summaries: &[Summary]) -> String {
    let f = |v: Option<f64>, d: f64| v.map_or("n/a".to_string(), |x| format!("{:.1}", x / d));
    let mut s = String::from(
        "| VMM | ok/runs | start → first line (ms) | start → exit (ms) | boot-time-ms (own) | restore (own, ms) | main → first guest exit (ms) | RSS total (MiB) | RSS w/o guest RAM (MiB) |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for m in summaries {
        s.push_str(&format!(
            "| {} | {}/{} | {} | {} | {} | {} | {} | {} | {} |\n",
            m.vmm,
            m.ok,
            m.runs,
            f(m.marker_ms, 1.0),
            f(m.wall_ms, 1.0),
            f(m.boot_time_ms, 1.0),
            f(m.restore_ms, 1.0),
            f(m.first_exit_ms, 1.0),
            f(m.rss_kib, 1024.0),
            f(m.vmm_rss_kib, 1024.0),
        ));
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

/// The microvm and QEMU command lines (busybox sh), same kernel, memory and root for both.
///
/// QEMU's microvm machine: `acpi=off` so that QEMU puts the virtio-mmio devices on the kernel command
/// line (our kernel has no ACPI), and `reboot=t` because it has no i8042 (with `reboot=k` the guest
/// falls back to a BIOS jump and qboot boots it again, forever).
fn commands(root: RootMode) -> (String, String) {
    let (mvm_root, qemu_root, cmdline) = match root {
        RootMode::Disk => (
            "--disk path=$WORK/root.ext4",
            "-drive id=root,file=$WORK/root.ext4,format=raw,if=none -device virtio-blk-device,drive=root",
            "root=/dev/vda rw quiet microvirt.scenario=quick",
        ),
        RootMode::Initrd => (
            "--initrd /guest/rootfs.cpio",
            "-initrd /guest/rootfs.cpio",
            "quiet microvirt.scenario=quick",
        ),
    };
    let microvm = format!(
        "/bin/microvm --kernel /guest/vmlinux --mem-mib {GUEST_MIB} {mvm_root} --cmdline '{cmdline}'"
    );
    let qemu = format!(
        "/bin/qemu-system-x86_64 -L /usr/share/qemu -M microvm,acpi=off,x-option-roms=off,rtc=off -accel kvm -cpu host -m {GUEST_MIB} -smp 1 \
         -nodefaults -no-user-config -nographic -serial stdio -monitor none -no-reboot \
         -kernel /guest/vmlinux -append 'console=ttyS0 reboot=t panic=1 pci=off i8042.noaux i8042.nomux i8042.dumbkbd {cmdline}' \
         {qemu_root}"
    );
    (microvm, qemu)
}

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
            "echo \"=== {tag} microvm-restore $(/bin/bootwatch --marker restored-output --guest-mib {GUEST_MIB} --timeout 120 -- /bin/microvm --restore /tmp/bench/snap --disk path=$WORK/root.ext4,overlay=$WORK/restored.ovl --log-level debug | grep '^bootwatch ')\"\n"
        ));
    }
    s
}

/// Runs the comparison; returns every sample and the test-host console log path.
pub fn run(
    prep: &Prepared,
    runs: usize,
    root: RootMode,
    echo: bool,
    snapshot_only: bool,
) -> Result<(Vec<Sample>, PathBuf), ScenarioError> {
    let bootwatch = scenarios::cargo_build_release("microvirt-testhost", "bootwatch")?;
    let (microvm, qemu_cmd) = commands(root);
    let mut body = String::from(
        "export WORK=/tmp/bench\nmkdir -p $WORK\ncp /guest/rootfs.ext4 $WORK/root.ext4\n",
    );
    // Interleave the VMMs so that drift in the test host affects both alike; one warm-up each.
    for i in (0..=runs).filter(|_| !snapshot_only) {
        for (name, c) in [("microvm", &microvm), ("qemu-microvm", &qemu_cmd)] {
            let tag = if i == 0 { "warmup" } else { "sample" };
            body.push_str(&format!(
                "echo \"=== {tag} {name} $(/bin/bootwatch --guest-mib {GUEST_MIB} --timeout 120 -- {c} | grep '^bootwatch ')\"\n"
            ));
        }
    }
    body.push_str(&snapshot_body(runs));
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
            binaries: vec![prep.microvm.clone(), bootwatch],
            with_qemu: true,
            files: Vec::new(),
            init: scenarios::l1_init(&body),
        },
        &initramfs,
    )?;
    eprintln!("[bench] booting the test host; {runs} runs per VMM (+1 warm-up each)");
    let console = qemu::run_console(
        qemu::qemu_tcg_command(
            &kernel.vmlinuz,
            &initramfs,
            "console=ttyS0 panic=-1 quiet",
            "2G",
        ),
        &RunOptions {
            name: "bench".into(),
            timeout: std::time::Duration::from_secs(300 + 360 * runs as u64),
            log: prep.workdir.join("bench-console.log"),
            echo,
            done_marker: DONE_MARKER.into(),
        },
    )?;
    let _ = std::fs::remove_file(&initramfs);
    let mut samples = Vec::new();
    for l in &console.lines {
        let l = l.trim();
        if let Some(s) = l.strip_prefix("=== snapshot ") {
            eprintln!("[bench] snapshot: {s}");
        }
        let Some(rest) = l.strip_prefix("=== sample ") else {
            continue;
        };
        let Some((name, result)) = rest.split_once(' ') else {
            continue;
        };
        match parse_sample(name, result) {
            Some(s) => samples.push(s),
            None => samples.push(Sample {
                vmm: name.to_string(),
                exit: -1,
                marker_ms: None,
                wall_ms: 0.0,
                rss_kib: 0,
                vmm_rss_kib: 0,
                boot_time_ms: None,
                restore_ms: None,
                first_exit_ms: None,
            }),
        }
    }
    Ok((samples, console.log))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_summarizes() {
        let a = parse_sample(
            "microvm",
            "bootwatch exit=0 marker-ms=100.0 wall-ms=300.0 rss-kib=2048 vmm-rss-kib=1024 boot-time-ms=90",
        )
        .expect("parses");
        assert_eq!(a.exit, 0);
        assert_eq!(a.marker_ms, Some(100.0));
        assert_eq!(a.boot_time_ms, Some(90.0));
        let mut b = a.clone();
        b.marker_ms = Some(300.0);
        let mut c = a.clone();
        c.marker_ms = Some(200.0);
        let mut failed = a.clone();
        failed.exit = 1;
        let s = summarize(&[a, b, c, failed]);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].runs, 4);
        assert_eq!(s[0].ok, 3);
        assert_eq!(s[0].marker_ms, Some(200.0));
        assert!(table(&s).contains("| microvm | 3/4 | 200.0 |"));
        assert!(parse_sample("x", "garbage").is_none());
    }
}
