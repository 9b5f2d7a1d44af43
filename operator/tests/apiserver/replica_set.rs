//! VirtualMachineInstanceReplicaSet scaling, also through `kubectl scale`.

use std::collections::BTreeSet;

use anyhow::Result;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::ResourceExt;
use microvirt_crds::{VirtualMachineInstance, VirtualMachineInstanceReplicaSet};
use serde_json::json;

use crate::common::*;

async fn rs_vmis(env: &Env) -> Result<Vec<VirtualMachineInstance>> {
    let list = env
        .api::<VirtualMachineInstance>()
        .list(&ListParams::default().labels("app=web"))
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter(|v| v.metadata.deletion_timestamp.is_none())
        .collect())
}

#[tokio::test]
async fn replica_set_scales_up_and_down_also_with_kubectl_scale() -> Result<()> {
    let env = Env::start_shared("t-vmirs").await?;
    let pods = env.api::<Pod>();
    let rss = env.api::<VirtualMachineInstanceReplicaSet>();
    env.apply(&vmirs_yaml("web", 3, "64Mi"))?;
    let names = wait_for("3 replicas with pods", WAIT, || async {
        let v = rs_vmis(&env).await?;
        let mut names = BTreeSet::new();
        for x in &v {
            if pods
                .get_opt(&format!("virt-launcher-{}", x.name_any()))
                .await?
                .is_some()
            {
                names.insert(x.name_any());
            }
        }
        Ok((v.len() == 3 && names.len() == 3).then_some(names))
    })
    .await?;
    assert_eq!(
        names,
        BTreeSet::from([
            "web-0".to_string(),
            "web-1".to_string(),
            "web-2".to_string()
        ])
    );
    // Two of them become ready.
    for (n, ip) in [("web-0", "10.0.0.10"), ("web-2", "10.0.0.12")] {
        let p = format!("virt-launcher-{n}");
        bind(&pods, &p, "node-1").await?;
        mark_running(&pods, &p, ip, true).await?;
    }
    wait_for("readyReplicas 2", WAIT, || async {
        let rs = rss.get("web").await?;
        let st = rs.status.unwrap_or_default();
        Ok((st.ready_replicas == 2 && st.replicas == 3).then_some(()))
    })
    .await?;
    let rs = rss.get("web").await?;
    assert_eq!(
        rs.status.unwrap().label_selector.as_deref(),
        Some("app=web")
    );

    // kubectl scale through the scale subresource: the not-ready one (web-1) goes first,
    // then the newest ready one.
    let (ok, _, err) = env.kubectl(&["scale", "vmirs/web", "--replicas=1"], None)?;
    assert!(ok, "{err}");
    let left = wait_for("1 replica left", WAIT, || async {
        let v = rs_vmis(&env).await?;
        Ok((v.len() == 1).then_some(v))
    })
    .await?;
    let survivor = left[0].name_any();
    assert!(survivor == "web-0" || survivor == "web-2", "{survivor}");
    let (ok, out, _) = env.kubectl(&["get", "vmirs", "web"], None)?;
    assert!(ok);
    let header = columns(&out);
    assert_eq!(header, vec!["NAME", "DESIRED", "CURRENT", "READY", "AGE"]);

    // Scale up through the Rust client's scale subresource.
    rss.patch_scale(
        "web",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"replicas": 2}})),
    )
    .await?;
    wait_for("2 replicas", WAIT, || async {
        Ok((rs_vmis(&env).await?.len() == 2).then_some(()))
    })
    .await?;

    // Paused: spec changes are not acted on.
    rss.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"paused": true, "replicas": 4}})),
    )
    .await?;
    wait_for("status paused", WAIT, || async {
        Ok((rss.get("web").await?.status.and_then(|s| s.paused) == Some(true)).then_some(()))
    })
    .await?;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert_eq!(rs_vmis(&env).await?.len(), 2);
    rss.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"paused": false}})),
    )
    .await?;
    wait_for("4 replicas after unpause", WAIT, || async {
        Ok((rs_vmis(&env).await?.len() == 4).then_some(()))
    })
    .await?;

    // Deleting the set deletes its VMIs, which delete their pods.
    rss.delete("web", &DeleteParams::default()).await?;
    wait_for("set, VMIs and pods gone", WAIT, || async {
        let rs = rss.get_opt("web").await?;
        let v = env
            .api::<VirtualMachineInstance>()
            .list(&ListParams::default().labels("app=web"))
            .await?;
        let p = pods.list(&ListParams::default()).await?;
        Ok((rs.is_none() && v.items.is_empty() && p.items.is_empty()).then_some(()))
    })
    .await?;
    Ok(())
}
