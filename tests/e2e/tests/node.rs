//! Whole-system tests: microvirt on a real single-node cluster (etcd, kube-apiserver,
//! kube-scheduler, kube-controller-manager, kubelet, containerd + runc, CNI bridge; the
//! operator Deployment and the virt-handler DaemonSet from `deploy/`, images built from this
//! workspace), VMIs booting the built-in demo guest from the `microvirt/demo-kernel:dev`
//! kernelBoot image on this machine's /dev/kvm.
//!
//! One node per machine, so this file has its own `main` (libtest-mimic): it builds and starts
//! everything once, runs the scenarios (one namespace each; one at a time by default, since
//! some restart shared components), then tears the cluster down whatever happened. If the
//! set-up fails, every scenario fails with its error.
//!
//! `cargo test -p microvirt-e2e --test node [-- FILTER]`; `MICROVIRT_KEEP_CLUSTER_DIR=1` keeps
//! the control plane's logs, the node's logs stay in /var/lib/microvirt-node/logs.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use libtest_mimic::{Arguments, Failed, Trial};
use microvirt_e2e::deploy::{self, NAMESPACE};
use microvirt_e2e::images::{self, ImageSet, DEMO_KERNEL, KERNEL_PATH};
use microvirt_e2e::kube::{condition, condition_true, wait_for, Kubectl, TestNamespace};
use microvirt_testsupport::RealCluster;
use serde_json::Value;

#[path = "node/pool.rs"]
mod pool;

use deploy::{wait_kvm_allocatable, HANDLER_NAMESPACE as HANDLER_NS};
/// How long a VMI may take from creation to Ready on a busy 2-core machine.
const READY: Duration = Duration::from_secs(120);

struct Env {
    rc: RealCluster,
    k: Kubectl,
    /// Directory with `kubectl-microvirt`, for `kubectl microvirt`.
    plugin_dir: PathBuf,
}

type Scenario = fn(&Env) -> Result<()>;

fn scenarios() -> Vec<(&'static str, Scenario)> {
    vec![
        ("vmirs_of_5_runs_and_scales_5_10_2", vmirs_scale),
        (
            "vmi_ready_without_the_boot_timer",
            ready_without_the_boot_timer,
        ),
        ("console_pause_unpause_on_a_real_pod", console_pause_unpause),
        ("launcher_pod_deleted_by_hand", launcher_pod_deleted),
        ("vm_run_strategies_and_vmi_deletion", vm_lifecycle),
        ("operator_leader_failover", operator_failover),
        ("device_plugin_and_kubelet_restarts", restarts),
        ("bad_input_fails_clearly", bad_input),
        ("deploy_examples_run", deploy_examples),
        ("guest_reachable_through_the_pod_ip", guest_network),
        (
            "pool_scales_0_5_0_5_from_warm_members",
            pool::pool_scale_from_warm,
        ),
        (
            "pool_paused_and_template_change",
            pool::pool_paused_and_template_change,
        ),
        (
            "pool_member_dies_and_foreign_snapshot",
            pool::pool_member_dies_and_foreign_snapshot,
        ),
        ("pool_bad_specs_refused", pool::pool_bad_specs_refused),
    ]
}

