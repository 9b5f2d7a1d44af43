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
use std::thread;
use std::time::{Duration, Instant};

use microvirt_testsupport::node::teardown::{self, HOST_VETH, KUBELET_SYSCTLS};
use microvirt_testsupport::node::NodePaths;
use microvirt_testsupport::oci::{Entry, Image};
use microvirt_testsupport::{RealCluster, RealClusterOptions};
use serde_json::Value;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

fn kubectl(rc: &RealCluster, args: &[&str], stdin: Option<&str>) -> Result<String> {
    let mut c = rc.kubectl();
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

#[test]
fn a_real_node_runs_pods_and_leaves_nothing_behind() -> Result {
    let before = sysctls();
    let paths = NodePaths::default();
    let rc = RealCluster::start(RealClusterOptions::default())?;
    let node_ip = rc.node().options().network.node_ip;
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
    assert!(teardown::node_processes(
        &paths,
        &["kubelet", "containerd", "containerd-shim-runc-v2", "pause"]
    )
    .is_empty());
    let left: Vec<_> = teardown::mounts()
        .into_iter()
        .filter(|(p, _)| paths.mount_roots().iter().any(|r| p.starts_with(r)))
        .collect();
    assert!(left.is_empty(), "mounts left: {left:?}");
    for m in teardown::cgroup_mounts() {
        assert!(
            !m.join("microvirt-node").exists(),
            "cgroup left in {}",
            m.display()
        );
    }
    assert!(!Path::new("/sys/class/net").join(HOST_VETH).exists());
    let routes = Command::new("/usr/sbin/ip").args(["route"]).output()?;
    assert!(!String::from_utf8_lossy(&routes.stdout).contains("10.244.0.0"));
    assert_eq!(sysctls(), before);
    assert!(!paths.run().exists());
    Ok(())
}
