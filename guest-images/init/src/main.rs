//! `microvirt-init`: PID 1 of a VM booted from an OCI container image (docs/oci-images.md).
//!
//! It lies in the initramfs `virt-launcher` builds for such a VM, next to the workload
//! description (`/microvirt/workload.json`, [`microvirt_crds::workload::Workload`]), and:
//!
//! 1. mounts the image's files (a read-only erofs disk) under an overlayfs whose upper layer is a
//!    tmpfs (the VM's writable layer, lost when the VM ends), with `/proc`, `/sys`, `/dev`,
//!    `/dev/pts`, `/dev/shm` and `/tmp` inside, and makes it the root;
//! 2. sets the host name, `/etc/hosts` when the image has none, and `/etc/resolv.conf` from the
//!    kernel's DHCP lease (`ip=dhcp`, `/proc/net/pnp`) when there is one;
//! 3. runs the workload (its environment, user and working directory; program looked up in its
//!    `PATH`) in a session of its own, with the console as stdin, stdout and stderr, and writes
//!    the boot marker (the VM is up and the workload started);
//! 4. reaps every orphan; a stop request (SIGTERM, Ctrl-Alt-Del's SIGINT, the ACPI power
//!    button's SIGRTMIN+4) is passed to the workload as SIGTERM;
//! 5. once the workload's own process ended: SIGTERM to everything left, SIGKILL after 2 s,
//!    sync, the exit status into the VMM's register (exit code, or 128 + signal), and the VM
//!    ends (ACPI power-off, or reboot without ACPI).
//!
//! Exit statuses of its own: 125 when the init could not set the workload up (as `docker
//! run`), 126 when the program cannot be run, 127 when it is not found.

mod lookup;
mod sys;

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use microvirt_crds::workload::{Workload, EXIT_STATUS_OFFSET, MAX_WORKLOAD_BYTES, WORKLOAD_PATH};

const NEWROOT: &str = "/newroot";

fn main() {
    if std::process::id() != 1 {
        eprintln!(
            "microvirt-init: runs only as PID 1 of a microvirt guest booted from an OCI image"
        );
        std::process::exit(2);
    }
    let handled = sys::handled_signals();
    sys::block(&handled);
    sys::ctrl_alt_del_signals();
    let status = match start() {
        Ok(pid) => supervise(pid, &handled),
        Err((status, msg)) => {
            eprintln!("microvirt-init: {msg}");
            status
        }
    };
    finish(status, &handled)
}

fn say(msg: &str) {
    eprintln!("microvirt-init: {msg}");
}

/// Everything up to the workload's start; returns its pid.
fn start() -> Result<libc::pid_t, (u8, String)> {
    let fail = |e: std::io::Error| (lookup::INIT_FAILED, e.to_string());
    let _ = sys::mount("devtmpfs", Path::new("/dev"), "devtmpfs", 0, "");
    sys::ensure_console();
    sys::mount("proc", Path::new("/proc"), "proc", 0, "").map_err(fail)?;
    sys::mount("sysfs", Path::new("/sys"), "sysfs", 0, "").map_err(fail)?;
    let w = read_workload()?;
    setup_root(&w).map_err(fail)?;
    sys::switch_root(Path::new(NEWROOT)).map_err(fail)?;
    let ids = lookup::user(Path::new("/"), &w.user).map_err(|e| (lookup::INIT_FAILED, e))?;
    let path = w
        .env
        .iter()
        .find(|e| e.name == "PATH")
        .map(|e| e.value.as_str())
        .unwrap_or(microvirt_crds::workload::DEFAULT_PATH);
    let program = lookup::program(Path::new("/"), &w.argv[0], path)?;
    // As runc: a working directory the image lacks is created.
    std::fs::create_dir_all(&w.working_dir).map_err(|e| {
        (
            lookup::INIT_FAILED,
            format!("working directory {}: {e}", w.working_dir),
        )
    })?;
    let mut cmd = Command::new(&program);
    cmd.arg0(&w.argv[0])
        .args(&w.argv[1..])
        .env_clear()
        .envs(w.env.iter().map(|e| (&e.name, &e.value)))
        .current_dir(&w.working_dir)
        .uid(ids.uid)
        .gid(ids.gid);
    // SAFETY: the closure runs in the forked child before exec and calls only async-signal-safe
    // functions (setsid, sigprocmask).
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|e| {
        let status = match e.kind() {
            std::io::ErrorKind::NotFound => lookup::NOT_FOUND,
            _ => lookup::NOT_EXECUTABLE,
        };
        (status, format!("starting {}: {e}", program.display()))
    })?;
    // The VM is up and the workload started: the boot marker.
    let _ = sys::signal_vmm(0, microvirt_crds::workload::BOOT_TIMER_MAGIC);
    Ok(child.id() as libc::pid_t)
}

