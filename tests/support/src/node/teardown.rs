//! Removing everything a node leaves on the machine: its processes (kubelet, containerd, shims,
//! containers, the network-namespace holder), mounts, cgroups, the host end of its veth, the
//! kernel settings the kubelet changed, and the fixed paths it created.
//!
//! Every step works from what is on the machine (pid files are only hints), so the same code
//! cleans up after a node whose owner was killed.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::paths::{NodePaths, FIXED_PATHS};
use crate::process::signal;

/// Name of the host end of the node's veth pair.
pub const HOST_VETH: &str = "mv-node-h";
/// Name of the node end of the veth pair (inside the node's network namespace).
pub const NODE_VETH: &str = "mv-node-n";

/// Kernel settings the kubelet changes on start (with `protectKernelDefaults: false`); the
/// values found before the first start are put back at teardown.
pub const KUBELET_SYSCTLS: &[&str] = &[
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

/// What teardown found and did, for the log and for tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TeardownReport {
    /// Processes killed (pid, name).
    pub killed: Vec<(u32, String)>,
    /// Mount points unmounted.
    pub unmounted: Vec<PathBuf>,
    /// cgroup directories removed.
    pub cgroups_removed: usize,
    /// Kernel settings restored (`key=value`).
    pub sysctls_restored: Vec<String>,
    /// Steps that did not fully succeed.
    pub problems: Vec<String>,
}

/// Mount points of the machine, in mount order: (mount point, file-system type).
pub fn mounts() -> Vec<(PathBuf, String)> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let mount_point = f.nth(4)?;
            let rest = l.split(" - ").nth(1)?;
            let fstype = rest.split(' ').next()?;
            Some((PathBuf::from(unescape(mount_point)), fstype.to_string()))
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = |c: &u8| (b'0'..=b'7').contains(c);
        let code = (i + 3 < b.len() && b[i] == b'\\' && b[i + 1..i + 4].iter().all(octal))
            .then(|| {
                b[i + 1..i + 4]
                    .iter()
                    .fold(0u32, |a, c| a * 8 + u32::from(c - b'0'))
            })
            .and_then(|v| u8::try_from(v).ok());
        if let Some(v) = code {
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Mount points of cgroup hierarchies (v1 controllers and a v2 unified mount, if any).
pub fn cgroup_mounts() -> Vec<PathBuf> {
    mounts()
        .into_iter()
        .filter(|(_, t)| t == "cgroup" || t == "cgroup2")
        .map(|(p, _)| p)
        .collect()
}

/// Creates `root` (e.g. `/microvirt-node`) in every cgroup hierarchy; in cpuset it copies the
/// parent's CPUs and memory nodes, which a new cpuset does not inherit on cgroup v1.
pub fn create_cgroup_root(root: &str) -> io::Result<()> {
    let rel = root.trim_start_matches('/');
    for m in cgroup_mounts() {
        let dir = m.join(rel);
        fs::create_dir_all(&dir)?;
        for f in ["cpuset.cpus", "cpuset.mems"] {
            let parent = m.join(f);
            if parent.exists() {
                let v = fs::read_to_string(&parent)?;
                let own = dir.join(f);
                if fs::read_to_string(&own)?.trim().is_empty() {
                    fs::write(&own, v.trim())?;
                }
            }
        }
    }
    Ok(())
}

fn proc_name(pid: u32) -> Option<String> {
    let exe = fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    Some(exe.file_name()?.to_string_lossy().into_owned())
}

fn proc_cmdline(pid: u32) -> Option<String> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(String::from_utf8_lossy(&raw).replace('\0', " "))
}

