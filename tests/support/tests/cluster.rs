//! End-to-end: real etcd + kube-apiserver processes.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use microvirt_testsupport::{detached, Cluster, ClusterOptions};
use serde_json::Value;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

fn alive(pid: u32) -> bool {
    // A reaped process has no /proc entry; a zombie would still show "Z" in its stat.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

fn kubectl(kubeconfig: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(String::from_utf8(out.stdout)?)
}

fn json(body: &str) -> Result<Value> {
    Ok(serde_json::from_str(body)?)
}

#[test]
fn configmap_survives_apiserver_restart_and_drop_cleans_up() -> Result {
    let t = Instant::now();
    let mut cluster = Cluster::start(ClusterOptions::default())?;
    eprintln!("start to ready: {:.1} s", t.elapsed().as_secs_f64());
    assert!(cluster.server_url().starts_with("https://127.0.0.1:"));

    // kubectl, through the generated kubeconfig.
    let ns = kubectl(cluster.kubeconfig_path(), &["get", "ns", "-o", "name"])?;
    assert!(ns.contains("namespace/default"), "{ns}");
    assert!(ns.contains("namespace/kube-system"), "{ns}");
    let res = kubectl(cluster.kubeconfig_path(), &["api-resources", "-o", "name"])?;
    assert!(res.lines().any(|l| l == "configmaps"), "{res}");
    assert!(
        res.lines()
            .any(|l| l == "customresourcedefinitions.apiextensions.k8s.io"),
        "{res}"
    );

    // Create and read back a ConfigMap over HTTP.
    let cm = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"probe"},"data":{"answer":"42"}}"#;
    let r = cluster.request("POST", "/api/v1/namespaces/default/configmaps", Some(cm))?;
    assert_eq!(r.status, 201, "{}", r.body);
    let r = cluster.request("GET", "/api/v1/namespaces/default/configmaps/probe", None)?;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(json(&r.body)?["data"]["answer"], "42");
    let uid = json(&r.body)?["metadata"]["uid"].clone();

    // Pods can be created without a controller-manager (ServiceAccount admission is off).
    let pod = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},
        "spec":{"containers":[{"name":"c","image":"example.invalid/none:1"}]}}"#;
    let r = cluster.request("POST", "/api/v1/namespaces/default/pods", Some(pod))?;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(json(&r.body)?["status"]["phase"], "Pending");

    // Restart the apiserver: new process, same port, same data.
    let old_api = cluster.apiserver_pid().ok_or("no apiserver pid")?;
    let etcd = cluster.etcd_pid().ok_or("no etcd pid")?;
    let url = cluster.server_url().to_string();
    let t = Instant::now();
    cluster.restart_apiserver()?;
    eprintln!(
        "apiserver restart to ready: {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let new_api = cluster
        .apiserver_pid()
        .ok_or("no apiserver pid after restart")?;
    assert_ne!(old_api, new_api);
    assert!(!alive(old_api), "old apiserver {old_api} still runs");
    assert_eq!(cluster.etcd_pid(), Some(etcd));
    assert_eq!(cluster.server_url(), url);
    let r = cluster.request("GET", "/api/v1/namespaces/default/configmaps/probe", None)?;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = json(&r.body)?;
    assert_eq!(v["data"]["answer"], "42");
    assert_eq!(v["metadata"]["uid"], uid);
    let got = kubectl(
        cluster.kubeconfig_path(),
        &["get", "configmap", "probe", "-o", "jsonpath={.data.answer}"],
    )?;
    assert_eq!(got, "42");

    // Stop: nothing listens; start: back on the same port with the same data.
    let port: u16 = url.rsplit(':').next().ok_or("port")?.parse()?;
    cluster.stop_apiserver();
    assert!(!alive(new_api), "stopped apiserver {new_api} still runs");
    assert_eq!(cluster.apiserver_pid(), None);
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    cluster.start_apiserver()?;
    let new_api = cluster
        .apiserver_pid()
        .ok_or("no apiserver pid after start")?;
    let r = cluster.request("GET", "/api/v1/namespaces/default/configmaps/probe", None)?;
    assert_eq!(json(&r.body)?["data"]["answer"], "42");

    // Freeze: connections are accepted but nothing answers, until the guard drops.
    // `patience`: how long to wait for an answer. A running apiserver answers at once, but on a
    // busy machine "at once" can take seconds, so only the frozen case gets a short window (the
    // freeze itself is known: `freeze_apiserver` returns once every thread is stopped).
    let answers = |patience: u64| -> Result<bool> {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(("127.0.0.1", port))?;
        c.set_read_timeout(Some(std::time::Duration::from_secs(patience)))?;
        c.write_all(b"not TLS\r\n\r\n")?;
        let mut buf = [0u8; 64];
        Ok(match c.read(&mut buf) {
            Ok(_) => true, // an alert, or the connection closed: someone is there
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                false
            }
            Err(_) => true,
        })
    };
    assert!(answers(60)?);
    {
        let _frozen = cluster.freeze_apiserver().ok_or("not running")?;
        assert!(!answers(2)?, "a frozen apiserver answered");
    }
    assert!(answers(60)?, "a resumed apiserver did not answer");
    let r = cluster.request("GET", "/readyz", None)?;
    assert_eq!(r.status, 200, "{}", r.body);

    // Drop: both processes gone, data dir removed.
    let dir = cluster.data_dir().to_path_buf();
    assert!(dir.join("logs/kube-apiserver.log").is_file());
    drop(cluster);
    assert!(!alive(new_api), "apiserver {new_api} survived drop");
    assert!(!alive(etcd), "etcd {etcd} survived drop");
    assert!(!dir.exists(), "{} survived drop", dir.display());
    Ok(())
}

