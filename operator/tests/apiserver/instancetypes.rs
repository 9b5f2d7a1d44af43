//! Instancetypes and preferences against a real kube-apiserver: a VM's instancetype and
//! preference are expanded into its VMI, captured in ControllerRevisions at the first start
//! (later edits of the instancetype do not change the VM), a template that sets what the
//! instancetype sets is refused with a `Failure` condition naming the field, and a missing
//! instancetype is waited for.

use crate::common::*;
use anyhow::{Context as _, Result};
use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams};
use microvirt_crds::vmi::DiskBus;
use microvirt_crds::{
    VirtualMachine, VirtualMachineCondition, VirtualMachineInstance, VirtualMachineInstanceSpec,
};
use serde_json::json;

/// A VM named `name` (runStrategy Always) with `refs` (its instancetype and preference
/// references, YAML lines at the spec's indentation) and `domain` (YAML flow mapping).
fn typed_vm_yaml(name: &str, refs: &str, domain: &str) -> String {
    format!(
        r#"apiVersion: microvirt.io/v1alpha1
kind: VirtualMachine
metadata: {{name: {name}}}
spec:
  runStrategy: Always
{refs}
  template:
    spec:
      domain: {domain}
      volumes:
      - name: root
        containerDisk: {{image: registry.example/demo/disk:v1}}
"#
    )
}

/// The VMI `name` once it exists (not being deleted) and differs from uid `not`.
async fn wait_vmi(env: &Env, name: &str, not: Option<&str>) -> Result<VirtualMachineInstance> {
    let vmis = env.api::<VirtualMachineInstance>();
    wait_for(&format!("VMI {name} (uid != {not:?})"), WAIT, || async {
        Ok(vmis.get_opt(name).await?.filter(|v| {
            v.metadata.deletion_timestamp.is_none() && v.metadata.uid.as_deref() != not
        }))
    })
    .await
}

/// `(sockets, cores, threads, memory.guest)` of a VMI spec.
fn size(s: &VirtualMachineInstanceSpec) -> (Option<u32>, Option<u32>, Option<u32>, String) {
    let cpu = s.domain.cpu.clone().unwrap_or_default();
    let mem = s
        .domain
        .memory
        .as_ref()
        .and_then(|m| m.guest.as_ref())
        .map(|q| q.0.clone())
        .unwrap_or_default();
    (cpu.sockets, cpu.cores, cpu.threads, mem)
}

/// The VM's `Failure` condition once its message contains `needle`.
async fn wait_failure(env: &Env, vm: &str, needle: &str) -> Result<VirtualMachineCondition> {
    let vms = env.api::<VirtualMachine>();
    wait_for(&format!("VM {vm} Failure {needle:?}"), WAIT, || async {
        let v = vms.get(vm).await?;
        Ok(v.status
            .unwrap_or_default()
            .conditions
            .into_iter()
            .find(|c| {
                c.type_ == "Failure"
                    && c.status == "True"
                    && c.message.as_deref().is_some_and(|m| m.contains(needle))
            }))
    })
    .await
}

