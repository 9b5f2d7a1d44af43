//! The snapshot part of `cargo xtask bench` (release `microvm`, test guest, this machine's
//! /dev/kvm):
//!
//! - snapshot create time and bytes written against RAM the guest touched, for 128 MiB and
//!   2 GiB guests (idle, and after touching 64 MiB);
//! - restore → first guest instruction (first vCPU entry and first exit, from the VMM's own
//!   timings) and → first console output, 128 MiB and 2 GiB; a paused restore: `resume` →
//!   first console output;
//! - restores per second, sequential and 2 in parallel (restore, the guest reads `quit` on its
//!   console and resets, the process exits);
//! - RSS of an idle restored clone (guest halted) against a booted VM's.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::measure::{field, monotonic_ns, print_row, rss_split, stats};

/// A scratch directory for the run, removed at the end.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `microvm` child; killed when dropped.
struct Vm(Child);

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn control(sock: &Path, req: Value) -> Result<Value> {
    let mut s = UnixStream::connect(sock).with_context(|| format!("{}", sock.display()))?;
    let mut line = req.to_string();
    line.push('\n');
    s.write_all(line.as_bytes())?;
    let mut answer = String::new();
    BufReader::new(s).read_line(&mut answer)?;
    let v: Value = serde_json::from_str(answer.trim())?;
    if v["ok"] != true {
        bail!("{req}: {v}");
    }
    Ok(v)
}

