//! The node's network namespace: held open by a small process (no `/run/netns` bind mount),
//! joined by containerd, the kubelet and the CNI plugins, and connected to the host by one veth
//! pair. Nothing in it touches the machine's own interfaces: the namespace has no default
//! route, the host only gets the veth's link route and a route for the pod subnet into the
//! namespace, and there is no NAT on the host.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::config::NodeNetwork;
use super::teardown::{HOST_VETH, NODE_VETH};

/// iproute2's `ip` (busybox's silently ignores `peer name`).
pub const IP: &str = "/usr/sbin/ip";
/// The nftables command-line tool.
pub const NFT: &str = "/usr/sbin/nft";

/// Errors setting the namespace up.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// A process could not be started or waited for.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        source: io::Error,
    },
    /// A configuration command failed.
    #[error("`{cmd}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        cmd: String,
        /// Its exit status.
        status: String,
        /// Its error output.
        stderr: String,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> NetnsError {
    let what = what.into();
    move |source| NetnsError::Io { what, source }
}

/// A handle on the node's network namespace.
#[derive(Debug)]
pub struct Netns {
    file: File,
    holder_pid: u32,
}

impl Netns {
    /// Starts `holder` (a program that waits for SIGTERM; `args` identify it as this node's) in
    /// a new network namespace and opens that namespace. `in_child` runs in the child before
    /// exec (it must only make async-signal-safe calls).
    pub fn create_with(
        holder: &Path,
        args: &[String],
        mut in_child: impl FnMut(()) -> io::Result<()> + Send + Sync + 'static,
    ) -> Result<(Netns, Child), NetnsError> {
        let mut cmd = Command::new(holder);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        // SAFETY: the closure runs in the child between fork and exec; it calls unshare(2) and
        // `in_child`, which the caller promises is async-signal-safe too.
        unsafe {
            cmd.pre_exec(move || {
                if libc::unshare(libc::CLONE_NEWNET) != 0 {
                    return Err(io::Error::last_os_error());
                }
                in_child(())
            });
        }
        let mut child = cmd
            .spawn()
            .map_err(io_err(format!("starting {}", holder.display())))?;
        let pid = child.id();
        // The namespace exists once the child has unshared, i.e. when its ns link differs from
        // ours.
        let ours = std::fs::read_link("/proc/self/ns/net").ok();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let theirs = std::fs::read_link(format!("/proc/{pid}/ns/net")).ok();
            if theirs.is_some() && theirs != ours {
                break;
            }
            if let Ok(Some(st)) = child.try_wait() {
                return Err(NetnsError::Command {
                    cmd: format!("{} (network namespace holder)", holder.display()),
                    status: st.to_string(),
                    stderr: "exited at once".into(),
                });
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(NetnsError::Command {
                    cmd: format!("{} (network namespace holder)", holder.display()),
                    status: "running".into(),
                    stderr: "never entered a new network namespace".into(),
                });
            }
            thread::sleep(Duration::from_millis(5));
        }
        let ns = Self::open(pid)?;
        Ok((ns, child))
    }

    /// Opens the namespace of a running holder.
    pub fn open(holder_pid: u32) -> Result<Netns, NetnsError> {
        let path = format!("/proc/{holder_pid}/ns/net");
        let file = File::open(&path).map_err(io_err(format!("opening {path}")))?;
        Ok(Netns { file, holder_pid })
    }

    /// The holder's pid.
    pub fn holder_pid(&self) -> u32 {
        self.holder_pid
    }

    /// Makes `cmd` run inside the namespace (only the network namespace is joined: mounts,
    /// cgroups and /sys stay the host's, as containerd and the kubelet need).
    pub fn enter(&self, cmd: &mut Command) {
        let fd = self.file.as_raw_fd();
        // SAFETY: runs between fork and exec; setns(2) is async-signal-safe, and `fd` stays
        // open in the child until exec (the parent keeps `self.file` alive during spawn).
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    /// Runs `f` on a thread that has joined the namespace (sockets it opens live there), and
    /// returns its result.
    pub fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, NetnsError> {
        let file = self
            .file
            .try_clone()
            .map_err(io_err("duplicating the namespace handle"))?;
        std::thread::spawn(move || {
            // SAFETY: setns(2) on a namespace fd we own; CLONE_NEWNET only changes this
            // thread's network namespace, and the thread ends after `f`.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io_err("joining the node's network namespace")(
                    io::Error::last_os_error(),
                ));
            }
            Ok(f())
        })
        .join()
        .map_err(|_| NetnsError::Command {
            cmd: "a closure in the node's network namespace".into(),
            status: "panicked".into(),
            stderr: String::new(),
        })?
    }

    /// A command that runs inside the namespace.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        self.enter(&mut c);
        c
    }

    /// Creates the veth pair, addresses both ends, turns forwarding on inside the namespace and
    /// routes the pod subnet from the host into it.
    pub fn connect(&self, net: &NodeNetwork) -> Result<(), NetnsError> {
        let pid = self.holder_pid.to_string();
        let host = format!("{}/{}", net.host_ip, net.link_prefix);
        let node = format!("{}/{}", net.node_ip, net.link_prefix);
        let node_ip = net.node_ip.to_string();
        let pods = net.pod_cidr();
        run(Command::new(IP).args([
            "link", "add", HOST_VETH, "type", "veth", "peer", "name", NODE_VETH,
        ]))?;
        run(Command::new(IP).args(["link", "set", NODE_VETH, "netns", &pid]))?;
        run(Command::new(IP).args(["addr", "add", &host, "dev", HOST_VETH]))?;
        run(Command::new(IP).args(["link", "set", HOST_VETH, "up"]))?;
        run(self.command(IP).args(["link", "set", "lo", "up"]))?;
        run(self
            .command(IP)
            .args(["addr", "add", &node, "dev", NODE_VETH]))?;
        run(self.command(IP).args(["link", "set", NODE_VETH, "up"]))?;
        // Inside the namespace: /proc/sys/net is the namespace's own when opened from there.
        run(self
            .command("/bin/sh")
            .args(["-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"]))?;
        run(Command::new(IP).args(["route", "add", &pods, "via", &node_ip, "dev", HOST_VETH]))?;
        Ok(())
    }

    /// Loads nftables rules (`nft -f -`) inside the namespace.
    pub fn load_nft(&self, rules: &str) -> Result<(), NetnsError> {
        let mut cmd = self.command(NFT);
        cmd.args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(io_err(format!("starting {NFT}")))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(rules.as_bytes())
                .map_err(io_err("writing nft rules"))?;
        }
        let out = child
            .wait_with_output()
            .map_err(io_err(format!("waiting for {NFT}")))?;
        if !out.status.success() {
            return Err(NetnsError::Command {
                cmd: format!("{NFT} -f - (in the node's namespace)"),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(())
    }
}

/// Runs `cmd`, turning a non-zero exit into an error with its stderr.
pub fn run(cmd: &mut Command) -> Result<(), NetnsError> {
    let line = format!(
        "{} {}",
        cmd.get_program().to_string_lossy(),
        cmd.get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(io_err(format!("running {line}")))?;
    if !out.status.success() {
        return Err(NetnsError::Command {
            cmd: line,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// Host tools the node needs, with the Debian package that has each.
pub const HOST_TOOLS: &[(&str, &str)] = &[
    (IP, "iproute2"),
    (NFT, "nftables"),
    ("/usr/sbin/runc", "runc"),
    ("/usr/lib/cni/bridge", "containernetworking-plugins"),
    ("/usr/lib/cni/host-local", "containernetworking-plugins"),
    ("/usr/lib/cni/loopback", "containernetworking-plugins"),
    ("/bin/mount", "mount"),
];

/// The Debian packages of [`HOST_TOOLS`] that are missing.
pub fn missing_host_packages() -> Vec<&'static str> {
    let mut missing: Vec<&str> = HOST_TOOLS
        .iter()
        .filter(|(p, _)| !PathBuf::from(p).exists())
        .map(|(_, pkg)| *pkg)
        .collect();
    missing.dedup();
    missing
}
