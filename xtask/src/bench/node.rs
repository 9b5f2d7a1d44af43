//! `cargo xtask bench-node [COUNT] [--interval-ms MS] [--idle-secs S]`: VMI start-up latency
//! against minimal pods started the same way (creates MS apart, default 100), memory per VMI and the node's CPU per idle VMI (S-second windows,
//! default 30) on a real single-node cluster (see `microvirt_e2e::bench`); `--ladder` also
//! starts the launcher pod's spec with `pause` as its process, one part of the spec taken
//! away after the other, to attribute the pod-start time.
//! `cargo xtask bench-node --pool [COUNT] [--rounds N] [--guest-mib MIB]`: a cold VMIRS scaled
//! 0 → COUNT against a VM pool with COUNT warm members scaled 0 → COUNT, and the node memory of
//! the idle warm members (see `microvirt_e2e::bench_pool`).
//! Brings its own cluster up (the machine's node lock makes it wait for a running
//! `cargo xtask cluster up` or test run) and tears it down.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use microvirt_e2e::bench::{self, BenchOptions};
use microvirt_e2e::bench_pool::{self, PoolBenchOptions};
use microvirt_e2e::images::ImageSet;

const USAGE: &str = "usage: cargo xtask bench-node [COUNT] [--interval-ms MS] [--idle-secs S] \
                     [--ladder] | --pool [COUNT] [--rounds N] [--guest-mib MIB] [--idle-secs S]";

/// The number after option `name`.
fn number<'a>(it: &mut impl Iterator<Item = &'a &'a str>, name: &str) -> Result<u64> {
    it.next()
        .with_context(|| format!("{name} needs a value\n{USAGE}"))?
        .parse()
        .with_context(|| format!("{name} must be a number"))
}

/// The idle-CPU window of `--idle-secs` (at least one second).
fn idle_secs<'a>(it: &mut impl Iterator<Item = &'a &'a str>) -> Result<Duration> {
    match number(it, "--idle-secs")? {
        0 => bail!("--idle-secs must be at least 1"),
        s => Ok(Duration::from_secs(s)),
    }
}

fn count(arg: &str) -> Result<usize> {
    arg.parse()
        .with_context(|| format!("COUNT must be a number\n{USAGE}"))
}

pub fn main(args: &[String]) -> Result<()> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    if let Some(("--pool", rest)) = args.split_first().map(|(a, r)| (*a, r)) {
        let mut o = PoolBenchOptions::default();
        let mut it = rest.iter();
        while let Some(a) = it.next() {
            match *a {
                "--rounds" => o.rounds = (number(&mut it, "--rounds")? as usize).max(1),
                "--idle-secs" => o.idle_window = idle_secs(&mut it)?,
                "--guest-mib" => {
                    o.guest_mib = u32::try_from(number(&mut it, "--guest-mib")?)
                        .context("--guest-mib is too large")?
                }
                n => o.count = count(n)?,
            }
        }
        let rc = microvirt_e2e::start_cluster(ImageSet::BENCH, false, None)?;
        let report = bench_pool::run(&rc, &o)?;
        println!("{report}");
        drop(rc);
        return Ok(());
    }
    let mut o = BenchOptions::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match *a {
            "--ladder" => o.ladder = true,
            "--interval-ms" => {
                o.interval = Duration::from_millis(number(&mut it, "--interval-ms")?)
            }
            "--idle-secs" => o.idle_window = idle_secs(&mut it)?,
            n => o.count = count(n)?,
        }
    }
    let rc = microvirt_e2e::start_cluster(ImageSet::BENCH, false, None)?;
    let report = bench::run(&rc, &o)?;
    println!("{report}");
    drop(rc);
    Ok(())
}
