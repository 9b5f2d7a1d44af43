//! Starts a (non-persistent) cluster, prints one line `<data dir> <etcd pid> <apiserver pid>`,
//! then waits until killed. The watchdog tests kill it with SIGKILL to prove that a dying test
//! process leaks nothing: `hold-cluster` (etcd + kube-apiserver) in `tests/cluster.rs`,
//! `hold-cluster --real [--import ARCHIVE]...` (a whole node) in `tests/real_node.rs`.

use std::io::Write;
use std::path::PathBuf;

use clap::Parser;
use microvirt_testsupport::{Cluster, RealCluster, RealClusterOptions};

/// Hold a test cluster until killed.
#[derive(Parser)]
#[command(name = "hold-cluster")]
struct Args {
    /// A whole single-node cluster (`RealCluster`) instead of etcd + kube-apiserver.
    #[arg(long)]
    real: bool,
    /// OCI archives to import into the node's containerd (with --real).
    #[arg(long, requires = "real")]
    import: Vec<PathBuf>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let (_real, cluster);
    let control: &Cluster = if args.real {
        let rc = RealCluster::start(RealClusterOptions::default())?;
        for a in &args.import {
            rc.node().import_image(a)?;
        }
        _real = rc;
        _real.control_plane()
    } else {
        cluster = Cluster::start(Default::default())?;
        &cluster
    };
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{} {} {}",
        control.data_dir().display(),
        control.etcd_pid().unwrap_or(0),
        control.apiserver_pid().unwrap_or(0)
    )?;
    out.flush()?;
    drop(out);
    loop {
        std::thread::park();
    }
}
