//! Building `etcd` and `kube-apiserver` from Go modules, cached by a hash of every input.
//!
//! Neither binary is packaged in a registry this project can reach, so both are built from
//! source with the machine's Go toolchain through the Go module proxy: each in a generated
//! throw-away Go module (a `go.mod` pinning the release, and for etcd a three-line `main.go`).
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

/// Bumped whenever the build recipe changes in a way the generated texts do not show.
const RECIPE_VERSION: &str = "microvirt-testsupport build recipe 1";

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

/// Paths of the built binaries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binaries {
    /// The `etcd` server.
    pub etcd: PathBuf,
    /// The `kube-apiserver`.
    pub kube_apiserver: PathBuf,
    /// The cache directory that holds both (and their build logs).
    pub dir: PathBuf,
}

/// One binary built from a generated Go module.
struct GoBinary {
    name: &'static str,
    go_mod: String,
    main_go: Option<&'static str>,
    package: &'static str,
    ldflags: String,
}

const ETCD_MAIN_GO: &str = "package main

import (
\t\"os\"

\t\"go.etcd.io/etcd/server/v3/etcdmain\"
)

func main() { etcdmain.Main(os.Args) }
";

/// `v1.34.4` → (`v0.34.4`, `34`).
fn staging_version(k8s: &str) -> (String, String) {
    let rest = k8s.strip_prefix("v1.").unwrap_or(k8s);
    let minor = rest.split('.').next().unwrap_or("").to_string();
    (format!("v0.{rest}"), minor)
}

fn recipes() -> Vec<GoBinary> {
    let (staging, minor) = staging_version(KUBERNETES_VERSION);
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
    let etcd_mod = format!(
        "module microvirt.local/etcd-build\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 {ETCD_VERSION}\n"
    );
    let v = "k8s.io/component-base/version";
    vec![
        GoBinary {
            name: "etcd",
            go_mod: etcd_mod,
            main_go: Some(ETCD_MAIN_GO),
            package: ".",
            ldflags: "-s -w".to_string(),
        },
        GoBinary {
            name: "kube-apiserver",
            go_mod: kube_mod,
            main_go: None,
            package: "k8s.io/kubernetes/cmd/kube-apiserver",
            ldflags: format!(
                "-s -w -X {v}.gitVersion={KUBERNETES_VERSION} -X {v}.gitMajor=1 \
                 -X {v}.gitMinor={minor} -X {v}.gitTreeState=clean"
            ),
        },
    ]
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
fn cache_key(go_version: &str, recipes: &[GoBinary]) -> String {
    let mut text = format!("{RECIPE_VERSION}\0{go_version}\0");
    for r in recipes {
        let _ = write!(
            text,
            "{}\0{}\0{}\0{}\0{}\0",
            r.name,
            r.go_mod,
            r.main_go.unwrap_or(""),
            r.package,
            r.ldflags
        );
    }
    let a = fnv1a(0xcbf2_9ce4_8422_2325, text.as_bytes());
    let b = fnv1a(0x6c62_272e_07bb_0142, text.as_bytes());
    format!("{a:016x}{b:016x}")
}

/// The cache root: `$MICROVIRT_CACHE_DIR`, else `$XDG_CACHE_HOME/microvirt`, else
/// `$HOME/.cache/microvirt`.
pub(crate) fn cache_root() -> Result<PathBuf, BinariesError> {
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
    let _guard = IN_PROCESS.lock().unwrap_or_else(|e| e.into_inner());
    let go = go_command()?;
    let goversion = go_version(&go)?;
    let recipes = recipes();
    let key = cache_key(&goversion, &recipes);
    let root = cache_root()?.join("k8s");
    fs::create_dir_all(&root).map_err(io_err(format!("creating {}", root.display())))?;
    let dir = root.join(&key);
    let bins = Binaries {
        etcd: dir.join("etcd"),
        kube_apiserver: dir.join("kube-apiserver"),
        dir: dir.clone(),
    };
    let complete = dir.join(".complete");
    let cached = || complete.exists() && bins.etcd.is_file() && bins.kube_apiserver.is_file();
    if cached() {
        return Ok(bins);
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
            "microvirt-testsupport: another process is building the Kubernetes binaries; waiting \
             for {}",
            lock_path.display()
        );
        lock.lock()
            .map_err(io_err(format!("locking {}", lock_path.display())))?;
    }
    if cached() {
        return Ok(bins);
    }
    // Holding the lock, no other build runs: leftovers of interrupted builds can go.
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
        "microvirt-testsupport: building etcd {ETCD_VERSION} and kube-apiserver \
         {KUBERNETES_VERSION} with {} ({goversion}) into {} — a cold build takes several minutes",
        go.display(),
        dir.display()
    );
    for r in &recipes {
        build_one(&go, &work, r)?;
    }
    fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
    for r in &recipes {
        for (from, to) in [
            (work.join("bin").join(r.name), dir.join(r.name)),
            (
                work.join(format!("{}-build.log", r.name)),
                dir.join(format!("{}-build.log", r.name)),
            ),
            (
                work.join(r.name).join("go.mod"),
                dir.join(format!("{}.go.mod", r.name)),
            ),
        ] {
            fs::rename(&from, &to).map_err(io_err(format!("moving {}", from.display())))?;
        }
    }
    let info = format!(
        "etcd {ETCD_VERSION}\nkube-apiserver {KUBERNETES_VERSION}\ngo {goversion}\nkey {key}\n"
    );
    fs::write(&complete, info).map_err(io_err(format!("writing {}", complete.display())))?;
    let _ = fs::remove_dir_all(&work);
    Ok(bins)
}

