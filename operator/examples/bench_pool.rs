//! Pool benchmark, control plane only: a cold VMIRS scaled 0 → N versus a VirtualMachinePool
//! with N warm members scaled 0 → N, against a private etcd + kube-apiserver with the operator's
//! controllers in-process, a simulated kubelet (binds a pod and marks it Running and Ready as
//! soon as it sees it) and a simulated node agent (answers every control request `ok` as soon
//! as it sees it; a snapshot request with host facts).
//!
//! ```text
//! cargo run -p microvirt-operator --example bench_pool [-- N]
//! ```
//! (default 20). Prints P50/P95/max of scale → VMI Ready (seen by a watch) for each, and the
//! pool's own `status.claimLatency`.
//!
//! What this does NOT show: a real pod start (the kubelet, the container runtime and the
//! launcher's boot: a cold VMI on a real node takes ~1 s more than here, a claimed warm member
//! only the launcher's resume more), nor the node memory of idle warm members. Those need the
//! real node (`tests/e2e`).

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use microvirt_crds::control::{self, ControlCommand, ControlRequest, ControlResult};
use microvirt_crds::pool::{ANNOTATION_HOST_FACTS, LABEL_POOL, LABEL_POOL_ROLE};
use microvirt_crds::vmi::{ANNOTATION_CONTROL_REQUEST, ANNOTATION_CONTROL_RESULT};
use microvirt_crds::{
    VirtualMachineInstance, VirtualMachineInstanceReplicaSet, VirtualMachinePool,
};
use serde_json::json;

const NODE: &str = "bench-node";
/// Claims of the one-at-a-time phase.
const ONE_BY_ONE: usize = 5;
const FACTS: &str = "cpu=BenchCPU/25/1/1 kernel=6.1.0-bench";

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn report(name: &str, mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let p50 = percentile(&v, 0.50);
    println!(
        "{name:<40} n={:<3} P50={:>7.1} ms  P95={:>7.1} ms  max={:>7.1} ms",
        v.len(),
        p50,
        percentile(&v, 0.95),
        v.last().copied().unwrap_or(f64::NAN)
    );
    p50
}

/// The simulated kubelet and node agent: reacts to every pod event of the namespace.
async fn sim_node(pods: Api<Pod>) {
    let busy: Arc<Mutex<HashSet<String>>> = Arc::default();
    let mut stream = watcher(pods.clone(), watcher::Config::default())
        .applied_objects()
        .boxed();
    while let Some(ev) = stream.next().await {
        let Ok(p) = ev else { continue };
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = p.name_any();
        let bound = p.spec.as_ref().and_then(|s| s.node_name.clone()).is_some();
        let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        let a = p.annotations();
        let answer = a.get(ANNOTATION_CONTROL_REQUEST).and_then(|req| {
            let req = ControlRequest::parse(req).ok()?;
            let answered = a
                .get(ANNOTATION_CONTROL_RESULT)
                .and_then(|r| control::id_of(r))
                == Some(req.id.as_str());
            let facts = (req.command == ControlCommand::Snapshot).then(|| FACTS.to_string());
            (!answered).then(|| ControlResult::ok(req.id, facts).to_string())
        });
        // A claim's answer: the real agent then writes the pod's readiness gate reason and
        // the claimed VMI's Paused=False (after reading the VMI), as `agent_follow_up` does.
        let vmi_name = a
            .get(ANNOTATION_CONTROL_REQUEST)
            .filter(|r| r.starts_with("claim-"))
            .and_then(|_| p.labels().get(microvirt_crds::vmi::LABEL_VMI_NAME).cloned());
        let vmis: Api<VirtualMachineInstance> = Api::namespaced(
            pods.clone().into_client(),
            &p.namespace().unwrap_or_default(),
        );
        let key = format!("{name}/{bound}/{running}/{answer:?}");
        if !busy.lock().unwrap().insert(key.clone()) {
            continue;
        }
        let (api, busy) = (pods.clone(), busy.clone());
        tokio::spawn(async move {
            let r = if !bound {
                common::bind(&api, &name, NODE).await
            } else if !running {
                common::mark_running(&api, &name, "10.9.0.1", true).await
            } else if let Some(result) = answer {
                let patch =
                    json!({"metadata": {"annotations": {ANNOTATION_CONTROL_RESULT: result}}});
                let r = api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map(|_| ())
                    .map_err(anyhow::Error::from);
                if r.is_ok() {
                    if let Some(vmi) = vmi_name {
                        agent_follow_up(&api, &vmis, &name, &vmi).await;
                    }
                }
                r
            } else {
                Ok(())
            };
            if r.is_err() {
                // Let the next event (or a later one) try again.
                busy.lock().unwrap().remove(&key);
            }
        });
    }
}

