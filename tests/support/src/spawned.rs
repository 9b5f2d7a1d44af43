//! A child process for one test, its output collected as it arrives.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long [`Spawned::wait`] gives the reader threads, once the child exited, to reach the
/// end of its output (a grandchild that inherited the pipes may keep them open longer).
const DRAIN_WITHIN: Duration = Duration::from_secs(5);

const POLL: Duration = Duration::from_millis(10);

/// One output stream of the child, read line by line on a thread of its own.
struct Collected {
    text: Arc<Mutex<String>>,
    reader: Option<JoinHandle<()>>,
}

impl Collected {
    fn start(r: impl Read + Send + 'static) -> Collected {
        let text = Arc::new(Mutex::new(String::new()));
        let t = text.clone();
        let reader = std::thread::spawn(move || {
            let mut r = BufReader::new(r);
            let mut line = Vec::new();
            while r.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
                t.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push_str(&String::from_utf8_lossy(&line));
                line.clear();
            }
        });
        Collected {
            text,
            reader: Some(reader),
        }
    }

    fn text(&self) -> String {
        self.text.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether the stream reached its end (the reader thread finished).
    fn ended(&mut self) -> bool {
        match &self.reader {
            Some(h) if h.is_finished() => {
                let _ = self.reader.take().map(JoinHandle::join);
                true
            }
            Some(_) => false,
            None => true,
        }
    }
}

#[derive(Clone, Copy)]
enum Stream {
    Out,
    Err,
}

/// A spawned child whose standard output and error are collected as they arrive; killed and
/// reaped when dropped if it still runs, so nothing a test started outlives it.
///
/// Every wait is bounded and its failure names the command, what was waited for and for how
/// long, and the output so far.
pub struct Spawned {
    child: Child,
    what: String,
    out: Collected,
    err: Collected,
    status: Option<ExitStatus>,
}

impl Spawned {
    /// Spawns `cmd` with standard input from `/dev/null` and its output collected; panics if it
    /// cannot be started.
    pub fn spawn(cmd: &mut Command) -> Spawned {
        Self::start(cmd.stdin(Stdio::null()))
    }

    /// Like [`spawn`](Self::spawn), with standard input a pipe: [`stdin`](Self::stdin).
    pub fn spawn_with_stdin(cmd: &mut Command) -> Spawned {
        Self::start(cmd.stdin(Stdio::piped()))
    }

    fn start(cmd: &mut Command) -> Spawned {
        let what = format!("{cmd:?}");
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {what}: {e}"));
        let out = Collected::start(child.stdout.take().expect("stdout is piped"));
        let err = Collected::start(child.stderr.take().expect("stderr is piped"));
        Spawned {
            child,
            what,
            out,
            err,
            status: None,
        }
    }

    /// The child's pid.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The pipe to the child's standard input (from [`spawn_with_stdin`](Self::spawn_with_stdin));
    /// `None` once taken or closed.
    pub fn stdin(&mut self) -> &mut Option<ChildStdin> {
        &mut self.child.stdin
    }

    /// Everything the child wrote to standard output so far.
    pub fn stdout(&self) -> String {
        self.out.text()
    }

    /// Everything the child wrote to standard error so far.
    pub fn stderr(&self) -> String {
        self.err.text()
    }

    /// Both, for failure messages: `stdout:\n…\nstderr:\n…`.
    pub fn output(&self) -> String {
        format!("stdout:\n{}\nstderr:\n{}", self.stdout(), self.stderr())
    }

    /// Sends `sig`; panics if it cannot (the child was reaped already).
    pub fn signal(&self, sig: libc::c_int) {
        assert!(
            self.status.is_none(),
            "signal {sig} to {}: it exited already",
            self.what
        );
        let pid = libc::pid_t::try_from(self.child.id()).expect("a pid fits pid_t");
        // SAFETY: kill(2) takes plain integers; `pid` is our own child, not reaped yet (no
        // status taken), so the number still names it.
        let r = unsafe { libc::kill(pid, sig) };
        assert_eq!(
            r,
            0,
            "signal {sig} to {}: {}",
            self.what,
            std::io::Error::last_os_error()
        );
    }