fn build_one(go: &Path, work: &Path, r: &GoBinary) -> Result<(), BinariesError> {
    let src = work.join(r.name);
    fs::create_dir_all(&src).map_err(io_err(format!("creating {}", src.display())))?;
    fs::write(src.join("go.mod"), &r.go_mod).map_err(io_err("writing go.mod"))?;
    if let Some(main) = r.main_go {
        fs::write(src.join("main.go"), main).map_err(io_err("writing main.go"))?;
    }
    let out = work.join("bin").join(r.name);
    let log_path = work.join(format!("{}-build.log", r.name));
    let log =
        File::create(&log_path).map_err(io_err(format!("creating {}", log_path.display())))?;
    let log2 = log.try_clone().map_err(io_err("cloning log handle"))?;
    eprintln!(
        "microvirt-testsupport: go build {} (log: {})",
        r.name,
        log_path.display()
    );
    let started = Instant::now();
    let mut child = Command::new(go)
        .current_dir(&src)
        .args(["build", "-p", "2", "-trimpath"])
        .arg(format!("-ldflags={}", r.ldflags))
        .arg("-o")
        .arg(&out)
        .arg(r.package)
        .env("GOFLAGS", "-mod=mod")
        .env("CGO_ENABLED", "0")
        .env("GOMAXPROCS", "2")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
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

/// The `go.mod` the kube-apiserver build uses (for tests and documentation).
#[cfg(test)]
fn kube_go_mod() -> String {
    recipes().remove(1).go_mod
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
        let base = cache_key("go1.26.8 linux amd64", &recipes());
        assert_eq!(base.len(), 32);
        assert_eq!(base, cache_key("go1.26.8 linux amd64", &recipes()));
        assert_ne!(base, cache_key("go1.26.9 linux amd64", &recipes()));
        let mut changed = recipes();
        changed[0].go_mod.push('\n');
        assert_ne!(base, cache_key("go1.26.8 linux amd64", &changed));
        let mut changed = recipes();
        changed[1].ldflags.push_str(" -X a.b=c");
        assert_ne!(base, cache_key("go1.26.8 linux amd64", &changed));
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
