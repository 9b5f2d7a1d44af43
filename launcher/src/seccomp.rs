//! seccomp filters for every launcher thread.
//!
//! Filters stack (the kernel runs all of them and the strictest answer wins), so the layout is:
//!
//! - [`Role::Launcher`], installed on the main thread with `SECCOMP_FILTER_FLAG_TSYNC` once the
//!   privileged setup (disks, pod network) is done and the capabilities are dropped, before any
//!   other thread exists. Every thread created afterwards inherits it: signals, control socket
//!   and its connections, console hub, boot notification, the DHCP server, the VMM thread while
//!   it builds the VM, its CPUID helper (which also creates and sets up the vCPUs while the VMM
//!   thread builds the rest: KVM ioctls and the `kvm_run` mapping, as on the VMM thread), and
//!   the vCPU threads.
//! - [`Role::Vmm`] and [`Role::Vcpu`] (the VM's threads once it is built): stacked on top by the
//!   VMM thread when it starts the event loop and by each vCPU thread when it starts. Neither
//!   can open a file, create or bind a socket, remove a file or start a thread.
//! - [`Role::Dhcp`]: stacked by the DHCP server thread (the one that parses packets the guest
//!   sends) before it serves: it can only receive and send on its socket.
//!
//! Arguments are checked where it matters: `ioctl` requests are limited to KVM's request class
//! (type `0xAE`, meaningful only on the KVM file descriptors) and the TUN, terminal and
//! `FIONBIO`/`FIOCLEX` requests the launcher makes; `socket` to `libc::AF_UNIX` (the network sockets
//! are all created before the filter); `clone` to threads (`libc::CLONE_THREAD`), with `clone3`
//! answering `ENOSYS` so the C library falls back to `clone` (its flags are in a register that
//! seccomp can inspect, `clone3`'s are behind a pointer); `fcntl`, `prctl` and `seccomp` to the
//! operations used. Anything else is not executed and stops the whole process: the filter
//! traps (`SECCOMP_RET_TRAP`), a SIGSYS handler writes the system call and its first arguments
//! to stderr and the process dies of SIGSYS.
//!
//! The lists are what `strace -f` showed the threads use (pod mode with networking, disks,
//! console socket, control socket with status/pause/console, run mode on a terminal), plus what
//! the Rust runtime needs to start, name and end threads and to abort, plus the file operations
//! the control thread needs to write snapshots into a directory.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
};

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("building the {role:?} filter: {source}")]
    Build {
        role: Role,
        source: seccompiler::BackendError,
    },
    #[error("installing the {role:?} filter: {source}")]
    Install {
        role: Role,
        source: seccompiler::Error,
    },
    #[error("installing the SIGSYS handler: {0}")]
    Handler(std::io::Error),
}

/// What a system call outside the allow-list does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mismatch {
    /// Kill the whole process (production): the call is not made; a SIGSYS handler reports it
    /// on stderr (system call number, thread, first arguments) and the process dies of
    /// SIGSYS.
    KillProcess,
    /// Fail with EPERM (tests).
    Errno,
}

/// Writes `n` in decimal (`hex` false) or hexadecimal into `buf` at `*at`.
fn put_num(buf: &mut [u8], at: &mut usize, mut n: u64, hex: bool) {
    let base = if hex { 16 } else { 10 };
    let mut digits = [0u8; 20];
    let mut len = 0;
    loop {
        let d = (n % base) as u8;
        digits[len] = if d < 10 { b'0' + d } else { b'a' + d - 10 };
        len += 1;
        n /= base;
        if n == 0 {
            break;
        }
    }
    if hex {
        put_str(buf, at, b"0x");
    }
    for &d in digits[..len].iter().rev() {
        put_str(buf, at, &[d]);
    }
}

fn put_str(buf: &mut [u8], at: &mut usize, s: &[u8]) {
    for &b in s {
        if *at < buf.len() {
            buf[*at] = b;
            *at += 1;
        }
    }
}

