//! `bootwatch`: runs a VMM, measures the time from process start to a console line, and samples
//! the VMM's resident memory. Used by the comparison benchmark inside the test host.
//!
//! usage: bootwatch [--marker TEXT] [--guest-mib N] [--timeout SECS] [--echo] -- VMM ARGS...
//!
//! Prints one line: `bootwatch exit=RC marker-ms=F wall-ms=F rss-kib=N vmm-rss-kib=N boot-time-ms=F
//! restore-ms=F first-exit-ms=F` where vmm-rss-kib is the peak RSS of every mapping smaller than
//! the guest memory (the VMM's own overhead; guest RAM excluded), rss-kib the peak total RSS, and
//! restore-ms / first-exit-ms what `microvm --log-level debug` reports for a restore (its
//! `timings:` line: restoring, and main → first return from KVM_RUN), or `none`.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

struct Args {
    marker: String,
    guest_kib: u64,
    timeout: Duration,
    echo: bool,
    cmd: Vec<String>,
}

fn parse() -> Result<Args> {
    let mut a = Args {
        marker: "microvirt: init up".into(),
        guest_kib: 256 * 1024,
        timeout: Duration::from_secs(60),
        echo: false,
        cmd: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--marker" => a.marker = it.next().context("--marker needs a value")?,
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
            "--" => {
                a.cmd = it.by_ref().collect();
                break;
            }
            other => bail!("unknown argument {other:?}"),
        }
    }
    if a.cmd.is_empty() {
        bail!("usage: bootwatch [--marker TEXT] [--guest-mib N] [--timeout SECS] [--echo] -- VMM ARGS...");
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

fn main() -> Result<()> {
    let a = parse()?;
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
    let mut marker_ms: Option<f64> = None;
    let mut boot_time: Option<String> = None;
    let us_field = |lines: &[String], key: &str| -> Option<f64> {
        lines.iter().rev().find_map(|l| {
            let i = l.find(key)?;
            l[i + key.len()..]
                .split_whitespace()
                .next()?
                .parse::<f64>()
                .ok()
                .map(|us| us / 1000.0)
        })
    };
    let (mut peak_total, mut peak_vmm) = (0u64, 0u64);
    let mut lines: Vec<String> = Vec::new();
    let status = loop {
        while let Ok((t, l)) = rx.try_recv() {
            if marker_ms.is_none() && l.contains(&a.marker) {
                marker_ms = Some((t - start).as_secs_f64() * 1000.0);
            }
            if let Some(i) = l.find("boot-time-ms=") {
                boot_time = l[i + "boot-time-ms=".len()..]
                    .split_whitespace()
                    .next()
                    .map(str::to_string);
            }
            if a.echo {
                eprintln!("[vm] {l}");
            }
            lines.push(l);
        }
        if let Some((t, v)) = rss(pid, a.guest_kib) {
            peak_total = peak_total.max(t);
            peak_vmm = peak_vmm.max(v);
        }
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if start.elapsed() > a.timeout {
            let _ = child.kill();
            let _ = child.wait();
            eprintln!(
                "bootwatch: timeout; last lines:\n{}",
                lines[lines.len().saturating_sub(20)..].join("\n")
            );
            break std::process::ExitStatus::default();
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let wall_ms = start.elapsed().as_secs_f64() * 1000.0;
    // Drain what is left.
    while let Ok((_, l)) = rx.recv_timeout(Duration::from_millis(200)) {
        if let Some(i) = l.find("boot-time-ms=") {
            boot_time = l[i + "boot-time-ms=".len()..]
                .split_whitespace()
                .next()
                .map(str::to_string);
        }
        lines.push(l);
    }
    if marker_ms.is_none() {
        eprintln!(
            "bootwatch: marker {:?} not seen; last lines:\n{}",
            a.marker,
            lines[lines.len().saturating_sub(20)..].join("\n")
        );
    }
    let ms = |v: Option<f64>| v.map_or("none".into(), |m| format!("{m:.1}"));
    println!(
        "bootwatch exit={} marker-ms={} wall-ms={:.1} rss-kib={} vmm-rss-kib={} boot-time-ms={} restore-ms={} first-exit-ms={}",
        status.code().unwrap_or(-1),
        ms(marker_ms),
        wall_ms,
        peak_total,
        peak_vmm,
        boot_time.unwrap_or_else(|| "none".into()),
        ms(us_field(&lines, "restore-us=")),
        ms(us_field(&lines, "first-vcpu-exit-us=")),
    );
    Ok(())
}