/// The pids of every process on the machine (`/proc`).
pub fn all_pids() -> Vec<u32> {
    fs::read_dir("/proc")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The node's own processes of one kind: executable `name`, command line mentioning one of
/// the node's directories (so a kubelet or containerd that is not ours is never touched).
pub fn node_processes(paths: &NodePaths, names: &[&str]) -> Vec<(u32, String)> {
    let me = std::process::id();
    let needles: Vec<String> = [paths.base(), paths.run()]
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    all_pids()
        .into_iter()
        .filter(|&p| p != me)
        .filter_map(|p| {
            let name = proc_name(p)?;
            if !names.contains(&name.as_str()) {
                return None;
            }
            let cmd = proc_cmdline(p)?;
            needles
                .iter()
                .any(|n| cmd.contains(n.as_str()))
                .then_some((p, name))
        })
        .collect()
}

fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// SIGTERM, then SIGKILL after `grace`, to each process; waits until they are gone.
pub fn stop_pids(pids: &[(u32, String)], grace: Duration, report: &mut TeardownReport) {
    for (p, _) in pids {
        signal(*p, libc::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    while pids.iter().any(|(p, _)| alive(*p)) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(50));
    }
    for (p, name) in pids {
        if alive(*p) {
            signal(*p, libc::SIGKILL);
        }
        report.killed.push((*p, name.clone()));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|(p, _)| alive(*p)) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    for (p, name) in pids {
        if alive(*p) {
            report
                .problems
                .push(format!("{name} (pid {p}) survived SIGKILL"));
        }
    }
}

/// Every cgroup directory below `root` in every hierarchy, deepest first.
fn cgroup_dirs(root: &str) -> Vec<PathBuf> {
    let rel = root.trim_start_matches('/');
    let mut dirs = Vec::new();
    for m in cgroup_mounts() {
        let top = m.join(rel);
        if top.is_dir() {
            walk_dirs(&top, &mut dirs);
        }
    }
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    dirs
}

fn walk_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_path_buf());
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                walk_dirs(&e.path(), out);
            }
        }
    }
}

