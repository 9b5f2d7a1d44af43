//! The operator against a real kube-apiserver: CRDs, validation, VMI → pod → status, deletion,
//! VMIRS scaling, VM run strategies, presets, `kubectl get` columns.

#[path = "../common/mod.rs"]
mod common;

use std::collections::BTreeSet;

use anyhow::{Context as _, Result};
use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use microvirt_crds::vmi::{ANNOTATION_PRESETS_APPLIED, ANNOTATION_VMI_UID};
use microvirt_crds::{
    PrintableStatus, VirtualMachine, VirtualMachineInstance, VirtualMachineInstancePreset,
    VirtualMachineInstanceReplicaSet, VmiPhase,
};
use serde_json::json;

async fn vmi_phase(env: &Env, name: &str) -> Result<Option<VmiPhase>> {
    let v: VirtualMachineInstance = env.api().get(name).await?;
    Ok(v.phase())
}

async fn wait_phase(env: &Env, name: &str, phase: VmiPhase) -> Result<VirtualMachineInstance> {
    let api = env.api::<VirtualMachineInstance>();
    wait_for(&format!("VMI {name} phase {phase}"), WAIT, || async {
        let v = api.get(name).await?;
        Ok((v.phase() == Some(phase)).then_some(v))
    })
    .await
}

async fn wait_pod(env: &Env, vmi: &str) -> Result<Pod> {
    let pods = env.api::<Pod>();
    let name = format!("virt-launcher-{vmi}");
    wait_for(&format!("pod {name}"), WAIT, || async {
        Ok(pods.get_opt(&name).await?)
    })
    .await
}

#[tokio::test]
async fn crds_install_and_bad_specs_are_refused() -> Result<()> {
    let cluster = shared_cluster();
    let env = Env::start(cluster.kubeconfig_path(), "t-validation").await?;

    // A valid manifest applies.
    let (ok, _, err) = env.kubectl(&["apply", "-f", "-"], Some(&vmi_yaml("good", "app: x")))?;
    assert!(ok, "valid VMI refused: {err}");

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
        let (ok, out, err) = env.kubectl(&["apply", "-f", "-"], Some(yaml))?;
        assert!(!ok, "{what}: kubectl apply accepted it: {out}");
        assert!(
            err.contains(want),
            "{what}: kubectl said {err:?}, wanted {want:?}"
        );
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
    let (ok, _, err) = env.kubectl(&["apply", "-f", "-"], Some(rs))?;
    assert!(!ok);
    assert!(
        err.contains(
            "spec.template.metadata.labels must contain every label of spec.selector.matchLabels"
        ),
        "{err}"
    );
    // A VM with both running and runStrategy.
    let vm = r#"apiVersion: microvirt.io/v1alpha1
kind: VirtualMachine
metadata: {name: both}
spec:
  running: true
  runStrategy: Always
  template: {spec: {domain: {}}}
"#;
    let (ok, _, err) = env.kubectl(&["apply", "-f", "-"], Some(vm))?;
    assert!(!ok);
    assert!(
        err.contains("set either spec.running or spec.runStrategy, not both"),
        "{err}"
    );

    // The spec is immutable once the operator has accepted the VMI (status written).
    wait_for("VMI good has a status", WAIT, || async {
        Ok(vmis.get("good").await?.status.map(|_| ()))
    })
    .await?;
    let changed = vmi_yaml("good", "app: x").replace("cores: 1", "cores: 2");
    let (ok, _, err) = env.kubectl(&["apply", "-f", "-"], Some(&changed))?;
    assert!(!ok, "spec change accepted");
    assert!(
        err.contains("spec of a VirtualMachineInstance is immutable after creation"),
        "{err}"
    );
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
    let (ok, _, err) = env.kubectl(&["apply", "-f", "-"], Some(&unknown))?;
    assert!(!ok);
    assert!(
        err.contains("unknown field \"spec.domain.ioThreadsPolicy\""),
        "{err}"
    );
    // Metadata stays editable.
    let (ok, _, err) = env.kubectl(&["label", "vmi", "good", "extra=1"], None)?;
    assert!(ok, "{err}");
    Ok(())
}

