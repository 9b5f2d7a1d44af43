//! `bootwatch`: runs a VMM, measures the time from process start to console lines, samples the
//! VMM's resident memory and (in the test host) KVM's exit counters of its VM and the time of its
//! first guest entry. Used by the comparison benchmark inside the test host.
//!
//! usage: bootwatch [--marker NAME=TEXT]... [--guest-mib N] [--timeout SECS] [--echo]
//!                  [--kvm-stats] [--first-entry] -- VMM ARGS...
//!
//! Prints one line:
//! `bootwatch exit=RC wall-ms=F rss-kib=N vmm-rss-kib=N boot-time-ms=F first-entry-ms=F
//!  restore-ms=F first-exit-ms=F marker.NAME-ms=F... kvm.STAT=N...`
//! - `marker.NAME-ms`: process start → first console line containing TEXT (defaults:
//!   `init` = "microvirt: init up", `ready` = "microvirt: ready");
//! - `vmm-rss-kib`: peak RSS of every mapping smaller than the guest memory (the VMM's own
//!   overhead; guest RAM excluded), `rss-kib` the peak total RSS;
//! - `first-entry-ms` (`--first-entry`): process start → the first `kvm:kvm_entry` trace event of
//!   the host kernel (the first guest instruction of any VM started meanwhile; the benchmark runs
//!   one VM at a time). Needs tracefs at /sys/kernel/tracing;
//! - `kvm.STAT` (`--kvm-stats`): KVM's counters of the VMM's VM (debugfs
//!   /sys/kernel/debug/kvm/PID-FD/), sampled every 10 ms; the last sample before the VM went
//!   away is reported (the last ≤ 10 ms of a run can be missing);
//! - `restore-ms` / `first-exit-ms`: what `microvm --log-level debug` reports in its `timings:`
//!   line (restoring, and main → first return from KVM_RUN), or `none`.
//!
//! Lines of a `microvm --exit-stats` table are passed on as `bootwatch-exits LINE`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// KVM statistics sampled from the per-VM debugfs directory.
const KVM_STATS: &[&str] = &[
    "exits",
    "io_exits",
    "mmio_exits",
    "halt_exits",
    "irq_window_exits",
    "nmi_window_exits",
    "irq_exits",
    "signal_exits",
    "request_irq_exits",
    "insn_emulation",
    "hypercalls",
    "irq_injections",
    "halt_wakeup",
    "pf_taken",
    "pf_fixed",
    "pages_4k",
    "pages_2m",
];

const TRACEFS: &str = "/sys/kernel/tracing";
const DEBUGFS_KVM: &str = "/sys/kernel/debug/kvm";

struct Args {
    markers: Vec<(String, String)>,
    guest_kib: u64,
    timeout: Duration,
    echo: bool,
    kvm_stats: bool,
    first_entry: bool,
    cmd: Vec<String>,
}

fn parse() -> Result<Args> {
    let mut a = Args {
        markers: Vec::new(),
        guest_kib: 256 * 1024,
        timeout: Duration::from_secs(60),
        echo: false,
        kvm_stats: false,
        first_entry: false,
        cmd: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--marker" => {
                let v = it.next().context("--marker needs NAME=TEXT")?;
                let (n, t) = v.split_once('=').context("--marker needs NAME=TEXT")?;
                a.markers.push((n.to_string(), t.to_string()));
            }
            "--guest-mib" => {
                a.guest_kib = it
                    .next()
                    .context("--guest-mib needs a value")?
                    .parse::<u64>()
                    .context("--guest-mib")?
                    * 1024
            }
            "--timeout" => {
                a.timeout = Duration::from_secs(
                    it.next()
                        .context("--timeout needs a value")?
                        .parse()
                        .context("--timeout")?,
                )
            }
            "--echo" => a.echo = true,
            "--kvm-stats" => a.kvm_stats = true,
            "--first-entry" => a.first_entry = true,
            "--" => {
                a.cmd = it.by_ref().collect();
                break;
            }
            other => bail!("unknown argument {other:?}"),
        }
    }
    if a.cmd.is_empty() {
        bail!("usage: bootwatch [--marker NAME=TEXT]... [--guest-mib N] [--timeout SECS] [--echo] [--kvm-stats] [--first-entry] -- VMM ARGS...");
    }
    if a.markers.is_empty() {
        a.markers = vec![
            ("init".into(), "microvirt: init up".into()),
            ("ready".into(), "microvirt: ready".into()),
        ];
    }
    Ok(a)
}

