//! VirtualMachinePool reconciler: carries out [`crate::pool::plan`] (API calls only; every
//! decision is in the pure modules of [`crate::pool`]).
//!
//! Writes: VMIs and pods with POST (warm members and cold VMIs use `generateName`; a claimed
//! VMI takes its warm member's name, so a second claim of the same member is refused by the
//! API server), merge patches on pods (claims, snapshot requests) and server-side apply of the
//! pool's status (field manager `microvirt-operator`). Every write is recorded in the pool's
//! expectations so that the next reconcile, possibly on a cache that has not seen the write,
//! does not repeat it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use microvirt_crds::control::{ControlCommand, ControlRequest};
use microvirt_crds::pool::{MemberRole, LABEL_POOL, LABEL_SNAPSHOT};
use microvirt_crds::vmi::ANNOTATION_CONTROL_REQUEST;
use microvirt_crds::{VirtualMachineInstance, VirtualMachinePool};
use serde_json::json;

use crate::config::FIELD_MANAGER;
use crate::controller::{
    apply_status, is_conflict, is_not_found, name_ns, reconcile_with_finalizer, Context, Error,
};
use crate::pool::members::{self, EffectiveTemplate};
use crate::pool::plan::{self, Inputs, Step};
use crate::pool::snapshot::NodeView;
use crate::pool::PoolExpectations;
use crate::vmi::VmiRef;

/// Finalizer on every pool: its VMIs and warm/builder pods are deleted with it.
pub const FINALIZER: &str = "microvirt.io/pool-members";
/// Most writes of one kind in flight at once (claims, creates).
const PARALLEL_WRITES: usize = 32;
/// Longest a refill waits for the pool's claims in flight.
const REFILL_HOLD: Duration = Duration::from_secs(1);

/// Reconcile one pool.
pub async fn reconcile(pool: Arc<VirtualMachinePool>, ctx: Arc<Context>) -> Result<Action, Error> {
    reconcile_with_finalizer(pool, &ctx, FINALIZER, apply, cleanup).await
}

/// Pods that trigger a pool: its members carry its name as a label.
pub fn pool_of_pod(pod: &Pod) -> Option<ObjectRef<VirtualMachinePool>> {
    let name = pod.labels().get(LABEL_POOL)?;
    Some(ObjectRef::new(name).within(&pod.namespace()?))
}

fn expectations<R>(ctx: &Context, uid: &str, f: impl FnOnce(&mut PoolExpectations) -> R) -> R {
    let mut g = ctx
        .pool
        .expectations
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    f(g.entry(uid.to_string()).or_default())
}

fn set_failure(ctx: &Context, uid: &str, failure: Option<String>) {
    let mut g = ctx.pool.failures.lock().unwrap_or_else(|e| e.into_inner());
    match failure {
        Some(f) => {
            g.insert(uid.to_string(), f);
        }
        None => {
            g.remove(uid);
        }
    }
}

/// What the node cache says about `node`.
fn node_view(ctx: &Context, node: Option<&str>) -> NodeView {
    let Some(node) = node else {
        return NodeView::Unknown;
    };
    if ctx.nodes.state().is_empty() {
        // Not filled (or no permission to list nodes): do not conclude anything.
        return NodeView::Unknown;
    }
    match ctx.nodes.get(&ObjectRef::<Node>::new(node)) {
        None => NodeView::Gone,
        Some(n) => NodeView::Present(
            n.annotations()
                .get(microvirt_crds::pool::ANNOTATION_HOST_FACTS)
                .cloned(),
        ),
    }
}

/// A 422/403 answer: the API server refuses the object, retrying will not help.
fn refusal(e: &kube::Error) -> Option<String> {
    match e {
        kube::Error::Api(s) if s.code == 422 || s.code == 403 => Some(s.message.clone()),
        _ => None,
    }
}

