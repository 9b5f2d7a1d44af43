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
#[path = "node/restarts.rs"]
mod restarts;
#[path = "node/vmi.rs"]
mod vmi;

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
            vmi::ready_without_the_boot_timer,
        ),
        ("console_pause_unpause_on_a_real_pod", console_pause_unpause),
        ("launcher_pod_deleted_by_hand", vmi::launcher_pod_deleted),
        ("vm_run_strategies_and_vmi_deletion", vm_lifecycle),
        ("operator_leader_failover", restarts::operator_failover),
        ("device_plugin_and_kubelet_restarts", restarts::restarts),
        ("bad_input_fails_clearly", vmi::bad_input),
        ("deploy_examples_run", deploy_examples),
        ("guest_reachable_through_the_pod_ip", vmi::guest_network),
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
