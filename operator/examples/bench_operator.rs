//! Control-plane latency benchmark in KubeVirt's perf-scale shape: N VMIs created `interval`
//! apart against a private etcd + kube-apiserver, with the operator's controllers running
//! in-process and a simulated kubelet that binds and marks each launcher pod Running (Ready)
//! as soon as it appears.
//!
//! ```text
//! cargo run -p microvirt-operator --example bench_operator [-- COUNT INTERVAL_MS]
//! ```
//! (defaults: 100 VMIs, 100 ms apart), after one warm-up VMI. Prints P50/P95/max of
//! - create → launcher pod created (seen by a watch),
//! - create → VMI Running (seen by a watch; includes the simulated kubelet's two API calls),
//! - pod marked Running → VMI Running (the operator's status reaction alone).
//!
//! Then it shuts down in order (its own watches, the simulated kubelet and the controllers,
//! then the cluster) and fails if anything logged a warning or an error meanwhile (a watch
//! still running when the API server goes away logs connection errors).

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, ResourceExt};
use microvirt_crds::{VirtualMachineInstance, VmiPhase};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// Counts warnings and errors logged while `armed` is set.
struct NoiseCounter {
    armed: Arc<AtomicBool>,
    count: Arc<AtomicUsize>,
}

impl<S: tracing::Subscriber> Layer<S> for NoiseCounter {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if self.armed.load(Ordering::SeqCst) && *event.metadata().level() <= tracing::Level::WARN {
            self.count.fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[derive(Default)]
struct Times {
    created: HashMap<String, Instant>,
    pod_seen: HashMap<String, Instant>,
    marked_running: HashMap<String, Instant>,
    vmi_running: HashMap<String, Instant>,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn report(name: &str, mut v: Vec<f64>) {
    v.sort_by(|a, b| a.total_cmp(b));
    println!(
        "{name:<38} n={:<4} P50={:>7.1} ms  P95={:>7.1} ms  max={:>7.1} ms",
        v.len(),
        percentile(&v, 0.50),
        percentile(&v, 0.95),
        v.last().copied().unwrap_or(f64::NAN)
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let count: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(100);
    let interval = Duration::from_millis(args.get(1).and_then(|s| s.parse().ok()).unwrap_or(100));
    let (armed, noise) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        ))
        .with(NoiseCounter {
            armed: armed.clone(),
            count: noise.clone(),
        })
        .init();

    let cluster = tokio::task::block_in_place(common::start_cluster);
    common::install_crds(cluster.kubeconfig_path())?;
    let mut env = common::Env::start(cluster.kubeconfig_path(), "bench").await?;
    let times = Arc::new(Mutex::new(Times::default()));

