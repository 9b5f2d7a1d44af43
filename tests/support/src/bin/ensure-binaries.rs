//! Builds (or finds cached) the Go binaries the tests run and prints their paths, e.g. to warm
//! the cache in CI before the tests run:
//! `cargo run -p microvirt-testsupport --bin ensure-binaries [-- --node]`.

use std::time::Instant;

use clap::Parser;

/// Build (or find cached) etcd and kube-apiserver, and with `--node` the node's binaries.
#[derive(Parser)]
#[command(name = "ensure-binaries")]
struct Args {
    /// Also kube-scheduler, kube-controller-manager, kubelet, containerd (+ shim, ctr) and pause.
    #[arg(long)]
    node: bool,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let t = Instant::now();
    let b = microvirt_testsupport::ensure_binaries()?;
    println!("etcd {}", b.etcd.display());
    println!("kube-apiserver {}", b.kube_apiserver.display());
    eprintln!("ensure_binaries took {:.1} s", t.elapsed().as_secs_f64());
    if args.node {
        let t = Instant::now();
        let n = microvirt_testsupport::ensure_node_binaries()?;
        for (name, path) in [
            ("kube-scheduler", &n.kube_scheduler),
            ("kube-controller-manager", &n.kube_controller_manager),
            ("kubelet", &n.kubelet),
            ("containerd", &n.containerd),
            ("containerd-shim-runc-v2", &n.containerd_shim),
            ("ctr", &n.ctr),
            ("pause", &n.pause),
        ] {
            println!("{name} {}", path.display());
        }
        eprintln!(
            "ensure_node_binaries took {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
