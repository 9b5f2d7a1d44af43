//! Network namespace helpers: identify the calling thread's namespace and run a closure in
//! another one (on a helper thread, so the caller's namespace never changes).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The calling thread's network namespace, as an open file (`/proc/thread-self/ns/net`).
pub fn current() -> io::Result<File> {
    File::open("/proc/thread-self/ns/net")
}

/// Whether two namespace files name the same namespace.
pub fn same(a: &File, b: &File) -> io::Result<bool> {
    let (ma, mb) = (a.metadata()?, b.metadata()?);
    Ok(ma.dev() == mb.dev() && ma.ino() == mb.ino())
}

/// Moves the calling thread into the network namespace `ns` (needs CAP_SYS_ADMIN).
pub fn enter(ns: &File) -> io::Result<()> {
    // SAFETY: setns on a valid namespace fd; it only changes this thread's namespace.
    let r = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Runs `f` in the network namespace `ns`: directly when the calling thread is already there,
/// else on a helper thread that enters it first.
pub fn run_in<T: Send>(ns: &File, f: impl FnOnce() -> T + Send) -> io::Result<T> {
    if same(&current()?, ns)? {
        return Ok(f());
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            enter(ns)?;
            Ok(f())
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("namespace helper thread panicked")))
    })
}

/// Runs `f` in the network namespace at `path` (e.g. `/run/netns/NAME`).
pub fn run_in_path<T: Send>(path: &Path, f: impl FnOnce() -> T + Send) -> io::Result<T> {
    let ns = File::open(path)?;
    run_in(&ns, f)
}
