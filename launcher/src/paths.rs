//! Names that become paths, and files opened without following symbolic links.
//!
//! Disk and volume names end up in file and mount paths (`<root>/empty-disks/<volume>/disk.img`,
//! `<runtime>/<disk>.overlay`): they must be DNS labels (the CRD refuses anything else at
//! `kubectl apply`; the launcher checks again, since it also reads local YAML). The VMI name
//! must be a DNS subdomain (it names the run-mode runtime directory).
//!
//! Files the launcher hands to the VMM inside the pod's directories (volume images, the kernel,
//! overlays, cloud-init images, emptyDisks) are opened by [`open_beneath`]: component by
//! component from a directory descriptor, never following a symbolic link (a link planted in an
//! image or a PVC cannot redirect the guest's disk to another file). The launcher keeps the
//! descriptor and gives the VMM `/proc/self/fd/N`, which reopens exactly that file.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters (RFC 1123 label, as Kubernetes).
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    let inner = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-';
    let edge = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.len() <= 63
        && b.iter().all(inner)
        && b.first().is_some_and(edge)
        && b.last().is_some_and(edge)
}

/// DNS labels joined by dots, at most 253 characters (Kubernetes object names).
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// Why a name is refused, for error messages.
pub const DNS_LABEL_RULE: &str = "must be a DNS label (lowercase letters, digits and '-', \
     starting and ending with a letter or digit, at most 63 characters)";

/// How [`open_beneath`] opens the last component.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    ReadOnly,
    ReadWrite,
    /// Read-write, created (mode 0644) or truncated; missing directories are created (0755).
    Create,
}

fn errno_path(source: io::Error, root: &Path, rel: &Path) -> io::Error {
    let shown = root.join(rel);
    match source.raw_os_error() {
        Some(libc::ELOOP) | Some(libc::ENOTDIR) => io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: a component is a symbolic link or not a directory (links are not followed)",
                shown.display()
            ),
        ),
        _ => io::Error::new(source.kind(), format!("{}: {source}", shown.display())),
    }
}

fn cstr(name: &std::ffi::OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// Opens `root/rel` without following a symbolic link anywhere in `rel` (`root` itself is
/// trusted and may be one). `rel` must be relative and have no `..`.
pub fn open_beneath(root: &Path, rel: &Path, mode: OpenMode) -> io::Result<File> {
    let names: Vec<&std::ffi::OsStr> = rel
        .components()
        .filter(|c| *c != Component::CurDir)
        .map(|c| match c {
            Component::Normal(n) => Ok(n),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: must be a relative path without '..'", rel.display()),
            )),
        })
        .collect::<io::Result<_>>()?;
    let Some((last, dirs)) = names.split_last() else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "empty path".to_string(),
        ));
    };
    let err = |e| errno_path(e, root, rel);
    let root_c = cstr(root.as_os_str()).map_err(err)?;
    // SAFETY: open with a valid C string; the descriptor is owned by `dir` right after.
    let fd = unsafe {
        libc::open(
            root_c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(err(io::Error::last_os_error()));
    }
    // SAFETY: `fd` is fresh and owned here.
    let mut dir = unsafe { File::from_raw_fd(fd) };
    for name in dirs {
        let c = cstr(name).map_err(err)?;
        if mode == OpenMode::Create {
            // SAFETY: mkdirat relative to our directory descriptor with a valid C string.
            let r = unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), 0o755) };
            if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
                return Err(err(io::Error::last_os_error()));
            }
        }
        // SAFETY: openat relative to our directory descriptor with a valid C string.
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(err(io::Error::last_os_error()));
        }
        // SAFETY: `fd` is fresh and owned here.
        dir = unsafe { File::from_raw_fd(fd) };
    }
    let flags = match mode {
        OpenMode::ReadOnly => libc::O_RDONLY,
        OpenMode::ReadWrite => libc::O_RDWR,
        OpenMode::Create => libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC,
    };
    let c = cstr(last).map_err(err)?;
    // SAFETY: openat relative to our directory descriptor with a valid C string; the mode
    // argument is read only with O_CREAT.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY,
            0o644 as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(err(io::Error::last_os_error()));
    }
    // SAFETY: `fd` is fresh and owned here.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// A path through which this process reopens exactly the file `f` (while `f` is open).
