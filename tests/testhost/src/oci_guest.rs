//! A Python container image for the OCI-image VM tests (docs/oci-images.md), from Debian's
//! packages only: `mmdebstrap --variant=extract` of `python3` (the interpreter and its standard
//! library with their libraries, no shell, no package scripts run) and `base-passwd`'s user
//! database as `/etc/passwd` and `/etc/group`, packed as `rootfs.tar`, with an OCI image
//! configuration (`config.json`: Entrypoint `python3`, Cmd `-V`, `PATH`, `LANG`,
//! `PYTHONUNBUFFERED`, WorkingDir `/srv`), the shape of Docker Hub's `python:3-slim` but without
//! a registry. Cached under `~/.cache/microvirt/oci-python/<hash>/`, keyed by python3's
//! candidate version and this recipe.

use std::path::PathBuf;
use std::process::Command;

use crate::cmd;
use crate::stock::{candidate, StockError};

/// Bump when the recipe changes what it produces.
const RECIPE_VERSION: &[u8] = b"microvirt-oci-python-v1";

/// The image's OCI configuration (the config blob's shape; only `config` is read).
pub const CONFIG: &str = r#"{"architecture": "amd64", "os": "linux",
 "config": {"Entrypoint": ["python3"], "Cmd": ["-V"],
            "Env": ["PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", "PYTHONUNBUFFERED=1"],
            "WorkingDir": "/srv"}}
"#;

/// The built image.
#[derive(Debug, Clone)]
pub struct PythonImage {
    /// python3's Debian version.
    pub version: String,
    /// The image's files.
    pub rootfs_tar: PathBuf,
    /// Its OCI configuration.
    pub config: PathBuf,
}

impl PythonImage {
    /// `(environment variable, file)` for the scenarios (`$PY_ROOTFS_TAR`, `$PY_CONFIG`).
    pub fn guest_files(&self) -> Vec<(String, PathBuf)> {
        vec![
            ("PY_ROOTFS_TAR".into(), self.rootfs_tar.clone()),
            ("PY_CONFIG".into(), self.config.clone()),
        ]
    }
}

/// Builds (or finds cached) the image. Installs `mmdebstrap` first when missing.
pub fn build() -> Result<PythonImage, StockError> {
    cmd::ensure_packages(&["mmdebstrap"])?;
    let version = candidate("python3")?;
    let hash = cmd::sha256_hex(&[RECIPE_VERSION, CONFIG.as_bytes(), version.as_bytes()])?;
    let dir = cmd::cache_root().join("oci-python").join(&hash[..16]);
    let image = PythonImage {
        version,
        rootfs_tar: dir.join("rootfs.tar"),
        config: dir.join("config.json"),
    };
    if dir.join("done").exists() {
        return Ok(image);
    }
    let _lock = cmd::CacheLock::acquire(
        &cmd::cache_root().join("oci-python.lock"),
        "the Python image",
    )?;
    if dir.join("done").exists() {
        return Ok(image);
    }
    crate::stock::progress("building the Python OCI image (mmdebstrap --variant=extract python3)");
    cmd::remove_dir(&dir)?;
    cmd::mkdirs(&dir)?;
    let root = dir.join("rootfs");
    cmd::run(
        Command::new("mmdebstrap")
            .args([
                "--variant=extract",
                "--include=python3,base-passwd",
                "--dpkgopt=path-exclude=/usr/share/doc/*",
                "--dpkgopt=path-exclude=/usr/share/man/*",
                "--dpkgopt=path-exclude=/usr/share/locale/*",
                crate::stock::SUITE,
            ])
            .arg(&root),
    )?;
    // What base-passwd's postinst would write; /srv is the working directory.
    cmd::sh(&format!(
        "cd {r} && cp usr/share/base-passwd/passwd.master etc/passwd && \
         cp usr/share/base-passwd/group.master etc/group && mkdir -p srv && \
         tar -cf {tar} -C {r} .",
        r = cmd::quote(&root),
        tar = cmd::quote(&image.rootfs_tar),
    ))?;
    cmd::remove_dir(&root)?;
    cmd::write(&image.config, CONFIG.as_bytes())?;
    cmd::write(&dir.join("done"), b"")?;
    Ok(image)
}

/// One start in [`bench`]: test-host seconds from the start command, and memory once it
/// answered.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    /// `runc` (a container of the image), `vm` (a VMI, the erofs image cached), `vm-uncached`
    /// (the first VMI, the erofs image built), `restored` (a VMI restored from a snapshot taken
    /// while the app served: a warm pool's claim).
    pub kind: String,
    pub run: usize,
    /// The app's first output line (`Serving HTTP ...`); none for `restored` (it printed it
    /// before the snapshot).
    pub first_line: Option<f64>,
    /// The first HTTP answer through the pod IP.
    pub answer: Option<f64>,
    /// RSS and PSS (KiB) of what the start runs on the node once it answered: the launcher
    /// (VMM and guest memory) or the container's processes.
    pub rss_kib: Option<f64>,
    pub pss_kib: Option<f64>,
}