/// Processes in the cgroups below `root` (containers, and anything they started).
fn cgroup_pids(root: &str) -> BTreeSet<u32> {
    let mut pids = BTreeSet::new();
    for d in cgroup_dirs(root) {
        if let Ok(t) = fs::read_to_string(d.join("cgroup.procs")) {
            pids.extend(t.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
    }
    pids.remove(&std::process::id());
    pids
}

/// Kills every process in the node's pod cgroups, then removes the cgroups.
pub fn remove_cgroups(root: &str, report: &mut TeardownReport) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let pids = cgroup_pids(root);
        if pids.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            report
                .problems
                .push(format!("processes left in cgroup {root}: {pids:?}"));
            break;
        }
        for p in pids {
            if signal(p, libc::SIGKILL) {
                report.killed.push((p, proc_name(p).unwrap_or_default()));
            }
        }
        thread::sleep(Duration::from_millis(50));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let dirs = cgroup_dirs(root);
        if dirs.is_empty() {
            break;
        }
        let mut failed = None;
        for d in &dirs {
            match fs::remove_dir(d) {
                Ok(()) => report.cgroups_removed += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => failed = Some(format!("{}: {e}", d.display())),
            }
        }
        match failed {
            None => break,
            Some(f) if Instant::now() > deadline => {
                report.problems.push(format!("cgroup not removed: {f}"));
                break;
            }
            // A cgroup whose last task just died stays busy for a moment.
            Some(_) => thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Unmounts everything mounted below `roots`, deepest (latest) first.
pub fn unmount_below(roots: &[PathBuf], report: &mut TeardownReport) {
    for _round in 0..5 {
        let mut ours: Vec<PathBuf> = mounts()
            .into_iter()
            .map(|(p, _)| p)
            .filter(|p| roots.iter().any(|r| p.starts_with(r)))
            .collect();
        if ours.is_empty() {
            return;
        }
        ours.reverse();
        for p in ours {
            let Ok(c) = CString::new(p.as_os_str().as_bytes()) else {
                continue;
            };
            // SAFETY: umount2 takes a valid NUL-terminated path; MNT_DETACH detaches the mount
            // even while something still holds it open (it goes away with the last user).
            let r = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            if r == 0 {
                report.unmounted.push(p);
            }
        }
    }
    let left: Vec<PathBuf> = mounts()
        .into_iter()
        .map(|(p, _)| p)
        .filter(|p| roots.iter().any(|r| p.starts_with(r)))
        .collect();
    if !left.is_empty() {
        report.problems.push(format!("mounts left: {left:?}"));
    }
}

fn sysctl_path(key: &str) -> PathBuf {
    Path::new("/proc/sys").join(key)
}

/// Records the kernel settings the kubelet changes, unless a record exists already (then it
/// holds the values from before an earlier node that was not torn down).
pub fn record_sysctls(paths: &NodePaths) -> io::Result<()> {
    let rec = paths.sysctl_record();
    if rec.exists() {
        return Ok(());
    }
    let mut text = String::new();
    for k in KUBELET_SYSCTLS {
        if let Ok(v) = fs::read_to_string(sysctl_path(k)) {
            text.push_str(&format!("{k} {}\n", v.trim()));
        }
    }
    let tmp = rec.with_extension("tmp");
    fs::write(&tmp, text)?;
    fs::rename(&tmp, &rec)
}

/// Puts back the recorded kernel settings and removes the record.
pub fn restore_sysctls(paths: &NodePaths, report: &mut TeardownReport) {
    let rec = paths.sysctl_record();
    let Ok(text) = fs::read_to_string(&rec) else {
        return;
    };
    let mut ok = true;
    for line in text.lines() {
        let Some((k, v)) = line.split_once(' ') else {
            continue;
        };
        let path = sysctl_path(k);
        let now = fs::read_to_string(&path).unwrap_or_default();
        if now.trim() == v.trim() {
            continue;
        }
        match fs::write(&path, v) {
            Ok(()) => report.sysctls_restored.push(format!("{k}={v}")),
            Err(e) => {
                ok = false;
                report.problems.push(format!("restoring {k}={v}: {e}"));
            }
        }
    }
    if ok {
        let _ = fs::remove_file(&rec);
    }
}

/// Records which of [`FIXED_PATHS`] do not exist yet (the node will create them).
pub fn record_fixed_paths(paths: &NodePaths) -> io::Result<()> {
    let rec = paths.created_record();
    let mut list: BTreeSet<String> = fs::read_to_string(&rec)
        .map(|t| t.lines().map(str::to_string).collect())
        .unwrap_or_default();
    for p in FIXED_PATHS {
        if !Path::new(p).exists() {
            list.insert(p.to_string());
        }
    }
    let text: String = list.iter().map(|l| format!("{l}\n")).collect();
    fs::write(rec, text)
}

/// Removes the fixed paths the node created.
pub fn remove_fixed_paths(paths: &NodePaths, report: &mut TeardownReport) {
    let rec = paths.created_record();
    let Ok(text) = fs::read_to_string(&rec) else {
        return;
    };
    for p in text.lines().filter(|l| FIXED_PATHS.contains(l)) {
        if let Err(e) = fs::remove_dir_all(p) {
            if e.kind() != io::ErrorKind::NotFound {
                report.problems.push(format!("removing {p}: {e}"));
            }
        }
    }
    let _ = fs::remove_file(rec);
}

/// Deletes the host end of the node's veth (the node end goes with its namespace).
pub fn remove_host_veth(report: &mut TeardownReport) {
    if !Path::new("/sys/class/net").join(HOST_VETH).exists() {
        return;
    }
    let st = Command::new(super::netns::IP)
        .args(["link", "del", HOST_VETH])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !matches!(st, Ok(s) if s.success()) {
        report
            .problems
            .push(format!("ip link del {HOST_VETH} failed"));
    }
}

/// Removes the node's directories except its process logs.
pub fn remove_state(paths: &NodePaths, report: &mut TeardownReport) {
    if let Ok(rd) = fs::read_dir(paths.base()) {
        for e in rd.flatten() {
            let p = e.path();
            if p == paths.logs() || p == paths.sysctl_record() || p == paths.created_record() {
                continue;
            }
            let r = if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                fs::remove_dir_all(&p)
            } else {
                fs::remove_file(&p)
            };
            if let Err(e) = r {
                report
                    .problems
                    .push(format!("removing {}: {e}", p.display()));
            }
        }
    }
    if let Err(e) = fs::remove_dir_all(paths.run()) {
        if e.kind() != io::ErrorKind::NotFound {
            report
                .problems
                .push(format!("removing {}: {e}", paths.run().display()));
        }
    }
}

/// Tears the whole node down, in an order that lets nothing restart what was just stopped:
/// kubelet, then the containers (by cgroup), then containerd and its shims, then the
/// namespace holder; then mounts, cgroups, the veth, kernel settings, fixed paths, state.
pub fn teardown(paths: &NodePaths, cgroup_root: &str) -> TeardownReport {
    let mut report = TeardownReport::default();
    let kubelets = node_processes(paths, &["kubelet"]);
    stop_pids(&kubelets, Duration::from_secs(10), &mut report);
    remove_cgroups(cgroup_root, &mut report);
    let runtime = node_processes(paths, &["containerd", "containerd-shim-runc-v2"]);
    stop_pids(&runtime, Duration::from_secs(10), &mut report);
    let holders = node_processes(paths, &["pause"]);
    stop_pids(&holders, Duration::from_secs(5), &mut report);
    unmount_below(&paths.mount_roots(), &mut report);
    // Containers are gone: their cgroups can go too (containerd may have recreated some).
    remove_cgroups(cgroup_root, &mut report);
    remove_host_veth(&mut report);
    restore_sysctls(paths, &mut report);
    remove_fixed_paths(paths, &mut report);
    remove_state(paths, &mut report);
    for what in ["kubelet", "containerd", "netns"] {
        let _ = fs::remove_file(paths.pid_file(what));
    }
    report
}

/// Shell text of the node's watchdog (see [`spawn_watchdog`]): [`teardown`]'s steps for an
/// owner that died without dropping its node (SIGKILL, a CI timeout), from the same facts on
/// the machine: executable name plus a command line naming the node's directories, the pod
/// cgroups, mountinfo, the recorded kernel settings and fixed paths.
const WATCHDOG_SH: &str = r#"trap '' INT TERM HUP
while kill -0 "$MV_PARENT" 2>/dev/null; do sleep 1; done
case "$MV_BASE:$MV_RUN" in /?*:/?*) ;; *) exit 1 ;; esac
# A new owner holds the lock: its start clears what is left. Otherwise keep it out meanwhile.
exec 9>>"$MV_LOCK" || exit 1
flock -n 9 || exit 0
pids_of() {
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    exe=$(readlink "$d/exe" 2>/dev/null) || continue
    exe=${exe##*/}; exe=${exe% (deleted)}
    for n in "$@"; do
      [ "$exe" = "$n" ] && grep -qaF -e "$MV_BASE" -e "$MV_RUN" "$d/cmdline" 2>/dev/null && echo "$p"
    done
  done
}
stop() {
  p=$(pids_of "$@"); [ -n "$p" ] || return 0
  kill -TERM $p 2>/dev/null
  i=0; while [ $i -lt 50 ] && [ -n "$(pids_of "$@")" ]; do sleep 0.1; i=$((i+1)); done
  p=$(pids_of "$@"); [ -n "$p" ] && kill -KILL $p 2>/dev/null
  i=0; while [ $i -lt 50 ] && [ -n "$(pids_of "$@")" ]; do sleep 0.1; i=$((i+1)); done
}
cgroup_dirs() {
  grep -E ' - cgroup2? ' /proc/self/mountinfo | cut -d' ' -f5 | while read -r m; do
    [ -d "$m$MV_CGROUP" ] && find "$m$MV_CGROUP" -depth -type d
  done
}
kill_cgroups() {
  i=0; while [ $i -lt 100 ]; do
    p=$(cgroup_dirs | while read -r d; do cat "$d/cgroup.procs" 2>/dev/null; done)
    [ -n "$p" ] || return 0
    kill -KILL $p 2>/dev/null; sleep 0.1; i=$((i+1))
  done
}
remove_cgroups() {
  i=0; while [ $i -lt 50 ]; do
    left=; for d in $(cgroup_dirs); do rmdir "$d" 2>/dev/null || left=1; done
    [ -n "$left" ] || return 0
    sleep 0.2; i=$((i+1))
  done
}
stop kubelet
kill_cgroups
stop containerd containerd-shim-runc-v2
stop pause
for round in 1 2 3 4 5; do
  ms=$(cut -d' ' -f5 /proc/self/mountinfo | tac | while read -r m; do
    for r in $MV_MOUNT_ROOTS; do case "$m" in "$r"|"$r"/*) echo "$m" ;; esac; done
  done)
  [ -n "$ms" ] || break
  for m in $ms; do umount -l "$m" 2>/dev/null; done
done
kill_cgroups
remove_cgroups
[ -e "/sys/class/net/$MV_VETH" ] && "$MV_IP" link del "$MV_VETH" 2>/dev/null
rec="$MV_BASE/sysctl.saved"
if [ -f "$rec" ]; then
  ok=1
  while read -r k v; do echo "$v" > "/proc/sys/$k" 2>/dev/null || ok=; done < "$rec"
  [ -n "$ok" ] && rm -f "$rec"
fi
rec="$MV_BASE/created-paths"
if [ -f "$rec" ]; then
  while read -r p; do for f in $MV_FIXED; do [ "$p" = "$f" ] && rm -rf "$p"; done; done < "$rec"
  rm -f "$rec"
fi
for e in "$MV_BASE"/*; do
  case "$e" in "$MV_BASE/logs"|"$rec"|"$MV_BASE/sysctl.saved") ;; *) rm -rf "$e" ;; esac
done
rm -rf "$MV_RUN"
exit 0
"#;

/// Starts a watchdog (a `sh` in a process group of its own) that waits for process `parent`
/// to end and then tears the node down as [`teardown`] does, unless another owner has taken
/// the node's lock by then (that owner's start clears what is left). The owner kills the
/// watchdog before its own teardown. Needs `flock` (util-linux), `find`, `tac`, `umount`.
pub fn spawn_watchdog(
    paths: &NodePaths,
    cgroup_root: &str,
    parent: u32,
) -> io::Result<std::process::Child> {
    use std::os::unix::process::CommandExt;
    let join = |v: Vec<String>| v.join(" ");
    Command::new("sh")
        .arg("-c")
        .arg(WATCHDOG_SH)
        .arg("microvirt-node-watchdog")
        .env("MV_PARENT", parent.to_string())
        .env("MV_LOCK", paths.lock_file())
        .env("MV_BASE", paths.base())
        .env("MV_RUN", paths.run())
        .env(
            "MV_CGROUP",
            format!("/{}", cgroup_root.trim_start_matches('/')),
        )
        .env("MV_VETH", HOST_VETH)
        .env("MV_IP", super::netns::IP)
        .env(
            "MV_MOUNT_ROOTS",
            join(
                paths
                    .mount_roots()
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect(),
            ),
        )
        .env(
            "MV_FIXED",
            join(FIXED_PATHS.iter().map(|p| p.to_string()).collect()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape(r"/a\040b"), "/a b");
        assert_eq!(unescape(r"/a\134b"), r"/a\b");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape(r"/end\04"), r"/end\04");
    }

    #[test]
    fn mounts_include_proc() {
        assert!(mounts()
            .iter()
            .any(|(p, t)| p == Path::new("/proc") && t == "proc"));
    }
}
