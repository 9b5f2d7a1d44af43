//! `cargo bench -p microvirt-launcher [-- RUNS]`: virt-launcher on this machine's /dev/kvm with
//! the built-in demo guest (release build).
//!
//! - boot: `virt-launcher run` → the guest's boot-timer write (the launcher's own measurement,
//!   from process start), and spawn → exit of the whole run (the guest powers off through ACPI right after);
//! - memory: RSS of the launcher process with a booted, halted guest, sampled from
//!   /proc/PID/smaps every 10 ms for 300 ms; "overhead" excludes the guest-RAM mapping
//!   (Firecracker's method).

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
                // The guest-RAM mapping: the guest's size plus vm-memory's few extra KiB.
                if (guest_kib..guest_kib + 1024).contains(&size) {
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

fn memory(dir: &Path, vcpus: u32, mem_mib: u64, console_socket: bool) -> (u64, u64) {
    let name = format!("bench-mem-{vcpus}-{console_socket}");
    let file = vmi(dir, &name, "halt-forever", vcpus, mem_mib);
    let ctl = dir.join(format!("{name}.sock"));
    let mut cmd = Command::new(BIN);
    cmd.arg("run")
        .arg(&file)
        .args(["--grace-period", "0", "--control-socket"])
        .arg(&ctl);
    if console_socket {
        cmd.args(["--console", "socket"]);
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    // Booted: the control socket's status says so.
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let st = Command::new(BIN)
            .args(["status", "--socket"])
            .arg(&ctl)
            .output()
            .expect("status");
        if String::from_utf8_lossy(&st.stdout).contains("\"booted\":true") {
            break;
        }
        assert!(Instant::now() < end, "the guest did not boot");
        std::thread::sleep(Duration::from_millis(20));
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
    println!("| spawn → exit (boot, then guest power-off) | {total:.2} ms |");
    for (vcpus, socket, what) in [
        (1, false, "1 vCPU, console on stdio"),
        (2, false, "2 vCPUs, console on stdio"),
        (1, true, "1 vCPU, console on a socket"),
    ] {
        let (t, o) = memory(&dir, vcpus, 128, socket);
        println!(
            "| RSS total / beyond guest RAM ({what}, 128 MiB guest, control socket) | {:.1} MiB / {:.1} MiB |",
            t as f64 / 1024.0,
            o as f64 / 1024.0
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