fn read_workload() -> Result<Workload, (u8, String)> {
    let mut text = String::new();
    std::fs::File::open(WORKLOAD_PATH)
        .and_then(|f| f.take(MAX_WORKLOAD_BYTES).read_to_string(&mut text))
        .map_err(|e| (lookup::INIT_FAILED, format!("reading {WORKLOAD_PATH}: {e}")))?;
    let w: Workload = serde_json::from_str(&text)
        .map_err(|e| (lookup::INIT_FAILED, format!("parsing {WORKLOAD_PATH}: {e}")))?;
    if w.argv.is_empty() {
        return Err((lookup::INIT_FAILED, format!("{WORKLOAD_PATH}: empty argv")));
    }
    Ok(w)
}

/// The image read-only under a tmpfs-backed overlay at [`NEWROOT`], with the kernel's file
/// systems inside, the host name and the name service files.
fn setup_root(w: &Workload) -> std::io::Result<()> {
    use libc::{MS_NODEV, MS_NOEXEC, MS_NOSUID, MS_RDONLY};
    sys::mount(&w.root_device, Path::new("/lower"), "erofs", MS_RDONLY, "").map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("{e} (the image's files, an erofs image the launcher built)"),
        )
    })?;
    let size = if w.scratch_bytes > 0 {
        format!("size={},mode=0755", w.scratch_bytes)
    } else {
        "mode=0755".into()
    };
    sys::mount("scratch", Path::new("/rw"), "tmpfs", 0, &size)?;
    std::fs::create_dir_all("/rw/upper")?;
    std::fs::create_dir_all("/rw/work")?;
    sys::mount(
        "overlay",
        Path::new(NEWROOT),
        "overlay",
        0,
        "lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work",
    )?;
    let at = |p: &str| Path::new(NEWROOT).join(p);
    sys::mount(
        "proc",
        &at("proc"),
        "proc",
        MS_NOSUID | MS_NODEV | MS_NOEXEC,
        "",
    )?;
    sys::mount(
        "sysfs",
        &at("sys"),
        "sysfs",
        MS_NOSUID | MS_NODEV | MS_NOEXEC,
        "",
    )?;
    sys::mount("devtmpfs", &at("dev"), "devtmpfs", MS_NOSUID, "mode=0755")?;
    sys::mount(
        "devpts",
        &at("dev/pts"),
        "devpts",
        MS_NOSUID | MS_NOEXEC,
        "newinstance,ptmxmode=0666,mode=0620",
    )?;
    sys::mount(
        "shm",
        &at("dev/shm"),
        "tmpfs",
        MS_NOSUID | MS_NODEV,
        "mode=1777",
    )?;
    sys::mount(
        "tmpfs",
        &at("tmp"),
        "tmpfs",
        MS_NOSUID | MS_NODEV,
        "mode=1777",
    )?;
    if !w.hostname.is_empty() {
        sys::sethostname(&w.hostname)?;
    }
    std::fs::create_dir_all(at("etc"))?;
    if std::fs::symlink_metadata(at("etc/hosts")).is_err() {
        let mut hosts = String::from("127.0.0.1\tlocalhost\n");
        if !w.hostname.is_empty() {
            hosts.push_str(&format!("127.0.1.1\t{}\n", w.hostname));
        }
        std::fs::write(at("etc/hosts"), hosts)?;
    }
    // The kernel's DHCP client (ip=dhcp) leaves the lease's name servers in /proc/net/pnp, in
    // resolv.conf's format.
    if let Ok(pnp) = std::fs::read_to_string("/proc/net/pnp") {
        if pnp.lines().any(|l| l.starts_with("nameserver")) {
            // A symlink (systemd-resolved's stub) would point at a file that is not there.
            let _ = std::fs::remove_file(at("etc/resolv.conf"));
            std::fs::write(at("etc/resolv.conf"), pnp)?;
        }
    }
    if !w.hostname.is_empty() {
        let _ = std::fs::write(at("etc/hostname"), format!("{}\n", w.hostname));
    }
    Ok(())
}

/// Reaps until the workload's own process ended; passes stop requests on. Returns its status.
fn supervise(pid: libc::pid_t, handled: &libc::sigset_t) -> u8 {
    loop {
        match sys::wait_signal(handled, None) {
            Some(libc::SIGCHLD) => {
                if let Some((_, ws)) = sys::reap().into_iter().find(|(p, _)| *p == pid) {
                    return sys::exit_status(ws);
                }
            }
            Some(s) => {
                say(&format!(
                    "signal {s}: asking the workload to stop (SIGTERM)"
                ));
                sys::kill(pid, libc::SIGTERM);
            }
            None => {}
        }
    }
}

/// Stops what is left, reports `status` and ends the VM.
fn finish(status: u8, handled: &libc::sigset_t) -> ! {
    sys::kill(-1, libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        if !sys::reap_all().1 {
            break;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            sys::kill(-1, libc::SIGKILL);
            sys::reap();
            break;
        }
        sys::wait_signal(handled, Some(left.min(Duration::from_millis(100))));
    }
    say(&format!("workload exit status {status}"));
    if let Err(e) = sys::signal_vmm(EXIT_STATUS_OFFSET, status) {
        say(&format!("reporting the exit status to the VMM: {e}"));
    }
    sys::end_vm()
}
