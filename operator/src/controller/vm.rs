//! VM reconciler: run-strategy semantics and start/stop requests (create/delete the VMI), the
//! start back-off after VMIs that failed before they ran (a requeue at its end), and printable
//! status.
//!
//! As in the VMIRS reconciler, creates and deletes wait for the VMI cache to show the previous
//! ones ([`crate::expectations`]) and deletes are conditioned on the uid the decision saw.

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::Api;
use microvirt_crds::{VirtualMachine, VirtualMachineInstance, VirtualMachineStatus};
use serde_json::json;

use super::{
    apply_status, delete_vmi, is_conflict, name_ns, reconcile_with_finalizer, Context, Error,
};
use crate::config::FIELD_MANAGER;
use crate::replicaset::VmiRef;
use crate::virtualmachine::{new_vmi, owned_by, plan, VmAction, VmPlan};

/// Finalizer on every VM: its VMI is deleted with it (also without a garbage collector).
pub const FINALIZER: &str = "microvirt.io/vmi";

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
    match action {
        VmAction::None => {}
        _ if !synced => {}
        VmAction::Create => {
            let pp = PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            };
            match vmi_api.create(&pp, &new_vmi(&vm)).await {
                Ok(created) => {
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
                Err(e) if is_conflict(&e) => return Ok(Action::requeue(Duration::from_secs(1))),
                Err(e) => return Err(e.into()),
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
    let status = without_requests(&status);
    if vm.status.as_ref().map(without_requests).as_ref() != Some(&status) {
        apply_status(api, &name, &status).await?;
    }
    if let Some(wait) = backoff_left {
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
