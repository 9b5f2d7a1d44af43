//! VM reconciler: run-strategy semantics and start/stop requests (create/delete the VMI), the
//! start back-off after VMIs that failed before they ran (a requeue at its end), and printable
//! status.
//!
//! A VM that names an instancetype or preference gets them expanded into the VMI it creates
//! ([`crate::vm::instancetype`]), from ControllerRevisions captured at its first start; when that
//! cannot be done (a missing object, a template that conflicts, a VMI the API server refuses)
//! the VM gets the `Failure` condition and a Warning event, and is reconciled again shortly.
//!
//! As in the VMIRS reconciler, creates and deletes wait for the VMI cache to show the previous
//! ones ([`crate::controller::expectations`]) and deletes are conditioned on the uid the decision saw.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::ControllerRevision;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::Api;
use kube::{Resource, ResourceExt};
use microvirt_crds::instancetype::is_cluster_kind;
use microvirt_crds::{
    VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceSpec, VirtualMachineStatus,
};
use serde_json::json;

use crate::config::FIELD_MANAGER;
use crate::controller::{
    apply_status, delete_vmi, is_conflict, name_ns, reconcile_with_finalizer, Context, Error,
};
use crate::vm::instancetype::{captures, expand, revision, spec_of, Which};
use crate::vm::plan::{
    new_vmi_with, owned_by, plan, with_failure, without_condition, VmAction, VmPlan,
    CONDITION_FAILURE,
};
use crate::vmi::VmiRef;

/// Finalizer on every VM: its VMI is deleted with it (also without a garbage collector).
pub const FINALIZER: &str = "microvirt.io/vmi";

/// How soon a VM whose VMI could not be created (its `Failure` condition) is reconciled again.
const FAILURE_RETRY: Duration = Duration::from_secs(5);

/// The VMI spec of a VM to create, or why there is none yet.
enum Expanded {
    /// The template with the instancetype and preference expanded.
    Spec(Box<VirtualMachineInstanceSpec>),
    /// Not now, with the VM's `Failure` reason and message.
    Failed {
        reason: &'static str,
        message: String,
    },
    /// The VM changed meanwhile (its revision names could not be recorded): try again.
    Retry,
}

