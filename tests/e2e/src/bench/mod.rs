//! The real-node benchmark (`cargo xtask bench-node`): VMI start-up latency and memory per VMI
//! on a single-node cluster from real parts, demo guest from the `microvirt/demo-kernel:dev`
//! kernelBoot image.
//!
//! Shapes (KubeVirt's perf-scale CI): N VMIs created 100 ms apart, and a VMIRS scaled 0 → N.
//! The guest boots, writes the boot timer and halts its vCPU (`halt-forever`): an idle VMI
//! that uses no CPU, as a real idle guest would.
//! Intervals, from the create (or the scale) as the client saw it, to the first watch event
//! showing: the launcher pod Running, the VMI Running, the VMI Ready (its VM runs: the node
//! agent's readiness gate on the launcher pod; the guest's boot is not waited for). Watches
//! are `kubectl get -w -o json` streams timestamped on arrival, so the numbers include the
//! watch delivery (a few ms) like any client's view. Memory: RSS and PSS of each launcher and
//! of its runtime helpers (containerd shim, sandbox `pause`), and the part of the launcher's
//! RSS that is guest RAM the guest touched.
//!
//! Against the limit: in the same run, before the VMIs, the same number of minimal pods
//! ([`baseline`]: one `pause` container, nothing mounted, no probe) created at the same rate;
//! the VMIs' create → pod Running and create → VMI Ready are printed as ratios to the minimal
//! pods' create → Running. Idle cost: the node's CPU over a fixed window ([`cpu`]) with the
//! cluster empty, with the minimal pods running and with the VMIs running idle.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::io::BufReader;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use microvirt_testsupport::node::teardown::all_pids as pids;
use microvirt_testsupport::RealCluster;
use serde_json::Value;

use crate::images::{DEMO_KERNEL, KERNEL_PATH};
use crate::kube::{condition_true, wait_for, Kubectl, TestNamespace};

mod baseline;
pub(crate) mod cpu;

/// Benchmark parameters.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// VMIs per shape (KubeVirt's CI uses 100; 50 here).
    pub count: usize,
    /// Gap between creates in the first shape.
    pub interval: Duration,
    /// Guest memory of each VMI (MiB).
    pub guest_mib: u32,
    /// Length of each idle-CPU window.
    pub idle_window: Duration,
    /// Also start the ladder from the launcher pod's spec down to the minimal pod
    /// ([`baseline::ladder`]).
    pub ladder: bool,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self {
            count: 50,
            interval: Duration::from_millis(100),
            guest_mib: 32,
            idle_window: Duration::from_secs(30),
            ladder: false,
        }
    }
}

/// Times (since the benchmark's epoch) at which each VMI (by name) was first seen in a state.
#[derive(Default, Debug)]
pub(crate) struct Seen {
    /// The scale request's answer (the same for every VMI of one scale).
    pub(crate) scale_answered: BTreeMap<String, Duration>,
    /// The launcher pod's first watch event (the operator created it).
    pub(crate) pod_created: BTreeMap<String, Duration>,
    pub(crate) pod_running: BTreeMap<String, Duration>,
    pub(crate) vmi_running: BTreeMap<String, Duration>,
    pub(crate) vmi_ready: BTreeMap<String, Duration>,
    /// The VMI's first watch event (a claimed VMI: the pool controller created it).
    pub(crate) vmi_created: BTreeMap<String, Duration>,
    /// A claim's pod patch: the launcher pod carries `control-request: claim-<uid> unpause`.
    pub(crate) claim_requested: BTreeMap<String, Duration>,
    /// The node agent's answer on the pod: `control-result: claim-<uid> ok`.
    pub(crate) claim_answered: BTreeMap<String, Duration>,
    /// Watch events (one per write of the object) per VMI and per pod (by VMI name for launcher
    /// pods), over the whole shape.
    pub(crate) vmi_events: BTreeMap<String, usize>,
    pub(crate) pod_events: BTreeMap<String, usize>,
}

