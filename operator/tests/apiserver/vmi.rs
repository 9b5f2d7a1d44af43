//! VMI → launcher pod → VMI status with the simulated kubelet, deletion, and a pod the apiserver
//! refuses.

use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::ResourceExt;
use microvirt_crds::vmi::ANNOTATION_VMI_UID;
use microvirt_crds::{VirtualMachineInstance, VmiPhase};
use serde_json::json;

use crate::common::*;
use crate::harness::{wait_phase, wait_pod};

#[tokio::test]
async fn vmi_gets_a_launcher_pod_and_follows_the_simulated_kubelet() -> Result<()> {
    let env = Env::start_shared("t-lifecycle").await?;
    let vmis = env.api::<VirtualMachineInstance>();
    let pods = env.api::<Pod>();
    let created = vmis
        .create(&PostParams::default(), &vmi("vm-a", &[("app", "demo")]))
        .await?;

    // The pod, as specified in docs/launcher-pod.md.
    let pod = wait_pod(&env, "vm-a").await?;
    assert_eq!(
        pod.annotations().get(ANNOTATION_VMI_UID),
        created.metadata.uid.as_ref()
    );
    assert_eq!(
        pod.labels().get("microvirt.io/vmi").map(String::as_str),
        Some("vm-a")
    );
    assert_eq!(pod.labels().get("app").map(String::as_str), Some("demo"));
    let owner = &pod.owner_references()[0];
    assert_eq!(owner.kind, "VirtualMachineInstance");
    assert_eq!(owner.controller, Some(true));
    let spec = pod.spec.clone().context("pod spec")?;
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    assert_eq!(spec.automount_service_account_token, Some(false));
    let c = &spec.containers[0];
    assert_eq!(c.name, "compute");
    assert_eq!(c.image.as_deref(), Some("microvirt/virt-launcher:dev"));
    assert_eq!(
        c.command,
        Some(vec!["virt-launcher".to_string(), "pod".to_string()])
    );
    let res = c.resources.clone().context("resources")?;
    let limits = res.limits.unwrap_or_default();
    let requests = res.requests.unwrap_or_default();
    assert_eq!(
        limits.get("devices.microvirt.io/kvm").map(|q| q.0.as_str()),
        Some("1")
    );
    assert_eq!(requests.get("memory").map(|q| q.0.as_str()), Some("160Mi"));
    let sc = c.security_context.clone().context("securityContext")?;
    assert_eq!(sc.privileged, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(
        sc.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
        Some("RuntimeDefault")
    );
    let caps = sc.capabilities.context("capabilities")?;
    assert_eq!(
        caps.add,
        Some(vec![
            "NET_ADMIN".to_string(),
            "NET_BIND_SERVICE".to_string(),
            "SETGID".to_string(),
            "SETUID".to_string(),
        ])
    );
    assert_eq!(
        spec.security_context.as_ref().and_then(|s| s.fs_group),
        Some(107)
    );
    assert_eq!(caps.drop, Some(vec!["ALL".to_string()]));
    // No probe (an exec probe costs a runtime exec per VM per second): readiness is the
    // readiness gate the node agent sets from the launcher's status, as the API server keeps it.
    assert!(
        c.readiness_probe.is_none() && c.liveness_probe.is_none() && c.startup_probe.is_none(),
        "the launcher container has a probe: {c:?}"
    );
    let gates: Vec<String> = spec
        .readiness_gates
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|g| g.condition_type)
        .collect();
    assert_eq!(gates, vec!["microvirt.io/vm-running".to_string()]);
    assert_eq!(
        c.termination_message_path.as_deref(),
        Some("/dev/termination-log")
    );
    let mounts = c.volume_mounts.clone().unwrap_or_default();
    assert!(mounts
        .iter()
        .any(|m| m.mount_path == "/var/run/microvirt/vmi"));
    assert!(mounts
        .iter()
        .any(|m| m.mount_path == "/var/run/microvirt/container-disks/root"));
    let vols = spec.volumes.clone().unwrap_or_default();
    let dapi = vols
        .iter()
        .find(|v| v.name == "vmi")
        .and_then(|v| v.downward_api.clone())
        .context("downward API volume")?;
    assert_eq!(
        dapi.items.unwrap()[0]
            .field_ref
            .as_ref()
            .unwrap()
            .field_path,
        "metadata.annotations['microvirt.io/vmi-spec']"
    );
    let doc: serde_json::Value = serde_json::from_str(&pod.annotations()["microvirt.io/vmi-spec"])?;
    assert_eq!(doc["guestMemoryBytes"], json!(134217728));
    assert_eq!(doc["metadata"]["uid"], json!(created.metadata.uid));
    let image_vol = vols
        .iter()
        .find_map(|v| v.image.clone())
        .context("containerDisk image volume (needs ImageVolume)")?;
    assert_eq!(
        image_vol.reference.as_deref(),
        Some("quay.io/containerdisks/fedora:latest")
    );

    // Phases driven by the simulated kubelet.
    let v = wait_phase(&env, "vm-a", VmiPhase::Scheduling).await?;
    assert_eq!(
        v.status.as_ref().and_then(|s| s.launcher_pod.as_deref()),
        Some("virt-launcher-vm-a")
    );
    bind(&pods, "virt-launcher-vm-a", "node-1").await?;
    let v = wait_phase(&env, "vm-a", VmiPhase::Scheduled).await?;
    assert_eq!(
        v.status.as_ref().and_then(|s| s.node_name.as_deref()),
        Some("node-1")
    );
    mark_running(&pods, "virt-launcher-vm-a", "10.244.0.7", false).await?;
    let v = wait_phase(&env, "vm-a", VmiPhase::Running).await?;
    assert!(!v.is_ready());
    mark_running(&pods, "virt-launcher-vm-a", "10.244.0.7", true).await?;
    let v = wait_for("VMI ready", WAIT, || async {
        let v = vmis.get("vm-a").await?;
        Ok(v.is_ready().then_some(v))
    })
    .await?;
    let st = v.status.clone().unwrap();
    // KubeVirt's Ready: the VM runs in a Ready pod (no boot time needed).
    let ready = st.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(ready.reason.as_deref(), Some("VMRunning"));
    assert_eq!(st.boot_time_ms, None);
    assert_eq!(st.interfaces[0].ip_address.as_deref(), Some("10.244.0.7"));
    assert_eq!(st.interfaces[0].name.as_deref(), Some("default"));
    let phases: Vec<VmiPhase> = st
        .phase_transition_timestamps
        .iter()
        .map(|t| t.phase)
        .collect();
    assert_eq!(
        phases,
        vec![VmiPhase::Scheduling, VmiPhase::Scheduled, VmiPhase::Running]
    );

    // kubectl get vmi shows the KubeVirt columns.
    let (ok, out, err) = env.kubectl(&["get", "vmi", "vm-a"], None)?;
    assert!(ok, "{err}");
    let mut lines = out.lines();
    let header: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    assert_eq!(
        header,
        vec!["NAME", "PHASE", "IP", "NODENAME", "READY", "AGE"]
    );
    let row: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    assert_eq!(
        &row[..5],
        &["vm-a", "Running", "10.244.0.7", "node-1", "True"]
    );

    // Guest powers off: exit 0 → Succeeded, boot time from the termination message.
    mark_terminated(
        &pods,
        "virt-launcher-vm-a",
        0,
        "guest powered off\nbootTimeMs=142",
    )
    .await?;
    let v = wait_phase(&env, "vm-a", VmiPhase::Succeeded).await?;
    let st = v.status.unwrap();
    assert_eq!(st.boot_time_ms, Some(142));
    assert!(!st.is_ready());

    // A failing launcher: non-zero exit → Failed with the reason line.
    vmis.create(&PostParams::default(), &vmi("vm-b", &[]))
        .await?;
    wait_pod(&env, "vm-b").await?;
    bind(&pods, "virt-launcher-vm-b", "node-1").await?;
    mark_running(&pods, "virt-launcher-vm-b", "10.244.0.8", true).await?;
    wait_phase(&env, "vm-b", VmiPhase::Running).await?;
    mark_terminated(
        &pods,
        "virt-launcher-vm-b",
        3,
        "kernel not found: /boot/vmlinux\n",
    )
    .await?;
    let v = wait_phase(&env, "vm-b", VmiPhase::Failed).await?;
    let st = v.status.unwrap();
    assert_eq!(st.reason.as_deref(), Some("LauncherExited3"));
    assert_eq!(
        st.message.as_deref(),
        Some("kernel not found: /boot/vmlinux")
    );

    // Metrics recorded the phase transitions.
    let text = env.metrics.encode();
    assert!(
        text.contains("microvirt_operator_vmi_phase_transition_seconds_count{phase=\"Running\"} 2"),
        "{text}"
    );
    Ok(())
}

