//! The VirtualMachinePool controller against a real kube-apiserver, with a simulated node: the
//! test binds and runs pods as a kubelet would and answers control requests as the node agent
//! (`virt-handler`) would. Real launchers, snapshots and the real agent are exercised by the
//! whole-system tests on a real node (`tests/e2e`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use anyhow::Result;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Node, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use microvirt_crds::control::{self, ControlCommand, ControlRequest, ControlResult};
use microvirt_crds::pool::{SnapshotPhase, ANNOTATION_HOST_FACTS, LABEL_POOL_ROLE, LABEL_SNAPSHOT};
use microvirt_crds::vmi::{
    ANNOTATION_CONTROL_REQUEST, ANNOTATION_CONTROL_RESULT, ANNOTATION_VMI_UID, LABEL_VMI_NAME,
};
use microvirt_crds::{VirtualMachineInstance, VirtualMachinePool};
use serde_json::json;

const FACTS: &str = "cpu=FakeCPU/25/1/1 kernel=6.1.0-test";

async fn create_node(client: &Client, name: &str) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": {ANNOTATION_HOST_FACTS: FACTS}},
    }))?;
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// What the simulated node did.
#[derive(Default)]
struct NodeLog {
    /// Control requests carried out, as `<pod> <request>`.
    requests: Mutex<Vec<String>>,
    /// Pods started (by uid).
    started: Mutex<BTreeSet<String>>,
    /// When set, warm members fail their restore (launcher exit code 3).
    fail_restore: AtomicBool,
}

