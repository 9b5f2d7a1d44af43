//! VM pools with warm members (docs/pools.md) on the real node: the snapshot is captured by a
//! real builder launcher pod, warm members are real launcher pods that restored it paused, the
//! claim goes through the node agent (virt-handler DaemonSet) to the launcher's control socket.
//!
//! The guest is the demo guest's `ticker` scenario: it prints `tick n=<count> ...` every second,
//! so a claimed member shows that it continues from the snapshot (no boot banner, the count
//! goes on) rather than booting.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use microvirt_e2e::kube::{condition, condition_true, wait_for, TestNamespace};
use serde_json::Value;

use super::{demo_spec, running_ready, summary, vmis, Env};

/// How long a snapshot capture plus the warm members' restores may take on a busy machine.
const POOL_WAIT: Duration = Duration::from_secs(240);
/// Where the node agent's snapshots live on the node (a hostPath: the host's file system).
const SNAPSHOT_ROOT: &str = "/var/lib/microvirt/snapshots";
/// The demo guest's boot banner, which a restored member must not print.
const BOOT_BANNER: &str = "microvirt-testguest: entry=";
/// Host facts of a machine that is not this one.
const FOREIGN_FACTS: &str = "cpu=OtherCPU/6/85/7 kernel=6.1.0-foreign";

/// A pool of `ticker` demo guests (64 MiB): the snapshot is taken 2 s after boot, so a
/// restored guest's first tick has a count above 1.
pub(super) fn pool_yaml(name: &str, replicas: u32, min: u32, max: u32, tick_ms: u32) -> String {
    let spec = demo_spec("ticker", 2, 6)
        .replace("guest: 32Mi", "guest: 64Mi")
        .replace(
            "testguest.scenario=ticker",
            &format!("testguest.scenario=ticker testguest.tick_ms={tick_ms}"),
        );
    format!(
        "apiVersion: microvirt.io/v1alpha1\nkind: VirtualMachinePool\nmetadata:\n  name: {name}\n\
         spec:\n  replicas: {replicas}\n  selector:\n    matchLabels: {{app: {name}}}\n  \
         warm:\n    min: {min}\n    max: {max}\n    snapshot: {{afterBootSeconds: 2, \
         captureTimeoutSeconds: 120}}\n  template:\n    metadata:\n      labels: {{app: {name}}}\n    \
         spec:\n{spec}"
    )
}

fn pool(env: &Env, ns: &str, name: &str) -> Result<Value> {
    env.k
        .get(ns, "vmpool", name)?
        .with_context(|| format!("pool {name} is gone"))
}

fn uid(v: &Value) -> String {
    v["metadata"]["uid"].as_str().unwrap_or("").to_string()
}

fn name(v: &Value) -> String {
    v["metadata"]["name"].as_str().unwrap_or("").to_string()
}

fn label<'a>(v: &'a Value, key: &str) -> &'a str {
    v["metadata"]["labels"][key].as_str().unwrap_or("")
}

/// The pool's pods of `role` (`warm`, `builder`, `claimed`) that are not being deleted.
fn pool_pods(env: &Env, ns: &str, pool: &str, role: &str) -> Result<Vec<Value>> {
    Ok(env
        .k
        .list(
            ns,
            "pod",
            Some(&format!(
                "microvirt.io/pool={pool},microvirt.io/pool-role={role}"
            )),
        )?
        .into_iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .collect())
}

/// Every pod of the namespace, deleted or not.
fn all_pods(env: &Env, ns: &str) -> Result<Vec<Value>> {
    env.k.list(ns, "pod", None)
}

fn pod_ready(p: &Value) -> bool {
    p["status"]["phase"] == "Running" && condition_true(p, "Ready")
}

