//! Running host tools (apt-get, make, mkfs.ext4, cpio ...) with clear errors.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Errors from running an external program.
#[derive(Debug, thiserror::Error)]
pub enum CmdError {
    /// The program could not be started at all.
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    /// The program ran and failed.
    #[error("`{cmdline}` failed ({status}){}", tail_suffix(.stderr))]
    Failed {
        cmdline: String,
        status: String,
        stderr: String,
    },
    /// A filesystem operation around a command failed.
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

fn tail_suffix(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    let start = lines.len().saturating_sub(15);
    if lines.is_empty() {
        String::new()
    } else {
        format!(":\n{}", lines[start..].join("\n"))
    }
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs `cmd`, inheriting stdout, capturing stderr for the error message.
pub fn run(cmd: &mut Command) -> Result<(), CmdError> {
    let cmdline = describe(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|source| CmdError::Spawn {
            program: cmd.get_program().to_string_lossy().into_owned(),
            source,
        })?;
    if out.status.success() {
        // Warnings on stderr are still worth seeing.
        let err = String::from_utf8_lossy(&out.stderr);
        if !err.trim().is_empty() && std::env::var_os("MICROVIRT_VERBOSE").is_some() {
            eprint!("{err}");
        }
        Ok(())
    } else {
        Err(CmdError::Failed {
            cmdline,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

/// Runs `cmd` and returns its stdout.
pub fn output(cmd: &mut Command) -> Result<String, CmdError> {
    let cmdline = describe(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| CmdError::Spawn {
            program: cmd.get_program().to_string_lossy().into_owned(),
            source,
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(CmdError::Failed {
            cmdline,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

/// Runs a shell snippet with `sh -c`.
pub fn sh(script: &str) -> Result<(), CmdError> {
    run(Command::new("sh").arg("-c").arg(script))
}

/// Single-quotes `p` for a shell snippet.
pub fn quote(p: &Path) -> String {
    format!("'{}'", p.to_string_lossy().replace('\'', "'\\''"))
}

/// `true` when the Debian package is installed.
pub fn dpkg_installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

/// Installed version of a Debian package.
pub fn dpkg_version(pkg: &str) -> Result<String, CmdError> {
    Ok(
        output(Command::new("dpkg-query").args(["-W", "-f=${Version}", pkg]))?
            .trim()
            .to_string(),
    )
}

/// Installs the missing ones of `pkgs` with apt-get (runs `apt-get update` once first).
pub fn ensure_packages(pkgs: &[&str]) -> Result<(), CmdError> {
    let missing: Vec<&str> = pkgs
        .iter()
        .copied()
        .filter(|p| !dpkg_installed(p))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("[setup] apt-get install {}", missing.join(" "));
    // update may fail offline; the install then reports the real problem.
    let _ = run(Command::new("apt-get").args(["update", "-q"]));
    run(Command::new("apt-get")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(&missing))
}

/// sha256 of the concatenated parts, as hex (uses coreutils `sha256sum`).
pub fn sha256_hex(parts: &[&[u8]]) -> Result<String, CmdError> {
    use std::io::Write;
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|source| CmdError::Spawn {
            program: "sha256sum".into(),
            source,
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        for p in parts {
            // Length-prefix each part so that boundaries count.
            let io = |source| CmdError::Io {
                what: "writing to",
                path: "sha256sum".into(),
                source,
            };
            stdin
                .write_all(&(p.len() as u64).to_le_bytes())
                .map_err(io)?;
            stdin.write_all(p).map_err(io)?;
        }
    }
    let out = child.wait_with_output().map_err(|source| CmdError::Io {
        what: "waiting for",
        path: "sha256sum".into(),
        source,
    })?;
    let s = String::from_utf8_lossy(&out.stdout);
    Ok(s.split_whitespace().next().unwrap_or_default().to_string())
}

/// Shared libraries (absolute paths) that `bin` loads, per `ldd`; empty for static binaries.
pub fn shared_libs(bin: &Path) -> Result<Vec<PathBuf>, CmdError> {
    let out = Command::new("ldd")
        .arg(bin)
        .output()
        .map_err(|source| CmdError::Spawn {
            program: "ldd".into(),
            source,
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut libs = Vec::new();
    for line in text.lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
        let path = match line.split_once("=>") {
            Some((_, rhs)) => rhs.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path {
            if p.starts_with('/') {
                libs.push(PathBuf::from(p));
            }
        }
    }
    Ok(libs)
}

/// `~/.cache/microvirt` (or `$MICROVIRT_CACHE`).
pub fn cache_root() -> PathBuf {
    if let Some(p) = std::env::var_os("MICROVIRT_CACHE") {
        return PathBuf::from(p);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".cache").join("microvirt")
}

/// Creates a directory and its parents.
pub fn mkdirs(p: &Path) -> Result<(), CmdError> {
    std::fs::create_dir_all(p).map_err(|source| CmdError::Io {
        what: "creating",
        path: p.to_path_buf(),
        source,
    })
}

/// Reads a file.
pub fn read(p: &Path) -> Result<Vec<u8>, CmdError> {
    std::fs::read(p).map_err(|source| CmdError::Io {
        what: "reading",
        path: p.to_path_buf(),
        source,
    })
}

/// Writes a file.
pub fn write(p: &Path, data: impl AsRef<[u8]>) -> Result<(), CmdError> {
    std::fs::write(p, data).map_err(|source| CmdError::Io {
        what: "writing",
        path: p.to_path_buf(),
        source,
    })
}

/// Copies a file (following symlinks) and keeps its permissions.
pub fn copy(from: &Path, to: &Path) -> Result<(), CmdError> {
    if let Some(parent) = to.parent() {
        mkdirs(parent)?;
    }
    std::fs::copy(from, to)
        .map(|_| ())
        .map_err(|source| CmdError::Io {
            what: "copying",
            path: from.to_path_buf(),
            source,
        })
}

/// Removes a directory tree if it exists.
pub fn remove_dir(p: &Path) -> Result<(), CmdError> {
    match std::fs::remove_dir_all(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(CmdError::Io {
            what: "removing",
            path: p.to_path_buf(),
            source,
        }),
    }
}

/// An exclusive lock between processes sharing the cache (e.g. two test binaries building the same
/// kernel): a directory created atomically, holding the owner's pid; a lock whose owner is gone is
/// taken over. Released on drop.
#[derive(Debug)]
pub struct CacheLock {
    path: PathBuf,
}

impl CacheLock {
    /// Blocks until the lock at `path` is ours; `what` is shown while waiting.
    pub fn acquire(path: &Path, what: &str) -> Result<CacheLock, CmdError> {
        if let Some(parent) = path.parent() {
            mkdirs(parent)?;
        }
        let mut said = false;
        loop {
            match std::fs::create_dir(path) {
                Ok(()) => {
                    write(&path.join("pid"), std::process::id().to_string())?;
                    return Ok(CacheLock {
                        path: path.to_path_buf(),
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let owner: Option<u32> = std::fs::read_to_string(path.join("pid"))
                        .ok()
                        .and_then(|s| s.trim().parse().ok());
                    let stale = match owner {
                        Some(pid) => !Path::new(&format!("/proc/{pid}")).exists(),
                        // Created but no pid yet: stale only if it stays so for a while.
                        None => std::fs::metadata(path)
                            .and_then(|m| m.modified())
                            .ok()
                            .and_then(|t| t.elapsed().ok())
                            .is_some_and(|age| age > std::time::Duration::from_secs(30)),
                    };
                    if stale {
                        let _ = std::fs::remove_dir_all(path);
                        continue;
                    }
                    if !said {
                        eprintln!(
                            "[cache] waiting for another process ({}) to finish {what}",
                            owner.map_or("starting".into(), |p| format!("pid {p}"))
                        );
                        said = true;
                    }
                    std::thread::sleep(std::time::Duration::from_secs(1));
                }
                Err(source) => {
                    return Err(CmdError::Io {
                        what: "creating lock",
                        path: path.to_path_buf(),
                        source,
                    })
                }
            }
        }
    }
}

impl Drop for CacheLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn cache_lock_excludes_and_recovers_from_dead_owner() {
        let dir = std::env::temp_dir().join(format!("microvirt-lock-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let lock = dir.join("x.lock");
        let first = CacheLock::acquire(&lock, "test").expect("first");
        let l2 = lock.clone();
        let t = Instant::now();
        let waiter = std::thread::spawn(move || {
            let _second = CacheLock::acquire(&l2, "test").expect("second");
            Instant::now()
        });
        std::thread::sleep(Duration::from_millis(1500));
        let released = Instant::now();
        drop(first);
        let got = waiter.join().expect("waiter");
        assert!(
            got >= released,
            "second lock taken while the first was held"
        );
        assert!(t.elapsed() < Duration::from_secs(10));
        // A lock left by a process that no longer exists is taken over.
        std::fs::create_dir_all(&lock).expect("fake lock");
        std::fs::write(lock.join("pid"), "2147483646").expect("fake pid");
        let t = Instant::now();
        let _third = CacheLock::acquire(&lock, "test").expect("takeover");
        assert!(t.elapsed() < Duration::from_secs(2));
        assert_eq!(
            std::fs::read_to_string(lock.join("pid")).expect("pid"),
            std::process::id().to_string()
        );
        drop(_third);
        assert!(!lock.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
