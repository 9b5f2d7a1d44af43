//! `cargo xtask cluster up [--control-plane-only] | down | status`: a persistent private
//! cluster for people (and scripts) rather than tests.
//!
//! `up` starts a whole single-node cluster (etcd, kube-apiserver, kube-scheduler,
//! kube-controller-manager, containerd + runc + CNI bridge and a kubelet in a network namespace
//! of their own), imports microvirt's images into the node and applies `crds/` and `deploy/`,
//! and returns once the node can run a VMI (operator leading, virt-handler Ready, the KVM
//! resource allocatable): afterwards `kubectl apply -f deploy/examples/...` runs VMs. `--control-plane-only` starts just
//! etcd + kube-apiserver (no node, nothing installed). Control-plane state lives in
//! `~/.cache/microvirt/cluster/`, the node's in `/var/lib/microvirt-node` and
//! `/run/microvirt-node`; the processes outlive this command.

use std::path::Path;

use anyhow::{bail, Context, Result};
use microvirt_e2e::images::ImageSet;
use microvirt_testsupport::node::{self, teardown, NodeOptions};
use microvirt_testsupport::{detached, Cluster, ClusterOptions};

const USAGE: &str = "usage: cargo xtask cluster up [--control-plane-only] | down | status";

pub fn main(args: &[String]) -> Result<()> {
    let dir = detached::default_dir().context("locating the cluster state dir")?;
    let flags: Vec<&str> = args.iter().skip(1).map(String::as_str).collect();
    match (args.first().map(String::as_str), flags.as_slice()) {
        (Some("up"), []) => up(&dir, false),
        (Some("up"), ["--control-plane-only"]) => up(&dir, true),
        (Some("down"), []) => down(&dir),
        (Some("status"), []) => status(&dir),
        _ => bail!("{USAGE}"),
    }
}

fn node_opts() -> NodeOptions {
    NodeOptions::default()
}

fn node_running() -> bool {
    node::persistent_node_running(&node_opts().paths)
}

fn up(dir: &Path, control_plane_only: bool) -> Result<()> {
    let st = detached::status(dir);
    let has_node = node_running();
    if st.healthy() && has_node != control_plane_only {
        eprintln!(
            "cluster already running at {} (etcd pid {}, kube-apiserver pid {}{})",
            st.server_url.as_deref().unwrap_or("?"),
            st.etcd.unwrap_or(0),
            st.kube_apiserver.unwrap_or(0),
            if has_node { ", with its node" } else { "" }
        );
        println!("export KUBECONFIG={}", st.kubeconfig.display());
        return Ok(());
    }
    if st.any_running() || has_node {
        eprintln!(
            "stopping the previous cluster in {} (unhealthy, or of the other kind)",
            dir.display()
        );
    }
    down_quiet(dir)?;
    let kubeconfig = if control_plane_only {
        eprintln!(
            "starting etcd + kube-apiserver (state in {})",
            dir.display()
        );
        let cluster = Cluster::start(ClusterOptions {
            data_dir: Some(dir.to_path_buf()),
            persistent: true,
            // containerDisk and kernelBoot volumes are image volumes (beta, off by default in
            // 1.34).
            extra_apiserver_args: vec!["--feature-gates=ImageVolume=true".to_string()],
            ..Default::default()
        })?;
        eprintln!(
            "control plane up at {}: etcd pid {}, kube-apiserver pid {}; logs in {}; stop with \
             `cargo xtask cluster down`",
            cluster.server_url(),
            cluster.etcd_pid().unwrap_or(0),
            cluster.apiserver_pid().unwrap_or(0),
            cluster.data_dir().join("logs").display()
        );
        cluster.kubeconfig_path().to_path_buf()
    } else {
        eprintln!(
            "starting a single-node cluster (control plane state in {}, node in {}); a first \
             run builds the Kubernetes components, containerd and microvirt's images (minutes)",
            dir.display(),
            node_opts().paths.base().display()
        );
        let rc = microvirt_e2e::start_cluster(ImageSet::ALL, true, Some(dir.to_path_buf()))?;
        eprintln!(
            "cluster up at {}: node {} Ready, microvirt installed (namespace microvirt), \
             virt-handler Ready and devices.microvirt.io/kvm allocatable: ready for VMIs; logs \
             in {} and {}; stop with `cargo xtask cluster down`",
            rc.server_url(),
            rc.node_name(),
            rc.control_plane().data_dir().join("logs").display(),
            rc.node().options().paths.logs().display()
        );
        rc.kubeconfig_path().to_path_buf()
    };
    println!("export KUBECONFIG={}", kubeconfig.display());
    Ok(())
}

/// Stops whatever runs; true if anything did.
fn down_quiet(dir: &Path) -> Result<bool> {
    let opts = node_opts();
    let node_state = opts.paths.base().exists() || opts.paths.run().exists();
    let mut any = false;
    if node_state {
        let r = teardown::teardown(&opts.paths, &opts.cgroup_root);
        any |= !r.killed.is_empty();
        if !r.problems.is_empty() {
            eprintln!("node teardown: {}", r.problems.join("; "));
        }
        if !r.sysctls_restored.is_empty() {
            eprintln!("restored {}", r.sysctls_restored.join(", "));
        }
    }
    if dir.exists() {
        any |= detached::stop(dir).context("stopping the control plane")?;
    }
    Ok(any)
}

fn down(dir: &Path) -> Result<()> {
    if down_quiet(dir)? {
        println!("cluster stopped; removed {}", dir.display());
    } else {
        println!("no cluster was running");
    }
    Ok(())
}

fn status(dir: &Path) -> Result<()> {
    let st = detached::status(dir);
    let has_node = node_running();
    if !st.any_running() && !has_node {
        println!("not running");
        std::process::exit(1);
    }
    let pid = |p: Option<u32>| p.map_or_else(|| "not running".to_string(), |p| format!("pid {p}"));
    let paths = node_opts().paths;
    let procs = |names: &[&str]| teardown::node_processes(&paths, names).len();
    println!(
        "{}: etcd {}, kube-apiserver {}, {}",
        if st.healthy() { "running" } else { "degraded" },
        pid(st.etcd),
        pid(st.kube_apiserver),
        if st.ready { "ready" } else { "not ready" }
    );
    if has_node {
        println!(
            "node: kubelet {}, containerd {}, {} shim(s)",
            if procs(&["kubelet"]) > 0 {
                "running"
            } else {
                "not running"
            },
            if procs(&["containerd"]) > 0 {
                "running"
            } else {
                "not running"
            },
            procs(&["containerd-shim-runc-v2"])
        );
    } else {
        println!("node: none (control plane only)");
    }
    println!("server {}", st.server_url.as_deref().unwrap_or("?"));
    println!("export KUBECONFIG={}", st.kubeconfig.display());
    if !st.healthy() {
        std::process::exit(1);
    }
    Ok(())
}