/// Waits until the pool's snapshot is `Ready` and exactly `n` warm members restored it and are
/// Ready (and the status says so); returns the snapshot id and the members.
fn wait_warm(env: &Env, ns: &str, pool_name: &str, n: usize) -> Result<(String, Vec<Value>)> {
    wait_for(
        &format!("pool {pool_name}: snapshot Ready and {n} Ready warm members"),
        POOL_WAIT,
        |last| {
            let p = pool(env, ns, pool_name)?;
            let st = &p["status"];
            let snap = &st["snapshot"];
            let id = snap["id"].as_str().unwrap_or("").to_string();
            let warm = pool_pods(env, ns, pool_name, "warm")?;
            *last = format!(
                "snapshot {id} {}, warmReplicas {}, warm pods [{}]",
                snap["phase"],
                st["warmReplicas"],
                warm.iter()
                    .map(|w| format!(
                        "{}:{}:{}",
                        name(w),
                        label(w, "microvirt.io/snapshot"),
                        pod_ready(w)
                    ))
                    .collect::<Vec<_>>()
                    .join(" ")
            );
            let ok = snap["phase"] == "Ready"
                && st["warmReplicas"] == n
                && warm.len() == n
                && warm
                    .iter()
                    .all(|w| pod_ready(w) && label(w, "microvirt.io/snapshot") == id);
            Ok(ok.then_some((id, warm)))
        },
    )
}

/// Waits until the pool has exactly `n` VMIs, all Running and Ready.
fn wait_pool_vmis(env: &Env, ns: &str, pool_name: &str, n: usize) -> Result<Vec<Value>> {
    wait_for(
        &format!("pool {pool_name}: {n} Ready VMIs"),
        POOL_WAIT,
        |last| {
            let vs = vmis(env, ns, Some(&format!("app={pool_name}")))?;
            *last = summary(&vs);
            Ok((vs.len() == n && vs.iter().all(|v| running_ready(env, v))).then_some(vs))
        },
    )
}

fn scale(env: &Env, ns: &str, pool_name: &str, n: u32) -> Result<()> {
    env.k.run(&[
        "-n",
        ns,
        "scale",
        &format!("vmpool/{pool_name}"),
        &format!("--replicas={n}"),
    ])?;
    Ok(())
}

