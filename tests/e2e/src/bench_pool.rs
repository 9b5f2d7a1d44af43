//! The real-node pool benchmark (`cargo xtask bench-node --pool [COUNT]`): a cold
//! VirtualMachineInstanceReplicaSet scaled 0 → COUNT against a VirtualMachinePool with COUNT
//! warm members scaled 0 → COUNT, same VMI template (idle demo guest, 256 MiB by default), one
//! run on one node; and the node memory of COUNT idle warm members against COUNT running cold
//! VMIs.
//!
//! Intervals run from the scale (a PUT of the scale subresource, as an autoscaler writes it)
//! to the first watch event showing each VMI Running and Ready, as in [`crate::bench`]. A cold replica pays for a
//! pod start and a guest boot; a claimed one for the claim's API writes, the node agent's
//! control call and the VMI status (docs/pools.md). The pool's own `status.claimLatency`
//! (measured by the operator, from its claim to the VMI's Ready) is reported next to it.
//! Rounds alternate cold and warm, so both see the same machine load.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use microvirt_testsupport::RealCluster;
use serde_json::Value;

use crate::bench::cpu;
use crate::bench::{
    guest_spec_json, memory_report, ms, percentiles, post_vmi, vmi_json, wait_all_ready,
    BenchOptions, MemoryTotals, Seen, Shape, Watch,
};
use crate::kube::{condition_true, wait_for, Kubectl, TestNamespace};

/// Pool benchmark parameters.
#[derive(Debug, Clone)]
pub struct PoolBenchOptions {
    /// Replicas per shape, and warm members of the pool.
    pub count: usize,
    /// Guest memory (MiB).
    pub guest_mib: u32,
    /// Cold/warm rounds (alternating).
    pub rounds: usize,
    /// Length of each idle-CPU window (empty cluster, running cold VMIs, idle warm members).
    pub idle_window: Duration,
}

impl Default for PoolBenchOptions {
    fn default() -> Self {
        Self {
            count: 20,
            guest_mib: 256,
            rounds: 1,
            idle_window: Duration::from_secs(30),
        }
    }
}

/// How long COUNT VMIs may take to become Ready, or COUNT warm members to restore.
const SLOW: Duration = Duration::from_secs(600);
/// Resource names (plural) of the two kinds compared.
const RS: &str = "virtualmachineinstancereplicasets";
const POOLS: &str = "virtualmachinepools";
/// Scale-outs by one replica measured after the big one.
const SINGLES: usize = 5;

fn vmirs_json(name: &str, guest_mib: u32) -> String {
    format!(
        r#"{{"apiVersion":"microvirt.io/v1alpha1","kind":"VirtualMachineInstanceReplicaSet",
"metadata":{{"name":"{name}"}},"spec":{{"replicas":0,"selector":{{"matchLabels":{{"app":"{name}"}}}},
"template":{{"metadata":{{"labels":{{"app":"{name}"}}}},"spec":{}}}}}}}"#,
        guest_spec_json(guest_mib)
    )
}

fn pool_json(name: &str, o: &PoolBenchOptions) -> String {
    format!(
        r#"{{"apiVersion":"microvirt.io/v1alpha1","kind":"VirtualMachinePool",
"metadata":{{"name":"{name}"}},"spec":{{"replicas":0,"selector":{{"matchLabels":{{"app":"{name}"}}}},
"warm":{{"min":{n},"max":{n},"snapshot":{{"captureTimeoutSeconds":120}}}},
"template":{{"metadata":{{"labels":{{"app":"{name}"}}}},"spec":{}}}}}}}"#,
        guest_spec_json(o.guest_mib),
        n = o.count
    )
}

fn create(rc: &RealCluster, ns: &str, plural: &str, body: &str) -> Result<()> {
    let r = rc.control_plane().request(
        "POST",
        &format!("/apis/microvirt.io/v1alpha1/namespaces/{ns}/{plural}"),
        Some(body),
    )?;
    ensure!(
        r.status == 201,
        "creating {plural}: HTTP {} {}",
        r.status,
        r.body
    );
    Ok(())
}

/// Launcher pods of the namespace that are not being deleted.
fn live_pods(k: &Kubectl, ns: &str) -> Result<Vec<Value>> {
    Ok(
        k.list(ns, "pod", Some("app.kubernetes.io/name=virt-launcher"))?
            .into_iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .collect(),
    )
}

