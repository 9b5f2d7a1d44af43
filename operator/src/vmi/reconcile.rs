//! VMI reconciler: presets on first sight, one launcher pod, status from the pod, graceful
//! deletion through a finalizer.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use microvirt_crds::vmi::ANNOTATION_PRESETS_APPLIED;
use microvirt_crds::VirtualMachineInstance;
use serde_json::json;

use crate::config::FIELD_MANAGER;
use crate::controller::{
    apply_status, is_conflict, is_not_found, name_ns, reconcile_with_finalizer, Context, Error,
};
use crate::pod::{cloud_init_secret, desired_pod, pod_belongs_to, pod_name, BlockVolumes};
use crate::vmi::{plan, preset};

/// Creates the VMI's cloud-init Secret, or rewrites its data when an earlier reconcile of this
/// VMI made it. A Secret of that name that belongs to anything else is never changed (nor
/// adopted, which would let the garbage collector delete it with the VMI): the JSON patch
/// tests the owner first. `Ok(Err(reason))` when the VMI cannot get its Secret.
async fn put_cloud_init_secret(
    secrets: &Api<Secret>,
    secret: &Secret,
    vmi_uid: &str,
) -> Result<Result<(), String>, kube::Error> {
    let name = secret.metadata.name.clone().unwrap_or_default();
    let pp = kube::api::PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    match secrets.create(&pp, secret).await {
        Ok(_) => return Ok(Ok(())),
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(kube::Error::Api(s)) if s.code == 422 => {
            return Ok(Err(format!("cloud-init Secret refused: {}", s.message)))
        }
        Err(e) => return Err(e),
    }
    let ops: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/ownerReferences/0/uid", "value": vmi_uid},
        {"op": "add", "path": "/data", "value": secret.data},
    ]))
    .expect("a well-formed JSON patch");
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    match secrets.patch(&name, &pp, &Patch::Json::<()>(ops)).await {
        Ok(_) => Ok(Ok(())),
        Err(kube::Error::Api(s)) if s.code == 422 => Ok(Err(format!(
            "a Secret {name:?} exists and does not belong to this VMI; its cloud-init data needs that name"
        ))),
        Err(e) => Err(e),
    }
}

/// Finalizer on every VMI: the launcher pod is stopped before the VMI goes away.
pub const FINALIZER: &str = microvirt_crds::vmi::FINALIZER_LAUNCHER_POD;

/// Reconcile one VMI.
pub async fn reconcile(
    vmi: Arc<VirtualMachineInstance>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    reconcile_with_finalizer(vmi, &ctx, FINALIZER, apply, cleanup).await
}