/// Waits until the control socket accepts connections.
fn wait_socket(sock: &Path) -> Result<()> {
    let t = Instant::now();
    while UnixStream::connect(sock).is_err() {
        if t.elapsed() > Duration::from_secs(30) {
            bail!("no control socket {}", sock.display());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// Boots `kernel` with `cmdline`, waits for a console line containing `ready`, snapshots into
/// `dir`, stops the VM; returns the snapshot answer and the client-side time it took.
fn make_snapshot(
    microvm: &Path,
    kernel: &Path,
    mem_mib: u64,
    cmdline: &str,
    ready: &str,
    dir: &Path,
) -> Result<(Value, Duration)> {
    let sock = dir.with_extension("sock");
    let mut vm = Vm(Command::new(microvm)
        .args(["--kernel", kernel.to_str().unwrap()])
        .args(["--mem-mib", &mem_mib.to_string(), "--cmdline", cmdline])
        .args(["--control-socket", sock.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?);
    let mut lines = BufReader::new(vm.0.stdout.take().unwrap()).lines();
    loop {
        match lines.next() {
            Some(Ok(l)) if l.contains(ready) => break,
            Some(Ok(_)) => {}
            _ => bail!("the guest never printed {ready:?}"),
        }
    }
    // Keep draining the console so the guest never blocks on it.
    std::thread::spawn(move || for _ in lines {});
    let t0 = Instant::now();
    let a = control(
        &sock,
        json!({"cmd": "snapshot", "dir": dir.to_str().unwrap()}),
    )?;
    let took = t0.elapsed();
    control(&sock, json!({"cmd": "stop"}))?;
    let _ = vm.0.wait();
    Ok((a, took))
}

/// Blocks actually allocated by a file (sparse files: its data).
fn allocated_bytes(p: &Path) -> Result<u64> {
    use std::os::unix::fs::MetadataExt;
    Ok(std::fs::metadata(p)?.blocks() * 512)
}

struct Restore {
    /// Spawn → first vCPU KVM_RUN (from the VMM: spawn-to-main + main-to-entry).
    to_entry_us: u64,
    /// Spawn → first return from KVM_RUN (the guest ran).
    to_exit_us: u64,
    /// Spawn → first console byte, seen from outside.
    to_output_us: u64,
    /// Inside the VMM: main() → restored (before the vCPUs start).
    restore_us: u64,
}

/// Restores `snap`, waits for the first console output, stops the VM, reads its timings.
fn one_restore(microvm: &Path, snap: &Path, sock: &Path) -> Result<Restore> {
    let _ = std::fs::remove_file(sock);
    let t0 = monotonic_ns();
    let started = Instant::now();
    let mut vm = Vm(Command::new(microvm)
        .args(["--restore", snap.to_str().unwrap()])
        .args([
            "--control-socket",
            sock.to_str().unwrap(),
            "--log-level",
            "debug",
        ])
        .env("MICROVM_T0_MONO_NS", t0.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?);
    let mut out = vm.0.stdout.take().unwrap();
    let mut b = [0u8; 1];
    if out.read(&mut b)? != 1 {
        bail!("no console output after restore");
    }
    let to_output_us = started.elapsed().as_micros() as u64;
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = out.read_to_end(&mut sink);
    });
    wait_socket(sock)?;
    control(sock, json!({"cmd": "stop"}))?;
    let mut err = String::new();
    vm.0.stderr.take().unwrap().read_to_string(&mut err)?;
    let _ = vm.0.wait();
    let line = err
        .lines()
        .find(|l| l.contains("timings:"))
        .context("no timings line")?;
    let main = field(line, "spawn-to-main-us").context("spawn-to-main-us")?;
    Ok(Restore {
        to_entry_us: main + field(line, "first-vcpu-entry-us").context("entry")?,
        to_exit_us: main + field(line, "first-vcpu-exit-us").context("exit")?,
        to_output_us,
        restore_us: field(line, "restore-us").context("restore-us")?,
    })
}

/// A paused restore: `resume` → first console byte.
fn resume_to_output(microvm: &Path, snap: &Path, sock: &Path) -> Result<u64> {
    let _ = std::fs::remove_file(sock);
    let mut vm = Vm(Command::new(microvm)
        .args(["--restore", snap.to_str().unwrap(), "--paused"])
        .args(["--control-socket", sock.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?);
    let mut out = vm.0.stdout.take().unwrap();
    wait_socket(sock)?;
    // Give the restore time to finish: the event loop answers once it runs.
    control(sock, json!({"cmd": "state"}))?;
    let t0 = Instant::now();
    control(sock, json!({"cmd": "resume"}))?;
    let mut b = [0u8; 1];
    if out.read(&mut b)? != 1 {
        bail!("no console output after resume");
    }
    let us = t0.elapsed().as_micros() as u64;
    drop(vm);
    Ok(us)
}

/// How long one restore-read-reset run may take (each takes milliseconds).
const RESTORE_RUN_WITHIN: Duration = Duration::from_secs(20);

/// Waits for `c`; a watchdog kills it if it still runs after `bound`, and then this fails. Under
/// `--rt` the restored guest's vCPU polls the serial port at `SCHED_FIFO`; with two such VMs on a
/// two-CPU machine they can starve the event loops that would hand them their input, which never
/// ends by itself. (The wait itself is a plain `wait()`: polling would add to what is timed.)
fn wait_bounded(c: &mut Child, bound: Duration) -> Result<std::process::ExitStatus> {
    let pid = c.id().to_string();
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        let timed_out = matches!(
            finished.recv_timeout(bound),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout)
        );
        if timed_out {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
        }
        timed_out
    });
    let st = c.wait()?;
    let _ = done.send(());
    if watchdog.join().unwrap_or(false) {
        bail!(
            "a restored VM did not finish within {} s and was killed (with --rt, guests that \
             poll at SCHED_FIFO can starve their event loops on a machine with few CPUs: run \
             without --rt)",
            bound.as_secs()
        );
    }
    Ok(st)
}

fn restores_per_second(microvm: &Path, snap: &Path, total: usize, parallel: usize) -> Result<f64> {
    let start = Instant::now();
    let per = total / parallel;
    let mut handles = Vec::new();
    for _ in 0..parallel {
        let (m, s) = (microvm.to_path_buf(), snap.to_path_buf());
        handles.push(std::thread::spawn(move || -> Result<()> {
            for _ in 0..per {
                let mut c = Command::new(&m)
                    .args(["--restore", s.to_str().unwrap(), "--log-level", "warn"])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::null())
                    .spawn()?;
                c.stdin.take().unwrap().write_all(b"quit\r")?;
                let st = wait_bounded(&mut c, RESTORE_RUN_WITHIN)?;
                if !st.success() {
                    bail!("restore failed: {st}");
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

/// RSS of an idle (halted) VM: restored from `snap`, or booted when `snap` is None.
fn idle_rss(microvm: &Path, kernel: &Path, snap: Option<&Path>) -> Result<(u64, u64)> {
    let mut c = Command::new(microvm);
    match snap {
        Some(s) => c.args(["--restore", s.to_str().unwrap()]),
        None => c.args([
            "--kernel",
            kernel.to_str().unwrap(),
            "--cmdline",
            "testguest.scenario=halt-forever",
        ]),
    };
    let mut vm = Vm(c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?);
    let mut out = vm.0.stdout.take().unwrap();
    if snap.is_none() {
        let mut lines = BufReader::new(&mut out).lines();
        loop {
            match lines.next() {
                Some(Ok(l)) if l.contains("halting") => break,
                Some(Ok(_)) => {}
                _ => bail!("the guest did not halt"),
            }
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    rss_split(vm.0.id(), 128 * 1024)
}

pub fn run(microvm: &Path, guest: &testguest_build::Artifacts, runs: usize) -> Result<()> {
    let kernel = &guest.pvh;
    let scratch =
        Scratch(std::env::temp_dir().join(format!("mv-bench-snap-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&scratch.0);
    std::fs::create_dir_all(&scratch.0)?;
    let dir = |n: &str| scratch.0.join(n);

    println!("\nsnapshot create (counter guest; bytes written = data in the sparse memory file)");
    println!(
        "{:<30} {:>10} {:>12} {:>12} {:>12} {:>10} {:>10}",
        "guest", "RAM MiB", "touched MiB", "written MiB", "file MiB", "write ms", "total ms"
    );
    for (mem, touch) in [(128u64, 0u64), (128, 64), (2048, 0), (2048, 64)] {
        let name = format!("create-{mem}-{touch}");
        let cmdline = format!(
            "testguest.scenario=counter testguest.touch_mib={touch} testguest.counter_every=20000"
        );
        let ready = if touch > 0 { "touch:" } else { "counter: addr" };
        let (a, took) = make_snapshot(microvm, kernel, mem, &cmdline, ready, &dir(&name))?;
        let mib = |v: &Value| v.as_u64().unwrap_or(0) as f64 / (1 << 20) as f64;
        println!(
            "{:<30} {:>10} {:>12.1} {:>12.1} {:>12.1} {:>10.1} {:>10.1}",
            format!("{mem} MiB, touched {touch} MiB"),
            mem,
            mib(&a["touchedBytes"]),
            mib(&a["memoryBytes"]),
            allocated_bytes(&dir(&name).join("memory"))? as f64 / (1 << 20) as f64,
            a["writeUs"].as_u64().unwrap_or(0) as f64 / 1000.0,
            took.as_secs_f64() * 1000.0
        );
    }

    println!(
        "\nrestore (counter guest printing every count, {runs} runs each; spawn of `microvm --restore` → ...)"
    );
    println!(
        "{:<44} {:>9} {:>9} {:>9}",
        "figure (ms)", "min", "median", "p95"
    );
    let sock = dir("restore.sock");
    for mem in [128u64, 2048] {
        // A guest that prints on every count: its first exit and output follow the restore at
        // once.
        let snap = dir(&format!("restore-{mem}"));
        make_snapshot(
            microvm,
            kernel,
            mem,
            "testguest.scenario=counter testguest.counter_every=1",
            "counter: seq=3 ",
            &snap,
        )?;
        one_restore(microvm, &snap, &sock)?; // warm-up (page cache)
        let mut samples = Vec::new();
        for _ in 0..runs {
            samples.push(one_restore(microvm, &snap, &sock)?);
        }
        let rows: [(&str, Vec<u64>); 4] = [
            (
                "restore in the VMM (main → ready)",
                samples.iter().map(|s| s.restore_us).collect(),
            ),
            (
                "spawn → guest running (first KVM_RUN)",
                samples.iter().map(|s| s.to_entry_us).collect(),
            ),
            (
                "spawn → first guest instruction (exit)",
                samples.iter().map(|s| s.to_exit_us).collect(),
            ),
            (
                "spawn → first console output",
                samples.iter().map(|s| s.to_output_us).collect(),
            ),
        ];
        for (label, v) in rows {
            print_row(&format!("{mem} MiB"), label, v);
        }
        let mut resumes = Vec::new();
        for _ in 0..runs {
            resumes.push(resume_to_output(microvm, &snap, &sock)?);
        }
        let (min, med, p95) = stats(resumes);
        println!(
            "{:<44} {:>9.2} {:>9.2} {:>9.2}",
            format!("[{mem} MiB] paused restore: resume → output"),
            min,
            med,
            p95
        );
    }

    // Restores per second: an echo guest waiting for a line; `quit` makes it reset.
    let echo = dir("echo");
    make_snapshot(
        microvm,
        kernel,
        128,
        "testguest.scenario=echo",
        "echo: ready",
        &echo,
    )?;
    let total = runs.max(2) * 2;
    let seq = restores_per_second(microvm, &echo, total, 1)?;
    let par = restores_per_second(microvm, &echo, total, 2)?;
    println!(
        "\nrestores/s (restore, guest reads a line and resets, exit): sequential {seq:.1}, 2 in parallel {par:.1} ({total} each)"
    );

    let halted = dir("halted");
    make_snapshot(
        microvm,
        kernel,
        128,
        "testguest.scenario=halt-forever",
        "halting",
        &halted,
    )?;
    let median5 = |snap: Option<&Path>| -> Result<(u64, u64)> {
        let mut v = (0..5)
            .map(|_| idle_rss(microvm, kernel, snap))
            .collect::<Result<Vec<_>>>()?;
        v.sort_by_key(|(t, g)| t - g);
        Ok(v[2])
    };
    let (boot_total, boot_guest) = median5(None)?;
    let (clone_total, clone_guest) = median5(Some(&halted))?;
    let touched = allocated_bytes(&halted.join("memory"))? / 1024;
    println!(
        "idle VM RSS (median of 5), 128 MiB guest (halted): booted {:.2} MiB (guest RAM resident {:.2} MiB, VMM {:.2} MiB); \
         restored clone {:.2} MiB (guest RAM resident {:.2} MiB, VMM {:.2} MiB); the snapshot holds {:.2} MiB of guest pages",
        boot_total as f64 / 1024.0,
        boot_guest as f64 / 1024.0,
        (boot_total - boot_guest) as f64 / 1024.0,
        clone_total as f64 / 1024.0,
        clone_guest as f64 / 1024.0,
        (clone_total - clone_guest) as f64 / 1024.0,
        touched as f64 / 1024.0,
    );
    Ok(())
}
