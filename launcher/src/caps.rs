//! Dropping capabilities once the launcher no longer needs them (after network setup).
//!
//! Capabilities are per thread, so this runs on the main thread before any other thread is
//! spawned (threads inherit the sets of their creator). It clears the ambient set, the
//! bounding set (where CAP_SETPCAP allows), and the effective, permitted and inheritable sets,
//! and sets `no_new_privs` so no exec can gain privileges back.

#[derive(Debug, thiserror::Error)]
pub enum CapsError {
    #[error("{op}: {source}")]
    Sys {
        op: &'static str,
        source: std::io::Error,
    },
}

fn check(op: &'static str, rc: libc::c_int) -> Result<(), CapsError> {
    if rc < 0 {
        Err(CapsError::Sys {
            op,
            source: std::io::Error::last_os_error(),
        })
    } else {
        Ok(())
    }
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40)
}

/// Drops every capability of the calling thread (and of threads it creates afterwards).
pub fn drop_all() -> Result<(), CapsError> {
    // SAFETY: prctl with integer arguments only.
    check("PR_SET_NO_NEW_PRIVS", unsafe {
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    })?;
    // SAFETY: prctl with integer arguments only.
    check("PR_CAP_AMBIENT_CLEAR_ALL", unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    })?;
    for cap in 0..=last_cap() {
        // SAFETY: prctl with integer arguments only. Without CAP_SETPCAP this fails with
        // EPERM; the bounding set then stays, but the permitted set below is empty anyway.
        unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
    }
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData::default(); 2];
    // SAFETY: capset reads a v3 header and two data structs that we own; pid 0 = this thread.
    check("capset", unsafe {
        libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) as libc::c_int
    })
}

/// The calling thread's effective capability set.
pub fn effective() -> Result<u64, CapsError> {
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget writes two data structs into our array.
    check("capget", unsafe {
        libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) as libc::c_int
    })?;
    Ok(u64::from(data[0].effective) | (u64::from(data[1].effective) << 32))
}

#[cfg(test)]
mod tests {
    #[test]
    fn dropping_empties_the_thread_sets() {
        std::thread::spawn(|| {
            super::drop_all().unwrap();
            assert_eq!(super::effective().unwrap(), 0);
            let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
            assert!(
                status.lines().any(|l| l == "CapPrm:\t0000000000000000"),
                "{status}"
            );
            assert!(status.lines().any(|l| l == "NoNewPrivs:\t1"), "{status}");
            // A privileged operation now fails even as root.
            // SAFETY: sethostname is given a valid buffer; it must fail with EPERM.
            let rc = unsafe { libc::sethostname(c"x".as_ptr(), 1) };
            assert_eq!(rc, -1);
        })
        .join()
        .unwrap();
    }
}
