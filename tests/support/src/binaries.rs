//! Building the cluster's Go programs from their modules, cached by a hash of every input.
//!
//! None of them is packaged in a registry this project can reach, so all are built from source
//! with the machine's Go toolchain through the Go module proxy, in three sets with a cache
//! directory each: the control plane (`etcd`, `kube-apiserver`), the node's Kubernetes
//! components (`kube-scheduler`, `kube-controller-manager`, `kubelet`) and its container runtime
//! (`containerd`, `containerd-shim-runc-v2`, `ctr`, and the sandbox's `pause`). Kubernetes and
//! etcd binaries come from a generated throw-away Go module (a `go.mod` pinning the release, and
//! for etcd a three-line `main.go`); containerd's from `go install <cmd>@<version>`, i.e. with
//! containerd's own `go.mod`.
//! `k8s.io/kubernetes` refers to its `k8s.io/*` staging modules as `v0.0.0` with `replace`
//! directives to its own tree, which a consumer does not see; the generated `go.mod` replaces
//! each of them with the published `v0.<minor>.<patch>` of the same release instead.

use std::fmt::Write as _;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::process::{log_tail, wait_timeout};

/// The Kubernetes release whose `kube-apiserver` is built.
///
/// Chosen to match `k8s-openapi`'s `v1_34` feature that the operator is built with; the
/// installed `kubectl` (v1.32) works against it for everything the tests do.
pub const KUBERNETES_VERSION: &str = "v1.34.4";

/// The etcd release that is built (the 3.6 line is what Kubernetes 1.34 is tested with).
pub const ETCD_VERSION: &str = "v3.6.16";

/// The containerd release that is built: image volumes (KEP-4639) need 2.1 or newer, and the
/// 2.2 line is what Kubernetes 1.34 is tested with.
pub const CONTAINERD_VERSION: &str = "v2.2.9";

/// The staging modules of `k8s.io/kubernetes` (its `replace ... => ./staging/src/...` lines),
/// each published as `v0.<minor>.<patch>` alongside the release.
const STAGING_MODULES: &[&str] = &[
    "k8s.io/api",
    "k8s.io/apiextensions-apiserver",
    "k8s.io/apimachinery",
    "k8s.io/apiserver",
    "k8s.io/cli-runtime",
    "k8s.io/client-go",
    "k8s.io/cloud-provider",
    "k8s.io/cluster-bootstrap",
    "k8s.io/code-generator",
    "k8s.io/component-base",
    "k8s.io/component-helpers",
    "k8s.io/controller-manager",
    "k8s.io/cri-api",
    "k8s.io/cri-client",
    "k8s.io/csi-translation-lib",
    "k8s.io/dynamic-resource-allocation",
    "k8s.io/endpointslice",
    "k8s.io/externaljwt",
    "k8s.io/kms",
    "k8s.io/kube-aggregator",
    "k8s.io/kube-controller-manager",
    "k8s.io/kube-proxy",
    "k8s.io/kube-scheduler",
    "k8s.io/kubectl",
    "k8s.io/kubelet",
    "k8s.io/metrics",
    "k8s.io/mount-utils",
    "k8s.io/pod-security-admission",
    "k8s.io/sample-apiserver",
    "k8s.io/sample-cli-plugin",
    "k8s.io/sample-controller",
];

/// Bumped whenever the build recipe changes in a way the generated texts do not show (one per
/// binary set).
const RECIPE_VERSION: &str = "microvirt-testsupport build recipe 1";
const NODE_RECIPE_VERSION: &str = "microvirt-testsupport node build recipe 1";
const RUNTIME_RECIPE_VERSION: &str = "microvirt-testsupport runtime build recipe 1";

/// Errors from [`ensure_binaries`].
#[derive(Debug, thiserror::Error)]
pub enum BinariesError {
    /// No `go` command could be found or installed.
    #[error(
        "no Go toolchain found (looked at $MICROVIRT_GO, `go` on PATH, /usr/local/go/bin/go, \
         /usr/lib/go/bin/go){0}"
    )]
    NoGo(String),
    /// Neither `MICROVIRT_CACHE_DIR`, `XDG_CACHE_HOME` nor `HOME` is set.
    #[error(
        "cannot place the build cache: none of MICROVIRT_CACHE_DIR, XDG_CACHE_HOME, HOME is set"
    )]
    NoCacheDir,
    /// A file-system or process operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: io::Error,
    },
    /// `go build` failed.
    #[error("`go build` of {what} failed ({status}); the end of {log}:\n{tail}")]
    GoBuild {
        /// Which binary.
        what: String,
        /// How `go build` ended.
        status: String,
        /// The full build log.
        log: PathBuf,
        /// Its last lines.
        tail: String,
    },
}

fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> BinariesError {
    let context = context.into();
    move |source| BinariesError::Io { context, source }
}

/// Paths of the built control-plane binaries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binaries {
    /// The `etcd` server.
    pub etcd: PathBuf,
    /// The `kube-apiserver`.
    pub kube_apiserver: PathBuf,
    /// The cache directory that holds both (and their build logs).
    pub dir: PathBuf,
}

/// Paths of the built node binaries (Kubernetes components and container runtime).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeBinaries {
    /// `kube-scheduler`.
    pub kube_scheduler: PathBuf,
    /// `kube-controller-manager`.
    pub kube_controller_manager: PathBuf,
    /// `kubelet`.
    pub kubelet: PathBuf,
    /// `containerd`.
    pub containerd: PathBuf,
    /// `containerd-shim-runc-v2` (containerd finds it on `PATH`, so its directory goes there).
    pub containerd_shim: PathBuf,
    /// `ctr`, containerd's own client (image import).
    pub ctr: PathBuf,
    /// The sandbox ("pause") program: waits for SIGTERM/SIGINT, then exits 0.
    pub pause: PathBuf,
    /// The cache directory of the Kubernetes components.
    pub k8s_dir: PathBuf,
    /// The cache directory of the runtime.
    pub runtime_dir: PathBuf,
}

/// How one binary is built.
enum Source {
    /// `go build <package>` in a generated module (`go.mod`, optional `main.go`).
    Module {
        go_mod: String,
        main_go: Option<&'static str>,
        package: &'static str,
    },
    /// `go install <package>@<version>`: the module's own `go.mod` decides every dependency.
    Install { package: String },
}

/// One binary.
struct GoBinary {
    name: &'static str,
    source: Source,
    ldflags: String,
}

impl GoBinary {
    fn module(
        name: &'static str,
        go_mod: String,
        main_go: Option<&'static str>,
        package: &'static str,
        ldflags: String,
    ) -> Self {
        Self {
            name,
            source: Source::Module {
                go_mod,
                main_go,
                package,
            },
            ldflags,
        }
    }
}

/// A set of binaries sharing one cache directory `<cache root>/<subdir>/<hash>/`.
struct BinarySet {
    /// What the set is, for messages.
    what: &'static str,
    subdir: &'static str,
    recipe_version: &'static str,
    binaries: Vec<GoBinary>,
}

const ETCD_MAIN_GO: &str = "package main

import (
\t\"os\"

\t\"go.etcd.io/etcd/server/v3/etcdmain\"
)

func main() { etcdmain.Main(os.Args) }
";

/// The sandbox container's program. It must block until told to stop: a bare `select {}`
/// makes the Go runtime exit with "all goroutines are asleep" (status 2) and the sandbox dies.
const PAUSE_MAIN_GO: &str = "package main

import (
\t\"os\"
\t\"os/signal\"
\t\"syscall\"
)

func main() {
\tc := make(chan os.Signal, 1)
\tsignal.Notify(c, syscall.SIGINT, syscall.SIGTERM)
\t<-c
}
";

/// `v1.34.4` → (`v0.34.4`, `34`).
fn staging_version(k8s: &str) -> (String, String) {
    let rest = k8s.strip_prefix("v1.").unwrap_or(k8s);
    let minor = rest.split('.').next().unwrap_or("").to_string();
    (format!("v0.{rest}"), minor)
}

/// The generated `go.mod` every Kubernetes binary is built in.
fn kube_go_mod() -> String {
    let (staging, _) = staging_version(KUBERNETES_VERSION);
    let mut kube_mod = String::new();
    // The go and godebug lines follow k8s.io/kubernetes's own go.mod for 1.34, so the binary
    // gets the runtime defaults upstream builds it with.
    let _ = write!(
        kube_mod,
        "module microvirt.local/kube-apiserver-build\n\ngo 1.24.0\n\ngodebug default=go1.24\n\n\
         require k8s.io/kubernetes {KUBERNETES_VERSION}\n\nreplace (\n"
    );
    for m in STAGING_MODULES {
        let _ = writeln!(kube_mod, "\t{m} => {m} {staging}");
    }
    kube_mod.push_str(")\n");
    kube_mod
}

