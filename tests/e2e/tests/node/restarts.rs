//! Shared components restarted under running VMIs: the operator's leader fails over, the
//! device plugin and the kubelet restart.

use super::*;

fn lease_holder(env: &Env) -> Result<Option<String>> {
    Ok(env
        .k
        .get(NAMESPACE, "lease", "microvirt-operator")?
        .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string)))
}

pub(super) fn operator_failover(env: &Env) -> Result<()> {
    let leader = deploy::wait_operator(&env.k, READY)?;
    let pods: Vec<String> = env
        .k
        .list(
            NAMESPACE,
            "pod",
            Some("app.kubernetes.io/name=virt-operator"),
        )?
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    ensure!(
        pods.contains(&leader),
        "lease holder {leader} is not an operator pod: {pods:?}"
    );
    ensure!(pods.len() == 2, "expected 2 operator pods, found {pods:?}");
    env.k
        .run(&["-n", NAMESPACE, "delete", "pod", &leader, "--wait=false"])?;
    // Another live operator pod takes the lease: the standby, or (if the standby is just
    // restarting) the replacement the Deployment makes.
    let new = wait_for("another replica to take the lease", READY, |last| {
        let h = lease_holder(env)?;
        let live: Vec<String> = env
            .k
            .list(
                NAMESPACE,
                "pod",
                Some("app.kubernetes.io/name=virt-operator"),
            )?
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
            .collect();
        *last = format!("holder {h:?}, live operator pods {live:?}, deleted {leader}");
        Ok(h.filter(|h| h != &leader && live.contains(h)))
    })?;
    eprintln!("[e2e] lease moved from {leader} to {new}");
    // The new leader reconciles: a VMIRS gets exactly its replicas, and no more later.
    let ns = TestNamespace::create(&env.k, "e2e-failover")?;
    let ns = ns.name();
    env.k.apply(ns, &vmirs_yaml("after", 3))?;
    wait_replicas(env, ns, "app=after", 3)?;
    thread::sleep(Duration::from_secs(5));
    let pods = launcher_pods(env, ns)?;
    ensure!(
        pods.len() == 3,
        "{} launcher pods after settling",
        pods.len()
    );
    // The Deployment brings the second replica back.
    wait_for("2 operator pods again", READY, |last| {
        let n = env
            .k
            .list(
                NAMESPACE,
                "pod",
                Some("app.kubernetes.io/name=virt-operator"),
            )?
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .count();
        *last = format!("{n}");
        Ok((n == 2).then_some(()))
    })?;
    Ok(())
}

pub(super) fn restarts(env: &Env) -> Result<()> {
    let ns = TestNamespace::create(&env.k, "e2e-restarts")?;
    let ns = ns.name();
    env.k.apply(ns, &vmi_yaml("before", "halt-forever", 2))?;
    wait_ready(env, ns, "before")?;
    let node = env.rc.node_name().to_string();

    // The device plugin (virt-handler) restarts: the DaemonSet makes a new pod, which
    // registers again.
    let old: Vec<String> = env
        .k
        .list(
            HANDLER_NS,
            "pod",
            Some("app.kubernetes.io/name=virt-handler"),
        )?
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    ensure!(old.len() == 1, "virt-handler pods: {old:?}");
    env.k
        .run(&["-n", HANDLER_NS, "delete", "pod", &old[0], "--wait=true"])?;
    wait_for("a new virt-handler pod Ready", READY, |last| {
        let ps = env.k.list(
            HANDLER_NS,
            "pod",
            Some("app.kubernetes.io/name=virt-handler"),
        )?;
        *last = format!("{} pod(s)", ps.len());
        Ok(ps
            .iter()
            .any(|p| p["metadata"]["name"] != old[0].as_str() && condition_true(p, "Ready"))
            .then_some(()))
    })?;
    wait_kvm_allocatable(&env.k, &node, READY)?;
    env.k
        .apply(ns, &vmi_yaml("after-plugin", "halt-forever", 2))?;
    wait_ready(env, ns, "after-plugin")?;

    // The kubelet restarts: it drops the plugin's socket, the plugin registers again.
    env.rc.restart_kubelet()?;
    wait_kvm_allocatable(&env.k, &node, READY)?;
    env.k
        .apply(ns, &vmi_yaml("after-kubelet", "halt-forever", 2))?;
    wait_ready(env, ns, "after-kubelet")?;
    // The first VMI ran through both.
    let v = env.k.get(ns, "vmi", "before")?.context("VMI before")?;
    ensure!(running_ready(env, &v), "VMI before: {}", v["status"]);
    Ok(())
}
