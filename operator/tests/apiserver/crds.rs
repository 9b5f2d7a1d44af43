//! The CRDs install with `kubectl apply`, and the apiserver refuses bad specs with a message that
//! says what is wrong.

use anyhow::Result;
use kube::api::{Patch, PatchParams, PostParams};
use microvirt_crds::VirtualMachineInstance;
use serde_json::json;

use crate::common::*;

#[tokio::test]
async fn crds_install_and_bad_specs_are_refused() -> Result<()> {
    let env = Env::start_shared("t-validation").await?;

    // A valid manifest applies.
    env.apply(&vmi_yaml("good", "app: x"))?;

    let good = vmi_yaml("bad", "");
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "disk without volume",
            good.replace("  - name: root\n    containerDisk:", "  - name: other\n    containerDisk:"),
            "every entry of spec.domain.devices.disks must name a volume listed in spec.volumes",
        ),
        (
            "memory below 16Mi",
            good.replace("guest: 128Mi", "guest: 8Mi"),
            "domain.memory.guest must be a quantity from 16Mi to 1Ei",
        ),
        (
            "memory not a quantity",
            good.replace("guest: 128Mi", "guest: lots"),
            "domain.memory.guest must be a quantity from 16Mi to 1Ei",
        ),
        (
            "emptyDisk without capacity",
            good.replace(
                "    containerDisk:\n      image: quay.io/containerdisks/fedora:latest\n",
                "    emptyDisk: {capacity: 0Gi}\n",
            ),
            "emptyDisk.capacity must be a quantity greater than 0 and at most 1Ei",
        ),
        (
            "zero cores",
            good.replace("cores: 1", "cores: 0"),
            "spec.domain.cpu.cores: Invalid value: 0: spec.domain.cpu.cores in body should be greater than or equal to 1",
        ),
        (
            "interface without network",
            good.replace("  - name: default\n    pod: {}", "  - name: elsewhere\n    pod: {}"),
            "every entry of spec.domain.devices.interfaces must name a network listed in spec.networks",
        ),
        (
            "volume with two sources",
            good.replace(
                "      image: quay.io/containerdisks/fedora:latest\n",
                "      image: quay.io/containerdisks/fedora:latest\n    emptyDisk: {capacity: 1Gi}\n",
            ),
            "a volume needs exactly one of containerDisk, persistentVolumeClaim, cloudInitNoCloud, emptyDisk",
        ),
        (
            "masquerade and bridge",
            good.replace("masquerade: {}", "masquerade: {}\n        bridge: {}"),
            "an interface uses either masquerade or bridge, not both",
        ),
        (
            "unsupported bus",
            good.replace("bus: virtio", "bus: sata"),
            "Unsupported value: \"sata\": supported values: \"virtio\"",
        ),
        (
            "duplicate disk names",
            good.replace(
                "      - name: root\n        disk: {bus: virtio}\n",
                "      - name: root\n        disk: {bus: virtio}\n      - name: root\n",
            ),
            "Duplicate value",
        ),
    ];
    let vmis = env.api::<VirtualMachineInstance>();
    for (what, yaml, want) in &cases {
        // kubectl apply refuses it with the message.
        env.apply_refused(what, yaml, &[want])?;
        // The Rust client gets a 422 with the same message.
        let obj: serde_json::Value = serde_saphyr::from_str(yaml)?;
        let obj: VirtualMachineInstance = match serde_json::from_value(obj.clone()) {
            Ok(v) => v,
            // Not representable in the Rust types (e.g. unknown enum value): post it raw.
            Err(_) => {
                let raw: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(
                    env.client.clone(),
                    &env.ns,
                    &kube::api::ApiResource::erase::<VirtualMachineInstance>(&()),
                );
                let dynobj: kube::api::DynamicObject = serde_json::from_value(obj)?;
                let e = raw
                    .create(&PostParams::default(), &dynobj)
                    .await
                    .expect_err(what);
                assert!(e.to_string().contains(want), "{what}: client got {e}");
                continue;
            }
        };
        let e = vmis
            .create(&PostParams::default(), &obj)
            .await
            .expect_err(what);
        match &e {
            kube::Error::Api(s) => {
                assert_eq!(s.code, 422, "{what}: {s:?}");
                assert!(
                    s.message.contains(want),
                    "{what}: client got {:?}",
                    s.message
                );
            }
            other => panic!("{what}: unexpected error {other}"),
        }
    }

    // A VMIRS whose template labels do not match its selector.
    let rs = r#"apiVersion: microvirt.io/v1alpha1
kind: VirtualMachineInstanceReplicaSet
metadata: {name: mismatched}
spec:
  selector: {matchLabels: {app: a}}
  template:
    metadata: {labels: {app: b}}
    spec: {domain: {}}
"#;
    env.apply_refused(
        "VMIRS with a mismatched selector",
        rs,
        &["spec.template.metadata.labels must contain every label of spec.selector.matchLabels"],
    )?;
    // A VM with both running and runStrategy.
    let vm = r#"apiVersion: microvirt.io/v1alpha1
kind: VirtualMachine
metadata: {name: both}
spec:
  running: true
  runStrategy: Always
  template: {spec: {domain: {}}}
"#;
    env.apply_refused(
        "VM with running and runStrategy",
        vm,
        &["set either spec.running or spec.runStrategy, not both"],
    )?;

    // The spec is immutable once the operator has accepted the VMI (status written).
    wait_for("VMI good has a status", WAIT, || async {
        Ok(vmis.get("good").await?.status.map(|_| ()))
    })
    .await?;
    let changed = vmi_yaml("good", "app: x").replace("cores: 1", "cores: 2");
    env.apply_refused(
        "spec change after status",
        &changed,
        &["spec of a VirtualMachineInstance is immutable after creation"],
    )?;
    // The same through the Rust client.
    let e = vmis
        .patch(
            "good",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"domain": {"cpu": {"cores": 3}}}})),
        )
        .await
        .expect_err("spec patch after status");
    assert!(
        e.to_string()
            .contains("spec of a VirtualMachineInstance is immutable after creation"),
        "{e}"
    );
    // Fields microvirt does not have are refused by kubectl's strict field validation
    // (KubeVirt's fields are either in the schema or refused with a reason:
    // kubevirt_manifests.rs).
    let unknown = vmi_yaml("unknown", "").replace(
        "    cpu: {cores: 1}\n",
        "    cpu: {cores: 1}\n    ioThreadsPolicy: auto\n",
    );
    env.apply_refused(
        "unknown field",
        &unknown,
        &["unknown field \"spec.domain.ioThreadsPolicy\""],
    )?;
    // Metadata stays editable.
    let (ok, _, err) = env.kubectl(&["label", "vmi", "good", "extra=1"], None)?;
    assert!(ok, "{err}");
    Ok(())
}
