//! VirtualMachine run strategies, start failures and their back-off, and `RerunOnFailure` after a
//! drain or an eviction.

use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::ResourceExt;
use microvirt_crds::vmi::ANNOTATION_VMI_UID;
use microvirt_crds::{PrintableStatus, VirtualMachine, VirtualMachineInstance, VmiPhase};
use serde_json::json;

use crate::common::*;
use crate::harness::{vm_status, wait_phase, wait_pod, wait_vmi_uid};

#[tokio::test]
async fn vm_run_strategies() -> Result<()> {
    let env = Env::start_shared("t-vm").await?;
    let vms = env.api::<VirtualMachine>();
    let vmis = env.api::<VirtualMachineInstance>();
    let pods = env.api::<Pod>();
    // The VMs of this test; their VMIs carry the label `kind: vm`.
    let manifest = |name: &str, strategy: &str| {
        vm_yaml(name, strategy, "64Mi").replace(
            "  template:\n",
            "  template:\n    metadata: {labels: {kind: vm}}\n",
        )
    };
    // Always: a VMI is created; when it ends cleanly it is replaced by a new one.
    env.apply(&manifest("always", "Always"))?;
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
    let header = columns(&out);
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
    env.apply(&manifest("rerun", "RerunOnFailure"))?;
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
    env.apply(&manifest("once", "Once"))?;
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
    env.apply(&manifest("manual", "Manual"))?;
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
    let env = Env::start_shared("t-vm-crashloop").await?;
    let vms = env.api::<VirtualMachine>();
    let vmis = env.api::<VirtualMachineInstance>();
    let pods = env.api::<Pod>();
    env.apply(&vm_yaml("crashy", "Always", "64Mi"))?;
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
    let env = Env::start_shared("t-drain").await?;
    let vmis = env.api::<VirtualMachineInstance>();
    let pods = env.api::<Pod>();
    env.apply(&vm_yaml("web", "RerunOnFailure", "64Mi"))?;
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