/// What the real node agent writes after it answered a claim: the pod's readiness gate (reason
/// `VMRunning` instead of `RestoredPaused`), then the VMI's Paused=False, after reading it.
async fn agent_follow_up(
    pods: &Api<Pod>,
    vmis: &Api<VirtualMachineInstance>,
    pod: &str,
    vmi: &str,
) {
    let gate = json!({"status": {"conditions": [{
        "type": microvirt_crds::vmi::POD_CONDITION_VM_RUNNING, "status": "True",
        "reason": "VMRunning", "lastTransitionTime": "2026-01-01T00:00:00Z",
    }]}});
    let _ = pods
        .patch_status(pod, &PatchParams::default(), &Patch::Strategic(&gate))
        .await;
    let _ = vmis.get(vmi).await;
    let paused = json!({
        "apiVersion": "microvirt.io/v1alpha1", "kind": "VirtualMachineInstance",
        "metadata": {"name": vmi},
        "status": {"conditions": [{"type": "Paused", "status": "False", "reason": "NotPaused",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
    });
    let _ = vmis
        .patch_status(
            vmi,
            &PatchParams::apply("virt-handler").force(),
            &Patch::Apply(&paused),
        )
        .await;
}

/// First time each VMI with label `app=<app>` was seen Ready.
type ReadyTimes = Arc<Mutex<HashMap<String, Instant>>>;

fn ready_clock(
    vmis: Api<VirtualMachineInstance>,
    app: &str,
) -> (ReadyTimes, tokio::task::JoinHandle<()>) {
    let times: ReadyTimes = Arc::default();
    let t = times.clone();
    let cfg = watcher::Config::default().labels(&format!("app={app}"));
    let task = tokio::spawn(async move {
        let mut stream = watcher(vmis, cfg).applied_objects().boxed();
        while let Some(Ok(v)) = stream.next().await {
            if v.is_ready() {
                t.lock()
                    .unwrap()
                    .entry(v.name_any())
                    .or_insert_with(Instant::now);
            }
        }
    });
    (times, task)
}

/// When each VMI with label `app=<app>` was first seen at all, `Running` and `Ready`.
#[derive(Default)]
struct VmiStages {
    seen: HashMap<String, Instant>,
    running: HashMap<String, Instant>,
    ready: HashMap<String, Instant>,
    /// Status writes seen per VMI (watch events with a new status).
    status_writes: HashMap<String, usize>,
}

fn vmi_clock(
    vmis: Api<VirtualMachineInstance>,
    app: &str,
) -> (Arc<Mutex<VmiStages>>, tokio::task::JoinHandle<()>) {
    let stages: Arc<Mutex<VmiStages>> = Arc::default();
    let st = stages.clone();
    let cfg = watcher::Config::default().labels(&format!("app={app}"));
    let task = tokio::spawn(async move {
        let mut last: HashMap<String, serde_json::Value> = HashMap::new();
        let mut stream = watcher(vmis, cfg).applied_objects().boxed();
        while let Some(Ok(v)) = stream.next().await {
            let now = Instant::now();
            let name = v.name_any();
            let mut g = st.lock().unwrap();
            g.seen.entry(name.clone()).or_insert(now);
            if v.phase() == Some(microvirt_crds::VmiPhase::Running) {
                g.running.entry(name.clone()).or_insert(now);
            }
            if v.is_ready() {
                g.ready.entry(name.clone()).or_insert(now);
            }
            let status = serde_json::to_value(&v.status).unwrap_or_default();
            if !status.is_null() && last.get(&name) != Some(&status) {
                *g.status_writes.entry(name.clone()).or_default() += 1;
            }
            last.insert(name, status);
        }
    });
    (stages, task)
}

/// When each claimed warm member's pod was first seen claimed, and first seen with the node
/// agent's answer to its claim (by VMI name: the pod is `virt-launcher-<vmi>`).
#[derive(Default)]
struct ClaimStages {
    claimed: HashMap<String, Instant>,
    answered: HashMap<String, Instant>,
}

fn claim_clock(
    pods: Api<Pod>,
    pool: &str,
) -> (Arc<Mutex<ClaimStages>>, tokio::task::JoinHandle<()>) {
    let stages: Arc<Mutex<ClaimStages>> = Arc::default();
    let st = stages.clone();
    let cfg = watcher::Config::default().labels(&format!("{LABEL_POOL}={pool}"));
    let task = tokio::spawn(async move {
        let mut stream = watcher(pods, cfg).applied_objects().boxed();
        while let Some(Ok(p)) = stream.next().await {
            if p.labels().get(LABEL_POOL_ROLE).map(String::as_str) != Some("claimed") {
                continue;
            }
            let Some(vmi) = p
                .name_any()
                .strip_prefix("virt-launcher-")
                .map(str::to_string)
            else {
                continue;
            };
            let a = p.annotations();
            let req = a
                .get(ANNOTATION_CONTROL_REQUEST)
                .and_then(|r| control::id_of(r));
            let answered = req.is_some()
                && a.get(ANNOTATION_CONTROL_RESULT)
                    .and_then(|r| control::id_of(r))
                    == req;
            let now = Instant::now();
            let mut g = st.lock().unwrap();
            g.claimed.entry(vmi.clone()).or_insert(now);
            if answered {
                g.answered.entry(vmi).or_insert(now);
            }
        }
    });
    (stages, task)
}

fn between(from: &HashMap<String, Instant>, to: &HashMap<String, Instant>) -> Vec<f64> {
    from.iter()
        .filter_map(|(k, a)| {
            to.get(k)
                .map(|b| b.duration_since(*a).as_secs_f64() * 1000.0)
        })
        .collect()
}

async fn wait_ready(times: &ReadyTimes, n: usize, what: &str) -> Result<()> {
    let start = Instant::now();
    while times.lock().unwrap().len() < n {
        if start.elapsed() > Duration::from_secs(120) {
            bail!(
                "{what}: only {}/{n} Ready after 120 s",
                times.lock().unwrap().len()
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

fn since(t0: Instant, times: &ReadyTimes) -> Vec<f64> {
    times
        .lock()
        .unwrap()
        .values()
        .map(|t| t.duration_since(t0).as_secs_f64() * 1000.0)
        .collect()
}

fn template(app: &str) -> serde_json::Value {
    json!({
        "metadata": {"labels": {"app": app}},
        "spec": {
            "domain": {
                "memory": {"guest": "256Mi"},
                "devices": {"interfaces": [{"name": "default", "masquerade": {}}]},
            },
            "networks": [{"name": "default", "pod": {}}],
        },
    })
}

async fn create_node(client: &Client) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE, "annotations": {ANNOTATION_HOST_FACTS: FACTS}},
    }))?;
    nodes.create(&PostParams::default(), &node).await?;
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let cluster = tokio::task::block_in_place(common::start_cluster);
    common::install_crds(cluster.kubeconfig_path())?;
    let mut env = common::Env::start(cluster.kubeconfig_path(), "bench-pool").await?;
    create_node(&env.client).await?;
    let node = tokio::spawn(sim_node(env.api()));
    let vmis: Api<VirtualMachineInstance> = env.api();
    let scale = |replicas: usize| json!({"spec": {"replicas": replicas}});
    let pp = PatchParams::default();

    // Cold: a VMIRS at 0, then scaled to n.
    let (cold, cold_clock) = ready_clock(vmis.clone(), "cold");
    let rs: VirtualMachineInstanceReplicaSet = serde_json::from_value(json!({
        "apiVersion": "microvirt.io/v1alpha1", "kind": "VirtualMachineInstanceReplicaSet",
        "metadata": {"name": "cold"},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "cold"}}, "template": template("cold")},
    }))?;
    let rs_api: Api<VirtualMachineInstanceReplicaSet> = env.api();
    rs_api.create(&PostParams::default(), &rs).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let cold_t0 = Instant::now();
    rs_api
        .patch_scale("cold", &pp, &Patch::Merge(&scale(n)))
        .await?;
    wait_ready(&cold, n, "cold VMIRS").await?;
    let cold_all = cold_t0.elapsed();

    // Warm: a pool at 0 with n warm members, then scaled to n.
    let (warm, warm_clock) = ready_clock(vmis.clone(), "warm");
    let (stages, stage_clock) = claim_clock(env.api(), "warm");
    let pool: VirtualMachinePool = serde_json::from_value(json!({
        "apiVersion": "microvirt.io/v1alpha1", "kind": "VirtualMachinePool",
        "metadata": {"name": "warm"},
        "spec": {
            "replicas": 0, "selector": {"matchLabels": {"app": "warm"}},
            "warm": {"min": n, "max": n},
            "template": template("warm"),
        },
    }))?;
    let pools: Api<VirtualMachinePool> = env.api();
    pools.create(&PostParams::default(), &pool).await?;
    let start = Instant::now();
    loop {
        let st = pools.get("warm").await?.status.unwrap_or_default();
        if st.warm_replicas == n as i32 {
            break;
        }
        if start.elapsed() > Duration::from_secs(120) {
            bail!("pool: {} of {n} warm members after 120 s", st.warm_replicas);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "pool: snapshot taken and {n} warm members ready {:.1} s after create",
        start.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let warm_t0 = Instant::now();
    pools
        .patch_scale("warm", &pp, &Patch::Merge(&scale(n)))
        .await?;
    wait_ready(&warm, n, "warm pool").await?;
    let warm_all = warm_t0.elapsed();

    println!("scale 0 -> {n}, simulated node (no real pod start, no guest):");
    let c = report("cold VMIRS: scale -> VMI Ready", since(cold_t0, &cold));
    let w = report("warm pool: scale -> VMI Ready", since(warm_t0, &warm));
    {
        let g = stages.lock().unwrap();
        let ms = |t: &Instant| t.duration_since(warm_t0).as_secs_f64() * 1000.0;
        report(
            "  scale -> member pod claimed (seen)",
            g.claimed.values().map(ms).collect(),
        );
        report(
            "  pod claimed -> agent's answer (seen)",
            between(&g.claimed, &g.answered),
        );
        report(
            "  agent's answer -> VMI Ready",
            between(&g.answered, &warm.lock().unwrap()),
        );
    }
    println!(
        "all {n} Ready: cold {:.0} ms, warm {:.0} ms; P50 cold/warm = {:.1}x",
        cold_all.as_secs_f64() * 1000.0,
        warm_all.as_secs_f64() * 1000.0,
        c / w
    );
    // One claim at a time: the pool scaled by one, ONE_BY_ONE times, each once the refill
    // is back to n warm members (the latency of one claim, without the queueing of n).
    let (one, one_clock) = vmi_clock(vmis.clone(), "warm");
    let mut t0s: HashMap<String, Instant> = HashMap::new();
    for i in 0..ONE_BY_ONE {
        let start = Instant::now();
        loop {
            let st = pools.get("warm").await?.status.unwrap_or_default();
            if st.warm_replicas == n as i32 && st.ready_replicas == (n + i) as i32 {
                break;
            }
            if start.elapsed() > Duration::from_secs(120) {
                bail!("pool: {} of {n} warm members after 120 s", st.warm_replicas);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let before: HashSet<String> = one.lock().unwrap().seen.keys().cloned().collect();
        let t0 = Instant::now();
        pools
            .patch_scale("warm", &pp, &Patch::Merge(&scale(n + i + 1)))
            .await?;
        let start = Instant::now();
        let name = loop {
            let new_ready = {
                let g = one.lock().unwrap();
                g.ready.keys().find(|k| !before.contains(*k)).cloned()
            };
            if let Some(k) = new_ready {
                break k;
            }
            if start.elapsed() > Duration::from_secs(60) {
                bail!("one-by-one claim {i}: no new VMI Ready after 60 s");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        t0s.insert(name, t0);
    }
    {
        let g = one.lock().unwrap();
        let s = stages.lock().unwrap();
        let at = |m: &HashMap<String, Instant>| -> Vec<f64> {
            t0s.iter()
                .filter_map(|(k, t0)| {
                    m.get(k)
                        .map(|t| t.duration_since(*t0).as_secs_f64() * 1000.0)
                })
                .collect()
        };
        println!("pool scaled by 1, {ONE_BY_ONE} times (one claim at a time):");
        report("  scale -> VMI created (seen)", at(&g.seen));
        report("  scale -> member pod claimed (seen)", at(&s.claimed));
        report("  scale -> agent's answer (seen)", at(&s.answered));
        report("  scale -> VMI Running (seen)", at(&g.running));
        report("  scale -> VMI Ready (seen)", at(&g.ready));
        let writes: Vec<f64> = t0s
            .keys()
            .filter_map(|k| g.status_writes.get(k).map(|n| *n as f64))
            .collect();
        report("  VMI status changes seen per claim", writes);
    }

    // The pool's own account (claim → the node agent's resume confirmed), once the VMI
    // controller recorded every claim.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let st = pools.get("warm").await?.status.unwrap_or_default();
    println!("pool status.claimLatency: {:?}", st.claim_latency);
    let pods_by_role: BTreeMap<String, usize> = env
        .api::<Pod>()
        .list(&kube::api::ListParams::default().labels("microvirt.io/pool=warm"))
        .await?
        .items
        .iter()
        .fold(BTreeMap::new(), |mut m, p| {
            let role = p
                .labels()
                .get(microvirt_crds::pool::LABEL_POOL_ROLE)
                .cloned()
                .unwrap_or_default();
            *m.entry(role).or_default() += 1;
            m
        });
    println!(
        "pool pods by role after the scale-out (claimed = served from warm): {pods_by_role:?}"
    );

    for task in [node, cold_clock, warm_clock, stage_clock, one_clock] {
        task.abort();
        let _ = task.await;
    }
    env.shutdown().await;
    drop(env);
    tokio::task::block_in_place(|| drop(cluster));
    Ok(())
}
