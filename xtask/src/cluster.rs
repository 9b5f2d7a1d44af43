//! `cargo xtask cluster up|down|status`: a persistent private etcd + kube-apiserver on
//! 127.0.0.1 for people (and scripts) rather than tests. State lives in
//! `~/.cache/microvirt/cluster/`; the processes outlive this command.

use std::path::Path;

use anyhow::{bail, Context, Result};
use microvirt_testsupport::{detached, Cluster, ClusterOptions};

const USAGE: &str = "usage: cargo xtask cluster up|down|status";

pub fn main(args: &[String]) -> Result<()> {
    let dir = detached::default_dir().context("locating the cluster state dir")?;
    match args.first().map(String::as_str) {
        Some("up") => up(&dir),
        Some("down") => down(&dir),
        Some("status") => status(&dir),
        _ => bail!("{USAGE}"),
    }
}

fn up(dir: &Path) -> Result<()> {
    let st = detached::status(dir);
    if st.healthy() {
        eprintln!(
            "cluster already running at {} (etcd pid {}, kube-apiserver pid {})",
            st.server_url.as_deref().unwrap_or("?"),
            st.etcd.unwrap_or(0),
            st.kube_apiserver.unwrap_or(0)
        );
        println!("export KUBECONFIG={}", st.kubeconfig.display());
        return Ok(());
    }
    if st.any_running() {
        eprintln!(
            "a previous cluster in {} is unhealthy; stopping it",
            dir.display()
        );
    }
    if dir.exists() {
        detached::stop(dir).context("clearing the previous cluster state")?;
    }
    eprintln!(
        "starting etcd + kube-apiserver (state in {})",
        dir.display()
    );
    let cluster = Cluster::start(ClusterOptions {
        data_dir: Some(dir.to_path_buf()),
        persistent: true,
        // containerDisk and kernelBoot volumes are image volumes (beta, off by default in 1.34).
        extra_apiserver_args: vec!["--feature-gates=ImageVolume=true".to_string()],
        ..Default::default()
    })?;
    eprintln!(
        "cluster up at {}: etcd pid {}, kube-apiserver pid {}; logs in {}; stop with `cargo xtask cluster down`",
        cluster.server_url(),
        cluster.etcd_pid().unwrap_or(0),
        cluster.apiserver_pid().unwrap_or(0),
        cluster.data_dir().join("logs").display()
    );
    let kubeconfig = cluster.kubeconfig_path().to_path_buf();
    drop(cluster); // persistent: the processes keep running
    println!("export KUBECONFIG={}", kubeconfig.display());
    Ok(())
}

fn down(dir: &Path) -> Result<()> {
    if detached::stop(dir)? {
        println!("cluster stopped; removed {}", dir.display());
    } else {
        println!("no cluster was running");
    }
    Ok(())
}

fn status(dir: &Path) -> Result<()> {
    let st = detached::status(dir);
    if !st.any_running() {
        println!("not running");
        std::process::exit(1);
    }
    let pid = |p: Option<u32>| p.map_or_else(|| "not running".to_string(), |p| format!("pid {p}"));
    println!(
        "{}: etcd {}, kube-apiserver {}, {}",
        if st.healthy() { "running" } else { "degraded" },
        pid(st.etcd),
        pid(st.kube_apiserver),
        if st.ready { "ready" } else { "not ready" }
    );
    println!("server {}", st.server_url.as_deref().unwrap_or("?"));
    println!("export KUBECONFIG={}", st.kubeconfig.display());
    if !st.healthy() {
        std::process::exit(1);
    }
    Ok(())
}