/// The SIGSYS handler: only async-signal-safe work and system calls every filter allows
/// (write, gettid, getpid, tgkill).
extern "C" fn on_sigsys(_: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SIGSYS: after si_signo, si_errno, si_code
    // and padding (16 bytes) comes `_sigsys` { si_call_addr (8 bytes), si_syscall (int) }.
    let nr = unsafe { *(info as *const u8).add(24).cast::<libc::c_int>() };
    // SAFETY: with SA_SIGINFO the third argument is the interrupted thread's ucontext.
    let (a0, a1) = unsafe {
        let uc = &*(ctx as *const libc::ucontext_t);
        (
            uc.uc_mcontext.gregs[libc::REG_RDI as usize] as u64,
            uc.uc_mcontext.gregs[libc::REG_RSI as usize] as u64,
        )
    };
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let mut buf = [0u8; 192];
    let mut at = 0;
    put_str(&mut buf, &mut at, b"virt-launcher: seccomp: thread ");
    put_num(&mut buf, &mut at, tid as u64, false);
    put_str(&mut buf, &mut at, b" made a forbidden system call ");
    put_num(&mut buf, &mut at, nr as u64, false);
    put_str(&mut buf, &mut at, b" (arguments ");
    put_num(&mut buf, &mut at, a0, true);
    put_str(&mut buf, &mut at, b", ");
    put_num(&mut buf, &mut at, a1, true);
    put_str(&mut buf, &mut at, b", ...); stopping\n");
    // SAFETY: writes our stack buffer to stderr; then sends SIGSYS to this thread, which
    // (the handler being reset to the default by SA_RESETHAND) ends the process once the
    // handler returns and the signal is unblocked.
    unsafe {
        libc::write(2, buf.as_ptr().cast(), at);
        libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, libc::SIGSYS);
    }
}

/// Installs the SIGSYS reporter (process-wide; see [`Mismatch::KillProcess`]).
fn install_sigsys_reporter() -> Result<(), SeccompError> {
    // SAFETY: sigaction is plain data; we fill in a handler with SA_SIGINFO semantics.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = on_sigsys as *const () as usize;
    sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESETHAND;
    // SAFETY: installs a valid handler for SIGSYS; the old action is not needed.
    if unsafe { libc::sigaction(libc::SIGSYS, &sa, std::ptr::null_mut()) } < 0 {
        return Err(SeccompError::Handler(std::io::Error::last_os_error()));
    }
    Ok(())
}

fn mismatch_action(m: Mismatch) -> SeccompAction {
    match m {
        Mismatch::KillProcess => SeccompAction::Trap,
        Mismatch::Errno => SeccompAction::Errno(libc::EPERM as u32),
    }
}

/// Which threads a filter is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Every launcher thread (installed process-wide).
    Launcher,
    /// The VMM thread once the VM is built (event loop, device I/O).
    Vmm,
    /// A vCPU thread.
    Vcpu,
    /// The DHCP server thread.
    Dhcp,
}

// ioctl requests (asm-generic/ioctls.h, linux/if_tun.h).
const FIONBIO: u64 = 0x5421;
const FIOCLEX: u64 = 0x5451;
const TCGETS: u64 = 0x5401;
const TCSETS: u64 = 0x5402;
const TCSETSW: u64 = 0x5403;
const TCSETSF: u64 = 0x5404;
const TIOCGWINSZ: u64 = 0x5413;
const TUNSETIFF: u64 = 0x4004_54ca;
const TUNSETOFFLOAD: u64 = 0x4004_54d0;
const TUNSETVNETHDRSZ: u64 = 0x4004_54d8;
/// `KVMIO`: the ioctl type byte of every KVM request (linux/kvm.h).
const KVMIO: u64 = 0xae;

/// One allowed system call: unconditionally (`rules` empty) or when any rule matches.
struct Allow {
    nr: libc::c_long,
    rules: Vec<SeccompRule>,
}

fn cond(arg: u8, len: Len, op: Op, value: u64) -> SeccompCondition {
    SeccompCondition::new(arg, len, op, value).expect("argument index below 6")
}

fn rule(conds: Vec<SeccompCondition>) -> SeccompRule {
    SeccompRule::new(conds).expect("a rule has at least one condition")
}

fn any(nr: libc::c_long) -> Allow {
    Allow {
        nr,
        rules: Vec::new(),
    }
}