#[tokio::test]
async fn vmi_gets_a_launcher_pod_and_follows_the_simulated_kubelet() -> Result<()> {
    let cluster = shared_cluster();
    let env = Env::start(cluster.kubeconfig_path(), "t-lifecycle").await?;
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
    let cluster = shared_cluster();
    let env = Env::start(cluster.kubeconfig_path(), "t-delete").await?;
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

async fn rs_vmis(env: &Env) -> Result<Vec<VirtualMachineInstance>> {
    let list = env
        .api::<VirtualMachineInstance>()
        .list(&ListParams::default().labels("app=web"))
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter(|v| v.metadata.deletion_timestamp.is_none())
        .collect())
}

#[tokio::test]
async fn replica_set_scales_up_and_down_also_with_kubectl_scale() -> Result<()> {
    let cluster = shared_cluster();
    let env = Env::start(cluster.kubeconfig_path(), "t-vmirs").await?;
    let pods = env.api::<Pod>();
    let rss = env.api::<VirtualMachineInstanceReplicaSet>();
    let manifest = r#"apiVersion: microvirt.io/v1alpha1
kind: VirtualMachineInstanceReplicaSet
metadata: {name: web}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      domain: {memory: {guest: 64Mi}}
"#;
    let (ok, _, err) = env.kubectl(&["apply", "-f", "-"], Some(manifest))?;
    assert!(ok, "{err}");
    let names = wait_for("3 replicas with pods", WAIT, || async {
        let v = rs_vmis(&env).await?;
        let mut names = BTreeSet::new();
        for x in &v {
            if pods
                .get_opt(&format!("virt-launcher-{}", x.name_any()))
                .await?
                .is_some()
            {
                names.insert(x.name_any());
            }
        }
        Ok((v.len() == 3 && names.len() == 3).then_some(names))
    })
    .await?;
    assert_eq!(
        names,
        BTreeSet::from([
            "web-0".to_string(),
            "web-1".to_string(),
            "web-2".to_string()
        ])
    );
    // Two of them become ready.
    for (n, ip) in [("web-0", "10.0.0.10"), ("web-2", "10.0.0.12")] {
        let p = format!("virt-launcher-{n}");
        bind(&pods, &p, "node-1").await?;
        mark_running(&pods, &p, ip, true).await?;
    }
    wait_for("readyReplicas 2", WAIT, || async {
        let rs = rss.get("web").await?;
        let st = rs.status.unwrap_or_default();
        Ok((st.ready_replicas == 2 && st.replicas == 3).then_some(()))
    })
    .await?;
    let rs = rss.get("web").await?;
    assert_eq!(
        rs.status.unwrap().label_selector.as_deref(),
        Some("app=web")
    );

    // kubectl scale through the scale subresource: the not-ready one (web-1) goes first,
    // then the newest ready one.
    let (ok, _, err) = env.kubectl(&["scale", "vmirs/web", "--replicas=1"], None)?;
    assert!(ok, "{err}");
    let left = wait_for("1 replica left", WAIT, || async {
        let v = rs_vmis(&env).await?;
        Ok((v.len() == 1).then_some(v))
    })
    .await?;
    let survivor = left[0].name_any();
    assert!(survivor == "web-0" || survivor == "web-2", "{survivor}");
    let (ok, out, _) = env.kubectl(&["get", "vmirs", "web"], None)?;
    assert!(ok);
    let header: Vec<&str> = out
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(header, vec!["NAME", "DESIRED", "CURRENT", "READY", "AGE"]);

    // Scale up through the Rust client's scale subresource.
    rss.patch_scale(
        "web",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"replicas": 2}})),
    )
    .await?;
    wait_for("2 replicas", WAIT, || async {
        Ok((rs_vmis(&env).await?.len() == 2).then_some(()))
    })
    .await?;

    // Paused: spec changes are not acted on.
    rss.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"paused": true, "replicas": 4}})),
    )
    .await?;
    wait_for("status paused", WAIT, || async {
        Ok((rss.get("web").await?.status.and_then(|s| s.paused) == Some(true)).then_some(()))
    })
    .await?;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert_eq!(rs_vmis(&env).await?.len(), 2);
    rss.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"paused": false}})),
    )
    .await?;
    wait_for("4 replicas after unpause", WAIT, || async {
        Ok((rs_vmis(&env).await?.len() == 4).then_some(()))
    })
    .await?;

    // Deleting the set deletes its VMIs, which delete their pods.
    rss.delete("web", &DeleteParams::default()).await?;
    wait_for("set, VMIs and pods gone", WAIT, || async {
        let rs = rss.get_opt("web").await?;
        let v = env
            .api::<VirtualMachineInstance>()
            .list(&ListParams::default().labels("app=web"))
            .await?;
        let p = pods.list(&ListParams::default()).await?;
        Ok((rs.is_none() && v.items.is_empty() && p.items.is_empty()).then_some(()))
    })
    .await?;
    Ok(())
}

