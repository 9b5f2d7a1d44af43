//! The controllers' shared machinery: their context, the reconcile pipeline, and [`run`].
//!
//! Each kind has its folder (KubeVirt's `pkg/virt-controller/watch/<kind>`): [`crate::vmi`],
//! [`crate::vmirs`], [`crate::vm`], [`crate::pool`], each with its pure `plan` and its I/O
//! `reconcile`. Each reconciler is small and idempotent: read the object and the caches,
//! compute the desired state with the pure functions of its `plan` (and [`crate::pod`]), then
//! write only what differs (server-side apply with field manager `microvirt-operator`; status
//! through the status subresource).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{future, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::NamespaceResourceScope;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{finalizer, Event as FinalizerEvent};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use microvirt_crds::{
    VirtualMachine, VirtualMachineInstance, VirtualMachineInstancePreset,
    VirtualMachineInstanceReplicaSet, VirtualMachinePool,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::json;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::pod::{PodError, APP_NAME, LABEL_APP};
use crate::pool::PoolState;
use crate::vmi::preset::PresetError;
use crate::vmirs::plan::VmiRef;
use crate::vmirs::reconcile as vmirs;
use crate::{pool::reconcile as pool, vm::reconcile as vm, vmi::reconcile as vmi};
use expectations::Expectations;
use filled::{mark_filled, Filled};

pub mod expectations;
pub mod fanout;
pub mod filled;

/// Errors of a reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API request failed.
    #[error("API request failed: {0}")]
    Kube(#[from] kube::Error),
    /// The launcher pod could not be built.
    #[error(transparent)]
    Pod(#[from] PodError),
    /// Presets could not be applied.
    #[error(transparent)]
    Preset(#[from] PresetError),
    /// JSON (de)serialization failed.
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The object lacks a name or namespace.
    #[error("object has no {0}")]
    MissingMeta(&'static str),
    /// Deletion waits for the launcher pod to terminate (not a failure; retried shortly).
    #[error("waiting for launcher pod {0} to terminate")]
    PodTerminating(String),
    /// Adding or removing a finalizer failed.
    #[error("finalizer: {0}")]
    Finalizer(String),
    /// The reconcile did not finish within [`RECONCILE_TIMEOUT`] (an API request that never
    /// answered); it was abandoned and is retried.
    #[error("reconcile abandoned after {0:?} (an API request did not answer)")]
    Timeout(Duration),
}

/// How long one reconcile may take. Each does a handful of API requests that answer in
/// milliseconds; one that hangs (a connection the API server will never answer on, e.g. after
/// it restarted) would otherwise hold that object's reconciles for minutes.
pub const RECONCILE_TIMEOUT: Duration = Duration::from_secs(20);

/// Whether an error is a plain `404 Not Found`.
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Whether an error is `409 AlreadyExists/Conflict`.
pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// State shared by all reconcilers.
pub struct Context {
    /// API client.
    pub client: Client,
    /// Settings.
    pub config: Config,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Event recorder.
    pub recorder: Recorder,
    /// Launcher pods (label `app.kubernetes.io/name=virt-launcher`).
    pub pods: Store<Pod>,
    /// Presets.
    pub presets: Store<VirtualMachineInstancePreset>,
    /// VMIs (for the VM, VMIRS and pool controllers).
    pub vmis: Store<VirtualMachineInstance>,
    /// VMI creations and deletions of the VM and VMIRS controllers not yet seen in `vmis`.
    pub expectations: Expectations,
    /// Nodes (for the pool controller: where snapshots live, the host facts they need).
    pub nodes: Store<Node>,
    /// Whether `pods`, `presets` and `vmis` hold their first full list (wait on these, not on
    /// `Store::wait_until_ready`, which wakes only one of several waiters: [`filled`]).
    pub filled: CachesFilled,
    /// The pool controller's in-memory state (expectations, claim latency).
    pub pool: Arc<PoolState>,
}

impl Context {
    /// Publish an Event about `obj` without delaying the reconcile (failures are logged).
    pub fn event<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let recorder = self.recorder.clone();
        let reference = obj.object_ref(&());
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&ev, &reference).await {
                tracing::debug!("publishing event: {e}");
            }
        });
    }
}

