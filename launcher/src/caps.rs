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
    retain_only(&[])
}

/// `CAP_NET_ADMIN` (linux/capability.h).
pub const CAP_NET_ADMIN: u32 = 12;

/// Drops every capability of the calling thread except `keep` (which stay permitted and
/// effective, and in the bounding set), and sets `no_new_privs`.
pub fn retain_only(keep: &[u32]) -> Result<(), CapsError> {
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
    for cap in (0..=last_cap()).filter(|c| !keep.contains(c)) {
        // SAFETY: prctl with integer arguments only. Without CAP_SETPCAP this fails with
        // EPERM; the bounding set then stays, but the permitted set below is empty anyway.
        unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
    }
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    for &cap in keep {
        let (word, bit) = ((cap / 32) as usize, 1u32 << (cap % 32));
        if let Some(d) = data.get_mut(word) {
            d.effective |= bit;
            d.permitted |= bit;
        }
    }
    // SAFETY: capset reads a v3 header and two data structs that we own; pid 0 = this thread.
    check("capset", unsafe {
        libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) as libc::c_int
    })
}

/// Becomes `uid`:`gid` for good (real, effective and saved ids), keeping the supplementary
/// groups the process has (a pod's `fsGroup` and `supplementalGroups`) plus `gid`. Leaving uid
/// 0 this way clears every capability. Needs CAP_SETUID and CAP_SETGID; call while the process
/// has a single thread (the ids are per thread).
pub fn become_user(uid: u32, gid: u32) -> Result<(), CapsError> {
    // SAFETY: getgroups(0, NULL) only returns the count.
    let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    check("getgroups", n)?;
    let mut groups = vec![0 as libc::gid_t; n as usize];
    // SAFETY: the buffer holds `n` entries.
    let n = unsafe { libc::getgroups(n, groups.as_mut_ptr()) };
    check("getgroups", n)?;
    groups.truncate(n as usize);
    groups.retain(|g| *g != 0);
    if !groups.contains(&gid) {
        groups.push(gid);
    }
    // SAFETY: setgroups reads `groups.len()` entries of the vector.
    check("setgroups", unsafe {
        libc::setgroups(groups.len(), groups.as_ptr())
    })?;
    // SAFETY: plain id changes with integer arguments.
    check("setresgid", unsafe { libc::setresgid(gid, gid, gid) })?;
    // SAFETY: as above.
    check("setresuid", unsafe { libc::setresuid(uid, uid, uid) })?;
    let (mut r, mut e, mut s) = (0, 0, 0);
    // SAFETY: getresuid writes three ids into our variables.
    check("getresuid", unsafe {
        libc::getresuid(&mut r, &mut e, &mut s)
    })?;
    if [r, e, s] != [uid; 3] {
        return Err(CapsError::Sys {
            op: "setresuid",
            source: std::io::Error::other(format!("ids are {r}/{e}/{s}, not {uid}")),
        });
    }
    Ok(())
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

    #[test]
    fn retaining_keeps_exactly_the_listed_capability() {
        std::thread::spawn(|| {
            super::retain_only(&[super::CAP_NET_ADMIN]).unwrap();
            assert_eq!(super::effective().unwrap(), 1 << super::CAP_NET_ADMIN);
            let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
            assert!(
                status.lines().any(|l| l == "CapPrm:\t0000000000001000"),
                "{status}"
            );
        })
        .join()
        .unwrap();
    }
}