async fn apply(
    pool: Arc<VirtualMachinePool>,
    ctx: &Context,
    api: &Api<VirtualMachinePool>,
) -> Result<Action, Error> {
    let (name, ns) = name_ns(&*pool)?;
    let uid = pool.uid().ok_or(Error::MissingMeta("uid"))?;
    let _ = ctx.filled.vmis.wait().await;
    let _ = ctx.filled.pods.wait().await;
    let _ = ctx.filled.presets.wait().await;

    let presets: Vec<_> = ctx
        .presets
        .state()
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(ns.as_str()))
        .collect();
    let tmpl = members::effective_template(&pool, presets.iter().map(|p| p.as_ref()))?;
    let vmis: Vec<Arc<VirtualMachineInstance>> = ctx
        .vmis
        .state()
        .into_iter()
        .filter(|v| v.namespace().as_deref() == Some(ns.as_str()))
        .collect();
    let pods: Vec<Arc<Pod>> = ctx
        .pods
        .state()
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(ns.as_str()))
        .filter(|p| p.labels().get(LABEL_POOL) == Some(&name))
        .collect();
    let vmi_refs: Vec<&VirtualMachineInstance> = vmis.iter().map(|v| v.as_ref()).collect();
    let pod_refs: Vec<&Pod> = pods.iter().map(|p| p.as_ref()).collect();
    let pending = expectations(ctx, &uid, |e| {
        e.observe(&pod_refs, &vmi_refs, Instant::now());
        e.clone()
    });
    let snapshot = pool.status.as_ref().and_then(|s| s.snapshot.clone());
    let node = node_view(ctx, snapshot.as_ref().and_then(|s| s.node.as_deref()));
    let last_failure = ctx
        .pool
        .failures
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&uid)
        .cloned();
    let p = plan::plan(&Inputs {
        pool: &pool,
        template_hash: &tmpl.hash,
        vmis: vmi_refs.clone(),
        pods: pod_refs.clone(),
        node,
        pending: &pending,
        last_failure,
        now: Timestamp::now(),
    });

    // Claims first: the refill's new pods would compete with the claimed members' resume for
    // the node's CPU (pod sandbox, network, container start), so they wait until this pool's
    // claims in flight are Ready — a VMI turning Ready wakes the pool — or REFILL_HOLD passed.
    let mut steps = p.steps.clone();
    let mut requeue = p.requeue;
    let claiming = steps
        .iter()
        .any(|s| matches!(s, Step::Claim(..) | Step::FinishClaim(..)));
    let hold = if claiming {
        Some(REFILL_HOLD)
    } else {
        ctx.pool
            .latency
            .oldest_in_flight(&ns, &name)
            .map(|t| REFILL_HOLD.saturating_sub(t.elapsed()))
            .filter(|d| !d.is_zero())
    };
    if let Some(h) = hold {
        if steps.iter().any(|s| matches!(s, Step::CreateWarm(_))) {
            steps.retain(|s| !matches!(s, Step::CreateWarm(_)));
            requeue = Some(requeue.map_or(h, |r| r.min(h)));
        }
    }

    let run = Run {
        ctx,
        pool: &pool,
        uid: &uid,
        ns: &ns,
        tmpl: &tmpl,
        snapshot: p.status.snapshot.clone(),
        pods: &pods,
        vmis: &vmis,
    };
    let failure = run.execute(&steps).await?;
    set_failure(ctx, &uid, failure);

    for n in &p.notes {
        let t = if n.warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        ctx.event(&*pool, t, n.reason, "Snapshot", n.message.clone());
    }
    if !tmpl.conflicts.is_empty() && p.steps.contains(&Step::CreateBuilder) {
        for (preset, field) in &tmpl.conflicts {
            ctx.event(
                &*pool,
                EventType::Warning,
                "PresetConflict",
                "ApplyPreset",
                format!("preset {preset}: {field} not applied, the template sets another value"),
            );
        }
    }

    let mut status = p.status;
    if let Some(l) = ctx.pool.latency.summary(&ns, &name) {
        status.claim_latency = Some(l);
    }
    if pool.status.as_ref() != Some(&status) {
        apply_status(api, &name, &status).await?;
    }
    Ok(Action::requeue(
        requeue
            .unwrap_or(Duration::from_secs(300))
            .max(Duration::from_millis(100)),
    ))
}