/// Whether each shared cache holds its first full list.
#[derive(Clone, Debug)]
pub struct CachesFilled {
    /// [`Context::pods`].
    pub pods: Filled,
    /// [`Context::presets`].
    pub presets: Filled,
    /// [`Context::vmis`].
    pub vmis: Filled,
}

/// Watch retry delays: 250 ms doubling up to 4 s (kube's default goes up to 30 s, which makes
/// recovery after an API server restart needlessly slow).
#[derive(Debug, Clone)]
pub struct WatchBackoff {
    next: Duration,
}

impl WatchBackoff {
    const MIN: Duration = Duration::from_millis(250);
    const MAX: Duration = Duration::from_secs(4);

    /// A fresh backoff.
    pub fn new() -> Self {
        Self { next: Self::MIN }
    }
}

impl Default for WatchBackoff {
    fn default() -> Self {
        Self::new()
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        let d = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        Some(d)
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = Self::MIN;
    }
}

/// What [`run`] watches and how.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Only this namespace (default: all).
    pub namespace: Option<String>,
    /// Reporting instance name for Events (e.g. the pod name).
    pub instance: Option<String>,
    /// After shutdown is asked for, how long reconciles already running may go on before they
    /// are abandoned.
    pub drain_timeout: Duration,
}

/// Default [`RunOptions::drain_timeout`].
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(3);

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            namespace: None,
            instance: None,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
        }
    }
}

fn api<K>(client: &Client, ns: Option<&str>) -> Api<K>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

fn error_policy_for<K: Resource>(
    controller: &'static str,
) -> impl Fn(Arc<K>, &Error, Arc<Context>) -> Action {
    move |obj, err, _ctx| match err {
        Error::PodTerminating(_) => Action::requeue(Duration::from_millis(500)),
        _ => {
            tracing::warn!(controller, object = %obj_name(&*obj), "reconcile failed: {err}");
            Action::requeue(Duration::from_secs(2))
        }
    }
}

fn obj_name<K: Resource>(obj: &K) -> String {
    format!(
        "{}/{}",
        obj.meta().namespace.as_deref().unwrap_or(""),
        obj.meta().name.as_deref().unwrap_or("")
    )
}

/// Time a reconcile and count it.
pub async fn instrumented<F>(
    ctx: &Context,
    controller: &'static str,
    fut: F,
) -> Result<Action, Error>
where
    F: std::future::Future<Output = Result<Action, Error>>,
{
    let start = Instant::now();
    let res = match tokio::time::timeout(RECONCILE_TIMEOUT, fut).await {
        Ok(res) => res,
        Err(_) => Err(Error::Timeout(RECONCILE_TIMEOUT)),
    };
    let failed = matches!(&res, Err(e) if !matches!(e, Error::PodTerminating(_)));
    ctx.metrics.reconciled(controller, start.elapsed(), failed);
    res
}

