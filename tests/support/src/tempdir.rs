//! A scratch directory for one test.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A fresh, empty directory under [`std::env::temp_dir`], removed with everything in it when
/// dropped.
///
/// The name is `mvt-<tag>-<pid>-<n>`, `n` counting up within the process, so test threads and
/// test processes running side by side never share one. It is created with `mkdir` (never
/// reused): a directory of that name left by an earlier process with the same pid is skipped,
/// not emptied. The name stays short because tests put Unix sockets in it (108-byte paths).
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates the directory; panics (naming the path) if it cannot, as a test has no use for
    /// a scratch directory that is not there.
    pub fn new(tag: &str) -> TempDir {
        Self::create(tag).unwrap_or_else(|e| {
            panic!(
                "creating a scratch directory mvt-{tag}-* in {}: {e}",
                std::env::temp_dir().display()
            )
        })
    }

    fn create(tag: &str) -> io::Result<TempDir> {
        static N: AtomicU64 = AtomicU64::new(0);
        let base = std::env::temp_dir();
        let pid = std::process::id();
        loop {
            let n = N.fetch_add(1, Ordering::Relaxed);
            let path = base.join(format!("mvt-{tag}-{pid}-{n}"));
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(TempDir { path }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `name` inside the directory.
    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.path.join(name)
    }
}

/// A `TempDir` can stand where a `&Path` is wanted (`&dir`, `dir.join(…)`, `dir.display()`).
impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_dir_is_new_and_empty_and_removed_with_its_contents_on_drop() {
        let a = TempDir::new("kit");
        let b = TempDir::new("kit");
        assert_ne!(a.path(), b.path());
        for d in [&a, &b] {
            assert!(d.path().is_dir());
            assert!(d.path().starts_with(std::env::temp_dir()));
            assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
        }
        let name = a.path().file_name().unwrap().to_str().unwrap().to_owned();
        assert!(
            name.starts_with(&format!("mvt-kit-{}-", std::process::id())),
            "{name}"
        );
        let as_path: &Path = &a;
        assert_eq!(as_path, a.path());
        std::fs::create_dir_all(a.join("x/y")).unwrap();
        std::fs::write(a.join("x/y/f"), b"data").unwrap();
        let (pa, pb) = (a.path().to_owned(), b.path().to_owned());
        drop(a);
        assert!(!pa.exists(), "{} left behind", pa.display());
        assert!(pb.is_dir(), "dropping one removed the other");
        drop(b);
        assert!(!pb.exists());
    }

    #[test]
    fn a_stale_dir_of_the_same_name_is_skipped_not_emptied() {
        let probe = TempDir::new("stale");
        let n: u64 = probe
            .path()
            .to_str()
            .unwrap()
            .rsplit('-')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        // Directories "left by an earlier process with our pid" under the next names the
        // counter gives out (names another test thread took meanwhile are left alone).
        let pid = std::process::id();
        let mut stale = Vec::new();
        for i in 1..=16 {
            let s = std::env::temp_dir().join(format!("mvt-stale-{pid}-{}", n + i));
            if std::fs::create_dir(&s).is_ok() {
                std::fs::write(s.join("keep"), b"not yours").unwrap();
                stale.push(s);
            }
        }
        let fresh = TempDir::new("stale");
        let taken = fresh.path().to_owned();
        assert!(!stale.contains(&taken), "{} reused", taken.display());
        assert_eq!(std::fs::read_dir(fresh.path()).unwrap().count(), 0);
        drop(fresh);
        for s in &stale {
            assert_eq!(std::fs::read(s.join("keep")).unwrap(), b"not yours");
            std::fs::remove_dir_all(s).unwrap();
        }
    }
}
