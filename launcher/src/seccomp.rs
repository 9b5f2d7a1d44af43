//! The seccomp filter of the VMM thread and the vCPU threads it spawns.
//!
//! It is installed on the VMM thread before the VM is built, so it covers building the VM
//! (KVM setup, guest memory, loading the kernel, opening disks and the serial socket), the
//! event loop and — inherited by every thread created afterwards — the vCPU threads. The
//! launcher's own threads (main, signals, control socket) are not filtered.
//!
//! The allow-list is the set of system calls that `strace -f` showed these threads make
//! (demo guest with disks, serial on stdio and on a socket, pause/resume, Ctrl-Alt-Del,
//! stop), plus what the Rust runtime needs to start and end threads. Everything else kills the
//! whole process (`SECCOMP_RET_KILL_PROCESS`).

use std::collections::BTreeMap;

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, SeccompRule, TargetArch};

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("building the filter: {0}")]
    Build(#[from] seccompiler::BackendError),
    #[error("compiling the filter: {0}")]
    Compile(String),
    #[error("installing the filter: {0}")]
    Install(String),
}

/// What a system call outside the allow-list does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mismatch {
    /// Kill the whole process (production).
    KillProcess,
    /// Fail with EPERM (tests).
    Errno,
}

/// The system calls the VMM and vCPU threads may make.
pub const VMM_SYSCALLS: &[(&str, libc::c_long)] = &[
    // I/O on disks, eventfds, the serial console, KVM.
    ("read", libc::SYS_read),
    ("write", libc::SYS_write),
    ("readv", libc::SYS_readv),
    ("writev", libc::SYS_writev),
    ("pread64", libc::SYS_pread64),
    ("pwrite64", libc::SYS_pwrite64),
    ("preadv", libc::SYS_preadv),
    ("pwritev", libc::SYS_pwritev),
    ("lseek", libc::SYS_lseek),
    ("ioctl", libc::SYS_ioctl),
    ("fcntl", libc::SYS_fcntl),
    ("fsync", libc::SYS_fsync),
    ("fdatasync", libc::SYS_fdatasync),
    ("fallocate", libc::SYS_fallocate),
    ("ftruncate", libc::SYS_ftruncate),
    ("flock", libc::SYS_flock),
    ("openat", libc::SYS_openat),
    ("close", libc::SYS_close),
    ("fstat", libc::SYS_fstat),
    ("newfstatat", libc::SYS_newfstatat),
    ("statx", libc::SYS_statx),
    ("unlink", libc::SYS_unlink),
    ("unlinkat", libc::SYS_unlinkat),
    // Event loop.
    ("epoll_create1", libc::SYS_epoll_create1),
    ("epoll_ctl", libc::SYS_epoll_ctl),
    ("epoll_wait", libc::SYS_epoll_wait),
    ("epoll_pwait", libc::SYS_epoll_pwait),
    ("eventfd2", libc::SYS_eventfd2),
    // virtio-rng's rate limit resumes a throttled queue with a timer.
    ("timerfd_create", libc::SYS_timerfd_create),
    ("timerfd_settime", libc::SYS_timerfd_settime),
    // The serial console's unix socket.
    ("socket", libc::SYS_socket),
    ("bind", libc::SYS_bind),
    ("listen", libc::SYS_listen),
    ("accept4", libc::SYS_accept4),
    ("sendto", libc::SYS_sendto),
    ("recvfrom", libc::SYS_recvfrom),
    ("shutdown", libc::SYS_shutdown),
    // Memory: guest RAM is a memfd (or a snapshot's file); a snapshot asks mincore which
    // pages of a restored VM's RAM are resident.
    ("memfd_create", libc::SYS_memfd_create),
    ("mincore", libc::SYS_mincore),
    ("mmap", libc::SYS_mmap),
    ("munmap", libc::SYS_munmap),
    ("mprotect", libc::SYS_mprotect),
    ("madvise", libc::SYS_madvise),
    ("mremap", libc::SYS_mremap),
    ("brk", libc::SYS_brk),
    // Threads (vCPUs), their signals and synchronisation.
    ("clone", libc::SYS_clone),
    ("clone3", libc::SYS_clone3),
    ("set_robust_list", libc::SYS_set_robust_list),
    ("rseq", libc::SYS_rseq),
    ("futex", libc::SYS_futex),
    ("sched_yield", libc::SYS_sched_yield),
    ("sched_getaffinity", libc::SYS_sched_getaffinity),
    ("prctl", libc::SYS_prctl),
    ("sigaltstack", libc::SYS_sigaltstack),
    ("rt_sigaction", libc::SYS_rt_sigaction),
    ("rt_sigprocmask", libc::SYS_rt_sigprocmask),
    ("rt_sigreturn", libc::SYS_rt_sigreturn),
    ("tgkill", libc::SYS_tgkill),
    ("getpid", libc::SYS_getpid),
    ("gettid", libc::SYS_gettid),
    ("clock_gettime", libc::SYS_clock_gettime),
    ("clock_nanosleep", libc::SYS_clock_nanosleep),
    ("nanosleep", libc::SYS_nanosleep),
    ("getrandom", libc::SYS_getrandom),
    ("exit", libc::SYS_exit),
    ("exit_group", libc::SYS_exit_group),
];