/// (total RSS, RSS of mappings smaller than the guest RAM) in KiB, from /proc/PID/smaps.
fn rss(pid: u32, guest_kib: u64) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    let (mut total, mut vmm) = (0u64, 0u64);
    let mut size = 0u64;
    for line in text.lines() {
        let mut f = line.split_whitespace();
        match f.next() {
            Some("Size:") => size = f.next().and_then(|v| v.parse().ok()).unwrap_or(0),
            Some("Rss:") => {
                let r: u64 = f.next().and_then(|v| v.parse().ok()).unwrap_or(0);
                total += r;
                if size < guest_kib {
                    vmm += r;
                }
            }
            _ => {}
        }
    }
    Some((total, vmm))
}

/// The debugfs directory of `pid`'s VM (`PID-FD`), once KVM created it.
fn kvm_dir(pid: u32) -> Option<PathBuf> {
    let prefix = format!("{pid}-");
    std::fs::read_dir(DEBUGFS_KVM)
        .ok()?
        .filter_map(|e| e.ok())
        .find(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
}

/// Every statistic of [`KVM_STATS`] the directory has; None when the VM is gone.
fn kvm_sample(dir: &Path) -> Option<BTreeMap<&'static str, u64>> {
    let mut m = BTreeMap::new();
    for s in KVM_STATS {
        match std::fs::read_to_string(dir.join(s)) {
            Ok(v) => {
                if let Ok(n) = v.trim().parse() {
                    m.insert(*s, n);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !dir.exists() => return None,
            Err(_) => {}
        }
    }
    Some(m)
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own; the clock id is valid.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn tracefs_write(file: &str, v: &str) -> Result<()> {
    std::fs::write(Path::new(TRACEFS).join(file), v)
        .with_context(|| format!("writing {v:?} to {TRACEFS}/{file}"))
}

/// Arms tracing so that the first `kvm_entry` event is recorded and then tracing stops (the
/// trigger has a condition, so it runs after the event was recorded).
fn arm_first_entry() -> Result<()> {
    disarm_first_entry();
    tracefs_write("trace_clock", "mono")?;
    tracefs_write("trace", "")?;
    tracefs_write(
        "events/kvm/kvm_entry/trigger",
        "traceoff:1 if vcpu_id < 4096",
    )?;
    tracefs_write("events/kvm/kvm_entry/enable", "1")?;
    tracefs_write("tracing_on", "1")
}

fn disarm_first_entry() {
    let _ = tracefs_write("events/kvm/kvm_entry/enable", "0");
    let _ = tracefs_write("events/kvm/kvm_entry/trigger", "!traceoff");
    let _ = tracefs_write("tracing_on", "1");
}

/// CLOCK_MONOTONIC ns of the first recorded `kvm_entry` event.
fn first_entry_ns() -> Option<u64> {
    let text = std::fs::read_to_string(Path::new(TRACEFS).join("trace")).ok()?;
    parse_first_entry(&text)
}

/// `  microvm-123  [000] d..2.  52.123456: kvm_entry: vcpu 0, rip 0x1000000` → ns.
fn parse_first_entry(trace: &str) -> Option<u64> {
    let line = trace
        .lines()
        .find(|l| !l.starts_with('#') && l.contains(" kvm_entry:"))?;
    let before = &line[..line.find(": kvm_entry:")?];
    let ts = before.split_whitespace().last()?;
    let (s, frac) = ts.split_once('.')?;
    let s: u64 = s.parse().ok()?;
    let mut frac = frac.to_string();
    frac.truncate(9);
    while frac.len() < 9 {
        frac.push('0');
    }
    Some(s * 1_000_000_000 + frac.parse::<u64>().ok()?)
}

fn pump(r: impl Read + Send + 'static, tx: mpsc::Sender<(Instant, String)>) {
    std::thread::spawn(move || {
        let mut r = BufReader::new(r);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match r.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    let l = String::from_utf8_lossy(&buf).trim_end().to_string();
                    if tx.send((Instant::now(), l)).is_err() {
                        return;
                    }
                }
            }
        }
    });
}

/// Everything learnt from the VMM's output.
#[derive(Default)]
struct Seen {
    markers: BTreeMap<String, f64>,
    boot_time: Option<String>,
    in_table: bool,
    table: Vec<String>,
    lines: Vec<String>,
}

impl Seen {
    fn line(&mut self, a: &Args, t: Option<f64>, l: String) {
        if let Some(t) = t {
            for (name, text) in &a.markers {
                if !self.markers.contains_key(name) && l.contains(text.as_str()) {
                    self.markers.insert(name.clone(), t);
                }
            }
        }
        if let Some(i) = l.find("boot-time-ms=") {
            self.boot_time = l[i + "boot-time-ms=".len()..]
                .split_whitespace()
                .next()
                .map(str::to_string);
        }
        if l.starts_with("exit statistics (") {
            self.in_table = true;
        } else if self.in_table && !l.starts_with("  ") {
            self.in_table = false;
        }
        if self.in_table {
            self.table.push(l.clone());
        }
        if a.echo {
            eprintln!("[vm] {l}");
        }
        self.lines.push(l);
    }