/// `-ldflags` of a Kubernetes binary: stripped, with the version stamped in as upstream does.
fn kube_ldflags() -> String {
    let (_, minor) = staging_version(KUBERNETES_VERSION);
    let v = "k8s.io/component-base/version";
    format!(
        "-s -w -X {v}.gitVersion={KUBERNETES_VERSION} -X {v}.gitMajor=1 \
         -X {v}.gitMinor={minor} -X {v}.gitTreeState=clean"
    )
}

fn recipes() -> Vec<GoBinary> {
    let etcd_mod = format!(
        "module microvirt.local/etcd-build\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 {ETCD_VERSION}\n"
    );
    vec![
        GoBinary::module(
            "etcd",
            etcd_mod,
            Some(ETCD_MAIN_GO),
            ".",
            "-s -w".to_string(),
        ),
        GoBinary::module(
            "kube-apiserver",
            kube_go_mod(),
            None,
            "k8s.io/kubernetes/cmd/kube-apiserver",
            kube_ldflags(),
        ),
    ]
}

fn control_plane_set() -> BinarySet {
    BinarySet {
        what: "etcd and kube-apiserver",
        subdir: "k8s",
        recipe_version: RECIPE_VERSION,
        binaries: recipes(),
    }
}

/// kube-scheduler, kube-controller-manager and kubelet: the same module as kube-apiserver.
fn node_set() -> BinarySet {
    let k = |name: &'static str, package: &'static str| {
        GoBinary::module(name, kube_go_mod(), None, package, kube_ldflags())
    };
    BinarySet {
        what: "kube-scheduler, kube-controller-manager and kubelet",
        subdir: "k8s-node",
        recipe_version: NODE_RECIPE_VERSION,
        binaries: vec![
            k("kube-scheduler", "k8s.io/kubernetes/cmd/kube-scheduler"),
            k(
                "kube-controller-manager",
                "k8s.io/kubernetes/cmd/kube-controller-manager",
            ),
            k("kubelet", "k8s.io/kubernetes/cmd/kubelet"),
        ],
    }
}

/// containerd, its runc shim, ctr, and the sandbox program.
fn runtime_set() -> BinarySet {
    let c = |name: &'static str| GoBinary {
        name,
        source: Source::Install {
            package: format!("github.com/containerd/containerd/v2/cmd/{name}@{CONTAINERD_VERSION}"),
        },
        ldflags: "-s -w".to_string(),
    };
    BinarySet {
        what: "containerd, containerd-shim-runc-v2, ctr and pause",
        subdir: "containerd",
        recipe_version: RUNTIME_RECIPE_VERSION,
        binaries: vec![
            c("containerd"),
            c("containerd-shim-runc-v2"),
            c("ctr"),
            GoBinary::module(
                "pause",
                "module microvirt.local/pause\n\ngo 1.24.0\n".to_string(),
                Some(PAUSE_MAIN_GO),
                ".",
                "-s -w".to_string(),
            ),
        ],
    }
}

/// 64-bit FNV-1a: small, and stable across Rust releases (unlike `DefaultHasher`).
fn fnv1a(seed: u64, data: &[u8]) -> u64 {
    let mut h = seed;
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The cache key: every input that changes the output (recipe, Go version, generated texts).
fn cache_key(recipe_version: &str, go_version: &str, recipes: &[GoBinary]) -> String {
    let mut text = format!("{recipe_version}\0{go_version}\0");
    for r in recipes {
        let (go_mod, main_go, package) = match &r.source {
            Source::Module {
                go_mod,
                main_go,
                package,
            } => (go_mod.as_str(), main_go.unwrap_or(""), *package),
            Source::Install { package } => ("", "", package.as_str()),
        };
        let _ = write!(
            text,
            "{}\0{}\0{}\0{}\0{}\0",
            r.name, go_mod, main_go, package, r.ldflags
        );
    }
    let a = fnv1a(0xcbf2_9ce4_8422_2325, text.as_bytes());
    let b = fnv1a(0x6c62_272e_07bb_0142, text.as_bytes());
    format!("{a:016x}{b:016x}")
}

/// The cache root: `$MICROVIRT_CACHE_DIR`, else `$XDG_CACHE_HOME/microvirt`, else
/// `$HOME/.cache/microvirt`.
pub fn cache_root() -> Result<PathBuf, BinariesError> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = env("MICROVIRT_CACHE_DIR") {
        return Ok(d);
    }
    if let Some(d) = env("XDG_CACHE_HOME") {
        return Ok(d.join("microvirt"));
    }
    env("HOME")
        .map(|h| h.join(".cache").join("microvirt"))
        .ok_or(BinariesError::NoCacheDir)
}

