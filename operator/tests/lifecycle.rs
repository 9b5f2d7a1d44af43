//! The `virt-operator` binary under failure: leader election (a standby is Ready, a released
//! Lease is taken over at once, a hung renew stops the leader before its Lease expires) and
//! shutdown (SIGTERM right after the API server went away, a second signal, a metrics port in
//! use). Each test drives the real binary against a real kube-apiserver that it stops or
//! freezes (SIGSTOP) on purpose.

mod common;

use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One `virt-operator` process; killed on drop.
struct Operator {
    child: Child,
    output: Arc<Mutex<String>>,
    /// The threads copying stdout and stderr into `output` (they end at EOF).
    readers: Vec<std::thread::JoinHandle<()>>,
    addr: SocketAddr,
}

fn free_addr() -> Result<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

impl Operator {
    /// Start on a free metrics port, watching namespace `work`; with `--leader-elect` and
    /// identity `id` when `id` is given.
    fn start(kubeconfig: &Path, id: Option<&str>) -> Result<Self> {
        let addr = free_addr()?;
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_virt-operator"));
        cmd.env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info,kube=warn")
            .args(["--namespace=work", &format!("--metrics-addr={addr}")]);
        if let Some(id) = id {
            cmd.args(["--leader-elect", &format!("--identity={id}")]);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting virt-operator")?;
        let output = Arc::new(Mutex::new(String::new()));
        let readers: [Box<dyn Read + Send>; 2] = [
            Box::new(child.stdout.take().context("stdout")?),
            Box::new(child.stderr.take().context("stderr")?),
        ];
        let mut threads = Vec::new();
        for mut r in readers {
            let out = output.clone();
            threads.push(std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = r.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                    out.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push_str(&text);
                }
            }));
        }
        Ok(Self {
            child,
            output,
            readers: threads,
            addr,
        })
    }

    fn output(&self) -> String {
        self.output
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on the pid of a child this test spawned and has not reaped yet.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
        assert_eq!(rc, 0, "kill({sig})");
    }

    /// Wait up to `limit` for the process to exit; returns its status and how long it took.
    async fn wait_exit(&mut self, limit: Duration) -> Result<(ExitStatus, Duration)> {
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait()? {
                let took = start.elapsed();
                // Everything it wrote is in `output` once the copying threads saw EOF.
                for r in self.readers.drain(..) {
                    let _ = r.join();
                }
                return Ok((st, took));
            }
            if start.elapsed() > limit {
                bail!(
                    "virt-operator still running {limit:?} later; output:\n{}",
                    self.output()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `/readyz`: (status code, body), or None when nothing answers.
    async fn readyz(&self) -> Option<(u16, String)> {
        let mut s = tokio::net::TcpStream::connect(self.addr).await.ok()?;
        s.write_all(b"GET /readyz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        let code = out.split_whitespace().nth(1)?.parse().ok()?;
        let body = out
            .split("\r\n\r\n")
            .nth(1)
            .unwrap_or("")
            .trim()
            .to_string();
        Some((code, body))
    }

    async fn wait_ready(&self) -> Result<String> {
        wait_for("/readyz 200", WAIT, || async {
            Ok(self.readyz().await.filter(|(c, _)| *c == 200).map(|r| r.1))
        })
        .await
        .with_context(|| format!("output:\n{}", self.output()))
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn holder(leases: &Api<Lease>) -> Result<Option<String>> {
    Ok(leases
        .get_opt("microvirt-operator")
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty()))
}

async fn setup(cluster: &microvirt_testsupport::Cluster) -> Result<Api<Lease>> {
    let kc = cluster.kubeconfig_path();
    install_crds(kc)?;
    for ns in ["work", "microvirt"] {
        let (ok, _, err) = kubectl(kc, &["create", "namespace", ns], None)?;
        assert!(ok, "{err}");
    }
    Ok(Api::namespaced(client_for(kc).await?, "microvirt"))
}

/// A 2-replica Deployment only completes a rolling update when the standby is Ready; a leader
/// that shuts down hands the Lease over at once; a leader whose renewals hang stops before its
/// Lease can expire (client-go's renew deadline), never leading alongside a new holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_is_ready_release_hands_over_and_a_hung_renew_stops_the_leader() -> Result<()> {
    let cluster = tokio::task::block_in_place(start_cluster);
    let leases = setup(&cluster).await?;
    let kc = cluster.kubeconfig_path();

    let a = Operator::start(kc, Some("replica-a"))?;
    let ready_a = a.wait_ready().await?;
    assert_eq!(ready_a, "ok: leading");
    assert_eq!(holder(&leases).await?.as_deref(), Some("replica-a"));
    let mut b = Operator::start(kc, Some("replica-b"))?;
    let ready_b = b.wait_ready().await?;
    assert_eq!(ready_b, "ok: standing by for leadership");
    assert_eq!(holder(&leases).await?.as_deref(), Some("replica-a"));

    // SIGTERM to the leader: exit 0, Lease released (holder cleared), the standby takes over
    // at its next retry (2 s) instead of after the 15 s lease duration.
    let mut a = a;
    a.signal(libc::SIGTERM);
    let (st, _) = a.wait_exit(Duration::from_secs(10)).await?;
    assert!(st.success(), "exit {st}; output:\n{}", a.output());
    assert!(a.output().contains("released the lease"), "{}", a.output());
    let released = Instant::now();
    eprintln!("leader SIGTERM with the API server up: {st}");
    wait_for(
        "replica-b holds the lease",
        Duration::from_secs(10),
        || async { Ok((holder(&leases).await?.as_deref() == Some("replica-b")).then_some(())) },
    )
    .await?;
    eprintln!(
        "standby took over {:?} after the leader exited",
        released.elapsed()
    );
    assert!(
        released.elapsed() < Duration::from_secs(10),
        "took {:?}: the lease was not released",
        released.elapsed()
    );
    wait_for("replica-b leading and ready", WAIT, || async {
        Ok(b.readyz()
            .await
            .filter(|(c, body)| *c == 200 && body == "ok: leading"))
    })
    .await?;

    // The API server hangs (SIGSTOP): b's renewals hang. It must stop leading within the renew
    // deadline (10 s after its last renewal), before that renewal's lease expires (15 s) and
    // another replica could take over, and exit non-zero.
    let (st, took, exited_at) = {
        let _frozen = cluster
            .freeze_apiserver()
            .context("kube-apiserver not running")?;
        let frozen_at = Instant::now();
        let (st, _) = b.wait_exit(Duration::from_secs(30)).await?;
        (st, frozen_at.elapsed(), k8s_openapi::jiff::Timestamp::now())
    };
    eprintln!("leader with a frozen API server: {st} after {took:?}");
    assert!(!st.success(), "exit {st}; output:\n{}", b.output());
    // The last renewal that reached the API server, and how long it made the lease valid.
    let spec = leases
        .get("microvirt-operator")
        .await?
        .spec
        .context("lease spec")?;
    assert_eq!(spec.holder_identity.as_deref(), Some("replica-b"));
    let renewed = spec.renew_time.context("renewTime")?.0;
    let expires = renewed
        + k8s_openapi::jiff::SignedDuration::from_secs(
            spec.lease_duration_seconds.unwrap_or(0).into(),
        );
    assert!(
        exited_at < expires,
        "still leading at {exited_at}, the lease renewed at {renewed} expired at {expires}; output:\n{}",
        b.output()
    );
    assert!(
        b.output().contains("lost the lease microvirt-operator"),
        "{}",
        b.output()
    );
    Ok(())
}

/// SIGTERM right after the API server was stopped, and to an operator that never reached it
/// (its caches never fill): it exits 0 within its shutdown bound (drain 3 s + lease release
/// 2 s) although nothing answers. With the API server frozen, a second signal ends the
/// shutdown at once (status 128 + SIGINT).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_without_an_api_server_and_a_second_signal() -> Result<()> {
    let mut cluster = tokio::task::block_in_place(start_cluster);
    let leases = setup(&cluster).await?;
    let kc = cluster.kubeconfig_path().to_path_buf();

    let mut op = Operator::start(&kc, Some("solo"))?;
    op.wait_ready().await?;
    tokio::task::block_in_place(|| cluster.stop_apiserver());
    op.signal(libc::SIGTERM);
    let (st, took) = op.wait_exit(Duration::from_secs(20)).await?;
    eprintln!("SIGTERM right after the API server was killed: {st} after {took:?}");
    assert!(st.success(), "exit {st}; output:\n{}", op.output());
    assert!(
        took < Duration::from_secs(8),
        "took {took:?}; output:\n{}",
        op.output()
    );

    // An operator (no leader election) that starts while the API server is down: its caches
    // never fill, reconciles wait for them; SIGTERM still ends it within the bound.
    let mut op = Operator::start(&kc, None)?;
    wait_for("the operator serving /readyz", WAIT, || async {
        Ok(op.readyz().await.filter(|(c, _)| *c == 503))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    op.signal(libc::SIGTERM);
    let (st, took) = op.wait_exit(Duration::from_secs(20)).await?;
    eprintln!("SIGTERM to an operator that never reached the API server: {st} after {took:?}");
    assert!(st.success(), "exit {st}; output:\n{}", op.output());
    assert!(
        took < Duration::from_secs(8),
        "took {took:?}; output:\n{}",
        op.output()
    );
    tokio::task::block_in_place(|| cluster.start_apiserver())?;

    // The lease of the previous run is still held (its release could not reach the API
    // server); a new operator waits for it to expire, then leads.
    let mut op = Operator::start(&kc, Some("solo-2"))?;
    wait_for("solo-2 leading", Duration::from_secs(40), || async {
        Ok(op
            .readyz()
            .await
            .filter(|(c, body)| *c == 200 && body == "ok: leading"))
    })
    .await?;
    assert_eq!(holder(&leases).await?.as_deref(), Some("solo-2"));
    {
        let _frozen = cluster
            .freeze_apiserver()
            .context("kube-apiserver not running")?;
        op.signal(libc::SIGTERM);
        wait_for("shutdown started", WAIT, || async {
            Ok(op.output().contains("shutting down").then_some(()))
        })
        .await?;
        // The orderly shutdown now waits for the frozen API server (lease release, 2 s).
        op.signal(libc::SIGINT);
        let (st, took) = op.wait_exit(Duration::from_secs(10)).await?;
        eprintln!("second signal: {st} after {took:?}");
        assert_eq!(
            st.code(),
            Some(128 + libc::SIGINT),
            "output:\n{}",
            op.output()
        );
        assert!(
            took < Duration::from_secs(1),
            "took {took:?} after the second signal"
        );
        assert!(op.output().contains("second signal"), "{}", op.output());
    }
    Ok(())
}

/// The metrics port is taken: one line on stderr naming the address and the flag, status 1.
#[tokio::test]
async fn a_metrics_port_in_use_is_one_clear_line() -> Result<()> {
    let taken = TcpListener::bind("127.0.0.1:0")?;
    let addr = taken.local_addr()?;
    // A kubeconfig is read but never used: the port is checked first.
    let dir = std::env::temp_dir().join(format!("virt-operator-port-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let kc = dir.join("kubeconfig");
    std::fs::write(
        &kc,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:1'}\n\
         users:\n- name: u\n  user: {token: x}\ncontexts:\n- name: c\n  context: {cluster: c, user: u}\n\
         current-context: c\n",
    )?;
    let out = Command::new(env!("CARGO_BIN_EXE_virt-operator"))
        .env("KUBECONFIG", &kc)
        .env("RUST_LOG", "off")
        .arg(format!("--metrics-addr={addr}"))
        .output()?;
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr:\n{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "stderr:\n{stderr}");
    assert_eq!(
        stderr.trim_end(),
        format!(
            "virt-operator: --metrics-addr {addr}: address already in use; stop the other process or choose another address with --metrics-addr"
        )
    );
    drop(taken);
    Ok(())
}
