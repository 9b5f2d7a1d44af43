//! Machine set-up shared by every xtask command: Debian packages, installed on demand.

use std::process::Command;
use std::sync::Once;

use anyhow::{bail, Context, Result};

static APT_UPDATE: Once = Once::new();

fn installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

/// Installs the Debian packages in `pkgs` that are missing (one `apt-get update` per run).
pub fn ensure_packages(pkgs: &[&str]) -> Result<()> {
    let missing: Vec<&str> = pkgs.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    println!("xtask: installing Debian packages: {}", missing.join(" "));
    let mut update_err = None;
    APT_UPDATE.call_once(|| {
        let st = Command::new("apt-get").args(["-qq", "update"]).status();
        if !matches!(st, Ok(s) if s.success()) {
            update_err = Some(format!("apt-get update failed: {st:?}"));
        }
    });
    if let Some(e) = update_err {
        bail!(e);
    }
    let st = Command::new("apt-get")
        .args(["-y", "-qq", "--no-install-recommends", "install"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .context("running apt-get (are you root?)")?;
    if !st.success() {
        bail!("apt-get install {} failed ({st})", missing.join(" "));
    }
    Ok(())
}
