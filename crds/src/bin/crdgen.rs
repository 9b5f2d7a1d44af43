//! Writes one YAML file per microvirt CRD.
//!
//! `cargo run -p microvirt-crds --bin crdgen [DIR]` (default DIR: the `crds/` directory of this crate).

use std::path::PathBuf;

use anyhow::{Context, Result};

fn main() -> Result<()> {
    let dir = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    for (file, crd) in microvirt_crds::all_crds() {
        let path = dir.join(&file);
        let yaml = microvirt_crds::render_yaml(&crd)?;
        std::fs::write(&path, yaml).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
