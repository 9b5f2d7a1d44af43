//! `cargo xtask bench`: the VMM's own benchmarks on this machine's /dev/kvm,
//! with the test guest (release build of `microvm`).
//!
//! - process spawn -> first guest instruction (the guest's POST-code write at
//!   its entry point) and -> boot-timer write;
//! - VMM memory overhead: RSS of the process minus the guest-RAM mapping's
//!   resident pages (Firecracker's method), 1 vCPU, 128 MiB, guest idle;
//! - boots per second, sequential and with 2 in parallel;
//! - the VMM's own build steps (`--log-level debug` "built VM" line), medians;
//! - `virt-launcher` (built static like `microvm`) memory overhead with the embedded demo guest.
//! - the machine's floor: spawn -> `main()` of a trivial Rust program built like `microvm`
//!   (release, static-pie), measured the same way: what exec costs here before any VMM code runs.
//! - snapshots and restores (`snapshot.rs`; only those with `--snapshot-only`, all but
//!   those with `--boot-only`).
//!
//! `--rt`: the harness, and every process it starts, runs at real-time priority (`SCHED_FIFO`
//! 10; needs root): on a shared machine the figures then show the VMM and the host kernel, not
//! the other load (which gets the CPUs back between runs and whatever real-time throttling
//! leaves it). Kernel threads the VMM waits for (KVM's PIT worker) keep their own priority.
//!
//! `--microvm-bin PATH`, `--launcher-bin PATH`: measure those binaries (a baseline built from
//! another commit, run back to back with this checkout's) instead of building them here.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use measure::{field, monotonic_ns, print_row, rss_split, stats};

mod measure;
pub mod node;
mod snapshot;

/// The release `microvm`, statically linked (no dynamic loader at exec; docs/boot-time.md).
pub fn build_release_microvm(_root: &Path) -> Result<PathBuf> {
    microvirt_testhost::scenarios::cargo_build_release_static("vmm", "microvm")
        .map_err(|e| anyhow::anyhow!("building microvm (release, static): {e}"))
}

/// The floor program: `main()` reads the clock first, like `microvm`'s, and prints how long
/// after the harness's `MICROVM_T0_MONO_NS` it ran.
const FLOOR_SRC: &str = r#"extern "C" {
    fn clock_gettime(clk: i32, ts: *mut [i64; 2]) -> i32;
}
fn main() {
    let mut ts = [0i64; 2];
    // SAFETY: clock_gettime writes two longs into the array we own; CLOCK_MONOTONIC is valid.
    unsafe { clock_gettime(1, &mut ts) };
    let now = ts[0] as u64 * 1_000_000_000 + ts[1] as u64;
    let t0: u64 = std::env::var("MICROVM_T0_MONO_NS").ok().and_then(|v| v.parse().ok()).unwrap_or(now);
    println!("spawn-to-main-us={}", now.saturating_sub(t0) / 1000);
}
"#;

