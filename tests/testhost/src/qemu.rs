//! Booting the test host under `qemu-system-x86_64 -accel tcg -cpu max` (or any command producing a
//! console on stdout): streams the output line by line with a prefix, keeps a log file, enforces a
//! timeout and always kills the process (also when the caller panics).

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The line the generated test-host init prints when everything ran.
pub const DONE_MARKER: &str = "=== microvirt-testhost done";

/// Errors from a console-producing run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot start {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("cannot write the console log {path}: {source}")]
    Log {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} timed out after {secs} s (log: {log}); console tail:\n{tail}")]
    Timeout {
        what: String,
        secs: u64,
        log: PathBuf,
        tail: String,
    },
    #[error("{what} ended ({status}) before it finished (log: {log}); console tail:\n{tail}")]
    Incomplete {
        what: String,
        status: String,
        log: PathBuf,
        tail: String,
    },
}

/// Kills and reaps the child when dropped, whatever happened.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// Options of a console run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Shown in errors and as the line prefix, e.g. "l1".
    pub name: String,
    pub timeout: Duration,
    pub log: PathBuf,
    /// Echo console lines to stderr as they arrive.
    pub echo: bool,
    /// A line containing this marks success; without it the run is incomplete.
    pub done_marker: String,
}

/// Everything a run printed.
#[derive(Debug, Clone)]
pub struct Console {
    pub lines: Vec<String>,
    pub wall_secs: f64,
    pub log: PathBuf,
}

fn tail(lines: &[String], n: usize) -> String {
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn pump(reader: impl Read, tx: mpsc::Sender<String>) {
    let mut r = BufReader::new(reader);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match r.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let line = String::from_utf8_lossy(&buf);
                let line = line.trim_end_matches(['\n', '\r']).replace('\r', "");
                if tx.send(line).is_err() {
                    return;
                }
            }
        }
    }
}

/// Runs `cmd` (stdout and stderr merged line-wise) until it exits or `opts.timeout` passes.
pub fn run_console(mut cmd: Command, opts: &RunOptions) -> Result<Console, RunError> {
    let start = Instant::now();
    let program = cmd.get_program().to_string_lossy().into_owned();
    let mut log = std::fs::File::create(&opts.log).map_err(|source| RunError::Log {
        path: opts.log.clone(),
        source,
    })?;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| RunError::Spawn { program, source })?;
    let mut child = KillOnDrop(child);
    let (tx, rx) = mpsc::channel();
    let mut pumps = Vec::new();
    if let Some(out) = child.0.stdout.take() {
        let tx = tx.clone();
        pumps.push(std::thread::spawn(move || pump(out, tx)));
    }
    if let Some(err) = child.0.stderr.take() {
        let tx = tx.clone();
        pumps.push(std::thread::spawn(move || pump(err, tx)));
    }
    drop(tx);
    let deadline = start + opts.timeout;
    let mut lines = Vec::new();
    let mut done = false;
    loop {
        let now = Instant::now();
        if now >= deadline {
            drop(child);
            return Err(RunError::Timeout {
                what: opts.name.clone(),
                secs: opts.timeout.as_secs(),
                log: opts.log.clone(),
                tail: tail(&lines, 40),
            });
        }
        match rx.recv_timeout(deadline - now) {
            Ok(line) => {
                let stamped = format!(
                    "[{} {:7.2}] {line}",
                    opts.name,
                    start.elapsed().as_secs_f64()
                );
                if opts.echo {
                    eprintln!("{stamped}");
                }
                let _ = writeln!(log, "{stamped}");
                if line.contains(&opts.done_marker) {
                    done = true;
                }
                lines.push(line);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    // Both pipes closed: the process is exiting; give it a moment, then the guard kills it.
    let mut status = String::from("still running");
    let exit_deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < exit_deadline {
        if let Ok(Some(s)) = child.0.try_wait() {
            status = s.to_string();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(child);
    for p in pumps {
        let _ = p.join();
    }
    if !done {
        return Err(RunError::Incomplete {
            what: opts.name.clone(),
            status,
            log: opts.log.clone(),
            tail: tail(&lines, 40),
        });
    }
    Ok(Console {
        lines,
        wall_secs: start.elapsed().as_secs_f64(),
        log: opts.log.clone(),
    })
}

/// The QEMU-TCG command that boots the test host with emulated AMD SVM.
pub fn qemu_tcg_command(vmlinuz: &Path, initramfs: &Path, append: &str, mem: &str) -> Command {
    let mut c = Command::new("qemu-system-x86_64");
    c.args(["-accel", "tcg", "-cpu", "max", "-smp", "1", "-m", mem])
        .args([
            "-nographic",
            "-no-reboot",
            "-nodefaults",
            "-serial",
            "stdio",
        ])
        .args(["-monitor", "none", "-net", "none"])
        .arg("-kernel")
        .arg(vmlinuz)
        .arg("-initrd")
        .arg(initramfs)
        .arg("-append")
        .arg(append);
    c
}

/// `true` when this host's CPU has hardware virtualization (vmx or svm) and /dev/kvm exists,
/// so scenarios can run directly instead of inside the test host.
pub fn hardware_kvm() -> bool {
    let flags = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let hw = flags
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
    hw && Path::new("/dev/kvm").exists()
}
