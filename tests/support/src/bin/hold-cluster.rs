//! Starts a (non-persistent) cluster, prints one line `<data dir> <etcd pid> <apiserver pid>`,
//! then waits until killed. The watchdog test kills it with SIGKILL to prove that a dying test
//! process does not leak etcd or kube-apiserver.

use std::io::Write;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cluster = microvirt_testsupport::Cluster::start(Default::default())?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{} {} {}",
        cluster.data_dir().display(),
        cluster.etcd_pid().unwrap_or(0),
        cluster.apiserver_pid().unwrap_or(0)
    )?;
    out.flush()?;
    drop(out);
    loop {
        std::thread::park();
    }
}
