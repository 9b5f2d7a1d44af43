//! `deploy/` manifests against a real kube-apiserver: they apply, the RBAC in `deploy/rbac.yaml`
//! is enough for the controllers (the operator runs impersonating its ServiceAccount), the
//! examples are valid, and leader election hands the Lease over.

use std::time::Duration;

use crate::common::*;
use anyhow::Result;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use kube::Api;
use microvirt_crds::{VirtualMachineInstance, VirtualMachineInstanceReplicaSet};
use microvirt_operator::leader::{LeaderConfig, LeaderElector};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_manifests_rbac_is_sufficient_and_leader_election_hands_over() -> Result<()> {
    let kc = tokio::task::block_in_place(shared_cluster).kubeconfig_path();
    apply_operator_rbac(kc)?;
    let d = deploy_dir();
    let path = d.join("operator.yaml").display().to_string();
    let (ok, out, err) = kubectl(kc, &["apply", "-f", &path], None)?;
    assert!(ok, "kubectl apply -f deploy/operator.yaml: {out}{err}");
    // The examples are valid manifests.
    let (ok, _, err) = kubectl(kc, &["create", "namespace", "examples"], None)?;
    assert!(ok, "{err}");
    let ex = d.join("examples").display().to_string();
    let (ok, out, err) = kubectl(kc, &["-n", "examples", "apply", "-f", &ex], None)?;
    assert!(ok, "kubectl apply -f deploy/examples: {out}{err}");

    // The operator with exactly the ServiceAccount's permissions.
    let env = Env::start_as_operator_sa("t-rbac").await?;
    let op = env.operator_client.clone();
    env.apply(&vmirs_yaml("r", 2, "32Mi"))?;
    let pods = env.api::<Pod>();
    wait_for("2 pods created by the ServiceAccount", WAIT, || async {
        let p = pods.list(&ListParams::default()).await?;
        Ok((p.items.len() == 2).then_some(()))
    })
    .await?;
    bind(&pods, "virt-launcher-r-0", "node-1").await?;
    mark_running(&pods, "virt-launcher-r-0", "10.3.0.1", true).await?;
    let rss = env.api::<VirtualMachineInstanceReplicaSet>();
    wait_for("readyReplicas 1", WAIT, || async {
        let st = rss.get("r").await?.status.unwrap_or_default();
        Ok((st.ready_replicas == 1 && st.replicas == 2).then_some(()))
    })
    .await?;
    rss.patch(
        "r",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"replicas": 0}})),
    )
    .await?;
    let vmis = env.api::<VirtualMachineInstance>();
    wait_for(
        "VMIs and pods deleted by the ServiceAccount",
        WAIT,
        || async {
            let v = vmis.list(&ListParams::default()).await?;
            let p = pods.list(&ListParams::default()).await?;
            Ok((v.items.is_empty() && p.items.is_empty()).then_some(()))
        },
    )
    .await?;
    env.assert_no_reconcile_errors();
    // A VM with a cluster-wide instancetype and a namespaced preference under the
    // ServiceAccount: both read and captured in ControllerRevisions, the VMI sized by them.
    let sized = r#"apiVersion: microvirt.io/v1alpha1
kind: VirtualMachineClusterInstancetype
metadata: {name: rbac-small}
spec: {cpu: {guest: 2}, memory: {guest: 48Mi}}
---
apiVersion: microvirt.io/v1alpha1
kind: VirtualMachinePreference
metadata: {name: cores}
spec: {cpu: {preferredCPUTopology: cores}}
---
apiVersion: microvirt.io/v1alpha1
kind: VirtualMachine
metadata: {name: sized}
spec:
  runStrategy: Always
  instancetype: {name: rbac-small}
  preference: {kind: VirtualMachinePreference, name: cores}
  template: {spec: {domain: {}}}