/// `nr` when argument `arg` (32 bits) is one of `values`.
fn one_of(nr: libc::c_long, arg: u8, values: &[u64]) -> Allow {
    Allow {
        nr,
        rules: values
            .iter()
            .map(|&v| rule(vec![cond(arg, Len::Dword, Op::Eq, v)]))
            .collect(),
    }
}

/// `ioctl` with the KVM request class and the listed requests.
fn ioctl_rules(kvm: bool, requests: &[u64]) -> Allow {
    let mut a = one_of(libc::SYS_ioctl, 1, requests);
    if kvm {
        // Bits 8..16 of the request are its type.
        a.rules.push(rule(vec![cond(
            1,
            Len::Dword,
            Op::MaskedEq(0xff00),
            KVMIO << 8,
        )]));
    }
    a
}

fn fcntl_ops() -> Allow {
    one_of(
        libc::SYS_fcntl,
        1,
        &[
            libc::F_GETFD as u64,
            libc::F_SETFD as u64,
            libc::F_GETFL as u64,
            libc::F_SETFL as u64,
            libc::F_DUPFD_CLOEXEC as u64,
        ],
    )
}

/// What every thread needs to run Rust code: memory, futexes, signals masks, time, and exit.
fn runtime() -> Vec<Allow> {
    [
        libc::SYS_mmap,
        libc::SYS_munmap,
        libc::SYS_mprotect,
        libc::SYS_madvise,
        libc::SYS_mremap,
        libc::SYS_brk,
        libc::SYS_futex,
        libc::SYS_sched_yield,
        libc::SYS_sigaltstack,
        libc::SYS_rt_sigprocmask,
        libc::SYS_rt_sigreturn,
        libc::SYS_restart_syscall,
        libc::SYS_getpid,
        libc::SYS_gettid,
        libc::SYS_tgkill,
        libc::SYS_clock_gettime,
        libc::SYS_clock_nanosleep,
        libc::SYS_nanosleep,
        libc::SYS_getrandom,
        libc::SYS_close,
        libc::SYS_write,
        libc::SYS_exit,
        libc::SYS_exit_group,
    ]
    .into_iter()
    .map(any)
    .collect()
}