fn find_go() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("MICROVIRT_GO").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(p));
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let cand = dir.join("go");
            if cand.is_file() {
                return Some(cand);
            }
        }
    }
    ["/usr/local/go/bin/go", "/usr/lib/go/bin/go"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// Finds `go`, installing Debian's `golang-go` with apt-get when none is there and we are root.
/// (A Debian Go older than the modules need fetches the right toolchain itself through the
/// module proxy, as `GOTOOLCHAIN=auto` does by default.)
fn go_command() -> Result<PathBuf, BinariesError> {
    if let Some(go) = find_go() {
        return Ok(go);
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !root || !Path::new("/usr/bin/apt-get").exists() {
        return Err(BinariesError::NoGo(
            "; install Go (1.24 or newer) or set MICROVIRT_GO".to_string(),
        ));
    }
    eprintln!("microvirt-testsupport: no Go toolchain; installing Debian's golang-go with apt-get");
    for args in [
        &["update"][..],
        &["install", "-y", "--no-install-recommends", "golang-go"][..],
    ] {
        let st = Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .map_err(io_err("running apt-get"))?;
        if !st.success() {
            return Err(BinariesError::NoGo(format!(
                "; `apt-get {}` failed ({st})",
                args.join(" ")
            )));
        }
    }
    find_go().ok_or_else(|| BinariesError::NoGo("; apt-get installed golang-go but no go".into()))
}

fn go_version(go: &Path) -> Result<String, BinariesError> {
    let out = Command::new(go)
        .args(["env", "GOVERSION", "GOOS", "GOARCH"])
        .output()
        .map_err(io_err(format!("running {} env", go.display())))?;
    if !out.status.success() {
        return Err(BinariesError::NoGo(format!(
            "; `{} env` failed: {}",
            go.display(),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" "))
}

static IN_PROCESS: Mutex<()> = Mutex::new(());

/// Returns the cached `etcd` and `kube-apiserver`, building them first if needed.
///
/// The cache directory is `<cache root>/k8s/<hash>/` (cache root: `$MICROVIRT_CACHE_DIR`, or
/// `~/.cache/microvirt`), where the hash covers the versions, the generated `go.mod` and
/// `main.go` texts, the build flags and the Go version, so any change rebuilds. Concurrent
/// callers (threads or processes) wait on a lock while one of them builds. A cold build
/// downloads the modules and compiles for several minutes; progress goes to stderr and the
/// `go build` output to `<name>-build.log` beside the binaries.
pub fn ensure_binaries() -> Result<Binaries, BinariesError> {
    let dir = ensure_set(&control_plane_set())?;
    Ok(Binaries {
        etcd: dir.join("etcd"),
        kube_apiserver: dir.join("kube-apiserver"),
        dir,
    })
}

/// Returns the cached node binaries, building them first if needed: `kube-scheduler`,
/// `kube-controller-manager` and `kubelet` (Kubernetes [`KUBERNETES_VERSION`], the same
/// generated module as [`ensure_binaries`]'s kube-apiserver) in `<cache root>/k8s-node/<hash>/`,
/// and containerd [`CONTAINERD_VERSION`] (`containerd`, `containerd-shim-runc-v2`, `ctr`, via
/// `CGO_ENABLED=0 go install …@version`) plus the sandbox's `pause` program in
/// `<cache root>/containerd/<hash>/`. Cold, both sets take several minutes each.
pub fn ensure_node_binaries() -> Result<NodeBinaries, BinariesError> {
    let k8s = ensure_set(&node_set())?;
    let rt = ensure_set(&runtime_set())?;
    Ok(NodeBinaries {
        kube_scheduler: k8s.join("kube-scheduler"),
        kube_controller_manager: k8s.join("kube-controller-manager"),
        kubelet: k8s.join("kubelet"),
        containerd: rt.join("containerd"),
        containerd_shim: rt.join("containerd-shim-runc-v2"),
        ctr: rt.join("ctr"),
        pause: rt.join("pause"),
        k8s_dir: k8s,
        runtime_dir: rt,
    })
}

/// Builds `set` unless its cache directory is complete; returns that directory.
fn ensure_set(set: &BinarySet) -> Result<PathBuf, BinariesError> {
    let _guard = IN_PROCESS.lock().unwrap_or_else(|e| e.into_inner());
    let go = go_command()?;
    let goversion = go_version(&go)?;
    let key = cache_key(set.recipe_version, &goversion, &set.binaries);
    let root = cache_root()?.join(set.subdir);
    fs::create_dir_all(&root).map_err(io_err(format!("creating {}", root.display())))?;
    let dir = root.join(&key);
    let complete = dir.join(".complete");
    let cached = || complete.exists() && set.binaries.iter().all(|b| dir.join(b.name).is_file());
    if cached() {
        return Ok(dir);
    }

    let lock_path = root.join(".build.lock");
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(io_err(format!("opening {}", lock_path.display())))?;
    if lock.try_lock().is_err() {
        eprintln!(
            "microvirt-testsupport: another process is building {}; waiting for {}",
            set.what,
            lock_path.display()
        );
        lock.lock()
            .map_err(io_err(format!("locking {}", lock_path.display())))?;
    }
    if cached() {
        return Ok(dir);
    }
    // Holding the lock, no other build of this set runs: leftovers of interrupted builds can go.
    if let Ok(entries) = fs::read_dir(&root) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().contains(".tmp-") {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
    let _ = fs::remove_file(&complete);

    let work = root.join(format!("{key}.tmp-{}", std::process::id()));
    if work.exists() {
        fs::remove_dir_all(&work).map_err(io_err(format!("removing {}", work.display())))?;
    }
    eprintln!(
        "microvirt-testsupport: building {} with {} ({goversion}) into {} — a cold build takes \
         several minutes",
        set.what,
        go.display(),
        dir.display()
    );
    let started = std::time::Instant::now();
    for r in &set.binaries {
        build_one(&go, &work, r)?;
    }
    fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
    for r in &set.binaries {
        let mut moves = vec![
            (work.join("bin").join(r.name), dir.join(r.name)),
            (
                work.join(format!("{}-build.log", r.name)),
                dir.join(format!("{}-build.log", r.name)),
            ),
        ];
        if matches!(r.source, Source::Module { .. }) {
            moves.push((
                work.join(r.name).join("go.mod"),
                dir.join(format!("{}.go.mod", r.name)),
            ));
        }
        for (from, to) in moves {
            fs::rename(&from, &to).map_err(io_err(format!("moving {}", from.display())))?;
        }
    }
    let mut info = String::new();
    for r in &set.binaries {
        let _ = writeln!(info, "{}", r.name);
    }
    let _ = write!(
        info,
        "kubernetes {KUBERNETES_VERSION}\netcd {ETCD_VERSION}\ncontainerd {CONTAINERD_VERSION}\n\
         go {goversion}\nkey {key}\n"
    );
    fs::write(&complete, info).map_err(io_err(format!("writing {}", complete.display())))?;
    let _ = fs::remove_dir_all(&work);
    eprintln!(
        "microvirt-testsupport: built {} in {:.1} s",
        set.what,
        started.elapsed().as_secs_f64()
    );
    Ok(dir)
}

fn build_one(go: &Path, work: &Path, r: &GoBinary) -> Result<(), BinariesError> {
    let src = work.join(r.name);
    fs::create_dir_all(&src).map_err(io_err(format!("creating {}", src.display())))?;
    let bin_dir = work.join("bin");
    fs::create_dir_all(&bin_dir).map_err(io_err(format!("creating {}", bin_dir.display())))?;
    let out = bin_dir.join(r.name);
    let log_path = work.join(format!("{}-build.log", r.name));
    let log =
        File::create(&log_path).map_err(io_err(format!("creating {}", log_path.display())))?;
    let log2 = log.try_clone().map_err(io_err("cloning log handle"))?;
    let mut cmd = Command::new(go);
    cmd.current_dir(&src)
        .env("CGO_ENABLED", "0")
        .env("GOMAXPROCS", "2")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2);
    match &r.source {
        Source::Module {
            go_mod,
            main_go,
            package,
        } => {
            fs::write(src.join("go.mod"), go_mod).map_err(io_err("writing go.mod"))?;
            if let Some(main) = main_go {
                fs::write(src.join("main.go"), main).map_err(io_err("writing main.go"))?;
            }
            cmd.args(["build", "-p", "2", "-trimpath"])
                .arg(format!("-ldflags={}", r.ldflags))
                .arg("-o")
                .arg(&out)
                .arg(package)
                .env("GOFLAGS", "-mod=mod");
        }
        Source::Install { package } => {
            // `go install pkg@version` ignores any go.mod around it and refuses -mod flags.
            cmd.args(["install", "-p", "2", "-trimpath"])
                .arg(format!("-ldflags={}", r.ldflags))
                .arg(package)
                .env("GOBIN", &bin_dir)
                .env_remove("GOFLAGS");
        }
    }
    eprintln!(
        "microvirt-testsupport: go build {} (log: {})",
        r.name,
        log_path.display()
    );
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(io_err(format!("starting {} build", go.display())))?;
    let status = loop {
        if let Some(st) = wait_timeout(&mut child, Duration::from_secs(30))
            .map_err(io_err("waiting for go build"))?
        {
            break st;
        }
        eprintln!(
            "microvirt-testsupport: still building {} ({} s)",
            r.name,
            started.elapsed().as_secs()
        );
    };
    if !status.success() || !out.is_file() {
        return Err(BinariesError::GoBuild {
            what: r.name.to_string(),
            status: status.to_string(),
            tail: log_tail(&log_path, 40),
            log: log_path,
        });
    }
    let size = fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "microvirt-testsupport: built {} in {:.0} s ({:.1} MiB)",
        r.name,
        started.elapsed().as_secs_f64(),
        size as f64 / (1024.0 * 1024.0)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_versions_follow_the_release() {
        assert_eq!(
            staging_version("v1.34.4"),
            ("v0.34.4".to_string(), "34".to_string())
        );
        let m = kube_go_mod();
        assert!(m.contains("require k8s.io/kubernetes v1.34.4\n"));
        assert!(m.contains("\tk8s.io/apiserver => k8s.io/apiserver v0.34.4\n"));
        assert_eq!(m.matches(" => ").count(), STAGING_MODULES.len());
    }

    #[test]
    fn cache_key_covers_every_input() {
        let key = |go: &str, r: &[GoBinary]| cache_key(RECIPE_VERSION, go, r);
        let base = key("go1.26.8 linux amd64", &recipes());
        assert_eq!(base.len(), 32);
        assert_eq!(base, key("go1.26.8 linux amd64", &recipes()));
        assert_ne!(base, key("go1.26.9 linux amd64", &recipes()));
        let mut changed = recipes();
        if let Source::Module { go_mod, .. } = &mut changed[0].source {
            go_mod.push('\n');
        }
        assert_ne!(base, key("go1.26.8 linux amd64", &changed));
        let mut changed = recipes();
        changed[1].ldflags.push_str(" -X a.b=c");
        assert_ne!(base, key("go1.26.8 linux amd64", &changed));
        // The sets never share a key, and the node set uses kube-apiserver's module.
        let node = node_set();
        assert_ne!(
            cache_key(node.recipe_version, "go", &node.binaries),
            cache_key(RECIPE_VERSION, "go", &node.binaries)
        );
        for b in &node.binaries {
            assert!(matches!(&b.source, Source::Module { go_mod, .. } if *go_mod == kube_go_mod()));
        }
        let rt = runtime_set();
        assert!(rt.binaries.iter().any(|b| matches!(&b.source,
            Source::Install { package } if package.ends_with("/cmd/containerd@v2.2.9"))));
    }

    #[test]
    fn fnv_matches_reference_vectors() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(fnv1a(0xcbf2_9ce4_8422_2325, b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(0xcbf2_9ce4_8422_2325, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(
            fnv1a(0xcbf2_9ce4_8422_2325, b"foobar"),
            0x8594_4171_f739_67e8
        );
    }
}
