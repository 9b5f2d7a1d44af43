//! Disks and devices of a VMI against a real kube-apiserver, with the operator running under
//! the ServiceAccount of `deploy/rbac.yaml`: `devices.rng: {}` passes kubectl's strict field
//! validation and reaches the launcher document; a `volumeMode: Block` claim becomes a device
//! of the launcher container, a file system claim a mount; a VMI whose claim does not exist yet
//! waits for it; the pod requests and limits the local disk it may use.

use crate::common::*;
use anyhow::Result;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{ListParams, PostParams};
use kube::Api;
use microvirt_crds::VirtualMachineInstance;
use microvirt_operator::pod::ANNOTATION_VMI_SPEC;
use serde_json::json;

fn claim(name: &str, mode: &str) -> Result<PersistentVolumeClaim> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "volumeMode": mode,
            "resources": {"requests": {"storage": "1Gi"}}
        }
    }))?)
}

fn vmi_with_volumes(name: &str) -> String {
    format!(
        r#"apiVersion: microvirt.io/v1alpha1
kind: VirtualMachineInstance
metadata: {{name: {name}}}
spec:
  domain:
    memory: {{guest: 64Mi}}
    devices:
      rng: {{}}
      disks:
      - name: root
      - name: fast
      - name: files
      - name: scratch
  volumes:
  - name: root
    containerDisk: {{image: example/disk:1}}
  - name: fast
    persistentVolumeClaim: {{claimName: fast-claim}}
  - name: files
    persistentVolumeClaim: {{claimName: files-claim}}
  - name: scratch
    emptyDisk: {{capacity: 1Gi}}
"#
    )
}

fn container(pod: &Pod) -> &k8s_openapi::api::core::v1::Container {
    &pod.spec.as_ref().unwrap().containers[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rng_block_claims_and_local_disk_reach_the_launcher_pod() -> Result<()> {
    let env = Env::start_as_operator_sa("t-volumes").await?;
    let claims = env.api::<PersistentVolumeClaim>();
    claims
        .create(&PostParams::default(), &claim("fast-claim", "Block")?)
        .await?;
    claims
        .create(&PostParams::default(), &claim("files-claim", "Filesystem")?)
        .await?;

    // kubectl's strict field validation accepts `rng: {}` and the API server keeps it.
    env.apply(&vmi_with_volumes("v1"))?;
    let vmis = env.api::<VirtualMachineInstance>();
    let stored = vmis.get("v1").await?;
    assert!(
        stored.spec.domain.devices.as_ref().unwrap().rng.is_some(),
        "rng was dropped"
    );

    let pods = env.api::<Pod>();
    let pod = wait_for("the launcher pod", WAIT, || async {
        pods.get_opt("virt-launcher-v1").await.map_err(Into::into)
    })
    .await?;
    let doc: serde_json::Value =
        serde_json::from_str(&pod.metadata.annotations.as_ref().unwrap()[ANNOTATION_VMI_SPEC])?;
    assert_eq!(doc["spec"]["domain"]["devices"]["rng"], json!({}));
    let c = container(&pod);
    let devices: Vec<(String, String)> = c
        .volume_devices
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|d| (d.name, d.device_path))
        .collect();
    assert_eq!(
        devices,
        vec![("vol-1".to_string(), "/dev/microvirt/pvcs/fast".to_string())]
    );
    let mounts: Vec<&str> = c
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .map(|m| m.mount_path.as_str())
        .collect();
    assert!(
        mounts.contains(&"/var/run/microvirt/pvcs/files"),
        "{mounts:?}"
    );
    assert!(
        !mounts.contains(&"/var/run/microvirt/pvcs/fast"),
        "{mounts:?}"
    );
    // Local disk: the runtime directory (64Mi + a 2Gi overlay allowance for the writable
    // containerDisk + room to extract the boot disk's kernel, the VMI naming none) and the 1Gi
    // emptyDisk with room for file system metadata.
    let res = c.resources.as_ref().unwrap();
    let eph = |m: &Option<std::collections::BTreeMap<String, _>>| -> u64 {
        let q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity =
            &m.as_ref().unwrap()["ephemeral-storage"];
        microvirt_crds::quantity::parse_bytes(&q.0).unwrap()
    };
    let scratch = (64u64 << 20) + (2 << 30) + microvirt_operator::config::IMAGE_KERNEL_SCRATCH;
    let empty = microvirt_operator::pod::empty_disk_size_limit(1 << 30);
    assert_eq!(eph(&res.requests), scratch + empty);
    assert_eq!(eph(&res.limits), scratch + empty);

    // A VMI whose claim does not exist yet gets no pod; once the claim appears, it does.
    let waiting = vmi_with_volumes("v2").replace("claimName: files-claim", "claimName: later");
    env.apply(&waiting)?;
    let events: Api<k8s_openapi::api::events::v1::Event> = env.api();
    wait_for("a PVCNotFound event", WAIT, || async {
        let l = events.list(&ListParams::default()).await?;
        Ok(l.items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("PVCNotFound")
                    && e.note.as_deref().is_some_and(|n| n.contains("\"later\""))
            })
            .then_some(()))
    })
    .await?;
    assert!(pods.get_opt("virt-launcher-v2").await?.is_none());
    claims
        .create(&PostParams::default(), &claim("later", "Filesystem")?)
        .await?;
    wait_for("the launcher pod once the claim exists", WAIT, || async {
        pods.get_opt("virt-launcher-v2").await.map_err(Into::into)
    })
    .await?;
    env.assert_no_reconcile_errors();
    Ok(())
}