async fn vm_status(env: &Env, name: &str) -> Result<Option<PrintableStatus>> {
    let vm: VirtualMachine = env.api().get(name).await?;
    Ok(vm.status.and_then(|s| s.printable_status))
}

async fn wait_vmi_uid(env: &Env, name: &str, not: Option<&str>) -> Result<String> {
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

#[tokio::test]
async fn vm_run_strategies() -> Result<()> {
    let cluster = shared_cluster();
    let env = Env::start(cluster.kubeconfig_path(), "t-vm").await?;
    let vms = env.api::<VirtualMachine>();
    let vmis = env.api::<VirtualMachineInstance>();
    let pods = env.api::<Pod>();
    let manifest = |name: &str, strategy: &str| {
        format!(
            r#"apiVersion: microvirt.io/v1alpha1
kind: VirtualMachine
metadata: {{name: {name}}}
spec:
  runStrategy: {strategy}
  template:
    metadata: {{labels: {{kind: vm}}}}
    spec: {{domain: {{memory: {{guest: 64Mi}}}}}}
"#
        )
    };
    // Always: a VMI is created; when it ends cleanly it is replaced by a new one.
    let (ok, _, err) = env.kubectl(&["apply", "-f", "-"], Some(&manifest("always", "Always")))?;
    assert!(ok, "{err}");
    let uid1 = wait_vmi_uid(&env, "always", None).await?;
    wait_pod(&env, "always").await?;
    bind(&pods, "virt-launcher-always", "node-1").await?;
    mark_running(&pods, "virt-launcher-always", "10.1.0.1", true).await?;
    wait_for("VM Running and ready", WAIT, || async {
        let vm = vms.get("always").await?;
        let st = vm.status.unwrap_or_default();
        Ok(
            (st.printable_status == Some(PrintableStatus::Running) && st.ready && st.created)
                .then_some(()),
        )
    })
    .await?;
    let (ok, out, _) = env.kubectl(&["get", "vm", "always"], None)?;
    assert!(ok);
    let header: Vec<&str> = out
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(header, vec!["NAME", "STATUS", "READY", "AGE"]);
    mark_terminated(&pods, "virt-launcher-always", 0, "guest powered off").await?;
    let uid2 = wait_vmi_uid(&env, "always", Some(&uid1)).await?;
    assert_ne!(uid1, uid2);
    let vmi2 = vmis.get("always").await?;
    assert_eq!(vmi2.labels().get("kind").map(String::as_str), Some("vm"));
    assert_eq!(
        vmi2.labels().get("microvirt.io/vm").map(String::as_str),
        Some("always")
    );

    // Halted: the VMI goes away and the VM shows Stopped.
    vms.patch(
        "always",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"runStrategy": "Halted"}})),
    )
    .await?;
    wait_for("VM stopped", WAIT, || async {
        let gone = vmis.get_opt("always").await?.is_none();
        Ok(
            (gone && vm_status(&env, "always").await? == Some(PrintableStatus::Stopped))
                .then_some(()),
        )
    })
    .await?;

    // RerunOnFailure: Failed → new VMI; Succeeded → kept.
    let (ok, _, err) = env.kubectl(
        &["apply", "-f", "-"],
        Some(&manifest("rerun", "RerunOnFailure")),
    )?;
    assert!(ok, "{err}");
    let uid1 = wait_vmi_uid(&env, "rerun", None).await?;
    wait_pod(&env, "rerun").await?;
    mark_terminated(&pods, "virt-launcher-rerun", 1, "crashed").await?;
    let uid2 = wait_vmi_uid(&env, "rerun", Some(&uid1)).await?;
    wait_for("new pod", WAIT, || async {
        Ok(pods
            .get_opt("virt-launcher-rerun")
            .await?
            .filter(|p| p.annotations().get(ANNOTATION_VMI_UID) == Some(&uid2)))
    })
    .await?;
    mark_terminated(&pods, "virt-launcher-rerun", 0, "done").await?;
    wait_phase(&env, "rerun", VmiPhase::Succeeded).await?;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let v = vmis.get("rerun").await?;
    assert_eq!(v.metadata.uid.as_deref(), Some(uid2.as_str()));
    assert_eq!(
        vm_status(&env, "rerun").await?,
        Some(PrintableStatus::Succeeded)
    );

    // Once: runs one VMI; after it failed and is deleted, nothing new is started.
    let (ok, _, err) = env.kubectl(&["apply", "-f", "-"], Some(&manifest("once", "Once")))?;
    assert!(ok, "{err}");
    wait_vmi_uid(&env, "once", None).await?;
    wait_pod(&env, "once").await?;
    mark_terminated(&pods, "virt-launcher-once", 2, "boom").await?;
    wait_phase(&env, "once", VmiPhase::Failed).await?;
    wait_for("once_ran recorded", WAIT, || async {
        let vm = vms.get("once").await?;
        Ok(vm.status.and_then(|s| s.once_ran_uid))
    })
    .await?;
    vmis.delete("once", &DeleteParams::default()).await?;
    wait_for("once VMI gone", WAIT, || async {
        Ok(vmis.get_opt("once").await?.is_none().then_some(()))
    })
    .await?;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert!(vmis.get_opt("once").await?.is_none());

    // Manual: nothing is created.
    let (ok, _, err) = env.kubectl(&["apply", "-f", "-"], Some(&manifest("manual", "Manual")))?;
    assert!(ok, "{err}");
    wait_for("manual VM status", WAIT, || async {
        vm_status(&env, "manual").await
    })
    .await?;
    assert!(vmis.get_opt("manual").await?.is_none());
    Ok(())
}

