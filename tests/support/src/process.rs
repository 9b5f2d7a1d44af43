//! Small process helpers: waiting with a timeout, signals, log tails, free ports.

use std::collections::HashSet;
use std::fs;
use std::io::{self, Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, TcpListener};
use std::path::Path;
use std::process::{Child, ExitStatus};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

/// Waits up to `timeout` for `child` to exit.
pub(crate) fn wait_timeout(child: &mut Child, timeout: Duration) -> io::Result<Option<ExitStatus>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait()? {
            return Ok(Some(st));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        thread::sleep(Duration::from_millis(25));
    }
}

/// Sends `sig` to `pid`; false if there is no such process (or it is not ours).
pub(crate) fn signal(pid: u32, sig: libc::c_int) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill(2) takes plain integers and touches no memory of ours; pid > 0 so it
    // addresses exactly one process, never a process group.
    unsafe { libc::kill(pid, sig) == 0 }
}

/// The scheduler state letters (`R`, `S`, `D`, `T`, ...) of every live thread of `pid`, from
/// `/proc/PID/task/*/stat`. Threads that exit while we read (`Z`, `X`, or gone) are left out.
fn thread_states(pid: u32) -> io::Result<Vec<char>> {
    let mut states = Vec::new();
    for entry in fs::read_dir(format!("/proc/{pid}/task"))? {
        let Ok(stat) = fs::read_to_string(entry?.path().join("stat")) else {
            continue; // the thread ended between read_dir and here
        };
        // "TID (comm) S ...": comm may hold spaces and parentheses, the state follows the last ')'.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next());
        match state {
            Some('Z' | 'X') | None => {}
            Some(c) => states.push(c),
        }
    }
    Ok(states)
}

/// Waits until `done` holds for the thread states of `pid` (checked at least once), at most
/// `limit`; the error names `what` and the last states seen.
fn wait_thread_states(
    pid: u32,
    what: &str,
    limit: Duration,
    done: impl Fn(&[char]) -> bool,
) -> io::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let states = thread_states(pid)?;
        if states.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("process {pid} ended before it {what}"),
            ));
        }
        if done(&states) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "process {pid} not {what} within {limit:?}; its threads' states: {states:?}"
                ),
            ));
        }
        thread::sleep(Duration::from_millis(2));
    }
}

/// How long [`stop_process`] and [`continue_process`] wait for the kernel to act on the signal.
/// Delivery is asynchronous: a thread busy in the kernel or waiting for a core on a loaded
/// machine stops only when it next returns to user mode, which takes milliseconds, or seconds
/// on a machine whose cores are all busy.
pub const SIGNAL_ACTED_ON_WITHIN: Duration = Duration::from_secs(30);

/// Sends SIGSTOP to `pid` and returns once **every** thread of it is stopped (`T` in
/// `/proc/PID/task/*/stat`): until then a thread can still accept a connection and answer it,
/// so "signal sent" is not "process frozen". Fails if `pid` is gone or some thread does not
/// stop within [`SIGNAL_ACTED_ON_WITHIN`].
pub fn stop_process(pid: u32) -> io::Result<()> {
    if !signal(pid, libc::SIGSTOP) {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("SIGSTOP to process {pid}: no such process"),
        ));
    }
    wait_thread_states(pid, "stopped after SIGSTOP", SIGNAL_ACTED_ON_WITHIN, |s| {
        s.iter().all(|&c| c == 'T')
    })
}

/// Sends SIGCONT to `pid` and returns once no thread of it is stopped any more, i.e. the kernel
/// has resumed it (it may still wait for a core). Fails if `pid` is gone or a thread stays
/// stopped for [`SIGNAL_ACTED_ON_WITHIN`].
pub fn continue_process(pid: u32) -> io::Result<()> {
    if !signal(pid, libc::SIGCONT) {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("SIGCONT to process {pid}: no such process"),
        ));
    }
    wait_thread_states(
        pid,
        "ran again after SIGCONT",
        SIGNAL_ACTED_ON_WITHIN,
        |s| s.iter().all(|&c| c != 'T'),
    )
}

