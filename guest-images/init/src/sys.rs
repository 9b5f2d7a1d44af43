//! The few system calls the init makes, each wrapped to return `io::Error` with what it did.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use microvirt_crds::workload::BOOT_TIMER_ADDR;

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL byte in a path"))
}

fn context(what: String) -> impl FnOnce(io::Error) -> io::Error {
    move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// `mount(2)`; `target` is created first when missing.
pub fn mount(
    source: &str,
    target: &Path,
    fstype: &str,
    flags: libc::c_ulong,
    data: &str,
) -> io::Result<()> {
    let _ = std::fs::create_dir_all(target);
    let what = format!("mounting {source} ({fstype}) on {}", target.display());
    let (s, t) = (
        CString::new(source).map_err(|_| io::ErrorKind::InvalidInput)?,
        cstr(target)?,
    );
    let (f, d) = (
        CString::new(fstype).map_err(|_| io::ErrorKind::InvalidInput)?,
        CString::new(data).map_err(|_| io::ErrorKind::InvalidInput)?,
    );
    // SAFETY: all four strings are NUL-terminated and live across the call.
    let rc = unsafe { libc::mount(s.as_ptr(), t.as_ptr(), f.as_ptr(), flags, d.as_ptr().cast()) };
    if rc != 0 {
        return Err(context(what)(io::Error::last_os_error()));
    }
    Ok(())
}

/// Makes `newroot` (a mount point) the root: moves it onto `/` and enters it. The initramfs
/// stays underneath (it cannot be pivoted away; it holds only this program and its workload
/// description).
pub fn switch_root(newroot: &Path) -> io::Result<()> {
    std::env::set_current_dir(newroot)
        .map_err(context(format!("entering {}", newroot.display())))?;
    mount(".", Path::new("/"), "", libc::MS_MOVE, "")
        .map_err(context("moving the new root onto /".into()))?;
    let dot = CString::new(".").unwrap();
    // SAFETY: a NUL-terminated path.
    if unsafe { libc::chroot(dot.as_ptr()) } != 0 {
        return Err(context("chroot".into())(io::Error::last_os_error()));
    }
    std::env::set_current_dir("/")
}

/// The signals PID 1 handles itself: a child's end, and the requests to stop (SIGTERM; SIGINT
/// for Ctrl-Alt-Del; 38 = SIGRTMIN+4, which the kernel's tiny ACPI power-button driver sends
/// to PID 1, as systemd expects).
pub const POWER_BUTTON: libc::c_int = 38;

pub fn handled_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and fill a local sigset_t.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [
            libc::SIGCHLD,
            libc::SIGTERM,
            libc::SIGINT,
            libc::SIGHUP,
            POWER_BUTTON,
        ] {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Blocks `set` so that [`wait_signal`] receives its signals (a blocked signal stays pending).
pub fn block(set: &libc::sigset_t) {
    // SAFETY: `set` is an initialised sigset_t.
    unsafe { libc::sigprocmask(libc::SIG_BLOCK, set, std::ptr::null_mut()) };
}

/// Waits for one signal of `set`, at most `timeout` (None: forever). None on timeout.
pub fn wait_signal(set: &libc::sigset_t, timeout: Option<std::time::Duration>) -> Option<i32> {
    loop {
        let rc = match timeout {
            None => {
                // SAFETY: `set` is initialised; no siginfo is asked for.
                unsafe { libc::sigwaitinfo(set, std::ptr::null_mut()) }
            }
            Some(t) => {
                let ts = libc::timespec {
                    tv_sec: t.as_secs() as libc::time_t,
                    tv_nsec: t.subsec_nanos() as libc::c_long,
                };
                // SAFETY: as above, with a valid timespec.
                unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &ts) }
            }
        };
        if rc >= 0 {
            return Some(rc);
        }
        if io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return None;
        }
    }
}

/// Reaps every exited child; returns `(pid, wait status)` of each.
pub fn reap() -> Vec<(libc::pid_t, libc::c_int)> {
    reap_all().0
}

/// [`reap`], and whether any child is left (PID 1 inherits every orphan: none left means no
/// process but the init and the kernel's threads).
pub fn reap_all() -> (Vec<(libc::pid_t, libc::c_int)>, bool) {
    let mut out = Vec::new();
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status into a local.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid < 0 {
            // ECHILD: no child at all.
            return (out, false);
        }
        if pid == 0 {
            return (out, true);
        }
        out.push((pid, status));
    }
}

/// The exit status a shell would report for a wait status: the exit code, or 128 + the signal.
pub fn exit_status(wait_status: libc::c_int) -> u8 {
    if libc::WIFEXITED(wait_status) {
        libc::WEXITSTATUS(wait_status) as u8
    } else if libc::WIFSIGNALED(wait_status) {
        (128 + libc::WTERMSIG(wait_status)) as u8
    } else {
        1
    }
}

pub fn kill(pid: libc::pid_t, signal: libc::c_int) {
    // SAFETY: kill(2) has no memory effects.
    unsafe { libc::kill(pid, signal) };
}

/// Writes one byte into microvirt's boot-timer page (0 = the boot marker, with the VMM's
/// magic; [`microvirt_crds::workload::EXIT_STATUS_OFFSET`] = the exit status) through
/// `/dev/mem`. Other VMMs have nothing there; the write is then lost, which is harmless.
pub fn signal_vmm(offset: u64, value: u8) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_SYNC)
        .open("/dev/mem")?;
    // SAFETY: a new shared mapping of one page of /dev/mem; nothing else refers to it.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            BOOT_TIMER_ADDR as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `offset` < 4096 (the page mapped above); a volatile byte store is the MMIO write.
    unsafe {
        std::ptr::write_volatile(p.cast::<u8>().add(offset as usize % 4096), value);
        libc::munmap(p, 4096);
    }
    Ok(())
}

/// Ends the VM: power off when the kernel has ACPI (S5), else reboot (microvirt ends a VM
/// without ACPI on its reset).
pub fn end_vm() -> ! {
    // SAFETY: sync(2) and reboot(2) take no pointers.
    unsafe {
        libc::sync();
        let cmd = if Path::new("/sys/firmware/acpi/tables").exists() {
            libc::RB_POWER_OFF
        } else {
            libc::RB_AUTOBOOT
        };
        libc::reboot(cmd);
    }
    // reboot(2) returns only on failure; PID 1 must not exit (the kernel would panic).
    loop {
        // SAFETY: pause(2) takes no arguments.
        unsafe { libc::pause() };
    }
}

/// Lets Ctrl-Alt-Del reach PID 1 as SIGINT instead of rebooting at once.
pub fn ctrl_alt_del_signals() {
    // SAFETY: reboot(2) with the CAD_OFF command only changes the kernel's Ctrl-Alt-Del policy.
    unsafe { libc::reboot(libc::RB_DISABLE_CAD) };
}

pub fn sethostname(name: &str) -> io::Result<()> {
    // SAFETY: a pointer and length of a live byte slice.
    if unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Makes fds 0, 1 and 2 the console when the kernel could not give PID 1 one.
pub fn ensure_console() {
    // SAFETY: fcntl on a possibly closed descriptor only reports EBADF.
    if unsafe { libc::fcntl(1, libc::F_GETFD) } >= 0 {
        return;
    }
    let path = CString::new("/dev/console").unwrap();
    // SAFETY: a NUL-terminated path; dup2 onto the standard descriptors.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_RDWR | libc::O_NOCTTY);
        if fd >= 0 {
            for target in 0..3 {
                libc::dup2(fd, target);
            }
            if fd > 2 {
                libc::close(fd);
            }
        }
    }
}