fn launcher() -> Vec<Allow> {
    let mut v = runtime();
    v.extend(
        [
            // Files: disks, overlays, the booted marker, the termination log, the runtime
            // directory's removal, /proc status; snapshot files in a directory.
            libc::SYS_read,
            libc::SYS_readv,
            libc::SYS_writev,
            libc::SYS_pread64,
            libc::SYS_pwrite64,
            libc::SYS_preadv,
            libc::SYS_pwritev,
            libc::SYS_lseek,
            libc::SYS_openat,
            libc::SYS_fstat,
            libc::SYS_newfstatat,
            libc::SYS_statx,
            libc::SYS_getdents64,
            libc::SYS_fsync,
            libc::SYS_fdatasync,
            libc::SYS_fallocate,
            libc::SYS_ftruncate,
            libc::SYS_flock,
            libc::SYS_unlink,
            libc::SYS_unlinkat,
            libc::SYS_rmdir,
            libc::SYS_mkdir,
            libc::SYS_mkdirat,
            libc::SYS_rename,
            libc::SYS_renameat,
            libc::SYS_renameat2,
            libc::SYS_chmod,
            libc::SYS_fchmod,
            libc::SYS_fchmodat,
            // Guest RAM is a memfd (created while the VM is built); a snapshot of a restored
            // VM asks which of its pages are resident.
            libc::SYS_memfd_create,
            libc::SYS_mincore,
            // virtio-rng's rate limit resumes a throttled queue with a timer.
            libc::SYS_timerfd_create,
            libc::SYS_timerfd_settime,
            // Event loop.
            libc::SYS_epoll_create1,
            libc::SYS_epoll_ctl,
            libc::SYS_epoll_wait,
            libc::SYS_epoll_pwait,
            libc::SYS_eventfd2,
            libc::SYS_poll,
            libc::SYS_ppoll,
            // Unix sockets (created below), the DHCP socket (created before the filter).
            libc::SYS_bind,
            libc::SYS_listen,
            libc::SYS_accept4,
            libc::SYS_connect,
            libc::SYS_sendto,
            libc::SYS_recvfrom,
            libc::SYS_sendmsg,
            libc::SYS_recvmsg,
            libc::SYS_shutdown,
            libc::SYS_setsockopt,
            libc::SYS_getsockopt,
            libc::SYS_getsockname,
            // Threads and signals.
            libc::SYS_set_robust_list,
            libc::SYS_rseq,
            libc::SYS_sched_getaffinity,
            libc::SYS_rt_sigaction,
            libc::SYS_rt_sigtimedwait,
            // The pod-network teardown helper (run mode) is waited for.
            libc::SYS_wait4,
        ]
        .into_iter()
        .map(any),
    );
    v.push(one_of(libc::SYS_socket, 0, &[libc::AF_UNIX as u64]));
    v.push(one_of(libc::SYS_socketpair, 0, &[libc::AF_UNIX as u64]));
    v.push(ioctl_rules(
        true,
        &[
            TUNSETIFF,
            TUNSETOFFLOAD,
            TUNSETVNETHDRSZ,
            FIONBIO,
            FIOCLEX,
            TCGETS,
            TCSETS,
            TCSETSW,
            TCSETSF,
            TIOCGWINSZ,
        ],
    ));
    v.push(fcntl_ops());
    v.push(one_of(
        libc::SYS_prctl,
        0,
        &[
            libc::PR_SET_NAME as u64,
            libc::PR_GET_NAME as u64,
            libc::PR_SET_NO_NEW_PRIVS as u64,
        ],
    ));
    // More filters may be stacked (they only ever restrict).
    v.push(one_of(
        libc::SYS_seccomp,
        0,
        &[libc::SECCOMP_SET_MODE_FILTER as u64],
    ));
    v.push(Allow {
        nr: libc::SYS_clone,
        rules: vec![rule(vec![cond(
            0,
            Len::Qword,
            Op::MaskedEq(libc::CLONE_THREAD as u64),
            libc::CLONE_THREAD as u64,
        )])],
    });
    // Answered ENOSYS by a separate filter (see `clone3_enosys`); allowed here so that
    // answer is what the caller sees.
    v.push(any(libc::SYS_clone3));
    v
}

fn vmm() -> Vec<Allow> {
    let mut v = runtime();
    v.extend(
        [
            // Disk and device I/O, eventfds, the serial console (stdout or the socket's client).
            libc::SYS_read,
            libc::SYS_readv,
            libc::SYS_writev,
            libc::SYS_pread64,
            libc::SYS_pwrite64,
            libc::SYS_preadv,
            libc::SYS_pwritev,
            libc::SYS_lseek,
            libc::SYS_fstat,
            libc::SYS_fsync,
            libc::SYS_fdatasync,
            libc::SYS_fallocate,
            libc::SYS_ftruncate,
            libc::SYS_flock,
            libc::SYS_epoll_ctl,
            libc::SYS_epoll_wait,
            libc::SYS_epoll_pwait,
            libc::SYS_accept4,
            libc::SYS_sendto,
            libc::SYS_recvfrom,
            libc::SYS_shutdown,
            libc::SYS_rt_sigaction,
            // A snapshot (through descriptors the control thread opened): which pages of a
            // restored VM's RAM are resident.
            libc::SYS_mincore,
            // virtio-rng's throttle timer.
            libc::SYS_timerfd_settime,
        ]
        .into_iter()
        .map(any),
    );
    v.push(ioctl_rules(true, &[TUNSETOFFLOAD, FIONBIO, FIOCLEX]));
    v.push(fcntl_ops());
    // A snapshot sizes an overlay through its descriptor (`File::metadata`).
    v.push(statx_by_fd());
    v
}

/// `statx` with AT_EMPTY_PATH only (what `File::metadata` does): no path can be looked up.
fn statx_by_fd() -> Allow {
    Allow {
        nr: libc::SYS_statx,
        rules: vec![rule(vec![cond(
            2,
            Len::Dword,
            Op::MaskedEq(libc::AT_EMPTY_PATH as u64),
            libc::AT_EMPTY_PATH as u64,
        )])],
    }
}

