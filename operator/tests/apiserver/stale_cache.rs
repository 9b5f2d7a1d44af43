//! The VMIRS and VM reconcilers racing their own VMI cache, against a real kube-apiserver.
//!
//! The reconcilers decide from a VMI cache that lags behind the API server: right after a
//! delete it still shows the deleted VMI, and an operator that has just become leader may list
//! from an API server cache that is behind what the previous leader did. Here the test holds
//! the cache (a reflector store it fills itself) at exactly such a state and runs the
//! reconcilers against the real API server:
//!
//! 1. scale-in, then a second reconcile before the cache shows the deletion (but after it shows
//!    an older change): it must not delete a second VMI (expectations);
//! 2. a cache whose VMI is an older object with the same name as a live, Ready VMI: the
//!    reconciler must not delete the live one (uid preconditions), for a VMIRS and for a VM;
//! 3. both again for a VirtualMachinePool (its own expectations, the shared uid-conditioned
//!    delete).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::common::*;
use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use microvirt_crds::{
    VirtualMachine, VirtualMachineInstance, VirtualMachineInstancePreset,
    VirtualMachineInstanceReplicaSet, VirtualMachinePool,
};
use microvirt_operator::config::Config;
use microvirt_operator::controller::expectations::Expectations;
use microvirt_operator::controller::filled::filled;
use microvirt_operator::controller::{CachesFilled, Context};
use microvirt_operator::metrics::Metrics;
use microvirt_operator::pool::members::{effective_template, replica_vmi};
use microvirt_operator::pool::PoolState;
use microvirt_operator::vm::plan::new_vmi;
use microvirt_operator::vmirs::plan::new_replica;
use microvirt_operator::{pool::reconcile as pool, vm::reconcile as vm, vmirs::reconcile as vmirs};
use serde_json::json;

/// The namespaces of the two tests (each has the shared control plane to itself there: no
/// operator runs in them).
const NS_RS: &str = "t-stale-cache";
const NS_POOL: &str = "t-stale-cache-pool";

/// Replace the whole content of a store, as a relist would.
fn relist<K>(w: &mut Writer<K>, objs: impl IntoIterator<Item = K>)
where
    K: kube::Resource<DynamicType = ()> + Clone,
{
    w.apply_watcher_event(&watcher::Event::Init);
    for o in objs {
        w.apply_watcher_event(&watcher::Event::InitApply(o));
    }
    w.apply_watcher_event(&watcher::Event::InitDone);
}

/// `listed` with the object of the same name as `changed` replaced by it: a cache that shows
/// that change and nothing after it.
fn with_replaced(
    listed: &[VirtualMachineInstance],
    changed: VirtualMachineInstance,
) -> Vec<VirtualMachineInstance> {
    listed
        .iter()
        .map(|v| {
            if v.name_any() == changed.name_any() {
                changed.clone()
            } else {
                v.clone()
            }
        })
        .collect()
}

/// The VMIs labelled `app: app` as listed now, but `name` an older, Failed object of the same
/// name (another uid): what a lagging cache shows while the API server has the newer one.
async fn listed_with_an_earlier_failed(
    api: &Api<VirtualMachineInstance>,
    app: &str,
    name: &str,
) -> Result<Vec<VirtualMachineInstance>> {
    let mut listed = api
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await?
        .items;
    let old = listed
        .iter_mut()
        .find(|v| v.name_any() == name)
        .context(name.to_string())?;
    old.metadata.uid = Some(format!("uid-of-an-earlier-{name}"));
    old.status.get_or_insert_with(Default::default).phase = Some(microvirt_crds::VmiPhase::Failed);
    Ok(listed)
}

/// A reconciler context whose VMI cache the test controls (a fresh operator: no expectations).
fn context(client: &Client) -> (Arc<Context>, Writer<VirtualMachineInstance>) {
    let (pods, mut pw) = reflector::store::<Pod>();
    let (presets, mut prw) = reflector::store::<VirtualMachineInstancePreset>();
    let (vmis, vw) = reflector::store::<VirtualMachineInstance>();
    let (nodes, mut nw) = reflector::store::<Node>();
    relist(&mut pw, []);
    relist(&mut prw, []);
    relist(&mut nw, []);
    // Every test relists the VMI cache itself (`relist`) before its first reconcile, so the
    // caches count as filled from the start.
    let caches = [filled(), filled(), filled()].map(|(mark, filled)| {
        mark.mark();
        filled
    });
    let [pods_filled, presets_filled, vmis_filled] = caches;
    let reporter = Reporter {
        controller: "stale-cache-test".into(),
        instance: None,
    };
    let ctx = Context {
        client: client.clone(),
        config: Config::default(),
        metrics: Arc::new(Metrics::new()),
        recorder: Recorder::new(client.clone(), reporter),
        pods,
        presets,
        vmis,
        expectations: Expectations::default(),
        nodes,
        filled: CachesFilled {
            pods: pods_filled,
            presets: presets_filled,
            vmis: vmis_filled,
        },
        pool: Arc::new(PoolState::default()),
    };
    (Arc::new(ctx), vw)
}

