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
