//! Builds (or finds cached) etcd and kube-apiserver and prints their paths, e.g. to warm the
//! cache in CI before the tests run: `cargo run -p microvirt-testsupport --bin ensure-binaries`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let t = std::time::Instant::now();
    let b = microvirt_testsupport::ensure_binaries()?;
    println!("etcd {}", b.etcd.display());
    println!("kube-apiserver {}", b.kube_apiserver.display());
    eprintln!("ensure_binaries took {:.1} s", t.elapsed().as_secs_f64());
    Ok(())
}
