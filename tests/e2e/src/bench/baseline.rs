//! The baseline the launcher pods are measured against: the simplest pod the node can start
//! (one container from the sandbox's own `pause` image, no volumes, no probes, no service
//! account token, no resources), created at the same rate in the same run.
//!
//! The ladder between the two (`--ladder`): the real launcher pod's spec, as the operator
//! rendered it for the warm-up VMI, with `pause` as its process instead of `virt-launcher`, and
//! then with one part of the spec after the other taken away, each shape started the same way,
//! so that the pod-start time is attributed to the parts of the spec.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use microvirt_testsupport::node::SANDBOX_IMAGE;
use microvirt_testsupport::RealCluster;

use serde_json::Value;

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

/// The steps of the ladder: from the launcher pod's own spec with `pause` as its process, each
/// step takes one more part away. `launcher_pod` is a launcher pod as read from the API.
pub(crate) fn ladder(launcher_pod: &Value) -> Result<Vec<(&'static str, Value)>> {
    let mut spec = launcher_pod["spec"].clone();
    let obj = spec
        .as_object_mut()
        .context("the launcher pod has no spec")?;
    // What the API server and the scheduler filled in: the new pods take the same path.
    for k in [
        "nodeName",
        "priority",
        "preemptionPolicy",
        "serviceAccount",
        "serviceAccountName",
        "hostname",
        "readinessGates",
    ] {
        obj.remove(k);
    }
    let c = spec["containers"][0]
        .as_object_mut()
        .context("the launcher pod has no container")?;
    c.insert("image".into(), SANDBOX_IMAGE.into());
    c.insert("command".into(), serde_json::json!(["/pause"]));
    c.insert("imagePullPolicy".into(), "Never".into());
    c.remove("args");
    let mut steps = vec![("launcher pod spec, pause as its process", spec.clone())];
    // Without the image volumes (kernelBoot.container's, containerDisks').
    retain_volumes(&mut spec, |v| v.get("image").is_none());
    steps.push(("  without its image volumes", spec.clone()));
    // Without the device-plugin resource.
    for side in ["requests", "limits"] {
        if let Some(r) = spec["containers"][0]["resources"][side].as_object_mut() {
            r.retain(|name, _| !name.starts_with("devices.microvirt.io/"));
        }
    }
    steps.push(("  and without /dev/kvm (device plugin)", spec.clone()));
    // Without any volume (the document's downward API, the runtime emptyDir).
    retain_volumes(&mut spec, |_| false);
    steps.push(("  and without any volume", spec.clone()));
    // Without resources and security contexts: the minimal pod but for its env and hostname.
    spec["containers"][0]
        .as_object_mut()
        .map(|c| (c.remove("resources"), c.remove("securityContext")));
    spec.as_object_mut().map(|s| s.remove("securityContext"));
    steps.push(("  and without resources, security contexts", spec));
    Ok(steps)
}

/// Keeps the volumes for which `keep` holds, and only their mounts.
fn retain_volumes(spec: &mut Value, keep: impl Fn(&Value) -> bool) {
    let Some(vols) = spec["volumes"].as_array_mut() else {
        return;
    };
    let gone: Vec<String> = vols
        .iter()
        .filter(|v| !keep(v))
        .filter_map(|v| v["name"].as_str().map(str::to_string))
        .collect();
    vols.retain(|v| keep(v));
    if let Some(mounts) = spec["containers"][0]["volumeMounts"].as_array_mut() {
        mounts.retain(|m| !gone.iter().any(|g| m["name"] == g.as_str()));
    }
}

/// Creates `count` minimal pods in `ns`, `interval` apart, and waits until every one runs.
pub(crate) fn minimal_pods(
    rc: &RealCluster,
    k: &Kubectl,
    ns: &str,
    count: usize,
    interval: Duration,
) -> Result<Shape> {
    let body = |name: &str| minimal_pod_json(name);
    let title = format!(
        "baseline: {count} minimal pods created {} ms apart",
        interval.as_millis()
    );
    pods(rc, k, ns, count, interval, title, &body)
}

