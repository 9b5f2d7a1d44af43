//! `kubectl microvirt` against a real kube-apiserver (start/stop/restart write the VM's run
//! strategy or its start/stop requests as virtctl does; expose creates Services), and against a
//! fake `kubectl` on PATH that records its arguments (console/pause/unpause/snapshot, which
//! need a running launcher pod).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use anyhow::{ensure, Context, Result};
use microvirt_testsupport::Cluster;

fn plugin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kubectl-microvirt"))
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Result<Output> {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("kubectl")?;
    let mut input = child.stdin.take().context("stdin")?;
    input.write_all(stdin.unwrap_or("").as_bytes())?;
    drop(input);
    Ok(child.wait_with_output()?)
}

fn ok(o: Output) -> Result<String> {
    ensure!(
        o.status.success(),
        "failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

fn virt(kubeconfig: &Path, args: &[&str]) -> Result<Output> {
    Ok(plugin()
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .stdin(Stdio::null())
        .output()?)
}

fn vm_json(kc: &Path, ns: &str, name: &str) -> Result<serde_json::Value> {
    let out = ok(kubectl(
        kc,
        &["-n", ns, "get", "vm", name, "-o", "json"],
        None,
    )?)?;
    Ok(serde_json::from_str(&out)?)
}

fn vm_spec(kc: &Path, ns: &str, name: &str) -> Result<serde_json::Value> {
    Ok(vm_json(kc, ns, name)?["spec"].clone())
}

fn vmi_uid(kc: &Path, ns: &str, name: &str) -> Result<Option<String>> {
    let s = ok(kubectl(
        kc,
        &[
            "-n",
            ns,
            "get",
            "vmi",
            name,
            "-o",
            "jsonpath={.metadata.uid}",
            "--ignore-not-found",
        ],
        None,
    )?)?;
    Ok((!s.trim().is_empty()).then(|| s.trim().to_string()))
}

fn requests(kc: &Path, ns: &str, name: &str) -> Result<serde_json::Value> {
    Ok(vm_json(kc, ns, name)?["status"]["stateChangeRequests"].clone())
}

fn clear_requests(kc: &Path, ns: &str, name: &str) -> Result<()> {
    ok(kubectl(
        kc,
        &[
            "-n",
            ns,
            "patch",
            "vm",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"stateChangeRequests":null}}"#,
        ],
        None,
    )?)?;
    Ok(())
}

fn vm_yaml(name: &str, strategy_line: &str) -> String {
    format!(
        "apiVersion: microvirt.io/v1alpha1\nkind: VirtualMachine\nmetadata: {{name: {name}}}\nspec:\n  {strategy_line}\n  template:\n    metadata: {{labels: {{app: {name}}}}}\n    spec: {{domain: {{memory: {{guest: 64Mi}}}}}}\n"
    )
}