#[tokio::test]
async fn instancetype_and_preference_are_expanded_and_captured_at_the_first_start() -> Result<()> {
    let env = Env::start_shared("t-instancetype").await?;
    let objects = r#"apiVersion: microvirt.io/v1alpha1
kind: VirtualMachineInstancetype
metadata: {name: medium}
spec:
  cpu: {guest: 2}
  memory: {guest: 256Mi}
---
apiVersion: microvirt.io/v1alpha1
kind: VirtualMachinePreference
metadata: {name: virtio-cores}
spec:
  cpu: {preferredCPUTopology: cores}
  devices: {preferredDiskBus: virtio}
"#;
    env.apply(objects)?;
    let refs = "  instancetype: {kind: VirtualMachineInstancetype, name: medium}\n  preference: {kind: virtualmachinepreferences, name: virtio-cores}";
    let domain = "{devices: {disks: [{name: root, disk: {}}]}}";
    env.apply(&typed_vm_yaml("sized", refs, domain))?;

    // The VMI has the instancetype's size, laid out as the preference prefers, and the
    // preference's disk bus.
    let vmi = wait_vmi(&env, "sized", None).await?;
    assert_eq!(size(&vmi.spec), (Some(1), Some(2), Some(1), "256Mi".into()));
    assert_eq!(vmi.spec.vcpus(), 2);
    let disk = &vmi.spec.domain.devices.as_ref().unwrap().disks[0];
    assert_eq!(disk.disk.as_ref().unwrap().bus, Some(DiskBus::Virtio));
    // The launcher pod is sized from it.
    let pods = env.api::<Pod>();
    wait_for("launcher pod of sized", WAIT, || async {
        Ok(pods.get_opt("virt-launcher-sized").await?)
    })
    .await?;

    // Both captured in ControllerRevisions owned by the VM, named in its spec.
    let vms = env.api::<VirtualMachine>();
    let vm = wait_for("revision names in the VM's spec", WAIT, || async {
        let vm = vms.get("sized").await?;
        let named = revisions_recorded(&vm);
        Ok(named.then_some(vm))
    })
    .await?;
    let revisions = env.api::<ControllerRevision>();
    let it_rev = vm
        .spec
        .instancetype
        .as_ref()
        .unwrap()
        .revision_name
        .clone()
        .unwrap();
    let rev = revisions.get(&it_rev).await?;
    let owner = &rev.metadata.owner_references.as_ref().context("owner")?[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("VirtualMachine", "sized")
    );
    assert_eq!(owner.uid, vm.metadata.uid.clone().unwrap());
    let data = &rev.data.as_ref().context("data")?.0;
    assert_eq!(data["kind"], "VirtualMachineInstancetype");
    assert_eq!(data["spec"]["cpu"]["guest"], 2);
    let pref_rev = vm
        .spec
        .preference
        .as_ref()
        .unwrap()
        .revision_name
        .clone()
        .unwrap();
    assert_eq!(
        revisions.get(&pref_rev).await?.data.unwrap().0["spec"]["cpu"]["preferredCPUTopology"],
        "cores"
    );
    // The user's own apply of the same manifest keeps the recorded revisions.
    env.apply(&typed_vm_yaml("sized", refs, domain))?;
    let again = vms.get("sized").await?;
    assert_eq!(
        again
            .spec
            .instancetype
            .as_ref()
            .unwrap()
            .revision_name
            .as_deref(),
        Some(it_rev.as_str())
    );

    // The instancetype is edited: the running VM's next VMI still has the captured size...
    let its: kube::Api<microvirt_crds::VirtualMachineInstancetype> = env.api();
    its.patch(
        "medium",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"cpu": {"guest": 4}, "memory": {"guest": "512Mi"}}})),
    )
    .await?;
    let uid1 = vmi.metadata.uid.clone().unwrap();
    env.api::<VirtualMachineInstance>()
        .delete("sized", &DeleteParams::default())
        .await?;
    let vmi2 = wait_vmi(&env, "sized", Some(&uid1)).await?;
    assert_eq!(
        size(&vmi2.spec),
        (Some(1), Some(2), Some(1), "256Mi".into())
    );
    // ... while a VM that starts now gets the edited one (KubeVirt's default kind is the
    // cluster-wide one, so the namespaced kind is named).
    env.apply(&typed_vm_yaml(
        "later",
        "  instancetype: {kind: VirtualMachineInstancetype, name: medium}",
        "{}",
    ))?;
    let vmi3 = wait_vmi(&env, "later", None).await?;
    // No preference: KubeVirt's default layout, sockets.
    assert_eq!(
        size(&vmi3.spec),
        (Some(4), Some(1), Some(1), "512Mi".into())
    );
    assert!(vms
        .get("later")
        .await?
        .status
        .unwrap_or_default()
        .conditions
        .is_empty());

    // The VM is pointed at another instancetype (its old revisionName left in place): the next
    // start captures the new one and records its revision.
    let big = r#"apiVersion: microvirt.io/v1alpha1
kind: VirtualMachineInstancetype
metadata: {name: big}
spec:
  cpu: {guest: 3}
  memory: {guest: 384Mi}