fn vcpu() -> Vec<Allow> {
    let mut v = runtime();
    // KVM_RUN and the register reads that describe a crash; eventfd reads and writes.
    v.push(any(libc::SYS_read));
    // Virtio register writes run on the vCPU: the driver's feature choice sets the TAP's
    // offloads.
    v.push(ioctl_rules(true, &[TUNSETOFFLOAD]));
    v.push(fcntl_ops());
    // At its end the thread reads its KVM statistics from the stats descriptor
    // (KVM_GET_STATS_FD; `read_to_end` sizes the file first).
    v.push(any(libc::SYS_lseek));
    v.push(statx_by_fd());
    v
}

fn dhcp() -> Vec<Allow> {
    let mut v = runtime();
    v.push(any(libc::SYS_recvfrom));
    v.push(any(libc::SYS_sendto));
    // Closing descriptors checks them first (F_GETFD).
    v.push(fcntl_ops());
    v
}

fn allowed(role: Role) -> Vec<Allow> {
    match role {
        Role::Launcher => launcher(),
        Role::Vmm => vmm(),
        Role::Vcpu => vcpu(),
        Role::Dhcp => dhcp(),
    }
}

/// The system call numbers a role may make (with or without argument conditions).
pub fn allowed_syscalls(role: Role) -> Vec<libc::c_long> {
    allowed(role).into_iter().map(|a| a.nr).collect()
}

/// Compiles the filter of `role`.
pub fn filter(role: Role, mismatch: Mismatch) -> Result<BpfProgram, SeccompError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for a in allowed(role) {
        let entry = rules.entry(a.nr).or_default();
        entry.extend(a.rules);
    }
    let on_mismatch = mismatch_action(mismatch);
    let build = |source| SeccompError::Build { role, source };
    let f = SeccompFilter::new(rules, on_mismatch, SeccompAction::Allow, TargetArch::x86_64)
        .map_err(build)?;
    f.try_into().map_err(build)
}

/// `clone3` → ENOSYS, everything else allowed (stacked under the launcher filter).
fn clone3_enosys() -> Result<BpfProgram, SeccompError> {
    let build = |source| SeccompError::Build {
        role: Role::Launcher,
        source,
    };
    let f = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        TargetArch::x86_64,
    )
    .map_err(build)?;
    f.try_into().map_err(build)
}

/// Installs the launcher filter on every thread of the process (TSYNC); threads created
/// afterwards inherit it. Sets `no_new_privs` first, so it needs no capability.
pub fn apply_launcher_filter(mismatch: Mismatch) -> Result<(), SeccompError> {
    install_launcher(mismatch, true)
}

fn install_launcher(mismatch: Mismatch, all_threads: bool) -> Result<(), SeccompError> {
    if mismatch == Mismatch::KillProcess {
        install_sigsys_reporter()?;
    }
    let install = |source| SeccompError::Install {
        role: Role::Launcher,
        source,
    };
    let apply = if all_threads {
        seccompiler::apply_filter_all_threads
    } else {
        seccompiler::apply_filter
    };
    apply(&clone3_enosys()?).map_err(install)?;
    apply(&filter(Role::Launcher, mismatch)?).map_err(install)
}

