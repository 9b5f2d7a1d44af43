//! Shared by the snapshot tests: a `microvm` process read line by line, temp directories,
//! control requests, the counter guest's output, file fingerprints.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs::File;
use std::hash::Hasher;
use std::io::Write;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use microvirt_testsupport::TempDir;
use serde_json::{json, Value};

pub const MICROVM: &str = env!("CARGO_BIN_EXE_microvm");
pub const WAIT: Duration = Duration::from_secs(60);
/// How long the output of a process that exited may take to reach its end (its readers are
/// threads that a busy machine may not run for a while).
const OUTPUT_END_WITHIN: Duration = Duration::from_secs(30);

/// A `microvm` process whose console is read line by line; killed when dropped.
pub struct Proc {
    pub child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    pub seen: Vec<String>,
    pub stderr: Arc<Mutex<String>>,
    /// Disconnects when the stderr reader has read to the end (the process and its pipe closed).
    stderr_done: Receiver<()>,
}

impl Proc {
    pub fn spawn(cmd: Command) -> Proc {
        Self::spawn_with(cmd, false)
    }

    /// Like [`Proc::spawn`], with the console's input writable through [`Proc::send`].
    pub fn spawn_with_input(cmd: Command) -> Proc {
        Self::spawn_with(cmd, true)
    }