/// Sends `sig` to `pid` and returns once the process has taken it: no longer pending for the
/// process (`ShdPnd` in `/proc/PID/status`) nor for any of its threads (`SigPnd`), i.e. a
/// thread dequeued it and ran its handler (or the default action; a process that ended counts as
/// having taken it). Two signals of one kind
/// sent back to back can merge into one while the first is still pending, so a test that
/// means "a second signal" must wait for this between them. Fails if `pid` is gone, or the
/// signal stays pending (blocked, or a stopped process) for [`SIGNAL_ACTED_ON_WITHIN`].
pub fn signal_taken(pid: u32, sig: libc::c_int) -> io::Result<()> {
    if !(1..=64).contains(&sig) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("no signal {sig}"),
        ));
    }
    if !signal(pid, sig) {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("signal {sig} to process {pid}: no such process"),
        ));
    }
    let bit = 1u64 << (sig - 1);
    let pending = |path: String, field: &str| -> bool {
        fs::read_to_string(path).is_ok_and(|st| {
            st.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                .is_some_and(|mask| mask & bit != 0)
        })
    };
    let deadline = Instant::now() + SIGNAL_ACTED_ON_WITHIN;
    loop {
        // A process that ended (its default action, or anything else) takes nothing more, and a
        // zombie keeps showing the signal that killed it as pending.
        if thread_states(pid).map_or(true, |s| s.is_empty()) {
            return Ok(());
        }
        let mut any = pending(format!("/proc/{pid}/status"), "ShdPnd:");
        for entry in fs::read_dir(format!("/proc/{pid}/task"))? {
            let task = entry?.path().join("status");
            any |= pending(task.display().to_string(), "SigPnd:");
        }
        if !any {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "signal {sig} still pending for process {pid} after {SIGNAL_ACTED_ON_WITHIN:?}"
                ),
            ));
        }
        thread::sleep(Duration::from_millis(2));
    }
}

