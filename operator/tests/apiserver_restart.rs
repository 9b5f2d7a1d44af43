//! kube-apiserver restarted while the controllers work: they reconnect and converge, and no VMI
//! ever gets a second launcher pod.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Result;
use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use microvirt_crds::vmi::ANNOTATION_VMI_UID;
use microvirt_crds::{VirtualMachineInstance, VmiPhase};
use serde_json::json;

/// VMI name → (uid, number of launcher pods pointing at it), and pods whose VMI is unknown.
async fn census(env: &Env) -> Result<(BTreeMap<String, (String, usize)>, Vec<String>)> {
    let vmis = env
        .api::<VirtualMachineInstance>()
        .list(&ListParams::default())
        .await?;
    let pods = env
        .api::<Pod>()
        .list(&ListParams::default().labels("app.kubernetes.io/name=virt-launcher"))
        .await?;
    let mut by_uid: BTreeMap<String, (String, usize)> = vmis
        .items
        .iter()
        .map(|v| {
            (
                v.metadata.uid.clone().unwrap_or_default(),
                (v.name_any(), 0),
            )
        })
        .collect();
    let mut orphans = Vec::new();
    for p in &pods.items {
        match p
            .annotations()
            .get(ANNOTATION_VMI_UID)
            .and_then(|u| by_uid.get_mut(u))
        {
            Some(e) => e.1 += 1,
            None => orphans.push(p.name_any()),
        }
    }
    let by_name = by_uid
        .into_iter()
        .map(|(uid, (name, n))| (name, (uid, n)))
        .collect();
    Ok((by_name, orphans))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controllers_converge_across_an_apiserver_restart_without_duplicate_pods() -> Result<()> {
    let t0 = std::time::Instant::now();
    let mut cluster = tokio::task::block_in_place(start_cluster);
    install_crds(cluster.kubeconfig_path())?;
    let mut env = Env::start(cluster.kubeconfig_path(), "t-restart").await?;
    env.apply(&vmirs_yaml("pool", 5, "32Mi"))?;
    wait_for("5 VMIs with one pod each", WAIT, || async {
        let (c, orphans) = census(&env).await?;
        Ok((c.len() == 5 && c.values().all(|(_, n)| *n == 1) && orphans.is_empty()).then_some(()))
    })
    .await?;

    // Work in flight: scale up and add standalone VMIs, then restart the API server at once.
    let rss = env.api::<microvirt_crds::VirtualMachineInstanceReplicaSet>();
    rss.patch(
        "pool",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"replicas": 9}})),
    )
    .await?;
    let vmis = env.api::<VirtualMachineInstance>();
    for i in 0..3 {
        vmis.create(&PostParams::default(), &vmi(&format!("solo-{i}"), &[]))
            .await?;
    }
    let r0 = std::time::Instant::now();
    tokio::task::block_in_place(|| cluster.restart_apiserver())?;
    eprintln!(
        "[{:.1}s] kube-apiserver restarted in {:.1}s",
        t0.elapsed().as_secs_f64(),
        r0.elapsed().as_secs_f64()
    );

    // Converge: 9 + 3 VMIs, each with exactly one pod, no orphan pods.
    wait_for(
        "12 VMIs with one pod each after the restart",
        Duration::from_secs(90),
        || async {
            let (c, orphans) = census(&env).await?;
            Ok(
                (c.len() == 12 && c.values().all(|(_, n)| *n == 1) && orphans.is_empty())
                    .then_some(()),
            )
        },
    )
    .await?;

    eprintln!(
        "[{:.1}s] converged after the restart",
        t0.elapsed().as_secs_f64()
    );
    // Status still flows: a pod marked running makes its VMI Running.
    let pods = env.api::<Pod>();
    bind(&pods, "virt-launcher-solo-0", "node-1").await?;
    mark_running(&pods, "virt-launcher-solo-0", "10.2.0.1", true).await?;
    wait_for("solo-0 Running", WAIT, || async {
        let v = vmis.get("solo-0").await?;
        Ok((v.phase() == Some(VmiPhase::Running) && v.is_ready()).then_some(()))
    })
    .await?;

    // The operator itself restarts (fresh caches): still no duplicates, scaling still works.
    env.stop_operator();
    rss.patch(
        "pool",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"replicas": 4}})),
    )
    .await?;
    env.start_operator().await?;
    let last_seen = std::sync::Mutex::new(String::new());
    let converged = wait_for(
        "4 + 3 VMIs after the operator restart",
        Duration::from_secs(60),
        || async {
            let list = vmis.list(&ListParams::default()).await?;
            let live = list
                .items
                .iter()
                .filter(|v| v.metadata.deletion_timestamp.is_none())
                .count();
            let (c, orphans) = census(&env).await?;
            *last_seen.lock().unwrap() = format!(
                "live={live} pods per VMI={:?} orphans={orphans:?} VMIs={:?}",
                c.iter()
                    .map(|(k, (_, n))| (k.clone(), *n))
                    .collect::<Vec<_>>(),
                list.items
                    .iter()
                    .map(|v| (
                        v.metadata.name.clone().unwrap_or_default(),
                        v.metadata.deletion_timestamp.is_some(),
                        v.status.as_ref().and_then(|s| s.phase)
                    ))
                    .collect::<Vec<_>>()
            );
            Ok((live == 7
                && c.len() == 7
                && c.values().all(|(_, n)| *n == 1)
                && orphans.is_empty())
            .then_some(()))
        },
    )
    .await;
    if let Err(e) = converged {
        anyhow::bail!("{e:#}; last state seen: {}", last_seen.lock().unwrap());
    }
    eprintln!(
        "[{:.1}s] converged after the operator restart",
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
