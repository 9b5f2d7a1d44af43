//! Booting the test host under `qemu-system-x86_64 -accel tcg -cpu max` (or any command producing a
//! console on stdout): streams the output line by line with a prefix, keeps a log file, enforces a
//! timeout and always kills the process (also when the caller panics).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
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
    #[error("{what} timed out after {secs} s, the last {silent_secs} s without a console line (log: {log}); console tail:\n{tail}")]
    Timeout {
        what: String,
        secs: u64,
        /// Seconds from the last console line to the timeout.
        silent_secs: u64,
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
    /// The QEMU human-monitor socket the command listens on ([`qemu_tcg_command`]): when the
    /// run times out, what the emulated CPU was doing goes into the error and the log.
    pub monitor: Option<PathBuf>,
    /// Ends the run as timed out once no console line came for this long (a console that
    /// prints a heartbeat, such as the test host's, is silent this long only when it froze).
    pub silence: Option<Duration>,
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
    let mut last_line = start;
    loop {
        let now = Instant::now();
        let deadline = match opts.silence {
            Some(quiet) => deadline.min(last_line + quiet),
            None => deadline,
        };
        if now >= deadline {
            let mut tail = tail(&lines, 40);
            if let Some(sock) = &opts.monitor {
                let dump = monitor_dump(sock);
                let _ = writeln!(log, "--- QEMU monitor at the timeout ---\n{}", dump.full);
                tail.push_str("\n--- QEMU monitor at the timeout ---\n");
                tail.push_str(&dump.summary);
            }
            drop(child);
            return Err(RunError::Timeout {
                what: opts.name.clone(),
                secs: now.duration_since(start).as_secs(),
                silent_secs: now.duration_since(last_line).as_secs(),
                log: opts.log.clone(),
                tail,
            });
        }
        match rx.recv_timeout(deadline - now) {
            Ok(line) => {
                last_line = Instant::now();
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

/// What QEMU's monitor said about a run that timed out.
#[derive(Debug, Clone, Default)]
pub struct MonitorDump {
    /// One line per register sample (RIP, EFER, HLT, CR3) and where the CPU was.
    pub summary: String,
    /// Every command's full answer.
    pub full: String,
}

/// The number of register samples [`monitor_dump`] takes, 2 s apart.
const MONITOR_SAMPLES: usize = 3;

/// Asks QEMU's human monitor on `sock` for the CPU's registers ([`MONITOR_SAMPLES`] times, 2 s
/// apart: a stuck CPU shows the same RIP), its local APIC and the PIC. Each sample says whether
/// RIP lies in the test host's kernel text: the test host boots with `nokaslr`
/// ([`TEST_HOST_APPEND`]), so its text starts at [`HOST_TEXT`]; a nested guest's kernel is
/// randomized elsewhere (almost always) and its user space is low.
pub fn monitor_dump(sock: &Path) -> MonitorDump {
    match query_monitor(sock) {
        Ok(d) => d,
        Err(e) => MonitorDump {
            summary: format!("the monitor at {} did not answer: {e}", sock.display()),
            full: String::new(),
        },
    }
}

fn query_monitor(sock: &Path) -> std::io::Result<MonitorDump> {
    let mut s = UnixStream::connect(sock)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut pending = Vec::new();
    let mut answer = |s: &mut UnixStream| -> std::io::Result<String> {
        const PROMPT: &[u8] = b"(qemu) ";
        let mut buf = [0u8; 8192];
        loop {
            if let Some(i) = pending.windows(PROMPT.len()).position(|w| w == PROMPT) {
                let text = String::from_utf8_lossy(&pending[..i]).replace('\r', "");
                pending.drain(..i + PROMPT.len());
                return Ok(text);
            }
            let n = s.read(&mut buf)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            pending.extend_from_slice(&buf[..n]);
        }
    };
    answer(&mut s)?; // the banner
    let mut d = MonitorDump::default();
    for k in 1..=MONITOR_SAMPLES {
        s.write_all(b"info registers -a\n")?;
        let regs = answer(&mut s)?;
        for (cpu, one) in per_cpu(&regs) {
            d.summary.push_str(&format!(
                "sample {k} CPU#{cpu}: {}\n",
                register_summary(one)
            ));
        }
        d.full
            .push_str(&format!("--- info registers -a (sample {k})\n{regs}\n"));
        if k < MONITOR_SAMPLES {
            std::thread::sleep(Duration::from_secs(2));
        }
    }
    let mut cmds: Vec<String> = (0..TEST_HOST_CPUS)
        .map(|c| format!("info lapic {c}"))
        .collect();
    cmds.push("info pic".into());
    for cmd in cmds {
        s.write_all(format!("{cmd}\n").as_bytes())?;
        let a = answer(&mut s)?;
        d.full.push_str(&format!("--- {cmd}\n{a}\n"));
    }
    Ok(d)
}

/// `info registers -a` split at its "CPU#N" headers (one piece with CPU 0 when there are none).
fn per_cpu(regs: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut rest = regs;
    while let Some(i) = rest.find("CPU#") {
        let after = &rest[i + 4..];
        let digits = after
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(after.len());
        let cpu = after[..digits].parse().unwrap_or(out.len());
        let body = &after[digits..];
        let end = body.find("CPU#").unwrap_or(body.len());
        out.push((cpu, &body[..end]));
        rest = &body[end..];
    }
    if out.is_empty() {
        out.push((0, regs));
    }
    out
}

/// The test host's vCPUs. Two, under multi-threaded TCG: while one emulated CPU runs a nested
/// guest, the other keeps the test host's own tasks (and the guest's other vCPU thread) running,
/// so a nested guest that spins waiting for its second vCPU cannot starve the test host whole
/// (docs/testing.md, "the test host's first-boot hang").
pub const TEST_HOST_CPUS: usize = 2;

/// The test host's kernel command line: `nokaslr` keeps its text at [`HOST_TEXT`], so a RIP in a
/// monitor dump can be told from a nested guest's and symbolized with the package's System.map.
/// `idle=poll`: an idle test-host CPU spins instead of halting. Under QEMU 7.2's TCG with nested
/// guests, a halted test-host CPU was seen not to wake up again although interrupts were pending
/// for it (monitor: `HLT=1`, IF set, the timer and IPI vectors in IRR above the PPR): the nested
/// guest whose thread waited on that CPU hung, and the VMM could not kick it. A polling idle loop
/// notices new work without an interrupt (docs/testing.md, "Nested paging in the test host").
pub const TEST_HOST_APPEND: &str = "console=ttyS0 panic=-1 quiet nokaslr idle=poll";

/// Where an x86-64 kernel's text starts without KASLR, and how far the test host's reaches.
pub const HOST_TEXT: std::ops::Range<u64> = 0xffff_ffff_8100_0000..0xffff_ffff_8400_0000;

/// "RIP=… CR3=… HLT=… — where" from `info registers`.
fn register_summary(regs: &str) -> String {
    let field = |name: &str| -> Option<&str> {
        regs.split_whitespace()
            .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
    };
    let rip = field("RIP").and_then(|v| u64::from_str_radix(v, 16).ok());
    let place = match rip {
        Some(r) if HOST_TEXT.contains(&r) => "in the test host's kernel text (nokaslr)",
        Some(r) if r >= 0xffff_8000_0000_0000 => {
            "a kernel address outside the test host's text: the nested guest's kernel"
        }
        Some(_) => "a user-space address",
        None => "no RIP in the answer",
    };
    format!(
        "RIP={} CR3={} HLT={} — {place}",
        field("RIP").unwrap_or("?"),
        field("CR3").unwrap_or("?"),
        field("HLT").unwrap_or("?"),
    )
}

/// The QEMU-TCG command that boots the test host with emulated AMD SVM, its human monitor on
/// the Unix socket `monitor` (pass the same path as [`RunOptions::monitor`]).
pub fn qemu_tcg_command(
    vmlinuz: &Path,
    initramfs: &Path,
    append: &str,
    mem: &str,
    monitor: &Path,
) -> Command {
    let mut c = Command::new("qemu-system-x86_64");
    c.args(["-accel", "tcg,thread=multi", "-cpu", "max", "-m", mem])
        .arg("-smp")
        .arg(TEST_HOST_CPUS.to_string())
        .args([
            "-nographic",
            "-no-reboot",
            "-nodefaults",
            "-serial",
            "stdio",
        ])
        .arg("-monitor")
        .arg(format!("unix:{},server=on,wait=off", monitor.display()))
        .args(["-net", "none"])
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Two lines of QEMU 7.2's `info registers` (x86-64), trimmed.
    const HOST: &str = "RAX=0000000000000000 RBX=ffffffff82613940\n\
        RIP=ffffffff81c7b7ab RFL=00000246 [---Z-P-] CPL=0 II=0 A20=1 SMM=0 HLT=1\n\
        CR0=80050033 CR2=00007f4c2a1f0000 CR3=000000010a2f4000 CR4=00350ef0\n\
        EFER=0000000000001d01\n";

    #[test]
    fn a_register_sample_says_where_the_cpu_ran() {
        assert_eq!(
            register_summary(HOST),
            "RIP=ffffffff81c7b7ab CR3=000000010a2f4000 HLT=1 \
             — in the test host's kernel text (nokaslr)"
        );
        let nested = HOST.replace("RIP=ffffffff81c7b7ab", "RIP=ffffffff9a473744");
        assert!(register_summary(&nested).ends_with("the nested guest's kernel"));
        let user = HOST.replace("RIP=ffffffff81c7b7ab", "RIP=00007f4c2a1f0123");
        assert!(register_summary(&user).ends_with("a user-space address"));
        assert!(register_summary("garbage").contains("RIP=? CR3=? HLT=? — no RIP"));
    }

    #[test]
    fn all_cpus_registers_are_split_per_cpu() {
        let two = format!("\nCPU#0\n{HOST}\nCPU#1\n{}", HOST.replace("HLT=1", "HLT=0"));
        let cpus = per_cpu(&two);
        assert_eq!(cpus.iter().map(|c| c.0).collect::<Vec<_>>(), vec![0, 1]);
        assert!(register_summary(cpus[0].1).contains("HLT=1"));
        assert!(register_summary(cpus[1].1).contains("HLT=0"));
        assert_eq!(per_cpu(HOST), vec![(0, HOST)]);
    }
}