/// One reconcile's writes.
struct Run<'a> {
    ctx: &'a Context,
    pool: &'a VirtualMachinePool,
    uid: &'a str,
    ns: &'a str,
    tmpl: &'a EffectiveTemplate,
    snapshot: Option<microvirt_crds::pool::PoolSnapshot>,
    pods: &'a [Arc<Pod>],
    vmis: &'a [Arc<VirtualMachineInstance>],
}

impl Run<'_> {
    fn pod_api(&self) -> Api<Pod> {
        Api::namespaced(self.ctx.client.clone(), self.ns)
    }

    fn vmi_api(&self) -> Api<VirtualMachineInstance> {
        Api::namespaced(self.ctx.client.clone(), self.ns)
    }

    fn post_params() -> PostParams {
        PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        }
    }

    fn event(&self, reason: &str, action: &str, note: String) {
        self.ctx
            .event(self.pool, EventType::Normal, reason, action, note);
    }

    /// Carries out `steps`: claims first (the latency-critical path), concurrently; then the
    /// rest. Returns the message of a create the API server refused, if any.
    async fn execute(&self, steps: &[Step]) -> Result<Option<String>, Error> {
        let mut failure = None;
        let claims: Vec<_> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Claim(pod, vmi) => Some(self.claim(pod, vmi, false)),
                Step::FinishClaim(pod, vmi) => Some(self.claim(pod, vmi, true)),
                _ => None,
            })
            .collect();
        let results: Vec<Result<(), Error>> = stream::iter(claims)
            .buffer_unordered(PARALLEL_WRITES)
            .collect()
            .await;
        for r in results {
            match r {
                Ok(()) => {}
                Err(Error::Kube(e)) if refusal(&e).is_some() => failure = refusal(&e),
                Err(e) => return Err(e),
            }
        }
        for s in steps {
            let r = match s {
                Step::Claim(..) | Step::FinishClaim(..) => Ok(()),
                Step::CreateBuilder => self.create_builder().await,
                Step::RequestSnapshot(pod, id) => self.request_snapshot(pod, id).await,
                Step::DeletePod(pod, why) => self.delete_pod(pod, why).await,
                Step::CreateWarm(n) => self.create_warm(*n).await,
                Step::CreateCold(n) => self.create_cold(*n).await,
                Step::DeleteVmi(vmi, why) => self.delete_vmi(vmi, why).await,
            };
            match r {
                Ok(()) => {}
                Err(Error::Kube(e)) if refusal(&e).is_some() => failure = refusal(&e),
                Err(e) => return Err(e),
            }
        }
        Ok(failure)
    }

    /// Claims warm pod `pod_name` as VMI `vmi_name` (`finish`: the VMI exists already).
    async fn claim(&self, pod_name: &str, vmi_name: &str, finish: bool) -> Result<(), Error> {
        let ctx = self.ctx;
        let started = Instant::now();
        let Some(pod) = self.pods.iter().find(|p| p.name_any() == pod_name) else {
            return Ok(());
        };
        let snapshot = pod
            .labels()
            .get(LABEL_SNAPSHOT)
            .cloned()
            .unwrap_or_default();
        let pool_name = self.pool.name_any();
        let vmi_api = self.vmi_api();
        let vmi = if finish {
            match self.vmis.iter().find(|v| v.name_any() == vmi_name) {
                Some(v) => (**v).clone(),
                None => return Ok(()),
            }
        } else {
            ctx.pool
                .latency
                .claim_started(self.ns, &pool_name, vmi_name, started);
            let obj = members::replica_vmi(self.pool, self.tmpl, Some(vmi_name), Some(&snapshot));
            match vmi_api.create(&Self::post_params(), &obj).await {
                Ok(v) => {
                    expectations(ctx, self.uid, |e| {
                        e.vmis_created.insert(vmi_name.to_string(), Instant::now())
                    });
                    v
                }
                // Someone (an earlier reconcile whose answer was lost) made it: the next
                // reconcile sees it and finishes the claim.
                Err(e) if is_conflict(&e) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        };
        let pods = self.pod_api();
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        let mut current: Pod = (**pod).clone();
        for attempt in 0..2 {
            match pods
                .patch(
                    pod_name,
                    &params,
                    &Patch::Merge(&members::claim_patch(&current, &vmi)),
                )
                .await
            {
                Ok(_) => {
                    expectations(ctx, self.uid, |e| {
                        e.pods_claimed.insert(pod_name.to_string(), Instant::now())
                    });
                    self.event(
                        "Claimed",
                        "ClaimWarmMember",
                        format!(
                            "VMI {vmi_name} claimed warm member {pod_name} (snapshot {snapshot}) in {} ms",
                            started.elapsed().as_millis()
                        ),
                    );
                    return Ok(());
                }
                // The cache was behind the pod: read it and try once more if it is still warm.
                Err(e) if is_conflict(&e) && attempt == 0 => match pods.get_opt(pod_name).await? {
                    Some(fresh)
                        if members::role(&fresh) == Some(MemberRole::Warm)
                            && fresh.metadata.deletion_timestamp.is_none() =>
                    {
                        current = fresh;
                    }
                    _ => break,
                },
                Err(e) if is_conflict(&e) || is_not_found(&e) => break,
                Err(e) => return Err(e.into()),
            }
        }
        // The member is gone or no longer warm: withdraw the VMI; the next reconcile claims
        // another member or boots one cold.
        tracing::info!(
            pool = %pool_name,
            "warm member {pod_name} could not be claimed; withdrawing VMI {vmi_name}"
        );
        if crate::controller::delete_vmi(&vmi_api, &VmiRef::of(&vmi)).await? {
            expectations(ctx, self.uid, |e| {
                e.vmis_deleted.insert(vmi_name.to_string(), Instant::now())
            });
        }
        Ok(())
    }

    async fn create_builder(&self) -> Result<(), Error> {
        let Some(s) = &self.snapshot else {
            return Ok(());
        };
        let pod = members::member_pod(
            self.pool,
            self.tmpl,
            MemberRole::Builder,
            &s.id,
            None,
            &self.ctx.config,
        )?;
        let name = pod.name_any();
        match self.pod_api().create(&Self::post_params(), &pod).await {
            Ok(_) => self.event(
                "SuccessfulCreate",
                "CreateBuilder",
                format!("created builder pod {name} for snapshot {}", s.id),
            ),
            Err(e) if is_conflict(&e) => {}
            Err(e) => return Err(e.into()),
        }
        expectations(self.ctx, self.uid, |e| {
            e.pods_created.insert(name, Instant::now())
        });
        Ok(())
    }

    async fn request_snapshot(&self, pod: &str, id: &str) -> Result<(), Error> {
        let request = ControlRequest::new(id, ControlCommand::Snapshot);
        let patch = json!({"metadata": {"annotations": {
            ANNOTATION_CONTROL_REQUEST: request.to_string(),
        }}});
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        match self
            .pod_api()
            .patch(pod, &params, &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                expectations(self.ctx, self.uid, |e| {
                    e.pods_requested.insert(pod.to_string(), Instant::now())
                });
                Ok(())
            }
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn delete_pod(&self, pod: &str, why: &str) -> Result<(), Error> {
        let uid = self
            .pods
            .iter()
            .find(|p| p.name_any() == pod)
            .and_then(|p| p.uid());
        let dp = DeleteParams {
            preconditions: uid.map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..Default::default()
        };
        match self.pod_api().delete(pod, &dp).await {
            Ok(_) => {
                expectations(self.ctx, self.uid, |e| {
                    e.pods_deleted.insert(pod.to_string(), Instant::now())
                });
                self.event(
                    "SuccessfulDelete",
                    "DeletePod",
                    format!("deleted {pod}: {why}"),
                );
                Ok(())
            }
            Err(e) if is_not_found(&e) || is_conflict(&e) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn create_warm(&self, n: usize) -> Result<(), Error> {
        let Some(s) = self.snapshot.as_ref() else {
            return Ok(());
        };
        let pod = members::member_pod(
            self.pool,
            self.tmpl,
            MemberRole::Warm,
            &s.id,
            s.node.as_deref(),
            &self.ctx.config,
        )?;
        let api = self.pod_api();
        let pp = Self::post_params();
        let creates: Vec<_> = (0..n).map(|_| api.create(&pp, &pod)).collect();
        let results: Vec<Result<Pod, kube::Error>> = stream::iter(creates)
            .buffer_unordered(PARALLEL_WRITES)
            .collect()
            .await;
        let mut made = 0;
        for r in results {
            let created = r?;
            made += 1;
            expectations(self.ctx, self.uid, |e| {
                e.pods_created.insert(created.name_any(), Instant::now())
            });
        }
        if made > 0 {
            self.event(
                "SuccessfulCreate",
                "CreateWarmMember",
                format!("created {made} warm member(s) from snapshot {}", s.id),
            );
        }
        Ok(())
    }

    async fn create_cold(&self, n: usize) -> Result<(), Error> {
        let vmi = members::replica_vmi(self.pool, self.tmpl, None, None);
        let api = self.vmi_api();
        let pp = Self::post_params();
        let creates: Vec<_> = (0..n).map(|_| api.create(&pp, &vmi)).collect();
        let results: Vec<Result<VirtualMachineInstance, kube::Error>> = stream::iter(creates)
            .buffer_unordered(PARALLEL_WRITES)
            .collect()
            .await;
        for r in results {
            let created = r?;
            expectations(self.ctx, self.uid, |e| {
                e.vmis_created.insert(created.name_any(), Instant::now())
            });
            self.event(
                "SuccessfulCreate",
                "CreateVMI",
                format!(
                    "created VMI {} (cold boot: no warm member ready)",
                    created.name_any()
                ),
            );
        }
        Ok(())
    }

    /// Deletes the VMI `r` only if its name still belongs to the uid the plan saw (a stale
    /// cache can name a VMI that was replaced meanwhile).
    async fn delete_vmi(&self, r: &VmiRef, why: &str) -> Result<(), Error> {
        if crate::controller::delete_vmi(&self.vmi_api(), r).await? {
            expectations(self.ctx, self.uid, |e| {
                e.vmis_deleted.insert(r.name.clone(), Instant::now())
            });
            self.event(
                "SuccessfulDelete",
                "DeleteVMI",
                format!("deleted VMI {}: {why}", r.name),
            );
        }
        Ok(())
    }
}

/// Deletion: every VMI of the pool and every builder and warm pod; the finalizer goes once the
/// API server lists none of them (snapshots on the nodes are removed by the node agents once
/// the pool is gone).
async fn cleanup(pool: Arc<VirtualMachinePool>, ctx: &Context) -> Result<Action, Error> {
    let (name, ns) = name_ns(&*pool)?;
    let uid = pool.uid().unwrap_or_default();
    let vmi_api: Api<VirtualMachineInstance> = Api::namespaced(ctx.client.clone(), &ns);
    let pod_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let mut left = 0;
    for v in vmi_api.list(&ListParams::default()).await?.items {
        if !members::vmi_of_pool(&v, &pool) {
            continue;
        }
        left += 1;
        if v.metadata.deletion_timestamp.is_none() {
            match vmi_api
                .delete(&v.name_any(), &DeleteParams::default())
                .await
            {
                Ok(_) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    let lp = ListParams::default().labels(&format!("{LABEL_POOL}={name}"));
    for p in pod_api.list(&lp).await?.items {
        if !members::pod_of_pool(&p, &pool) {
            continue;
        }
        left += 1;
        if p.metadata.deletion_timestamp.is_none() {
            match pod_api
                .delete(&p.name_any(), &DeleteParams::default())
                .await
            {
                Ok(_) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    if left > 0 {
        return Err(Error::PodTerminating(format!(
            "{left} VMI(s) and pod(s) of pool {name}"
        )));
    }
    ctx.pool.latency.forget_pool(&ns, &name);
    expectations(ctx, &uid, |e| *e = PoolExpectations::default());
    ctx.pool
        .expectations
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&uid);
    set_failure(ctx, &uid, None);
    Ok(Action::await_change())
}
