//! Per-process scratch directories for the targets that need real files (disk images,
//! overlays), removed when the process exits normally.
//!
//! Two file systems are used on purpose: tmpfs (`/dev/shm`, fast; no `FALLOC_FL_ZERO_RANGE`, so
//! the backends' fallback path runs) and the temporary directory's file system (normally the
//! root file system, with native zero-range). `MICROVIRT_FUZZ_SCRATCH` overrides the tmpfs one.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

static DIRS: OnceLock<[PathBuf; 2]> = OnceLock::new();

extern "C" fn remove_dirs() {
    if let Some(dirs) = DIRS.get() {
        for d in dirs {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

fn make(parent: &Path, tag: &str) -> PathBuf {
    let d = parent.join(format!("microvirt-fuzz-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d)
        .unwrap_or_else(|e| panic!("cannot create the scratch directory {}: {e}", d.display()));
    d
}

/// Scratch directory number `which` (0: tmpfs, 1: the temporary directory).
pub fn dir(which: usize) -> &'static Path {
    let dirs = DIRS.get_or_init(|| {
        let shm = std::env::var_os("MICROVIRT_FUZZ_SCRATCH")
            .map(PathBuf::from)
            .or_else(|| Some(PathBuf::from("/dev/shm")).filter(|p| p.is_dir()))
            .unwrap_or_else(std::env::temp_dir);
        let dirs = [make(&shm, "shm"), make(&std::env::temp_dir(), "tmp")];
        // SAFETY: registers a plain `extern "C" fn()` with no captured state; it only reads the
        // `OnceLock` that is initialised by now.
        unsafe { libc::atexit(remove_dirs) };
        dirs
    });
    &dirs[which % 2]
}

/// `name` made unique per thread (the corpus tests run targets on several threads at once).
pub fn file_name(name: &str) -> String {
    let t = format!("{:?}", std::thread::current().id());
    let t: String = t.chars().filter(char::is_ascii_digit).collect();
    format!("t{t}-{name}")
}
