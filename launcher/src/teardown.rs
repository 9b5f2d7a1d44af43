//! The pod-network teardown helper of `virt-launcher run --pod-network`.
//!
//! Run mode removes the pod network when the launcher exits, and that needs CAP_NET_ADMIN,
//! while every launcher thread runs without capabilities. So before the launcher drops them
//! (while it is still single-threaded) it forks this helper: a process that keeps only
//! CAP_NET_ADMIN, does nothing but wait for the launcher to close a pipe (which also happens
//! when the launcher is killed), then undoes the network configuration and exits. Pod mode
//! needs no helper: the pod's network namespace goes away with the pod.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::caps;

#[derive(Debug, thiserror::Error)]
pub enum TeardownError {
    #[error("{op}: {source}")]
    Sys {
        op: &'static str,
        source: std::io::Error,
    },
    #[error("the teardown helper {0}")]
    Helper(String),
}

fn sys_err(op: &'static str) -> TeardownError {
    TeardownError::Sys {
        op,
        source: std::io::Error::last_os_error(),
    }
}

/// The running helper. [`TeardownHelper::finish`] (or drop) makes it tear down and waits.
pub struct TeardownHelper {
    pid: libc::pid_t,
    /// Closing it is the helper's signal to start.
    pipe: Option<OwnedFd>,
}

/// Forks the helper for `net` and makes the launcher's own copy leave the network in place.
/// Call it while the process has only one thread (before any thread is spawned).
pub fn spawn(net: &mut netsetup::NetSetup) -> Result<TeardownHelper, TeardownError> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(sys_err("pipe2"));
    }
    // SAFETY: both descriptors were just created and are owned here.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: fork in a process with a single thread; the child only runs `helper_main` and
    // then `_exit`s.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(sys_err("fork"));
    }
    if pid == 0 {
        drop(wr);
        let code = helper_main(&rd, net);
        // SAFETY: ends the helper without running the launcher's destructors or atexit code.
        unsafe { libc::_exit(code) };
    }
    drop(rd);
    net.keep_on_drop();
    Ok(TeardownHelper {
        pid,
        pipe: Some(wr),
    })
}

/// The helper process: a copy of the launcher at the moment of the fork.
fn helper_main(pipe: &OwnedFd, net: &netsetup::NetSetup) -> i32 {
    // SAFETY: this process is a copy of the launcher; the launcher's `NetSetup` is never used
    // nor dropped here (the helper ends with `_exit`), so this bitwise copy is its only owner
    // in this process.
    let net: netsetup::NetSetup = unsafe { std::ptr::read(net) };
    // SAFETY: prctl with a valid NUL-terminated name.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"net-teardown".as_ptr(), 0, 0, 0) };
    // stdin and stdout belong to the guest console; keep stderr for warnings.
    // SAFETY: open with a valid C string; dup2 onto the standard descriptors.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::dup2(null, 1);
            libc::close(null);
        }
    }
    if let Err(e) = caps::retain_only(&[caps::CAP_NET_ADMIN]) {
        log::warn!("pod network teardown helper: {e}");
    }
    let mut b = [0u8; 1];
    loop {
        // SAFETY: reads at most one byte into `b`.
        let n = unsafe { libc::read(pipe.as_raw_fd(), b.as_mut_ptr().cast(), 1) };
        if n == 0 {
            break;
        }
        if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            break;
        }
    }
    match net.teardown() {
        Ok(()) => 0,
        Err(e) => {
            log::warn!("pod network teardown: {e}");
            1
        }
    }
}

impl TeardownHelper {
    /// Lets the helper remove the network and waits for it.
    pub fn finish(mut self) -> Result<(), TeardownError> {
        self.finish_inner()
    }

    fn finish_inner(&mut self) -> Result<(), TeardownError> {
        let Some(pipe) = self.pipe.take() else {
            return Ok(());
        };
        drop(pipe);
        let mut status = 0;
        loop {
            // SAFETY: waits for our own child and writes its status into `status`.
            let r = unsafe { libc::waitpid(self.pid, &mut status, 0) };
            if r == self.pid {
                break;
            }
            if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                return Err(sys_err("waitpid"));
            }
        }
        if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
            Ok(())
        } else {
            Err(TeardownError::Helper(format!(
                "ended with status {status:#x}"
            )))
        }
    }
}

impl Drop for TeardownHelper {
    fn drop(&mut self) {
        if let Err(e) = self.finish_inner() {
            log::warn!("pod network teardown: {e}");
        }
    }
}