    fn tail(&self) -> String {
        self.lines[self.lines.len().saturating_sub(20)..].join("\n")
    }
}

/// The last `KEY<microseconds>` in `lines`, in milliseconds.
fn us_field(lines: &[String], key: &str) -> Option<f64> {
    lines.iter().rev().find_map(|l| {
        let i = l.find(key)?;
        l[i + key.len()..]
            .split_whitespace()
            .next()?
            .parse::<f64>()
            .ok()
            .map(|us| us / 1000.0)
    })
}

fn main() -> Result<()> {
    let a = parse()?;
    if a.first_entry {
        arm_first_entry()?;
    }
    let start_ns = monotonic_ns();
    let start = Instant::now();
    let mut child = Command::new(&a.cmd[0])
        .args(&a.cmd[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", a.cmd[0]))?;
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    if let Some(o) = child.stdout.take() {
        pump(o, tx.clone());
    }
    if let Some(e) = child.stderr.take() {
        pump(e, tx.clone());
    }
    drop(tx);
    let mut seen = Seen::default();
    let (mut peak_total, mut peak_vmm) = (0u64, 0u64);
    let mut kdir: Option<PathBuf> = None;
    let mut kvm: BTreeMap<&'static str, u64> = BTreeMap::new();
    let status = loop {
        while let Ok((t, l)) = rx.try_recv() {
            seen.line(&a, Some((t - start).as_secs_f64() * 1000.0), l);
        }
        if let Some((t, v)) = rss(pid, a.guest_kib) {
            peak_total = peak_total.max(t);
            peak_vmm = peak_vmm.max(v);
        }
        if a.kvm_stats {
            if kdir.is_none() {
                kdir = kvm_dir(pid);
            }
            if let Some(m) = kdir.as_deref().and_then(kvm_sample) {
                kvm = m;
            }
        }
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if start.elapsed() > a.timeout {
            let _ = child.kill();
            let _ = child.wait();
            eprintln!("bootwatch: timeout; last lines:\n{}", seen.tail());
            break std::process::ExitStatus::default();
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let wall_ms = start.elapsed().as_secs_f64() * 1000.0;
    // Drain what is left.
    while let Ok((_, l)) = rx.recv_timeout(Duration::from_millis(200)) {
        seen.line(&a, None, l);
    }
    let first_entry_ms = if a.first_entry {
        let r = first_entry_ns().map(|ns| ns.saturating_sub(start_ns) as f64 / 1e6);
        disarm_first_entry();
        r
    } else {
        None
    };
    for (name, text) in &a.markers {
        if !seen.markers.contains_key(name) {
            eprintln!(
                "bootwatch: marker {name} ({text:?}) not seen; last lines:\n{}",
                seen.tail()
            );
        }
    }
    for l in &seen.table {
        println!("bootwatch-exits {l}");
    }
    let ms = |v: Option<f64>| v.map_or("none".into(), |m| format!("{m:.1}"));
    let mut out = format!(
        "bootwatch exit={} wall-ms={:.1} rss-kib={} vmm-rss-kib={} boot-time-ms={} first-entry-ms={} restore-ms={} first-exit-ms={}",
        status.code().unwrap_or(-1),
        wall_ms,
        peak_total,
        peak_vmm,
        seen.boot_time.unwrap_or_else(|| "none".into()),
        ms(first_entry_ms),
        ms(us_field(&seen.lines, "restore-us=")),
        ms(us_field(&seen.lines, "first-vcpu-exit-us=")),
    );
    for (name, _) in &a.markers {
        out.push_str(&format!(
            " marker.{name}-ms={}",
            seen.markers
                .get(name)
                .map_or("none".into(), |m| format!("{m:.1}"))
        ));
    }
    for (k, v) in &kvm {
        out.push_str(&format!(" kvm.{k}={v}"));
    }
    println!("{out}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_entry_timestamp() {
        let t = "# tracer: nop\n#\n           <...>-812     [000] d..2.    52.000123: kvm_entry: vcpu 0, rip 0xfff0\n            qemu-812     [000] d..2.    53.5: kvm_entry: vcpu 0, rip 0x1\n";
        assert_eq!(parse_first_entry(t), Some(52_000_123_000));
        assert_eq!(parse_first_entry("# tracer: nop\n"), None);
    }
}