/// The VM's `status.startFailure` once it has `count` consecutive failures (and the printable
/// status is CrashLoopBackOff).
async fn wait_start_failure(
    env: &Env,
    vm: &str,
    count: i32,
) -> Result<microvirt_crds::VirtualMachineStartFailure> {
    let vms = env.api::<VirtualMachine>();
    wait_for(
        &format!("VM {vm} CrashLoopBackOff with consecutiveFailCount {count}"),
        WAIT,
        || async {
            let st = vms.get(vm).await?.status.unwrap_or_default();
            Ok(st
                .start_failure
                .filter(|f| f.consecutive_fail_count == count)
                .filter(|_| st.printable_status == Some(PrintableStatus::CrashLoopBackOff)))
        },
    )
    .await
}

/// The launcher pod of the VMI with `uid` (the pod of an earlier VMI has the same name).
async fn wait_pod_of(env: &Env, vmi: &str, uid: &str) -> Result<Pod> {
    let pods = env.api::<Pod>();
    let name = format!("virt-launcher-{vmi}");
    wait_for(&format!("pod {name} of VMI {uid}"), WAIT, || async {
        Ok(pods
            .get_opt(&name)
            .await?
            .filter(|p| p.annotations().get(ANNOTATION_VMI_UID).map(String::as_str) == Some(uid)))
    })
    .await
}