"#;
    env.apply(big)?;
    vms.patch(
        "sized",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"instancetype": {"name": "big"}}})),
    )
    .await?;
    let uid2 = vmi2.metadata.uid.clone().unwrap();
    env.api::<VirtualMachineInstance>()
        .delete("sized", &DeleteParams::default())
        .await?;
    let vmi4 = wait_vmi(&env, "sized", Some(&uid2)).await?;
    assert_eq!(
        size(&vmi4.spec),
        (Some(1), Some(3), Some(1), "384Mi".into())
    );
    let renamed = vms.get("sized").await?;
    let new_rev = renamed.spec.instancetype.unwrap().revision_name.unwrap();
    assert_ne!(new_rev, it_rev);
    assert_eq!(
        revisions.get(&new_rev).await?.data.unwrap().0["metadata"]["name"],
        "big"
    );
    Ok(())
}

#[tokio::test]
async fn a_conflicting_template_or_a_missing_instancetype_fails_the_vm_until_fixed() -> Result<()> {
    let env = Env::start_shared("t-instancetype-fail").await?;
    let vms = env.api::<VirtualMachine>();
    let vmis = env.api::<VirtualMachineInstance>();

    // A missing cluster-wide instancetype (the default kind): a Failure condition naming it,
    // no VMI, retried.
    let refs = "  instancetype: {name: t-fail-small}";
    env.apply(&typed_vm_yaml("waiting", refs, "{}"))?;
    let c = wait_failure(
        &env,
        "waiting",
        "VirtualMachineClusterInstancetype t-fail-small not found",
    )
    .await?;
    assert_eq!(c.reason.as_deref(), Some("InstancetypeNotFound"));
    assert!(vmis.get_opt("waiting").await?.is_none());
    // Once it exists the VMI is created and the condition goes.
    let small = r#"apiVersion: microvirt.io/v1alpha1
kind: VirtualMachineClusterInstancetype
metadata: {name: t-fail-small}
spec:
  cpu: {guest: 1}
  memory: {guest: 96Mi}
"#;
    env.apply(small)?;
    let vmi = wait_vmi(&env, "waiting", None).await?;
    assert_eq!(size(&vmi.spec), (Some(1), Some(1), Some(1), "96Mi".into()));
    wait_for("Failure condition cleared", WAIT, || async {
        let st = vms.get("waiting").await?.status.unwrap_or_default();
        Ok(st.conditions.is_empty().then_some(()))
    })
    .await?;

    // A template that sets what the instancetype sets: refused, naming the fields; no VMI and
    // no revision captured.
    env.apply(&typed_vm_yaml(
        "conflict",
        refs,
        "{memory: {guest: 128Mi}, cpu: {sockets: 2}}",
    ))?;
    let c = wait_failure(&env, "conflict", "spec.template.spec.domain.memory.guest").await?;
    assert_eq!(c.reason.as_deref(), Some("InstancetypeConflict"));
    let msg = c.message.unwrap_or_default();
    assert!(
        msg.contains("spec.template.spec.domain.cpu.sockets"),
        "{msg}"
    );
    // Still refused a few reconciles later.
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    assert!(vmis.get_opt("conflict").await?.is_none());
    let vm = vms.get("conflict").await?;
    assert_eq!(vm.spec.instancetype.as_ref().unwrap().revision_name, None);
    // The event says the same.
    let (ok, out, _) = env.kubectl(
        &[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=conflict",
            "-o",
            "json",
        ],
        None,
    )?;
    assert!(ok);
    assert!(out.contains("InstancetypeConflict"), "{out}");
    // The template fixed: the VMI comes, sized by the instancetype.
    vms.patch(
        "conflict",
        &PatchParams::default(),
        &Patch::Merge(
            &json!({"spec": {"template": {"spec": {"domain": {"memory": null, "cpu": null}}}}}),
        ),
    )
    .await?;
    let vmi = wait_vmi(&env, "conflict", None).await?;
    assert_eq!(size(&vmi.spec), (Some(1), Some(1), Some(1), "96Mi".into()));
    Ok(())
}
