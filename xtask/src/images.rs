//! `cargo xtask images`: build (or find cached) the guest kernel and rootfs and print their paths.

use anyhow::Result;
use microvirt_testhost::images;

pub fn main(_args: &[String]) -> Result<()> {
    let t = std::time::Instant::now();
    let (img, times) = images::build()?;
    for (step, secs) in &times.steps {
        eprintln!("[images] {step}: {secs:.1} s");
    }
    eprintln!(
        "[images] {} in {:.1} s",
        if times.cached { "cached" } else { "built" },
        t.elapsed().as_secs_f64()
    );
    println!("vmlinux={}", img.vmlinux.display());
    println!("bzimage={}", img.bzimage.display());
    println!("rootfs={}", img.rootfs.display());
    println!("config={}", img.config.display());
    Ok(())
}
