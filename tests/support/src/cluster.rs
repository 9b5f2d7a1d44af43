//! [`Cluster`]: a private etcd + kube-apiserver on 127.0.0.1.

use std::fs::{self, OpenOptions};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;

use crate::binaries::{ensure_binaries, Binaries, BinariesError};
use crate::certs::{self, CertError};
use crate::http::{plain_get, ApiClient, Connected, HttpError, Response};
use crate::process::{
    continue_process, free_port, log_tail, random_hex, signal, stop_child, stop_process,
};

/// Errors starting or driving a [`Cluster`].
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The binaries could not be built.
    #[error(transparent)]
    Binaries(#[from] BinariesError),
    /// The PKI could not be generated.
    #[error(transparent)]
    Certs(#[from] CertError),
    /// An HTTP exchange with the apiserver failed.
    #[error(transparent)]
    Http(#[from] HttpError),
    /// A file-system or process operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: io::Error,
    },
    /// A process exited while we waited for it to become ready.
    #[error("{what} exited ({status}) before it was ready; the end of {log}:\n{tail}")]
    Exited {
        /// `etcd` or `kube-apiserver`.
        what: &'static str,
        /// How it ended.
        status: String,
        /// Its log file.
        log: PathBuf,
        /// The log's last lines.
        tail: String,
    },
    /// A process did not become ready in time.
    #[error("{what} not ready after {waited:?} (last answer: {last}); the end of {log}:\n{tail}")]
    NotReady {
        /// `etcd` or `kube-apiserver`.
        what: &'static str,
        /// How long we waited.
        waited: Duration,
        /// The last probe result.
        last: String,
        /// Its log file.
        log: PathBuf,
        /// The log's last lines.
        tail: String,
    },
}

impl ClusterError {
    fn port_clash(&self) -> bool {
        matches!(self, ClusterError::Exited { tail, .. } if tail.contains("address already in use"))
    }
}

fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> ClusterError {
    let context = context.into();
    move |source| ClusterError::Io { context, source }
}

/// How to start a [`Cluster`]. `Default` is what tests want.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Where certificates, etcd data, the kubeconfig and logs go. `None` (default): a fresh
    /// directory under the system temp dir, removed when the cluster is dropped. A given
    /// directory is created if needed and kept on drop; every start re-initialises it (new
    /// certificates, and any etcd data a previous cluster left there is discarded).
    pub data_dir: Option<PathBuf>,
    /// Leave both processes running and the data dir in place when the [`Cluster`] is dropped
    /// (for `cargo xtask cluster up`; stop it with [`crate::detached::stop`]). Default false:
    /// dropping stops everything, and a watchdog stops it if the test process dies first.
    pub persistent: bool,
    /// How long etcd, then kube-apiserver, may take to become ready. Default 120 s (the
    /// apiserver needs ~5-15 s on an idle 2-core machine; much more when it shares the cores).
    pub ready_timeout: Duration,
    /// Extra kube-apiserver flags, appended after the defaults (a later flag wins).
    pub extra_apiserver_args: Vec<String>,
    /// The address kube-apiserver listens on and advertises. Default 127.0.0.1; a real node
    /// whose kubelet runs in another network namespace needs an address it can reach (see
    /// [`crate::RealCluster`]). etcd always stays on 127.0.0.1.
    pub bind_address: Ipv4Addr,
    /// Extra IP addresses for the serving certificate (e.g. the `kubernetes` Service's
    /// cluster IP, which in-cluster clients connect to).
    pub extra_serving_ips: Vec<Ipv4Addr>,
    /// Keep the `ServiceAccount` admission plugin (default false: without a
    /// kube-controller-manager no namespace gets its `default` account and the plugin would
    /// refuse every pod; with one, as in [`crate::RealCluster`], pods need it for their
    /// service-account tokens).
    pub service_account_admission: bool,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            data_dir: None,
            persistent: false,
            ready_timeout: Duration::from_secs(120),
            extra_apiserver_args: Vec::new(),
            bind_address: Ipv4Addr::LOCALHOST,
            extra_serving_ips: Vec::new(),
            service_account_admission: false,
        }
    }
}

/// A running etcd + kube-apiserver pair, private to its owner.
///
/// Dropping it stops both (SIGTERM, then SIGKILL after a grace period) and removes the data
/// directory, unless it was started with [`ClusterOptions::persistent`].
pub struct Cluster {
    dir: PathBuf,
    remove_dir: bool,
    persistent: bool,
    started: bool,
    binaries: Binaries,
    etcd: Option<Child>,
    apiserver: Option<Child>,
    watchdog: Option<Child>,
    apiserver_args: Vec<String>,
    etcd_port: u16,
    server_url: String,
    kubeconfig: PathBuf,
    client: Option<ApiClient>,
    ready_timeout: Duration,
}

