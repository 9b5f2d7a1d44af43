//! VM reconciler: run-strategy semantics (create/delete the VMI) and printable status.

use std::sync::Arc;
use std::time::Duration;

use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{finalizer, Event as FinalizerEvent};
use kube::runtime::reflector::ObjectRef;
use kube::Api;
use microvirt_crds::{VirtualMachine, VirtualMachineInstance};
use serde_json::json;

use super::{finalizer_result, is_conflict, is_not_found, name_ns, Context, Error};
use crate::config::FIELD_MANAGER;
use crate::virtualmachine::{new_vmi, owned_by, plan, VmAction};

/// Finalizer on every VM: its VMI is deleted with it (also without a garbage collector).
pub const FINALIZER: &str = "microvirt.io/vmi";

/// Reconcile one VM.
pub async fn reconcile(vm: Arc<VirtualMachine>, ctx: Arc<Context>) -> Result<Action, Error> {
    let (_, ns) = name_ns(&*vm)?;
    let api: Api<VirtualMachine> = Api::namespaced(ctx.client.clone(), &ns);
    finalizer_result(
        finalizer(&api, FINALIZER, vm, |event| async {
            match event {
                FinalizerEvent::Apply(vm) => apply(vm, &ctx, &api).await,
                FinalizerEvent::Cleanup(vm) => cleanup(vm, &ctx).await,
            }
        })
        .await,
    )
}

async fn apply(
    vm: Arc<VirtualMachine>,
    ctx: &Context,
    api: &Api<VirtualMachine>,
) -> Result<Action, Error> {
    let (name, ns) = name_ns(&*vm)?;
    // Decisions need the full VMI cache (creates use fixed names, so a stale cache could only
    // cause refused duplicates, but deletions must see every VMI).
    let _ = ctx.vmis.wait_until_ready().await;
    let vmi = ctx
        .vmis
        .get(&ObjectRef::<VirtualMachineInstance>::new(&name).within(&ns));
    let (action, status) = plan(&vm, vmi.as_deref());
    let vmi_api: Api<VirtualMachineInstance> = Api::namespaced(ctx.client.clone(), &ns);
    match action {
        VmAction::None => {}
        VmAction::Create => {
            let pp = PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            };
            match vmi_api.create(&pp, &new_vmi(&vm)).await {
                Ok(_) => ctx.event(
                    &*vm,
                    EventType::Normal,
                    "SuccessfulCreate",
                    "CreateVMI",
                    format!("started VMI {name}"),
                ),
                // The previous VMI is still being deleted, or the cache lags: retry.
                Err(e) if is_conflict(&e) => return Ok(Action::requeue(Duration::from_secs(1))),
                Err(e) => return Err(e.into()),
            }
        }
        VmAction::Delete => match vmi_api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => ctx.event(
                &*vm,
                EventType::Normal,
                "SuccessfulDelete",
                "DeleteVMI",
                format!("stopped VMI {name}"),
            ),
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(e.into()),
        },
    }
    if vm.status.as_ref() != Some(&status) {
        let patch = json!({
            "apiVersion": "microvirt.io/v1alpha1",
            "kind": "VirtualMachine",
            "status": status,
        });
        api.patch_status(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    }
    Ok(Action::requeue(Duration::from_secs(300)))
}

async fn cleanup(vm: Arc<VirtualMachine>, ctx: &Context) -> Result<Action, Error> {
    let (name, ns) = name_ns(&*vm)?;
    let vmi_api: Api<VirtualMachineInstance> = Api::namespaced(ctx.client.clone(), &ns);
    if let Some(vmi) = vmi_api.get_opt(&name).await? {
        if owned_by(&vmi, &vm) && vmi.metadata.deletion_timestamp.is_none() {
            match vmi_api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(Action::await_change())
}