/// Waits until the namespace has no VMI and no launcher process of it is left on the node.
fn wait_empty(k: &Kubectl, ns: &str) -> Result<()> {
    wait_for("the namespace's VMIs and pods gone", SLOW, |last| {
        let v = k.list(ns, "vmi", None)?;
        let p = k.list(ns, "pod", Some("app.kubernetes.io/name=virt-launcher"))?;
        *last = format!("{} VMIs, {} pods", v.len(), p.len());
        Ok((v.is_empty() && p.is_empty()).then_some(()))
    })
}

/// Waits until the pool has `n` Ready warm members restored from a Ready snapshot; returns the
/// pool.
fn wait_warm(k: &Kubectl, ns: &str, name: &str, n: usize) -> Result<Value> {
    wait_for(&format!("{n} warm members"), SLOW, |last| {
        let p = k.get(ns, "vmpool", name)?.context("the pool is gone")?;
        let warm = k
            .list(
                ns,
                "pod",
                Some(&format!(
                    "microvirt.io/pool={name},microvirt.io/pool-role=warm"
                )),
            )?
            .into_iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .filter(|p| condition_true(p, "Ready"))
            .count();
        *last = format!("{warm} Ready warm pods, status {}", p["status"]);
        Ok((p["status"]["snapshot"]["phase"] == "Ready"
            && p["status"]["warmReplicas"] == n
            && warm == n)
            .then_some(p))
    })
}