"#;
    env.apply(sized)?;
    let vms = env.api::<microvirt_crds::VirtualMachine>();
    let vmi = wait_for("VMI of the sized VM, revisions recorded", WAIT, || async {
        let vm = vms.get("sized").await?;
        let recorded = revisions_recorded(&vm);
        Ok(vmis.get_opt("sized").await?.filter(|_| recorded))
    })
    .await?;
    let cpu = vmi.spec.domain.cpu.clone().unwrap_or_default();
    assert_eq!(
        (cpu.sockets, cpu.cores, cpu.threads),
        (Some(1), Some(2), Some(1))
    );
    vms.delete("sized", &Default::default()).await?;
    wait_for("sized VM, its VMI and pod gone", WAIT, || async {
        let v = vmis.list(&ListParams::default()).await?;
        let p = pods.list(&ListParams::default()).await?;
        Ok(
            (vms.get_opt("sized").await?.is_none() && v.items.is_empty() && p.items.is_empty())
                .then_some(()),
        )
    })
    .await?;
    // A VM pool under the ServiceAccount: its builder pod (a snapshot is wanted for the warm
    // members), its status, a cold replica while no warm member is ready, and its deletion.
    env.apply(&pool_yaml("p", 1, "warm: {min: 1}", "32Mi"))?;
    let pools = env.api::<microvirt_crds::VirtualMachinePool>();
    wait_for("pool builder, replica and status", WAIT, || async {
        let st = pools.get("p").await?.status.unwrap_or_default();
        let p = pods
            .list(
                &ListParams::default().labels("microvirt.io/pool=p,microvirt.io/pool-role=builder"),
            )
            .await?;
        let v = vmis.list(&ListParams::default().labels("app=p")).await?;
        Ok((st.snapshot.is_some()
            && st.label_selector.as_deref() == Some("app=p")
            && p.items.len() == 1
            && v.items.len() == 1)
            .then_some(()))
    })
    .await?;
    pools.delete("p", &Default::default()).await?;
    wait_for("pool, VMIs and pods gone", WAIT, || async {
        let p = pools.get_opt("p").await?;
        let v = vmis.list(&ListParams::default()).await?;
        let ps = pods.list(&ListParams::default()).await?;
        Ok((p.is_none() && v.items.is_empty() && ps.items.is_empty()).then_some(()))
    })
    .await?;
    env.assert_no_reconcile_errors();

    // Events were published under the ServiceAccount too.
    let events: Api<k8s_openapi::api::events::v1::Event> = env.api();
    wait_for("events", WAIT, || async {
        let l = events.list(&ListParams::default()).await?;
        Ok(l.items
            .iter()
            .any(|e| e.reporting_controller.as_deref() == Some("microvirt-operator"))
            .then_some(()))
    })
    .await?;

    // Leader election with the ServiceAccount's permissions: a holds, b waits, b takes over
    // once a stops renewing.
    let cfg = |id: &str| LeaderConfig {
        name: "microvirt-operator".into(),
        namespace: "microvirt".into(),
        identity: id.into(),
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1500),
        retry_period: Duration::from_millis(500),
    };
    let a = LeaderElector::new(op.clone(), cfg("a"));
    let b = LeaderElector::new(op.clone(), cfg("b"));
    assert!(a.try_acquire_or_renew().await?);
    assert!(!b.try_acquire_or_renew().await?);
    assert!(a.try_acquire_or_renew().await?, "holder renews");
    let started = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(10), b.acquire(|| {})).await?;
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "took over too early"
    );
    let lease: Api<Lease> = Api::namespaced(env.client.clone(), "microvirt");
    let spec = lease
        .get("microvirt-operator")
        .await?
        .spec
        .unwrap_or_default();
    assert_eq!(spec.holder_identity.as_deref(), Some("b"));
    assert_eq!(spec.lease_transitions, Some(1));
    assert!(
        !a.try_acquire_or_renew().await?,
        "old holder must not win it back"
    );
    Ok(())
}

