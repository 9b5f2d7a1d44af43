//! Shared helpers for the VMM's KVM integration tests: build the test guest once,
//! run `microvm` with a timeout, collect its console and log.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

// Not every test binary that includes this module makes scratch directories.
#[allow(unused_imports)]
pub use microvirt_testsupport::TempDir;

pub fn guest() -> &'static testguest_build::Artifacts {
    static G: OnceLock<testguest_build::Artifacts> = OnceLock::new();
    G.get_or_init(|| testguest_build::build().expect("build the test guest"))
}

pub struct Run {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn assert_ok(&self) -> &Self {
        assert!(
            self.status.success(),
            "microvm failed: {}\nstdout:\n{}\nstderr:\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
        self
    }
    /// The value after `prefix` on the first console line starting with it.
    pub fn line(&self, prefix: &str) -> String {
        self.stdout
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| {
                panic!(
                    "no line starting {prefix:?} in:\n{}\nstderr:\n{}",
                    self.stdout, self.stderr
                )
            })
            .trim()
            .to_string()
    }
}

pub fn spawn(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_microvm"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn microvm")
}

/// Waits for `child` up to `timeout`, killing it past that; returns its output.
pub fn finish(mut child: Child, timeout: Duration) -> Run {
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let o = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let e = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let st = child.wait().unwrap();
            let (so, se) = (o.join().unwrap(), e.join().unwrap());
            panic!("microvm timed out after {timeout:?} ({st})\nstdout:\n{so}\nstderr:\n{se}");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Run {
        status,
        stdout: o.join().unwrap(),
        stderr: e.join().unwrap(),
    }
}

/// A running `microvm` whose console is read line by line.
pub struct Live {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
    seen: String,
}

impl Live {
    pub fn start(args: &[&str]) -> Live {
        let mut child = spawn(args);
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(out).lines() {
                let Ok(l) = line else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Live {
            child,
            lines: rx,
            seen: String::new(),
        }
    }

    /// Waits until the guest printed a line containing `text`.
    pub fn wait_for(&mut self, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.seen.contains(text) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push_str(&l);
                    self.seen.push('\n');
                }
                Err(_) => {
                    let _ = self.child.kill();
                    panic!(
                        "guest never printed {text:?}; console so far:\n{}",
                        self.seen
                    );
                }
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Writes `bytes` to the VM's console input and keeps it open.
    pub fn write(&mut self, bytes: &[u8]) {
        let input = self.child.stdin.as_mut().expect("stdin is piped");
        input.write_all(bytes).expect("writing to microvm's stdin");
        input.flush().expect("flushing microvm's stdin");
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: sending a signal to our own child process.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// Waits for exit (killing it after `timeout`); stdout holds the whole console.
    pub fn finish(mut self, timeout: Duration) -> Run {
        let mut err = self.child.stderr.take().unwrap();
        let e = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let st = self.child.wait().unwrap();
                panic!(
                    "microvm timed out ({st})\nstdout:\n{}\nstderr:\n{}",
                    self.seen,
                    e.join().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(2)) {
            self.seen.push_str(&l);
            self.seen.push('\n');
        }
        Run {
            status,
            stdout: self.seen,
            stderr: e.join().unwrap(),
        }
    }
}

pub fn run(args: &[&str], stdin: &[u8]) -> Run {
    let mut child = spawn(args);
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin).unwrap();
    drop(input);
    finish(child, Duration::from_secs(20))
}

/// Waits until the serial output collected in `buf` (an embedded VMM's `SerialOut::Buffer`)
/// contains `text`.
pub fn wait_for(buf: &std::sync::Arc<std::sync::Mutex<Vec<u8>>>, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !String::from_utf8_lossy(&buf.lock().unwrap()).contains(text) {
        assert!(Instant::now() < deadline, "guest never printed {text:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}