fn main() -> ExitCode {
    let mut args = Arguments::from_args();
    // Scenarios restart shared components (kubelet, device plugin, operator leader): one at a
    // time unless asked otherwise.
    if args.test_threads.is_none() {
        args.test_threads = Some(1);
    }
    let list = scenarios();
    let selected = list.iter().any(|(name, _)| selected(&args, name));
    let env: Arc<std::result::Result<Env, String>> = Arc::new(if selected && !args.list {
        let started = Instant::now();
        let e = start().map_err(|e| format!("setting up the real node failed: {e:#}"));
        eprintln!(
            "[e2e] set-up {} in {:.1} s",
            if e.is_ok() { "done" } else { "FAILED" },
            started.elapsed().as_secs_f64()
        );
        e
    } else {
        Err("the node was not set up".into())
    });
    let trials = list
        .into_iter()
        .map(|(name, f)| {
            let env = env.clone();
            Trial::test(name, move || {
                let env = env
                    .as_ref()
                    .as_ref()
                    .map_err(|e| Failed::from(e.as_str()))?;
                let t = Instant::now();
                let r = f(env);
                eprintln!("[e2e] {name}: {:.1} s", t.elapsed().as_secs_f64());
                r.map_err(|e| Failed::from(format!("{e:#}")))
            })
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    // The trials (and their references) are gone: this drops the last one, and the cluster's
    // Drop removes the node (processes, mounts, cgroups, veth, kernel settings) and the
    // control plane.
    drop(env);
    conclusion.exit_code()
}

/// libtest's filter semantics, to skip the set-up when no scenario is selected.
fn selected(args: &Arguments, name: &str) -> bool {
    let matches = |f: &str| {
        if args.exact {
            name == f
        } else {
            name.contains(f)
        }
    };
    if args.skip.iter().any(|s| matches(s)) {
        return false;
    }
    if args.ignored {
        return false;
    }
    args.filter.as_deref().is_none_or(matches)
}

fn start() -> Result<Env> {
    let plugin_dir = build_kubectl_microvirt()?;
    // Returns once the node can run VMIs (virt-handler Ready, the KVM resource allocatable).
    let rc = microvirt_e2e::start_cluster(ImageSet::TESTS, false, None)?;
    let k = Kubectl::new(rc.kubeconfig_path());
    Ok(Env { rc, k, plugin_dir })
}

/// `cargo build -p kubectl-microvirt`; returns the directory of the binary.
fn build_kubectl_microvirt() -> Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let root = images::workspace_root();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let st = Command::new(cargo)
        .current_dir(&root)
        .env("CARGO_TARGET_DIR", &target)
        .args([
            "build",
            "-p",
            "kubectl-microvirt",
            "--bin",
            "kubectl-microvirt",
        ])
        .status()
        .context("cargo build -p kubectl-microvirt")?;
    ensure!(
        st.success(),
        "cargo build -p kubectl-microvirt failed ({st})"
    );
    Ok(target.join("debug"))
}

/// A VMI spec booting the demo guest (from the demo kernelBoot image) with `scenario`, 32 MiB,
/// a masquerade interface, 10m CPU (so dozens fit on a 2-core node), indented for a template.
fn demo_spec(scenario: &str, grace: u32, indent: usize) -> String {
    let text = format!(
        "terminationGracePeriodSeconds: {grace}\n\
         domain:\n\
         \x20 memory: {{guest: 32Mi}}\n\
         \x20 resources: {{requests: {{cpu: 10m}}}}\n\
         \x20 firmware:\n\
         \x20   kernelBoot:\n\
         \x20     kernelArgs: testguest.scenario={scenario}\n\
         \x20     container: {{image: {DEMO_KERNEL}, kernelPath: {KERNEL_PATH}}}\n\
         \x20 devices:\n\
         \x20   interfaces: [{{name: default, masquerade: {{}}}}]\n\
         networks: [{{name: default, pod: {{}}}}]\n"
    );
    let pad = " ".repeat(indent);
    text.lines().map(|l| format!("{pad}{l}\n")).collect()
}

fn vmi_yaml(name: &str, scenario: &str, grace: u32) -> String {
    format!(
        "apiVersion: microvirt.io/v1alpha1\nkind: VirtualMachineInstance\nmetadata:\n  name: {name}\n\
         spec:\n{}",
        demo_spec(scenario, grace, 2)
    )
}

/// A VMIRS of idle demo guests: `halt-forever` halts the vCPU (no CPU used while idle) and
/// ignores the shutdown request, so the launcher stops it after the short grace period.
fn vmirs_yaml(name: &str, replicas: u32) -> String {
    format!(
        "apiVersion: microvirt.io/v1alpha1\nkind: VirtualMachineInstanceReplicaSet\n\
         metadata:\n  name: {name}\nspec:\n  replicas: {replicas}\n  selector:\n    \
         matchLabels: {{app: {name}}}\n  template:\n    metadata:\n      labels: {{app: {name}}}\n    \
         spec:\n{}",
        demo_spec("halt-forever", 2, 6)
    )
}

fn phase(v: &Value) -> &str {
    v["status"]["phase"].as_str().unwrap_or("")
}

fn vmis(env: &Env, ns: &str, selector: Option<&str>) -> Result<Vec<Value>> {
    env.k.list(ns, "vmi", selector)
}

fn launcher_pods(env: &Env, ns: &str) -> Result<Vec<Value>> {
    env.k
        .list(ns, "pod", Some("app.kubernetes.io/name=virt-launcher"))
}

/// Running + Ready, with the pod's IP and the node's name in the status.
fn running_ready(env: &Env, v: &Value) -> bool {
    phase(v) == "Running"
        && condition_true(v, "Ready")
        && v["status"]["interfaces"][0]["ipAddress"]
            .as_str()
            .is_some_and(|ip| !ip.is_empty())
        && v["status"]["nodeName"] == env.rc.node_name()
}

fn summary(vs: &[Value]) -> String {
    vs.iter()
        .map(|v| {
            format!(
                "{}:{}{}",
                v["metadata"]["name"].as_str().unwrap_or("?"),
                phase(v),
                if condition_true(v, "Ready") {
                    "+Ready"
                } else {
                    ""
                }
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn wait_vmi(
    env: &Env,
    ns: &str,
    name: &str,
    what: &str,
    f: impl Fn(&Value) -> bool,
) -> Result<Value> {
    wait_for(&format!("VMI {name} {what}"), READY, |last| {
        let v = env.k.get(ns, "vmi", name)?;
        *last = v
            .as_ref()
            .map(|v| format!("{} {}", phase(v), v["status"]))
            .unwrap_or_else(|| "no VMI".into());
        Ok(v.filter(|v| f(v)))
    })
}

fn wait_ready(env: &Env, ns: &str, name: &str) -> Result<Value> {
    wait_vmi(env, ns, name, "Running and Ready", |v| {
        running_ready(env, v)
    })
}

/// Waits until the VMIs of `selector` are exactly `n`, all Running and Ready, and exactly `n`
/// launcher pods exist in `ns`.
fn wait_replicas(env: &Env, ns: &str, selector: &str, n: usize) -> Result<Vec<Value>> {
    wait_for(&format!("{n} Ready VMIs ({selector})"), READY * 2, |last| {
        let vs = vmis(env, ns, Some(selector))?;
        let pods = launcher_pods(env, ns)?;
        *last = format!("{} launcher pods; {}", pods.len(), summary(&vs));
        Ok(
            (vs.len() == n && pods.len() == n && vs.iter().all(|v| running_ready(env, v)))
                .then_some(vs),
        )
    })
}

fn vmirs_scale(env: &Env) -> Result<()> {
    let ns = TestNamespace::create(&env.k, "e2e-vmirs")?;
    let ns = ns.name();
    env.k.apply(ns, &vmirs_yaml("demo", 5))?;
    let vs = wait_replicas(env, ns, "app=demo", 5)?;
    // `kubectl get vmi` shows each VMI's pod IP and node.
    let table = env.k.run(&["-n", ns, "get", "vmi"])?;
    for v in &vs {
        let name = v["metadata"]["name"].as_str().unwrap();
        let ip = v["status"]["interfaces"][0]["ipAddress"].as_str().unwrap();
        let line = table
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .with_context(|| format!("{name} missing from:\n{table}"))?;
        ensure!(
            line.contains(ip) && line.contains(env.rc.node_name()) && line.contains("True"),
            "kubectl get vmi line {line:?} lacks the IP {ip}, the node or Ready"
        );
        // The IP is the launcher pod's.
        let pod = env
            .k
            .get(ns, "pod", &format!("virt-launcher-{name}"))?
            .context("launcher pod")?;
        ensure!(
            pod["status"]["podIP"] == ip,
            "pod IP differs from the VMI's"
        );
    }
    env.k
        .run(&["-n", ns, "scale", "vmirs/demo", "--replicas=10"])?;
    wait_replicas(env, ns, "app=demo", 10)?;
    env.k
        .run(&["-n", ns, "scale", "vmirs/demo", "--replicas=2"])?;
    wait_replicas(env, ns, "app=demo", 2)?;
    let rs = env.k.get(ns, "vmirs", "demo")?.context("VMIRS")?;
    ensure!(
        rs["status"]["readyReplicas"] == 2,
        "VMIRS status {}",
        rs["status"]
    );
    Ok(())
}

/// `kubectl microvirt ARGS` with the plugin on PATH (kubectl wants the plugin name first; the
/// plugin passes `--kubeconfig` on).
fn kubectl_microvirt(env: &Env, args: &[&str]) -> Command {
    let mut c = Command::new("kubectl");
    let path = format!(
        "{}:{}",
        env.plugin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    c.env("PATH", path)
        .arg("microvirt")
        .arg(format!("--kubeconfig={}", env.k.kubeconfig().display()))
        .args(args);
    c
}

fn console_pause_unpause(env: &Env) -> Result<()> {
    let ns = TestNamespace::create(&env.k, "e2e-console")?;
    let ns = ns.name();
    env.k.apply(ns, &vmi_yaml("echo", "echo", 5))?;
    wait_ready(env, ns, "echo")?;

    // The console: the guest's serial output (replayed from boot) and our line echoed back.
    // In a process group of its own: the plugin runs `kubectl exec` as its child, which holds
    // the pipe too; the whole group is ended below.
    let mut child = kubectl_microvirt(env, &["-n", ns, "console", "echo"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .context("kubectl microvirt console")?;
    let out = Arc::new(Mutex::new(Vec::new()));
    let mut stdout = child.stdout.take().unwrap();
    let o2 = out.clone();
    let reader = thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 {
                break;
            }
            o2.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    let mut stdin = child.stdin.take().unwrap();
    let text = || String::from_utf8_lossy(&out.lock().unwrap()).into_owned();
    let r = wait_for(
        "the guest's console output",
        Duration::from_secs(30),
        |last| {
            *last = text();
            Ok(last.contains("echo: ready").then_some(()))
        },
    )
    .and_then(|_| {
        stdin.write_all(b"hello-from-the-console\r")?;
        stdin.flush()?;
        wait_for(
            "our line echoed by the guest",
            Duration::from_secs(30),
            |last| {
                *last = text();
                Ok(last.contains("echo: hello-from-the-console").then_some(()))
            },
        )
    });
    // Our own child's process group (its pid is the group id).
    if let Ok(pgid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill(2) with the negated id of the group we created for this child.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
    }
    let _ = child.wait();
    let _ = reader.join();
    r.with_context(|| format!("console output:\n{}", text()))?;

    // pause / unpause through the launcher; the node agent reports the Paused condition.
    let st = kubectl_microvirt(env, &["-n", ns, "pause", "echo"]).output()?;
    ensure!(st.status.success(), "kubectl microvirt pause: {st:?}");
    wait_vmi(env, ns, "echo", "Paused", |v| condition_true(v, "Paused"))?;
    let st = kubectl_microvirt(env, &["-n", ns, "unpause", "echo"]).output()?;
    ensure!(st.status.success(), "kubectl microvirt unpause: {st:?}");
    wait_vmi(env, ns, "echo", "not Paused", |v| {
        condition(v, "Paused").is_some_and(|c| c["status"] == "False") && phase(v) == "Running"
    })?;
    Ok(())
}

/// KubeVirt's Ready: a guest that never writes the boot timer (every stock guest) is Ready
/// once its VM runs in a Ready launcher pod — `kubectl wait --for=condition=Ready` returns —
/// through the node agent's readiness gate, not a probe; paused it is not Ready.
fn ready_without_the_boot_timer(env: &Env) -> Result<()> {
    let ns = TestNamespace::create(&env.k, "e2e-ready")?;
    let ns = ns.name();
    env.k.apply(ns, &vmi_yaml("stock", "no-boot-timer", 2))?;
    // The VMI must exist before `kubectl wait` (it fails at once on a missing object).
    wait_vmi(env, ns, "stock", "created", |_| true)?;
    env.k.run(&[
        "-n",
        ns,
        "wait",
        "--for=condition=Ready",
        "--timeout=120s",
        "vmi/stock",
    ])?;
    let v = env.k.get(ns, "vmi", "stock")?.context("VMI")?;
    ensure!(
        running_ready(env, &v),
        "not Running and Ready: {}",
        v["status"]
    );
    ensure!(
        v["status"]["bootTimeMs"].is_null(),
        "the guest signalled boot: {}",
        v["status"]
    );
    // The pod's own Ready (what Services follow) comes from the kubelet, a moment after the
    // operator saw the gate.
    let pod = wait_for("the launcher pod Ready", READY, |last| {
        let p = env.k.get(ns, "pod", "virt-launcher-stock")?;
        *last = p
            .as_ref()
            .map(|p| p["status"]["conditions"].to_string())
            .unwrap_or_default();
        Ok(p.filter(|p| condition_true(p, "Ready")))
    })?;
    ensure!(
        pod["spec"]["containers"][0]["readinessProbe"].is_null(),
        "the launcher has a readiness probe: {}",
        pod["spec"]["containers"][0]
    );
    ensure!(
        pod["spec"]["readinessGates"][0]["conditionType"] == "microvirt.io/vm-running"
            && condition_true(&pod, "microvirt.io/vm-running")
            && condition_true(&pod, "Ready")
            && condition(&pod, "microvirt.io/guest-booted").is_none(),
        "launcher pod: {} {}",
        pod["spec"]["readinessGates"],
        pod["status"]["conditions"]
    );
    // The guest runs (its console is the pod's log) and never wrote the boot timer.
    wait_for("the guest's console", READY, |last| {
        *last = env
            .k
            .run(&["-n", ns, "logs", "virt-launcher-stock"])
            .unwrap_or_default();
        Ok(last
            .contains("no-boot-timer: running, halting")
            .then_some(()))
    })
    .map(|_| ())?;
    let log = env.k.run(&["-n", ns, "logs", "virt-launcher-stock"])?;
    ensure!(
        log.contains("boot-timer: not written") && !log.contains("guest booted"),
        "console: {log}"
    );
    // Paused: not Ready (pod and VMI); unpaused: Ready again.
    let st = kubectl_microvirt(env, &["-n", ns, "pause", "stock"]).output()?;
    ensure!(st.status.success(), "kubectl microvirt pause: {st:?}");
    let v = wait_vmi(env, ns, "stock", "paused and not Ready", |v| {
        condition_true(v, "Paused") && condition(v, "Ready").is_some_and(|c| c["status"] == "False")
    })?;
    ensure!(
        condition(&v, "Ready").is_some_and(|c| c["reason"] == "VMPaused"),
        "Ready while paused: {}",
        v["status"]
    );
    let st = kubectl_microvirt(env, &["-n", ns, "unpause", "stock"]).output()?;
    ensure!(st.status.success(), "kubectl microvirt unpause: {st:?}");
    wait_vmi(env, ns, "stock", "Ready again", |v| {
        !condition_true(v, "Paused") && running_ready(env, v)
    })?;
    Ok(())
}

fn launcher_pod_deleted(env: &Env) -> Result<()> {
    let ns = TestNamespace::create(&env.k, "e2e-poddel")?;
    let ns = ns.name();
    // A VMI whose pod is deleted by hand fails, with a reason.
    env.k.apply(ns, &vmi_yaml("alone", "halt-forever", 2))?;
    wait_ready(env, ns, "alone")?;
    env.k.run(&[
        "-n",
        ns,
        "delete",
        "pod",
        "virt-launcher-alone",
        "--wait=false",
    ])?;
    let failed = wait_vmi(env, ns, "alone", "Failed", |v| phase(v) == "Failed")?;
    let reason = failed["status"]["reason"].as_str().unwrap_or("");
    ensure!(
        !reason.is_empty(),
        "Failed without a reason: {}",
        failed["status"]
    );
    ensure!(!condition_true(&failed, "Ready"), "a failed VMI is Ready");

    // A VMIRS replaces such a VMI.
    env.k.apply(ns, &vmirs_yaml("keep", 1))?;
    let vs = wait_replicas_of(env, ns, "app=keep", 1)?;
    let first = vs[0]["metadata"]["name"].as_str().unwrap().to_string();
    env.k.run(&[
        "-n",
        ns,
        "delete",
        "pod",
        &format!("virt-launcher-{first}"),
        "--wait=false",
    ])?;
    let vs = wait_for("the VMIRS to replace its VMI", READY, |last| {
        let vs = vmis(env, ns, Some("app=keep"))?;
        *last = summary(&vs);
        Ok((vs.len() == 1
            && vs[0]["metadata"]["name"] != first.as_str()
            && running_ready(env, &vs[0]))
        .then_some(vs))
    })?;
    eprintln!(
        "[e2e] {first} replaced by {}",
        vs[0]["metadata"]["name"].as_str().unwrap_or("?")
    );
    Ok(())
}

fn vm_lifecycle(env: &Env) -> Result<()> {
    let ns = TestNamespace::create(&env.k, "e2e-vm")?;
    let ns = ns.name();
    // A guest that powers off right after booting: runStrategy Always starts it again.
    let vm = format!(
        "apiVersion: microvirt.io/v1alpha1\nkind: VirtualMachine\nmetadata:\n  name: looper\n\
         spec:\n  runStrategy: Always\n  template:\n    metadata:\n      labels: {{app: looper}}\n    \
         spec:\n{}",
        demo_spec("basic", 5, 6)
    );
    env.k.apply(ns, &vm)?;
    let mut uids = std::collections::BTreeSet::new();
    wait_for(
        "the VM's VMI to be started again after the guest powered off",
        READY,
        |last| {
            if let Some(v) = env.k.get(ns, "vmi", "looper")? {
                if let Some(u) = v["metadata"]["uid"].as_str() {
                    uids.insert(u.to_string());
                }
                *last = format!("{} uid(s) seen, now {}", uids.len(), phase(&v));
            }
            Ok((uids.len() >= 2).then_some(()))
        },
    )?;
    // Halted: the VMI and its pod go away and stay away.
    let out = kubectl_microvirt(env, &["-n", ns, "stop", "looper"]).output()?;
    ensure!(out.status.success(), "kubectl microvirt stop: {out:?}");
    wait_for("the halted VM to have no VMI and no pod", READY, |last| {
        let v = env.k.get(ns, "vmi", "looper")?;
        let pods = launcher_pods(env, ns)?;
        *last = format!(
            "VMI {:?}, {} pod(s)",
            v.map(|v| phase(&v).to_string()),
            pods.len()
        );
        Ok((last.starts_with("VMI None") && pods.is_empty()).then_some(()))
    })?;
    thread::sleep(Duration::from_secs(3));
    ensure!(
        env.k.get(ns, "vmi", "looper")?.is_none(),
        "a halted VM got a VMI again"
    );

    // Deleting a VMI removes its pod within the grace period: the guest shuts down when asked,
    // so the kubelet never has to kill the launcher. The period is long so that a busy
    // machine's slow pod clean-up still fits; a launcher that ignored the request would be
    // killed only at its end, and the pod would be gone only after it.
    let grace = 60;
    env.k.apply(ns, &vmi_yaml("short", "ctrlaltdel", grace))?;
    wait_ready(env, ns, "short")?;
    // Ready means the VM runs, not that the guest got this far: wait until it listens.
    wait_for("the guest to wait for Ctrl-Alt-Del", READY, |last| {
        *last = env
            .k
            .run(&["-n", ns, "logs", "virt-launcher-short"])
            .unwrap_or_default();
        Ok(last.contains("waiting for ctrl-alt-del").then_some(()))
    })?;
    let t = Instant::now();
    env.k
        .run(&["-n", ns, "delete", "vmi", "short", "--wait=false"])?;
    wait_for("the pod and the VMI to be gone", READY, |last| {
        let p = env.k.get(ns, "pod", "virt-launcher-short")?;
        let v = env.k.get(ns, "vmi", "short")?;
        *last = format!("pod {}, VMI {}", p.is_some(), v.is_some());
        Ok((p.is_none() && v.is_none()).then_some(()))
    })?;
    let took = t.elapsed();
    ensure!(
        took <= Duration::from_secs(grace.into()),
        "the launcher pod took {took:?}, more than the {grace} s grace period"
    );
    eprintln!(
        "[e2e] VMI deletion -> pod gone in {:.1} s",
        took.as_secs_f64()
    );
    Ok(())
}

fn lease_holder(env: &Env) -> Result<Option<String>> {
    Ok(env
        .k
        .get(NAMESPACE, "lease", "microvirt-operator")?
        .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string)))
}

fn operator_failover(env: &Env) -> Result<()> {
    let leader = deploy::wait_operator(&env.k, READY)?;
    let pods: Vec<String> = env
        .k
        .list(
            NAMESPACE,
            "pod",
            Some("app.kubernetes.io/name=virt-operator"),
        )?
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    ensure!(
        pods.contains(&leader),
        "lease holder {leader} is not an operator pod: {pods:?}"
    );
    ensure!(pods.len() == 2, "expected 2 operator pods, found {pods:?}");
    env.k
        .run(&["-n", NAMESPACE, "delete", "pod", &leader, "--wait=false"])?;
    // Another live operator pod takes the lease: the standby, or (if the standby is just
    // restarting) the replacement the Deployment makes.
    let new = wait_for("another replica to take the lease", READY, |last| {
        let h = lease_holder(env)?;
        let live: Vec<String> = env
            .k
            .list(
                NAMESPACE,
                "pod",
                Some("app.kubernetes.io/name=virt-operator"),
            )?
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
            .collect();
        *last = format!("holder {h:?}, live operator pods {live:?}, deleted {leader}");
        Ok(h.filter(|h| h != &leader && live.contains(h)))
    })?;
    eprintln!("[e2e] lease moved from {leader} to {new}");
    // The new leader reconciles: a VMIRS gets exactly its replicas, and no more later.
    let ns = TestNamespace::create(&env.k, "e2e-failover")?;
    let ns = ns.name();
    env.k.apply(ns, &vmirs_yaml("after", 3))?;
    wait_replicas(env, ns, "app=after", 3)?;
    thread::sleep(Duration::from_secs(5));
    let pods = launcher_pods(env, ns)?;
    ensure!(
        pods.len() == 3,
        "{} launcher pods after settling",
        pods.len()
    );
    // The Deployment brings the second replica back.
    wait_for("2 operator pods again", READY, |last| {
        let n = env
            .k
            .list(
                NAMESPACE,
                "pod",
                Some("app.kubernetes.io/name=virt-operator"),
            )?
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .count();
        *last = format!("{n}");
        Ok((n == 2).then_some(()))
    })?;
    Ok(())
}

fn restarts(env: &Env) -> Result<()> {
    let ns = TestNamespace::create(&env.k, "e2e-restarts")?;
    let ns = ns.name();
    env.k.apply(ns, &vmi_yaml("before", "halt-forever", 2))?;
    wait_ready(env, ns, "before")?;
    let node = env.rc.node_name().to_string();

    // The device plugin (virt-handler) restarts: the DaemonSet makes a new pod, which
    // registers again.
    let old: Vec<String> = env
        .k
        .list(
            HANDLER_NS,
            "pod",
            Some("app.kubernetes.io/name=virt-handler"),
        )?
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    ensure!(old.len() == 1, "virt-handler pods: {old:?}");
    env.k
        .run(&["-n", HANDLER_NS, "delete", "pod", &old[0], "--wait=true"])?;
    wait_for("a new virt-handler pod Ready", READY, |last| {
        let ps = env.k.list(
            HANDLER_NS,
            "pod",
            Some("app.kubernetes.io/name=virt-handler"),
        )?;
        *last = format!("{} pod(s)", ps.len());
        Ok(ps
            .iter()
            .any(|p| p["metadata"]["name"] != old[0].as_str() && condition_true(p, "Ready"))
            .then_some(()))
    })?;
    wait_kvm_allocatable(&env.k, &node, READY)?;
    env.k
        .apply(ns, &vmi_yaml("after-plugin", "halt-forever", 2))?;
    wait_ready(env, ns, "after-plugin")?;

    // The kubelet restarts: it drops the plugin's socket, the plugin registers again.
    env.rc.restart_kubelet()?;
    wait_kvm_allocatable(&env.k, &node, READY)?;
    env.k
        .apply(ns, &vmi_yaml("after-kubelet", "halt-forever", 2))?;
    wait_ready(env, ns, "after-kubelet")?;
    // The first VMI ran through both.
    let v = env.k.get(ns, "vmi", "before")?.context("VMI before")?;
    ensure!(running_ready(env, &v), "VMI before: {}", v["status"]);
    Ok(())
}

fn bad_input(env: &Env) -> Result<()> {
    let ns = TestNamespace::create(&env.k, "e2e-bad")?;
    let ns = ns.name();
    env.k.apply(ns, &vmi_yaml("good", "halt-forever", 2))?;
    // A kernel image that does not exist anywhere.
    env.k.apply(
        ns,
        &vmi_yaml("noimage", "halt-forever", 2)
            .replace(DEMO_KERNEL, "microvirt/no-such-kernel:dev"),
    )?;
    // More memory than the node has.
    env.k.apply(
        ns,
        &vmi_yaml("huge", "halt-forever", 2).replace("guest: 32Mi", "guest: 4Ti"),
    )?;
    // A containerDisk image without the named file.
    let nofile = vmi_yaml("nofile", "halt-forever", 2)
        .replace(
            "    devices:\n",
            "    devices:\n      disks: [{name: root, disk: {bus: virtio}}]\n",
        )
        .replace(
            "networks: [{name: default, pod: {}}]\n",
            &format!(
                "networks: [{{name: default, pod: {{}}}}]\n  volumes:\n  - name: root\n    \
                 containerDisk: {{image: {DEMO_KERNEL}, path: /disk/missing.img}}\n"
            ),
        );
    env.k.apply(ns, &nofile)?;

    wait_ready(env, ns, "good")?;
    let noimage = wait_vmi(env, ns, "noimage", "an image pull error", |v| {
        condition(v, "Ready").is_some_and(|c| {
            matches!(
                c["reason"].as_str(),
                Some("ErrImagePull" | "ImagePullBackOff")
            )
        })
    })?;
    let msg = condition(&noimage, "Ready").unwrap()["message"].to_string();
    ensure!(msg.contains("no-such-kernel"), "message {msg}");
    let huge = wait_vmi(env, ns, "huge", "unschedulable", |v| {
        condition(v, "PodScheduled").is_some_and(|c| c["status"] == "False")
    })?;
    ensure!(phase(&huge) == "Scheduling", "{}", huge["status"]);
    let msg = condition(&huge, "PodScheduled").unwrap()["message"].to_string();
    ensure!(msg.contains("Insufficient memory"), "message {msg}");
    let nofile = wait_vmi(env, ns, "nofile", "Failed", |v| phase(v) == "Failed")?;
    let msg = nofile["status"]["message"].as_str().unwrap_or("");
    ensure!(msg.contains("missing.img"), "message {msg:?}");
    // What a user sees.
    for (name, needle) in [
        ("noimage", "no-such-kernel"),
        ("huge", "Insufficient memory"),
        ("nofile", "missing.img"),
    ] {
        let d = env.k.run(&["-n", ns, "describe", "vmi", name])?;
        ensure!(
            d.contains(needle),
            "kubectl describe vmi {name} lacks {needle:?}:\n{d}"
        );
    }
    // The good one was not disturbed, and nothing hangs on deletion.
    let good = env.k.get(ns, "vmi", "good")?.context("VMI good")?;
    ensure!(running_ready(env, &good), "{}", good["status"]);
    env.k
        .run(&["-n", ns, "delete", "vmi", "--all", "--wait=false"])?;
    wait_for("every VMI and pod gone", READY, |last| {
        let vs = vmis(env, ns, None)?;
        let ps = launcher_pods(env, ns)?;
        *last = format!("{} VMIs, {} pods", vs.len(), ps.len());
        Ok((vs.is_empty() && ps.is_empty()).then_some(()))
    })?;
    Ok(())
}

/// What deploy/README.md walks a user through: the examples run as they are.
fn deploy_examples(env: &Env) -> Result<()> {
    let ns = TestNamespace::create(&env.k, "e2e-examples")?;
    let ns = ns.name();
    let ex = deploy::deploy_dir().join("examples");
    for f in ["vmirs.yaml", "vm.yaml"] {
        let path = ex.join(f).display().to_string();
        env.k.run(&["-n", ns, "apply", "-f", &path])?;
    }
    wait_replicas_of(env, ns, "app=pool", 3)?;
    wait_ready(env, ns, "testvm")?;
    Ok(())
}

/// Like [`wait_replicas`], counting only the launcher pods of `selector`'s VMIs.
fn wait_replicas_of(env: &Env, ns: &str, selector: &str, n: usize) -> Result<Vec<Value>> {
    wait_for(&format!("{n} Ready VMIs ({selector})"), READY * 2, |last| {
        let vs = vmis(env, ns, Some(selector))?;
        *last = summary(&vs);
        Ok((vs.len() == n && vs.iter().all(|v| running_ready(env, v))).then_some(vs))
    })
}

/// The guest's masquerade interface answers through the pod IP: ICMP echo and UDP echo from the
/// node (its network namespace) and from this machine (the route into it).
fn guest_network(env: &Env) -> Result<()> {
    let ns = TestNamespace::create(&env.k, "e2e-net")?;
    let ns = ns.name();
    env.k.apply(ns, &vmi_yaml("netserve", "net-serve", 5))?;
    let v = wait_ready(env, ns, "netserve")?;
    let ip: std::net::Ipv4Addr = v["status"]["interfaces"][0]["ipAddress"]
        .as_str()
        .context("VMI IP")?
        .parse()?;
    // The guest got its address from the launcher's DHCP server (the console is the log).
    wait_for("the guest's DHCP lease", READY, |last| {
        *last = env
            .k
            .run(&["-n", ns, "logs", "virt-launcher-netserve"])
            .unwrap_or_default();
        Ok(last
            .contains("net-serve: ip=10.0.2.2/24 router=10.0.2.1")
            .then_some(()))
    })?;
    // Three echo replies, each awaited up to 5 s: `ping -c 3` counts a reply as lost once it is
    // later than twice the slowest RTT so far (busybox), which a busy machine exceeds (run G,
    // 2026-12-05: "3 packets transmitted, 2 packets received", RTTs 82 and 35 ms). Reachability
    // is the property; a request that gets no reply in 5 s is tried again, at most 6 times.
    let mut replies = 0;
    let mut tried = Vec::new();
    for _ in 0..6 {
        let ping = env
            .rc
            .node()
            .netns()
            .command("/bin/busybox")
            .args(["ping", "-c", "1", "-W", "5", &ip.to_string()])
            .output()?;
        let text = String::from_utf8_lossy(&ping.stdout).into_owned();
        if ping.status.success() && text.contains("1 packets received") {
            replies += 1;
            if replies == 3 {
                break;
            }
        } else {
            tried.push(format!("{text}{}", String::from_utf8_lossy(&ping.stderr)));
        }
    }
    ensure!(
        replies == 3,
        "ping {ip} from the node: {replies} replies to {} requests:\n{}",
        replies + tried.len(),
        tried.join("\n")
    );
    let echo = move || -> Result<()> {
        let s = std::net::UdpSocket::bind("0.0.0.0:0")?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        for size in [1usize, 100, 1400] {
            let msg: Vec<u8> = (0..size).map(|i| (i * 7 + size) as u8).collect();
            s.send_to(&msg, (ip, 7))?;
            let mut buf = [0u8; 2048];
            let (n, from) = s.recv_from(&mut buf).context("no UDP echo")?;
            ensure!(buf[..n] == msg[..], "UDP echo of {size} bytes differs");
            ensure!(from == (ip, 7).into(), "reply from {from}, not the pod IP");
        }
        Ok(())
    };
    env.rc
        .node()
        .netns()
        .run(echo)?
        .context("UDP echo from the node")?;
    echo().context("UDP echo from this machine")?;
    Ok(())
}