/// Stacks the filter of `role` on the calling thread (and threads it creates later).
pub fn apply_thread_filter(role: Role, mismatch: Mismatch) -> Result<(), SeccompError> {
    if mismatch == Mismatch::KillProcess {
        install_sigsys_reporter()?;
    }
    seccompiler::apply_filter(&filter(role, mismatch)?)
        .map_err(|source| SeccompError::Install { role, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    fn errno() -> Option<i32> {
        std::io::Error::last_os_error().raw_os_error()
    }

    fn thread_status() -> String {
        std::fs::read_to_string("/proc/thread-self/status").unwrap()
    }

    #[test]
    fn tighter_filters_are_subsets_of_the_launcher_filter() {
        // A stacked filter can only restrict: anything it allows that the launcher filter does
        // not would still be killed, so the lists must nest.
        let base = allowed_syscalls(Role::Launcher);
        for role in [Role::Vmm, Role::Vcpu, Role::Dhcp] {
            for nr in allowed_syscalls(role) {
                assert!(
                    base.contains(&nr),
                    "{role:?} allows {nr}, the launcher does not"
                );
            }
            let set = allowed_syscalls(role);
            for forbidden in [
                libc::SYS_openat,
                libc::SYS_socket,
                libc::SYS_bind,
                libc::SYS_unlink,
                libc::SYS_unlinkat,
                libc::SYS_clone,
                libc::SYS_execve,
            ] {
                assert!(!set.contains(&forbidden), "{role:?} allows {forbidden}");
            }
        }
    }

    #[test]
    fn launcher_filter_checks_arguments_in_errno_mode() {
        std::thread::spawn(|| {
            install_launcher(Mismatch::Errno, false).unwrap();
            // Not listed at all.
            // SAFETY: getuid has no preconditions.
            assert_eq!(unsafe { libc::syscall(libc::SYS_getuid) }, -1);
            assert_eq!(errno(), Some(libc::EPERM));
            // socket: libc::AF_UNIX yes, AF_INET and AF_NETLINK no.
            // SAFETY: plain socket calls; the fd is closed.
            let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
            assert!(fd >= 0);
            // SAFETY: closing the socket just made.
            unsafe { libc::close(fd) };
            for family in [
                libc::AF_INET,
                libc::AF_INET6,
                libc::AF_NETLINK,
                libc::AF_PACKET,
            ] {
                // SAFETY: as above; it must fail.
                let fd = unsafe { libc::socket(family, libc::SOCK_DGRAM, 0) };
                assert_eq!((fd, errno()), (-1, Some(libc::EPERM)), "family {family}");
            }
            // ioctl: KVM's class and FIONBIO pass the filter (and fail in the kernel on a
            // socket); TIOCSTI (inject terminal input) and SIOCGIFCONF do not.
            // SAFETY: a unix socket for the ioctl probes; every ioctl gets a valid pointer.
            let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
            let mut int = 0i32;
            let mut buf = [0u8; 64];
            // SAFETY: KVM_GET_API_VERSION takes no argument; on a socket it fails with ENOTTY.
            let r = unsafe { libc::ioctl(fd, 0xae00, 0) };
            assert_eq!((r, errno()), (-1, Some(libc::ENOTTY)));
            // SAFETY: FIONBIO reads an int.
            assert_eq!(unsafe { libc::ioctl(fd, FIONBIO as _, &mut int) }, 0);
            for req in [libc::TIOCSTI, libc::SIOCGIFCONF] {
                // SAFETY: the buffer is large enough for either request.
                let r = unsafe { libc::ioctl(fd, req, buf.as_mut_ptr()) };
                assert_eq!((r, errno()), (-1, Some(libc::EPERM)), "ioctl {req:#x}");
            }
            // SAFETY: closing the probe socket.
            unsafe { libc::close(fd) };
            // Threads still start (clone3 says ENOSYS, the C library falls back to clone)...
            let t = std::thread::spawn(|| 7).join().unwrap();
            assert_eq!(t, 7);
            // ...but a process cannot be forked.
            // SAFETY: fork fails here (the child would only _exit).
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // SAFETY: in the (unexpected) child, leave at once.
                unsafe { libc::_exit(0) };
            }
            assert_eq!((pid, errno()), (-1, Some(libc::EPERM)));
            let status = thread_status();
            assert!(status.lines().any(|l| l == "Seccomp:\t2"), "{status}");
            assert!(status.lines().any(|l| l == "NoNewPrivs:\t1"), "{status}");
        })
        .join()
        .unwrap();
        // This thread is unfiltered.
        // SAFETY: getuid has no preconditions.
        assert!(unsafe { libc::syscall(libc::SYS_getuid) } >= 0);
    }

    #[test]
    fn vm_thread_filters_refuse_files_and_sockets() {
        for role in [Role::Vmm, Role::Vcpu, Role::Dhcp] {
            std::thread::spawn(move || {
                apply_thread_filter(role, Mismatch::Errno).unwrap();
                // SAFETY: open with a valid C string; it must fail.
                let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY) };
                assert_eq!((fd, errno()), (-1, Some(libc::EPERM)), "{role:?}");
                // SAFETY: plain socket call; it must fail.
                let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
                assert_eq!((fd, errno()), (-1, Some(libc::EPERM)), "{role:?}");
                // SAFETY: unlink with a valid C string; it must fail before touching anything.
                let r = unsafe { libc::unlink(c"/nonexistent-microvirt".as_ptr()) };
                assert_eq!((r, errno()), (-1, Some(libc::EPERM)), "{role:?}");
                // statx by path is refused; the VMM may stat a descriptor it holds.
                // SAFETY: statx with valid C strings and a buffer of the right type.
                let mut st: libc::statx = unsafe { std::mem::zeroed() };
                let r = unsafe {
                    libc::statx(libc::AT_FDCWD, c"/".as_ptr(), 0, libc::STATX_SIZE, &mut st)
                };
                assert_eq!((r, errno()), (-1, Some(libc::EPERM)), "{role:?}");
                // SAFETY: as above, on descriptor 0 with an empty path.
                let r = unsafe {
                    libc::statx(
                        0,
                        c"".as_ptr(),
                        libc::AT_EMPTY_PATH,
                        libc::STATX_SIZE,
                        &mut st,
                    )
                };
                let by_fd = (r, if r == 0 { None } else { errno() });
                if role != Role::Dhcp {
                    assert_ne!(by_fd.1, Some(libc::EPERM), "{role:?}");
                } else {
                    assert_eq!(by_fd, (-1, Some(libc::EPERM)), "{role:?}");
                }
                let spawned = std::thread::Builder::new().spawn(|| ());
                assert!(spawned.is_err(), "{role:?} must not start threads");
            })
            .join()
            .unwrap();
        }
    }

    /// Runs this test binary again with only `test` and `LAUNCHER_SECCOMP_VICTIM=<case>`, and
    /// returns how it ended.
    fn victim(test: &str, case: &str) -> std::process::Output {
        let exe = std::env::current_exe().unwrap();
        std::process::Command::new(exe)
            .args([test, "--exact", "--test-threads=1", "--nocapture"])
            .env("LAUNCHER_SECCOMP_VICTIM", case)
            .output()
            .unwrap()
    }

    /// The production mode kills the process on a forbidden system call, a forbidden ioctl
    /// request, a socket of another family, or a fork; and the VM filters on a file open.
    #[test]
    fn forbidden_calls_kill_the_process() {
        const NAME: &str = "seccomp::tests::forbidden_calls_kill_the_process";
        if let Ok(case) = std::env::var("LAUNCHER_SECCOMP_VICTIM") {
            apply_launcher_filter(Mismatch::KillProcess).unwrap();
            // SAFETY (all cases): system calls with valid arguments; the filter kills the
            // process before any of them does anything.
            unsafe {
                match case.as_str() {
                    "syscall" => {
                        libc::syscall(libc::SYS_getuid);
                    }
                    "ioctl" => {
                        let mut b = 0u8;
                        libc::ioctl(0, libc::TIOCSTI, &mut b);
                    }
                    "socket" => {
                        libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
                    }
                    "fork" => {
                        if libc::fork() == 0 {
                            libc::_exit(0);
                        }
                    }
                    "vmm-open" => {
                        apply_thread_filter(Role::Vmm, Mismatch::KillProcess).unwrap();
                        libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
                    }
                    "vcpu-socket" => {
                        apply_thread_filter(Role::Vcpu, Mismatch::KillProcess).unwrap();
                        libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                    }
                    "allowed" => {
                        // The control case: allowed calls do not kill.
                        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                        libc::close(fd);
                        std::thread::spawn(|| ()).join().unwrap();
                    }
                    other => panic!("unknown case {other}"),
                }
            }
            std::process::exit(0);
        }
        for case in [
            "syscall",
            "ioctl",
            "socket",
            "fork",
            "vmm-open",
            "vcpu-socket",
        ] {
            let out = victim(NAME, case);
            assert_eq!(out.status.signal(), Some(libc::SIGSYS), "{case}: {out:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains("virt-launcher: seccomp: thread ")
                    && err.contains(" made a forbidden system call "),
                "{case}: {err}"
            );
        }
        let out = victim(NAME, "allowed");
        assert_eq!(out.status.code(), Some(0), "{out:?}");
    }
}