    // Simulated kubelet + pod-creation clock.
    let pods: Api<Pod> = env.api();
    let t = times.clone();
    let kubelet_pods = pods.clone();
    let kubelet = tokio::spawn(async move {
        let mut stream = watcher(kubelet_pods.clone(), watcher::Config::default())
            .applied_objects()
            .boxed();
        while let Some(Ok(p)) = stream.next().await {
            let Some(vmi) = p.labels().get("microvirt.io/vmi").cloned() else {
                continue;
            };
            let first = {
                let mut t = t.lock().unwrap_or_else(|e| e.into_inner());
                if t.pod_seen.contains_key(&vmi) {
                    false
                } else {
                    t.pod_seen.insert(vmi.clone(), Instant::now());
                    true
                }
            };
            if first {
                let (api, t, name) = (kubelet_pods.clone(), t.clone(), p.name_any());
                tokio::spawn(async move {
                    let mut bound = false;
                    for attempt in 0..50 {
                        if !bound {
                            match common::bind(&api, &name, "node-1").await {
                                Ok(()) => bound = true,
                                Err(e) => {
                                    eprintln!("bind {name} (attempt {attempt}): {e:#}");
                                    tokio::time::sleep(Duration::from_millis(100)).await;
                                    continue;
                                }
                            }
                        }
                        match common::mark_running(&api, &name, "10.9.0.1", true).await {
                            Ok(()) => {
                                let mut t = t.lock().unwrap_or_else(|e| e.into_inner());
                                t.marked_running.insert(vmi, Instant::now());
                                return;
                            }
                            Err(e) => {
                                eprintln!("mark {name} running (attempt {attempt}): {e:#}");
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                        }
                    }
                });
            }
        }
    });

    // VMI Running clock.
    let vmis: Api<VirtualMachineInstance> = env.api();
    let t = times.clone();
    let watch_vmis = vmis.clone();
    let clock = tokio::spawn(async move {
        let mut stream = watcher(watch_vmis, watcher::Config::default())
            .applied_objects()
            .boxed();
        while let Some(Ok(v)) = stream.next().await {
            if v.phase() == Some(VmiPhase::Running) {
                let mut t = t.lock().unwrap_or_else(|e| e.into_inner());
                t.vmi_running
                    .entry(v.name_any())
                    .or_insert_with(Instant::now);
            }
        }
    });
    // Let both watches establish, then warm up (the API server builds some per-resource state
    // lazily on first use): one VMI to Running, timed separately.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let warm = Instant::now();
    vmis.create(&PostParams::default(), &common::vmi("warmup", &[]))
        .await?;
    while !times
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .vmi_running
        .contains_key("warmup")
    {
        if warm.elapsed() > Duration::from_secs(60) {
            bail!("warm-up VMI not Running after 60 s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!(
        "warm-up (first VMI on a fresh API server): create -> Running {:.0} ms",
        warm.elapsed().as_secs_f64() * 1000.0
    );

    println!("creating {count} VMIs {} ms apart", interval.as_millis());
    let mut ticker = tokio::time::interval(interval);
    let start = Instant::now();
    for i in 0..count {
        ticker.tick().await;
        let name = format!("perf-{i:03}");
        let obj = common::vmi(&name, &[("bench", "perf")]);
        let api = vmis.clone();
        times
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .created
            .insert(name.clone(), Instant::now());
        tokio::spawn(async move {
            if let Err(e) = api.create(&PostParams::default(), &obj).await {
                eprintln!("create {name}: {e}");
            }
        });
    }
    loop {
        let done = times
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .vmi_running
            .len();
        if done > count {
            break;
        }
        if start.elapsed() > Duration::from_secs(120) {
            let stuck: Vec<(String, bool, bool)> = {
                let t = times.lock().unwrap_or_else(|e| e.into_inner());
                t.created
                    .keys()
                    .filter(|n| !t.vmi_running.contains_key(*n))
                    .map(|n| {
                        (
                            n.clone(),
                            t.pod_seen.contains_key(n),
                            t.marked_running.contains_key(n),
                        )
                    })
                    .collect()
            };
            for (name, seen, marked) in stuck {
                let v = vmis.get_opt(&name).await?;
                eprintln!(
                    "{name}: pod seen {seen}, marked running {marked}, VMI status {:?}",
                    v.and_then(|v| v.status)
                );
            }
            bail!("only {done}/{count} VMIs Running after 120 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    {
        let t = times.lock().unwrap_or_else(|e| e.into_inner());
        let ms = |a: &Instant, b: &Instant| b.duration_since(*a).as_secs_f64() * 1000.0;
        // Only the timed VMIs (not the warm-up).
        let pairs = |from: &HashMap<String, Instant>, to: &HashMap<String, Instant>| -> Vec<f64> {
            from.iter()
                .filter(|(k, _)| t.created.contains_key(*k))
                .filter_map(|(k, a)| to.get(k).map(|b| ms(a, b)))
                .collect()
        };
        println!(
            "{count} VMIs, all Running {:.1} s after the first create",
            start.elapsed().as_secs_f64()
        );
        let mut slow: Vec<(f64, &String)> = t
            .created
            .iter()
            .filter_map(|(k, a)| t.pod_seen.get(k).map(|b| (ms(a, b), k)))
            .collect();
        slow.sort_by(|a, b| b.0.total_cmp(&a.0));
        let slow: Vec<String> = slow
            .iter()
            .take(6)
            .map(|(l, k)| format!("{k} {l:.0} ms"))
            .collect();
        println!("slowest create -> pod: {}", slow.join(", "));
        report(
            "create -> launcher pod created",
            pairs(&t.created, &t.pod_seen),
        );
        report("create -> VMI Running", pairs(&t.created, &t.vmi_running));
        report(
            "pod marked Running -> VMI Running",
            pairs(&t.marked_running, &t.vmi_running),
        );
        println!("operator metrics:");
        for line in env.metrics.encode().lines() {
            if line.starts_with("microvirt_operator_reconciles_total")
                || line.starts_with("microvirt_operator_reconcile_errors_total")
                || line.starts_with("microvirt_operator_reconcile_duration_seconds_sum")
                || line.starts_with("microvirt_operator_reconcile_duration_seconds_count")
            {
                println!("  {line}");
            }
        }
    }

    // Shut down in order, so nothing is left talking to an API server that is going away:
    // the benchmark's own watches, then the simulated kubelet and the controllers, then the
    // cluster.
    for task in [kubelet, clock] {
        task.abort();
        let _ = task.await;
    }
    armed.store(true, Ordering::SeqCst);
    env.shutdown().await;
    drop(env);
    tokio::task::block_in_place(|| drop(cluster));
    let n = noise.load(Ordering::SeqCst);
    if n > 0 {
        bail!("{n} warnings or errors logged while shutting down");
    }
    println!("shut down in order: no warnings or errors");
    Ok(())
}