#[tokio::test]
async fn deleting_a_vmi_stops_and_removes_its_pod() -> Result<()> {
    let env = Env::start_shared("t-delete").await?;
    let vmis = env.api::<VirtualMachineInstance>();
    let pods = env.api::<Pod>();
    vmis.create(&PostParams::default(), &vmi("vm-d", &[]))
        .await?;
    wait_pod(&env, "vm-d").await?;
    bind(&pods, "virt-launcher-vm-d", "node-1").await?;
    mark_running(&pods, "virt-launcher-vm-d", "10.244.0.9", true).await?;
    wait_phase(&env, "vm-d", VmiPhase::Running).await?;
    let v = vmis.get("vm-d").await?;
    assert!(v
        .finalizers()
        .iter()
        .any(|f| f == "microvirt.io/launcher-pod"));

    vmis.delete("vm-d", &DeleteParams::default()).await?;
    // The VMI waits for its pod; the simulated kubelet finishes the pod's graceful deletion.
    wait_for("VMI and pod gone", WAIT, || async {
        let v = vmis.get_opt("vm-d").await?;
        let p = pods.get_opt("virt-launcher-vm-d").await?;
        Ok((v.is_none() && p.is_none()).then_some(()))
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_launcher_pod_the_api_server_refuses_fails_the_vmi() -> Result<()> {
    let env = Env::start_shared("t-refused").await?;
    // The CRD accepts any nodeSelector map; pod validation refuses this label key.
    let yaml = vmi_yaml("refused", "").replace(
        "spec:\n  domain:",
        "spec:\n  nodeSelector: {\"not a/valid/key\": x}\n  domain:",
    );
    env.apply(&yaml)?;
    let v = wait_phase(&env, "refused", VmiPhase::Failed).await?;
    let st = v.status.unwrap();
    assert_eq!(st.reason.as_deref(), Some("LauncherPodRefused"));
    let msg = st.message.unwrap_or_default();
    assert!(msg.contains("nodeSelector"), "{msg}");
    assert!(env
        .api::<Pod>()
        .get_opt("virt-launcher-refused")
        .await?
        .is_none());
    Ok(())
}