/// Run every controller until `shutdown` resolves. `ready` is set once the caches are filled.
///
/// Once `shutdown` resolves the controllers take no new work; reconciles already running get
/// [`RunOptions::drain_timeout`], then they are dropped and `run` returns, whatever the API
/// server does (a reconcile or a cache that waits for an unreachable API server never finishes
/// on its own).
pub async fn run(
    client: Client,
    config: Config,
    metrics: Arc<Metrics>,
    opts: RunOptions,
    ready: Arc<AtomicBool>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + Clone + 'static,
) {
    let ns = opts.namespace.as_deref();
    let pod_api: Api<Pod> = api(&client, ns);
    let vmi_api: Api<VirtualMachineInstance> = api(&client, ns);
    let vm_api: Api<VirtualMachine> = api(&client, ns);
    let rs_api: Api<VirtualMachineInstanceReplicaSet> = api(&client, ns);
    let preset_api: Api<VirtualMachineInstancePreset> = api(&client, ns);
    let pool_api: Api<VirtualMachinePool> = api(&client, ns);

    // Shared caches. Pods and VMIs are watched once each; the watch fills the cache and then
    // triggers the controllers that read it (controller/fanout.rs), so none of them runs on a
    // cache older than the event that woke it.
    let (pods, pod_writer) = reflector::store();
    let (mark_pods, pods_filled) = filled::filled();
    let (pod_watch, mut pod_triggers) = fanout::fan_out(
        mark_filled(
            watcher(
                pod_api,
                watcher::Config::default().labels(&format!("{LABEL_APP}={APP_NAME}")),
            )
            .backoff(WatchBackoff::new())
            .reflect(pod_writer),
            mark_pods,
        ),
        2,
        "launcher pods",
    );
    let (pods_for_vmi, pods_for_pool) = (pod_triggers.remove(0), pod_triggers.remove(0));
    let (presets, preset_writer) = reflector::store();
    let (mark_presets, presets_filled) = filled::filled();
    let preset_stream = mark_filled(
        watcher(preset_api, watcher::Config::default())
            .backoff(WatchBackoff::new())
            .reflect(preset_writer),
        mark_presets,
    )
    .touched_objects();
    let (vmis, vmi_writer) = reflector::store();
    let (mark_vmis, vmis_filled) = filled::filled();
    let (vmi_watch, mut vmi_triggers) = fanout::fan_out(
        mark_filled(
            watcher(vmi_api.clone(), watcher::Config::default())
                .backoff(WatchBackoff::new())
                .reflect(vmi_writer),
            mark_vmis,
        ),
        3,
        "VMIs",
    );
    let (vmis_for_rs, vmis_for_vm, vmis_for_pool) = (
        vmi_triggers.remove(0),
        vmi_triggers.remove(0),
        vmi_triggers.remove(0),
    );
    let (nodes, node_writer) = reflector::store();
    let node_stream = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .backoff(WatchBackoff::new())
        .reflect(node_writer)
        .touched_objects();
    let (pools, pool_writer) = reflector::store::<VirtualMachinePool>();

    let reporter = Reporter {
        controller: crate::config::FIELD_MANAGER.into(),
        instance: opts.instance.clone(),
    };
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client: client.clone(),
        config,
        metrics,
        pods: pods.clone(),
        presets: presets.clone(),
        vmis: vmis.clone(),
        expectations: Expectations::default(),
        nodes: nodes.clone(),
        filled: CachesFilled {
            pods: pods_filled,
            presets: presets_filled,
            vmis: vmis_filled,
        },
        pool: Arc::new(PoolState::default()),
    });

    // Presets only feed the cache; pods and VMIs feed theirs and trigger the controllers.
    // The watches run inside this future (not spawned): whoever drops or aborts `run` stops
    // them with the controllers.
    let watches = future::join3(
        preset_stream.for_each(|_| future::ready(())),
        pod_watch,
        vmi_watch,
    );

    let vmi_ctrl = Controller::new(vmi_api, watcher::Config::default())
        .owns_stream(pods_for_vmi)
        .trigger_backoff(WatchBackoff::new())
        .graceful_shutdown_on(shutdown.clone())
        .run(
            |obj, ctx: Arc<Context>| async move {
                let c = ctx.clone();
                instrumented(&c, "vmi", vmi::reconcile(obj, ctx)).await
            },
            error_policy_for("vmi"),
            ctx.clone(),
        )
        .for_each(|r| {
            if let Err(e) = r {
                tracing::debug!("vmi controller: {e}");
            }
            future::ready(())
        });
    let rs_ctrl = Controller::new(rs_api, watcher::Config::default())
        .owns_stream(vmis_for_rs)
        .trigger_backoff(WatchBackoff::new())
        .graceful_shutdown_on(shutdown.clone())
        .run(
            |obj, ctx: Arc<Context>| async move {
                let c = ctx.clone();
                instrumented(&c, "vmirs", vmirs::reconcile(obj, ctx)).await
            },
            error_policy_for("vmirs"),
            ctx.clone(),
        )
        .for_each(|r| {
            if let Err(e) = r {
                tracing::debug!("vmirs controller: {e}");
            }
            future::ready(())
        });
    let vm_ctrl = Controller::new(vm_api, watcher::Config::default())
        .owns_stream(vmis_for_vm)
        .trigger_backoff(WatchBackoff::new())
        .graceful_shutdown_on(shutdown.clone())
        .run(
            |obj, ctx: Arc<Context>| async move {
                let c = ctx.clone();
                instrumented(&c, "vm", vm::reconcile(obj, ctx)).await
            },
            error_policy_for("vm"),
            ctx.clone(),
        )
        .for_each(|r| {
            if let Err(e) = r {
                tracing::debug!("vm controller: {e}");
            }
            future::ready(())
        });

    let pools_by_node = pools.clone();
    let pool_ctrl = Controller::for_stream(
        watcher(pool_api, watcher::Config::default())
            .backoff(WatchBackoff::new())
            .reflect(pool_writer)
            .touched_objects(),
        pools,
    )
    .owns_stream(vmis_for_pool)
    .watches_stream(pods_for_pool, |pod: Pod| pool::pool_of_pod(&pod))
    .watches_stream(node_stream, move |node: Node| {
        let name = node.name_any();
        pools_by_node
            .state()
            .into_iter()
            .filter(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.snapshot.as_ref())
                    .and_then(|s| s.node.as_deref())
                    == Some(name.as_str())
            })
            .map(|p| ObjectRef::from_obj(&*p))
            .collect::<Vec<_>>()
    })
    .trigger_backoff(WatchBackoff::new())
    .graceful_shutdown_on(shutdown.clone())
    .run(
        |obj, ctx: Arc<Context>| async move {
            let c = ctx.clone();
            instrumented(&c, "vmpool", pool::reconcile(obj, ctx)).await
        },
        error_policy_for("vmpool"),
        ctx.clone(),
    )
    .for_each(|r| {
        if let Err(e) = r {
            tracing::debug!("vmpool controller: {e}");
        }
        future::ready(())
    });

    let ready_flag = ready.clone();
    let caches = ctx.filled.clone();
    let readiness = tokio::spawn(async move {
        // Each cache is named as it fills, so a start that never gets ready says which list
        // it still waits for. Reconciles wait on the same caches at the same time: hence
        // `Filled`, which wakes every waiter (kube's `Store::wait_until_ready` wakes only one,
        // and a start-up that lost that race never became ready).
        for (what, cache) in [
            ("launcher pods", &caches.pods),
            ("presets", &caches.presets),
            ("VMIs", &caches.vmis),
        ] {
            if !cache.wait().await {
                // The watch ended first: the controllers are stopping.
                return;
            }
            tracing::info!("{what} cache filled");
        }
        ready_flag.store(true, Ordering::SeqCst);
        tracing::info!("caches filled; controllers running");
    });
    let controllers = future::join4(vmi_ctrl, rs_ctrl, vm_ctrl, pool_ctrl);
    tokio::pin!(controllers);
    tokio::pin!(watches);
    tokio::select! {
        _ = &mut controllers => {}
        _ = &mut watches => {}
        _ = shutdown => {
            tracing::info!("shutting down: controllers take no new work");
            if tokio::time::timeout(opts.drain_timeout, &mut controllers).await.is_err() {
                tracing::warn!(
                    "reconciles still running after {:?}; abandoning them",
                    opts.drain_timeout
                );
            }
        }
    }
    readiness.abort();
    ready.store(false, Ordering::SeqCst);
}

