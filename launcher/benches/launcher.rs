//! `cargo bench -p microvirt-launcher [-- RUNS]`: virt-launcher on this machine's /dev/kvm with
//! the built-in demo guest (release build).
//!
//! - boot: `virt-launcher run` → the guest's boot-timer write (the launcher's own measurement,
//!   from process start), and spawn → exit of the whole run (the guest resets right after);
//! - memory: RSS of the launcher process with a booted, halted guest, sampled from
//!   /proc/PID/smaps every 10 ms for 300 ms; "overhead" excludes the guest-RAM mapping
//!   (Firecracker's method).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_virt-launcher");

fn vmi(dir: &Path, name: &str, scenario: &str, vcpus: u32, mem_mib: u64) -> std::path::PathBuf {
    let p = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &p,
        format!(
            "metadata: {{name: {name}}}\nspec:\n  domain:\n    cpu: {{cores: {vcpus}}}\n    \
             memory: {{guest: {mem_mib}Mi}}\n    firmware: {{kernelBoot: {{kernelArgs: \
             \"testguest.scenario={scenario}\"}}}}\n"
        ),
    )
    .expect("write VMI");
    p
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// (total RSS KiB, RSS KiB without the guest-RAM mapping).
fn rss(pid: u32, guest_kib: u64) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    let (mut total, mut guest) = (0u64, 0u64);
    let mut size = 0u64;
    for line in text.lines() {
        let mut f = line.split_whitespace();
        match f.next() {
            Some("Size:") => size = f.next()?.parse().ok()?,
            Some("Rss:") => {
                let r: u64 = f.next()?.parse().ok()?;
                total += r;
                if size == guest_kib {
                    guest += r;
                }
            }
            _ => {}
        }
    }
    Some((total, total - guest))
}

fn boot_runs(dir: &Path, runs: usize) -> (f64, f64, f64) {
    let file = vmi(dir, "bench-boot", "basic", 1, 128);
    let (mut boot, mut cpu, mut total) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..=runs {
        let t0 = Instant::now();
        let out = Command::new(BIN)
            .arg("run")
            .arg(&file)
            .stdin(Stdio::null())
            .output()
            .expect("run virt-launcher");
        let took = t0.elapsed().as_secs_f64() * 1000.0;
        assert!(out.status.success(), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        // "guest booted in 12.345 ms (cpu 3 ms)"
        let line = err
            .lines()
            .find_map(|l| l.strip_prefix("virt-launcher: guest booted in "))
            .expect("boot line");
        let ms: f64 = line
            .split(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .expect("ms");
        let cpu_ms: f64 = line
            .split("(cpu ")
            .nth(1)
            .and_then(|v| v.split(' ').next())
            .and_then(|v| v.parse().ok())
            .expect("cpu ms");
        if i > 0 {
            boot.push(ms);
            cpu.push(cpu_ms);
            total.push(took);
        }
    }
    (median(&mut boot), median(&mut cpu), median(&mut total))
}

fn memory(dir: &Path, vcpus: u32, mem_mib: u64, extra: &[&str]) -> (u64, u64) {
    let file = vmi(
        dir,
        &format!("bench-mem-{vcpus}"),
        "halt-forever",
        vcpus,
        mem_mib,
    );
    let mut child = Command::new(BIN)
        .arg("run")
        .arg(&file)
        .args(["--grace-period", "0"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    while out.read_line(&mut line).map(|n| n > 0).unwrap_or(false) && !line.contains("halting") {
        line.clear();
    }
    let (mut peak_total, mut peak_over) = (0, 0);
    let end = Instant::now() + Duration::from_millis(300);
    while Instant::now() < end {
        if let Some((t, o)) = rss(child.id(), mem_mib << 10) {
            peak_total = peak_total.max(t);
            peak_over = peak_over.max(o);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: signals our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    (peak_total, peak_over)
}

fn main() {
    let runs: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(20);
    let dir = std::env::temp_dir().join(format!("launcher-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (boot, cpu, total) = boot_runs(&dir, runs);
    println!(
        "virt-launcher bench ({runs} runs + 1 warm-up, medians; demo guest, 1 vCPU, 128 MiB)\n"
    );
    println!("| metric | value |\n|---|---|");
    println!("| run → guest boot-timer write (wall) | {boot:.2} ms |");
    println!("| run → guest boot-timer write (launcher CPU) | {cpu:.0} ms |");
    println!("| spawn → exit (boot, then guest reset) | {total:.2} ms |");
    for (vcpus, mem, extra, what) in [
        (1, 128, &[][..], "1 vCPU, 128 MiB, console on stdio"),
        (2, 128, &[][..], "2 vCPUs, 128 MiB, console on stdio"),
    ] {
        let (t, o) = memory(&dir, vcpus, mem, extra);
        println!(
            "| RSS total / overhead beyond guest RAM ({what}) | {:.1} MiB / {:.1} MiB |",
            t as f64 / 1024.0,
            o as f64 / 1024.0
        );
    }
    let ctl = dir.join("control.sock");
    let (t, o) = memory(
        &dir,
        1,
        128,
        &[
            "--console",
            "socket",
            "--control-socket",
            ctl.to_str().unwrap_or(""),
        ],
    );
    println!(
        "| RSS total / overhead beyond guest RAM (1 vCPU, 128 MiB, console socket + control socket) | {:.1} MiB / {:.1} MiB |",
        t as f64 / 1024.0,
        o as f64 / 1024.0
    );
    let _ = std::fs::remove_dir_all(&dir);
}