/// The test-host shell of [`bench`] (after the scenarios' prelude: `pod_network_up`, `token`,
/// `wait_line`).
pub fn bench_body(runs: usize) -> String {
    BENCH_BODY.replace("@RUNS@", &runs.to_string())
}

const BENCH_BODY: &str = r#"export WORK=/tmp/oci-bench; mkdir -p $WORK; cd $WORK
now() { cut -d' ' -f1 /proc/uptime; }
el() { awk -v a=$(now) -v b=$t0 'BEGIN{print a-b}'; }
# runc needs a cgroup hierarchy and its state directory.
mount -t cgroup2 none /sys/fs/cgroup 2>/dev/null || echo "bench: no cgroup2"
mkdir -p /run/runc
mkdir -p img/rootfs
tar -xf "$PY_ROOTFS_TAR" -C img/rootfs
cp "$PY_CONFIG" img/config.json
tok=$(token)
echo "$tok" > img/rootfs/srv/index.html
export MICROVIRT_ROOTFS_CACHE=$WORK/cache
pod_network_up
# The container: the same files (a copy: runc adds its mount points to a root, which would
# change the VM's image), read-only, the image's configuration by hand, in the pod's network
# namespace (as a pod's container joins its sandbox's).
mkdir -p bundle
cp -a img/rootfs bundle/rootfs
cat > bundle/config.json <<EOF
{"ociVersion": "1.0.2",
 "process": {"terminal": false, "user": {"uid": 0, "gid": 0}, "cwd": "/srv",
   "args": ["python3", "-m", "http.server", "8080"],
   "env": ["PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", "PYTHONUNBUFFERED=1"],
   "noNewPrivileges": true},
 "root": {"path": "$WORK/bundle/rootfs", "readonly": true},
 "hostname": "bench",
 "mounts": [
   {"destination": "/proc", "type": "proc", "source": "proc"},
   {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=755"]},
   {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev"]}],
 "linux": {"namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
   {"type": "network", "path": "/proc/$holder/ns/net"}]}}
EOF
cat > vm.yaml <<EOF
apiVersion: microvirt.io/v1alpha1
kind: VirtualMachineInstance
metadata: {name: app}
spec:
  domain:
    memory: {guest: 256Mi}
    firmware:
      kernelBoot:
        kernelArgs: "console=ttyS0 panic=-1 quiet"
        container: {image: local, kernelPath: "$VMLINUX"}
    devices:
      disks: [{name: app}]
      interfaces: [{name: default, masquerade: {}}]
  networks: [{name: default, pod: {}}]
  volumes:
    - name: app
      containerRootfs: {image: local/python, path: "$WORK/img", args: ["-m", "http.server", "8080"]}
EOF
launcher() { MICROVIRT_RESOLV_CONF=$WORK/resolv.conf nsenter -t $holder -n /bin/virt-launcher "$@"; }
# stamp KIND RUN: a T line at the app's first line; the output also goes to KIND.log.
stamp() {
	while IFS= read -r l; do
		case "$l" in *"Serving HTTP"*) echo "T $1 $2 first-line $(el)" ;; esac
		echo "$l" >> "$1.log"
	done
}
# answer KIND RUN PROCESS: polls the pod IP until the token comes back, then the memory of the
# PROCESS processes (RSS, PSS in KiB).
answer() {
	_i=0
	until [ "$(printf 'GET /index.html HTTP/1.0\r\n\r\n' | nc -w 2 10.244.0.5 8080 2>/dev/null | tail -n 1)" = "$tok" ]; do
		_i=$((_i + 1))
		[ $_i -ge 3000 ] && { echo "T $1 $2 no-answer"; return; }
		sleep 0.02
	done
	echo "T $1 $2 answer $(el)"
	_rss=0; _pss=0
	for p in $(pidof $3); do
		_rss=$((_rss + $(awk '/^VmRSS/{print $2}' /proc/$p/status)))
		_pss=$((_pss + $(awk '/^Pss:/{print $2}' /proc/$p/smaps_rollup)))
	done
	echo "T $1 $2 memory $_rss $_pss"
}
# vm_run KIND RUN [ARGS]: a VMI of the image until it answered.
vm_run() {
	t0=$(now)
	( answer "$1" "$2" virt-launcher; launcher stop --socket $WORK/ctl.sock > /dev/null ) &
	_c=$!
	_k=$1 _r=$2
	shift 2
	launcher run vm.yaml --pod-network --guest-init "$GUEST_INIT" --control-socket $WORK/ctl.sock "$@" < /dev/null 2>&1 | stamp "$_k" "$_r"
	wait $_c
}
# (Never a bare `wait`: it would wait for the pod namespace's holder too.)
# The first start builds the erofs image.
vm_run vm-uncached 0
# The warm member: snapshotted once it serves.
( wait_line vm-warm.log "Serving HTTP" 3000 && launcher snapshot $WORK/snap --socket $WORK/ctl.sock > /dev/null; launcher stop --socket $WORK/ctl.sock > /dev/null ) &
_c=$!
launcher run vm.yaml --pod-network --guest-init "$GUEST_INIT" --control-socket $WORK/ctl.sock < /dev/null > vm-warm.log 2>&1
wait $_c
[ -d $WORK/snap ] || echo "T restored 0 no-snapshot"
for i in $(seq 1 @RUNS@); do
	t0=$(now)
	( answer runc $i python3; runc kill c$i KILL 2>&1 | sed "s/^/bench: runc kill: /"; sleep 2; kill -9 $(pidof python3) 2>/dev/null ) &
	_c=$!
	# --no-pivot: the test host's root is an initramfs, which pivot_root cannot leave.
	runc run --no-pivot -b bundle c$i < /dev/null 2>&1 | stamp runc $i
	wait $_c
	runc delete -f c$i 2>/dev/null
	vm_run vm $i
	vm_run restored $i --restore $WORK/snap
done
tail -n 5 runc.log vm.log restored.log
pod_network_down
"#;

/// Parses the `T ...` lines of [`bench_body`]'s output.
pub fn parse_bench(lines: &[String]) -> Vec<Sample> {
    let mut out: Vec<Sample> = Vec::new();
    for t in crate::stock::t_lines(lines) {
        let i = crate::stock::sample_index(
            &mut out,
            |s| s.kind == t.vmm && s.run == t.run,
            || Sample {
                kind: t.vmm.to_string(),
                run: t.run,
                ..Default::default()
            },
        );
        let first = t.values.first().copied();
        match t.what {
            "first-line" => out[i].first_line = first,
            "answer" => out[i].answer = first,
            "memory" => {
                out[i].rss_kib = first;
                out[i].pss_kib = t.values.get(1).copied();
            }
            _ => {}
        }
    }
    out
}

/// Runs the image `runs` times as a runc container, as a VMI and restored from a snapshot, in
/// one test-host boot (`launcher`: a static `virt-launcher`, `init`: `microvirt-init`).
pub fn bench(
    prep: &crate::scenarios::Prepared,
    image: &PythonImage,
    launcher: &std::path::Path,
    init: &std::path::Path,
    runs: usize,
    echo: bool,
) -> Result<(Vec<Sample>, crate::qemu::Console), crate::scenarios::ScenarioError> {
    let mut files = image.guest_files();
    files.push(("GUEST_INIT".into(), init.to_path_buf()));
    let body = format!("{}\n{}", crate::scenarios::PRELUDE, bench_body(runs));
    let console = crate::stock::run_in_test_host(
        prep,
        files,
        vec![
            launcher.to_path_buf(),
            "/usr/bin/mkfs.erofs".into(),
            "/usr/sbin/runc".into(),
        ],
        &body,
        "oci-bench",
        std::time::Duration::from_secs(300 + 240 * runs as u64),
        echo,
    )?;
    Ok((parse_bench(&console.lines), console))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_lines_become_samples() {
        let lines: Vec<String> = [
            "[l1 50.1] T vm-uncached 0 first-line 12.5",
            "T vm-uncached 0 answer 12.9",
            "T vm-uncached 0 memory 120000 80000",
            "T runc 1 first-line 1.25",
            "T runc 1 answer 1.5",
            "T restored 1 answer 0.8",
            "T restored 1 no-answer",
            "noise",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let s = parse_bench(&lines);
        assert_eq!(s.len(), 3);
        assert_eq!(
            s[0],
            Sample {
                kind: "vm-uncached".into(),
                run: 0,
                first_line: Some(12.5),
                answer: Some(12.9),
                rss_kib: Some(120000.0),
                pss_kib: Some(80000.0),
            }
        );
        assert_eq!((s[1].first_line, s[1].answer), (Some(1.25), Some(1.5)));
        assert_eq!(
            (s[2].kind.as_str(), s[2].answer, s[2].first_line),
            ("restored", Some(0.8), None)
        );
        assert!(bench_body(3).contains("$(seq 1 3)"));
    }
}
