//! Build and test orchestration for microvirt: `cargo xtask <command>`.
//!
//! Each concern lives in its own module; this file only dispatches.

use anyhow::{bail, Result};

mod cluster;

fn usage() -> &'static str {
    "usage: cargo xtask <command>\n\
     commands:\n\
     \x20 test            set up this machine (packages, cached artifacts) and run every test\n\
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
        _ => {
            bail!("unknown command {cmd:?}\n{}", usage())
        }
    }
}
