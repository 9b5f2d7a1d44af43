//! Waits shared by this binary's tests (the cluster, the operator and the simulated kubelet are
//! in `tests/common`).

use anyhow::Result;
use k8s_openapi::api::core::v1::Pod;
use microvirt_crds::{PrintableStatus, VirtualMachine, VirtualMachineInstance, VmiPhase};

use crate::common::*;

pub(crate) async fn vmi_phase(env: &Env, name: &str) -> Result<Option<VmiPhase>> {
    let v: VirtualMachineInstance = env.api().get(name).await?;
    Ok(v.phase())
}

pub(crate) async fn wait_phase(
    env: &Env,
    name: &str,
    phase: VmiPhase,
) -> Result<VirtualMachineInstance> {
    let api = env.api::<VirtualMachineInstance>();
    wait_for(&format!("VMI {name} phase {phase}"), WAIT, || async {
        let v = api.get(name).await?;
        Ok((v.phase() == Some(phase)).then_some(v))
    })
    .await
}

pub(crate) async fn wait_pod(env: &Env, vmi: &str) -> Result<Pod> {
    let pods = env.api::<Pod>();
    let name = format!("virt-launcher-{vmi}");
    wait_for(&format!("pod {name}"), WAIT, || async {
        Ok(pods.get_opt(&name).await?)
    })
    .await
}

pub(crate) async fn vm_status(env: &Env, name: &str) -> Result<Option<PrintableStatus>> {
    let vm: VirtualMachine = env.api().get(name).await?;
    Ok(vm.status.and_then(|s| s.printable_status))
}

pub(crate) async fn wait_vmi_uid(env: &Env, name: &str, not: Option<&str>) -> Result<String> {
    let vmis = env.api::<VirtualMachineInstance>();
    wait_for(&format!("VMI {name} (uid != {not:?})"), WAIT, || async {
        Ok(vmis
            .get_opt(name)
            .await?
            .filter(|v| v.metadata.deletion_timestamp.is_none())
            .and_then(|v| v.metadata.uid)
            .filter(|u| Some(u.as_str()) != not))
    })
    .await
}