/// Stops a child: SIGTERM, then SIGKILL after `grace`; always reaps it.
pub(crate) fn stop_child(child: &mut Child, grace: Duration) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    signal(child.id(), libc::SIGTERM);
    if let Ok(Some(_)) = wait_timeout(child, grace) {
        return;
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Whether `pid` is a live (not zombie) process whose command line mentions `needle`.
pub(crate) fn pid_runs(pid: u32, needle: &str) -> bool {
    let base = Path::new("/proc").join(pid.to_string());
    let Ok(cmdline) = fs::read(base.join("cmdline")) else {
        return false;
    };
    let zombie = fs::read_to_string(base.join("stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false);
    !zombie && String::from_utf8_lossy(&cmdline).contains(needle)
}

/// The last `lines` lines of a (log) file, reading at most its last 64 KiB.
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    let Ok(mut f) = fs::File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(64 * 1024);
    if f.seek(SeekFrom::Start(start)).is_err() {
        return String::new();
    }
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// A loopback TCP port that was free a moment ago and that this process has not handed out
/// before (so clusters started in parallel by one test binary never collide; a collision with
/// another process is caught as "address already in use" and retried by the caller).
pub(crate) fn free_port(ip: Ipv4Addr) -> io::Result<u16> {
    let mut seen = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let seen = seen.get_or_insert_with(HashSet::new);
    for _ in 0..64 {
        let l = TcpListener::bind((ip, 0))?;
        let port = l.local_addr()?.port();
        if seen.insert(port) {
            return Ok(port);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        "no fresh free port found",
    ))
}

/// 16 random bytes from the kernel, hex encoded.
pub(crate) fn random_hex() -> io::Result<String> {
    let mut b = [0u8; 16];
    fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn stop_child_terminates_and_reaps() {
        let mut c = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = c.id();
        // Right after fork the child may not have exec'd `sleep` yet.
        let t = Instant::now();
        while !pid_runs(pid, "sleep") && t.elapsed() < Duration::from_secs(10) {
            thread::sleep(Duration::from_millis(5));
        }
        assert!(pid_runs(pid, "sleep"));
        stop_child(&mut c, Duration::from_secs(5));
        assert!(!pid_runs(pid, "sleep"));
    }

    #[test]
    fn stop_and_continue_wait_for_every_thread() {
        // A child that is always runnable: a stop is seen only once the kernel has acted on it.
        let mut c = Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap();
        let pid = c.id();
        stop_process(pid).unwrap();
        assert!(thread_states(pid).unwrap().iter().all(|&s| s == 'T'));
        // Stopped means stopped: it stays so until SIGCONT.
        thread::sleep(Duration::from_millis(50));
        assert!(thread_states(pid).unwrap().iter().all(|&s| s == 'T'));
        continue_process(pid).unwrap();
        assert!(thread_states(pid).unwrap().iter().all(|&s| s != 'T'));
        stop_child(&mut c, Duration::from_secs(5));
        let err = stop_process(pid).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
    }

    #[test]
    fn a_taken_signal_is_no_longer_pending() {
        // A shell that catches SIGUSR1 and stays busy.
        let mut c = Command::new("sh")
            .args(["-c", "trap 'n=1' USR1; while :; do :; done"])
            .spawn()
            .unwrap();
        let pid = c.id();
        // Caught means the trap is installed (SigCgt), not merely that `sh` was exec'd: a
        // SIGUSR1 before the trap would end the shell by its default action.
        let bit = 1u64 << (libc::SIGUSR1 - 1);
        let caught = || {
            fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|st| {
                st.lines()
                    .find_map(|l| l.strip_prefix("SigCgt:"))
                    .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                    .is_some_and(|m| m & bit != 0)
            })
        };
        let t = Instant::now();
        while !caught() {
            assert!(
                t.elapsed() < SIGNAL_ACTED_ON_WITHIN,
                "the trap was never installed"
            );
            thread::sleep(Duration::from_millis(2));
        }
        signal_taken(pid, libc::SIGUSR1).unwrap();
        assert!(pid_runs(pid, "trap"), "the caught signal ended the shell");
        // A stopped process takes nothing: the signal stays pending until SIGCONT.
        stop_process(pid).unwrap();
        assert!(signal(pid, libc::SIGUSR1));
        let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let shd = status
            .lines()
            .find_map(|l| l.strip_prefix("ShdPnd:"))
            .unwrap();
        assert_ne!(
            u64::from_str_radix(shd.trim(), 16).unwrap() & bit,
            0,
            "{shd}"
        );
        continue_process(pid).unwrap();
        signal_taken(pid, libc::SIGUSR1).unwrap();
        // SIGTERM is not caught: the shell ends, and that counts as taken.
        signal_taken(pid, libc::SIGTERM).unwrap();
        let st = c.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&st),
            Some(libc::SIGTERM)
        );
        // Reaped: there is no such process any more.
        assert!(signal_taken(pid, libc::SIGUSR1).is_err());
        assert!(signal_taken(pid, 0).is_err());
    }

    #[test]
    fn free_ports_are_distinct() {
        let a = free_port(Ipv4Addr::LOCALHOST).unwrap();
        let b = free_port(Ipv4Addr::LOCALHOST).unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn log_tail_keeps_last_lines() {
        let p = std::env::temp_dir().join(format!("mvts-tail-{}", std::process::id()));
        fs::write(&p, "1\n2\n3\n4\n").unwrap();
        assert_eq!(log_tail(&p, 2), "3\n4");
        let _ = fs::remove_file(&p);
        assert!(log_tail(&p, 2).starts_with("(no log"));
    }

    #[test]
    fn random_hex_is_random() {
        let a = random_hex().unwrap();
        assert_eq!(a.len(), 32);
        assert_ne!(a, random_hex().unwrap());
    }
}
