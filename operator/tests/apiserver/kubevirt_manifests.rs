//! KubeVirt-style manifests (`tests/manifests/kubevirt/`, apiVersion changed to
//! `microvirt.io/v1alpha1`) against the real API server: each is accepted, or refused with the
//! message that names the field and says why (`microvirt_crds::refusals`), never with `unknown
//! field`. And the operator applies KubeVirt's defaults: a VMI without interfaces gets the pod
//! network, a volume that no disk names gets a disk.
//!
//! KubeVirt's own examples are counted by `cargo run -p microvirt-operator --example
//! count_kubevirt_examples -- DIR` (tests never read files outside the repository).

use std::path::{Path, PathBuf};

use crate::common::*;
use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use microvirt_crds::refusals;
use microvirt_crds::{VirtualMachineInstance, VmiPhase};
use serde_json::json;

fn manifest_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/manifests/kubevirt")
}

/// What the API server does with each manifest: `[]` accepts it, else each `(path, message)`
/// is one refusal, reported as `<path>: Invalid value: ...: <message>`.
fn expected(file: &str) -> Option<Vec<(&'static str, &'static str)>> {
    let e = match file {
        "vmi-cirros.yaml"
        | "vmi-volumes-only.yaml"
        | "vmi-hostname-bootorder.yaml"
        | "vmi-efi-q35.yaml"
        | "vmi-isolated.yaml"
        | "vmi-masquerade-ports.yaml"
        | "vmi-probes.yaml"
        | "vmi-probes-forwarded.yaml"
        | "vm-priorityclass.yaml"
        | "vmirs-cirros.yaml"
        | "vmipreset-small.yaml"
        | "vmi-start-paused.yaml"
        | "vmpool-kubevirt.yaml"
        | "vm-instancetype.yaml"
        | "vminstancetype-large.yaml"
        | "vmpreference-virtio.yaml"
        | "vmi-user-guide-tuning.yaml" => vec![],
        "vmi-sriov.yaml" => vec![
            ("spec.domain.devices.interfaces[1].sriov", refusals::SRIOV),
            ("spec.networks[1].multus", refusals::MULTUS),
        ],
        "vmi-multus.yaml" => vec![("spec.networks[0].multus", refusals::MULTUS)],
        "vmi-gpu.yaml" => vec![("spec.domain.devices.gpus", refusals::GPUS)],
        "vmi-dra.yaml" => vec![
            ("spec.resourceClaims", refusals::RESOURCE_CLAIMS),
            ("spec.domain.devices.gpus", refusals::GPUS),
        ],
        "vmi-usb.yaml" => vec![("spec.domain.devices.hostDevices", refusals::HOST_DEVICES)],
        "vmi-host-disk.yaml" => vec![("spec.volumes[0].hostDisk", refusals::HOST_DISK)],
        "vmi-secureboot.yaml" => {
            vec![("spec.domain.firmware.bootloader.efi", refusals::SECURE_BOOT)]
        }
        "vmi-windows.yaml" => vec![
            ("spec.domain.devices.tpm", refusals::TPM),
            ("spec.domain.features.hyperv", refusals::HYPERV),
            ("spec.domain.firmware.bootloader.efi", refusals::SECURE_BOOT),
            (
                "spec.domain.devices.interfaces[0].model",
                refusals::INTERFACE_MODEL,
            ),
        ],
        "vmi-unsupported-devices.yaml" => vec![
            ("spec.evictionStrategy", refusals::EVICTION_STRATEGY),
            ("spec.domain.memory.hugepages", refusals::HUGEPAGES),
            ("spec.domain.devices.disks[1].cdrom", refusals::CDROM),
            ("spec.domain.devices.disks[2].lun", refusals::LUN),
            ("spec.domain.devices.filesystems", refusals::FILESYSTEMS),
            ("spec.domain.devices.interfaces[0].passt", refusals::PASST),
            (
                "spec.networks[0].pod.vmNetworkCIDR",
                refusals::VM_NETWORK_CIDR,
            ),
            ("spec.volumes[3].configMap", refusals::VOLUME_SOURCE),
        ],
        "vmi-user-guide-refused.yaml" => vec![
            (
                "spec.dnsConfig",
                "dnsPolicy: None needs dnsConfig.nameservers",
            ),
            ("spec.domain.chassis", refusals::CHASSIS),
            ("spec.domain.firmware.serial", refusals::FIRMWARE_SERIAL),
            ("spec.domain.cpu.model", refusals::CPU_MODEL),
            ("spec.domain.cpu.features", refusals::CPU_FEATURES),
            ("spec.domain.cpu.numa", refusals::NUMA),
            ("spec.domain.features.kvm.hidden", refusals::KVM_HIDDEN),
            ("spec.domain.devices.watchdog", refusals::WATCHDOG),
            ("spec.domain.devices.sound", refusals::SOUND),
            (
                "spec.domain.devices.disks[0].cache",
                refusals::DISK_CACHE_WRITETHROUGH,
            ),
            (
                "spec.domain.devices.disks[1].shareable",
                refusals::SHAREABLE,
            ),
            (
                "spec.volumes[1].persistentVolumeClaim.hotpluggable",
                refusals::HOTPLUG,
            ),
            ("spec.volumes[2].downwardMetrics", refusals::VOLUME_SOURCE),
            ("spec.volumes[3].memoryDump", refusals::VOLUME_SOURCE),
        ],
        "vmipreset-refused.yaml" => vec![
            ("spec.domain.chassis", refusals::CHASSIS),
            ("spec.domain.devices.watchdog", refusals::WATCHDOG),
        ],
        "vm-instancetype-inferred.yaml" => vec![
            (
                "spec.instancetype.inferFromVolume",
                refusals::INFER_FROM_VOLUME,
            ),
            ("spec.preference.kind", refusals::PREFERENCE_KIND),
        ],
        "vmpreference-refused.yaml" => vec![
            ("spec.clock", refusals::PREFERRED_CLOCK),
            ("spec.features", refusals::PREFERRED_FEATURES),
            ("spec.firmware", refusals::PREFERRED_FIRMWARE),
            (
                "spec.cpu.preferredCPUTopology",
                refusals::PREFERRED_CPU_TOPOLOGY,
            ),
            (
                "spec.devices.preferredDiskBus",
                refusals::PREFERRED_DISK_BUS,
            ),
            (
                "spec.devices.preferredInterfaceModel",
                refusals::PREFERRED_INTERFACE_MODEL,
            ),
            ("spec.devices.preferredTPM", refusals::PREFERRED_TPM),
        ],
        "vmpool-kubevirt-instancetype.yaml" => vec![
            (
                "spec.virtualMachineTemplate.spec.instancetype",
                refusals::POOL_INSTANCETYPE,
            ),
            (
                "spec.virtualMachineTemplate.spec.preference",
                refusals::POOL_PREFERENCE,
            ),
        ],
        "vm-datavolume.yaml" => vec![
            ("spec.dataVolumeTemplates", refusals::DATA_VOLUME_TEMPLATES),
            (
                "spec.template.spec.volumes[0].dataVolume",
                refusals::DATA_VOLUME,
            ),
        ],
        "vm-sidecar-hook.yaml" => vec![(
            "spec.template.metadata.annotations",
            refusals::HOOK_SIDECARS,
        )],
        "vmpool-kubevirt-halted.yaml" => vec![(
            "spec.virtualMachineTemplate.spec.runStrategy",
            refusals::POOL_VM_RUN_STRATEGY,
        )],
        "vmi-probes-guest-agent.yaml" => vec![
            ("spec.readinessProbe.exec", refusals::PROBE_EXEC),
            (
                "spec.livenessProbe.guestAgentPing",
                refusals::PROBE_GUEST_AGENT_PING,
            ),
        ],
        "vmi-probes-invalid.yaml" => vec![
            ("spec.readinessProbe", refusals::PROBE_NO_HANDLER),
            (
                "spec.livenessProbe.successThreshold",
                refusals::LIVENESS_SUCCESS_THRESHOLD,
            ),
            ("spec", refusals::PROBE_WITHOUT_NIC),
        ],
        "vmi-probes-masquerade-ports.yaml" => {
            vec![("spec.livenessProbe", refusals::PROBE_PORT_NOT_FORWARDED)]
        }
        "vmpool-warm-probes.yaml" => {
            vec![("spec.template.spec", refusals::POOL_WARM_PROBES)]
        }
        "vmpool-warm-start-paused.yaml" => vec![(
            "spec.template.spec.startStrategy",
            refusals::POOL_WARM_START_STRATEGY,
        )],
        _ => return None,
    };
    Some(e)
}