async fn apply(
    vmi: Arc<VirtualMachineInstance>,
    ctx: &Context,
    api: &Api<VirtualMachineInstance>,
) -> Result<Action, Error> {
    let (name, ns) = name_ns(&*vmi)?;
    // Presets must not be missed just because the operator has only started.
    let _ = ctx.filled.presets.wait().await;

    // 1. Presets, once, before the first status write (afterwards the spec is immutable).
    if vmi.status.is_none() && !vmi.annotations().contains_key(ANNOTATION_PRESETS_APPLIED) {
        let candidates: Vec<_> = ctx
            .presets
            .state()
            .into_iter()
            .filter(|p| p.namespace().as_deref() == Some(ns.as_str()))
            .collect();
        let matched = preset::matching(candidates.iter().map(|p| p.as_ref()), vmi.labels());
        if !matched.is_empty() {
            let outcome = preset::apply(&vmi.spec.domain, &matched)?;
            for (p, field) in &outcome.conflicts {
                ctx.event(
                    &*vmi,
                    EventType::Warning,
                    "PresetConflict",
                    "ApplyPreset",
                    format!(
                        "preset {p}: {field} not applied, the VMI already sets a different value"
                    ),
                );
            }
            let applied = outcome.applied.join(",");
            // A merge patch guarded by resourceVersion: the spec seen is the spec merged into.
            let patch = json!({
                "metadata": {
                    "resourceVersion": vmi.resource_version(),
                    "annotations": { ANNOTATION_PRESETS_APPLIED: applied },
                },
                "spec": { "domain": outcome.domain },
            });
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            ctx.event(
                &*vmi,
                EventType::Normal,
                "PresetsApplied",
                "ApplyPreset",
                format!("applied presets: {applied}"),
            );
            return Ok(Action::await_change());
        }
    }

    // 2. The launcher pod.
    let pod_key = ObjectRef::<Pod>::new(&pod_name(&name)).within(&ns);
    let cached = ctx.pods.get(&pod_key);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let mut pod: Option<Pod> = None;
    if let Some(p) = cached {
        if pod_belongs_to(&p, &vmi) {
            pod = Some((*p).clone());
        } else if crate::pool::members::awaiting_claim(&p, &vmi) {
            // A pool's warm member this VMI was made from: the pool controller hands the pod
            // over (labels, owner, uid) right after creating the VMI; the pod watch brings the
            // change (this requeue only covers a lost event).
            return Ok(Action::requeue(Duration::from_millis(500)));
        } else {
            // A pod of an earlier VMI with the same name: remove it, then try again.
            if p.metadata.deletion_timestamp.is_none() {
                let dp = DeleteParams {
                    preconditions: p.uid().map(|uid| Preconditions {
                        uid: Some(uid),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                match pods.delete(&p.name_any(), &dp).await {
                    Ok(_) => {}
                    Err(e) if is_not_found(&e) => {}
                    Err(e) if crate::controller::is_conflict(&e) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            if vmi.status.is_none() {
                write_status(api, &vmi, ctx, None).await?;
            }
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
    }
    let phase = vmi.phase();
    let claimed = vmi
        .annotations()
        .contains_key(microvirt_crds::pool::ANNOTATION_CLAIMED_FROM);
    if pod.is_none() && claimed && phase.is_none() {
        // Made from a warm member: its pod must not be mistaken for absent because of a cache
        // that has not caught up (applying a new pod over it would be refused).
        if let Some(p) = pods.get_opt(&pod_name(&name)).await? {
            if pod_belongs_to(&p, &vmi) {
                pod = Some(p);
            } else if crate::pool::members::awaiting_claim(&p, &vmi) {
                return Ok(Action::requeue(Duration::from_millis(500)));
            } else {
                return Ok(Action::requeue(Duration::from_secs(1)));
            }
        } else {
            ctx.event(
                &*vmi,
                EventType::Warning,
                "WarmMemberGone",
                "CreatePod",
                "the warm member this VMI was claimed from is gone; booting it cold".into(),
            );
        }
    }
    if pod.is_none() && phase.is_some_and(|p| p != microvirt_crds::VmiPhase::Pending) {
        // The cache may lag behind our own create: only the API server can say the pod is gone.
        pod = pods
            .get_opt(&pod_name(&name))
            .await?
            .filter(|p| pod_belongs_to(p, &vmi));
    }
    if pod.is_none() && phase.is_none_or(|p| p == microvirt_crds::VmiPhase::Pending) {
        let block = match block_volumes(&vmi, ctx, &ns).await? {
            Ok(b) => b,
            Err(missing) => {
                ctx.event(
                    &*vmi,
                    EventType::Warning,
                    "PVCNotFound",
                    "CreatePod",
                    format!(
                        "persistentVolumeClaim {missing:?} does not exist (yet); waiting for it"
                    ),
                );
                if vmi.status.is_none() {
                    write_status(api, &vmi, ctx, None).await?;
                }
                return Ok(Action::requeue(Duration::from_secs(5)));
            }
        };
        let desired = match desired_pod(&vmi, &ctx.config, &block) {
            Ok(p) => p,
            Err(e) => {
                return fail(api, &vmi, ctx, "InvalidSpec", &e.to_string()).await;
            }
        };
        // Inline cloud-init data goes into a Secret the pod mounts, never into the pod.
        let secret = match cloud_init_secret(&vmi) {
            Ok(s) => s,
            Err(e) => {
                return fail(api, &vmi, ctx, "InvalidSpec", &e.to_string()).await;
            }
        };
        if let Some(secret) = secret {
            let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
            let uid = vmi.uid().unwrap_or_default();
            if let Err(msg) = put_cloud_init_secret(&secrets, &secret, &uid).await? {
                return fail(api, &vmi, ctx, "LauncherPodRefused", &msg).await;
            }
        }
        let created = match pods
            .patch(
                &pod_name(&name),
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&desired),
            )
            .await
        {
            Ok(p) => p,
            // A namespace created a moment ago has no `default` ServiceAccount yet (the
            // controller-manager makes it): the ServiceAccount admission plugin refuses the
            // pod with 403 until then. Transient: retry.
            Err(kube::Error::Api(s))
                if s.code == 403 && s.message.contains("error looking up service account") =>
            {
                return Ok(Action::requeue(Duration::from_millis(500)));
            }
            // The API server refuses the pod (e.g. image volumes disabled, quota, policy):
            // that will not fix itself, so the VMI fails with the server's message.
            Err(kube::Error::Api(s)) if s.code == 422 || s.code == 403 => {
                let msg = format!("launcher pod refused: {}", s.message);
                return fail(api, &vmi, ctx, "LauncherPodRefused", &msg).await;
            }
            Err(e) => return Err(e.into()),
        };
        if pod_belongs_to(&created, &vmi) {
            let missing = crate::pod::missing_volumes(&desired, &created);
            if !missing.is_empty() {
                // The API server silently drops fields of disabled features (image volumes
                // without the ImageVolume gate): such a pod would start without its disks.
                let dp = DeleteParams {
                    grace_period_seconds: Some(0),
                    ..Default::default()
                };
                match pods.delete(&created.name_any(), &dp).await {
                    Ok(_) => {}
                    Err(e) if is_not_found(&e) => {}
                    Err(e) => return Err(e.into()),
                }
                let msg = format!(
                    "the API server dropped pod volumes {missing:?}; containerDisk and kernelBoot.container need image volumes (enable the ImageVolume feature gate)"
                );
                return fail(api, &vmi, ctx, "LauncherPodVolumesDropped", &msg).await;
            }
            ctx.event(
                &*vmi,
                EventType::Normal,
                "SuccessfulCreate",
                "CreatePod",
                format!("created launcher pod {}", created.name_any()),
            );
            pod = Some(created);
        } else {
            // The name is held by an older VMI's pod that the cache did not show yet.
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
    }

    // 3. Status from the pod.
    write_status(api, &vmi, ctx, pod.as_ref()).await?;
    Ok(Action::requeue(Duration::from_secs(300)))
}

/// The VMI's persistentVolumeClaim volumes whose claims have `volumeMode: Block` (KubeVirt's
/// behaviour: such a claim reaches the launcher as a device). `Ok(Err(claim))` when a claim
/// does not exist: the pod waits for it (its mode decides how it is attached).
async fn block_volumes(
    vmi: &VirtualMachineInstance,
    ctx: &Context,
    ns: &str,
) -> Result<Result<BlockVolumes, String>, Error> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
    let mut block = BlockVolumes::new();
    for v in &vmi.spec.volumes {
        let Some(pvc) = &v.persistent_volume_claim else {
            continue;
        };
        match claims.get_opt(&pvc.claim_name).await? {
            None => return Ok(Err(pvc.claim_name.clone())),
            Some(c) => {
                let mode = c.spec.as_ref().and_then(|s| s.volume_mode.as_deref());
                if mode == Some("Block") {
                    block.insert(v.name.clone());
                }
            }
        }
    }
    Ok(Ok(block))
}

/// Write the status derived from `pod` when it differs from the current one (SSA on the status
/// subresource), with a metric and an Event on phase changes.
async fn write_status(
    api: &Api<VirtualMachineInstance>,
    vmi: &VirtualMachineInstance,
    ctx: &Context,
    pod: Option<&Pod>,
) -> Result<(), Error> {
    let (name, _) = name_ns(vmi)?;
    let now = Time(Timestamp::now());
    let desired = plan::desired_status(vmi, pod, &now);
    if vmi.status.as_ref() != Some(&desired) {
        let old_phase = vmi.phase();
        // The read resourceVersion is a precondition: a reconcile that runs on a VMI from a
        // stale cache gets 409 instead of writing (and counting a phase transition, and
        // emitting its Event) a second time; the newer object's watch event reconciles again.
        let patch = json!({
            "apiVersion": "microvirt.io/v1alpha1",
            "kind": "VirtualMachineInstance",
            "metadata": {"resourceVersion": vmi.metadata.resource_version},
            "status": plan::operator_owned(&desired),
        });
        match api
            .patch_status(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
        {
            Ok(_) => {}
            Err(e) if is_conflict(&e) => {
                tracing::debug!(vmi = %name, "status not written: the VMI changed since it was read");
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        }
        if desired.is_ready() && !vmi.is_ready() {
            // A claim of the pool controller is complete: record its latency.
            if let Some(ns) = vmi.namespace() {
                if let Some(d) = ctx
                    .pool
                    .latency
                    .ready(&ns, &name, std::time::Instant::now())
                {
                    ctx.metrics.claimed(d);
                    tracing::debug!("VMI {ns}/{name}: claimed warm member Ready in {d:?}");
                }
            }
        }
        if let Some(new_phase) = desired.phase.filter(|p| Some(*p) != old_phase) {
            if let Some(created) = vmi.metadata.creation_timestamp.as_ref() {
                let since = now.0.duration_since(created.0);
                let since = Duration::try_from(since).unwrap_or_default();
                ctx.metrics.phase_entered(new_phase.as_str(), since);
            }
            let (type_, note) = match (&desired.reason, &desired.message) {
                (Some(r), Some(m)) => (EventType::Warning, format!("{new_phase}: {r}: {m}")),
                (Some(r), None) => (EventType::Warning, format!("{new_phase}: {r}")),
                _ => (EventType::Normal, format!("VMI is {new_phase}")),
            };
            let type_ = if new_phase == microvirt_crds::VmiPhase::Failed {
                type_
            } else {
                EventType::Normal
            };
            ctx.event(vmi, type_, new_phase.as_str(), "UpdateStatus", note);
        }
    }
    Ok(())
}

/// Mark the VMI Failed (before any pod exists) with a Warning event.
async fn fail(
    api: &Api<VirtualMachineInstance>,
    vmi: &VirtualMachineInstance,
    ctx: &Context,
    reason: &str,
    message: &str,
) -> Result<Action, Error> {
    let (name, _) = name_ns(vmi)?;
    let now = Time(Timestamp::now());
    let st = plan::failed_status(vmi, reason, message, &now);
    apply_status(api, &name, &st).await?;
    ctx.event(
        vmi,
        EventType::Warning,
        reason,
        "CreatePod",
        message.to_string(),
    );
    Ok(Action::await_change())
}

/// Deletion: stop the launcher pod gracefully; the finalizer goes once the pod is gone.
async fn cleanup(vmi: Arc<VirtualMachineInstance>, ctx: &Context) -> Result<Action, Error> {
    let (name, ns) = name_ns(&*vmi)?;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let pname = pod_name(&name);
    let Some(pod) = pods.get_opt(&pname).await? else {
        return Ok(Action::await_change());
    };
    if !pod_belongs_to(&pod, &vmi) {
        return Ok(Action::await_change());
    }
    if pod.metadata.deletion_timestamp.is_none() {
        let dp = DeleteParams {
            grace_period_seconds: vmi
                .spec
                .termination_grace_period_seconds
                .and_then(|s| u32::try_from(s).ok()),
            preconditions: pod.uid().map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..Default::default()
        };
        match pods.delete(&pname, &dp).await {
            Ok(_) => ctx.event(
                &*vmi,
                EventType::Normal,
                "Stopping",
                "DeletePod",
                format!("deleting launcher pod {pname}"),
            ),
            Err(e) if is_not_found(&e) => return Ok(Action::await_change()),
            Err(e) => return Err(e.into()),
        }
        // Unscheduled and finished pods are removed at once.
        if pods.get_opt(&pname).await?.is_none() {
            return Ok(Action::await_change());
        }
    }
    Err(Error::PodTerminating(pname))
}