async fn set_ready(api: &Api<VirtualMachineInstance>, name: &str, ready: bool) -> Result<()> {
    let status = json!({"status": {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
    }});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

/// Live (not deleting) VMIs: name → uid.
async fn live(api: &Api<VirtualMachineInstance>) -> Result<BTreeMap<String, String>> {
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|v| v.metadata.deletion_timestamp.is_none())
        .map(|v| (v.name_any(), v.metadata.uid.unwrap_or_default()))
        .collect())
}

/// A `kind` (VMIRS or pool) of `replicas` 32 MiB VMIs labelled `app: name`, created with its
/// controller's `finalizer` already, so a reconcile goes straight to its work.
async fn replicated<K>(
    api: &Api<K>,
    kind: &str,
    finalizer: &str,
    name: &str,
    replicas: i32,
) -> Result<K>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    let obj: K = serde_json::from_value(replicated_json(kind, finalizer, name, replicas))?;
    Ok(api.create(&PostParams::default(), &obj).await?)
}

async fn replica_set(
    api: &Api<VirtualMachineInstanceReplicaSet>,
    name: &str,
    replicas: i32,
) -> Result<VirtualMachineInstanceReplicaSet> {
    replicated(
        api,
        "VirtualMachineInstanceReplicaSet",
        vmirs::FINALIZER,
        name,
        replicas,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcilers_on_a_stale_cache_never_delete_more_or_other_vmis() -> Result<()> {
    let cluster = tokio::task::block_in_place(shared_cluster);
    let kc = cluster.kubeconfig_path();
    let (ok, _, err) = kubectl(kc, &["create", "namespace", NS_RS], None)?;
    assert!(ok, "{err}");
    let client = client_for(kc).await?;
    let rss: Api<VirtualMachineInstanceReplicaSet> = Api::namespaced(client.clone(), NS_RS);
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), NS_RS);
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), NS_RS);
    let pp = PostParams::default();

    // 1. Scale-in racing the cache. Three Ready replicas; web-2 is the newest.
    let rs = replica_set(&rss, "web", 3).await?;
    for i in 0..3 {
        let name = format!("web-{i}");
        vmis.create(&pp, &new_replica(&rs, &name)).await?;
        set_ready(&vmis, &name, true).await?;
    }
    let listed = vmis.list(&ListParams::default()).await?.items;
    let (ctx, mut cache) = context(&client);
    relist(&mut cache, listed.clone());
    // Scale to 2. Meanwhile web-0 stops being Ready (its guest reboots) — the cache does not
    // show that yet.
    rss.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"replicas": 2}})),
    )
    .await?;
    set_ready(&vmis, "web-0", false).await?;
    let web0_not_ready = vmis.get("web-0").await?;
    let rs2 = Arc::new(rss.get("web").await?);
    vmirs::reconcile(rs2.clone(), ctx.clone()).await?;
    let after_first = live(&vmis).await?;
    assert_eq!(
        after_first.keys().collect::<Vec<_>>(),
        ["web-0", "web-1"],
        "the first reconcile deletes the newest replica"
    );
    // The cache now shows web-0's change, which happened before the deletion, but not the
    // deletion itself: it still counts three active replicas, one of them not Ready.
    relist(&mut cache, with_replaced(&listed, web0_not_ready));
    vmirs::reconcile(rs2.clone(), ctx.clone()).await?;
    assert_eq!(
        live(&vmis).await?,
        after_first,
        "a reconcile on a cache that does not show its own deletion yet deleted another VMI"
    );
    // Once the cache catches up, the set is at its size and nothing more goes.
    relist(&mut cache, vmis.list(&ListParams::default()).await?.items);
    vmirs::reconcile(rs2, ctx.clone()).await?;
    assert_eq!(live(&vmis).await?, after_first);

    // 2a. A new leader listing from a lagging cache: it sees db-1 as an older, Failed object,
    //     while the API server has a newer db-1 that is Running and Ready.
    let rs = replica_set(&rss, "db", 2).await?;
    for i in 0..3 {
        let name = format!("db-{i}");
        vmis.create(&pp, &new_replica(&rs, &name)).await?;
        set_ready(&vmis, &name, true).await?;
    }
    let before = live(&vmis).await?;
    let stale = listed_with_an_earlier_failed(&vmis, "db", "db-1").await?;
    let (ctx, mut cache) = context(&client);
    relist(&mut cache, stale);
    vmirs::reconcile(Arc::new(rss.get("db").await?), ctx).await?;
    assert_eq!(
        live(&vmis).await?,
        before,
        "a stale decision deleted a newer VMI that reuses the name"
    );

    // 2b. The same for a VM: runStrategy Always, the stale cache shows its VMI Succeeded
    //     (so: delete and restart it), the API server already has the next, running VMI.
    let vm: VirtualMachine = serde_json::from_value(json!({
        "apiVersion": "microvirt.io/v1alpha1",
        "kind": "VirtualMachine",
        "metadata": {"name": "app", "finalizers": [vm::FINALIZER]},
        "spec": {"runStrategy": "Always",
                 "template": {"spec": {"domain": {"memory": {"guest": "32Mi"}}}}},
    }))?;
    let vm = vms.create(&pp, &vm).await?;
    let current = vmis.create(&pp, &new_vmi(&vm)).await?;
    set_ready(&vmis, "app", true).await?;
    let mut old = vmis.get("app").await?;
    old.metadata.uid = Some("uid-of-the-previous-app-vmi".into());
    old.status.get_or_insert_with(Default::default).phase =
        Some(microvirt_crds::VmiPhase::Succeeded);
    let (ctx, mut cache) = context(&client);
    relist(&mut cache, [old]);
    vm::reconcile(Arc::new(vm), ctx).await?;
    let now = vmis.get("app").await?;
    assert_eq!(now.metadata.uid, current.metadata.uid);
    assert!(
        now.metadata.deletion_timestamp.is_none(),
        "a stale decision deleted the VM's running VMI"
    );

    // 2c. A VM whose VMI failed before it ran: the failure is recorded before the VMI is
    //     deleted, a reconcile on the stale VM (the record not seen yet) records it again
    //     rather than counting it twice or deleting, and once the VMI is gone no VMI is created
    //     before retryAfterTimestamp.
    let vm: VirtualMachine = serde_json::from_value(json!({
        "apiVersion": "microvirt.io/v1alpha1",
        "kind": "VirtualMachine",
        "metadata": {"name": "crashy", "finalizers": [vm::FINALIZER]},
        "spec": {"runStrategy": "Always",
                 "template": {"spec": {"domain": {"memory": {"guest": "32Mi"}}}}},
    }))?;
    let stale_vm = Arc::new(vms.create(&pp, &vm).await?);
    let failed = vmis.create(&pp, &new_vmi(&stale_vm)).await?;
    let status = json!({"status": {"phase": "Failed", "reason": "GuestCrashed"}});
    vmis.patch_status("crashy", &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    let (ctx, mut cache) = context(&client);
    relist(&mut cache, [vmis.get("crashy").await?]);
    let recorded = |vm: VirtualMachine| vm.status.and_then(|s| s.start_failure);
    for _ in 0..2 {
        vm::reconcile(stale_vm.clone(), ctx.clone()).await?;
        let f = recorded(vms.get("crashy").await?).context("startFailure recorded")?;
        assert_eq!(f.consecutive_fail_count, 1, "{f:?}");
        assert_eq!(f.last_failed_vmi_uid, failed.metadata.uid);
        let v = vmis.get("crashy").await?;
        assert!(
            v.metadata.deletion_timestamp.is_none(),
            "the failed VMI was deleted before the VM's status recorded its failure"
        );
    }
    // The VM as it is now (the record seen): the failed VMI goes.
    vm::reconcile(Arc::new(vms.get("crashy").await?), ctx.clone()).await?;
    wait_for("failed VMI gone", WAIT, || async {
        Ok(vmis
            .get_opt("crashy")
            .await?
            .is_none_or(|v| v.metadata.deletion_timestamp.is_some())
            .then_some(()))
    })
    .await?;
    // Gone from the cache, within the back-off (10 s, the default): nothing is created, again
    // and again, and the VM shows CrashLoopBackOff.
    relist(&mut cache, []);
    for _ in 0..2 {
        vm::reconcile(Arc::new(vms.get("crashy").await?), ctx.clone()).await?;
        assert!(
            vmis.get_opt("crashy").await?.is_none(),
            "a VMI was created during the start back-off"
        );
    }
    let st = vms.get("crashy").await?.status.unwrap_or_default();
    assert_eq!(
        st.printable_status,
        Some(microvirt_crds::PrintableStatus::CrashLoopBackOff)
    );
    assert_eq!(st.start_failure.map(|f| f.consecutive_fail_count), Some(1));
    Ok(())
}

