//! Build and test orchestration for microvirt: `cargo xtask <command>`.
//!
//! Each concern lives in its own module; this file only dispatches.

use anyhow::{bail, Result};

mod cluster;
mod images;
mod testhost;

fn usage() -> &'static str {
    "usage: cargo xtask <command>\n\
     commands:\n\
     \x20 test            set up this machine (packages, cached artifacts) and run every test\n\
     \x20 images          build (or find cached) the guest kernel + rootfs, print their paths\n\
     \x20 testhost [SCENARIO...|--list]  run end-to-end scenarios in the QEMU-TCG test host\n\
     \x20 bench-testhost [RUNS]  microvm vs QEMU -M microvm boot time and RSS in the test host\n\
     \x20 cluster up|down|status  a persistent private etcd + kube-apiserver on 127.0.0.1\n"
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cmd = args.first().map(String::as_str).unwrap_or("");
    let rest = args.get(1..).unwrap_or(&[]);
    match cmd {
        "help" | "-h" | "--help" => {
            print!("{}", usage());
            Ok(())
        }
        "cluster" => cluster::main(rest),
        "images" => images::main(rest),
        "testhost" => testhost::main(rest),
        "bench-testhost" => testhost::bench_main(rest),
        _ => {
            bail!("unknown command {cmd:?}\n{}", usage())
        }
    }
}