/// A `kubectl get KIND -w -o json` stream feeding [`Seen`].
pub(crate) struct Watch {
    child: Child,
    thread: Option<thread::JoinHandle<()>>,
}

/// Whether every container of `pod` runs.
fn all_running(pod: &Value) -> bool {
    pod["status"]["containerStatuses"]
        .as_array()
        .is_some_and(|cs| !cs.is_empty() && cs.iter().all(|c| c["state"]["running"].is_object()))
}

fn compute_running(pod: &Value) -> bool {
    pod["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["name"] == "compute" && c["state"]["running"].is_object())
}

impl Watch {
    pub(crate) fn start(
        k: &Kubectl,
        ns: &str,
        kind: &'static str,
        epoch: Instant,
        seen: Arc<Mutex<Seen>>,
    ) -> Result<Self> {
        let mut child = k
            .command()
            .args(["-n", ns, "get", kind, "-w", "-o", "json"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("kubectl get -w")?;
        let out = child.stdout.take().context("kubectl stdout")?;
        let thread = thread::spawn(move || {
            let stream = serde_json::Deserializer::from_reader(BufReader::new(out));
            for v in stream.into_iter::<Value>() {
                let Ok(v) = v else { break };
                let t = epoch.elapsed();
                let Some(name) = v["metadata"]["name"].as_str() else {
                    continue;
                };
                let mut s = seen.lock().unwrap_or_else(|e| e.into_inner());
                if kind == "pod" {
                    let key = name.strip_prefix("virt-launcher-").unwrap_or(name);
                    *s.pod_events.entry(key.to_string()).or_default() += 1;
                    let Some(vmi) = name.strip_prefix("virt-launcher-") else {
                        // Another pod (the baseline's): Running once all its containers run.
                        if all_running(&v) {
                            s.pod_running.entry(name.to_string()).or_insert(t);
                        }
                        continue;
                    };
                    s.pod_created.entry(vmi.to_string()).or_insert(t);
                    if compute_running(&v) {
                        s.pod_running.entry(vmi.to_string()).or_insert(t);
                    }
                    let ann = &v["metadata"]["annotations"];
                    let claim =
                        |key: &str| ann[key].as_str().is_some_and(|a| a.starts_with("claim-"));
                    if claim("microvirt.io/control-request") {
                        s.claim_requested.entry(vmi.to_string()).or_insert(t);
                    }
                    if claim("microvirt.io/control-result")
                        && ann["microvirt.io/control-result"]
                            .as_str()
                            .is_some_and(|a| a.ends_with(" ok"))
                    {
                        s.claim_answered.entry(vmi.to_string()).or_insert(t);
                    }
                } else {
                    *s.vmi_events.entry(name.to_string()).or_default() += 1;
                    s.vmi_created.entry(name.to_string()).or_insert(t);
                    if v["status"]["phase"] == "Running" {
                        s.vmi_running.entry(name.to_string()).or_insert(t);
                    }
                    if condition_true(&v, "Ready") {
                        s.vmi_ready.entry(name.to_string()).or_insert(t);
                    }
                }
            }
        });
        Ok(Self {
            child,
            thread: Some(thread),
        })
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        // Our own child: stop it by pid.
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub(crate) fn vmi_json(name: &str, labels: &str, o: &BenchOptions) -> String {
    format!(
        r#"{{"apiVersion":"microvirt.io/v1alpha1","kind":"VirtualMachineInstance",
"metadata":{{"name":"{name}"{labels}}},"spec":{}}}"#,
        spec_json(o)
    )
}

fn spec_json(o: &BenchOptions) -> String {
    guest_spec_json(o.guest_mib)
}

/// The VMI spec both shapes boot (idle demo guest, `guest_mib` MiB), as JSON.
pub(crate) fn guest_spec_json(guest_mib: u32) -> String {
    format!(
        r#"{{"terminationGracePeriodSeconds":2,"domain":{{"memory":{{"guest":"{}Mi"}},
"resources":{{"requests":{{"cpu":"10m"}}}},
"firmware":{{"kernelBoot":{{"kernelArgs":"testguest.scenario=halt-forever",
"container":{{"image":"{DEMO_KERNEL}","kernelPath":"{KERNEL_PATH}"}}}}}},
"devices":{{"interfaces":[{{"name":"default","masquerade":{{}}}}]}}}},
"networks":[{{"name":"default","pod":{{}}}}]}}"#,
        guest_mib
    )
}

