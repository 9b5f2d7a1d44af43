//! The baseline the launcher pods are measured against: the simplest pod the node can start
//! (one container from the sandbox's own `pause` image, no volumes, no probes, no service
//! account token, no resources), created at the same rate in the same run.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use microvirt_testsupport::node::SANDBOX_IMAGE;
use microvirt_testsupport::RealCluster;

use super::{Seen, Shape, Watch};
use crate::kube::{wait_for, Kubectl};

/// A minimal pod named `name`, as JSON.
pub(crate) fn minimal_pod_json(name: &str) -> String {
    format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}"}},
"spec":{{"containers":[{{"name":"pause","image":"{SANDBOX_IMAGE}","imagePullPolicy":"Never"}}],
"automountServiceAccountToken":false,"enableServiceLinks":false,
"terminationGracePeriodSeconds":0}}}}"#
    )
}

/// Creates `count` minimal pods in `ns`, `interval` apart, and waits until every one runs.
pub(crate) fn minimal_pods(
    rc: &RealCluster,
    k: &Kubectl,
    ns: &str,
    count: usize,
    interval: Duration,
) -> Result<Shape> {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let epoch = Instant::now();
    let watch = Watch::start(k, ns, "pod", epoch, seen.clone())?;
    thread::sleep(Duration::from_secs(1));
    let names: Vec<String> = (0..count).map(|i| format!("pod-{i:03}")).collect();
    let mut starts = BTreeMap::new();
    let t0 = Instant::now();
    for (i, n) in names.iter().enumerate() {
        let due = t0 + interval * i as u32;
        if let Some(d) = due.checked_duration_since(Instant::now()) {
            thread::sleep(d);
        }
        starts.insert(n.clone(), epoch.elapsed());
        let r = rc.control_plane().request(
            "POST",
            &format!("/api/v1/namespaces/{ns}/pods"),
            Some(&minimal_pod_json(n)),
        )?;
        ensure!(
            r.status == 201,
            "creating a pod: HTTP {} {}",
            r.status,
            r.body
        );
    }
    wait_for(
        "every minimal pod Running",
        Duration::from_secs(600),
        |last| {
            let s = seen.lock().unwrap_or_else(|e| e.into_inner());
            let running = names
                .iter()
                .filter(|n| s.pod_running.contains_key(*n))
                .count();
            *last = format!("{running}/{count} Running");
            Ok((running == count).then_some(()))
        },
    )?;
    let wall = t0.elapsed();
    drop(watch);
    let seen = std::mem::take(&mut *seen.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(Shape {
        title: format!(
            "baseline: {count} minimal pods created {} ms apart",
            interval.as_millis()
        ),
        starts,
        seen,
        wall,
        from: "create",
        pods_started: true,
        vmis: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn the_minimal_pod_has_one_container_and_nothing_else() {
        let v: Value = serde_json::from_str(&minimal_pod_json("pod-001")).unwrap();
        let spec = &v["spec"];
        assert_eq!(spec["containers"].as_array().unwrap().len(), 1);
        assert_eq!(spec["containers"][0]["image"], SANDBOX_IMAGE);
        assert!(spec["volumes"].is_null());
        assert!(spec["containers"][0]["readinessProbe"].is_null());
        assert!(spec["containers"][0]["resources"].is_null());
        assert_eq!(spec["automountServiceAccountToken"], false);
    }
}