/// `deploy/user-roles.yaml`: a user bound to `microvirt.io:edit` runs VMs (and may ask the
/// operator to start/stop one through the VM's status); one bound to `microvirt.io:view` sees
/// them and cannot create, change or start anything; the roles carry the labels that aggregate
/// them into Kubernetes' admin/edit/view (the aggregation itself is kube-controller-manager's,
/// which this API server runs without).
#[test]
fn user_roles_edit_creates_vmis_view_only_reads() -> Result<()> {
    let kc = shared_cluster().kubeconfig_path();
    let roles = deploy_dir().join("user-roles.yaml").display().to_string();
    let (ok, out, err) = kubectl(kc, &["apply", "-f", &roles], None)?;
    assert!(ok, "kubectl apply -f deploy/user-roles.yaml: {out}{err}");
    for (role, label) in [
        ("admin", "aggregate-to-admin"),
        ("edit", "aggregate-to-edit"),
        ("view", "aggregate-to-view"),
    ] {
        let (ok, out, err) = kubectl(
            kc,
            &[
                "get",
                "clusterrole",
                &format!("microvirt.io:{role}"),
                "-o",
                &format!("jsonpath={{.metadata.labels.rbac\\.authorization\\.k8s\\.io/{label}}}"),
            ],
            None,
        )?;
        assert!(ok, "{err}");
        assert_eq!(out, "true", "microvirt.io:{role} lacks {label}");
    }
    let ns = "t-roles";
    let (ok, _, err) = kubectl(kc, &["create", "namespace", ns], None)?;
    assert!(ok, "{err}");
    for (user, role) in [("alice", "edit"), ("bob", "view"), ("carol", "admin")] {
        let (ok, _, err) = kubectl(
            kc,
            &[
                "-n",
                ns,
                "create",
                "rolebinding",
                user,
                &format!("--clusterrole=microvirt.io:{role}"),
                &format!("--user={user}"),
            ],
            None,
        )?;
        assert!(ok, "{err}");
    }
    let as_user = |user: &str, args: &[&str], stdin: Option<&str>| {
        let mut a = vec!["-n", ns, "--as", user];
        a.extend_from_slice(args);
        kubectl(kc, &a, stdin)
    };
    let vm: &str = &vm_yaml("vm1", "Manual", "64Mi");

    // edit: create a VMI and a VM, change them, ask for a start, delete.
    let (ok, _, err) = as_user("alice", &["create", "-f", "-"], Some(&vmi_yaml("a", "")))?;
    assert!(ok, "edit cannot create a VMI: {err}");
    let (ok, _, err) = as_user("alice", &["create", "-f", "-"], Some(vm))?;
    assert!(ok, "edit cannot create a VM: {err}");
    let start = r#"{"status":{"stateChangeRequests":[{"action":"Start"}]}}"#;
    let (ok, _, err) = as_user(
        "alice",
        &[
            "patch",
            "vm",
            "vm1",
            "--subresource=status",
            "--type=merge",
            "-p",
            start,
        ],
        None,
    )?;
    assert!(ok, "edit cannot request a start: {err}");

    // view: reads, and is refused every change.
    let (ok, out, err) = as_user("bob", &["get", "vmi", "a", "-o", "name"], None)?;
    assert!(ok, "view cannot get a VMI: {err}");
    assert_eq!(out.trim(), "virtualmachineinstance.microvirt.io/a");
    let (ok, _, err) = as_user("bob", &["get", "vm,vmirs,vmipreset,vmpool"], None)?;
    assert!(ok, "view cannot list: {err}");
    let (ok, _, err) = as_user("bob", &["create", "-f", "-"], Some(&vmi_yaml("b", "")))?;
    assert!(!ok, "view created a VMI");
    assert!(
        err.contains("Forbidden") || err.contains("forbidden"),
        "{err}"
    );
    let (ok, _, err) = as_user(
        "bob",
        &[
            "patch",
            "vm",
            "vm1",
            "--subresource=status",
            "--type=merge",
            "-p",
            start,
        ],
        None,
    )?;
    assert!(
        !ok && err.contains("forbidden"),
        "view requested a start: {err}"
    );
    let (ok, _, err) = as_user("bob", &["delete", "vmi", "a"], None)?;
    assert!(
        !ok && err.contains("forbidden"),
        "view deleted a VMI: {err}"
    );

    // admin: the same rights as edit (microvirt has no cluster settings for admins only).
    let (ok, _, err) = as_user("carol", &["create", "-f", "-"], Some(&vmi_yaml("c", "")))?;
    assert!(ok, "admin cannot create a VMI: {err}");
    let (ok, _, err) = as_user("alice", &["delete", "vmi", "a", "--wait=false"], None)?;
    assert!(ok, "edit cannot delete a VMI: {err}");
    // Nobody is granted anything outside the namespace of the binding.
    let (ok, _, _) = kubectl(kc, &["-n", "default", "--as", "alice", "get", "vmi"], None)?;
    assert!(!ok, "a RoleBinding in {ns} granted access to default");
    Ok(())
}
