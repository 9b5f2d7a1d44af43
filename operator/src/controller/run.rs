//! [`run`]: the shared caches (one watch per kind, fanned out to the controllers that read it)
//! and the four controllers, until shutdown.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{future, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use microvirt_crds::{
    VirtualMachine, VirtualMachineInstance, VirtualMachineInstancePreset,
    VirtualMachineInstanceReplicaSet, VirtualMachinePool,
};

use super::expectations::Expectations;
use super::filled::{self, mark_filled};
use super::{fanout, CachesFilled, Context, Error, RECONCILE_TIMEOUT};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::pod::{APP_NAME, LABEL_APP};
use crate::pool::PoolState;
use crate::vmirs::reconcile as vmirs;
use crate::{pool::reconcile as pool, vm::reconcile as vm, vmi::reconcile as vmi};

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

/// Drops `metadata.managedFields` from a watched object before it is cached: the API server's
/// record of which field manager owns which field, often the largest part of an object's
/// metadata, which no controller here reads (server-side apply sends its own field manager).
/// Every cache of the operator holds objects without it.
pub fn strip_managed_fields<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

/// A controller's main watch (what `Controller::new` builds, with this operator's back-off and
/// without `managedFields`): the objects of `api` into a cache the controller reads, and the
/// stream of objects added or changed, each a reconcile trigger.
fn main_watch<K>(
    api: Api<K>,
) -> (
    impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
    reflector::Store<K>,
)
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (cache, writer) = reflector::store();
    let stream = watcher(api, watcher::Config::default())
        .backoff(WatchBackoff::new())
        .modify(strip_managed_fields)
        .reflect(writer)
        .applied_objects();
    (stream, cache)
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
    // Waiting for a launcher pod to go is not a failure.
    let failed = match &res {
        Err(Error::PodTerminating(_)) | Ok(_) => None,
        Err(e) => Some(e.kind()),
    };
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
            .modify(strip_managed_fields)
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
            .modify(strip_managed_fields)
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
                .modify(strip_managed_fields)
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
        .modify(strip_managed_fields)
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

    let (vmi_main, vmi_cache) = main_watch(vmi_api);
    let vmi_ctrl = Controller::for_stream(vmi_main, vmi_cache)
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
    let (rs_main, rs_cache) = main_watch(rs_api);
    let rs_ctrl = Controller::for_stream(rs_main, rs_cache)
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
    let (vm_main, vm_cache) = main_watch(vm_api);
    let vm_ctrl = Controller::for_stream(vm_main, vm_cache)
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
            .modify(strip_managed_fields)
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

    #[tokio::test]
    async fn cached_objects_carry_no_managed_fields() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
        use kube::api::ObjectMeta;
        use kube::runtime::watcher::Event;

        let pod = |name: &str| Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                managed_fields: Some(vec![ManagedFieldsEntry {
                    manager: Some("kubectl".into()),
                    operation: Some("Apply".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            ..Default::default()
        };
        let (cache, writer) = reflector::store::<Pod>();
        let events = futures::stream::iter(vec![
            Ok(Event::Init),
            Ok(Event::InitApply(pod("a"))),
            Ok(Event::InitDone),
            Ok(Event::Apply(pod("b"))),
        ]);
        let seen: Vec<Pod> = events
            .modify(strip_managed_fields)
            .reflect(writer)
            .applied_objects()
            .map(|r| r.expect("no errors"))
            .collect()
            .await;
        assert_eq!(seen.len(), 2);
        assert!(seen.iter().all(|p| p.metadata.managed_fields.is_none()));
        for name in ["a", "b"] {
            let cached = cache
                .get(&ObjectRef::new(name).within("ns"))
                .expect("cached");
            assert_eq!(cached.metadata.managed_fields, None, "{name}");
        }
    }
}