    fn spawn_with(mut cmd: Command, input: bool) -> Proc {
        let mut child = cmd
            .stdin(if input { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn microvm");
        let out = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(l) = line else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut err = child.stderr.take().unwrap();
        let e = stderr.clone();
        let (stderr_end, stderr_done) = channel::<()>();
        std::thread::spawn(move || {
            // Dropped when this thread ends: `stderr_done` then disconnects.
            let _end = stderr_end;
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                e.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Proc {
            stdin: child.stdin.take(),
            child,
            lines: rx,
            seen: Vec::new(),
            stderr,
            stderr_done,
        }
    }

    pub fn microvm(args: &[&str]) -> Proc {
        let mut c = Command::new(MICROVM);
        c.args(args);
        Proc::spawn(c)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Types `text` on the guest's console.
    pub fn send(&mut self, text: &str) {
        let i = self.stdin.as_mut().expect("spawned with input");
        i.write_all(text.as_bytes()).unwrap();
        i.flush().unwrap();
    }

    pub fn context(&self) -> String {
        format!(
            "console:\n{}\nstderr:\n{}",
            self.seen.join("\n"),
            self.stderr.lock().unwrap()
        )
    }

    /// Waits for a console line matching `pred`; returns it.
    pub fn wait_line(&mut self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + WAIT;
        if let Some(l) = self.seen.iter().find(|l| pred(l)) {
            return l.clone();
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if pred(&l) {
                        return l;
                    }
                }
                Err(_) => panic!("never saw {what}; {}", self.context()),
            }
        }
    }

    /// Lines that arrived so far.
    pub fn drain(&mut self) -> &[String] {
        while let Ok(l) = self.lines.try_recv() {
            self.seen.push(l);
        }
        &self.seen
    }

    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                // The process is gone and its pipes are closed: collect the rest of the console
                // and of stderr until both readers reached the end (not until a pause in the
                // output, which a busy machine can make long), within OUTPUT_END_WITHIN.
                let end = Instant::now() + OUTPUT_END_WITHIN;
                loop {
                    let left = end.saturating_duration_since(Instant::now());
                    match self.lines.recv_timeout(left) {
                        Ok(l) => self.seen.push(l),
                        Err(RecvTimeoutError::Disconnected) => break,
                        Err(RecvTimeoutError::Timeout) => {
                            panic!("the console did not end after the exit; {}", self.context())
                        }
                    }
                }
                let left = end.saturating_duration_since(Instant::now());
                if let Err(RecvTimeoutError::Timeout) = self.stderr_done.recv_timeout(left) {
                    panic!("stderr did not end after the exit; {}", self.context());
                }
                return s;
            }
            if Instant::now() > deadline {
                panic!("microvm did not exit; {}", self.context());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn control(sock: &Path, req: Value) -> Value {
    vmm::control::request(sock, &req).unwrap_or_else(|e| panic!("control {req}: {e}"))
}

/// Waits until the control socket accepts connections (the file appears at bind, a moment
/// before the listen).
pub fn wait_socket(sock: &Path) {
    let t = Instant::now();
    while std::os::unix::net::UnixStream::connect(sock).is_err() {
        assert!(
            t.elapsed() < WAIT,
            "control socket {} never accepted",
            sock.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub fn snapshot(sock: &Path, dir: &Path) -> Value {
    let a = control(
        sock,
        json!({"cmd": "snapshot", "dir": dir.display().to_string()}),
    );
    assert_eq!(a["ok"], true, "snapshot failed: {a}");
    assert_eq!(a["state"], "paused");
    a
}

/// `counter: seq=<n> cpu0=<c> ...` → (n, [c0, c1, ...], mem sum).
pub fn parse_counter(l: &str) -> Option<(u64, Vec<u64>, Option<u64>)> {
    let rest = l.strip_prefix("counter: seq=")?;
    let mut it = rest.split_whitespace();
    let seq = it.next()?.parse().ok()?;
    let mut cpus = Vec::new();
    let mut mem = None;
    for f in it {
        if let Some(v) = f.strip_prefix("mem=") {
            mem = Some(u64::from_str_radix(v, 16).ok()?);
        } else {
            let (k, v) = f.split_once('=')?;
            if !k.starts_with("cpu") {
                return None;
            }
            cpus.push(v.parse().ok()?);
        }
    }
    Some((seq, cpus, mem))
}

/// Complete counter lines with `cpus` counters.
pub fn counters(lines: &[String], cpus: usize) -> Vec<(u64, Vec<u64>, Option<u64>)> {
    lines
        .iter()
        .filter_map(|l| parse_counter(l))
        .filter(|c| c.1.len() == cpus)
        .collect()
}

pub fn counters_addr(p: &mut Proc) -> u64 {
    let l = p.wait_line("the counters' address", |l| l.starts_with("counter: addr="));
    let v = l
        .strip_prefix("counter: addr=0x")
        .and_then(|r| r.split_whitespace().next())
        .unwrap();
    u64::from_str_radix(v, 16).unwrap()
}

/// The counters as saved in the memory file (guest RAM at 0 is file offset 0).
pub fn saved_counters(mem: &Path, addr: u64, cpus: usize) -> Vec<u64> {
    let f = File::open(mem).unwrap();
    (0..cpus)
        .map(|i| {
            let mut b = [0u8; 8];
            f.read_exact_at(&mut b, addr + 8 * i as u64).unwrap();
            u64::from_le_bytes(b)
        })
        .collect()
}

/// Hash, length and modification time of every file in `dir`.
pub fn fingerprint(dir: &Path) -> BTreeMap<String, (u64, u64, std::time::SystemTime)> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        if !e.file_type().unwrap().is_file() {
            continue;
        }
        let mut f = File::open(e.path()).unwrap();
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            h.write(&buf[..n]);
        }
        let m = e.metadata().unwrap();
        out.insert(
            e.file_name().to_string_lossy().into_owned(),
            (h.finish(), m.len(), m.modified().unwrap()),
        );
    }
    out
}

/// An ext4 file system image at `dir/name` (32 MiB) holding zero-filled files `files` (name,
/// length).
pub fn ext4_image(t: &TempDir, name: &str, files: &[(&str, u64)]) -> PathBuf {
    let src = t.join(format!("{name}.d"));
    std::fs::create_dir_all(&src).unwrap();
    for (f, len) in files {
        File::create(src.join(f)).unwrap().set_len(*len).unwrap();
    }
    let img = t.join(name);
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-d"])
        .arg(&src)
        .arg(&img)
        .arg("32M")
        .output()
        .expect("run mkfs.ext4 (Debian package e2fsprogs)");
    assert!(
        out.status.success(),
        "mkfs.ext4: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    img
}

/// `microvm ARGS` in a private mount namespace (gone with the process) in which `image` is
/// loop-mounted at `mnt`; with console input when `input`.
pub fn microvm_with_mount(image: &Path, mnt: &Path, args: &[&str], input: bool) -> Proc {
    std::fs::create_dir_all(mnt).unwrap();
    let mut c = Command::new("unshare");
    c.args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount -o loop "$0" "$1" && shift && exec "$@""#)
        .arg(image)
        .arg(mnt)
        .arg(MICROVM)
        .args(args);
    if input {
        Proc::spawn_with_input(c)
    } else {
        Proc::spawn(c)
    }
}

const FIFREEZE: libc::c_ulong = 0xc004_5877;
const FITHAW: libc::c_ulong = 0xc004_5878;

/// A frozen file system (FIFREEZE: writes to it block until it is thawed), thawed when
/// dropped. Holds the file system's root directory open, so it stays reachable (and is thawed)
/// even once the namespace it was mounted in is gone.
pub struct Frozen {
    root: File,
    frozen: bool,
}

impl Frozen {
    /// Freezes the file system mounted at `mnt` in process `pid`'s mount namespace.
    pub fn freeze(pid: u32, mnt: &Path) -> Frozen {
        let p = PathBuf::from(format!("/proc/{pid}/root{}", mnt.display()));
        let root = File::open(&p).unwrap_or_else(|e| panic!("open {}: {e}", p.display()));
        // SAFETY: FIFREEZE on an owned directory fd; the argument is ignored.
        let r = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&root), FIFREEZE, 0) };
        assert_eq!(
            r,
            0,
            "FIFREEZE {}: {}",
            p.display(),
            std::io::Error::last_os_error()
        );
        Frozen { root, frozen: true }
    }

    pub fn thaw(&mut self) {
        if std::mem::take(&mut self.frozen) {
            // SAFETY: FITHAW on an owned directory fd; the argument is ignored.
            let r = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&self.root), FITHAW, 0) };
            assert_eq!(r, 0, "FITHAW: {}", std::io::Error::last_os_error());
        }
    }

    /// A file of the file system, reachable through the held root.
    pub fn path(&self, name: &str) -> PathBuf {
        PathBuf::from(format!(
            "/proc/self/fd/{}/{name}",
            std::os::fd::AsRawFd::as_raw_fd(&self.root)
        ))
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if std::mem::take(&mut self.frozen) {
            // SAFETY: as in `thaw`.
            unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&self.root), FITHAW, 0) };
        }
    }
}

/// Waits until process `pid`'s thread named `name` is in state `state` (`/proc/.../stat`),
/// e.g. `D`: blocked in the kernel (a write to a frozen file system).
pub fn wait_thread_state(pid: u32, name: &str, state: char) {
    let t = Instant::now();
    loop {
        for task in std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .flatten()
        {
            let dir = task.path();
            let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            if comm.trim() != name {
                continue;
            }
            let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
            // "tid (comm) S ...": the state follows the last ')'.
            let st = stat
                .rsplit_once(')')
                .and_then(|(_, r)| r.trim_start().chars().next());
            if st == Some(state) {
                return;
            }
        }
        assert!(
            t.elapsed() < WAIT,
            "thread {name} of {pid} never reached state {state}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}
