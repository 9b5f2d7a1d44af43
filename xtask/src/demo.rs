//! `cargo xtask demo [MICROVM ARGS...]`: the main job for a newcomer — build `microvm`
//! and the test guest, then boot the guest on /dev/kvm with the console on this terminal.

use std::process::Command;

use anyhow::{bail, Context, Result};

pub fn main(args: &[String]) -> Result<()> {
    let root = crate::workspace_root();
    let microvm = crate::bench::build_release_microvm(&root)?;
    let guest = testguest_build::build()?;
    let mut cmd = Command::new(&microvm);
    cmd.arg("--kernel").arg(&guest.pvh);
    if !args.iter().any(|a| a == "--vcpus") {
        cmd.args(["--vcpus", "2"]);
    }
    cmd.args(args);
    println!(
        "xtask: {} --kernel {} ...",
        microvm.display(),
        guest.pvh.display()
    );
    let st = cmd.status().context("running microvm")?;
    if !st.success() {
        bail!("microvm exited with {st}");
    }
    Ok(())
}