#[test]
fn kubevirt_style_manifests_are_accepted_or_refused_with_a_reason() -> Result<()> {
    let kc = shared_cluster().kubeconfig_path();
    let ns = "t-kubevirt-manifests";
    let _ = kubectl(kc, &["create", "namespace", ns], None)?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(manifest_dir())?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    files.retain(|p| p.extension().is_some_and(|e| e == "yaml"));
    files.sort();
    assert!(files.len() >= 20, "manifests missing: {files:?}");
    let mut failures = Vec::new();
    for path in &files {
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let want =
            expected(&file).with_context(|| format!("{file}: no expectation in expected()"))?;
        let yaml = std::fs::read_to_string(path)?;
        assert!(yaml.contains("apiVersion: microvirt.io/v1alpha1"), "{file}");
        // Server-side dry run: the API server's whole validation, nothing stored; kubectl's
        // strict field validation turns any unknown field into an error.
        let (ok, out, err) = kubectl(
            kc,
            &["-n", ns, "create", "--dry-run=server", "-f", "-"],
            Some(&yaml),
        )?;
        if err.contains("unknown field") {
            failures.push(format!("{file}: unknown field: {err}"));
            continue;
        }
        if want.is_empty() {
            if !ok {
                failures.push(format!("{file}: refused: {err}"));
            }
            continue;
        }
        if ok {
            failures.push(format!("{file}: accepted, wanted a refusal: {out}"));
            continue;
        }
        for (field, msg) in &want {
            // `<path>: Invalid value: "<type>": <message>`.
            let refused_here =
                err.split(&format!("{field}: Invalid value: "))
                    .skip(1)
                    .any(|rest| {
                        rest.split_once(": ")
                            .is_some_and(|(_, m)| m.starts_with(msg))
                    });
            if !refused_here {
                failures.push(format!(
                    "{file}: wanted {field:?} refused with {msg:?}; kubectl said {err}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    Ok(())
}

async fn launcher_doc(env: &Env, vmi: &str) -> Result<serde_json::Value> {
    let pods = env.api::<Pod>();
    let name = format!("virt-launcher-{vmi}");
    let pod = wait_for(&format!("pod {name}"), WAIT, || async {
        Ok(pods.get_opt(&name).await?)
    })
    .await?;
    let doc = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("microvirt.io/vmi-spec"))
        .context("the pod has no VMI document")?;
    Ok(serde_json::from_str(doc)?)
}

#[tokio::test]
async fn kubevirt_defaults_the_pod_network_and_a_disk_per_volume() -> Result<()> {
    let env = Env::start_shared("t-kubevirt-defaults").await?;
    let yaml = std::fs::read_to_string(manifest_dir().join("vmi-cirros.yaml"))?;
    let (ok, _, err) = env.kubectl(&["create", "-f", "-"], Some(&yaml))?;
    assert!(ok, "{err}");
    let doc = launcher_doc(&env, "vmi-cirros").await?;
    assert_eq!(
        doc["spec"]["domain"]["devices"]["interfaces"],
        json!([{"name": "default", "masquerade": {}}])
    );
    assert_eq!(
        doc["spec"]["networks"],
        json!([{"name": "default", "pod": {}}])
    );
    // The VMI keeps its spec; its status names the interface with the pod IP.
    let pods = env.api::<Pod>();
    bind(&pods, "virt-launcher-vmi-cirros", "node-1").await?;
    mark_running(&pods, "virt-launcher-vmi-cirros", "10.9.0.7", false).await?;
    let vmis = env.api::<VirtualMachineInstance>();
    let v = wait_for("vmi-cirros with its interface in status", WAIT, || async {
        let v = vmis.get("vmi-cirros").await?;
        let named = v
            .status
            .as_ref()
            .and_then(|s| s.interfaces.first())
            .is_some_and(|i| i.ip_address.is_some());
        Ok(named.then_some(v))
    })
    .await?;
    let iface = &v.status.as_ref().unwrap().interfaces[0];
    assert_eq!(iface.name.as_deref(), Some("default"));
    assert_eq!(iface.ip_address.as_deref(), Some("10.9.0.7"));
    assert!(v.spec.networks.is_empty());

    // autoattachPodInterface: false: no NIC.
    let off = yaml
        .replace("name: vmi-cirros", "name: vmi-no-nic")
        .replace(
            "      rng: {}\n",
            "      rng: {}\n      autoattachPodInterface: false\n",
        );
    let (ok, _, err) = env.kubectl(&["create", "-f", "-"], Some(&off))?;
    assert!(ok, "{err}");
    let doc = launcher_doc(&env, "vmi-no-nic").await?;
    assert!(
        doc["spec"]["domain"]["devices"].get("interfaces").is_none(),
        "{doc}"
    );
    assert!(doc["spec"].get("networks").is_none(), "{doc}");

    // A VMI's own annotations are beyond the CRD's CEL rules: the operator refuses sidecar
    // hooks with the same message as the templates' rule.
    let hooked = yaml.replace("name: vmi-cirros", "name: vmi-hooked").replace(
        "  labels:\n",
        "  annotations:\n    hooks.kubevirt.io/hookSidecars: '[{\"image\": \"registry.example/hook:v1\"}]'\n  labels:\n",
    );
    let (ok, _, err) = env.kubectl(&["create", "-f", "-"], Some(&hooked))?;
    assert!(ok, "{err}");
    let v = wait_for("vmi-hooked Failed", WAIT, || async {
        let v = vmis.get("vmi-hooked").await?;
        Ok((v.phase() == Some(VmiPhase::Failed)).then_some(v))
    })
    .await?;
    let st = v.status.unwrap();
    assert_eq!(st.reason.as_deref(), Some("InvalidSpec"));
    assert_eq!(st.message.as_deref(), Some(refusals::HOOK_SIDECARS));
    assert!(pods.get_opt("virt-launcher-vmi-hooked").await?.is_none());

    // Volumes that no disk names get a disk each, in order, as in KubeVirt.
    let yaml = std::fs::read_to_string(manifest_dir().join("vmi-volumes-only.yaml"))?;
    let (ok, _, err) = env.kubectl(&["create", "-f", "-"], Some(&yaml))?;
    assert!(ok, "{err}");
    let doc = launcher_doc(&env, "vmi-volumes-only").await?;
    assert_eq!(
        doc["spec"]["domain"]["devices"]["disks"],
        json!([{"name": "containerdisk"}, {"name": "cloudinitdisk"}])
    );
    Ok(())
}

#[tokio::test]
async fn a_kubevirt_pool_makes_vmis_from_its_vm_templates_vmi_template() -> Result<()> {
    let env = Env::start_shared("t-kubevirt-pool").await?;
    let yaml = std::fs::read_to_string(manifest_dir().join("vmpool-kubevirt.yaml"))?
        .replace("replicas: 0", "replicas: 2");
    let (ok, _, err) = env.kubectl(&["create", "-f", "-"], Some(&yaml))?;
    assert!(ok, "{err}");
    let vmis = env.api::<VirtualMachineInstance>();
    let l = ListParams::default().labels("kubevirt.io/vmpool=vmpool-kubevirt");
    let made = wait_for("2 VMIs of vmpool-kubevirt", WAIT, || async {
        let list = vmis.list(&l).await?.items;
        Ok((list.len() == 2).then_some(list))
    })
    .await?;
    for v in &made {
        let name = v.metadata.name.as_deref().unwrap_or_default();
        assert!(name.starts_with("vmpool-kubevirt-"), "{name}");
        // The VMI template inside the VM template, as written.
        let guest = v.spec.domain.memory.as_ref().and_then(|m| m.guest.as_ref());
        assert_eq!(guest.map(|q| q.0.as_str()), Some("128Mi"), "{name}");
        assert_eq!(
            v.spec.volumes[0]
                .container_disk
                .as_ref()
                .map(|c| c.image.as_str()),
            Some("registry.example/demo/cirros-disk:v1"),
            "{name}"
        );
    }
    Ok(())
}

/// Whether the VMI's `Ready` condition is `True`.
fn vmi_ready(v: &VirtualMachineInstance) -> bool {
    v.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

#[tokio::test]
async fn kubevirt_probes_become_the_launcher_probes_and_decide_ready_and_liveness() -> Result<()> {
    use kube::api::{Patch, PatchParams};
    use microvirt_crds::termination::{ShutdownOrigin, TerminationMessage};

    let env = Env::start_shared("t-kubevirt-probes").await?;
    let yaml = std::fs::read_to_string(manifest_dir().join("vmi-probes.yaml"))?;
    let (ok, _, err) = env.kubectl(&["create", "-f", "-"], Some(&yaml))?;
    assert!(ok, "{err}");
    let pods = env.api::<Pod>();
    let name = "virt-launcher-vmi-probes";
    let pod = wait_for("the launcher pod", WAIT, || async {
        Ok(pods.get_opt(name).await?)
    })
    .await?;
    // The kubelet runs the VMI's probes as the compute container's, against the pod IP (with the
    // API server's defaults: scheme HTTP, successThreshold 1).
    let spec = serde_json::to_value(pod.spec.as_ref().unwrap())?;
    let c = &spec["containers"][0];
    assert_eq!(c["name"], "compute");
    assert_eq!(
        c["readinessProbe"],
        json!({
            "httpGet": {
                "port": 1500, "path": "/healthz", "scheme": "HTTP",
                "httpHeaders": [{"name": "X-Probe", "value": "readiness"}]
            },
            "initialDelaySeconds": 120, "periodSeconds": 20, "timeoutSeconds": 10,
            "failureThreshold": 3, "successThreshold": 3
        })
    );
    assert_eq!(
        c["livenessProbe"],
        json!({
            "tcpSocket": {"port": 1500},
            "initialDelaySeconds": 120, "periodSeconds": 20, "timeoutSeconds": 10,
            "failureThreshold": 3, "successThreshold": 1
        })
    );

    // The VM runs (the node agent's gate is True) but the readiness probe has not passed
    // (ContainersReady False): the VMI is not Ready; once it passes, it is.
    bind(&pods, name, "node-1").await?;
    mark_running(&pods, name, "10.9.0.8", true).await?;
    let vmis = env.api::<VirtualMachineInstance>();
    let conditions = |containers_ready: &str| {
        let now = now_rfc3339();
        json!({"status": {"conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            {"type": "Ready", "status": containers_ready, "lastTransitionTime": now},
            {"type": "ContainersReady", "status": containers_ready, "lastTransitionTime": now},
            {"type": "microvirt.io/vm-running", "status": "True", "reason": "VMRunning", "lastTransitionTime": now},
        ]}})
    };
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&conditions("False")),
    )
    .await?;
    wait_for("vmi-probes Running, not Ready", WAIT, || async {
        let v = vmis.get("vmi-probes").await?;
        Ok((v.phase() == Some(VmiPhase::Running)
            && !vmi_ready(&v)
            && v.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "False")
            }))
        .then_some(()))
    })
    .await?;
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&conditions("True")),
    )
    .await?;
    wait_for("vmi-probes Ready", WAIT, || async {
        let v = vmis.get("vmi-probes").await?;
        Ok(vmi_ready(&v).then_some(()))
    })
    .await?;

    // The liveness probe failed: the kubelet stopped the launcher (SIGTERM; the guest powered
    // off) and, with restartPolicy Never, the pod ended. The VMI fails, as in KubeVirt.
    let message = TerminationMessage {
        message: "guest powered off after the shutdown request".into(),
        reason: Some("GuestShutdown".into()),
        exit_code: Some(0),
        boot_time_ms: None,
        shutdown_requested: Some(ShutdownOrigin::Signal),
    }
    .render();
    mark_terminated(&pods, name, 0, &message).await?;
    let v = wait_for("vmi-probes Failed", WAIT, || async {
        let v = vmis.get("vmi-probes").await?;
        Ok((v.phase() == Some(VmiPhase::Failed)).then_some(v))
    })
    .await?;
    let st = v.status.unwrap();
    assert_eq!(st.reason.as_deref(), Some("LivenessProbeFailed"));
    assert_eq!(
        st.message.as_deref(),
        Some("livenessProbe failed, the kubelet stopped the launcher: guest powered off after the shutdown request")
    );
    Ok(())
}
