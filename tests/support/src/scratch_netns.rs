//! A network namespace for one test.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

/// A named network namespace (`ip netns add`, so `/run/netns/<name>`) that the test creates and
/// that is deleted (`ip netns del`, taking every interface in it along) when dropped.
///
/// Nothing here touches the machine's own network: the namespace starts with only a loopback
/// (down), and every helper acts inside it (`ip -n`, `ip netns exec`, a thread that joined it).
/// What a test itself moves into it from the host (a TAP it made there) is the test's business.
///
/// The name is `mvt-<tag>-<pid>-<n>`, unique among the tests running side by side; a stale
/// namespace of that name (left by an earlier process with the same pid) is deleted first.
/// Needs `CAP_SYS_ADMIN` (the tests run as root) and iproute2's `ip`.
#[derive(Debug)]
pub struct ScratchNetns {
    name: String,
}

fn output(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

fn check(cmd: &mut Command) -> Output {
    let out = output(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim_end()
    );
    out
}

impl ScratchNetns {
    /// Creates the namespace; panics with `ip`'s error output if it cannot.
    pub fn new(tag: &str) -> ScratchNetns {
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let name = format!("mvt-{tag}-{}-{n}", std::process::id());
        let _ = output(Command::new("ip").args(["netns", "del", &name]));
        check(Command::new("ip").args(["netns", "add", &name]));
        ScratchNetns { name }
    }

    /// The namespace's name (for `ip -n`, `ip netns exec`, `ip link set … netns`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip -n <name> ARGS`; panics with its error output if it fails.
    pub fn ip(&self, args: &[&str]) {
        check(Command::new("ip").arg("-n").arg(&self.name).args(args));
    }

    /// `sh -c SCRIPT` in the namespace; its standard output. Panics with the error output if the
    /// script fails.
    pub fn sh(&self, script: &str) -> String {
        let out = check(self.command("sh").args(["-c", script]));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A command that runs `program` in the namespace (`ip netns exec <name> program`, which
    /// execs it in place: the child's pid is the program's).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }

    /// Runs `f` on a new thread that first joined the namespace (only that thread: `setns(2)`
    /// changes the calling thread). The thread panics if it cannot join.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> JoinHandle<T> {
        let path = format!("/run/netns/{}", self.name);
        let ns = File::open(&path).unwrap_or_else(|e| panic!("opening {path}: {e}"));
        std::thread::spawn(move || {
            // SAFETY: setns(2) with a namespace fd we own, which stays open for the call; it
            // changes only this thread's network namespace.
            let r = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(r, 0, "joining {path}: {}", std::io::Error::last_os_error());
            drop(ns);
            f()
        })
    }

    /// [`spawn`](Self::spawn), then waits for the thread; its panic is passed on.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        match self.spawn(f).join() {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        }
    }
}

impl Drop for ScratchNetns {
    fn drop(&mut self) {
        let _ = output(Command::new("ip").args(["netns", "del", &self.name]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn links(ns: &ScratchNetns) -> String {
        ns.sh("ip -o link show")
    }

    /// The host's interfaces (this test's own namespace).
    fn host_links() -> String {
        let out = check(Command::new("ip").args(["-o", "link", "show"]));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    #[test]
    fn a_namespace_of_its_own_deleted_on_drop_without_the_hosts_interfaces() {
        let ns = ScratchNetns::new("kit");
        let other = ScratchNetns::new("kit");
        assert_ne!(ns.name(), other.name());
        assert!(
            ns.name()
                .starts_with(&format!("mvt-kit-{}-", std::process::id())),
            "{}",
            ns.name()
        );
        let path = std::path::PathBuf::from(format!("/run/netns/{}", ns.name()));
        assert!(path.exists());
        // Only a loopback in it.
        let l = links(&ns);
        assert_eq!(l.lines().count(), 1, "{l}");
        assert!(l.contains(": lo:"), "{l}");

        ns.ip(&[
            "link", "add", "kit0", "type", "veth", "peer", "name", "kit1",
        ]);
        ns.ip(&["link", "set", "kit0", "up"]);
        ns.ip(&["link", "set", "kit1", "up"]);
        ns.ip(&["addr", "add", "192.0.2.1/24", "dev", "kit0"]);
        assert!(links(&ns).contains(": kit0@"));
        assert!(!links(&other).contains("kit0"));
        assert!(!host_links().contains(": kit0@"));

        // A thread in the namespace sees its address; this one does not.
        let bound = ns.run(|| std::net::UdpSocket::bind("192.0.2.1:0").is_ok());
        assert!(
            bound,
            "a thread in the namespace could not bind its address"
        );
        assert!(std::net::UdpSocket::bind("192.0.2.1:0").is_err());

        // `command` runs the program in the namespace.
        let out = check(ns.command("ip").args(["-o", "addr", "show", "kit0"]));
        assert!(String::from_utf8_lossy(&out.stdout).contains("192.0.2.1/24"));

        drop(ns);
        assert!(!path.exists(), "{} left behind", path.display());
        assert!(!host_links().contains(": kit0@"));
    }

    #[test]
    fn a_failing_command_names_itself_and_its_error() {
        let ns = ScratchNetns::new("kitfail");
        let e = std::panic::catch_unwind(|| ns.ip(&["link", "set", "nosuchdev", "up"]))
            .expect_err("ip on a missing device succeeded");
        let msg = e.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("nosuchdev"), "{msg}");
        assert!(msg.contains("failed"), "{msg}");
    }
}