async fn vm_pool(
    api: &Api<VirtualMachinePool>,
    name: &str,
    replicas: i32,
) -> Result<VirtualMachinePool> {
    replicated(api, "VirtualMachinePool", pool::FINALIZER, name, replicas).await
}

/// The pool reconciler on the same kind of stale cache: its own expectations keep a second
/// reconcile from deleting another replica, and its deletes carry the uid the decision saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_reconciler_on_a_stale_cache_never_deletes_more_or_other_vmis() -> Result<()> {
    let cluster = tokio::task::block_in_place(shared_cluster);
    let kc = cluster.kubeconfig_path();
    let (ok, _, err) = kubectl(kc, &["create", "namespace", NS_POOL], None)?;
    assert!(ok, "{err}");
    let client = client_for(kc).await?;
    let pools: Api<VirtualMachinePool> = Api::namespaced(client.clone(), NS_POOL);
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), NS_POOL);
    let pp = PostParams::default();

    // 1. Scale-in 3 → 2, then a second reconcile on a cache that does not show the deletion.
    let p = vm_pool(&pools, "web", 3).await?;
    let tmpl = effective_template(&p, [])?;
    for i in 0..3 {
        let name = format!("web-{i}");
        vmis.create(&pp, &replica_vmi(&p, &tmpl, Some(&name), None))
            .await?;
        set_ready(&vmis, &name, true).await?;
    }
    let listed = vmis.list(&ListParams::default()).await?.items;
    let (ctx, mut cache) = context(&client);
    relist(&mut cache, listed.clone());
    pools
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 2}})),
        )
        .await?;
    let p2 = Arc::new(pools.get("web").await?);
    pool::reconcile(p2.clone(), ctx.clone()).await?;
    let after_first = live(&vmis).await?;
    assert_eq!(after_first.len(), 2, "{after_first:?}");
    // Then a survivor stops being Ready (its guest reboots), and the cache shows that change
    // but not the deletion: a plan on it alone would delete the survivor (not Ready first).
    let survivor = after_first.keys().next().context("a survivor")?.clone();
    set_ready(&vmis, &survivor, false).await?;
    let survivor_not_ready = vmis.get(&survivor).await?;
    relist(&mut cache, with_replaced(&listed, survivor_not_ready));
    pool::reconcile(p2.clone(), ctx.clone()).await?;
    assert_eq!(
        live(&vmis).await?,
        after_first,
        "a reconcile on a cache that does not show its own deletion yet deleted another VMI"
    );
    relist(&mut cache, vmis.list(&ListParams::default()).await?.items);
    pool::reconcile(p2, ctx).await?;
    assert_eq!(live(&vmis).await?, after_first);

    // 2. A cache whose db-1 is an older, Failed object with the same name as the live, Ready
    //    db-1: the pool deletes ended replicas, but never the newer one.
    let p = vm_pool(&pools, "db", 3).await?;
    let tmpl = effective_template(&p, [])?;
    for i in 0..3 {
        let name = format!("db-{i}");
        vmis.create(&pp, &replica_vmi(&p, &tmpl, Some(&name), None))
            .await?;
        set_ready(&vmis, &name, true).await?;
    }
    let before = live(&vmis).await?;
    let mut stale = listed_with_an_earlier_failed(&vmis, "db", "db-1").await?;
    // A fourth replica already on the API server covers the one the stale cache counts as
    // ended, so the plan's only write is the delete of "db-1".
    vmis.create(&pp, &replica_vmi(&p, &tmpl, Some("db-3"), None))
        .await?;
    stale.push(vmis.get("db-3").await?);
    let before: BTreeMap<String, String> = before
        .into_iter()
        .chain(live(&vmis).await?.into_iter().filter(|(n, _)| n == "db-3"))
        .collect();
    let (ctx, mut cache) = context(&client);
    relist(&mut cache, stale);
    pool::reconcile(Arc::new(pools.get("db").await?), ctx).await?;
    assert_eq!(
        live(&vmis).await?,
        before,
        "a stale decision deleted a newer VMI that reuses the name"
    );
    Ok(())
}