/// A reference's spec as captured, and the name of a revision that was just captured.
type Captured = Result<(serde_json::Value, Option<String>), (&'static str, String)>;

/// The spec that `vm`'s reference (`which`: kind, name, revisionName) stands for: from the
/// revision it names (when that holds the object the reference names), else from the object
/// itself, captured in a new ControllerRevision.
async fn capture(
    vm: &VirtualMachine,
    ctx: &Context,
    which: Which,
    kind: Option<&str>,
    name: &str,
    revision_name: Option<&str>,
) -> Result<Captured, Error> {
    let ns = vm.namespace().unwrap_or_default();
    let revisions: Api<ControllerRevision> = Api::namespaced(ctx.client.clone(), &ns);
    let field = which.field();
    let namespaced_kind = match which {
        Which::Instancetype => "VirtualMachineInstancetype",
        Which::Preference => "VirtualMachinePreference",
    };
    let Some(cluster) = is_cluster_kind(kind, namespaced_kind) else {
        return Ok(Err((
            "InvalidKind",
            format!("spec.{field}.kind {kind:?} names no {field} kind"),
        )));
    };
    let kind = if cluster {
        namespaced_kind.replacen("VirtualMachine", "VirtualMachineCluster", 1)
    } else {
        namespaced_kind.to_string()
    };
    if let Some(rev) = revision_name {
        match revisions.get_opt(rev).await? {
            // A revision of another object (the reference was changed to another kind or
            // name, the old revisionName left): captured anew below, as at a first start.
            Some(r) if !captures(&r, &kind, name) => {}
            Some(r) => {
                return Ok(spec_of::<serde_json::Value>(&r)
                    .map(|s| (s, None))
                    .map_err(|m| ("RevisionInvalid", m)))
            }
            None => {
                return Ok(Err((
                    "RevisionNotFound",
                    format!(
                        "ControllerRevision {rev} named by spec.{field}.revisionName not found"
                    ),
                )))
            }
        }
    }
    let gvk = GroupVersionKind::gvk(microvirt_crds::GROUP, microvirt_crds::VERSION, &kind);
    let ar = ApiResource::from_gvk_with_plural(&gvk, &format!("{}s", kind.to_ascii_lowercase()));
    let objects: Api<DynamicObject> = if cluster {
        Api::all_with(ctx.client.clone(), &ar)
    } else {
        Api::namespaced_with(ctx.client.clone(), &ns, &ar)
    };
    let Some(obj) = objects.get_opt(name).await? else {
        let reason = match which {
            Which::Instancetype => "InstancetypeNotFound",
            Which::Preference => "PreferenceNotFound",
        };
        let scope = if cluster {
            String::new()
        } else {
            format!(" in namespace {ns}")
        };
        return Ok(Err((
            reason,
            format!(
                "{kind} {name}{scope} not found (spec.{field}): the VMI is created once it exists"
            ),
        )));
    };
    let spec = obj.data.get("spec").cloned().unwrap_or_default();
    let want = revision(vm, which, &kind, name, &spec);
    let rev_name = want.name_any();
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let rev = match revisions.create(&pp, &want).await {
        Ok(r) => r,
        // Made by an earlier capture that could not record its name: the same content.
        Err(e) if is_conflict(&e) => revisions.get(&rev_name).await?,
        Err(e) => return Err(e.into()),
    };
    let vm_uid = vm.meta().uid.as_deref();
    if !rev
        .owner_references()
        .iter()
        .any(|o| Some(o.uid.as_str()) == vm_uid)
    {
        return Ok(Err((
            "RevisionConflict",
            format!("ControllerRevision {rev_name} exists and does not belong to this VM"),
        )));
    }
    Ok(spec_of::<serde_json::Value>(&rev)
        .map(|s| (s, Some(rev_name)))
        .map_err(|m| ("RevisionInvalid", m)))
}

/// One reference of `vm` (`which`; its kind, name and revisionName) as its typed spec, captured
/// at the first start: the name of a revision just captured goes into `record` (the VM's spec
/// patch); `Ok(Err(reason, message))` when the VM cannot start with it.
async fn resolve<T: serde::de::DeserializeOwned>(
    vm: &VirtualMachine,
    ctx: &Context,
    which: Which,
    (kind, name, revision_name): (Option<&str>, &str, Option<&str>),
    record: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<Result<T, (&'static str, String)>, Error> {
    let (spec, new) = match capture(vm, ctx, which, kind, name, revision_name).await? {
        Ok(c) => c,
        Err(failed) => return Ok(Err(failed)),
    };
    let invalid = match which {
        Which::Instancetype => "InstancetypeInvalid",
        Which::Preference => "PreferenceInvalid",
    };
    let typed = match serde_json::from_value::<T>(spec) {
        Ok(s) => s,
        Err(e) => return Ok(Err((invalid, format!("{} {name}: {e}", which.field())))),
    };
    if let Some(n) = new {
        record.insert(which.field().into(), json!({"revisionName": n}));
    }
    Ok(Ok(typed))
}

/// The VMI spec `vm` creates now: its instancetype and preference resolved (captured in
/// ControllerRevisions at the first start, whose names are recorded in the VM's spec, guarded
/// by its resourceVersion) and expanded into the template.
async fn expanded_spec(
    vm: &VirtualMachine,
    ctx: &Context,
    api: &Api<VirtualMachine>,
) -> Result<Expanded, Error> {
    let mut record = serde_json::Map::new();
    let mut instancetype = None;
    if let Some(m) = &vm.spec.instancetype {
        let r = (
            m.kind.as_deref(),
            m.name.as_str(),
            m.revision_name.as_deref(),
        );
        match resolve(vm, ctx, Which::Instancetype, r, &mut record).await? {
            Ok(s) => instancetype = Some(s),
            Err((reason, message)) => return Ok(Expanded::Failed { reason, message }),
        }
    }
    let mut preference = None;
    if let Some(m) = &vm.spec.preference {
        let r = (
            m.kind.as_deref(),
            m.name.as_str(),
            m.revision_name.as_deref(),
        );
        match resolve(vm, ctx, Which::Preference, r, &mut record).await? {
            Ok(s) => preference = Some(s),
            Err((reason, message)) => return Ok(Expanded::Failed { reason, message }),
        }
    }
    let spec = match expand(
        &vm.spec.template.spec,
        instancetype.as_ref(),
        preference.as_ref(),
    ) {
        Ok(s) => s,
        Err(message) => {
            return Ok(Expanded::Failed {
                reason: "InstancetypeConflict",
                message,
            })
        }
    };
    if !record.is_empty() {
        // KubeVirt records the revisions in the VM's spec; a JSON merge patch (not an apply)
        // so that the user's own field manager keeps the rest of the references.
        let patch = json!({
            "metadata": {"resourceVersion": vm.metadata.resource_version},
            "spec": record,
        });
        let pp = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        match api.patch(&vm.name_any(), &pp, &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(e) if is_conflict(&e) => return Ok(Expanded::Retry),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Expanded::Spec(Box::new(spec)))
}

/// Expectations key of a VM.
fn key(ns: &str, name: &str) -> String {
    format!("vm/{ns}/{name}")
}

/// Reconcile one VM.
pub async fn reconcile(vm: Arc<VirtualMachine>, ctx: Arc<Context>) -> Result<Action, Error> {
    reconcile_with_finalizer(vm, &ctx, FINALIZER, apply, cleanup).await
}

async fn apply(
    vm: Arc<VirtualMachine>,
    ctx: &Context,
    api: &Api<VirtualMachine>,
) -> Result<Action, Error> {
    let (name, ns) = name_ns(&*vm)?;
    // Decisions need the full VMI cache (creates use fixed names, so a stale cache could only
    // cause refused duplicates, but deletions must see every VMI).
    let _ = ctx.filled.vmis.wait().await;
    let vmi = ctx
        .vmis
        .get(&ObjectRef::<VirtualMachineInstance>::new(&name).within(&ns));
    let key = key(&ns, &name);
    let synced = ctx.expectations.satisfied(&key, vmi.as_deref());
    let VmPlan {
        action,
        status,
        requests,
        backoff_left,
    } = plan(
        &vm,
        vmi.as_deref(),
        k8s_openapi::jiff::Timestamp::now(),
        ctx.config.vm_start_backoff,
    );
    // Start/stop requests first, guarded by the resourceVersion the plan saw: a request added
    // meanwhile (kubectl microvirt) is never lost, and the action below is only taken on the
    // requests it was planned from. On a conflict the new version comes with the next event.
    if let Some(requests) = requests.filter(|_| synced) {
        let patch = json!({
            "metadata": {"resourceVersion": vm.metadata.resource_version},
            "status": {"stateChangeRequests": if requests.is_empty() {
                serde_json::Value::Null
            } else {
                serde_json::to_value(&requests)?
            }},
        });
        let pp = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        match api.patch_status(&name, &pp, &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(e) if is_conflict(&e) => return Ok(Action::requeue(Duration::from_secs(1))),
            Err(e) => return Err(e.into()),
        }
    }
    let vmi_api: Api<VirtualMachineInstance> = Api::namespaced(ctx.client.clone(), &ns);
    // Why the VMI could not be created (the VM's `Failure` condition), and whether it was.
    let mut failure: Option<(&'static str, String)> = None;
    let mut created_vmi = false;
    match action {
        VmAction::None => {}
        _ if !synced => {}
        VmAction::Create => {
            let spec = match expanded_spec(&vm, ctx, api).await? {
                Expanded::Spec(spec) => *spec,
                Expanded::Retry => return Ok(Action::requeue(Duration::from_secs(1))),
                Expanded::Failed { reason, message } => {
                    failure = Some((reason, message));
                    vm.spec.template.spec.clone()
                }
            };
            let pp = PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            };
            let uses_instancetype = vm.spec.instancetype.is_some() || vm.spec.preference.is_some();
            let result = match failure {
                Some(_) => None,
                None => Some(vmi_api.create(&pp, &new_vmi_with(&vm, spec)).await),
            };
            match result {
                None => {}
                Some(Ok(created)) => {
                    created_vmi = true;
                    if let Some(uid) = created.metadata.uid.as_deref() {
                        ctx.expectations.expect_creation(&key, uid);
                    }
                    ctx.event(
                        &*vm,
                        EventType::Normal,
                        "SuccessfulCreate",
                        "CreateVMI",
                        format!("started VMI {name}"),
                    )
                }
                // The previous VMI is still being deleted, or the cache lags: retry.
                Some(Err(e)) if is_conflict(&e) => {
                    return Ok(Action::requeue(Duration::from_secs(1)))
                }
                // The expanded VMI is refused (e.g. an instancetype's vCPUs in a layout the
                // VMI's rules do not admit): the VM says why.
                Some(Err(kube::Error::Api(s))) if s.code == 422 && uses_instancetype => {
                    failure = Some(("FailedCreate", s.message));
                }
                Some(Err(e)) => return Err(e.into()),
            }
        }
        VmAction::Delete => {
            // `plan` only deletes a VMI it was given.
            let r = vmi.as_deref().map(VmiRef::of).unwrap_or(VmiRef {
                name: name.clone(),
                uid: None,
            });
            if delete_vmi(&vmi_api, &r).await? {
                if let Some(uid) = r.uid.as_deref() {
                    ctx.expectations.expect_deletion(&key, uid);
                }
                ctx.event(
                    &*vm,
                    EventType::Normal,
                    "SuccessfulDelete",
                    "DeleteVMI",
                    format!("stopped VMI {name}"),
                );
            }
        }
    }
    // The requests are left out of the comparison and the apply: they are written above (with
    // a precondition), and this field manager must never own them.
    let without_requests = |s: &VirtualMachineStatus| VirtualMachineStatus {
        state_change_requests: Vec::new(),
        ..s.clone()
    };
    let mut status = without_requests(&status);
    let now = k8s_openapi::jiff::Timestamp::now();
    if let Some((reason, message)) = &failure {
        let old = vm
            .status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or(&[]);
        let before = old
            .iter()
            .find(|c| c.type_ == CONDITION_FAILURE)
            .and_then(|c| c.message.as_deref());
        if before != Some(message.as_str()) {
            ctx.event(
                &*vm,
                EventType::Warning,
                reason,
                "CreateVMI",
                message.clone(),
            );
        }
        status.conditions = with_failure(&status.conditions, reason, message, now);
    } else if created_vmi {
        status.conditions = without_condition(&status.conditions, CONDITION_FAILURE);
    }
    if vm.status.as_ref().map(without_requests).as_ref() != Some(&status) {
        apply_status(api, &name, &status).await?;
    }
    if failure.is_some() {
        // Retried: a missing instancetype or preference may be created, the VM edited.
        Ok(Action::requeue(FAILURE_RETRY))
    } else if let Some(wait) = backoff_left {
        // The start back-off: the next VMI once it is over (a little after, so that the
        // retry time, in whole seconds, has passed).
        Ok(Action::requeue(
            wait.saturating_add(Duration::from_millis(100))
                .min(Duration::from_secs(300)),
        ))
    } else if synced {
        Ok(Action::requeue(Duration::from_secs(300)))
    } else {
        Ok(Action::requeue(Duration::from_secs(2)))
    }
}

async fn cleanup(vm: Arc<VirtualMachine>, ctx: &Context) -> Result<Action, Error> {
    let (name, ns) = name_ns(&*vm)?;
    let vmi_api: Api<VirtualMachineInstance> = Api::namespaced(ctx.client.clone(), &ns);
    if let Some(vmi) = vmi_api.get_opt(&name).await? {
        if owned_by(&vmi, &vm) && vmi.metadata.deletion_timestamp.is_none() {
            delete_vmi(&vmi_api, &VmiRef::of(&vmi)).await?;
        }
    }
    ctx.expectations.forget(&key(&ns, &name));
    Ok(Action::await_change())
}