pub fn proc_path(f: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()))
}

/// Creates a new directory `parent/<prefix>-<random>` (mode 0700) that did not exist before, so
/// no one else's file or link can be in the way (run mode's runtime directory in /tmp).
pub fn private_dir(parent: &Path, prefix: &str) -> io::Result<PathBuf> {
    for _ in 0..16 {
        let mut r = [0u8; 6];
        // SAFETY: getrandom writes at most `r.len()` bytes into `r`.
        if unsafe { libc::getrandom(r.as_mut_ptr().cast(), r.len(), 0) } != r.len() as isize {
            return Err(io::Error::last_os_error());
        }
        let suffix: String = r.iter().map(|b| format!("{b:02x}")).collect();
        let p = parent.join(format!("{prefix}-{suffix}"));
        let c = cstr(p.as_os_str())?;
        // SAFETY: mkdir with a valid C string.
        if unsafe { libc::mkdir(c.as_ptr(), 0o700) } == 0 {
            return Ok(p);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(io::Error::new(e.kind(), format!("{}: {e}", p.display())));
        }
    }
    Err(io::Error::other("no free runtime directory name"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names() {
        for ok in ["a", "root", "data-1", "0", "a".repeat(63).as_str()] {
            assert!(is_dns_label(ok), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "Root",
            "a_b",
            "a.b",
            "../pvcs/data",
            "a/b",
            "..",
            "a b",
            "é",
            "a".repeat(64).as_str(),
        ] {
            assert!(!is_dns_label(bad), "{bad}");
        }
        assert!(is_dns_subdomain("web.example-1"));
        for bad in ["", "a..b", ".a", "a/b", "../x", "A"] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
    }

    #[test]
    fn links_are_not_followed_beneath_the_root() {
        let d = microvirt_testsupport::TempDir::new("launcher-paths-links");
        std::fs::create_dir_all(d.join("root/vol")).unwrap();
        std::fs::write(d.join("secret"), b"keep").unwrap();
        std::os::unix::fs::symlink(d.join("secret"), d.join("root/vol/disk.img")).unwrap();
        std::os::unix::fs::symlink(d.join("."), d.join("root/linkdir")).unwrap();
        let root = d.join("root");
        for mode in [OpenMode::ReadOnly, OpenMode::ReadWrite, OpenMode::Create] {
            let e = open_beneath(&root, Path::new("vol/disk.img"), mode).unwrap_err();
            assert!(e.to_string().contains("symbolic link"), "{e}");
        }
        let e = open_beneath(&root, Path::new("linkdir/secret"), OpenMode::ReadOnly).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read(d.join("secret")).unwrap(), b"keep");
        let e = open_beneath(&root, Path::new("../secret"), OpenMode::ReadOnly).unwrap_err();
        assert!(e.to_string().contains("without '..'"), "{e}");
        // Creating makes the directories; the file is reopened through /proc.
        let f = open_beneath(&root, Path::new("new/dir/file"), OpenMode::Create).unwrap();
        std::fs::write(proc_path(&f), b"via proc").unwrap();
        assert_eq!(
            std::fs::read(root.join("new/dir/file")).unwrap(),
            b"via proc"
        );
    }

    #[test]
    fn private_dirs_are_new_and_private() {
        use std::os::unix::fs::PermissionsExt;
        let d = microvirt_testsupport::TempDir::new("launcher-paths-private");
        let a = private_dir(&d, "x").unwrap();
        let b = private_dir(&d, "x").unwrap();
        assert_ne!(a, b);
        let mode = std::fs::metadata(&a).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }
}