/// The simulated kubelet and node agent of node `node`: binds every pod of `ns`, runs it
/// (Ready at once: booted, or restored), and answers control requests: `snapshot` with the
/// node's host facts, anything else with `ok`.
async fn fake_node(client: Client, ns: String, node: String, log: Arc<NodeLog>) {
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    let ips = AtomicUsize::new(10);
    loop {
        if let Ok(list) = pods.list(&ListParams::default()).await {
            for p in list.items {
                let name = p.name_any();
                if p.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                let bound = p.spec.as_ref().and_then(|s| s.node_name.clone()).is_some();
                if !bound {
                    let _ = bind(&pods, &name, &node).await;
                    continue;
                }
                let phase = p.status.as_ref().and_then(|s| s.phase.clone());
                if phase.as_deref() != Some("Running") && phase.as_deref() != Some("Failed") {
                    let warm = p.labels().get(LABEL_POOL_ROLE).map(String::as_str) == Some("warm");
                    if warm && log.fail_restore.load(Ordering::SeqCst) {
                        let _ = mark_terminated(
                            &pods,
                            &name,
                            3,
                            "restoring the snapshot: it was taken on another CPU model",
                        )
                        .await;
                    } else {
                        let ip = format!("10.1.0.{}", ips.fetch_add(1, Ordering::SeqCst) % 250);
                        if mark_running(&pods, &name, &ip, true).await.is_ok() {
                            log.started
                                .lock()
                                .unwrap()
                                .insert(p.uid().unwrap_or_default());
                        }
                    }
                    continue;
                }
                let a = p.annotations();
                let Some(req) = a.get(ANNOTATION_CONTROL_REQUEST) else {
                    continue;
                };
                let Ok(r) = ControlRequest::parse(req) else {
                    continue;
                };
                if a.get(ANNOTATION_CONTROL_RESULT)
                    .and_then(|r| control::id_of(r))
                    == Some(r.id.as_str())
                {
                    continue;
                }
                let facts = (r.command == ControlCommand::Snapshot).then(|| FACTS.to_string());
                let result = ControlResult::ok(r.id, facts).to_string();
                let patch =
                    json!({"metadata": {"annotations": {ANNOTATION_CONTROL_RESULT: result}}});
                if pods
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .is_ok()
                {
                    log.requests.lock().unwrap().push(format!("{name} {req}"));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

struct Sim {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The Node object `node` (with [`FACTS`]) and its simulated kubelet and node agent for the
/// pods of `env`'s namespace ([`fake_node`]), running until the [`Sim`] is dropped; the log
/// says what it did.
async fn start_fake_node(env: &Env, node: &str) -> Result<(Arc<NodeLog>, Sim)> {
    create_node(&env.client, node).await?;
    let log = Arc::new(NodeLog::default());
    let sim = Sim {
        task: tokio::spawn(fake_node(
            env.client.clone(),
            env.ns.clone(),
            node.to_string(),
            log.clone(),
        )),
    };
    Ok((log, sim))
}

/// [`pool_yaml`] whose template also names the pod network and its masquerade interface.
fn networked_pool_yaml(name: &str, replicas: i32, warm: &str, memory: &str) -> String {
    let yaml = pool_yaml(name, replicas, warm, memory).replace(
        &format!("    spec: {{domain: {{memory: {{guest: {memory}}}}}}}\n"),
        &format!(
            "    spec:\n      domain:\n        memory: {{guest: {memory}}}\n        devices:\n          \
             interfaces: [{{name: default, masquerade: {{}}}}]\n      networks: [{{name: default, pod: {{}}}}]\n"
        ),
    );
    assert!(yaml.contains("networks:"), "{yaml}");
    yaml
}

async fn pool(env: &Env, name: &str) -> Result<VirtualMachinePool> {
    Ok(env.api::<VirtualMachinePool>().get(name).await?)
}

async fn pool_pods(env: &Env, name: &str, role: &str) -> Result<Vec<Pod>> {
    let l = ListParams::default().labels(&format!(
        "microvirt.io/pool={name},{LABEL_POOL_ROLE}={role}"
    ));
    Ok(env
        .api::<Pod>()
        .list(&l)
        .await?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect())
}

async fn pool_vmis(env: &Env, name: &str) -> Result<Vec<VirtualMachineInstance>> {
    let l = ListParams::default().labels(&format!("app={name}"));
    Ok(env
        .api::<VirtualMachineInstance>()
        .list(&l)
        .await?
        .items
        .into_iter()
        .filter(|v| v.metadata.deletion_timestamp.is_none())
        .collect())
}

/// Waits until the pool's snapshot is Ready and `n` warm members are ready; returns the
/// snapshot id.
async fn wait_warm(env: &Env, name: &str, n: i32) -> Result<String> {
    wait_warm_for(env, name, n, WAIT).await
}

/// [`wait_warm`] with a timeout of its own (for waits that include a restore back-off).
async fn wait_warm_for(env: &Env, name: &str, n: i32, timeout: Duration) -> Result<String> {
    wait_for(
        &format!("pool {name}: snapshot Ready and {n} warm"),
        timeout,
        || async {
            let st = pool(env, name).await?.status.unwrap_or_default();
            let snap = st.snapshot.filter(|s| s.phase == SnapshotPhase::Ready);
            let warm = pool_pods(env, name, "warm").await?.len();
            Ok(snap
                .filter(|_| st.warm_replicas == n && warm == n as usize)
                .map(|s| s.id))
        },
    )
    .await
}

async fn scale(env: &Env, name: &str, replicas: i32) -> Result<()> {
    env.api::<VirtualMachinePool>()
        .patch_scale(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": replicas}})),
        )
        .await?;
    Ok(())
}

async fn events_of(env: &Env, reason: &str) -> Result<Vec<String>> {
    let ev: Api<CoreEvent> = env.api();
    Ok(ev
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.message)
        .collect())
}

#[tokio::test]
async fn bad_pool_specs_are_refused_with_clear_messages() -> Result<()> {
    let env = Env::start_shared("t-pool-validation").await?;
    let warm = "warm: {min: 1, max: 3}";
    let good = networked_pool_yaml("web", 2, warm, "64Mi");
    env.apply(&good)?;

    let cases: Vec<(&str, String, &str)> = vec![
        (
            "selector not in template labels",
            good.replace("selector: {matchLabels: {app: web}}", "selector: {matchLabels: {app: other}}"),
            "spec.template.metadata.labels must contain every label of spec.selector.matchLabels",
        ),
        (
            "empty selector",
            good.replace("selector: {matchLabels: {app: web}}", "selector: {}"),
            "spec.selector must not be empty",
        ),
        (
            "max below min",
            good.replace(warm, "warm: {min: 3, max: 2}"),
            "spec.warm.max must be at least spec.warm.min",
        ),
        (
            "max below default min",
            good.replace(warm, "warm: {max: 0}"),
            "spec.warm.max must be at least spec.warm.min (default 1)",
        ),
        (
            "negative replicas",
            good.replace("replicas: 2", "replicas: -1"),
            "spec.replicas: Invalid value: -1",
        ),
        (
            "warm with a PVC",
            good.replace(
                "      networks:",
                "      volumes: [{name: data, persistentVolumeClaim: {claimName: d}}]\n      networks:",
            ),
            "spec.warm needs a template without persistentVolumeClaim and emptyDisk volumes",
        ),
        (
            "warm with an emptyDisk",
            good.replace(
                "      networks:",
                "      volumes: [{name: scratch, emptyDisk: {capacity: 1Gi}}]\n      networks:",
            ),
            "an emptyDisk's content is not part of the snapshot",
        ),
        (
            "warm with a bridge interface",
            good.replace("masquerade: {}", "bridge: {}"),
            "spec.warm needs masquerade interfaces",
        ),
        (
            "two scale-in strategies",
            good.replace(
                "  template:",
                "  scaleInStrategy: {proactive: {}, unmanaged: {}}\n  template:",
            ),
            "spec.scaleInStrategy needs exactly one of proactive, opportunistic, unmanaged",
        ),
        (
            "online state preservation",
            good.replace(
                "  template:",
                "  scaleInStrategy: {proactive: {statePreservation: Online}}\n  template:",
            ),
            "Unsupported value: \"Online\": supported values: \"Disabled\"",
        ),
        (
            "unknown sort policy",
            good.replace(
                "  template:",
                "  scaleInStrategy: {proactive: {selectionPolicy: {sortPolicy: Biggest}}}\n  template:",
            ),
            "Unsupported value: \"Biggest\"",
        ),
        (
            "a name too long for its VMIs",
            good.replace("metadata: {name: web}", &format!("metadata: {{name: {}}}", "w".repeat(58))),
            "metadata.name of a VirtualMachinePool must be at most 57 characters",
        ),
        (
            "a bad template",
            good.replace("guest: 64Mi", "guest: 1Mi"),
            "domain.memory.guest must be a quantity from 16Mi to 1Ei",
        ),
        (
            "both template and KubeVirt's virtualMachineTemplate",
            good.replace(
                "  template:",
                "  virtualMachineTemplate: {spec: {runStrategy: Always, template: {spec: {domain: {}}}}}\n  template:",
            ),
            microvirt_crds::refusals::POOL_BOTH_TEMPLATES,
        ),
        (
            "warm members with KubeVirt's virtualMachineTemplate",
            format!(
                "{}\n  virtualMachineTemplate:\n    spec:\n      runStrategy: Always\n      template:{}",
                good.split("  template:").next().unwrap().trim_end(),
                good.split("  template:").nth(1).unwrap().replace("\n", "\n    "),
            ),
            microvirt_crds::refusals::POOL_VM_TEMPLATE_WARM,
        ),
        (
            "no template",
            format!("{}\n", good.split("  template:").next().unwrap().trim_end()),
            "spec.template (or KubeVirt's spec.virtualMachineTemplate) is required",
        ),
    ];
    for (what, yaml, want) in &cases {
        env.apply_refused(what, yaml, &[want])?;
    }
    // The Rust client gets a 422 too.
    let mut p: VirtualMachinePool = serde_saphyr::from_str(&good)?;
    p.metadata.name = Some("client".into());
    p.spec.warm.as_mut().unwrap().min = Some(5);
    let e = env
        .api::<VirtualMachinePool>()
        .create(&PostParams::default(), &p)
        .await
        .expect_err("max < min");
    match e {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 422);
            assert!(
                s.message
                    .contains("spec.warm.max must be at least spec.warm.min"),
                "{}",
                s.message
            );
        }
        other => panic!("unexpected {other}"),
    }

    // kubectl knows the short name, the columns and the scale subresource.
    let (ok, _, err) = env.kubectl(&["scale", "vmpool/web", "--replicas=0"], None)?;
    assert!(ok, "{err}");
    assert_eq!(pool(&env, "web").await?.spec.replicas, Some(0));
    let (ok, out, _) = env.kubectl(&["get", "vmpool", "web"], None)?;
    assert!(ok);
    let header = columns(&out);
    assert_eq!(
        header,
        vec!["NAME", "DESIRED", "CURRENT", "READY", "WARM", "SNAPSHOT", "AGE"]
    );
    let (ok, out, _) = env.kubectl(&["get", "vmpool", "web", "-o", "wide"], None)?;
    assert!(ok);
    assert!(out.contains("CLAIM-P50-MS"), "{out}");
    env.api::<VirtualMachinePool>()
        .delete("web", &DeleteParams::default())
        .await?;
    Ok(())
}

#[tokio::test]
async fn scale_out_claims_warm_members_without_creating_pods() -> Result<()> {
    let env = Env::start_shared("t-pool-claims").await?;
    let node = "pool-claims-node";
    let (log, _sim) = start_fake_node(&env, node).await?;
    let pools = env.api::<VirtualMachinePool>();
    let pods = env.api::<Pod>();

    env.apply(&networked_pool_yaml(
        "web",
        0,
        "warm: {min: 2, max: 4}",
        "64Mi",
    ))?;

    // A builder boots the template; once it is Ready the operator asks the node agent for the
    // snapshot; then two warm members restore it.
    let snap = wait_warm(&env, "web", 2).await?;
    let st = pool(&env, "web").await?.status.unwrap();
    let s = st.snapshot.clone().unwrap();
    assert_eq!(s.node.as_deref(), Some(node));
    assert_eq!(s.host_facts.as_deref(), Some(FACTS));
    assert_eq!(s.id, format!("{}-1", st.template_hash.clone().unwrap()));
    assert!(
        pool_pods(&env, "web", "builder").await?.is_empty(),
        "builder not removed"
    );
    let reqs = log.requests.lock().unwrap().clone();
    assert_eq!(
        reqs,
        vec![format!(
            "virt-launcher-web-snap-{snap} snap-{snap} snapshot"
        )],
        "exactly one snapshot request"
    );
    assert_eq!(st.replicas, 0);
    assert_eq!(st.label_selector.as_deref(), Some("app=web"));
    let warm = pool_pods(&env, "web", "warm").await?;
    for w in &warm {
        assert_eq!(w.labels().get(LABEL_SNAPSHOT), Some(&snap));
        assert!(
            w.labels().get("app").is_none(),
            "a warm member must not match Services"
        );
        let env_vars: Vec<String> = w.spec.as_ref().unwrap().containers[0]
            .env
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|e| format!("{}={}", e.name, e.value.unwrap_or_default()))
            .collect();
        assert!(
            env_vars.contains(&"MICROVIRT_RESTORE_PAUSED=1".to_string()),
            "{env_vars:?}"
        );
    }
    let warm_uids: BTreeMap<String, String> = warm
        .iter()
        .map(|w| (w.name_any(), w.uid().unwrap()))
        .collect();
    let started_before = log.started.lock().unwrap().len();

    // Scale 0 -> 2 through the scale subresource: both replicas are the warm members.
    scale(&env, "web", 2).await?;
    let vmis = wait_for("2 Ready replicas", WAIT, || async {
        let v = pool_vmis(&env, "web").await?;
        Ok((v.len() == 2 && v.iter().all(|v| v.is_ready())).then_some(v))
    })
    .await?;
    for v in &vmis {
        let pod_name = format!("virt-launcher-{}", v.name_any());
        assert!(
            warm_uids.contains_key(&pod_name),
            "{pod_name} was not a warm member"
        );
        let p = pods.get(&pod_name).await?;
        assert_eq!(
            p.uid(),
            warm_uids.get(&pod_name).cloned(),
            "the pod was replaced"
        );
        assert_eq!(p.labels().get("app").map(String::as_str), Some("web"));
        assert_eq!(p.labels().get(LABEL_VMI_NAME), Some(&v.name_any()));
        assert_eq!(
            p.labels().get(LABEL_POOL_ROLE).map(String::as_str),
            Some("claimed")
        );
        assert_eq!(p.annotations().get(ANNOTATION_VMI_UID), v.uid().as_ref());
        let o = &p.owner_references()[0];
        assert_eq!(
            (o.kind.as_str(), Some(o.uid.clone())),
            ("VirtualMachineInstance", v.uid())
        );
        assert_eq!(
            v.status.as_ref().unwrap().launcher_pod.as_deref(),
            Some(pod_name.as_str())
        );
        assert_eq!(
            v.annotations().get("microvirt.io/claimed-from"),
            Some(&snap)
        );
    }
    // The pool refills to clamp(2, 2, 4) = 2 warm members, new pods.
    let _ = wait_warm(&env, "web", 2).await?;
    let st = wait_for(
        "status replicas 2, ready 2, claim latency",
        WAIT,
        || async {
            let st = pool(&env, "web").await?.status.unwrap_or_default();
            Ok(
                (st.replicas == 2 && st.ready_replicas == 2 && st.claim_latency.is_some())
                    .then_some(st),
            )
        },
    )
    .await?;
    let lat = st.claim_latency.unwrap();
    assert_eq!(lat.samples, 2);
    assert!(
        env.metrics
            .encode()
            .contains("microvirt_operator_pool_claim_seconds_count 2"),
        "{}",
        env.metrics.encode()
    );
    assert!(lat.p50_ms >= 0 && lat.max_ms >= lat.p50_ms, "{lat:?}");
    assert!(!events_of(&env, "Claimed").await?.is_empty());
    // Claiming started no pod: only the two refills did.
    assert_eq!(log.started.lock().unwrap().len(), started_before + 2);

    // Scale 2 -> 5 with kubectl: 2 warm members are claimed, 3 replicas boot cold; the warm
    // target becomes clamp(5, 2, 4) = 4.
    let (ok, _, err) = env.kubectl(&["scale", "vmpool/web", "--replicas=5"], None)?;
    assert!(ok, "{err}");
    wait_for("5 Ready replicas", WAIT, || async {
        let v = pool_vmis(&env, "web").await?;
        Ok((v.len() == 5 && v.iter().all(|v| v.is_ready())).then_some(()))
    })
    .await?;
    let claimed = pool_vmis(&env, "web")
        .await?
        .iter()
        .filter(|v| v.annotations().contains_key("microvirt.io/claimed-from"))
        .count();
    assert_eq!(claimed, 4, "2 claimed first, 2 more now; the rest cold");
    let _ = wait_warm(&env, "web", 4).await?;

    // Scale to 0: the replicas and their pods go; warm members shrink to min 2.
    scale(&env, "web", 0).await?;
    wait_for("no replicas and their pods gone", WAIT, || async {
        let v = pool_vmis(&env, "web").await?;
        let claimed = pool_pods(&env, "web", "claimed").await?;
        let cold = pods
            .list(&ListParams::default().labels("app=web"))
            .await?
            .items;
        Ok((v.is_empty() && claimed.is_empty() && cold.is_empty()).then_some(()))
    })
    .await?;
    let _ = wait_warm(&env, "web", 2).await?;

    // Paused: nothing is claimed or created.
    pools
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"paused": true, "replicas": 3}})),
        )
        .await?;
    wait_for("ReplicaPaused", WAIT, || async {
        let st = pool(&env, "web").await?.status.unwrap_or_default();
        Ok(st
            .conditions
            .iter()
            .any(|c| c.type_ == "ReplicaPaused" && c.status == "True")
            .then_some(()))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(pool_vmis(&env, "web").await?.is_empty());
    pools
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"paused": false}})),
        )
        .await?;
    wait_for("3 replicas after unpause", WAIT, || async {
        let v = pool_vmis(&env, "web").await?;
        Ok((v.len() == 3 && v.iter().all(|v| v.is_ready())).then_some(()))
    })
    .await?;

    // Deleting the pool removes its replicas, warm members and pods.
    pools.delete("web", &DeleteParams::default()).await?;
    wait_for("pool, VMIs and pods gone", WAIT, || async {
        let p = pools.get_opt("web").await?;
        let v = env
            .api::<VirtualMachineInstance>()
            .list(&ListParams::default())
            .await?;
        let ps = pods.list(&ListParams::default()).await?;
        Ok((p.is_none() && v.items.is_empty() && ps.items.is_empty()).then_some(()))
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn snapshots_follow_the_template_and_the_node() -> Result<()> {
    let env = Env::start_shared("t-pool-snapshots").await?;
    let node = "pool-snapshots-node";
    let (log, _sim) = start_fake_node(&env, node).await?;
    let pools = env.api::<VirtualMachinePool>();
    let pods = env.api::<Pod>();
    env.apply(&networked_pool_yaml("db", 1, "warm: {min: 2}", "64Mi"))?;
    let first = wait_warm(&env, "db", 2).await?;
    wait_for("1 Ready replica", WAIT, || async {
        let v = pool_vmis(&env, "db").await?;
        Ok((v.len() == 1 && v[0].is_ready()).then_some(()))
    })
    .await?;
    let replica = pool_vmis(&env, "db").await?[0].uid();

    // A template change: a new snapshot (new hash), the old warm members drained, the running
    // replica left alone.
    env.apply(&networked_pool_yaml("db", 1, "warm: {min: 2}", "96Mi"))?;
    let second = wait_for("a new snapshot with 2 warm", WAIT, || async {
        let id = wait_warm(&env, "db", 2).await?;
        Ok((id != first).then_some(id))
    })
    .await?;
    assert!(
        second.ends_with("-1"),
        "a new template starts at attempt 1: {second}"
    );
    assert_eq!(
        &second[..10],
        pool(&env, "db")
            .await?
            .status
            .unwrap()
            .template_hash
            .unwrap()
    );
    for w in pool_pods(&env, "db", "warm").await? {
        assert_eq!(w.labels().get(LABEL_SNAPSHOT), Some(&second));
    }
    assert_eq!(pool_vmis(&env, "db").await?[0].uid(), replica);

    // A snapshot whose recorded host facts are another CPU model is never used: it is marked
    // Incompatible, its warm members go, and a new one is taken.
    let fake = "cpu=OtherCPU/6/85/7 kernel=6.1.0-test";
    let api = pools.clone();
    wait_for("the fake facts recorded", WAIT, || async {
        let p = api.get("db").await?;
        let rv = p.resource_version();
        let mut snap = p.status.unwrap().snapshot.unwrap();
        if snap.id != second {
            return Ok(Some(()));
        }
        snap.host_facts = Some(fake.into());
        // Only onto the status just read: a patch of a stale read would write the old
        // snapshot record back over the operator's next attempt (seen under load: a third
        // attempt instead of the second).
        let patch = json!({
            "metadata": {"resourceVersion": rv},
            "status": {"snapshot": snap},
        });
        match api
            .patch_status("db", &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        Ok(None)
    })
    .await?;
    let third = wait_for("attempt 2 with 2 warm", WAIT, || async {
        let id = wait_warm(&env, "db", 2).await?;
        Ok((id != second).then_some(id))
    })
    .await?;
    assert_eq!(third, format!("{}-2", &second[..10]));
    for w in pool_pods(&env, "db", "warm").await? {
        assert_eq!(w.labels().get(LABEL_SNAPSHOT), Some(&third));
    }
    let inc = events_of(&env, "SnapshotIncompatible").await?;
    assert!(
        inc.iter()
            .any(|m| m.contains(&second) && m.contains("OtherCPU")),
        "{inc:?}"
    );

    // A warm member whose launcher dies is replaced.
    let victim = pool_pods(&env, "db", "warm").await?[0].name_any();
    mark_terminated(&pods, &victim, 137, "killed").await?;
    wait_for("the dead member replaced", WAIT, || async {
        let w = pool_pods(&env, "db", "warm").await?;
        let st = pool(&env, "db").await?.status.unwrap_or_default();
        Ok(
            (w.len() == 2 && st.warm_replicas == 2 && w.iter().all(|p| p.name_any() != victim))
                .then_some(()),
        )
    })
    .await?;

    // Warm members that cannot restore (the node refuses the snapshot: launcher exit 3) fail
    // the snapshot after 3 of them; the pool then captures again after a back-off.
    log.fail_restore.store(true, Ordering::SeqCst);
    for w in pool_pods(&env, "db", "warm").await? {
        pods.delete(&w.name_any(), &DeleteParams::default()).await?;
    }
    let failed = wait_for("snapshot Failed after restore failures", WAIT, || async {
        let s = pool(&env, "db").await?.status.unwrap_or_default().snapshot;
        Ok(s.filter(|s| s.phase == SnapshotPhase::Failed))
    })
    .await?;
    assert_eq!(failed.id, third);
    assert!(failed.restore_failures >= 3, "{failed:?}");
    assert!(failed.message.unwrap().contains("another CPU model"));
    log.fail_restore.store(false, Ordering::SeqCst);
    // Attempt 2 failed: attempt 3 starts after a 20 s back-off.
    let fourth = wait_warm_for(&env, "db", 2, WAIT * 2).await?;
    assert_eq!(fourth, format!("{}-3", &second[..10]));

    pools.delete("db", &DeleteParams::default()).await?;
    wait_for("everything gone", WAIT, || async {
        let p = pools.get_opt("db").await?;
        let ps = pods.list(&ListParams::default()).await?;
        Ok((p.is_none() && ps.items.is_empty()).then_some(()))
    })
    .await?;
    Ok(())
}