/// Compiles the VMM filter.
pub fn vmm_filter(mismatch: Mismatch) -> Result<BpfProgram, SeccompError> {
    let rules: BTreeMap<i64, Vec<SeccompRule>> = VMM_SYSCALLS
        .iter()
        .map(|&(_, nr)| (nr, Vec::new()))
        .collect();
    let on_mismatch = match mismatch {
        Mismatch::KillProcess => SeccompAction::KillProcess,
        Mismatch::Errno => SeccompAction::Errno(libc::EPERM as u32),
    };
    let filter = SeccompFilter::new(rules, on_mismatch, SeccompAction::Allow, TargetArch::x86_64)?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| SeccompError::Compile(e.to_string()))
}

/// Installs the VMM filter on the calling thread (inherited by threads it creates later).
/// Sets `no_new_privs` first, so it needs no capability.
pub fn apply_vmm_filter(mismatch: Mismatch) -> Result<(), SeccompError> {
    let prog = vmm_filter(mismatch)?;
    seccompiler::apply_filter(&prog).map_err(|e| SeccompError::Install(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_refuses_what_is_not_listed_and_allows_the_rest() {
        // In a thread of its own: the filter stays on that thread.
        std::thread::spawn(|| {
            apply_vmm_filter(Mismatch::Errno).unwrap();
            // Not on the list: execve, and a socket-independent probe (getuid).
            // SAFETY: getuid has no preconditions.
            let uid = unsafe { libc::syscall(libc::SYS_getuid) };
            assert_eq!(uid, -1);
            assert_eq!(
                std::io::Error::last_os_error().raw_os_error(),
                Some(libc::EPERM)
            );
            let e = std::process::Command::new("/bin/true").status();
            assert!(e.is_err(), "exec must be refused: {e:?}");
            // On the list: eventfd, write, read, close.
            let fd = vmm_sys_util_eventfd();
            assert!(fd >= 0);
            // SAFETY: fd is the eventfd just created.
            unsafe { libc::close(fd) };
            let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
            assert!(status.lines().any(|l| l == "Seccomp:\t2"), "{status}");
        })
        .join()
        .unwrap();
        // This thread is unfiltered.
        // SAFETY: getuid has no preconditions.
        assert!(unsafe { libc::syscall(libc::SYS_getuid) } >= 0);
    }

    fn vmm_sys_util_eventfd() -> i32 {
        // SAFETY: eventfd2 with valid flags.
        unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) }
    }

    /// The production mode kills the process: checked in a child process (this test binary
    /// re-run with only this test and an environment variable telling it to be the victim).
    #[test]
    fn disallowed_syscall_kills_the_process() {
        if std::env::var_os("LAUNCHER_SECCOMP_VICTIM").is_some() {
            apply_vmm_filter(Mismatch::KillProcess).unwrap();
            // SAFETY: getuid has no preconditions; the filter kills the process here.
            unsafe { libc::syscall(libc::SYS_getuid) };
            std::process::exit(0);
        }
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new(exe)
            .args([
                "seccomp::tests::disallowed_syscall_kills_the_process",
                "--exact",
                "--test-threads=1",
                "--nocapture",
            ])
            .env("LAUNCHER_SECCOMP_VICTIM", "1")
            .output()
            .unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), Some(libc::SIGSYS), "{out:?}");
    }
}