/// P50, P95 and max of `v` (nearest-rank).
pub(crate) fn percentiles(mut v: Vec<Duration>) -> Option<(Duration, Duration, Duration)> {
    if v.is_empty() {
        return None;
    }
    v.sort();
    let rank = |p: f64| {
        let i = ((p / 100.0) * v.len() as f64).ceil() as usize;
        v[i.clamp(1, v.len()) - 1]
    };
    Some((rank(50.0), rank(95.0), *v.last().unwrap()))
}

pub(crate) fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

/// Latency of one shape: per VMI, its start time and what the watches saw.
pub(crate) struct Shape {
    pub(crate) title: String,
    pub(crate) starts: BTreeMap<String, Duration>,
    pub(crate) seen: Seen,
    pub(crate) wall: Duration,
    /// What the intervals start at (`create`, `scale`).
    pub(crate) from: &'static str,
    /// Whether launcher pods were started for the VMIs (not for claims of warm members,
    /// whose pods ran before the scale).
    pub(crate) pods_started: bool,
    /// Whether the shape is about VMIs (false: the baseline's bare pods).
    pub(crate) vmis: bool,
    /// What the node's processes used from the first create until every object was up.
    pub(crate) cpu: Option<cpu::Usage>,
}

impl Shape {
    pub(crate) fn table(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "\n{} (wall {:.1} s)",
            self.title,
            self.wall.as_secs_f64()
        );
        let _ = writeln!(
            out,
            "  {:<36} {:>9} {:>9} {:>9} {:>5}",
            "interval", "P50", "P95", "max", "n"
        );
        let from = self.from;
        let mut rows = vec![];
        if !self.vmis {
            rows.push((format!("{from} -> pod Running"), &self.seen.pod_running));
        } else if self.pods_started {
            rows.push((
                format!("{from} -> launcher pod created"),
                &self.seen.pod_created,
            ));
            rows.push((
                format!("{from} -> launcher pod Running"),
                &self.seen.pod_running,
            ));
        }
        if !self.seen.scale_answered.is_empty() {
            rows.push((
                format!("{from} -> its PUT answered"),
                &self.seen.scale_answered,
            ));
        }
        if !self.pods_started {
            rows.push((format!("{from} -> VMI created"), &self.seen.vmi_created));
            rows.push((
                format!("{from} -> pod claimed (patch)"),
                &self.seen.claim_requested,
            ));
            rows.push((
                format!("{from} -> agent resumed it (answer)"),
                &self.seen.claim_answered,
            ));
        }
        if self.vmis {
            rows.push((format!("{from} -> VMI Running"), &self.seen.vmi_running));
        }
        rows.push((
            format!(
                "{from} -> VMI Ready ({})",
                if self.pods_started {
                    "VM running"
                } else {
                    "resumed"
                }
            ),
            &self.seen.vmi_ready,
        ));
        if !self.vmis {
            rows.pop();
        }
        for (label, map) in rows {
            let d: Vec<Duration> = self
                .starts
                .iter()
                .filter_map(|(n, s)| map.get(n).map(|t| t.saturating_sub(*s)))
                .collect();
            let n = d.len();
            match percentiles(d) {
                Some((p50, p95, max)) => {
                    let _ = writeln!(
                        out,
                        "  {label:<36} {:>9} {:>9} {:>9} {n:>5}",
                        ms(p50),
                        ms(p95),
                        ms(max)
                    );
                }
                None => {
                    let _ = writeln!(out, "  {label:<36} (none seen)");
                }
            }
        }
        let events = |map: &BTreeMap<String, usize>| {
            let mut v: Vec<usize> = self
                .starts
                .keys()
                .filter_map(|n| map.get(n))
                .copied()
                .collect();
            v.sort_unstable();
            (!v.is_empty()).then(|| format!("{} (max {})", v[v.len() / 2], v[v.len() - 1]))
        };
        let pods = events(&self.seen.pod_events);
        let vmis = events(&self.seen.vmi_events);
        if pods.is_some() || vmis.is_some() {
            let _ = writeln!(
                out,
                "  writes seen (watch events, median): per pod {}, per VMI {}",
                pods.as_deref().unwrap_or("-"),
                vmis.as_deref().unwrap_or("-"),
            );
        }
        if !self.pods_started || !self.vmis {
            return;
        }
        // Running -> Ready: the readiness share.
        let d: Vec<Duration> = self
            .seen
            .vmi_ready
            .iter()
            .filter_map(|(n, r)| self.seen.pod_running.get(n).map(|p| r.saturating_sub(*p)))
            .collect();
        if let Some((p50, p95, max)) = percentiles(d) {
            let _ = writeln!(
                out,
                "  {:<36} {:>9} {:>9} {:>9}",
                "pod Running -> VMI Ready",
                ms(p50),
                ms(p95),
                ms(max)
            );
        }
    }
}

