//! Embeds the test guest (guest-images/testguest, PVH ELF) in `virt-launcher` as the built-in
//! demo guest. The guest is built by a nested cargo with its own target directory inside
//! OUT_DIR, so it never waits on the outer build's target-directory lock. Its bzImage is left
//! in OUT_DIR for the launcher's tests.

use std::path::PathBuf;

fn main() {
    let out = match std::env::var_os("OUT_DIR") {
        Some(o) => PathBuf::from(o),
        None => {
            eprintln!("OUT_DIR is not set");
            std::process::exit(1);
        }
    };
    let guest = testguest_build::guest_dir();
    for p in [
        "src",
        "Cargo.toml",
        "Cargo.lock",
        "build.rs",
        "link.ld.in",
        ".cargo/config.toml",
    ] {
        println!("cargo:rerun-if-changed={}", guest.join(p).display());
    }
    println!("cargo:rerun-if-changed=build.rs");
    let artifacts = match testguest_build::build_in(&out.join("testguest")) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("building the demo guest failed: {e}");
            std::process::exit(1);
        }
    };
    // The test guest as a bzImage, for tests that put it on a disk image as the image's own
    // kernel (tests/bootdisk.rs); not embedded in the binary.
    let bz = out.join("testguest-bzImage");
    if let Err(e) = std::fs::copy(&artifacts.bzimage, &bz) {
        eprintln!(
            "copying {} to {}: {e}",
            artifacts.bzimage.display(),
            bz.display()
        );
        std::process::exit(1);
    }
    let dest = out.join("demo-guest.elf");
    if let Err(e) = std::fs::copy(&artifacts.pvh, &dest) {
        eprintln!(
            "copying {} to {}: {e}",
            artifacts.pvh.display(),
            dest.display()
        );
        std::process::exit(1);
    }
}
