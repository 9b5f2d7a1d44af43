//! cloud-init user data (often secrets) never sits in the launcher pod: against a real
//! kube-apiserver, with the operator running as its ServiceAccount (`deploy/rbac.yaml`), inline
//! `userData`/`networkData` go into a Secret owned by the VMI that the pod mounts, the pod's
//! VMI document has none of it, and a `secretRef` Secret is mounted as it is (KubeVirt's
//! behaviour). The CRD refuses conflicting or malformed references at `kubectl apply`.

use std::time::Duration;

use crate::common::*;
use anyhow::Result;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::Api;
use microvirt_crds::VirtualMachineInstance;

const WAIT: Duration = Duration::from_secs(30);

fn vmi_with_seed(name: &str, seed: &str) -> String {
    format!(
        r#"apiVersion: microvirt.io/v1alpha1
kind: VirtualMachineInstance
metadata: {{name: {name}}}
spec:
  domain:
    memory: {{guest: 64Mi}}
    devices:
      disks: [{{name: root}}, {{name: seed}}]
  volumes:
  - name: root
    containerDisk: {{image: example/disk:1}}
  - name: seed
    cloudInitNoCloud:
{seed}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_cloud_init_data_goes_to_a_secret_the_pod_mounts() -> Result<()> {
    let mut env = Env::start_as_operator_sa("t-cloudinit").await?;

    let inline = vmi_with_seed(
        "ci",
        "      userData: \"#cloud-config\\npassword: hunter2\\n\"\n      networkData: \"version: 2\\n\"\n",
    );
    env.apply(&inline)?;
    let by_ref = vmi_with_seed("byref", "      secretRef: {name: my-user-data}\n");
    env.apply(&by_ref)?;

    let pods = env.api::<Pod>();
    let pod = wait_for("the launcher pod", WAIT, || async {
        Ok(pods.get_opt("virt-launcher-ci").await?)
    })
    .await?;
    let pod_json = serde_json::to_string(&pod)?;
    assert!(
        !pod_json.contains("hunter2"),
        "user data in the pod: {pod_json}"
    );
    assert!(
        !pod_json.contains("version: 2"),
        "network data in the pod: {pod_json}"
    );

    let vmi = env.api::<VirtualMachineInstance>().get("ci").await?;
    let secrets: Api<Secret> = env.api();
    let s = secrets.get("virt-launcher-ci-cloud-init").await?;
    let owner = &s.metadata.owner_references.as_ref().expect("owner")[0];
    assert_eq!(Some(owner.uid.as_str()), vmi.metadata.uid.as_deref());
    assert_eq!(owner.kind, "VirtualMachineInstance");
    let data = s.data.expect("data");
    assert_eq!(
        data["seed.userdata"].0,
        b"#cloud-config\npassword: hunter2\n"
    );
    assert_eq!(data["seed.networkdata"].0, b"version: 2\n");

    let volumes = pod.spec.as_ref().unwrap().volumes.clone().unwrap();
    let secret_volume = |pod_volumes: &[k8s_openapi::api::core::v1::Volume], part: &str| {
        pod_volumes
            .iter()
            .find(|v| v.name.ends_with(part))
            .and_then(|v| v.secret.clone())
            .unwrap_or_else(|| panic!("no {part} secret volume: {pod_volumes:?}"))
    };
    let u = secret_volume(&volumes, "-userdata");
    assert_eq!(
        u.secret_name.as_deref(),
        Some("virt-launcher-ci-cloud-init")
    );
    assert_eq!(u.items.as_ref().unwrap()[0].key, "seed.userdata");
    let n = secret_volume(&volumes, "-networkdata");
    assert_eq!(n.items.as_ref().unwrap()[0].key, "seed.networkdata");
    let mounts: Vec<String> = pod.spec.as_ref().unwrap().containers[0]
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .map(|m| m.mount_path.clone())
        .collect();
    assert!(
        mounts.contains(&"/var/run/microvirt/cloud-init/seed/userdata".to_string()),
        "{mounts:?}"
    );

    // secretRef: the user's Secret is mounted; nothing is copied.
    let pod = wait_for("the secretRef launcher pod", WAIT, || async {
        Ok(pods.get_opt("virt-launcher-byref").await?)
    })
    .await?;
    let volumes = pod.spec.as_ref().unwrap().volumes.clone().unwrap();
    let u = secret_volume(&volumes, "-userdata");
    assert_eq!(u.secret_name.as_deref(), Some("my-user-data"));
    assert!(u.items.is_none());
    assert!(secrets
        .get_opt("virt-launcher-byref-cloud-init")
        .await?
        .is_none());

    // KubeVirt's base64 fields: decoded into the Secret (the CRD keeps both fields).
    let b64 = vmi_with_seed(
        "b64",
        "      userDataBase64: I2Nsb3VkLWNvbmZpZwo=\n      networkDataBase64: dmVyc2lvbjogMgo=\n",
    );
    env.apply(&b64)?;
    let s = wait_for("the base64 cloud-init Secret", WAIT, || async {
        Ok(secrets.get_opt("virt-launcher-b64-cloud-init").await?)
    })
    .await?;
    let data = s.data.expect("data");
    assert_eq!(data["seed.userdata"].0, b"#cloud-config\n");
    assert_eq!(data["seed.networkdata"].0, b"version: 2\n");

    // A Secret of the name the operator would use that is not this VMI's (here: made by
    // someone else first) is neither changed nor adopted (the garbage collector would delete
    // an adopted one with the VMI): the VMI fails and says why.
    let foreign: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "virt-launcher-taken-cloud-init"},
        "stringData": {"keep": "me"}
    }))?;
    secrets.create(&Default::default(), &foreign).await?;
    let taken = vmi_with_seed("taken", "      userData: \"#cloud-config\\n\"\n");
    env.apply(&taken)?;
    let vmis = env.api::<VirtualMachineInstance>();
    let v = wait_for(
        "the VMI whose Secret name is taken to fail",
        WAIT,
        || async {
            let v = vmis.get("taken").await?;
            Ok((v.phase() == Some(microvirt_crds::VmiPhase::Failed)).then_some(v))
        },
    )
    .await?;
    let st = v.status.unwrap();
    assert_eq!(st.reason.as_deref(), Some("LauncherPodRefused"));
    let msg = st.message.unwrap_or_default();
    assert!(
        msg.contains("\"virt-launcher-taken-cloud-init\" exists and does not belong to this VMI"),
        "{msg}"
    );
    let s = secrets.get("virt-launcher-taken-cloud-init").await?;
    assert!(s.metadata.owner_references.is_none(), "adopted: {s:?}");
    let data = s.data.expect("data");
    assert_eq!(data.len(), 1, "changed: {data:?}");
    assert_eq!(data["keep"].0, b"me");
    assert!(pods.get_opt("virt-launcher-taken").await?.is_none());

    // A Secret an earlier reconcile of the same VMI made (stale data; the pod was not made
    // then) is rewritten, and the pod follows.
    env.stop_operator();
    let again = vmi_with_seed("again", "      userData: \"#cloud-config\\nnew: 1\\n\"\n");
    env.apply(&again)?;
    let uid = vmis.get("again").await?.metadata.uid.expect("uid");
    let ours: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "virt-launcher-again-cloud-init",
            "ownerReferences": [{
                "apiVersion": "microvirt.io/v1alpha1",
                "kind": "VirtualMachineInstance",
                "name": "again",
                "uid": uid,
                "controller": true,
                "blockOwnerDeletion": true
            }]
        },
        "stringData": {"seed.userdata": "stale"}
    }))?;
    secrets.create(&Default::default(), &ours).await?;
    env.start_operator().await?;
    wait_for(
        "the launcher pod of the VMI with its Secret",
        WAIT,
        || async { Ok(pods.get_opt("virt-launcher-again").await?) },
    )
    .await?;
    let data = secrets
        .get("virt-launcher-again-cloud-init")
        .await?
        .data
        .expect("data");
    assert_eq!(data["seed.userdata"].0, b"#cloud-config\nnew: 1\n");

    // The CRD refuses what cannot work.
    for (what, seed, want) in [
        (
            "userData and secretRef",
            "      userData: x\n      secretRef: {name: s}\n",
            "cloudInitNoCloud takes one of userData, userDataBase64 and secretRef",
        ),
        (
            "networkData and its Secret",
            "      networkData: x\n      networkDataSecretRef: {name: s}\n",
            "cloudInitNoCloud takes one of networkData, networkDataBase64 and networkDataSecretRef",
        ),
        (
            "networkData twice",
            "      networkData: x\n      networkDataBase64: eA==\n",
            "cloudInitNoCloud takes one of networkData, networkDataBase64 and networkDataSecretRef",
        ),
        (
            "a Secret name that is no DNS subdomain",
            "      secretRef: {name: My_Secret}\n",
            "a Secret name must be a DNS subdomain",
        ),
        (
            "no data at all",
            "      {}\n",
            "cloudInitNoCloud needs userData, userDataBase64, secretRef, networkData, networkDataBase64 or networkDataSecretRef",
        ),
    ] {
        let yaml = vmi_with_seed("refused", seed).replace("    cloudInitNoCloud:\n      {}", "    cloudInitNoCloud: {}");
        env.apply_refused(what, &yaml, &[want])?;
    }
    Ok(())
}