/// Resident and proportional set size of a process, in KiB.
fn rss_pss(pid: u32) -> Option<(u64, u64)> {
    let t = fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let field = |k: &str| {
        t.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
    };
    Some((field("Rss:")?, field("Pss:")?))
}

/// RSS (KiB) of the process's anonymous mappings of exactly `size_kib`: the guest's RAM.
fn guest_rss(pid: u32, size_kib: u64) -> u64 {
    let Ok(t) = fs::read_to_string(format!("/proc/{pid}/smaps")) else {
        return 0;
    };
    let mut total = 0;
    let mut in_guest = false;
    for l in t.lines() {
        if let Some(v) = l.strip_prefix("Size:") {
            let size: u64 = v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
            in_guest = size == size_kib;
        } else if in_guest {
            if let Some(v) = l.strip_prefix("Rss:") {
                total += v
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap_or(0);
            }
        }
    }
    total
}

fn exe_name(pid: u32) -> String {
    fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default()
}

/// Whether `pid` is a readiness probe (`virt-launcher probe ...`, exec'd by the kubelet for a
/// moment), not a launcher.
fn is_probe(pid: u32) -> bool {
    fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| c.split(|b| *b == 0).nth(1) == Some(b"probe".as_slice()))
}

/// Parent pid from /proc/PID/stat.
fn ppid(pid: u32) -> Option<u32> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Whether `pid` runs in one of the node's pod cgroups (not a launcher of another test on this
/// machine).
fn in_node_pods(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| c.contains("/microvirt-node/"))
}

/// Node memory of a set of launchers, in KiB.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct MemoryTotals {
    /// Launcher processes measured.
    pub(crate) launchers: usize,
    /// RSS and PSS of the launchers.
    pub(crate) launcher_rss: u64,
    pub(crate) launcher_pss: u64,
    /// The part of the launchers' RSS that is guest RAM.
    pub(crate) guest_rss: u64,
    /// RSS and PSS of the launchers, their shims and sandboxes.
    pub(crate) all_rss: u64,
    pub(crate) all_pss: u64,
}