/// A VMI as the operator would create it for a VM, in `phase` (set through the status
/// subresource, as the operator does); returns its uid.
fn make_vmi(kc: &Path, ns: &str, name: &str, phase: &str) -> Result<String> {
    let yaml = format!(
        "apiVersion: microvirt.io/v1alpha1\nkind: VirtualMachineInstance\nmetadata: {{name: {name}}}\nspec:\n  domain:\n    memory: {{guest: 64Mi}}\n    devices:\n      interfaces: [{{name: default, masquerade: {{}}, ports: [{{port: 22}}, {{port: 80}}]}}]\n  networks: [{{name: default, pod: {{}}}}]\n"
    );
    ok(kubectl(kc, &["-n", ns, "apply", "-f", "-"], Some(&yaml))?)?;
    ok(kubectl(
        kc,
        &[
            "-n",
            ns,
            "patch",
            "vmi",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &format!(r#"{{"status":{{"phase":"{phase}"}}}}"#),
        ],
        None,
    )?)?;
    vmi_uid(kc, ns, name)?.context("VMI not created")
}

fn fails_with(o: Output, text: &str) {
    assert!(!o.status.success(), "succeeded: {o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(text), "stderr {err:?} lacks {text:?}");
}

fn install_crds(kc: &Path) -> Result<()> {
    let crds = workspace().join("crds");
    for f in std::fs::read_dir(&crds)? {
        let p = f?.path();
        if p.extension().is_some_and(|e| e == "yaml") {
            ok(kubectl(kc, &["apply", "-f", &p.to_string_lossy()], None)?)?;
        }
    }
    microvirt_testsupport::wait_crds_established(
        kc,
        &[
            "virtualmachines.microvirt.io",
            "virtualmachineinstances.microvirt.io",
            "virtualmachineinstancereplicasets.microvirt.io",
        ],
        microvirt_testsupport::CRDS_ESTABLISHED_WITHIN,
    )
    .map_err(anyhow::Error::msg)?;
    Ok(())
}

#[test]
fn start_stop_restart_as_virtctl_against_a_real_apiserver() -> Result<()> {
    let cluster = Cluster::start(Default::default())?;
    let kc = cluster.kubeconfig_path();
    install_crds(kc)?;
    ok(kubectl(kc, &["create", "namespace", "t-virt"], None)?)?;
    let ns = "t-virt";
    for (name, line) in [
        ("vm1", "runStrategy: Always"),
        ("old", "running: false"),
        ("man", "runStrategy: Manual"),
        ("rerun", "runStrategy: RerunOnFailure"),
        ("once", "runStrategy: Once"),
    ] {
        ok(kubectl(
            kc,
            &["-n", ns, "apply", "-f", "-"],
            Some(&vm_yaml(name, line)),
        )?)?;
    }

    // Always / Halted: stop and start flip runStrategy (namespace given after the name).
    let out = ok(virt(kc, &["stop", "vm1", "-n", ns])?)?;
    assert!(out.contains("scheduled to stop"), "{out}");
    assert_eq!(vm_spec(kc, ns, "vm1")?["runStrategy"], "Halted");
    ok(virt(kc, &["-n", ns, "start", "vm1"])?)?;
    assert_eq!(vm_spec(kc, ns, "vm1")?["runStrategy"], "Always");
    // virtctl: Always and Once take no start request; a halted VM without a VMI is not running.
    fails_with(
        virt(kc, &["-n", ns, "start", "vm1"])?,
        "Always does not support manual start requests",
    );
    fails_with(
        virt(kc, &["-n", ns, "start", "once"])?,
        "Once does not support manual start requests",
    );
    fails_with(
        virt(kc, &["-n", ns, "restart", "once"])?,
        "RunStrategy Once does not support manual restart requests",
    );
    ok(virt(kc, &["-n", ns, "stop", "once"])?)?;
    assert_eq!(vm_spec(kc, ns, "once")?["runStrategy"], "Halted");
    fails_with(virt(kc, &["-n", ns, "stop", "once"])?, "VM is not running");

    // A VM using the deprecated `running` field keeps using it.
    ok(virt(kc, &["-n", ns, "start", "old"])?)?;
    let spec = vm_spec(kc, ns, "old")?;
    assert_eq!(spec["running"], true, "{spec}");
    assert!(spec.get("runStrategy").is_none(), "{spec}");

    // Manual: start and stop are requests; the run strategy stays.
    ok(virt(kc, &["-n", ns, "start", "man"])?)?;
    assert_eq!(
        requests(kc, ns, "man")?,
        serde_json::json!([{"action": "Start"}])
    );
    assert_eq!(vm_spec(kc, ns, "man")?["runStrategy"], "Manual");
    fails_with(virt(kc, &["-n", ns, "start", "man"])?, "already underway");
    fails_with(virt(kc, &["-n", ns, "stop", "man"])?, "VM is not running");
    // (The operator, not running here, would create the VMI and drop the request.)
    clear_requests(kc, ns, "man")?;
    let uid = make_vmi(kc, ns, "man", "Running")?;
    fails_with(
        virt(kc, &["-n", ns, "start", "man"])?,
        "VM is already running",
    );
    ok(virt(kc, &["-n", ns, "stop", "man"])?)?;
    assert_eq!(
        requests(kc, ns, "man")?,
        serde_json::json!([{"action": "Stop", "uid": uid}])
    );
    fails_with(virt(kc, &["-n", ns, "restart", "man"])?, "already underway");
    clear_requests(kc, ns, "man")?;
    let out = ok(virt(kc, &["-n", ns, "restart", "man"])?)?;
    assert!(out.contains("scheduled to restart"), "{out}");
    assert_eq!(
        requests(kc, ns, "man")?,
        serde_json::json!([{"action": "Stop", "uid": uid}, {"action": "Start"}])
    );
    // A VMI that ended is stopped before the new start.
    clear_requests(kc, ns, "man")?;
    ok(kubectl(
        kc,
        &[
            "-n",
            ns,
            "patch",
            "vmi",
            "man",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Succeeded"}}"#,
        ],
        None,
    )?)?;
    ok(virt(kc, &["-n", ns, "start", "man"])?)?;
    assert_eq!(
        requests(kc, ns, "man")?,
        serde_json::json!([{"action": "Stop", "uid": uid}, {"action": "Start"}])
    );

    // RerunOnFailure: stop is a request; starting a failed VMI is refused.
    let uid = make_vmi(kc, ns, "rerun", "Running")?;
    ok(virt(kc, &["-n", ns, "stop", "rerun"])?)?;
    assert_eq!(
        requests(kc, ns, "rerun")?,
        serde_json::json!([{"action": "Stop", "uid": uid}])
    );
    assert_eq!(vm_spec(kc, ns, "rerun")?["runStrategy"], "RerunOnFailure");
    clear_requests(kc, ns, "rerun")?;
    ok(kubectl(
        kc,
        &[
            "-n",
            ns,
            "patch",
            "vmi",
            "rerun",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Failed"}}"#,
        ],
        None,
    )?)?;
    fails_with(
        virt(kc, &["-n", ns, "start", "rerun"])?,
        "RerunOnFailure does not support starting VM from failed state",
    );

    // Always: restart is a stop and a start request for the VMI; runStrategy stays.
    let uid = make_vmi(kc, ns, "vm1", "Running")?;
    ok(virt(kc, &["-n", ns, "restart", "vm1"])?)?;
    assert_eq!(
        requests(kc, ns, "vm1")?,
        serde_json::json!([{"action": "Stop", "uid": uid}, {"action": "Start"}])
    );
    assert_eq!(vm_spec(kc, ns, "vm1")?["runStrategy"], "Always");

    // Unknown VM, and the kubeconfig's default namespace without -n (the VMs are not there).
    fails_with(virt(kc, &["-n", ns, "stop", "nope"])?, "not found");
    let o = virt(kc, &["stop", "vm1"])?;
    assert!(!o.status.success(), "{o:?}");
    Ok(())
}

#[test]
fn expose_creates_services_like_virtctl() -> Result<()> {
    let cluster = Cluster::start(Default::default())?;
    let kc = cluster.kubeconfig_path();
    install_crds(kc)?;
    ok(kubectl(kc, &["create", "namespace", "t-expose"], None)?)?;
    let ns = "t-expose";
    ok(kubectl(
        kc,
        &["-n", ns, "apply", "-f", "-"],
        Some(&vm_yaml("db", "runStrategy: Halted")),
    )?)?;
    make_vmi(kc, ns, "web", "Running")?;
    ok(kubectl(
        kc,
        &["-n", ns, "apply", "-f", "-"],
        Some(
            "apiVersion: microvirt.io/v1alpha1\nkind: VirtualMachineInstanceReplicaSet\nmetadata: {name: rs}\nspec:\n  replicas: 0\n  selector: {matchLabels: {app: rs}}\n  template:\n    metadata: {labels: {app: rs}}\n    spec: {domain: {memory: {guest: 64Mi}}}\n",
        ),
    )?)?;
    let svc = |name: &str| -> Result<serde_json::Value> {
        let out = ok(kubectl(
            kc,
            &["-n", ns, "get", "service", name, "-o", "json"],
            None,
        )?)?;
        Ok(serde_json::from_str(&out)?)
    };

    // A VM: its VMI's launcher pod, the given port, NodePort; owned by the VM.
    let out = ok(virt(
        kc,
        &[
            "-n",
            ns,
            "expose",
            "vm",
            "db",
            "--name",
            "db-svc",
            "--port",
            "5432",
            "--target-port",
            "5433",
            "--type",
            "NodePort",
        ],
    )?)?;
    assert!(out.contains("Service db-svc successfully exposed"), "{out}");
    let s = svc("db-svc")?;
    assert_eq!(
        s["spec"]["selector"],
        serde_json::json!({"microvirt.io/vmi": "db"})
    );
    assert_eq!(s["spec"]["type"], "NodePort");
    assert_eq!(s["spec"]["ports"][0]["port"], 5432);
    assert_eq!(s["spec"]["ports"][0]["targetPort"], 5433);
    assert!(s["spec"]["ports"][0]["nodePort"].is_number(), "{s}");
    let owner = &s["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "VirtualMachine");
    assert_eq!(owner["uid"], vm_json(kc, ns, "db")?["metadata"]["uid"]);

    // A VMI without --port: the ports its pod-network interface declares.
    ok(virt(
        kc,
        &["-n", ns, "expose", "vmi", "web", "--name", "web"],
    )?)?;
    let s = svc("web")?;
    let ports: Vec<_> = s["spec"]["ports"]
        .as_array()
        .context("ports")?
        .iter()
        .map(|p| {
            (
                p["name"].clone(),
                p["port"].clone(),
                p["targetPort"].clone(),
            )
        })
        .collect();
    assert_eq!(
        ports,
        vec![
            ("port-1".into(), 22.into(), 22.into()),
            ("port-2".into(), 80.into(), 80.into())
        ]
    );

    // A VMIRS: its selector; a headless Service.
    ok(virt(
        kc,
        &[
            "-n",
            ns,
            "expose",
            "vmirs",
            "rs",
            "--name",
            "rs",
            "--port",
            "80",
            "--cluster-ip",
            "None",
        ],
    )?)?;
    let s = svc("rs")?;
    assert_eq!(s["spec"]["selector"], serde_json::json!({"app": "rs"}));
    assert_eq!(s["spec"]["clusterIP"], "None");

    // No port anywhere; a Service that exists; an unknown VM.
    fails_with(
        virt(kc, &["-n", ns, "expose", "vm", "db", "--name", "x"])?,
        "couldn't find port",
    );
    fails_with(
        virt(
            kc,
            &[
                "-n", ns, "expose", "vm", "db", "--name", "db-svc", "--port", "1",
            ],
        )?,
        "already exists",
    );
    fails_with(
        virt(
            kc,
            &[
                "-n", ns, "expose", "vm", "nope", "--name", "x", "--port", "1",
            ],
        )?,
        "not found",
    );
    Ok(())
}

#[test]
fn console_pause_unpause_snapshot_exec_into_the_launcher_pod() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("kubectl-microvirt-fake-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let log = dir.join("args.log");
    let fake = dir.join("kubectl");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done > {}\nexit 7\n",
            log.display()
        ),
    )?;
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let socket = "/var/run/microvirt/control.sock";
    for (verb, extra, verb_args) in [
        ("pause", vec![], vec![]),
        ("unpause", vec![], vec![]),
        ("console", vec!["-i"], vec![]),
        ("snapshot", vec![], vec!["/snapshots/s1"]),
    ] {
        let o = plugin()
            .arg(verb)
            .arg("vm1")
            .args(&verb_args)
            .args(["-n", "ns1", "--context", "c1"])
            .env("PATH", &path)
            .stdin(Stdio::null())
            .output()?;
        // kubectl's exit status is passed on.
        assert_eq!(o.status.code(), Some(7), "{verb}: {o:?}");
        let args = std::fs::read_to_string(&log)?;
        let mut want = vec!["--context=c1", "--namespace=ns1", "exec"];
        want.extend(extra);
        want.extend([
            "virt-launcher-vm1",
            "-c",
            "compute",
            "--",
            "virt-launcher",
            verb,
        ]);
        want.extend(verb_args);
        want.extend(["--socket", socket]);
        assert_eq!(args.lines().collect::<Vec<_>>(), want, "{verb}");
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