/// Delete the VMI `r` only if its name still belongs to the uid the decision saw. Returns
/// whether this call deleted it (or started its deletion); a VMI already gone, or a name that
/// belongs to another VMI now, is left alone.
pub async fn delete_vmi(api: &Api<VirtualMachineInstance>, r: &VmiRef) -> Result<bool, Error> {
    let dp = DeleteParams {
        preconditions: r.uid.clone().map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&r.name, &dp).await {
        Ok(_) => Ok(true),
        Err(e) if is_not_found(&e) => Ok(false),
        Err(e) if is_conflict(&e) => {
            tracing::info!(vmi = %r.name, "not deleting: the name belongs to another VMI now");
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

/// Object name and namespace, or an error.
pub fn name_ns<K: Resource>(obj: &K) -> Result<(String, String), Error> {
    let name = obj.meta().name.clone().ok_or(Error::MissingMeta("name"))?;
    let ns = obj
        .meta()
        .namespace
        .clone()
        .ok_or(Error::MissingMeta("namespace"))?;
    Ok((name, ns))
}

/// Reconciles `obj` in its namespace under the finalizer `finalizer_name` (kube's finalizer
/// helper): `apply` while it lives, once the finalizer is on it; `cleanup` once it is being
/// deleted, the finalizer coming off when that succeeds. Errors as in [`finalizer_result`].
pub async fn reconcile_with_finalizer<K>(
    obj: Arc<K>,
    ctx: &Context,
    finalizer_name: &str,
    apply: impl AsyncFnOnce(Arc<K>, &Context, &Api<K>) -> Result<Action, Error>,
    cleanup: impl AsyncFnOnce(Arc<K>, &Context) -> Result<Action, Error>,
) -> Result<Action, Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Serialize
        + std::fmt::Debug,
{
    let (_, ns) = name_ns(&*obj)?;
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &ns);
    finalizer_result(
        finalizer(&api, finalizer_name, obj, |event| async {
            match event {
                FinalizerEvent::Apply(obj) => apply(obj, ctx, &api).await,
                FinalizerEvent::Cleanup(obj) => cleanup(obj, ctx).await,
            }
        })
        .await,
    )
}

/// The finalizer helper's result as ours. Adding or removing the finalizer of an object that is
/// already gone (another reconcile finished the deletion first) is not an error.
pub fn finalizer_result(
    r: Result<Action, kube::runtime::finalizer::Error<Error>>,
) -> Result<Action, Error> {
    use kube::runtime::finalizer::Error as F;
    match r {
        Ok(a) => Ok(a),
        Err(F::ApplyFailed(e) | F::CleanupFailed(e)) => Err(e),
        Err(F::AddFinalizer(e) | F::RemoveFinalizer(e)) if is_not_found(&e) => {
            Ok(Action::await_change())
        }
        Err(other) => Err(Error::Finalizer(other.to_string())),
    }
}

/// The body of a server-side apply of `status` to an object of kind `K`: its apiVersion and
/// kind, and the status (nothing of the metadata, so the apply is not conditioned on a
/// resourceVersion).
fn status_patch<K: Resource<DynamicType = ()>>(status: &impl Serialize) -> serde_json::Value {
    json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    })
}

