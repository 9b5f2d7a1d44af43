//! End-to-end: a whole single-node cluster from real parts runs a pod — scheduled, started by
//! containerd + runc, CNI bridge address reachable from the node and the host, exec readiness
//! probe, an image volume with content, `kubectl exec` and `logs` — a missing image fails
//! cleanly, and teardown leaves nothing on the machine.
//!
//! Needs root, /dev access and the Debian packages runc, containernetworking-plugins, nftables
//! (`cargo xtask test` installs them).

use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use microvirt_testsupport::node::teardown::{self, HOST_VETH, KUBELET_SYSCTLS};
use microvirt_testsupport::node::NodePaths;
use microvirt_testsupport::oci::{BuiltImage, Entry, Image};
use microvirt_testsupport::{RealCluster, RealClusterOptions};
use serde_json::Value;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// One node per machine, and the killed-owner test checks that nothing of a node is left, so
/// this file's tests run one after the other (the machine's node lock alone would let the next
/// test's node start the moment the killed owner's lock is released).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn kubectl(rc: &RealCluster, args: &[&str], stdin: Option<&str>) -> Result<String> {
    kubectl_at(rc.kubeconfig_path(), args, stdin)
}

fn kubectl_at(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Result<String> {
    let mut c = Command::new("kubectl");
    c.arg(format!("--kubeconfig={}", kubeconfig.display()));
    c.args(args);
    let out = if let Some(input) = stdin {
        c.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = c.spawn()?;
        child.stdin.take().unwrap().write_all(input.as_bytes())?;
        child.wait_with_output()?
    } else {
        c.output()?
    };
    if !out.status.success() {
        return Err(format!(
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into());
    }
    Ok(String::from_utf8(out.stdout)?)
}

fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Result<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if start.elapsed() > timeout {
            return Err(format!("timed out after {timeout:?} waiting for {what}").into());
        }
        thread::sleep(Duration::from_millis(250));
    }
}

fn pod(rc: &RealCluster, ns: &str, name: &str) -> Option<Value> {
    let out = kubectl(rc, &["-n", ns, "get", "pod", name, "-o", "json"], None).ok()?;
    serde_json::from_str(&out).ok()
}

fn sysctls() -> Vec<(String, String)> {
    KUBELET_SYSCTLS
        .iter()
        .map(|k| {
            (
                k.to_string(),
                fs::read_to_string(Path::new("/proc/sys").join(k))
                    .unwrap_or_default()
                    .trim()
                    .to_string(),
            )
        })
        .collect()
}

fn http_get(addr: SocketAddr, path: &str) -> Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n")?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    Ok(body)
}

const POD: &str = r#"apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: microvirt-test/busybox:1
    command: ["/bin/sh", "-c", "echo started; touch /tmp/ready; exec httpd -f -p 8080 -h /data"]
    readinessProbe:
      exec: {command: ["/bin/test", "-f", "/tmp/ready"]}
      periodSeconds: 1
    volumeMounts:
    - {name: data, mountPath: /data, readOnly: true}
  volumes:
  - name: data
    image: {reference: microvirt-test/data:1, pullPolicy: Never}
"#;

const MISSING: &str = r#"apiVersion: v1
kind: Pod
metadata: {name: missing}
spec:
  containers:
  - name: c
    image: microvirt-test/does-not-exist:1
    imagePullPolicy: Never
"#;

/// The test's images: busybox (sh, httpd, ...) and a data image for an image volume.
fn test_images() -> Result<(BuiltImage, BuiltImage)> {
    let cache = microvirt_testsupport::cache_root()?.join("oci");
    let bb = Image {
        name: "docker.io/microvirt-test/busybox:1".into(),
        entries: ["sh", "httpd", "test", "cat", "touch", "echo"]
            .iter()
            .map(|a| Entry::symlink(format!("bin/{a}"), "busybox"))
            .chain([
                Entry::file("bin/busybox", "/bin/busybox", true),
                Entry::dir("tmp"),
            ])
            .collect(),
        ..Default::default()
    }
    .build(&cache)?;
    let data = Image {
        name: "docker.io/microvirt-test/data:1".into(),
        entries: vec![Entry::bytes(
            "hello.txt",
            b"hello from an image volume\n".to_vec(),
        )],
        ..Default::default()
    }
    .build(&cache)?;
    Ok((bb, data))
}

