//! On an API server without the ImageVolume feature gate, image volumes are silently dropped
//! from pods: the operator notices, removes the disk-less (or kernel-less) pod and fails the
//! VMI with the reason.

mod common;

use anyhow::Result;
use common::*;
use k8s_openapi::api::core::v1::Pod;
use microvirt_crds::{VirtualMachineInstance, VmiPhase};
use microvirt_testsupport::{Cluster, ClusterOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vmi_with_container_disk_fails_clearly_without_image_volumes() -> Result<()> {
    let cluster = tokio::task::block_in_place(|| Cluster::start(ClusterOptions::default()))?;
    install_crds(cluster.kubeconfig_path())?;
    let env = Env::start(cluster.kubeconfig_path(), "t-nogate").await?;
    env.apply(&vmi_yaml("cd", ""))?;
    let vmis = env.api::<VirtualMachineInstance>();
    let v = wait_for("VMI Failed", WAIT, || async {
        let v = vmis.get("cd").await?;
        Ok((v.phase() == Some(VmiPhase::Failed)).then_some(v))
    })
    .await?;
    let st = v.status.unwrap();
    assert_eq!(st.reason.as_deref(), Some("LauncherPodVolumesDropped"));
    assert!(
        st.message
            .unwrap_or_default()
            .contains("ImageVolume feature gate"),
        "message"
    );
    let pods = env.api::<Pod>();
    wait_for("disk-less pod removed", WAIT, || async {
        Ok(pods
            .get_opt("virt-launcher-cd")
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;
    // A VMI with no image volume of its own gets the operator's default kernel image, also an
    // image volume: without the gate no VMI can run in a pod (and none silently boots the
    // launcher's built-in demo guest instead).
    let yaml = vmi_yaml("plain", "").replace(
        "    containerDisk:\n      image: quay.io/containerdisks/fedora:latest\n",
        "    emptyDisk: {capacity: 1Gi}\n",
    );
    env.apply(&yaml)?;
    let v = wait_for("plain VMI Failed", WAIT, || async {
        let v = vmis.get("plain").await?;
        Ok((v.phase() == Some(VmiPhase::Failed)).then_some(v))
    })
    .await?;
    let st = v.status.unwrap();
    assert_eq!(st.reason.as_deref(), Some("LauncherPodVolumesDropped"));
    let msg = st.message.unwrap_or_default();
    assert!(msg.contains("kernel-boot"), "{msg}");
    Ok(())
}
