//! Benchmark (not a test): masquerade setup and teardown time in a scratch network namespace,
//! and the process RSS after the runs. Needs root and `ip`.
//!
//! `cargo run --release -p microvirt-netsetup --example bench_setup [RUNS]`

use std::process::Command;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use netsetup::{netns, Binding, InterfaceSpec};

fn ip(args: &[&str]) -> Result<()> {
    let st = Command::new("ip").args(args).status().context("ip")?;
    ensure!(st.success(), "ip {}", args.join(" "));
    Ok(())
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let runs: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20);
    let ns = format!("mvbench-{}", std::process::id());
    let node = format!("{ns}-node");
    ip(&["netns", "add", &ns])?;
    ip(&["netns", "add", &node])?;
    let result = (|| -> Result<()> {
        ip(&[
            "link", "add", "eth0", "netns", &ns, "type", "veth", "peer", "name", "p", "netns",
            &node,
        ])?;
        ip(&["-n", &ns, "addr", "add", "192.168.78.2/24", "dev", "eth0"])?;
        ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        let path = std::path::PathBuf::from("/run/netns").join(&ns);
        let before = rss_kib();
        let (mut setup, mut teardown) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            let t = Instant::now();
            let net = netns::run_in_path(&path, || {
                netsetup::setup_pod_network(Binding::Masquerade, &InterfaceSpec::default())
            })??;
            setup.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            net.teardown()?;
            teardown.push(t.elapsed().as_secs_f64() * 1e3);
        }
        println!(
            "masquerade setup median {:.2} ms, teardown median {:.2} ms ({runs} runs); \
             RSS {} KiB before, {} KiB after",
            median(&mut setup),
            median(&mut teardown),
            before,
            rss_kib()
        );
        Ok(())
    })();
    let _ = ip(&["netns", "del", &ns]);
    let _ = ip(&["netns", "del", &node]);
    result
}