/// Writes `status` to object `name` through the status subresource: server-side apply, field
/// manager `microvirt-operator`, forced (the operator owns the status fields it writes).
pub async fn apply_status<K>(api: &Api<K>, name: &str, status: &impl Serialize) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    api.patch_status(
        name,
        &PatchParams::apply(crate::config::FIELD_MANAGER).force(),
        &Patch::Apply(&status_patch::<K>(status)),
    )
    .await?;
    Ok(())
}

/// Labels of an object as a reference (convenience re-export for the sub-modules).
pub fn labels_of<K: ResourceExt>(obj: &K) -> &std::collections::BTreeMap<String, String> {
    obj.labels()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::utils::Backoff;

    #[test]
    fn watch_backoff_doubles_caps_and_resets() {
        let mut b = WatchBackoff::new();
        let v: Vec<u128> = (0..7).map(|_| b.next().unwrap().as_millis()).collect();
        assert_eq!(v, vec![250, 500, 1000, 2000, 4000, 4000, 4000]);
        b.reset();
        assert_eq!(b.next(), Some(Duration::from_millis(250)));
    }

    #[test]
    fn status_patches_name_the_kind_and_carry_only_the_status() {
        let status = json!({"phase": "Running"});
        for (patch, kind) in [
            (status_patch::<VirtualMachine>(&status), "VirtualMachine"),
            (
                status_patch::<VirtualMachineInstance>(&status),
                "VirtualMachineInstance",
            ),
            (
                status_patch::<VirtualMachineInstanceReplicaSet>(&status),
                "VirtualMachineInstanceReplicaSet",
            ),
            (
                status_patch::<VirtualMachinePool>(&status),
                "VirtualMachinePool",
            ),
        ] {
            assert_eq!(
                patch,
                json!({
                    "apiVersion": "microvirt.io/v1alpha1",
                    "kind": kind,
                    "status": {"phase": "Running"},
                })
            );
        }
    }
}
