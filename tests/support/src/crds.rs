//! Waiting for CustomResourceDefinitions to be established.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// How long the tests give freshly applied CRDs to become established.
pub const CRDS_ESTABLISHED_WITHIN: Duration = Duration::from_secs(120);

/// Waits until every CRD in `names` (`virtualmachineinstances.microvirt.io`, …) has the condition
/// `Established=True`, asking the API server with `kubectl --kubeconfig KUBECONFIG get crd`, for
/// at most `timeout`. The error names the CRDs still waited for and what was last read of them.
///
/// Not `kubectl wait --for=condition=Established`: a CRD whose status has no conditions yet (the
/// API server's CRD controller had not written them when kubectl first read it) makes kubectl
/// fail at once with `.status.conditions accessor error: <nil> is of the type <nil>` instead of
/// waiting — seen on a busy machine (docs/testing.md, run H).
pub fn wait_crds_established(
    kubeconfig: &Path,
    names: &[&str],
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let mut pending: Vec<(&str, String)> = names.iter().map(|n| (*n, String::new())).collect();
    loop {
        for (name, last) in pending.iter_mut() {
            *last = established(kubeconfig, name);
        }
        pending.retain(|(_, last)| last != "True");
        if pending.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let what: Vec<String> = pending
                .iter()
                .map(|(n, last)| format!("{n}: {last}"))
                .collect();
            return Err(format!(
                "CRDs not established within {timeout:?}: {}",
                what.join("; ")
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The status of `name`'s `Established` condition ("True"), or what kubectl said instead.
fn established(kubeconfig: &Path, name: &str) -> String {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args([
            "get",
            "crd",
            name,
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Established\")].status}",
        ])
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let s = String::from_utf8_lossy(&o.stdout).trim().to_string();
            if s.is_empty() {
                "no Established condition yet".into()
            } else {
                s
            }
        }
        Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
        Err(e) => format!("running kubectl: {e}"),
    }
}