/// Memory of the node's launchers and their runtime helpers: per VMI (mean) and in total.
/// Fails unless there are exactly `expect` launchers, if given.
pub(crate) fn memory_report(
    title: &str,
    guest_mib: u32,
    expect: Option<usize>,
    out: &mut String,
) -> Result<MemoryTotals> {
    let all = pids();
    let launchers: Vec<u32> = all
        .iter()
        .copied()
        .filter(|p| exe_name(*p) == "virt-launcher" && in_node_pods(*p) && !is_probe(*p))
        .collect();
    ensure!(!launchers.is_empty(), "no virt-launcher processes found");
    if let Some(n) = expect {
        ensure!(
            launchers.len() == n,
            "{} launcher processes on the node, expected {n}",
            launchers.len()
        );
    }
    // A launcher's shim is its parent; the shim's other child is the sandbox's pause.
    let mut shims = Vec::new();
    let mut pauses = Vec::new();
    for l in &launchers {
        if let Some(s) = ppid(*l).filter(|s| exe_name(*s) == "containerd-shim-runc-v2") {
            shims.push(s);
            pauses.extend(
                all.iter()
                    .copied()
                    .filter(|p| ppid(*p) == Some(s) && exe_name(*p) == "pause"),
            );
        }
    }
    let sum = |ps: &[u32]| {
        ps.iter()
            .filter_map(|p| rss_pss(*p))
            .fold((0u64, 0u64), |(a, b), (r, p)| (a + r, b + p))
    };
    let n = launchers.len() as u64;
    let (l_rss, l_pss) = sum(&launchers);
    let guest: u64 = launchers
        .iter()
        .map(|p| guest_rss(*p, u64::from(guest_mib) * 1024))
        .sum();
    let (s_rss, s_pss) = sum(&shims);
    let (p_rss, p_pss) = sum(&pauses);
    let mean = |k: u64| k as f64 / 1024.0 / n as f64;
    let total = |k: u64| k as f64 / 1024.0;
    let _ = writeln!(
        out,
        "\n{title} ({n} launchers, {} shims, {} pause; MiB)",
        shims.len(),
        pauses.len()
    );
    let _ = writeln!(
        out,
        "  {:<40} {:>8} {:>8} {:>10} {:>10}",
        "", "RSS/VMI", "PSS/VMI", "RSS total", "PSS total"
    );
    let mut row = |label: &str, rss: u64, pss: Option<u64>| {
        let _ = writeln!(
            out,
            "  {label:<40} {:>8.1} {:>8} {:>10.1} {:>10}",
            mean(rss),
            pss.map(|p| format!("{:.1}", mean(p))).unwrap_or_default(),
            total(rss),
            pss.map(|p| format!("{:.1}", total(p))).unwrap_or_default(),
        );
    };
    row("virt-launcher (all)", l_rss, Some(l_pss));
    row("  of which guest RAM resident", guest, None);
    row(
        "  virt-launcher beyond guest RAM (ours)",
        l_rss.saturating_sub(guest),
        Some(l_pss.saturating_sub(guest)),
    );
    row("containerd-shim-runc-v2 (runtime's)", s_rss, Some(s_pss));
    row("pause / sandbox (runtime's)", p_rss, Some(p_pss));
    let all_rss = l_rss + s_rss + p_rss;
    let all_pss = l_pss + s_pss + p_pss;
    row("all (launcher + shim + pause)", all_rss, Some(all_pss));
    row(
        "total beyond guest RAM",
        all_rss.saturating_sub(guest),
        Some(all_pss.saturating_sub(guest)),
    );
    Ok(MemoryTotals {
        launchers: launchers.len(),
        launcher_rss: l_rss,
        launcher_pss: l_pss,
        guest_rss: guest,
        all_rss,
        all_pss,
    })
}

pub(crate) fn wait_all_ready(
    seen: &Arc<Mutex<Seen>>,
    names: &[String],
    timeout: Duration,
) -> Result<()> {
    wait_for("every VMI Ready", timeout, |last| {
        let s = seen.lock().unwrap_or_else(|e| e.into_inner());
        let ready = names
            .iter()
            .filter(|n| s.vmi_ready.contains_key(*n))
            .count();
        *last = format!("{ready}/{} Ready", names.len());
        Ok((ready == names.len()).then_some(()))
    })
}