#[test]
fn two_clusters_are_isolated_and_persistent_mode_outlives_drop() -> Result {
    // A persistent cluster in a chosen dir, next to a default one.
    let state =
        std::env::temp_dir().join(format!("microvirt-persistent-test-{}", std::process::id()));
    // Stops the persistent cluster even when an assertion below fails.
    struct Cleanup<'a>(&'a Path);
    impl Drop for Cleanup<'_> {
        fn drop(&mut self) {
            let _ = detached::stop(self.0);
        }
    }
    let _cleanup = Cleanup(&state);
    let persistent = Cluster::start(ClusterOptions {
        data_dir: Some(state.clone()),
        persistent: true,
        ..Default::default()
    })?;
    let other = Cluster::start(ClusterOptions::default())?;
    assert_ne!(persistent.server_url(), other.server_url());

    let cm = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"only-here"}}"#;
    let r = persistent.request("POST", "/api/v1/namespaces/default/configmaps", Some(cm))?;
    assert_eq!(r.status, 201, "{}", r.body);
    let r = other.request(
        "GET",
        "/api/v1/namespaces/default/configmaps/only-here",
        None,
    )?;
    assert_eq!(r.status, 404, "{}", r.body);
    drop(other);

    let (etcd, api) = (
        persistent.etcd_pid().ok_or("etcd")?,
        persistent.apiserver_pid().ok_or("api")?,
    );
    drop(persistent);
    assert!(
        alive(etcd) && alive(api),
        "a persistent cluster must outlive its handle"
    );
    let st = detached::status(&state);
    assert!(st.healthy(), "{st:?}");
    assert_eq!((st.etcd, st.kube_apiserver), (Some(etcd), Some(api)));
    let got = kubectl(
        &st.kubeconfig,
        &["get", "configmap", "only-here", "-o", "name"],
    )?;
    assert_eq!(got.trim(), "configmap/only-here");

    assert!(detached::stop(&state)?);
    assert!(!state.exists());
    let st = detached::status(&state);
    assert!(!st.any_running(), "{st:?}");
    assert!(!detached::stop(&state)?);
    Ok(())
}

#[test]
fn watchdog_stops_the_cluster_when_its_owner_is_killed() -> Result {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::time::Duration;

    let mut holder = Command::new(env!("CARGO_BIN_EXE_hold-cluster"))
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(holder.stdout.take().ok_or("no stdout")?).read_line(&mut line)?;
    let parts: Vec<&str> = line.split_whitespace().collect();
    let [dir, etcd, api] = parts[..] else {
        let _ = holder.kill();
        return Err(format!("unexpected line {line:?}").into());
    };
    let (dir, etcd, api) = (
        Path::new(dir).to_path_buf(),
        etcd.parse::<u32>()?,
        api.parse::<u32>()?,
    );
    assert!(alive(etcd) && alive(api) && dir.is_dir());

    holder.kill()?; // SIGKILL: no destructor runs
    holder.wait()?;
    let t = Instant::now();
    while (alive(etcd) || alive(api) || dir.exists()) && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "watchdog cleaned up {:.1} s after the owner died",
        t.elapsed().as_secs_f64()
    );
    assert!(!alive(etcd), "etcd {etcd} leaked");
    assert!(!alive(api), "kube-apiserver {api} leaked");
    assert!(!dir.exists(), "{} leaked", dir.display());
    Ok(())
}

/// `wait_crds_established` returns once a freshly applied CRD is established (it polls the
/// condition, so a CRD without conditions yet is waited for, not an error), and names the CRDs
/// it still waits for when the time is up.
#[test]
fn crds_are_waited_for_until_established() -> Result {
    let cluster = Cluster::start(ClusterOptions::default())?;
    let kc = cluster.kubeconfig_path();
    let crd = r#"{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition",
"metadata":{"name":"widgets.test.microvirt.io"},
"spec":{"group":"test.microvirt.io","scope":"Namespaced",
"names":{"plural":"widgets","singular":"widget","kind":"Widget"},
"versions":[{"name":"v1","served":true,"storage":true,
"schema":{"openAPIV3Schema":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}]}}"#;
    let path = cluster.data_dir().join("widgets-crd.json");
    std::fs::write(&path, crd)?;
    kubectl(kc, &["apply", "-f", &path.display().to_string()])?;
    microvirt_testsupport::wait_crds_established(
        kc,
        &["widgets.test.microvirt.io"],
        microvirt_testsupport::CRDS_ESTABLISHED_WITHIN,
    )?;
    let status = kubectl(
        kc,
        &[
            "get",
            "crd",
            "widgets.test.microvirt.io",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Established\")].status}",
        ],
    )?;
    assert_eq!(status.trim(), "True");
    let err = microvirt_testsupport::wait_crds_established(
        kc,
        &["widgets.test.microvirt.io", "gadgets.test.microvirt.io"],
        std::time::Duration::from_secs(1),
    )
    .expect_err("gadgets do not exist");
    assert!(
        err.contains("gadgets.test.microvirt.io") && !err.contains("widgets"),
        "{err}"
    );
    Ok(())
}
