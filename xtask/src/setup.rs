//! Machine set-up shared by every xtask command: Debian packages, installed on demand.
//! The test-host crate owns the implementation (its tests install what they need too).

use anyhow::Result;

/// Installs the Debian packages in `pkgs` that are missing (`apt-get update` first).
pub fn ensure_packages(pkgs: &[&str]) -> Result<()> {
    microvirt_testhost::cmd::ensure_packages(pkgs)?;
    Ok(())
}
