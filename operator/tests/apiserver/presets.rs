//! VirtualMachineInstancePresets: applied once, conflicts reported.

use anyhow::Result;
use kube::api::{ListParams, Patch, PatchParams};
use kube::ResourceExt;
use microvirt_crds::vmi::ANNOTATION_PRESETS_APPLIED;
use microvirt_crds::{VirtualMachineInstance, VirtualMachineInstancePreset, VmiPhase};
use serde_json::json;

use crate::common::*;
use crate::harness::{vmi_phase, wait_pod};

#[tokio::test]
async fn presets_apply_once_with_conflicts_reported() -> Result<()> {
    let env = Env::start_shared("t-preset").await?;
    let presets = env.api::<VirtualMachineInstancePreset>();
    let preset = r#"apiVersion: microvirt.io/v1alpha1
kind: VirtualMachineInstancePreset
metadata: {name: small}
spec:
  selector: {matchLabels: {size: small}}
  domain:
    cpu: {cores: 2}
    memory: {guest: 256Mi}
"#;
    env.apply(preset)?;
    wait_for("preset cached", WAIT, || async {
        Ok(presets.get_opt("small").await?)
    })
    .await?;
    // Give the operator's preset watch a moment to see it.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;

    // The VMI sets memory itself (128Mi) and no cores... but vmi() sets cores: 1, so build one
    // without cpu.
    let yaml = vmi_yaml("sized", "size: small").replace("    cpu: {cores: 1}\n", "");
    env.apply(&yaml)?;
    let vmis = env.api::<VirtualMachineInstance>();
    let v = wait_for("presets applied", WAIT, || async {
        let v = vmis.get("sized").await?;
        Ok(v.annotations()
            .contains_key(ANNOTATION_PRESETS_APPLIED)
            .then_some(v))
    })
    .await?;
    assert_eq!(v.annotations()[ANNOTATION_PRESETS_APPLIED], "small");
    assert_eq!(v.spec.domain.cpu.as_ref().and_then(|c| c.cores), Some(2));
    assert_eq!(
        v.spec
            .domain
            .memory
            .as_ref()
            .and_then(|m| m.guest.as_ref())
            .map(|q| q.0.as_str()),
        Some("128Mi")
    );
    // The conflict is an Event on the VMI.
    let events: kube::Api<k8s_openapi::api::events::v1::Event> = env.api();
    wait_for("PresetConflict event", WAIT, || async {
        let list = events.list(&ListParams::default()).await?;
        Ok(list
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("PresetConflict")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("sized")
            })
            .map(|e| e.note.unwrap_or_default()))
    })
    .await
    .map(|note| assert!(note.contains("domain.memory.guest"), "{note}"))?;
    // The pod got the merged spec (2 vCPUs → 200m CPU).
    let pod = wait_pod(&env, "sized").await?;
    let req = pod.spec.unwrap().containers[0]
        .resources
        .clone()
        .unwrap()
        .requests
        .unwrap();
    assert_eq!(req.get("cpu").map(|q| q.0.as_str()), Some("200m"));

    // Applied once: a later preset change does not touch the VMI.
    presets
        .patch(
            "small",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"domain": {"cpu": {"cores": 4}}}})),
        )
        .await?;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let v = vmis.get("sized").await?;
    assert_eq!(v.spec.domain.cpu.as_ref().and_then(|c| c.cores), Some(2));
    assert_eq!(vmi_phase(&env, "sized").await?, Some(VmiPhase::Scheduling));
    Ok(())
}