pub(crate) fn post_vmi(rc: &RealCluster, ns: &str, body: &str) -> Result<()> {
    let r = rc.control_plane().request(
        "POST",
        &format!("/apis/microvirt.io/v1alpha1/namespaces/{ns}/virtualmachineinstances"),
        Some(body),
    )?;
    ensure!(
        r.status == 201,
        "creating a VMI: HTTP {} {}",
        r.status,
        r.body
    );
    Ok(())
}

/// Deletes every pod of namespace `ns` and waits until none is left.
fn delete_pods(k: &Kubectl, ns: &str) -> Result<()> {
    k.run(&[
        "-n",
        ns,
        "delete",
        "pod",
        "--all",
        "--wait=true",
        "--timeout=300s",
    ])?;
    wait_no_pods(k, ns)
}

/// Waits until namespace `ns` has no pod left (deleted ones included).
pub(crate) fn wait_no_pods(k: &Kubectl, ns: &str) -> Result<()> {
    wait_for(
        "the namespace's pods gone",
        Duration::from_secs(300),
        |last| {
            let p = k.list(ns, "pod", None)?;
            *last = format!("{} pods", p.len());
            Ok(p.is_empty().then_some(()))
        },
    )
}

/// The P50 and P95 of `map`'s intervals from the shape's starts.
fn p50_p95(shape: &Shape, map: &BTreeMap<String, Duration>) -> Option<(Duration, Duration)> {
    let d: Vec<Duration> = shape
        .starts
        .iter()
        .filter_map(|(n, s)| map.get(n).map(|t| t.saturating_sub(*s)))
        .collect();
    percentiles(d).map(|(p50, p95, _)| (p50, p95))
}

/// The VMIs' intervals as ratios to the minimal pods' create → Running (same run, same rate).
pub(crate) fn ratios(baseline: &Shape, vmis: &Shape, out: &mut String) {
    let Some((b50, b95)) = p50_p95(baseline, &baseline.seen.pod_running) else {
        return;
    };
    let _ = writeln!(
        out,
        "  {:<36} {:>9} {:>9}   (goal: VMI Ready P50 <= 1.3x)",
        "as a ratio to the minimal pods' Running", "P50", "P95"
    );
    for (label, map) in [
        ("create -> launcher pod Running", &vmis.seen.pod_running),
        ("create -> VMI Ready", &vmis.seen.vmi_ready),
    ] {
        if let Some((p50, p95)) = p50_p95(vmis, map) {
            let _ = writeln!(
                out,
                "  {label:<36} {:>8.2}x {:>8.2}x",
                p50.as_secs_f64() / b50.as_secs_f64().max(1e-9),
                p95.as_secs_f64() / b95.as_secs_f64().max(1e-9)
            );
        }
    }
}