/// Per-request time limit for readiness probes and [`Cluster::request`].
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

static DIR_COUNTER: AtomicU32 = AtomicU32::new(0);

fn fresh_temp_dir() -> Result<PathBuf, ClusterError> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!(
        "microvirt-cluster-{}-{}-{nanos:x}",
        std::process::id(),
        DIR_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    fs::create_dir(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
    Ok(dir)
}

/// Shell text of the watchdog: waits for the test process to go away, then stops the processes
/// named in the data dir's pid files (etcd, kube-apiserver, and whatever else an owner records
/// there, e.g. [`crate::RealCluster`]'s scheduler and controller-manager) and (when asked)
/// removes the data dir.
pub(crate) const WATCHDOG_SH: &str = r#"trap '' INT TERM HUP
parent=$1 dir=$2 remove=$3
while kill -0 "$parent" 2>/dev/null; do sleep 1; done
for sig in TERM KILL; do
  for f in "$dir"/*.pid; do
    p=$(cat "$f" 2>/dev/null) && [ -n "$p" ] && grep -qaF -- "$dir" "/proc/$p/cmdline" 2>/dev/null && kill -$sig "$p"
  done
  [ "$sig" = TERM ] && sleep 3
done
[ "$remove" = 1 ] && [ -z "$MICROVIRT_KEEP_CLUSTER_DIR" ] && rm -rf "$dir"
exit 0
"#;

impl Cluster {
    /// Builds the binaries if needed ([`ensure_binaries`]), then starts etcd and kube-apiserver
    /// and waits until `/readyz` answers `ok`.
    pub fn start(opts: ClusterOptions) -> Result<Cluster, ClusterError> {
        let binaries = ensure_binaries()?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::try_start(&opts, &binaries) {
                Err(e) if e.port_clash() && attempt < 3 => {
                    eprintln!("microvirt-testsupport: port clash, retrying: {e}");
                }
                other => return other,
            }
        }
    }

    fn try_start(opts: &ClusterOptions, binaries: &Binaries) -> Result<Cluster, ClusterError> {
        let started_at = Instant::now();
        let (dir, remove_dir) = match &opts.data_dir {
            Some(d) => {
                fs::create_dir_all(d).map_err(io_err(format!("creating {}", d.display())))?;
                let d =
                    fs::canonicalize(d).map_err(io_err(format!("resolving {}", d.display())))?;
                (d, false)
            }
            None => (fresh_temp_dir()?, true),
        };
        let old_etcd = dir.join("etcd");
        if old_etcd.exists() {
            fs::remove_dir_all(&old_etcd)
                .map_err(io_err(format!("removing {}", old_etcd.display())))?;
        }
        let mut c = Cluster {
            dir: dir.clone(),
            remove_dir,
            persistent: opts.persistent,
            started: false,
            binaries: binaries.clone(),
            etcd: None,
            apiserver: None,
            watchdog: None,
            apiserver_args: Vec::new(),
            etcd_port: 0,
            server_url: String::new(),
            kubeconfig: dir.join("kubeconfig"),
            client: None,
            ready_timeout: opts.ready_timeout,
        };
        for sub in ["pki", "logs"] {
            let p = dir.join(sub);
            fs::create_dir_all(&p).map_err(io_err(format!("creating {}", p.display())))?;
        }
        if !opts.persistent {
            c.start_watchdog()?;
        }

        let ips: Vec<IpAddr> = std::iter::once(opts.bind_address)
            .chain(opts.extra_serving_ips.iter().copied())
            .map(IpAddr::V4)
            .collect();
        let pki = certs::generate(&ips)?;
        let token = random_hex().map_err(io_err("reading /dev/urandom"))?;
        let p = |name: &str| dir.join("pki").join(name);
        let files = [
            ("ca.crt", pki.ca_pem.as_bytes()),
            ("ca.der", &pki.ca_der[..]),
            ("apiserver.crt", pki.serving_cert_pem.as_bytes()),
            ("apiserver.key", pki.serving_key_pem.as_bytes()),
            (
                "service-account.key",
                pki.service_account_key_pem.as_bytes(),
            ),
            (
                "service-account.pub",
                pki.service_account_pub_pem.as_bytes(),
            ),
            ("admin.token", token.as_bytes()),
        ];
        for (name, data) in files {
            fs::write(p(name), data).map_err(io_err(format!("writing {name}")))?;
        }
        // Static token file: token,user,uid,"groups".
        let tokens = format!("{token},microvirt-admin,microvirt-admin,\"system:masters\"\n");
        fs::write(p("tokens.csv"), tokens).map_err(io_err("writing tokens.csv"))?;

        let alloc = |ip| free_port(ip).map_err(io_err("finding a free port"));
        let lo = Ipv4Addr::LOCALHOST;
        let (etcd_port, peer_port) = (alloc(lo)?, alloc(lo)?);
        let api_port = alloc(opts.bind_address)?;
        c.etcd_port = etcd_port;
        let bind = opts.bind_address;
        c.server_url = format!("https://{bind}:{api_port}");

        // etcd: plain HTTP on loopback only.
        let client_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd_args = vec![
            "--name=microvirt".to_string(),
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=microvirt={peer_url}"),
            "--initial-cluster-state=new".to_string(),
            // A throw-away cluster: skip fsync (much faster on shared disks).
            "--unsafe-no-fsync=true".to_string(),
            "--log-level=warn".to_string(),
        ];
        c.etcd = Some(spawn(&binaries.etcd, &etcd_args, &c.log("etcd"))?);
        c.write_pid("etcd")?;
        c.wait_etcd_ready()?;

        let pki_arg = |flag: &str, name: &str| format!("--{flag}={}", p(name).display());
        let mut args = vec![
            format!("--etcd-servers={client_url}"),
            format!("--bind-address={bind}"),
            format!("--advertise-address={bind}"),
            format!("--secure-port={api_port}"),
            pki_arg("tls-cert-file", "apiserver.crt"),
            pki_arg("tls-private-key-file", "apiserver.key"),
            pki_arg("client-ca-file", "ca.crt"),
            pki_arg("token-auth-file", "tokens.csv"),
            pki_arg("service-account-key-file", "service-account.pub"),
            pki_arg("service-account-signing-key-file", "service-account.key"),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_string(),
            format!("--cert-dir={}", dir.join("pki").display()),
            "--authorization-mode=RBAC".to_string(),
            // Cluster IPs are only allocated as API data; nothing routes to them.
            "--service-cluster-ip-range=10.96.0.0/16".to_string(),
            // The `kubernetes` Service endpoints would point at 127.0.0.1, which validation
            // refuses; nothing in-cluster needs them.
            "--endpoint-reconciler-type=none".to_string(),
            "--allow-privileged=true".to_string(),
            "--profiling=false".to_string(),
            "--v=0".to_string(),
        ];
        if !opts.service_account_admission {
            // No controller-manager creates the `default` ServiceAccount, so this plugin would
            // refuse every pod.
            args.push("--disable-admission-plugins=ServiceAccount".to_string());
        }
        args.extend(opts.extra_apiserver_args.iter().cloned());
        c.apiserver_args = args;
        c.client = Some(ApiClient::new(
            &pki.ca_der,
            SocketAddr::new(IpAddr::V4(bind), api_port),
            &token,
        )?);
        c.write_kubeconfig(&pki.ca_pem, &token)?;
        fs::write(dir.join("server-url"), &c.server_url).map_err(io_err("writing server-url"))?;
        c.spawn_apiserver()?;
        c.started = true;
        eprintln!(
            "microvirt-testsupport: cluster ready at {} in {:.1} s (data dir {})",
            c.server_url,
            started_at.elapsed().as_secs_f64(),
            c.dir.display()
        );
        Ok(c)
    }

    /// The kubeconfig for the cluster admin (bearer token, `system:masters`).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// `https://<bind address>:<port>` (by default `https://127.0.0.1:<port>`).
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// The directory with certificates (`pki/`), etcd data, logs (`logs/`) and the kubeconfig.
    pub fn data_dir(&self) -> &Path {
        &self.dir
    }

    /// The binaries this cluster runs.
    pub fn binaries(&self) -> &Binaries {
        &self.binaries
    }

    /// Process id of etcd, while it runs.
    pub fn etcd_pid(&self) -> Option<u32> {
        self.etcd.as_ref().map(Child::id)
    }

    /// Process id of kube-apiserver, while it runs.
    pub fn apiserver_pid(&self) -> Option<u32> {
        self.apiserver.as_ref().map(Child::id)
    }

    /// Stops kube-apiserver and starts it again on the same port against the same etcd, then
    /// waits for `/readyz`. Clients see connection errors in between, as after a real
    /// control-plane restart; all stored objects survive (they live in etcd).
    pub fn restart_apiserver(&mut self) -> Result<(), ClusterError> {
        self.stop_apiserver_within(Duration::from_secs(30));
        self.start_apiserver()
    }

    /// Kills kube-apiserver (SIGKILL, as when its machine fails) and leaves it stopped: clients
    /// get "connection refused" until [`Cluster::start_apiserver`]. etcd keeps running.
    pub fn stop_apiserver(&mut self) {
        self.stop_apiserver_within(Duration::ZERO);
    }

    /// SIGTERM, then SIGKILL after `grace` (at once when zero).
    fn stop_apiserver_within(&mut self, grace: Duration) {
        if let Some(mut a) = self.apiserver.take() {
            if grace.is_zero() {
                let _ = a.kill();
                let _ = a.wait();
            } else {
                stop_child(&mut a, grace);
            }
        }
        let _ = fs::remove_file(self.dir.join("kube-apiserver.pid"));
    }

    /// Starts kube-apiserver again after [`Cluster::stop_apiserver`] (same port, same etcd)
    /// and waits for `/readyz`. Does nothing while it runs.
    pub fn start_apiserver(&mut self) -> Result<(), ClusterError> {
        if self.apiserver.is_some() {
            return Ok(());
        }
        let marker = "\n==== microvirt-testsupport: kube-apiserver started again ====\n";
        if let Ok(mut f) = OpenOptions::new()
            .append(true)
            .open(self.log("kube-apiserver"))
        {
            let _ = io::Write::write_all(&mut f, marker.as_bytes());
        }
        self.spawn_apiserver()
    }

    /// Freezes kube-apiserver (SIGSTOP) until the returned guard is dropped (SIGCONT): the kernel
    /// still accepts connections but nothing answers, as with a hung control plane or a network
    /// that drops packets. Returns once every apiserver thread is stopped ([`stop_process`]):
    /// right after the signal a thread could still answer. `None` while kube-apiserver is
    /// stopped; panics if it does not stop within [`crate::SIGNAL_ACTED_ON_WITHIN`].
    pub fn freeze_apiserver(&self) -> Option<FrozenApiserver<'_>> {
        let pid = self.apiserver_pid()?;
        if let Err(e) = stop_process(pid) {
            // Not frozen after all: make sure it runs before failing the test.
            signal(pid, libc::SIGCONT);
            panic!("freezing kube-apiserver: {e}");
        }
        Some(FrozenApiserver {
            pid,
            _cluster: self,
        })
    }

    /// Sends one request to the apiserver as the cluster admin. `body`, when given, is JSON.
    ///
    /// ```no_run
    /// # let cluster = microvirt_testsupport::Cluster::start(Default::default()).unwrap();
    /// let cm = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"},"data":{"k":"v"}}"#;
    /// let r = cluster.request("POST", "/api/v1/namespaces/default/configmaps", Some(cm)).unwrap();
    /// assert_eq!(r.status, 201);
    /// ```
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<Response, ClusterError> {
        let client = self
            .client
            .as_ref()
            .ok_or(HttpError::Malformed("cluster not started"))?;
        Ok(client.request(method, path, body, REQUEST_TIMEOUT)?)
    }

    /// A connection to the API server with its TLS handshake done, for timing one request
    /// without the connection set-up ([`Connected::request`]).
    pub fn connect(&self) -> Result<Connected, ClusterError> {
        let client = self
            .client
            .as_ref()
            .ok_or(HttpError::Malformed("cluster not started"))?;
        Ok(client.connect(REQUEST_TIMEOUT)?)
    }

    fn log(&self, what: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{what}.log"))
    }

    fn write_pid(&self, what: &'static str) -> Result<(), ClusterError> {
        let child = if what == "etcd" {
            &self.etcd
        } else {
            &self.apiserver
        };
        let pid = child
            .as_ref()
            .map(|c| c.id().to_string())
            .unwrap_or_default();
        let path = self.dir.join(format!("{what}.pid"));
        fs::write(&path, pid).map_err(io_err(format!("writing {}", path.display())))
    }

    fn spawn_apiserver(&mut self) -> Result<(), ClusterError> {
        let log = self.log("kube-apiserver");
        self.apiserver = Some(spawn(
            &self.binaries.kube_apiserver,
            &self.apiserver_args,
            &log,
        )?);
        self.write_pid("kube-apiserver")?;
        self.wait_apiserver_ready()
    }

    fn start_watchdog(&mut self) -> Result<(), ClusterError> {
        let child = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG_SH)
            .arg("microvirt-cluster-watchdog")
            .arg(std::process::id().to_string())
            .arg(&self.dir)
            .arg(if self.remove_dir { "1" } else { "0" })
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(io_err("starting the watchdog (sh)"))?;
        self.watchdog = Some(child);
        Ok(())
    }

    fn wait_etcd_ready(&mut self) -> Result<(), ClusterError> {
        let port = self.etcd_port;
        self.wait_ready("etcd", |_| {
            let r = plain_get(port, "/health", Duration::from_secs(5))?;
            Ok((r.status == 200 && r.body.contains("\"health\":\"true\""), r))
        })
    }

    fn wait_apiserver_ready(&mut self) -> Result<(), ClusterError> {
        self.wait_ready("kube-apiserver", |c| {
            let r = c.request("GET", "/readyz", None)?;
            Ok((r.status == 200 && r.body.trim() == "ok", r))
        })
    }

    fn wait_ready(
        &mut self,
        what: &'static str,
        probe: impl Fn(&Cluster) -> Result<(bool, Response), ClusterError>,
    ) -> Result<(), ClusterError> {
        let started = Instant::now();
        let log = self.log(what);
        loop {
            let child = if what == "etcd" {
                self.etcd.as_mut()
            } else {
                self.apiserver.as_mut()
            };
            if let Some(child) = child {
                if let Some(st) = child
                    .try_wait()
                    .map_err(io_err(format!("waiting for {what}")))?
                {
                    return Err(ClusterError::Exited {
                        what,
                        status: st.to_string(),
                        tail: log_tail(&log, 30),
                        log,
                    });
                }
            }
            let last = match probe(self) {
                Ok((true, _)) => return Ok(()),
                Ok((false, r)) => format!("HTTP {}: {}", r.status, first_line(&r.body)),
                Err(e) => e.to_string(),
            };
            if started.elapsed() > self.ready_timeout {
                return Err(ClusterError::NotReady {
                    what,
                    waited: started.elapsed(),
                    last,
                    tail: log_tail(&log, 30),
                    log,
                });
            }
            thread::sleep(Duration::from_millis(200));
        }
    }

    fn write_kubeconfig(&self, ca_pem: &str, token: &str) -> Result<(), ClusterError> {
        let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: microvirt\n  cluster:\n    \
             server: {}\n    certificate-authority-data: {ca}\nusers:\n- name: microvirt-admin\n  \
             user:\n    token: {token}\ncontexts:\n- name: microvirt\n  context:\n    \
             cluster: microvirt\n    user: microvirt-admin\n    namespace: default\n\
             current-context: microvirt\n",
            self.server_url
        );
        fs::write(&self.kubeconfig, text).map_err(io_err("writing kubeconfig"))
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

fn spawn(bin: &Path, args: &[String], log: &Path) -> Result<Child, ClusterError> {
    let f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(io_err(format!("opening {}", log.display())))?;
    let f2 = f.try_clone().map_err(io_err("cloning log handle"))?;
    Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(f)
        .stderr(f2)
        // Own process group: a Ctrl-C meant for the test runner (or xtask) does not hit it; the
        // owner (Drop, watchdog or `cargo xtask cluster down`) stops it.
        .process_group(0)
        .spawn()
        .map_err(io_err(format!("starting {}", bin.display())))
}

/// kube-apiserver frozen by [`Cluster::freeze_apiserver`]; dropping it lets it run again, and
/// the drop returns once the kernel has resumed every thread ([`continue_process`]).
pub struct FrozenApiserver<'a> {
    pid: u32,
    _cluster: &'a Cluster,
}

impl Drop for FrozenApiserver<'_> {
    fn drop(&mut self) {
        if let Err(e) = continue_process(self.pid) {
            // A panic while already panicking aborts: only report then.
            if std::thread::panicking() {
                eprintln!("resuming kube-apiserver: {e}");
            } else {
                panic!("resuming kube-apiserver: {e}");
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.persistent && self.started {
            return;
        }
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
        for child in [self.apiserver.take(), self.etcd.take()]
            .into_iter()
            .flatten()
        {
            let mut child = child;
            stop_child(&mut child, Duration::from_secs(10));
        }
        let keep = std::env::var_os("MICROVIRT_KEEP_CLUSTER_DIR").is_some_and(|v| !v.is_empty());
        if self.remove_dir && !keep {
            let _ = fs::remove_dir_all(&self.dir);
        } else {
            let _ = fs::remove_file(self.dir.join("etcd.pid"));
            let _ = fs::remove_file(self.dir.join("kube-apiserver.pid"));
        }
    }
}

// Tests share one cluster through a `static` (`OnceLock<Cluster>`), so it must stay Send + Sync.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Cluster>();
};