/// Scales `kind/name` to `n` and measures scale → each new VMI Running and Ready (VMIs that
/// existed before the scale are not counted).
fn measure_scale(
    rc: &RealCluster,
    k: &Kubectl,
    ns: &str,
    plural: &str,
    name: &str,
    n: usize,
    pods_started: bool,
) -> Result<Shape> {
    let before: Vec<String> = k
        .list(ns, "vmi", Some(&format!("app={name}")))?
        .iter()
        .filter_map(|v| v["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let epoch = Instant::now();
    let w1 = Watch::start(k, ns, "vmi", epoch, seen.clone())?;
    let w2 = Watch::start(k, ns, "pod", epoch, seen.clone())?;
    // The scale subresource (no kubectl start-up in the interval): read it, then PUT it with
    // the new replica count and without its resourceVersion, as `kubectl scale` writes it. With
    // the resourceVersion (an HPA's update) a pool status write in between — the refill of the
    // previous claim — answers 409, and the read and write again doubled the interval (+~100 ms
    // here): that measured the client's retry, not the claim.
    let path = format!("/apis/microvirt.io/v1alpha1/namespaces/{ns}/{plural}/{name}/scale");
    let scale_body = || -> Result<String> {
        let r = rc.control_plane().request("GET", &path, None)?;
        ensure!(
            r.status == 200,
            "reading {path}: HTTP {} {}",
            r.status,
            r.body
        );
        let mut scale: Value = serde_json::from_str(&r.body).context("the Scale object")?;
        scale["spec"]["replicas"] = n.into();
        if let Some(m) = scale["metadata"].as_object_mut() {
            m.remove("resourceVersion");
        }
        Ok(scale.to_string())
    };
    let mut body = scale_body()?;
    thread::sleep(Duration::from_secs(1));
    // Connected (TLS handshake done) before the interval starts, as an autoscaler's client is.
    let conn = rc.control_plane().connect()?;
    let t0 = Instant::now();
    let scaled_at = epoch.elapsed();
    let mut conn = Some(conn);
    let mut answered = None;
    for attempt in 1.. {
        let r = match conn.take() {
            Some(c) => c.request("PUT", &path, Some(&body))?,
            None => rc.control_plane().request("PUT", &path, Some(&body))?,
        };
        if r.status == 200 {
            answered = Some(epoch.elapsed());
            break;
        }
        ensure!(
            r.status == 409 && attempt < 20,
            "scaling {name}: HTTP {} {}",
            r.status,
            r.body
        );
        body = scale_body()?;
    }
    let names = wait_for(&format!("{n} VMIs of {name}"), SLOW, |last| {
        let v = k.list(ns, "vmi", Some(&format!("app={name}")))?;
        *last = format!("{} VMIs", v.len());
        Ok((v.len() == n).then(|| {
            v.iter()
                .filter_map(|v| v["metadata"]["name"].as_str().map(str::to_string))
                .filter(|n| !before.contains(n))
                .collect::<Vec<_>>()
        }))
    })?;
    wait_all_ready(&seen, &names, SLOW)?;
    let wall = t0.elapsed();
    drop((w1, w2));
    let mut seen = std::mem::take(&mut *seen.lock().unwrap_or_else(|e| e.into_inner()));
    if let Some(a) = answered {
        for n in &names {
            seen.scale_answered.insert(n.clone(), a);
        }
    }
    Ok(Shape {
        title: String::new(),
        starts: names.iter().map(|n| (n.clone(), scaled_at)).collect(),
        seen,
        wall,
        from: "scale",
        pods_started,
        vmis: true,
        cpu: None,
    })
}

/// Scale-outs by one, `SINGLES` times in a row: the latency of one claim (or one cold start)
/// without the queueing of many at once. Returns the merged shape.
fn singles(
    rc: &RealCluster,
    k: &Kubectl,
    ns: &str,
    plural: &str,
    name: &str,
    pods_started: bool,
) -> Result<Shape> {
    let mut merged: Option<Shape> = None;
    for i in 1..=SINGLES {
        let s = measure_scale(rc, k, ns, plural, name, i, pods_started)?;
        match &mut merged {
            None => merged = Some(s),
            Some(m) => {
                m.wall += s.wall;
                // Each scale has its own epoch: store the intervals relative to a zero start.
                for (n, t) in &s.starts {
                    let rel =
                        |map: &BTreeMap<String, Duration>| map.get(n).map(|x| x.saturating_sub(*t));
                    m.starts.insert(n.clone(), Duration::ZERO);
                    for (dst, src) in [
                        (&mut m.seen.scale_answered, rel(&s.seen.scale_answered)),
                        (&mut m.seen.vmi_created, rel(&s.seen.vmi_created)),
                        (&mut m.seen.claim_requested, rel(&s.seen.claim_requested)),
                        (&mut m.seen.claim_answered, rel(&s.seen.claim_answered)),
                        (&mut m.seen.vmi_running, rel(&s.seen.vmi_running)),
                        (&mut m.seen.vmi_ready, rel(&s.seen.vmi_ready)),
                        (&mut m.seen.pod_running, rel(&s.seen.pod_running)),
                    ] {
                        if let Some(d) = src {
                            dst.insert(n.clone(), d);
                        }
                    }
                }
            }
        }
        // The first one too: make its intervals relative to zero.
        if i == 1 {
            if let Some(m) = &mut merged {
                let starts = std::mem::take(&mut m.starts);
                for (n, t) in starts {
                    for map in [
                        &mut m.seen.scale_answered,
                        &mut m.seen.vmi_created,
                        &mut m.seen.claim_requested,
                        &mut m.seen.claim_answered,
                        &mut m.seen.vmi_running,
                        &mut m.seen.vmi_ready,
                        &mut m.seen.pod_running,
                    ] {
                        if let Some(x) = map.get_mut(&n) {
                            *x = x.saturating_sub(t);
                        }
                    }
                    m.starts.insert(n, Duration::ZERO);
                }
            }
        }
        thread::sleep(Duration::from_millis(500));
    }
    merged.context("no single scale-out measured")
}

fn ready_p50(s: &Shape) -> Option<Duration> {
    let d: Vec<Duration> = s
        .starts
        .iter()
        .filter_map(|(n, t)| s.seen.vmi_ready.get(n).map(|r| r.saturating_sub(*t)))
        .collect();
    percentiles(d).map(|(p50, _, _)| p50)
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Runs the pool benchmark on `rc` (microvirt installed) and returns the report.
pub fn run(rc: &RealCluster, o: &PoolBenchOptions) -> Result<String> {
    let k = Kubectl::new(rc.kubeconfig_path());
    let mut out = String::new();
    let _ = writeln!(
        out,
        "microvirt real-node pool benchmark: cold VMIRS 0 -> {n} vs pool with {n} warm members \
         0 -> {n}, demo guest (halt-forever, {} MiB, 1 vCPU, masquerade NIC), {} ({} cores), \
         {} round(s)",
        o.guest_mib,
        rc.node_name(),
        thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        o.rounds,
        n = o.count,
    );

    // Warm-up: the first pod on a node pays for unpacking images.
    {
        let ns = TestNamespace::create(&k, "bench-warmup")?;
        let bo = BenchOptions {
            guest_mib: o.guest_mib,
            ..Default::default()
        };
        post_vmi(rc, ns.name(), &vmi_json("warmup", "", &bo))?;
        wait_for("the warm-up VMI Ready", SLOW, |_| {
            Ok(k.get(ns.name(), "vmi", "warmup")?
                .filter(|v| condition_true(v, "Ready")))
        })?;
        k.run(&["-n", ns.name(), "delete", "vmi", "warmup", "--wait=true"])?;
        wait_empty(&k, ns.name())?;
    }
    let mut idle = vec![cpu::Window {
        title: "empty cluster".into(),
        objects: 0,
        usage: cpu::measure(Duration::from_secs(3), o.idle_window)?,
    }];

    let ns = TestNamespace::create(&k, "bench-pool")?;
    let ns = ns.name();
    create(
        rc,
        ns,
        "virtualmachineinstancereplicasets",
        &vmirs_json("cold", o.guest_mib),
    )?;

    let mut tables = String::new();
    let mut memory = String::new();
    let mut cold_mem = MemoryTotals::default();
    let mut warm_mem = MemoryTotals::default();
    let mut summary = Vec::new();
    for round in 1..=o.rounds {
        // Cold: a VMIRS scaled 0 -> count; memory of the running VMIs; back to 0.
        let mut cold = measure_scale(rc, &k, ns, RS, "cold", o.count, true)?;
        cold.title = format!("round {round}: cold VMIRS scaled 0 -> {}", o.count);
        thread::sleep(Duration::from_secs(3));
        if round == 1 {
            cold_mem = memory_report(
                &format!("{} running cold VMIs", o.count),
                o.guest_mib,
                Some(o.count),
                &mut memory,
            )?;
            idle.push(cpu::Window {
                title: format!("{} idle running cold VMIs", o.count),
                objects: o.count,
                usage: cpu::measure(Duration::ZERO, o.idle_window)?,
            });
        }
        k.run(&["-n", ns, "scale", "vmirs/cold", "--replicas=0"])?;
        wait_empty(&k, ns)?;
        let mut cold1 = singles(rc, &k, ns, RS, "cold", true)?;
        cold1.title = format!(
            "round {round}: cold VMIRS scaled by 1, {SINGLES} times (0 -> 1 -> ... -> {SINGLES})"
        );
        k.run(&["-n", ns, "scale", "vmirs/cold", "--replicas=0"])?;
        wait_empty(&k, ns)?;

        // Warm: a pool with count warm members (captured and restored in the background, not
        // timed); memory of the idle members; scaled 0 -> count; the pool deleted.
        create(rc, ns, POOLS, &pool_json("warm", o))?;
        let t = Instant::now();
        let p = wait_warm(&k, ns, "warm", o.count)?;
        let _ = writeln!(
            tables,
            "\nround {round}: pool created -> snapshot Ready and {} warm members Ready: {:.1} s \
             (snapshot {})",
            o.count,
            t.elapsed().as_secs_f64(),
            p["status"]["snapshot"]["id"].as_str().unwrap_or("?")
        );
        thread::sleep(Duration::from_secs(3));
        let pods = live_pods(&k, ns)?;
        ensure!(
            pods.len() == o.count,
            "{} launcher pods besides the {} warm members",
            pods.len(),
            o.count
        );
        if round == 1 {
            warm_mem = memory_report(
                &format!("{} idle warm members", o.count),
                o.guest_mib,
                Some(o.count),
                &mut memory,
            )?;
            idle.push(cpu::Window {
                title: format!("{} idle warm members (paused)", o.count),
                objects: o.count,
                usage: cpu::measure(Duration::ZERO, o.idle_window)?,
            });
        }
        let mut warm = measure_scale(rc, &k, ns, POOLS, "warm", o.count, false)?;
        warm.title = format!(
            "round {round}: pool with {n} warm members scaled 0 -> {n}",
            n = o.count
        );
        let p = k.get(ns, "vmpool", "warm")?.context("the pool")?;
        let claimed = k
            .list(ns, "vmi", Some("app=warm"))?
            .iter()
            .filter(|v| !v["metadata"]["annotations"]["microvirt.io/claimed-from"].is_null())
            .count();
        // One claim at a time: back to 0, the warm members refilled, then +1 five times.
        k.run(&["-n", ns, "scale", "vmpool/warm", "--replicas=0"])?;
        wait_for("the pool's VMIs gone", SLOW, |last| {
            let v = k.list(ns, "vmi", Some("app=warm"))?;
            *last = format!("{} VMIs", v.len());
            Ok(v.is_empty().then_some(()))
        })?;
        wait_warm(&k, ns, "warm", o.count)?;
        thread::sleep(Duration::from_secs(3));
        let mut warm1 = singles(rc, &k, ns, POOLS, "warm", false)?;
        warm1.title = format!(
            "round {round}: pool scaled by 1, {SINGLES} times (0 -> 1 -> ... -> {SINGLES})"
        );
        let p1 = k.get(ns, "vmpool", "warm")?.context("the pool")?;
        cold.table(&mut tables);
        warm.table(&mut tables);
        let _ = writeln!(
            tables,
            "  claimed from warm members: {claimed}/{}; operator's claimLatency {}",
            o.count, p["status"]["claimLatency"]
        );
        cold1.table(&mut tables);
        warm1.table(&mut tables);
        let _ = writeln!(
            tables,
            "  operator's claimLatency (all {} claims so far) {}",
            o.count + SINGLES,
            p1["status"]["claimLatency"]
        );
        if let (Some(c), Some(w)) = (ready_p50(&cold1), ready_p50(&warm1)) {
            summary.push(format!(
                "round {round}: one at a time, scale -> Ready P50 cold {} / warm {} = {:.1}x",
                ms(c),
                ms(w),
                c.as_secs_f64() / w.as_secs_f64().max(1e-6)
            ));
        }
        if let (Some(c), Some(w)) = (ready_p50(&cold), ready_p50(&warm)) {
            summary.push(format!(
                "round {round}: scale -> Ready P50 cold {} / warm {} = {:.1}x",
                ms(c),
                ms(w),
                c.as_secs_f64() / w.as_secs_f64().max(1e-6)
            ));
        }
        k.run(&["-n", ns, "delete", "vmpool", "warm", "--wait=true"])?;
        wait_empty(&k, ns)?;
    }
    k.run(&["-n", ns, "delete", "vmirs", "cold", "--wait=true"])?;

    let mut s = String::new();
    let _ = writeln!(s, "\nsummary");
    for l in &summary {
        let _ = writeln!(s, "  {l}");
    }
    let _ = writeln!(
        s,
        "  node memory, {n} idle warm members: {:.0} MiB RSS ({:.0} MiB PSS) launcher+shim+pause, \
         launchers {:.0} MiB RSS ({:.0} MiB PSS) of which guest RAM {:.0} MiB",
        mib(warm_mem.all_rss),
        mib(warm_mem.all_pss),
        mib(warm_mem.launcher_rss),
        mib(warm_mem.launcher_pss),
        mib(warm_mem.guest_rss),
        n = warm_mem.launchers,
    );
    let _ = writeln!(
        s,
        "  node memory, {n} running cold VMIs: {:.0} MiB RSS ({:.0} MiB PSS) launcher+shim+pause, \
         launchers {:.0} MiB RSS ({:.0} MiB PSS) of which guest RAM {:.0} MiB",
        mib(cold_mem.all_rss),
        mib(cold_mem.all_pss),
        mib(cold_mem.launcher_rss),
        mib(cold_mem.launcher_pss),
        mib(cold_mem.guest_rss),
        n = cold_mem.launchers,
    );
    cpu::table(&idle, &mut s);
    Ok(format!("{out}{tables}{memory}{s}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_are_valid_json() {
        let o = PoolBenchOptions::default();
        let p: Value = serde_json::from_str(&pool_json("warm", &o)).unwrap();
        assert_eq!(p["spec"]["warm"]["min"], 20);
        assert_eq!(
            p["spec"]["template"]["spec"]["domain"]["memory"]["guest"],
            "256Mi"
        );
        let r: Value = serde_json::from_str(&vmirs_json("cold", 256)).unwrap();
        assert_eq!(r["spec"]["selector"]["matchLabels"]["app"], "cold");
    }
}