/// Sets the pool's `spec.paused`.
fn set_paused(env: &Env, ns: &str, pool_name: &str, paused: bool) -> Result<()> {
    let patch = format!(r#"{{"spec":{{"paused":{paused}}}}}"#);
    env.k.run(&[
        "-n",
        ns,
        "patch",
        "vmpool",
        pool_name,
        "--type=merge",
        "-p",
        &patch,
    ])?;
    Ok(())
}

/// The `n=` counts of the `tick` lines in a console text.
fn ticks(text: &str) -> Vec<u64> {
    text.lines()
        .filter_map(|l| {
            let rest = &l[l.find("tick n=")? + "tick n=".len()..];
            rest.split_whitespace().next()?.parse().ok()
        })
        .collect()
}

/// Checks that the guest of `vmi`'s launcher pod was restored, not booted: its console (the
/// pod's log) has no boot banner, says it resumed, and its tick count continues the one in
/// the snapshot (the first tick after the restore is above 1) and goes on, one by one.
fn guest_continues(env: &Env, ns: &str, vmi: &str) -> Result<()> {
    let pod = format!("virt-launcher-{vmi}");
    let text = wait_for(
        &format!("{pod}'s guest to tick 3 times after the claim"),
        Duration::from_secs(60),
        |last| {
            *last = env.k.run(&["-n", ns, "logs", &pod, "-c", "compute"])?;
            let after = last
                .split_once("ticker: resumed after")
                .map(|(_, a)| a)
                .unwrap_or("");
            Ok((ticks(after).len() >= 3).then(|| last.clone()))
        },
    )?;
    ensure!(
        !text.contains(BOOT_BANNER),
        "{pod}: the guest booted instead of being restored:\n{text}"
    );
    let after = text.split_once("ticker: resumed after").unwrap().1;
    eprintln!(
        "[e2e] {pod}: ticker: resumed after{}",
        after.lines().take(2).collect::<Vec<_>>().join(" | ")
    );
    let t = ticks(after);
    ensure!(
        t[0] > 1,
        "{pod}: the first tick after the restore is {} (the snapshot was taken after tick 1):\n{text}",
        t[0]
    );
    ensure!(
        t.windows(2).all(|w| w[1] == w[0] + 1),
        "{pod}: ticks do not continue one by one {t:?}:\n{text}"
    );
    Ok(())
}

/// Lets a Ready snapshot age past the `ticker`'s gap detection (3 tick periods) before its warm
/// members are claimed: a claimed guest prints `resumed after` only when its first tick comes
/// that late, and on a fast machine a warm member can be claimed well within 3 s of the
/// snapshot (CI saw it).
fn let_the_snapshot_age(tick_ms: u32) {
    thread::sleep(Duration::from_millis(u64::from(tick_ms) * 4));
}

/// The snapshot directory of a pool on the node.
fn snapshot_dir(pool_uid: &str) -> PathBuf {
    Path::new(SNAPSHOT_ROOT).join(pool_uid)
}

/// Deletes the pool and checks that nothing is left: no pool, VMI or pod in `ns`, and the
/// pool's snapshot directory on the node removed by the node agent.
fn delete_pool_leaves_nothing(env: &Env, ns: &str, pool_name: &str) -> Result<()> {
    let p = pool(env, ns, pool_name)?;
    let dir = snapshot_dir(&uid(&p));
    ensure!(
        dir.is_dir(),
        "the pool's snapshot directory {} is not on the node",
        dir.display()
    );
    env.k
        .run(&["-n", ns, "delete", "vmpool", pool_name, "--wait=false"])?;
    wait_for(
        "the pool, its VMIs, pods and snapshot directory gone",
        POOL_WAIT,
        |last| {
            let p = env.k.get(ns, "vmpool", pool_name)?;
            let vs = vmis(env, ns, None)?;
            let ps = all_pods(env, ns)?;
            let d = dir.exists();
            *last = format!(
                "pool {}, {} VMIs, pods [{}], {} exists {d}",
                p.is_some(),
                vs.len(),
                ps.iter().map(name).collect::<Vec<_>>().join(" "),
                dir.display()
            );
            Ok((p.is_none() && vs.is_empty() && ps.is_empty() && !d).then_some(()))
        },
    )
}

/// Runs `f`; whatever happens, the pool is deleted afterwards (the namespace guard deletes the
/// rest).
fn with_pool(env: &Env, ns: &str, pool_name: &str, f: impl FnOnce() -> Result<()>) -> Result<()> {
    let r = f();
    if r.is_err() {
        let _ = env.k.try_run(
            &["-n", ns, "delete", "vmpool", pool_name, "--wait=false"],
            None,
        );
    }
    r
}

/// Scale 0 → 5 → 0 → 5 from warm members; deleting the pool leaves nothing.
pub(super) fn pool_scale_from_warm(env: &Env) -> Result<()> {
    let ns = TestNamespace::create(&env.k, "e2e-pool-scale")?;
    let ns = ns.name();
    let tick_ms = 500;
    env.k.apply(ns, &pool_yaml("tick", 0, 5, 5, tick_ms))?;
    with_pool(env, ns, "tick", || {
        for round in 1..=2 {
            let (id, warm) = wait_warm(env, ns, "tick", 5)?;
            let_the_snapshot_age(tick_ms);
            let warm_uids: BTreeSet<String> = warm.iter().map(uid).collect();
            let pods_before: BTreeSet<String> = all_pods(env, ns)?.iter().map(uid).collect();
            ensure!(
                vmis(env, ns, None)?.is_empty(),
                "round {round}: VMIs before the scale-out"
            );
            scale(env, ns, "tick", 5)?;
            let vs = wait_pool_vmis(env, ns, "tick", 5)?;
            for v in &vs {
                let vmi = name(v);
                // The claimed member is the VMI's launcher pod: same pod, no new one.
                let pod = env
                    .k
                    .get(ns, "pod", &format!("virt-launcher-{vmi}"))?
                    .with_context(|| format!("no launcher pod for {vmi}"))?;
                ensure!(
                    warm_uids.contains(&uid(&pod)),
                    "round {round}: {vmi}'s pod {} was not one of the warm members {warm_uids:?}",
                    uid(&pod)
                );
                ensure!(
                    label(&pod, "microvirt.io/pool-role") == "claimed"
                        && label(&pod, "app") == "tick",
                    "round {round}: claimed pod labels {}",
                    pod["metadata"]["labels"]
                );
                ensure!(
                    v["metadata"]["annotations"]["microvirt.io/claimed-from"] == id.as_str(),
                    "round {round}: {vmi} not claimed from snapshot {id}: {}",
                    v["metadata"]["annotations"]
                );
                guest_continues(env, ns, &vmi)?;
            }
            // No pod was made for a replica: every pod that appeared since is a refill member.
            for p in all_pods(env, ns)? {
                if !pods_before.contains(&uid(&p)) {
                    ensure!(
                        label(&p, "microvirt.io/pool-role") == "warm",
                        "round {round}: a new pod {} that is not a warm member (role {:?})",
                        name(&p),
                        label(&p, "microvirt.io/pool-role")
                    );
                }
            }
            let st = pool(env, ns, "tick")?["status"].clone();
            ensure!(
                st["readyReplicas"] == 5 && st["replicas"] == 5,
                "round {round}: pool status {st}"
            );
            ensure!(
                st["claimLatency"]["samples"].as_u64().unwrap_or(0) >= 5 * round,
                "round {round}: claim latency not measured: {}",
                st["claimLatency"]
            );
            eprintln!(
                "[e2e] pool round {round}: 5 claims, claimLatency {}",
                st["claimLatency"]
            );
            // The pool refills to warm.min while the replicas run.
            wait_warm(env, ns, "tick", 5)?;

            scale(env, ns, "tick", 0)?;
            let claimed: Vec<String> = vs.iter().map(name).collect();
            wait_for("the replicas and their pods gone", POOL_WAIT, |last| {
                let left = vmis(env, ns, None)?;
                let pods = all_pods(env, ns)?;
                let old: Vec<String> = pods
                    .iter()
                    .map(name)
                    .filter(|n| claimed.iter().any(|c| n == &format!("virt-launcher-{c}")))
                    .collect();
                *last = format!("VMIs [{}], old pods {old:?}", summary(&left));
                Ok((left.is_empty() && old.is_empty()).then_some(()))
            })?;
        }
        delete_pool_leaves_nothing(env, ns, "tick")
    })
}

/// `paused: true`: nothing is created, claimed or deleted; a template change rolls the warm
/// members to a new snapshot without touching the running replicas.
pub(super) fn pool_paused_and_template_change(env: &Env) -> Result<()> {
    let ns = TestNamespace::create(&env.k, "e2e-pool-roll")?;
    let ns = ns.name();
    env.k.apply(ns, &pool_yaml("roll", 0, 2, 2, 1000))?;
    with_pool(env, ns, "roll", || {
        let (first, warm) = wait_warm(env, ns, "roll", 2)?;
        let warm_uids: BTreeSet<String> = warm.iter().map(uid).collect();

        // Paused: a scale-out claims nothing and creates nothing; a dead member is not
        // replaced.
        set_paused(env, ns, "roll", true)?;
        wait_for("the ReplicaPaused condition", POOL_WAIT, |last| {
            let p = pool(env, ns, "roll")?;
            *last = p["status"].to_string();
            Ok(condition_true(&p, "ReplicaPaused").then_some(()))
        })?;
        scale(env, ns, "roll", 2)?;
        env.k
            .run(&["-n", ns, "delete", "pod", &name(&warm[0]), "--wait=true"])?;
        // Nothing to wait for: the operator must do nothing. Give it time to (wrongly) act.
        thread::sleep(Duration::from_secs(8));
        let vs = vmis(env, ns, None)?;
        ensure!(vs.is_empty(), "a paused pool made VMIs: {}", summary(&vs));
        let pods: BTreeSet<String> = all_pods(env, ns)?.iter().map(uid).collect();
        let expect: BTreeSet<String> = warm_uids
            .iter()
            .filter(|u| **u != uid(&warm[0]))
            .cloned()
            .collect();
        ensure!(
            pods == expect,
            "a paused pool created or deleted pods: {pods:?}, expected {expect:?}"
        );

        // Unpaused: the replicas are claimed (one from the remaining member), the pool
        // refills.
        set_paused(env, ns, "roll", false)?;
        let replicas = wait_pool_vmis(env, ns, "roll", 2)?;
        let replica_uids: BTreeSet<String> = replicas.iter().map(uid).collect();
        ensure!(
            replicas.iter().any(
                |v| v["metadata"]["annotations"]["microvirt.io/claimed-from"] == first.as_str()
            ),
            "no replica claimed from {first} after unpausing: {replicas:?}"
        );
        let p = pool(env, ns, "roll")?;
        ensure!(
            condition(&p, "ReplicaPaused").is_none_or(|c| c["status"] == "False"),
            "still ReplicaPaused: {}",
            p["status"]
        );
        let (_, warm) = wait_warm(env, ns, "roll", 2)?;
        let old_warm: BTreeSet<String> = warm.iter().map(uid).collect();

        // A template change (the tick period): a new snapshot, the old warm members drained,
        // new ones restore the new snapshot; the replicas keep running.
        env.k.apply(ns, &pool_yaml("roll", 2, 2, 2, 500))?;
        let second = wait_for("a new snapshot with 2 warm members", POOL_WAIT, |last| {
            let (id, warm) = wait_warm(env, ns, "roll", 2)?;
            *last = id.clone();
            Ok((id != first && warm.iter().all(|w| !old_warm.contains(&uid(w)))).then_some(id))
        })?;
        ensure!(
            second[..second.len() - 2] != first[..first.len() - 2] && second.ends_with("-1"),
            "the new snapshot {second} is not a new template's first attempt (old {first})"
        );
        // The old members are deleted; they may still be terminating (grace period) when the
        // new ones are Ready.
        wait_for(
            "the old warm members gone after the roll",
            POOL_WAIT,
            |last| {
                let left: Vec<String> = all_pods(env, ns)?
                    .iter()
                    .filter(|p| old_warm.contains(&uid(p)))
                    .map(name)
                    .collect();
                *last = format!("left: {left:?}");
                Ok(left.is_empty().then_some(()))
            },
        )?;
        let vs = wait_pool_vmis(env, ns, "roll", 2)?;
        ensure!(
            vs.iter().map(uid).collect::<BTreeSet<_>>() == replica_uids,
            "the template change touched the running replicas"
        );
        // The next replica is claimed from the new snapshot and ticks at the new period.
        let_the_snapshot_age(500);
        scale(env, ns, "roll", 3)?;
        let vs = wait_pool_vmis(env, ns, "roll", 3)?;
        let new = vs
            .iter()
            .find(|v| !replica_uids.contains(&uid(v)))
            .context("the third replica")?;
        ensure!(
            new["metadata"]["annotations"]["microvirt.io/claimed-from"] == second.as_str(),
            "the new replica was not claimed from {second}: {}",
            new["metadata"]["annotations"]
        );
        guest_continues(env, ns, &name(new))?;
        // The old snapshot stays on the node while replicas restored from it run (their guest
        // memory is mapped from it); once they are gone the node agent removes it and keeps the
        // one in use.
        let pool_uid = uid(&pool(env, ns, "roll")?);
        let old_dir = snapshot_dir(&pool_uid).join(&first);
        ensure!(
            old_dir.is_dir(),
            "the old snapshot was removed while replicas restored from it run"
        );
        scale(env, ns, "roll", 0)?;
        wait_for(
            "the replicas gone and the old snapshot's directory removed by the node agent",
            POOL_WAIT,
            |last| {
                let vs = vmis(env, ns, None)?;
                *last = format!("VMIs [{}], {} exists", summary(&vs), old_dir.exists());
                Ok((vs.is_empty() && !old_dir.exists()).then_some(()))
            },
        )?;
        ensure!(
            snapshot_dir(&pool_uid).join(&second).is_dir(),
            "the snapshot in use was removed"
        );
        delete_pool_leaves_nothing(env, ns, "roll")
    })
}

/// Pids of the `virt-launcher` processes of pod `pod_uid` (by the pod's cgroup).
fn launcher_pids(pod_uid: &str) -> Vec<i32> {
    let needle = format!("pod{pod_uid}");
    let alt = format!("pod{}", pod_uid.replace('-', "_"));
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
            let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            exe.file_name().is_some_and(|n| n == "virt-launcher")
                && (cg.contains(&needle) || cg.contains(&alt))
        })
        .collect()
}