    /// The exit status if the child has exited (reaping it), without waiting.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self
                .child
                .try_wait()
                .unwrap_or_else(|e| panic!("waiting for {}: {e}", self.what));
        }
        self.status
    }

    /// Waits up to `timeout` until the child's standard output contains `needle`; panics when
    /// the time is up or when the child exited (and its output ended) without writing it.
    pub fn wait_for_stdout(&mut self, needle: &str, timeout: Duration) {
        self.wait_for_text(Stream::Out, needle, timeout)
    }

    /// [`wait_for_stdout`](Self::wait_for_stdout) for standard error (where the programs of
    /// this project log).
    pub fn wait_for_stderr(&mut self, needle: &str, timeout: Duration) {
        self.wait_for_text(Stream::Err, needle, timeout)
    }

    fn wait_for_text(&mut self, which: Stream, needle: &str, timeout: Duration) {
        let name = match which {
            Stream::Out => "stdout",
            Stream::Err => "stderr",
        };
        let text = |s: &Spawned| match which {
            Stream::Out => s.stdout(),
            Stream::Err => s.stderr(),
        };
        let end = Instant::now() + timeout;
        loop {
            if text(self).contains(needle) {
                return;
            }
            if let Some(st) = self.try_wait() {
                let ended = match which {
                    Stream::Out => self.out.ended(),
                    Stream::Err => self.err.ended(),
                };
                if ended && !text(self).contains(needle) {
                    panic!(
                        "{} exited ({st}) without writing {needle:?} to {name}; {}",
                        self.what,
                        self.output()
                    );
                }
            }
            assert!(
                Instant::now() < end,
                "no {needle:?} on the {name} of {} within {timeout:?}; {}",
                self.what,
                self.output()
            );
            std::thread::sleep(POLL);
        }
    }

    /// Waits up to `timeout` for the child to exit, then (up to a few seconds more) for the end
    /// of its output, so [`stdout`](Self::stdout) and [`stderr`](Self::stderr) are complete.
    /// Returns the status and the time the exit took. After `timeout` the child is killed and
    /// the call panics, naming the command and its output.
    pub fn wait(&mut self, timeout: Duration) -> (ExitStatus, Duration) {
        let t0 = Instant::now();
        let st = loop {
            if let Some(st) = self.try_wait() {
                break st;
            }
            if t0.elapsed() > timeout {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "{} still running after {timeout:?} (killed); {}",
                    self.what,
                    self.output()
                );
            }
            std::thread::sleep(POLL);
        };
        let took = t0.elapsed();
        let drained = Instant::now() + DRAIN_WITHIN;
        while !(self.out.ended() & self.err.ended()) && Instant::now() < drained {
            std::thread::sleep(POLL);
        }
        (st, took)
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if self.status.is_none() {
            if let Ok(None) = self.child.try_wait() {
                let _ = self.child.kill();
            }
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    }

    #[test]
    fn output_is_collected_and_complete_after_the_wait() {
        let mut s = Spawned::spawn(&mut sh(
            "echo one; echo err >&2; sleep 0.2; printf 'two\\nno newline'; exit 3",
        ));
        s.wait_for_stdout("one", Duration::from_secs(10));
        let (st, took) = s.wait(Duration::from_secs(10));
        assert_eq!(st.code(), Some(3));
        assert!(took >= Duration::from_millis(150), "{took:?}");
        assert_eq!(s.stdout(), "one\ntwo\nno newline");
        assert_eq!(s.stderr(), "err\n");
        assert_eq!(s.output(), "stdout:\none\ntwo\nno newline\nstderr:\nerr\n");
        assert_eq!(s.try_wait().and_then(|s| s.code()), Some(3));
    }

    #[test]
    fn waiting_for_a_line_on_stderr() {
        let mut s = Spawned::spawn(&mut sh("sleep 0.1; echo 'log: ready' >&2; exec sleep 30"));
        s.wait_for_stderr("log: ready", Duration::from_secs(10));
        assert_eq!(s.stdout(), "");
        let msg = panic_text(|| s.wait_for_stderr("never", Duration::from_millis(200)));
        assert!(msg.contains("no \"never\" on the stderr of"), "{msg}");
        assert!(msg.contains("log: ready"), "{msg}");
    }

    #[test]
    fn stdin_is_a_pipe_when_asked_for_and_empty_otherwise() {
        let mut s = Spawned::spawn_with_stdin(&mut sh("read l; echo got $l"));
        s.stdin().take().unwrap().write_all(b"hello\n").unwrap();
        s.wait_for_stdout("got hello", Duration::from_secs(10));
        assert!(s.wait(Duration::from_secs(10)).0.success());

        let mut s = Spawned::spawn(&mut sh("cat; echo eof"));
        assert!(s.stdin().is_none());
        s.wait_for_stdout("eof", Duration::from_secs(10));
        assert_eq!(s.wait(Duration::from_secs(10)).0.code(), Some(0));
    }

    #[test]
    fn a_signal_reaches_the_child() {
        let mut s = Spawned::spawn(&mut sh(
            "trap 'echo term; exit 7' TERM; echo ready; while :; do sleep 0.05; done",
        ));
        s.wait_for_stdout("ready", Duration::from_secs(10));
        s.signal(libc::SIGTERM);
        let (st, _) = s.wait(Duration::from_secs(10));
        assert_eq!(st.code(), Some(7));
        assert!(s.stdout().contains("term"), "{}", s.output());
    }

    fn panic_text(f: impl FnOnce()) -> String {
        let e = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).expect_err("no panic");
        e.downcast_ref::<String>().cloned().unwrap_or_default()
    }

    #[test]
    fn a_wait_that_runs_out_kills_and_says_what_it_waited_for() {
        let mut s = Spawned::spawn(&mut sh("echo started; exec sleep 30"));
        let pid = s.id();
        s.wait_for_stdout("started", Duration::from_secs(10));
        let t0 = Instant::now();
        let msg = panic_text(|| {
            s.wait(Duration::from_millis(200));
        });
        assert!(t0.elapsed() < Duration::from_secs(10));
        assert!(msg.contains("still running after 200ms"), "{msg}");
        assert!(msg.contains("sleep 30"), "{msg}");
        assert!(msg.contains("stdout:\nstarted\n"), "{msg}");
        // Killed and reaped: the pid is gone.
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());

        let mut s = Spawned::spawn(&mut sh("echo working; exec sleep 30"));
        let msg = panic_text(|| s.wait_for_stdout("done", Duration::from_millis(300)));
        assert!(msg.contains("no \"done\" on the stdout of"), "{msg}");
        assert!(msg.contains("within 300ms"), "{msg}");
        assert!(msg.contains("working"), "{msg}");
    }

    #[test]
    fn waiting_for_output_stops_when_the_child_exits_without_it() {
        let mut s = Spawned::spawn(&mut sh("echo bye; exit 2"));
        let t0 = Instant::now();
        let msg = panic_text(|| s.wait_for_stdout("never", Duration::from_secs(60)));
        assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
        assert!(
            msg.contains("exited (exit status: 2) without writing \"never\""),
            "{msg}"
        );
        assert!(msg.contains("bye"), "{msg}");
    }

    #[test]
    fn dropping_a_running_child_kills_and_reaps_it() {
        let s = Spawned::spawn(&mut sh("exec sleep 30"));
        let pid = s.id();
        assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
        drop(s);
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    }
}