/// Creates `count` pods with `spec` in `ns`, `interval` apart, and waits until every one runs.
pub(crate) fn pods_with_spec(
    rc: &RealCluster,
    k: &Kubectl,
    ns: &str,
    count: usize,
    interval: Duration,
    title: String,
    spec: &Value,
) -> Result<Shape> {
    let body = |name: &str| {
        serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": spec})
        .to_string()
    };
    pods(rc, k, ns, count, interval, title, &body)
}

fn pods(
    rc: &RealCluster,
    k: &Kubectl,
    ns: &str,
    count: usize,
    interval: Duration,
    title: String,
    body: &dyn Fn(&str) -> String,
) -> Result<Shape> {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let epoch = Instant::now();
    let watch = Watch::start(k, ns, "pod", epoch, seen.clone())?;
    thread::sleep(Duration::from_secs(1));
    let names: Vec<String> = (0..count).map(|i| format!("pod-{i:03}")).collect();
    let mut starts = BTreeMap::new();
    let cpu0 = super::cpu::Sample::take()?;
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
            Some(&body(n)),
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
    let started = super::cpu::usage(&cpu0, &super::cpu::Sample::take()?);
    drop(watch);
    let seen = std::mem::take(&mut *seen.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(Shape {
        title,
        starts,
        seen,
        wall,
        from: "create",
        pods_started: true,
        vmis: false,
        cpu: Some(started),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ladder_takes_the_parts_of_the_launcher_pod_away_one_by_one() {
        let pod = serde_json::json!({"spec": {
            "nodeName": "n", "priority": 0, "hostname": "h",
            "readinessGates": [{"conditionType": "microvirt.io/vm-running"}],
            "securityContext": {"fsGroup": 107},
            "containers": [{"name": "compute", "image": "microvirt/virt-launcher:dev",
                "command": ["virt-launcher", "pod"],
                "securityContext": {"runAsUser": 0},
                "resources": {"requests": {"cpu": "10m", "devices.microvirt.io/kvm": "1"},
                              "limits": {"devices.microvirt.io/kvm": "1", "memory": "64Mi"}},
                "volumeMounts": [{"name": "vmi"}, {"name": "runtime"}, {"name": "kernel-boot"}]}],
            "volumes": [{"name": "vmi", "downwardAPI": {}}, {"name": "runtime", "emptyDir": {}},
                        {"name": "kernel-boot", "image": {"reference": "k"}}]}});
        let steps = ladder(&pod).unwrap();
        assert_eq!(steps.len(), 5);
        let full = &steps[0].1;
        assert!(full["nodeName"].is_null() && full["priority"].is_null());
        assert_eq!(full["containers"][0]["image"], SANDBOX_IMAGE);
        assert_eq!(full["containers"][0]["command"][0], "/pause");
        assert_eq!(full["volumes"].as_array().unwrap().len(), 3);
        let no_image = &steps[1].1;
        assert_eq!(no_image["volumes"].as_array().unwrap().len(), 2);
        assert_eq!(
            no_image["containers"][0]["volumeMounts"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
        assert!(
            no_image["containers"][0]["resources"]["limits"]["devices.microvirt.io/kvm"]
                .is_string()
        );
        let no_kvm = &steps[2].1;
        assert!(
            no_kvm["containers"][0]["resources"]["limits"]["devices.microvirt.io/kvm"].is_null()
        );
        assert_eq!(
            no_kvm["containers"][0]["resources"]["limits"]["memory"],
            "64Mi"
        );
        let no_vols = &steps[3].1;
        assert!(no_vols["volumes"].as_array().unwrap().is_empty());
        assert!(no_vols["containers"][0]["volumeMounts"]
            .as_array()
            .unwrap()
            .is_empty());
        let bare = &steps[4].1;
        assert!(bare["containers"][0]["resources"].is_null());
        assert!(bare["securityContext"].is_null());
    }

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