/// Runs both shapes on `rc` (microvirt installed) and returns the report.
pub fn run(rc: &RealCluster, o: &BenchOptions) -> Result<String> {
    let k = Kubectl::new(rc.kubeconfig_path());
    let mut report = String::new();
    let _ = writeln!(
        report,
        "microvirt real-node benchmark: {} VMIs per shape, demo guest ({} MiB, 1 vCPU, \
         masquerade NIC), {} ({} cores)",
        o.count,
        o.guest_mib,
        rc.node_name(),
        thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );

    // Warm-up: the first pod on a node pays for unpacking images.
    let launcher_pod = {
        let ns = TestNamespace::create(&k, "bench-warmup")?;
        post_vmi(rc, ns.name(), &vmi_json("warmup", "", o))?;
        wait_for("the warm-up VMI Ready", Duration::from_secs(180), |_| {
            Ok(k.get(ns.name(), "vmi", "warmup")?
                .filter(|v| condition_true(v, "Ready")))
        })?;
        let pod = k
            .get(ns.name(), "pod", "virt-launcher-warmup")?
            .context("the warm-up VMI's launcher pod")?;
        k.run(&["-n", ns.name(), "delete", "vmi", "warmup", "--wait=true"])?;
        wait_no_pods(&k, ns.name())?;
        pod
    };

    // Idle CPU of the empty cluster, then the baseline: minimal pods at the same rate.
    let mut idle = vec![cpu::Window {
        title: "empty cluster".into(),
        objects: 0,
        usage: cpu::measure(Duration::from_secs(3), o.idle_window)?,
    }];
    let baseline = {
        let ns = TestNamespace::create(&k, "bench-baseline")?;
        let shape = baseline::minimal_pods(rc, &k, ns.name(), o.count, o.interval)?;
        idle.push(cpu::Window {
            title: format!("{} idle minimal pods", o.count),
            objects: o.count,
            usage: cpu::measure(Duration::from_secs(3), o.idle_window)?,
        });
        delete_pods(&k, ns.name())?;
        shape
    };
    let mut ladder = Vec::new();
    if o.ladder {
        let ns = TestNamespace::create(&k, "bench-ladder")?;
        for (title, spec) in baseline::ladder(&launcher_pod)? {
            let shape = baseline::pods_with_spec(
                rc,
                &k,
                ns.name(),
                o.count,
                o.interval,
                format!("ladder: {title}"),
                &spec,
            )?;
            delete_pods(&k, ns.name())?;
            ladder.push(shape);
        }
    }

    // Shape 1: VMIs created `interval` apart.
    let ns1 = TestNamespace::create(&k, "bench-create")?;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let epoch = Instant::now();
    let _w1 = Watch::start(&k, ns1.name(), "vmi", epoch, seen.clone())?;
    let _w2 = Watch::start(&k, ns1.name(), "pod", epoch, seen.clone())?;
    thread::sleep(Duration::from_secs(1));
    let mut starts = BTreeMap::new();
    let names: Vec<String> = (0..o.count).map(|i| format!("vmi-{i:03}")).collect();
    let cpu0 = cpu::Sample::take()?;
    let t0 = Instant::now();
    for (i, n) in names.iter().enumerate() {
        let due = t0 + o.interval * i as u32;
        if let Some(d) = due.checked_duration_since(Instant::now()) {
            thread::sleep(d);
        }
        starts.insert(n.clone(), epoch.elapsed());
        post_vmi(rc, ns1.name(), &vmi_json(n, "", o))?;
    }
    wait_all_ready(&seen, &names, Duration::from_secs(600))?;
    let wall = t0.elapsed();
    let started = cpu::usage(&cpu0, &cpu::Sample::take()?);
    thread::sleep(Duration::from_secs(3));
    let mut memory = String::new();
    memory_report("memory per running VMI", o.guest_mib, None, &mut memory)?;
    drop((_w1, _w2));
    idle.push(cpu::Window {
        title: format!("{} idle running VMIs", o.count),
        objects: o.count,
        usage: cpu::measure(Duration::from_secs(1), o.idle_window)?,
    });
    let shape1 = Shape {
        title: format!(
            "{} VMIs created {} ms apart",
            o.count,
            o.interval.as_millis()
        ),
        starts,
        seen: std::mem::take(&mut *seen.lock().unwrap_or_else(|e| e.into_inner())),
        wall,
        from: "create",
        pods_started: true,
        vmis: true,
        cpu: Some(started),
    };
    // Free the node before the next shape.
    k.run(&[
        "-n",
        ns1.name(),
        "delete",
        "vmi",
        "--all",
        "--wait=true",
        "--timeout=300s",
    ])?;
    drop(ns1);

    // Shape 2: a VMIRS scaled 0 -> count.
    let ns2 = TestNamespace::create(&k, "bench-scale")?;
    let rs = format!(
        r#"{{"apiVersion":"microvirt.io/v1alpha1","kind":"VirtualMachineInstanceReplicaSet",
"metadata":{{"name":"pool"}},"spec":{{"replicas":0,"selector":{{"matchLabels":{{"app":"pool"}}}},
"template":{{"metadata":{{"labels":{{"app":"pool"}}}},"spec":{}}}}}}}"#,
        spec_json(o)
    );
    let r = rc.control_plane().request(
        "POST",
        &format!(
            "/apis/microvirt.io/v1alpha1/namespaces/{}/virtualmachineinstancereplicasets",
            ns2.name()
        ),
        Some(&rs),
    )?;
    ensure!(
        r.status == 201,
        "creating the VMIRS: HTTP {} {}",
        r.status,
        r.body
    );
    let seen = Arc::new(Mutex::new(Seen::default()));
    let epoch = Instant::now();
    let _w1 = Watch::start(&k, ns2.name(), "vmi", epoch, seen.clone())?;
    let _w2 = Watch::start(&k, ns2.name(), "pod", epoch, seen.clone())?;
    thread::sleep(Duration::from_secs(1));
    let t0 = Instant::now();
    let scaled_at = epoch.elapsed();
    k.run(&[
        "-n",
        ns2.name(),
        "scale",
        "vmirs/pool",
        &format!("--replicas={}", o.count),
    ])?;
    let names = wait_for("the VMIRS's VMIs", Duration::from_secs(120), |last| {
        let v = k.list(ns2.name(), "vmi", Some("app=pool"))?;
        *last = format!("{} VMIs", v.len());
        Ok((v.len() == o.count).then(|| {
            v.iter()
                .filter_map(|v| v["metadata"]["name"].as_str().map(str::to_string))
                .collect::<Vec<_>>()
        }))
    })?;
    wait_all_ready(&seen, &names, Duration::from_secs(600))?;
    let wall = t0.elapsed();
    drop((_w1, _w2));
    let shape2 = Shape {
        title: format!("VMIRS scaled 0 -> {} (intervals from the scale)", o.count),
        starts: names.iter().map(|n| (n.clone(), scaled_at)).collect(),
        seen: std::mem::take(&mut *seen.lock().unwrap_or_else(|e| e.into_inner())),
        wall,
        from: "scale",
        pods_started: true,
        vmis: true,
        cpu: None,
    };
    k.run(&["-n", ns2.name(), "scale", "vmirs/pool", "--replicas=0"])?;
    drop(ns2);

    let mut tables = String::new();
    baseline.table(&mut tables);
    for s in &ladder {
        s.table(&mut tables);
    }
    shape1.table(&mut tables);
    ratios(&baseline, &shape1, &mut tables);
    shape2.table(&mut tables);
    let rows: Vec<(&str, usize, &cpu::Usage)> = std::iter::once(&baseline)
        .chain(&ladder)
        .chain(std::iter::once(&shape1))
        .filter_map(|s| Some((s.title.as_str(), s.starts.len(), s.cpu.as_ref()?)))
        .collect();
    cpu::start_table(&rows, &mut tables);
    cpu::table(&idle, &mut tables);
    Ok(format!("{report}{tables}{memory}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let (p50, p95, max) = percentiles(v).unwrap();
        assert_eq!(
            (p50, p95, max),
            (
                Duration::from_millis(50),
                Duration::from_millis(95),
                Duration::from_millis(100)
            )
        );
        assert_eq!(percentiles(vec![]), None);
        let one = percentiles(vec![Duration::from_millis(7)]).unwrap();
        assert_eq!(one.0, Duration::from_millis(7));
    }

    #[test]
    fn vmi_json_is_valid() {
        let v: Value = serde_json::from_str(&vmi_json("a", "", &BenchOptions::default())).unwrap();
        assert_eq!(v["spec"]["domain"]["memory"]["guest"], "32Mi");
        assert_eq!(
            v["spec"]["domain"]["firmware"]["kernelBoot"]["container"]["image"],
            DEMO_KERNEL
        );
    }
}