/// A warm member whose launcher dies is replaced; a snapshot recorded on another CPU model is
/// never restored: its warm members go and a new snapshot is taken.
pub(super) fn pool_member_dies_and_foreign_snapshot(env: &Env) -> Result<()> {
    let ns = TestNamespace::create(&env.k, "e2e-pool-facts")?;
    let ns = ns.name();
    env.k.apply(ns, &pool_yaml("facts", 0, 2, 2, 1000))?;
    with_pool(env, ns, "facts", || {
        let (first, warm) = wait_warm(env, ns, "facts", 2)?;
        // The node's facts are what the snapshot recorded.
        let node = env.k.get("", "node", env.rc.node_name())?.context("Node")?;
        let facts = node["metadata"]["annotations"]["microvirt.io/host-facts"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let p = pool(env, ns, "facts")?;
        ensure!(
            !facts.is_empty() && p["status"]["snapshot"]["hostFacts"] == facts.as_str(),
            "node facts {facts:?}, snapshot {}",
            p["status"]["snapshot"]
        );

        // Kill one warm member's launcher (SIGKILL, as an OOM kill would).
        let victim = &warm[0];
        let pids = launcher_pids(&uid(victim));
        ensure!(
            pids.len() == 1,
            "launcher processes of {}: {pids:?}",
            name(victim)
        );
        // SAFETY: kill(2) on the launcher process of a pod this test's pool made.
        ensure!(
            unsafe { libc::kill(pids[0], libc::SIGKILL) } == 0,
            "kill {}: {}",
            pids[0],
            std::io::Error::last_os_error()
        );
        wait_for("the dead member replaced", POOL_WAIT, |last| {
            let (id, warm) = wait_warm(env, ns, "facts", 2)?;
            *last = warm.iter().map(name).collect::<Vec<_>>().join(" ");
            Ok((id == first && warm.iter().all(|w| uid(w) != uid(victim))).then_some(()))
        })?;
        let (_, warm) = wait_warm(env, ns, "facts", 2)?;
        let old_warm: BTreeSet<String> = warm.iter().map(uid).collect();

        // The snapshot now says it was taken on another CPU model (as if the node had been
        // replaced under the same name): it is Incompatible and never restored again.
        let patch = format!(r#"{{"status":{{"snapshot":{{"hostFacts":"{FOREIGN_FACTS}"}}}}}}"#);
        let second = wait_for(
            "a new snapshot after the foreign facts",
            POOL_WAIT,
            |last| {
                let p = pool(env, ns, "facts")?;
                let snap = &p["status"]["snapshot"];
                *last = snap.to_string();
                if snap["id"] == first.as_str() {
                    if snap["hostFacts"] != FOREIGN_FACTS {
                        env.k.run(&[
                            "-n",
                            ns,
                            "patch",
                            "vmpool",
                            "facts",
                            "--subresource=status",
                            "--type=merge",
                            "-p",
                            &patch,
                        ])?;
                    }
                    return Ok(None);
                }
                Ok(Some(snap["id"].as_str().unwrap_or("").to_string()))
            },
        )?;
        ensure!(
            second[..second.len() - 2] == first[..first.len() - 2] && second.ends_with("-2"),
            "the retake of {first} is {second}"
        );
        let (id, warm) = wait_warm(env, ns, "facts", 2)?;
        ensure!(id == second, "warm members on {id}, not {second}");
        ensure!(
            warm.iter().all(|w| !old_warm.contains(&uid(w))),
            "a member of the incompatible snapshot is still warm"
        );
        let on_first = env
            .k
            .list(ns, "pod", Some(&format!("microvirt.io/snapshot={first}")))?;
        ensure!(
            on_first.is_empty(),
            "pods still on the incompatible snapshot: {:?}",
            on_first.iter().map(name).collect::<Vec<_>>()
        );
        let events = env.k.run(&[
            "-n",
            ns,
            "get",
            "events",
            "--field-selector=reason=SnapshotIncompatible",
            "-o",
            "jsonpath={.items[*].message}",
        ])?;
        ensure!(
            events.contains(&first) && events.contains("OtherCPU"),
            "SnapshotIncompatible events: {events:?}"
        );
        // The new snapshot carries this node's facts again and serves claims.
        let p = pool(env, ns, "facts")?;
        ensure!(
            p["status"]["snapshot"]["hostFacts"] == facts.as_str(),
            "{}",
            p["status"]["snapshot"]
        );
        scale(env, ns, "facts", 1)?;
        let vs = wait_pool_vmis(env, ns, "facts", 1)?;
        ensure!(
            vs[0]["metadata"]["annotations"]["microvirt.io/claimed-from"] == second.as_str(),
            "{}",
            vs[0]["metadata"]["annotations"]
        );
        delete_pool_leaves_nothing(env, ns, "facts")
    })
}

/// Bad pool specs are refused by `kubectl apply` with a message that says why; nothing is
/// created.
pub(super) fn pool_bad_specs_refused(env: &Env) -> Result<()> {
    let ns = TestNamespace::create(&env.k, "e2e-pool-bad")?;
    let ns = ns.name();
    let good = pool_yaml("bad", 0, 1, 2, 1000);
    let cases = [
        (
            "selector not matching the template",
            good.replace("matchLabels: {app: bad}", "matchLabels: {app: other}"),
            "spec.template.metadata.labels must contain every label of spec.selector.matchLabels",
        ),
        (
            "warm.max below warm.min",
            good.replace("min: 1\n    max: 2", "min: 3\n    max: 2"),
            "spec.warm.max must be at least spec.warm.min",
        ),
        (
            "bridge interface with warm members",
            good.replace("masquerade: {}", "bridge: {}"),
            "spec.warm needs masquerade interfaces",
        ),
        (
            "both template and KubeVirt's virtualMachineTemplate",
            good.replace(
                "  template:\n",
                "  virtualMachineTemplate: {spec: {runStrategy: Always, template: {spec: {domain: {}}}}}\n  template:\n",
            ),
            // A pool takes one of the two spellings (crds/src/refusals.rs, POOL_BOTH_TEMPLATES).
            "spec.virtualMachineTemplate: Invalid value: \"object\": give spec.template (a VMI \
             template) or KubeVirt's spec.virtualMachineTemplate, not both",
        ),
    ];
    for (what, yaml, msg) in cases {
        ensure!(yaml != good, "{what}: the case did not change the spec");
        let (ok, _, err) = env
            .k
            .try_run(&["-n", ns, "apply", "-f", "-"], Some(&yaml))?;
        if ok {
            bail!("{what}: accepted by kubectl apply");
        }
        ensure!(err.contains(msg), "{what}: message {err:?} lacks {msg:?}");
    }
    ensure!(
        env.k.list(ns, "vmpool", None)?.is_empty(),
        "a refused pool exists"
    );
    // The same spec, fixed, is accepted.
    env.k.apply(ns, &good)?;
    env.k
        .run(&["-n", ns, "delete", "vmpool", "bad", "--wait=true"])?;
    wait_for("the pool's pods gone", POOL_WAIT, |last| {
        let ps = all_pods(env, ns)?;
        *last = ps.iter().map(name).collect::<Vec<_>>().join(" ");
        Ok(ps.is_empty().then_some(()))
    })?;
    Ok(())
}