/// Waits for the readiness of pod `name` in `ns`.
fn wait_ready(kubeconfig: &Path, ns: &str, name: &str) -> Result<Value> {
    wait_for(
        &format!("pod {name} Ready"),
        Duration::from_secs(120),
        || {
            let out = kubectl_at(
                kubeconfig,
                &["-n", ns, "get", "pod", name, "-o", "json"],
                None,
            )
            .ok()?;
            let p: Value = serde_json::from_str(&out).ok()?;
            let ready = p["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            ready.then_some(p)
        },
    )
}

/// What a node left on the machine (empty: nothing).
fn leftovers(paths: &NodePaths, sysctls_before: &[(String, String)]) -> Vec<String> {
    let mut left = Vec::new();
    let procs = teardown::node_processes(
        paths,
        &["kubelet", "containerd", "containerd-shim-runc-v2", "pause"],
    );
    if !procs.is_empty() {
        left.push(format!("processes {procs:?}"));
    }
    let mounts: Vec<_> = teardown::mounts()
        .into_iter()
        .filter(|(p, _)| paths.mount_roots().iter().any(|r| p.starts_with(r)))
        .collect();
    if !mounts.is_empty() {
        left.push(format!("mounts {mounts:?}"));
    }
    for m in teardown::cgroup_mounts() {
        if m.join("microvirt-node").exists() {
            left.push(format!("cgroup in {}", m.display()));
        }
    }
    if Path::new("/sys/class/net").join(HOST_VETH).exists() {
        left.push(format!("interface {HOST_VETH}"));
    }
    let routes = Command::new("/usr/sbin/ip")
        .args(["route"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    if routes.contains("10.244.0.0") {
        left.push("route to the pod subnet".into());
    }
    if sysctls() != sysctls_before {
        left.push(format!("kernel settings {:?}", sysctls()));
    }
    if paths.run().exists() {
        left.push(format!("{}", paths.run().display()));
    }
    left
}

#[test]
fn a_real_node_runs_pods_and_leaves_nothing_behind() -> Result {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let before = sysctls();
    let paths = NodePaths::default();
    let (bb, data) = test_images()?;
    let rc = RealCluster::start(RealClusterOptions::default())?;
    let node_ip = rc.node().options().network.node_ip;
    for i in [&bb, &data] {
        rc.node().import_image(&i.archive)?;
    }

    // The Node: Ready, its InternalIP the private address.
    let node: Value = serde_json::from_str(&kubectl(
        &rc,
        &["get", "node", rc.node_name(), "-o", "json"],
        None,
    )?)?;
    assert_eq!(
        node["status"]["addresses"][0]["address"],
        node_ip.to_string()
    );

    kubectl(&rc, &["create", "namespace", "t"], None)?;
    wait_for(
        "the default ServiceAccount",
        Duration::from_secs(60),
        || kubectl(&rc, &["-n", "t", "get", "sa", "default"], None).ok(),
    )?;
    kubectl(&rc, &["-n", "t", "apply", "-f", "-"], Some(POD))?;
    let p = wait_for("pod web Ready", Duration::from_secs(120), || {
        let p = pod(&rc, "t", "web")?;
        let ready = p["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        ready.then_some(p)
    })?;
    assert_eq!(p["spec"]["nodeName"], rc.node_name());
    let ip: Ipv4Addr = p["status"]["podIP"].as_str().unwrap().parse()?;
    assert!(rc.node().options().network.is_pod_ip(ip), "pod IP {ip}");

    // Reachable from the host (route into the node's namespace) ...
    let body = http_get(SocketAddr::from((ip, 8080)), "/hello.txt")?;
    assert!(body.contains("hello from an image volume"), "{body}");
    // ... and from inside the node's namespace.
    let out = rc
        .node()
        .netns()
        .command("/bin/busybox")
        .args([
            "wget",
            "-q",
            "-O",
            "-",
            &format!("http://{ip}:8080/hello.txt"),
        ])
        .output()?;
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("hello from an image volume"),
        "{out:?}"
    );
    // kubectl exec and logs go through the apiserver to the kubelet.
    let cat = kubectl(
        &rc,
        &["-n", "t", "exec", "web", "--", "cat", "/data/hello.txt"],
        None,
    )?;
    assert_eq!(cat, "hello from an image volume\n");
    // Pods' namespaces route (the CNI tuning plugin turns forwarding on in them).
    let fwd = kubectl(
        &rc,
        &[
            "-n",
            "t",
            "exec",
            "web",
            "--",
            "cat",
            "/proc/sys/net/ipv4/ip_forward",
        ],
        None,
    )?;
    assert_eq!(fwd.trim(), "1");
    let logs = kubectl(&rc, &["-n", "t", "logs", "web"], None)?;
    assert!(logs.contains("started"), "{logs}");

    // A missing image with pullPolicy Never: a clear reason, nothing hangs.
    kubectl(&rc, &["-n", "t", "apply", "-f", "-"], Some(MISSING))?;
    let message = wait_for("ErrImageNeverPull", Duration::from_secs(60), || {
        let p = pod(&rc, "t", "missing")?;
        let w = &p["status"]["containerStatuses"][0]["state"]["waiting"];
        (w["reason"] == "ErrImageNeverPull").then(|| w["message"].to_string())
    })?;
    assert!(message.contains("does-not-exist"), "{message}");

    // Pod deletion frees the pod's address on the node.
    kubectl(
        &rc,
        &["-n", "t", "delete", "pod", "web", "missing", "--wait=true"],
        None,
    )?;
    assert!(http_get(SocketAddr::from((ip, 8080)), "/").is_err());
    let kubelet_pid = rc.node().kubelet_pid().unwrap();

    // The kubelet sets kernel settings; teardown puts them back.
    drop(rc);
    assert!(!Path::new(&format!("/proc/{kubelet_pid}")).exists());
    let left = leftovers(&paths, &before);
    assert!(left.is_empty(), "left behind: {left:?}");
    Ok(())
}

/// Kills the holder process if the test ends early.
struct Holder(std::process::Child);

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An owner killed with SIGKILL (no destructor runs) while a pod runs: its watchdogs stop the
/// control plane and tear the node down (processes, containers, mounts, cgroups, veth, route,
/// kernel settings) without waiting for the next start.
#[test]
fn a_killed_owner_leaves_nothing_behind() -> Result {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let before = sysctls();
    let paths = NodePaths::default();
    let (bb, data) = test_images()?;
    let mut holder = Holder(
        Command::new(env!("CARGO_BIN_EXE_hold-cluster"))
            .arg("--real")
            .arg("--import")
            .arg(&bb.archive)
            .arg("--import")
            .arg(&data.archive)
            .stdout(Stdio::piped())
            .spawn()?,
    );
    let mut line = String::new();
    BufReader::new(holder.0.stdout.take().ok_or("no stdout")?).read_line(&mut line)?;
    let dir = Path::new(line.split_whitespace().next().ok_or("no data dir")?).to_path_buf();
    let kc = dir.join("kubeconfig");
    kubectl_at(&kc, &["create", "namespace", "k"], None)?;
    wait_for(
        "the default ServiceAccount",
        Duration::from_secs(60),
        || kubectl_at(&kc, &["-n", "k", "get", "sa", "default"], None).ok(),
    )?;
    kubectl_at(&kc, &["-n", "k", "apply", "-f", "-"], Some(POD))?;
    wait_ready(&kc, "k", "web")?;
    assert!(!teardown::node_processes(&paths, &["containerd-shim-runc-v2"]).is_empty());

    holder.0.kill()?; // SIGKILL
    holder.0.wait()?;
    let t = Instant::now();
    let mut left = leftovers(&paths, &before);
    while (!left.is_empty() || dir.exists()) && t.elapsed() < Duration::from_secs(90) {
        thread::sleep(Duration::from_millis(250));
        left = leftovers(&paths, &before);
    }
    eprintln!(
        "watchdogs cleaned up {:.1} s after the owner died",
        t.elapsed().as_secs_f64()
    );
    assert!(left.is_empty(), "left behind: {left:?}");
    assert!(!dir.exists(), "{} left behind", dir.display());
    Ok(())
}
