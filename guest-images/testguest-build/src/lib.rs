//! Builds microvirt's test guest (`guest-images/testguest`, a `no_std` crate outside the
//! workspace) with a nested `cargo build --release`, and wraps its 64-bit entry in a bzImage.
//!
//! ```no_run
//! let a = testguest_build::build()?;
//! println!("{} {} {}", a.pvh.display(), a.linux64.display(), a.bzimage.display());
//! # anyhow::Ok(())
//! ```

pub mod bzimage;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The guest images produced by [`build`].
#[derive(Debug, Clone)]
pub struct Artifacts {
    /// ELF with the PVH note: the VMM enters `_start_pvh` in 32-bit protected mode.
    pub pvh: PathBuf,
    /// ELF without the note: the VMM uses the 64-bit Linux boot protocol at `e_entry`.
    pub linux64: PathBuf,
    /// bzImage wrapping the `linux64` image (64-bit entry at load address + 0x200).
    pub bzimage: PathBuf,
}

/// What can go wrong building the guest.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("running {cargo} for the test guest: {source}")]
    Spawn {
        cargo: String,
        source: std::io::Error,
    },
    #[error("cargo build of the test guest failed ({status}):\n{stderr}")]
    Cargo {
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("the test guest build did not produce {0}")]
    Missing(PathBuf),
    #[error("making the bzImage from {path}: {source}")]
    BzImage {
        path: PathBuf,
        source: bzimage::BzImageError,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// `guest-images/` of the checkout being built or tested: found above the `CARGO_MANIFEST_DIR`
/// cargo gives the running build script or test (a checkout's own path), else this crate's
/// compile-time directory. Not only the latter: a target directory shared by two checkouts
/// reuses this crate compiled in the other one, and a path baked in there points at the other
/// checkout (or at one since deleted: "running cargo for the test guest: No such file or
/// directory" in a loaded run on 2026-12-05).
fn images_dir() -> PathBuf {
    let compiled = Path::new(env!("CARGO_MANIFEST_DIR"));
    let compiled = compiled.parent().unwrap_or(compiled).to_path_buf();
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .and_then(|dir| find_images_dir(&dir))
        .unwrap_or(compiled)
}

/// The first `guest-images/` holding `testguest/Cargo.toml` in `start` or a directory above it.
fn find_images_dir(start: &Path) -> Option<PathBuf> {
    start
        .ancestors()
        .map(|d| d.join("guest-images"))
        .find(|d| d.join("testguest").join("Cargo.toml").is_file())
}

/// The guest crate's directory (`guest-images/testguest`).
pub fn guest_dir() -> PathBuf {
    images_dir().join("testguest")
}

/// The workspace root (two levels above this crate).
pub fn workspace_dir() -> PathBuf {
    let images = images_dir();
    images.parent().unwrap_or(&images).to_path_buf()
}

/// `<workspace>/target/testguest`, where the nested build puts everything.
pub fn target_dir() -> PathBuf {
    workspace_dir().join("target").join("testguest")
}

/// Environment variables of an outer cargo/rustc that must not leak into the nested build.
fn is_outer_build_var(name: &str) -> bool {
    const KEEP: &[&str] = &[
        "CARGO_HOME",
        "CARGO_NET_OFFLINE",
        "CARGO_HTTP_TIMEOUT",
        "CARGO_TERM_COLOR",
    ];
    if KEEP.contains(&name)
        || name.starts_with("CARGO_REGISTRIES_")
        || name.starts_with("CARGO_HTTP_")
    {
        return false;
    }
    name.starts_with("CARGO_")
        || matches!(
            name,
            "CARGO"
                | "RUSTFLAGS"
                | "RUSTDOCFLAGS"
                | "RUSTC"
                | "RUSTDOC"
                | "RUSTC_WRAPPER"
                | "RUSTC_WORKSPACE_WRAPPER"
                | "RUSTC_LINKER"
                | "MAKEFLAGS"
                | "MFLAGS"
                | "OUT_DIR"
                | "TARGET"
                | "HOST"
                | "OPT_LEVEL"
                | "PROFILE"
                | "DEBUG"
                | "NUM_JOBS"
        )
}

/// Builds the guest (a no-op for cargo when nothing changed) and returns the image paths.
pub fn build() -> anyhow::Result<Artifacts> {
    Ok(build_in(&target_dir())?)
}

/// [`build`] with an explicit cargo target directory.
pub fn build_in(target_dir: &Path) -> Result<Artifacts, BuildError> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(&cargo);
    for (name, _) in std::env::vars_os() {
        if let Some(n) = name.to_str() {
            if is_outer_build_var(n) {
                cmd.env_remove(n);
            }
        }
    }
    cmd.current_dir(guest_dir())
        .args(["build", "--release", "--quiet", "--bins"])
        .arg("--target-dir")
        .arg(target_dir);
    let out = cmd.output().map_err(|source| BuildError::Spawn {
        cargo: Path::new(&cargo).display().to_string(),
        source,
    })?;
    if !out.status.success() {
        return Err(BuildError::Cargo {
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let bin_dir = target_dir.join("x86_64-unknown-linux-gnu").join("release");
    let pvh = bin_dir.join("testguest-pvh");
    let linux64 = bin_dir.join("testguest-linux64");
    for p in [&pvh, &linux64] {
        if !p.is_file() {
            return Err(BuildError::Missing(p.clone()));
        }
    }
    let elf = std::fs::read(&linux64).map_err(|source| BuildError::Write {
        path: linux64.clone(),
        source,
    })?;
    let image = bzimage::from_elf(&elf).map_err(|source| BuildError::BzImage {
        path: linux64.clone(),
        source,
    })?;
    let bzimage = target_dir.join("testguest.bzImage");
    write_if_changed(&bzimage, &image)?;
    Ok(Artifacts {
        pvh,
        linux64,
        bzimage,
    })
}

/// Writes `data` to `path` unless it already holds exactly that, via a temporary file and a
/// rename so concurrent readers never see a partial file.
fn write_if_changed(path: &Path, data: &[u8]) -> Result<(), BuildError> {
    if std::fs::read(path).is_ok_and(|old| old == data) {
        return Ok(());
    }
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let err = |source| BuildError::Write {
        path: path.to_path_buf(),
        source,
    };
    std::fs::write(&tmp, data).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checkout_is_found_above_the_running_crate() {
        // A second "checkout" somewhere else: its guest-images/ is found from any of its crates.
        let root =
            std::env::temp_dir().join(format!("testguest-build-find-{}", std::process::id()));
        let guest = root.join("guest-images/testguest");
        std::fs::create_dir_all(&guest).unwrap();
        std::fs::create_dir_all(root.join("launcher/src")).unwrap();
        std::fs::write(guest.join("Cargo.toml"), "[package]\n").unwrap();
        assert_eq!(
            find_images_dir(&root.join("launcher")),
            Some(root.join("guest-images"))
        );
        assert_eq!(
            find_images_dir(&root.join("launcher/src")),
            Some(root.join("guest-images"))
        );
        std::fs::remove_file(guest.join("Cargo.toml")).unwrap();
        assert_eq!(find_images_dir(&root.join("launcher")), None);
        std::fs::remove_dir_all(&root).unwrap();
        // This checkout, from this crate's own directory (where cargo runs its tests).
        assert_eq!(
            images_dir(),
            Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
        );
    }

    #[test]
    fn outer_build_vars_are_filtered() {
        for v in [
            "CARGO_PKG_NAME",
            "CARGO_MANIFEST_DIR",
            "RUSTFLAGS",
            "CARGO_ENCODED_RUSTFLAGS",
            "CARGO",
            "CARGO_TARGET_DIR",
        ] {
            assert!(is_outer_build_var(v), "{v}");
        }
        for v in [
            "CARGO_HOME",
            "PATH",
            "HOME",
            "RUSTUP_TOOLCHAIN",
            "CARGO_REGISTRIES_CRATES_IO_PROTOCOL",
        ] {
            assert!(!is_outer_build_var(v), "{v}");
        }
    }
}
