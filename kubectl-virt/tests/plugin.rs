//! `kubectl virt` against a real kube-apiserver (start/stop/restart change the VM and VMI), and
//! against a fake `kubectl` on PATH that records its arguments (console/pause/unpause, which
//! need a running launcher pod).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use microvirt_testsupport::Cluster;

fn plugin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kubectl-virt"))
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

fn vm_spec(kc: &Path, ns: &str, name: &str) -> Result<serde_json::Value> {
    let out = ok(kubectl(
        kc,
        &["-n", ns, "get", "vm", name, "-o", "json"],
        None,
    )?)?;
    Ok(serde_json::from_str::<serde_json::Value>(&out)?["spec"].clone())
}

fn vmi_uid(kc: &Path, ns: &str, name: &str) -> Result<Option<String>> {
    let o = kubectl(
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
    )?;
    let s = ok(o)?;
    Ok((!s.trim().is_empty()).then(|| s.trim().to_string()))
}

fn vm_yaml(name: &str, strategy_line: &str) -> String {
    format!(
        "apiVersion: microvirt.io/v1alpha1\nkind: VirtualMachine\nmetadata: {{name: {name}}}\nspec:\n  {strategy_line}\n  template:\n    spec: {{domain: {{memory: {{guest: 64Mi}}}}}}\n"
    )
}

fn vmi_yaml(name: &str) -> String {
    format!(
        "apiVersion: microvirt.io/v1alpha1\nkind: VirtualMachineInstance\nmetadata: {{name: {name}}}\nspec: {{domain: {{memory: {{guest: 64Mi}}}}}}\n"
    )
}

#[test]
fn start_stop_restart_against_a_real_apiserver() -> Result<()> {
    let cluster = Cluster::start(Default::default())?;
    let kc = cluster.kubeconfig_path();
    let crds = workspace().join("crds");
    for f in std::fs::read_dir(&crds)? {
        let p = f?.path();
        if p.extension().is_some_and(|e| e == "yaml") {
            ok(kubectl(kc, &["apply", "-f", &p.to_string_lossy()], None)?)?;
        }
    }
    ok(kubectl(
        kc,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/virtualmachines.microvirt.io",
            "crd/virtualmachineinstances.microvirt.io",
        ],
        None,
    )?)?;
    ok(kubectl(kc, &["create", "namespace", "t-virt"], None)?)?;
    let ns = "t-virt";
    ok(kubectl(
        kc,
        &["-n", ns, "apply", "-f", "-"],
        Some(&vm_yaml("vm1", "runStrategy: Always")),
    )?)?;
    ok(kubectl(
        kc,
        &["-n", ns, "apply", "-f", "-"],
        Some(&vm_yaml("old", "running: false")),
    )?)?;

    // stop / start flip runStrategy (namespace given after the name).
    let out = ok(virt(kc, &["stop", "vm1", "-n", ns])?)?;
    assert!(out.contains("Halted"), "{out}");
    assert_eq!(vm_spec(kc, ns, "vm1")?["runStrategy"], "Halted");
    ok(virt(kc, &["-n", ns, "start", "vm1"])?)?;
    assert_eq!(vm_spec(kc, ns, "vm1")?["runStrategy"], "Always");
    // Idempotent.
    let out = ok(virt(kc, &["-n", ns, "start", "vm1"])?)?;
    assert!(out.contains("already"), "{out}");

    // A VM using the deprecated `running` field: start replaces it (the CRD forbids both).
    ok(virt(kc, &["-n", ns, "start", "old"])?)?;
    let spec = vm_spec(kc, ns, "old")?;
    assert_eq!(spec["runStrategy"], "Always");
    assert!(spec.get("running").is_none(), "{spec}");

    // restart deletes the VMI (the operator, not running here, would create a new one).
    ok(kubectl(
        kc,
        &["-n", ns, "apply", "-f", "-"],
        Some(&vmi_yaml("vm1")),
    )?)?;
    assert!(vmi_uid(kc, ns, "vm1")?.is_some());
    let out = ok(virt(kc, &["-n", ns, "restart", "vm1"])?)?;
    assert!(out.contains("restarting"), "{out}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while vmi_uid(kc, ns, "vm1")?.is_some() {
        if Instant::now() > deadline {
            bail!("VMI vm1 not deleted by restart");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(vm_spec(kc, ns, "vm1")?["runStrategy"], "Always");

    // restart without a VMI, restart of a halted VM, unknown VM: errors with a reason.
    let o = virt(kc, &["-n", ns, "restart", "vm1"])?;
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("has no running VMI"),
        "{o:?}"
    );
    ok(virt(kc, &["-n", ns, "stop", "vm1"])?)?;
    let o = virt(kc, &["-n", ns, "restart", "vm1"])?;
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("runStrategy Halted"),
        "{o:?}"
    );
    let o = virt(kc, &["-n", ns, "stop", "nope"])?;
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("not found"),
        "{o:?}"
    );
    // The default namespace of the kubeconfig is used without -n: vm1 is not there.
    let o = virt(kc, &["stop", "vm1"])?;
    assert!(!o.status.success(), "{o:?}");
    Ok(())
}

#[test]
fn console_pause_unpause_snapshot_exec_into_the_launcher_pod() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("kubectl-virt-fake-{}", std::process::id()));
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