/// A VM whose VMIs crash before they run backs off as KubeVirt's: `status.startFailure` counts
/// the failures, `printableStatus` is CrashLoopBackOff, the next VMI comes only after
/// `retryAfterTimestamp` (longer after each failure), and a VMI that runs clears it all. (The
/// test operator's back-off starts at 1 s: `common::test_config`.)
#[tokio::test]
async fn vm_start_failures_back_off_until_a_vmi_runs() -> Result<()> {
    use k8s_openapi::jiff::Timestamp;
    let cluster = shared_cluster();
    let env = Env::start(cluster.kubeconfig_path(), "t-vm-crashloop").await?;
    let vms = env.api::<VirtualMachine>();
    let vmis = env.api::<VirtualMachineInstance>();
    let pods = env.api::<Pod>();
    let manifest = r#"apiVersion: microvirt.io/v1alpha1
kind: VirtualMachine
metadata: {name: crashy}
spec:
  runStrategy: Always
  template:
    spec: {domain: {memory: {guest: 64Mi}}}
"#;
    let (ok, _, err) = env.kubectl(&["apply", "-f", "-"], Some(manifest))?;
    assert!(ok, "{err}");
    let crash = "guest crashed: triple fault\nreason=GuestCrashed\nexitCode=1\n";
    // Seconds since the epoch, as the API server stores times.
    let secs = |t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time| t.0.as_second();

    // 1. The first VMI crashes before it runs: count 1, CrashLoopBackOff, and no new VMI
    //    before retryAfterTimestamp.
    let uid1 = wait_vmi_uid(&env, "crashy", None).await?;
    wait_pod_of(&env, "crashy", &uid1).await?;
    let failed1 = Timestamp::now().as_second();
    mark_terminated(&pods, "virt-launcher-crashy", 1, crash).await?;
    let f1 = wait_start_failure(&env, "crashy", 1).await?;
    assert_eq!(f1.last_failed_vmi_uid.as_deref(), Some(uid1.as_str()));
    let retry1 = secs(
        f1.retry_after_timestamp
            .as_ref()
            .context("retryAfterTimestamp")?,
    );
    let uid2 = wait_vmi_uid(&env, "crashy", Some(&uid1)).await?;
    let vmi2 = vmis.get("crashy").await?;
    let created2 = vmi2
        .metadata
        .creation_timestamp
        .as_ref()
        .map(secs)
        .context("creationTimestamp")?;
    assert!(
        created2 >= retry1,
        "VMI 2 created at {created2}, before retryAfterTimestamp {retry1}"
    );
    // Starting again; the record stays until a VMI runs.
    let st = vms.get("crashy").await?.status.unwrap_or_default();
    assert_eq!(
        st.start_failure.as_ref().map(|f| f.consecutive_fail_count),
        Some(1)
    );

    // 2. The second fails too, its launcher running (the VMI Running) but finding no kernel to
    //    boot, which counts as failed before the VM ran: count 2 and a longer wait (1 s × 2²
    //    plus jitter, at least 4 s, against 1 s plus jitter).
    wait_pod_of(&env, "crashy", &uid2).await?;
    bind(&pods, "virt-launcher-crashy", "node-1").await?;
    mark_running(&pods, "virt-launcher-crashy", "10.1.0.8", false).await?;
    wait_phase(&env, "crashy", VmiPhase::Running).await?;
    let failed2 = Timestamp::now().as_second();
    let no_kernel =
        "no bootable kernel: disk \"root\": no kernel\nreason=NoBootableKernel\nexitCode=3\n";
    mark_terminated(&pods, "virt-launcher-crashy", 3, no_kernel).await?;
    let f2 = wait_start_failure(&env, "crashy", 2).await?;
    assert_eq!(f2.last_failed_vmi_uid.as_deref(), Some(uid2.as_str()));
    let retry2 = secs(
        f2.retry_after_timestamp
            .as_ref()
            .context("retryAfterTimestamp")?,
    );
    let (wait1, wait2) = (retry1 - failed1, retry2 - failed2);
    assert!(
        wait2 >= 4 && wait2 > wait1,
        "waits {wait1} s then {wait2} s"
    );
    let uid3 = wait_vmi_uid(&env, "crashy", Some(&uid2)).await?;
    let created3 = vmis
        .get("crashy")
        .await?
        .metadata
        .creation_timestamp
        .as_ref()
        .map(secs)
        .context("creationTimestamp")?;
    assert!(
        created3 >= retry2,
        "VMI 3 created at {created3}, before retryAfterTimestamp {retry2}"
    );

    // 3. The third runs: startFailure is cleared and the VM is Running.
    wait_pod_of(&env, "crashy", &uid3).await?;
    bind(&pods, "virt-launcher-crashy", "node-1").await?;
    mark_running(&pods, "virt-launcher-crashy", "10.1.0.9", true).await?;
    wait_for("VM Running without startFailure", WAIT, || async {
        let st = vms.get("crashy").await?.status.unwrap_or_default();
        Ok(
            (st.printable_status == Some(PrintableStatus::Running) && st.start_failure.is_none())
                .then_some(()),
        )
    })
    .await?;
    Ok(())
}

