//! `cargo xtask bench-node [COUNT]`: VMI start-up latency and memory per VMI on a real
//! single-node cluster (see `microvirt_e2e::bench`). Brings its own cluster up (the machine's
//! node lock makes it wait for a running `cargo xtask cluster up` or test run) and tears it down.

use anyhow::{bail, Context, Result};
use microvirt_e2e::bench::{self, BenchOptions};
use microvirt_e2e::images::ImageSet;

pub fn main(args: &[String]) -> Result<()> {
    let mut o = BenchOptions::default();
    match args {
        [] => {}
        [n] => o.count = n.parse().context("COUNT must be a number")?,
        _ => bail!("usage: cargo xtask bench-node [COUNT]"),
    }
    let rc = microvirt_e2e::start_cluster(ImageSet::BENCH, false, None)?;
    let report = bench::run(&rc, &o)?;
    println!("{report}");
    drop(rc);
    Ok(())
}