/// Builds the floor program with `rustc` like the release `microvm` (opt-level 3, panic=abort,
/// static-pie for the same target) under `target/bench-floor/`.
fn build_floor(root: &Path) -> Result<PathBuf> {
    let dir = root.join("target").join("bench-floor");
    std::fs::create_dir_all(&dir)?;
    let src = dir.join("floor.rs");
    let bin = dir.join("floor");
    if std::fs::read_to_string(&src).ok().as_deref() != Some(FLOOR_SRC) || !bin.is_file() {
        std::fs::write(&src, FLOOR_SRC)?;
        let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
        let out = Command::new(rustc)
            .args([
                "--edition",
                "2021",
                "-C",
                "opt-level=3",
                "-C",
                "panic=abort",
                "-C",
                "target-feature=+crt-static",
                "--target",
                microvirt_testhost::scenarios::STATIC_TARGET,
                "-o",
            ])
            .arg(&bin)
            .arg(&src)
            .output()?;
        if !out.status.success() {
            bail!(
                "building the floor program: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    Ok(bin)
}

fn floor_sample(bin: &Path) -> Result<u64> {
    let t0 = monotonic_ns();
    let out = Command::new(bin)
        .env("MICROVM_T0_MONO_NS", t0.to_string())
        .stdin(Stdio::null())
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    field(text.trim(), "spawn-to-main-us").context("floor program: no spawn-to-main-us")
}

struct Sample {
    phases: Vec<(String, u64)>,
    to_main_us: u64,
    to_first_insn_us: u64,
    to_boot_timer_us: u64,
    boot_cpu_us: u64,
    wall_us: u64,
}

fn one_boot(microvm: &Path, kernel: &Path) -> Result<Sample> {
    let t0 = monotonic_ns();
    let started = Instant::now();
    let out = Command::new(microvm)
        .args([
            "--kernel",
            kernel.to_str().unwrap(),
            "--serial",
            "none",
            "--log-level",
            "debug",
        ])
        .env("MICROVM_T0_MONO_NS", t0.to_string())
        .stdin(Stdio::null())
        .output()?;
    let wall_us = started.elapsed().as_micros() as u64;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("boot failed ({}): {stderr}", out.status);
    }
    let line = stderr
        .lines()
        .find(|l| l.contains("timings:"))
        .context("no timings line")?;
    let to_main = field(line, "spawn-to-main-us").context("spawn-to-main-us")?;
    // "built VM: ... in N us: open-kvm=12 guest-memory=34 ..."
    let phases = stderr
        .lines()
        .find(|l| l.contains("built VM:"))
        .and_then(|l| l.rsplit_once(" us: "))
        .map(|(_, p)| {
            p.split_whitespace()
                .filter_map(|kv| {
                    let (k, v) = kv.split_once('=')?;
                    Some((k.to_string(), v.parse().ok()?))
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(Sample {
        phases,
        to_main_us: to_main,
        to_first_insn_us: to_main
            + field(line, "first-guest-io-us")
                .context("first-guest-io-us (guest without POST marker?)")?,
        to_boot_timer_us: to_main + field(line, "boot-timer-us").context("boot-timer-us")?,
        boot_cpu_us: field(line, "boot-timer-cpu-us").unwrap_or(0),
        wall_us,
    })
}

fn memory_overhead(microvm: &Path, kernel: &Path) -> Result<(u64, u64)> {
    let mut child = Command::new(microvm)
        .args([
            "--kernel",
            kernel.to_str().unwrap(),
            "--mem-mib",
            "128",
            "--cmdline",
            "testguest.scenario=halt-forever",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match lines.next() {
            Some(Ok(l)) if l.contains("halting") => break,
            Some(Ok(_)) => {}
            _ => {
                let _ = child.kill();
                bail!("guest did not reach its idle loop");
            }
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            bail!("timeout waiting for the guest");
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    let r = rss_split(child.id(), 128 * 1024);
    let _ = child.kill();
    let _ = child.wait();
    r
}

/// RSS of `virt-launcher run` with the embedded demo guest idling (1 vCPU, 128 MiB), split like
/// [`memory_overhead`].
fn launcher_overhead(launcher: &Path) -> Result<(u64, u64)> {
    let dir = std::env::temp_dir().join(format!("xtask-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let vmi = dir.join("vmi.yaml");
    std::fs::write(
        &vmi,
        "metadata: {name: bench}\nspec:\n  domain:\n    cpu: {cores: 1}\n    memory: {guest: 128Mi}\n    \
         firmware: {kernelBoot: {kernelArgs: \"testguest.scenario=halt-forever\"}}\n",
    )?;
    let mut child = Command::new(launcher)
        .arg("run")
        .arg(&vmi)
        .args(["--grace-period", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(20);
    let halted = loop {
        match lines.next() {
            Some(Ok(l)) if l.contains("halting") => break true,
            Some(Ok(_)) if Instant::now() < deadline => {}
            _ => break false,
        }
    };
    let r = if halted {
        std::thread::sleep(Duration::from_millis(200));
        rss_split(child.id(), 128 * 1024)
    } else {
        Err(anyhow::anyhow!(
            "the demo guest did not reach its idle loop under virt-launcher"
        ))
    };
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    r
}

fn boots_per_second(microvm: &Path, kernel: &Path, total: usize, parallel: usize) -> Result<f64> {
    let start = Instant::now();
    let per = total / parallel;
    let mut handles = Vec::new();
    for _ in 0..parallel {
        let (m, k) = (microvm.to_path_buf(), kernel.to_path_buf());
        handles.push(std::thread::spawn(move || -> Result<()> {
            for _ in 0..per {
                let st = Command::new(&m)
                    .args([
                        "--kernel",
                        k.to_str().unwrap(),
                        "--serial",
                        "none",
                        "--log-level",
                        "warn",
                    ])
                    .stdin(Stdio::null())
                    .status()?;
                if !st.success() {
                    bail!("boot failed: {st}");
                }
            }
            Ok(())
        }));
    }
    for h in handles {
        h.join()
            .map_err(|_| anyhow::anyhow!("bench thread panicked"))??;
    }
    Ok((per * parallel) as f64 / start.elapsed().as_secs_f64())
}

#[repr(C)]
struct SchedParam {
    priority: i32,
}

extern "C" {
    fn sched_setscheduler(pid: i32, policy: i32, param: *const SchedParam) -> i32;
}

/// `--rt`: this process (and so every child it spawns afterwards) to `SCHED_FIFO` priority 10.
fn real_time() -> Result<()> {
    const SCHED_FIFO: i32 = 1;
    // SAFETY: sched_setscheduler reads the parameter struct we own; pid 0 is this process.
    if unsafe { sched_setscheduler(0, SCHED_FIFO, &SchedParam { priority: 10 }) } != 0 {
        bail!(
            "--rt: sched_setscheduler(SCHED_FIFO): {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

pub fn main(args: &[String]) -> Result<()> {
    let only_snapshot = args.iter().any(|a| a == "--snapshot-only");
    let rt = args.iter().any(|a| a == "--rt");
    let only_boot = args.iter().any(|a| a == "--boot-only");
    if only_snapshot && only_boot {
        bail!("--snapshot-only and --boot-only exclude each other");
    }
    // `--microvm-bin PATH` / `--launcher-bin PATH`: measure those binaries instead of building
    // this checkout's (e.g. a baseline built from another commit, run back to back).
    let mut microvm_bin = None;
    let mut launcher_given = None;
    let mut positional = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--microvm-bin" => {
                microvm_bin = Some(PathBuf::from(it.next().context("--microvm-bin PATH")?))
            }
            "--launcher-bin" => {
                launcher_given = Some(PathBuf::from(it.next().context("--launcher-bin PATH")?))
            }
            s if !s.starts_with("--") => positional.push(s),
            _ => {}
        }
    }
    let runs: usize = positional
        .first()
        .map(|s| s.parse())
        .transpose()
        .context("RUNS")?
        .unwrap_or(30);
    let root = crate::workspace_root();
    let microvm = match microvm_bin {
        Some(p) => p,
        None => build_release_microvm(&root)?,
    };
    let guest = testguest_build::build()?;
    let launcher_bin = if only_snapshot {
        None
    } else if let Some(p) = launcher_given {
        Some(p)
    } else {
        Some(
            microvirt_testhost::scenarios::cargo_build_release_static(
                "microvirt-launcher",
                "virt-launcher",
            )
            .map_err(|e| anyhow::anyhow!("building virt-launcher (release, static): {e}"))?,
        )
    };
    // After the builds: the compilers keep normal priority.
    if rt {
        real_time()?;
    }
    if only_snapshot {
        return snapshot::run(&microvm, &guest, runs);
    }
    println!(
        "microvm bench: {} runs per figure, test guest, 1 vCPU, 128 MiB, serial off{}",
        runs,
        if rt { ", SCHED_FIFO 10" } else { "" }
    );
    println!(
        "{:<44} {:>9} {:>9} {:>9}",
        "figure (ms)", "min", "median", "p95"
    );
    let floor = build_floor(&root)?;
    floor_sample(&floor)?; // warm-up
    let mut floor_us = Vec::new();
    for (name, kernel) in [("pvh", &guest.pvh), ("linux64", &guest.linux64)] {
        let mut samples = Vec::new();
        one_boot(&microvm, kernel)?; // warm-up
        for _ in 0..runs {
            samples.push(one_boot(&microvm, kernel)?);
            // Interleaved with the boots, so that both see the same load. The run right after
            // a VM's exit is slower (the host is still tearing the VM down): as each boot
            // follows a floor run, the measured floor run follows another one.
            if name == "pvh" {
                floor_sample(&floor)?;
                floor_us.push(floor_sample(&floor)?);
            }
        }
        if name == "pvh" {
            let (min, med, p95) = stats(std::mem::take(&mut floor_us));
            println!(
                "{:<44} {:>9.2} {:>9.2} {:>9.2}",
                "[floor] spawn -> main() of a static hello", min, med, p95
            );
        }
        let rows: [(&str, Vec<u64>); 5] = [
            (
                "spawn -> main()",
                samples.iter().map(|s| s.to_main_us).collect(),
            ),
            (
                "spawn -> first guest instruction",
                samples.iter().map(|s| s.to_first_insn_us).collect(),
            ),
            (
                "spawn -> boot-timer write",
                samples.iter().map(|s| s.to_boot_timer_us).collect(),
            ),
            (
                "VMM CPU time build -> boot timer",
                samples.iter().map(|s| s.boot_cpu_us).collect(),
            ),
            (
                "spawn -> process exit (whole boot)",
                samples.iter().map(|s| s.wall_us).collect(),
            ),
        ];
        for (label, v) in rows {
            print_row(name, label, v);
        }
        if name == "pvh" {
            let names: Vec<String> = samples
                .first()
                .map(|s| s.phases.iter().map(|(n, _)| n.clone()).collect())
                .unwrap_or_default();
            for n in names {
                let v: Vec<u64> = samples
                    .iter()
                    .filter_map(|s| s.phases.iter().find(|(k, _)| *k == n).map(|p| p.1))
                    .collect();
                let (min, med, p95) = stats(v);
                println!(
                    "{:<44} {:>9.3} {:>9.3} {:>9.3}",
                    format!("[{name}]   build step {n}"),
                    min,
                    med,
                    p95
                );
            }
        }
    }
    let mut overheads = Vec::new();
    for _ in 0..5 {
        let (total, guest_kib) = memory_overhead(&microvm, &guest.pvh)?;
        overheads.push((total, guest_kib));
    }
    overheads.sort_by_key(|(t, g)| t - g);
    let (total, guest_kib) = overheads[overheads.len() / 2];
    println!(
        "memory: RSS {:.2} MiB, guest RAM resident {:.2} MiB, VMM overhead {:.2} MiB (median of 5)",
        total as f64 / 1024.0,
        guest_kib as f64 / 1024.0,
        (total - guest_kib) as f64 / 1024.0
    );
    let mut launcher = Vec::new();
    for _ in 0..5 {
        launcher.push(launcher_overhead(
            launcher_bin.as_deref().context("virt-launcher")?,
        )?);
    }
    launcher.sort_by_key(|(t, g)| t - g);
    let (total, guest_kib) = launcher[launcher.len() / 2];
    println!(
        "virt-launcher memory: RSS {:.2} MiB, guest RAM resident {:.2} MiB, launcher overhead {:.2} MiB (median of 5)",
        total as f64 / 1024.0,
        guest_kib as f64 / 1024.0,
        (total - guest_kib) as f64 / 1024.0
    );
    let total_boots = runs.max(2) * 2;
    let seq = boots_per_second(&microvm, &guest.pvh, total_boots, 1)?;
    let par = boots_per_second(&microvm, &guest.pvh, total_boots, 2)?;
    println!("boots/s: sequential {seq:.1}, 2 in parallel {par:.1} ({total_boots} boots each)");
    if only_boot {
        return Ok(());
    }
    snapshot::run(&microvm, &guest, runs)
}
