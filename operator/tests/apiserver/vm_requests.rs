//! VirtualMachine state-change requests: start, stop and restart (what `kubectl microvirt`
//! sends).

use anyhow::Result;
use kube::api::{Patch, PatchParams};
use microvirt_crds::{PrintableStatus, VirtualMachine, VirtualMachineInstance};
use serde_json::json;

use crate::common::*;
use crate::harness::{vm_status, wait_vmi_uid};

/// Writes `requests` into the VM's `status.stateChangeRequests`, as `kubectl microvirt
/// start/stop/restart` do (merge patch of the status subresource).
pub(crate) async fn request(env: &Env, vm: &str, requests: serde_json::Value) -> Result<()> {
    env.api::<VirtualMachine>()
        .patch_status(
            vm,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"stateChangeRequests": requests}})),
        )
        .await?;
    Ok(())
}

/// Waits until the operator has worked through the VM's start/stop requests.
async fn wait_requests_done(env: &Env, vm: &str) -> Result<VirtualMachine> {
    let vms = env.api::<VirtualMachine>();
    wait_for(&format!("VM {vm}'s requests done"), WAIT, || async {
        let v = vms.get(vm).await?;
        let done = v
            .status
            .as_ref()
            .is_some_and(|s| s.state_change_requests.is_empty());
        Ok(done.then_some(v))
    })
    .await
}

async fn wait_vmi_gone(env: &Env, name: &str) -> Result<()> {
    let vmis = env.api::<VirtualMachineInstance>();
    wait_for(&format!("VMI {name} gone"), WAIT, || async {
        Ok(vmis.get_opt(name).await?.is_none().then_some(()))
    })
    .await
}

/// Start/stop requests with virtctl's semantics: Manual starts and stops only on requests,
/// Always restarts on a stop + start request, RerunOnFailure stays stopped after a stop request
/// and starts again on a start request; the run strategies stay as they were.
#[tokio::test]
async fn vm_start_stop_restart_requests() -> Result<()> {
    let env = Env::start_shared("t-vm-requests").await?;
    let vms = env.api::<VirtualMachine>();
    let vmis = env.api::<VirtualMachineInstance>();
    for (name, strategy) in [
        ("man", "Manual"),
        ("always", "Always"),
        ("rerun", "RerunOnFailure"),
    ] {
        env.apply(&vm_yaml(name, strategy, "64Mi"))?;
    }

    // Manual: nothing until a start request; the request is removed once the VMI exists.
    wait_for("manual VM status", WAIT, || async {
        vm_status(&env, "man").await
    })
    .await?;
    assert!(vmis.get_opt("man").await?.is_none());
    request(&env, "man", json!([{"action": "Start"}])).await?;
    let uid = wait_vmi_uid(&env, "man", None).await?;
    wait_requests_done(&env, "man").await?;
    // A stop request deletes that VMI, and nothing starts a new one.
    request(&env, "man", json!([{"action": "Stop", "uid": uid}])).await?;
    wait_vmi_gone(&env, "man").await?;
    let vm = wait_requests_done(&env, "man").await?;
    assert_eq!(
        vm.spec.run_strategy,
        Some(microvirt_crds::RunStrategy::Manual)
    );
    // (The printable status is written after the request is dropped, in the same reconcile.)
    wait_for("manual VM Stopped", WAIT, || async {
        Ok((vm_status(&env, "man").await? == Some(PrintableStatus::Stopped)).then_some(()))
    })
    .await?;
    // A stop request for a VMI that is gone is dropped without effect; the start behind it
    // runs.
    request(
        &env,
        "man",
        json!([{"action": "Stop", "uid": uid}, {"action": "Start"}]),
    )
    .await?;
    let uid2 = wait_vmi_uid(&env, "man", Some(&uid)).await?;
    wait_requests_done(&env, "man").await?;
    assert!(vmis.get("man").await?.metadata.uid == Some(uid2));

    // Always: restart (stop + start) replaces the VMI; runStrategy stays Always. Both VMIs
    // have the VM's one firmware UUID (cloud-init's instance-id).
    let uid = wait_vmi_uid(&env, "always", None).await?;
    let firmware_uuid = |v: VirtualMachineInstance| v.spec.domain.firmware.and_then(|f| f.uuid);
    let uuid1 = firmware_uuid(vmis.get("always").await?);
    assert_eq!(
        uuid1.as_deref(),
        Some(microvirt_operator::vm::plan::stable_firmware_uuid("always").as_str())
    );
    request(
        &env,
        "always",
        json!([{"action": "Stop", "uid": uid}, {"action": "Start"}]),
    )
    .await?;
    let uid2 = wait_vmi_uid(&env, "always", Some(&uid)).await?;
    assert_ne!(uid, uid2);
    assert_eq!(firmware_uuid(vmis.get("always").await?), uuid1);
    let vm = wait_requests_done(&env, "always").await?;
    assert_eq!(
        vm.spec.run_strategy,
        Some(microvirt_crds::RunStrategy::Always)
    );

    // RerunOnFailure: started on its own when created; a stop request ends the VMI and it
    // stays ended; a start request starts a new one.
    let uid = wait_vmi_uid(&env, "rerun", None).await?;
    wait_for("rerun's run strategy recorded", WAIT, || async {
        let vm = vms.get("rerun").await?;
        Ok((vm.status.and_then(|s| s.run_strategy)
            == Some(microvirt_crds::RunStrategy::RerunOnFailure))
        .then_some(()))
    })
    .await?;
    request(&env, "rerun", json!([{"action": "Stop", "uid": uid}])).await?;
    wait_vmi_gone(&env, "rerun").await?;
    wait_requests_done(&env, "rerun").await?;
    // Stays stopped. Reconciles of one VM run one after the other, so once a later request
    // (a stale stop, which is dropped) has been handled, the reconcile that dropped the first
    // one has finished, including any VMI it would have created.
    for _ in 0..2 {
        request(&env, "rerun", json!([{"action": "Stop", "uid": uid}])).await?;
        wait_requests_done(&env, "rerun").await?;
    }
    assert!(vmis.get_opt("rerun").await?.is_none());
    assert_eq!(
        vm_status(&env, "rerun").await?,
        Some(PrintableStatus::Stopped),
        "written before the later requests were handled"
    );
    request(&env, "rerun", json!([{"action": "Start"}])).await?;
    let uid2 = wait_vmi_uid(&env, "rerun", Some(&uid)).await?;
    assert_ne!(uid, uid2);
    wait_requests_done(&env, "rerun").await?;
    Ok(())
}