/// Writes `requests` into the VM's `status.stateChangeRequests`, as `kubectl microvirt
/// start/stop/restart` do (merge patch of the status subresource).
async fn request(env: &Env, vm: &str, requests: serde_json::Value) -> Result<()> {
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
    let cluster = shared_cluster();
    let env = Env::start(cluster.kubeconfig_path(), "t-vm-requests").await?;
    let vms = env.api::<VirtualMachine>();
    let vmis = env.api::<VirtualMachineInstance>();
    let manifest = |name: &str, strategy: &str| {
        format!(
            "apiVersion: microvirt.io/v1alpha1\nkind: VirtualMachine\nmetadata: {{name: {name}}}\n\
             spec:\n  runStrategy: {strategy}\n  template:\n    spec: {{domain: {{memory: {{guest: 64Mi}}}}}}\n"
        )
    };
    for (name, strategy) in [
        ("man", "Manual"),
        ("always", "Always"),
        ("rerun", "RerunOnFailure"),
    ] {
        let (ok, _, err) = env.kubectl(&["apply", "-f", "-"], Some(&manifest(name, strategy)))?;
        assert!(ok, "{err}");
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
        Some(microvirt_operator::virtualmachine::stable_firmware_uuid("always").as_str())
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

#[tokio::test]
async fn presets_apply_once_with_conflicts_reported() -> Result<()> {
    let cluster = shared_cluster();
    let env = Env::start(cluster.kubeconfig_path(), "t-preset").await?;
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
    let (ok, _, err) = env.kubectl(&["apply", "-f", "-"], Some(preset))?;
    assert!(ok, "{err}");
    wait_for("preset cached", WAIT, || async {
        Ok(presets.get_opt("small").await?)
    })
    .await?;
    // Give the operator's preset watch a moment to see it.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;

    // The VMI sets memory itself (128Mi) and no cores... but vmi() sets cores: 1, so build one
    // without cpu.
    let yaml = vmi_yaml("sized", "size: small").replace("    cpu: {cores: 1}\n", "");
    let (ok, _, err) = env.kubectl(&["apply", "-f", "-"], Some(&yaml))?;
    assert!(ok, "{err}");
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

#[tokio::test]
async fn a_launcher_pod_the_api_server_refuses_fails_the_vmi() -> Result<()> {
    let cluster = shared_cluster();
    let env = Env::start(cluster.kubeconfig_path(), "t-refused").await?;
    // The CRD accepts any nodeSelector map; pod validation refuses this label key.
    let yaml = vmi_yaml("refused", "").replace(
        "spec:\n  domain:",
        "spec:\n  nodeSelector: {\"not a/valid/key\": x}\n  domain:",
    );
    let (ok, _, err) = env.kubectl(&["apply", "-f", "-"], Some(&yaml))?;
    assert!(ok, "{err}");
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

/// Simulated kubelet: the pod was evicted (node pressure or shutdown), its compute container
/// exited 0 with `message`; the pod object stays (phase Failed, reason Evicted).
async fn mark_evicted(pods: &kube::Api<Pod>, name: &str, message: &str) -> Result<()> {
    let now = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let status = json!({
        "status": {
            "phase": "Failed",
            "reason": "Evicted",
            "message": "The node was low on resource: memory.",
            "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now}],
            "containerStatuses": [{
                "name": "compute",
                "image": "microvirt/virt-launcher:dev",
                "imageID": "sha256:0000",
                "ready": false,
                "restartCount": 0,
                "started": false,
                "state": {"terminated": {
                    "exitCode": 0, "reason": "Completed", "message": message,
                    "startedAt": now, "finishedAt": now,
                }},
            }],
        }
    });
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

/// KubeVirt's rule for `RerunOnFailure`: a VMI is re-created unless its guest stopped by itself.
/// A drain (pod deleted: the kubelet SIGTERMs the launcher, which shuts the guest down cleanly
/// and exits 0) and a kubelet eviction must therefore fail the VMI, not make it Succeeded.
#[tokio::test]
async fn rerun_on_failure_vms_come_back_after_a_drain_or_an_eviction() -> Result<()> {
    use microvirt_crds::termination::{ShutdownOrigin, TerminationMessage};
    let cluster = shared_cluster();
    let env = Env::start(cluster.kubeconfig_path(), "t-drain").await?;
    let vmis = env.api::<VirtualMachineInstance>();
    let pods = env.api::<Pod>();
    let manifest = r#"apiVersion: microvirt.io/v1alpha1
kind: VirtualMachine
metadata: {name: web}
spec:
  runStrategy: RerunOnFailure
  template:
    spec: {domain: {memory: {guest: 64Mi}}}
"#;
    let (ok, _, err) = env.kubectl(&["apply", "-f", "-"], Some(manifest))?;
    assert!(ok, "{err}");
    let pod_name = "virt-launcher-web";
    // What the launcher writes when the kubelet's SIGTERM made it shut the guest down.
    let asked = TerminationMessage {
        message: "guest reset after the shutdown request".into(),
        reason: Some("GuestShutdown".into()),
        exit_code: Some(0),
        boot_time_ms: Some(7),
        shutdown_requested: Some(ShutdownOrigin::Signal),
    }
    .render();
    let start_pod = |uid: String| {
        let pods = pods.clone();
        async move {
            wait_for("the VMI's launcher pod", WAIT, || async {
                Ok(pods
                    .get_opt(pod_name)
                    .await?
                    .filter(|p| p.annotations().get(ANNOTATION_VMI_UID) == Some(&uid)))
            })
            .await?;
            bind(&pods, pod_name, "node-1").await?;
            mark_running(&pods, pod_name, "10.4.0.1", true).await
        }
    };
    // Watches from `rv` (read before the failure is caused) for the VMI `uid` in phase Failed.
    // A poll can miss that state: RerunOnFailure deletes the Failed VMI and creates the next
    // one within milliseconds once nothing holds the pod, so only a watch sees every version.
    let wait_failed = |uid: String, rv: String| {
        let vmis = vmis.clone();
        async move {
            use futures::{StreamExt, TryStreamExt};
            use kube::api::{WatchEvent, WatchParams};
            let wp = WatchParams::default()
                .fields("metadata.name=web")
                .timeout(WAIT.as_secs() as u32);
            let mut events = vmis.watch(&wp, &rv).await?.boxed();
            while let Some(ev) = events.try_next().await? {
                let v = match ev {
                    WatchEvent::Added(v) | WatchEvent::Modified(v) | WatchEvent::Deleted(v) => v,
                    WatchEvent::Bookmark(_) => continue,
                    WatchEvent::Error(e) => anyhow::bail!("watch error: {e:?}"),
                };
                if v.metadata.uid.as_deref() != Some(uid.as_str()) {
                    continue;
                }
                match v.phase() {
                    Some(VmiPhase::Succeeded) => anyhow::bail!("VMI Succeeded: {:?}", v.status),
                    Some(VmiPhase::Failed) => return Ok(v.status),
                    _ => {}
                }
            }
            anyhow::bail!("watch ended after {WAIT:?} without the VMI {uid} Failed")
        }
    };
    let rv_of = |uid: String| {
        let vmis = vmis.clone();
        async move {
            let v = vmis.get("web").await?;
            anyhow::ensure!(
                v.metadata.uid.as_deref() == Some(uid.as_str()),
                "VMI replaced early"
            );
            Ok::<_, anyhow::Error>(v.metadata.resource_version.unwrap_or_default())
        }
    };

    // 1. Drain: the pod is deleted. A real kubelet reports the container's exit before the pod
    //    object goes away; a finalizer holds the object so the operator sees that report.
    let uid1 = wait_vmi_uid(&env, "web", None).await?;
    start_pod(uid1.clone()).await?;
    pods.patch(
        pod_name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"finalizers": ["microvirt.io/test-hold"]}})),
    )
    .await?;
    let rv = rv_of(uid1.clone()).await?;
    pods.delete(pod_name, &DeleteParams::default()).await?;
    mark_terminated(&pods, pod_name, 0, &asked).await?;
    let st = wait_failed(uid1.clone(), rv).await?.unwrap_or_default();
    assert_eq!(st.reason.as_deref(), Some("LauncherStopped"), "{st:?}");
    assert_eq!(st.boot_time_ms, Some(7));
    pods.patch(
        pod_name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    let uid2 = wait_vmi_uid(&env, "web", Some(&uid1)).await?;

    // 2. Eviction by the kubelet: the pod object stays, phase Failed.
    start_pod(uid2.clone()).await?;
    let rv = rv_of(uid2.clone()).await?;
    mark_evicted(&pods, pod_name, &asked).await?;
    let st = wait_failed(uid2.clone(), rv).await?.unwrap_or_default();
    assert_eq!(
        st.message.as_deref(),
        Some("Evicted: guest reset after the shutdown request"),
        "{st:?}"
    );
    let uid3 = wait_vmi_uid(&env, "web", Some(&uid2)).await?;

    // 3. The guest powered off by itself: Succeeded, and the VM stays down.
    start_pod(uid3.clone()).await?;
    let chose = TerminationMessage {
        message: "guest powered off".into(),
        reason: Some("GuestShutdown".into()),
        exit_code: Some(0),
        ..Default::default()
    }
    .render();
    mark_terminated(&pods, pod_name, 0, &chose).await?;
    wait_phase(&env, "web", VmiPhase::Succeeded).await?;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let v = vmis.get("web").await?;
    assert_eq!(v.metadata.uid.as_deref(), Some(uid3.as_str()));
    assert_eq!(v.phase(), Some(VmiPhase::Succeeded));
    Ok(())
}
