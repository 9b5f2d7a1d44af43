//! The controllers' shared machinery: their context, the reconcile pipeline, and [`run`](run::run).
//!
//! Each kind has its folder (KubeVirt's `pkg/virt-controller/watch/<kind>`): [`crate::vmi`],
//! [`crate::vmirs`], [`crate::vm`], [`crate::pool`], each with its pure `plan` and its I/O
//! `reconcile`. Each reconciler is small and idempotent: read the object and the caches,
//! compute the desired state with the pure functions of its `plan` (and [`crate::pod`]), then
//! write only what differs (server-side apply with field manager `microvirt-operator`; status
//! through the status subresource).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::NamespaceResourceScope;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::finalizer::{finalizer, Event as FinalizerEvent};
use kube::runtime::reflector::Store;
use kube::{Api, Client, Resource, ResourceExt};
use microvirt_crds::{VirtualMachineInstance, VirtualMachineInstancePreset};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::json;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::pod::PodError;
use crate::pool::PoolState;
use crate::vmi::preset::PresetError;
use crate::vmi::VmiRef;
use expectations::Expectations;
use filled::Filled;

pub mod expectations;
pub mod fanout;
pub mod filled;
pub mod run;

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

impl Error {
    /// What kind of failure this is, for the error counter's `kind` label: a small fixed set,
    /// so a dashboard can tell conflicts (a stale cache, retried at once) from an API server
    /// that refuses or does not answer, and both from specs the operator cannot render.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(s)) if s.code == 409 => "conflict",
            Error::Kube(kube::Error::Api(s)) if s.code == 404 => "not_found",
            Error::Kube(kube::Error::Api(s)) if s.code == 403 => "forbidden",
            Error::Kube(kube::Error::Api(s)) if s.code == 422 => "invalid",
            Error::Kube(kube::Error::Api(_)) => "api",
            Error::Kube(_) => "connection",
            Error::Pod(_) => "pod_spec",
            Error::Preset(_) => "preset",
            Error::Json(_) => "json",
            Error::MissingMeta(_) => "missing_meta",
            Error::PodTerminating(_) => "pod_terminating",
            Error::Finalizer(_) => "finalizer",
            Error::Timeout(_) => "timeout",
        }
    }
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
    use microvirt_crds::{VirtualMachine, VirtualMachineInstanceReplicaSet, VirtualMachinePool};

    #[test]
    fn errors_are_counted_by_kind() {
        let api = |code: u16| {
            Error::Kube(kube::Error::Api(
                kube::core::Status::failure("refused", "Reason")
                    .with_code(code)
                    .boxed(),
            ))
        };
        let cases = [
            (api(409), "conflict"),
            (api(404), "not_found"),
            (api(403), "forbidden"),
            (api(422), "invalid"),
            (api(500), "api"),
            (
                Error::Kube(kube::Error::LinesCodecMaxLineLengthExceeded),
                "connection",
            ),
            (Error::MissingMeta("name"), "missing_meta"),
            (Error::PodTerminating("p".into()), "pod_terminating"),
            (Error::Finalizer("f".into()), "finalizer"),
            (Error::Timeout(RECONCILE_TIMEOUT), "timeout"),
        ];
        for (e, kind) in cases {
            assert_eq!(e.kind(), kind, "{e}");
        }
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
