//! microvirt on a real single-node cluster ([`microvirt_testsupport::RealCluster`]): its
//! container images ([`images`]), installing `crds/` and `deploy/` ([`deploy`]), and `kubectl`
//! helpers for the whole-system tests in `tests/node.rs` ([`kube`]).
//!
//! `cargo xtask cluster up` and `cargo xtask oci-images` use this crate too, so people get
//! exactly the cluster the tests run on.

pub mod bench;
pub mod bench_pool;
pub mod deploy;
pub mod images;
pub mod kube;

use std::path::PathBuf;

use anyhow::{Context, Result};
use microvirt_testsupport::{RealCluster, RealClusterOptions};

/// Debian packages a node needs on this machine (runc, the CNI plugins, nft for the node's
/// namespace, iproute2's `ip`).
pub const NODE_PACKAGES: &[&str] = &[
    "runc",
    "containernetworking-plugins",
    "nftables",
    "iproute2",
    "util-linux",
];

/// Everything `up` does: packages, images, the cluster, microvirt installed on it.
pub fn start_cluster(
    images: images::ImageSet,
    persistent: bool,
    data_dir: Option<PathBuf>,
) -> Result<RealCluster> {
    let step = |what: &str, t: std::time::Instant| {
        eprintln!("[cluster] {what}: {:.1} s", t.elapsed().as_secs_f64());
    };
    let t = std::time::Instant::now();
    microvirt_testhost::cmd::ensure_packages(NODE_PACKAGES)
        .context("installing the node's packages")?;
    let built = images::build(images)?;
    step("images", t);
    let t = std::time::Instant::now();
    let rc = RealCluster::start(RealClusterOptions {
        data_dir,
        persistent,
        ..Default::default()
    })
    .context("starting the cluster")?;
    step("cluster up, node Ready", t);
    let t = std::time::Instant::now();
    deploy::install(&rc, &built).context("installing microvirt")?;
    step("microvirt installed, operator leading", t);
    Ok(rc)
}
