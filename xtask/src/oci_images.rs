//! `cargo xtask oci-images`: build (or find cached) microvirt's container images as OCI
//! archives and print one line per image: `<name> <manifest digest> <archive path>`.
//! deploy/README.md says how to push them to a registry.

use anyhow::{bail, Result};
use microvirt_e2e::images::{self, ImageSet};

pub fn main(args: &[String]) -> Result<()> {
    let set = match args {
        [] => ImageSet::ALL,
        [a] if a == "--no-linux" => ImageSet {
            linux_guest: false,
            ..ImageSet::ALL
        },
        _ => bail!("usage: cargo xtask oci-images [--no-linux]"),
    };
    let t = std::time::Instant::now();
    for b in images::build(set)? {
        println!("{} {} {}", b.name, b.manifest_digest, b.archive.display());
    }
    eprintln!("[oci-images] done in {:.1} s", t.elapsed().as_secs_f64());
    Ok(())
}
