//! A Python container image for the OCI-image VM tests (docs/oci-images.md), from Debian's
//! packages only: `mmdebstrap --variant=extract` of `python3` (the interpreter and its standard
//! library with their libraries, no shell, no package scripts run) and `base-passwd`'s user
//! database as `/etc/passwd` and `/etc/group`, packed as `rootfs.tar`, with an OCI image
//! configuration (`config.json`: Entrypoint `python3`, Cmd `-V`, `PATH`, `LANG`,
//! `PYTHONUNBUFFERED`, WorkingDir `/srv`), the shape of Docker Hub's `python:3-slim` but without
//! a registry. Cached under `~/.cache/microvirt/oci-python/<hash>/`, keyed by python3's
//! candidate version and this recipe.

use std::path::PathBuf;
use std::process::Command;

use crate::cmd;
use crate::stock::{candidate, StockError};

/// Bump when the recipe changes what it produces.
const RECIPE_VERSION: &[u8] = b"microvirt-oci-python-v1";

/// The image's OCI configuration (the config blob's shape; only `config` is read).
pub const CONFIG: &str = r#"{"architecture": "amd64", "os": "linux",
 "config": {"Entrypoint": ["python3"], "Cmd": ["-V"],
            "Env": ["PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", "PYTHONUNBUFFERED=1"],
            "WorkingDir": "/srv"}}
"#;

/// The built image.
#[derive(Debug, Clone)]
pub struct PythonImage {
    /// python3's Debian version.
    pub version: String,
    /// The image's files.
    pub rootfs_tar: PathBuf,
    /// Its OCI configuration.
    pub config: PathBuf,
}

impl PythonImage {
    /// `(environment variable, file)` for the scenarios (`$PY_ROOTFS_TAR`, `$PY_CONFIG`).
    pub fn guest_files(&self) -> Vec<(String, PathBuf)> {
        vec![
            ("PY_ROOTFS_TAR".into(), self.rootfs_tar.clone()),
            ("PY_CONFIG".into(), self.config.clone()),
        ]
    }
}

/// Builds (or finds cached) the image. Installs `mmdebstrap` first when missing.
pub fn build() -> Result<PythonImage, StockError> {
    cmd::ensure_packages(&["mmdebstrap"])?;
    let version = candidate("python3")?;
    let hash = cmd::sha256_hex(&[RECIPE_VERSION, CONFIG.as_bytes(), version.as_bytes()])?;
    let dir = cmd::cache_root().join("oci-python").join(&hash[..16]);
    let image = PythonImage {
        version,
        rootfs_tar: dir.join("rootfs.tar"),
        config: dir.join("config.json"),
    };
    if dir.join("done").exists() {
        return Ok(image);
    }
    let _lock = cmd::CacheLock::acquire(
        &cmd::cache_root().join("oci-python.lock"),
        "the Python image",
    )?;
    if dir.join("done").exists() {
        return Ok(image);
    }
    crate::stock::progress("building the Python OCI image (mmdebstrap --variant=extract python3)");
    cmd::remove_dir(&dir)?;
    cmd::mkdirs(&dir)?;
    let root = dir.join("rootfs");
    cmd::run(
        Command::new("mmdebstrap")
            .args([
                "--variant=extract",
                "--include=python3,base-passwd",
                "--dpkgopt=path-exclude=/usr/share/doc/*",
                "--dpkgopt=path-exclude=/usr/share/man/*",
                "--dpkgopt=path-exclude=/usr/share/locale/*",
                crate::stock::SUITE,
            ])
            .arg(&root),
    )?;
    // What base-passwd's postinst would write; /srv is the working directory.
    cmd::sh(&format!(
        "cd {r} && cp usr/share/base-passwd/passwd.master etc/passwd && \
         cp usr/share/base-passwd/group.master etc/group && mkdir -p srv && \
         tar -cf {tar} -C {r} .",
        r = cmd::quote(&root),
        tar = cmd::quote(&image.rootfs_tar),
    ))?;
    cmd::remove_dir(&root)?;
    cmd::write(&image.config, CONFIG.as_bytes())?;
    cmd::write(&dir.join("done"), b"")?;
    Ok(image)
}
