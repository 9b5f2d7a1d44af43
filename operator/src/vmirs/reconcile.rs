//! VMIRS reconciler: converge the number of VMIs to `replicas`, report status.
//!
//! Creates and deletes wait for the VMI cache to show the previous ones
//! ([`crate::controller::expectations`]), and deletes are conditioned on the uid the decision saw, so a
//! reconcile on a cache that lags behind cannot delete more VMIs than asked, nor a newer VMI
//! that reuses a name.

use std::sync::Arc;
use std::time::Duration;

use kube::api::PostParams;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use microvirt_crds::{VirtualMachineInstance, VirtualMachineInstanceReplicaSet};

use crate::config::FIELD_MANAGER;
use crate::controller::{
    apply_status, delete_vmi, is_conflict, name_ns, reconcile_with_finalizer, Context, Error,
};
use crate::vmi::VmiRef;
use crate::vmirs::plan::{new_replica, owned_by, plan};

/// Finalizer on every VMIRS: its VMIs are deleted with it (also without a garbage collector).
pub const FINALIZER: &str = "microvirt.io/replicas";

/// Reconcile one VMIRS.
pub async fn reconcile(
    rs: Arc<VirtualMachineInstanceReplicaSet>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    reconcile_with_finalizer(rs, &ctx, FINALIZER, apply, cleanup).await
}

/// Expectations key of a VMIRS.
fn key(ns: &str, name: &str) -> String {
    format!("vmirs/{ns}/{name}")
}

fn vmis_in(ctx: &Context, ns: &str) -> Vec<Arc<VirtualMachineInstance>> {
    ctx.vmis
        .state()
        .into_iter()
        .filter(|v| v.namespace().as_deref() == Some(ns))
        .collect()
}

async fn apply(
    rs: Arc<VirtualMachineInstanceReplicaSet>,
    ctx: &Context,
    api: &Api<VirtualMachineInstanceReplicaSet>,
) -> Result<Action, Error> {
    let (name, ns) = name_ns(&*rs)?;
    // Decisions need the full VMI cache (creates use fixed names, so a stale cache could only
    // cause refused duplicates, but deletions must see every VMI).
    let _ = ctx.filled.vmis.wait().await;
    let vmis = vmis_in(ctx, &ns);
    let key = key(&ns, &name);
    // Until the cache shows our earlier creates and deletes, it would make us act twice.
    let synced = ctx
        .expectations
        .satisfied(&key, vmis.iter().map(|v| v.as_ref()));
    let p = plan(&rs, vmis.iter().map(|v| v.as_ref()));
    let vmi_api: Api<VirtualMachineInstance> = Api::namespaced(ctx.client.clone(), &ns);
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    for vname in p.create.iter().filter(|_| synced) {
        match vmi_api.create(&pp, &new_replica(&rs, vname)).await {
            Ok(created) => {
                if let Some(uid) = created.metadata.uid.as_deref() {
                    ctx.expectations.expect_creation(&key, uid);
                }
                ctx.event(
                    &*rs,
                    EventType::Normal,
                    "SuccessfulCreate",
                    "CreateVMI",
                    format!("created VMI {vname}"),
                )
            }
            // Created by an earlier attempt whose answer was lost, or a foreign VMI: the cache
            // will show it and the next reconcile counts it.
            Err(e) if is_conflict(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
    for r in p.delete.iter().filter(|_| synced) {
        if delete_vmi(&vmi_api, r).await? {
            if let Some(uid) = r.uid.as_deref() {
                ctx.expectations.expect_deletion(&key, uid);
            }
            ctx.event(
                &*rs,
                EventType::Normal,
                "SuccessfulDelete",
                "DeleteVMI",
                format!("deleted VMI {}", r.name),
            );
        }
    }
    if rs.status.as_ref() != Some(&p.status) {
        apply_status(api, &name, &p.status).await?;
    }
    if synced {
        Ok(Action::requeue(Duration::from_secs(300)))
    } else {
        // The VMI events that satisfy the expectations trigger a reconcile; this is a fallback.
        Ok(Action::requeue(Duration::from_secs(2)))
    }
}

async fn cleanup(
    rs: Arc<VirtualMachineInstanceReplicaSet>,
    ctx: &Context,
) -> Result<Action, Error> {
    let (name, ns) = name_ns(&*rs)?;
    let vmi_api: Api<VirtualMachineInstance> = Api::namespaced(ctx.client.clone(), &ns);
    for v in vmis_in(ctx, &ns) {
        if owned_by(&v, &rs) && v.metadata.deletion_timestamp.is_none() {
            delete_vmi(&vmi_api, &VmiRef::of(&v)).await?;
        }
    }
    ctx.expectations.forget(&key(&ns, &name));
    Ok(Action::await_change())
}
