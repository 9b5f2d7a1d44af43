//! Bad snapshots and bad snapshot targets: a restore that cannot work says why in one line,
//! exits non-zero, starts nothing and leaves the snapshot's files alone; a snapshot that
//! cannot be written fails cleanly and the VM keeps running.

mod common;
mod snapshot_common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};

use common::guest;
use snapshot_common::*;
use vmm::snapshot::format;

/// A snapshot of the counter guest with a disk, in `<dir>/snap` (disk: `<dir>/disk.img`).
fn copy_of(tag: &str) -> TempDir {
    let t = TempDir::new(tag);
    let disk = t.join("disk.img");
    std::fs::write(&disk, vec![0u8; 1 << 20]).unwrap();
    let sock = t.join("ctl.sock");
    let kernel = guest().pvh.display().to_string();
    let mut vm = Proc::microvm(&[
        "--kernel",
        &kernel,
        "--disk",
        &format!("path={}", disk.display()),
        "--cmdline",
        "testguest.scenario=counter",
        "--control-socket",
        &sock.display().to_string(),
    ]);
    vm.wait_line("counter", |l| l.starts_with("counter: seq=2 "));
    snapshot(&sock, &t.join("snap"));
    t
}

fn read_state(dir: &Path) -> Value {
    let b = std::fs::read(dir.join("vmstate")).unwrap();
    let (_, payload) = format::decode(&b).unwrap();
    serde_json::from_slice(payload).unwrap()
}

/// Rewrites the state file with `state` and a valid header and checksum.
fn write_state(dir: &Path, state: &Value) {
    let payload = serde_json::to_vec(state).unwrap();
    std::fs::write(dir.join("vmstate"), format::encode(&payload)).unwrap();
}

/// Runs `microvm --restore DIR extra...` and checks the failure is clean; returns the error.
fn restore_fails(dir: &Path, extra: &[&str]) -> String {
    let sock = dir.with_extension("sock");
    let before = dir.is_dir().then(|| fingerprint(dir));
    let out: Output = Command::new(MICROVM)
        .arg("--restore")
        .arg(dir)
        .args(["--control-socket", &sock.display().to_string()])
        .args(extra)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "exit status; stderr:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("microvm: error:"))
        .collect();
    assert_eq!(errors.len(), 1, "one error line expected:\n{stderr}");
    assert!(out.stdout.is_empty(), "the guest ran: {:?}", out.stdout);
    assert!(!sock.exists(), "the control socket was left behind");
    if let Some(b) = before {
        assert_eq!(fingerprint(dir), b, "the snapshot's files changed");
    }
    errors[0].to_string()
}

fn has(err: &str, needle: &str) {
    assert!(err.contains(needle), "{err:?} does not say {needle:?}");
}

#[test]
fn corrupt_state_file_fails_the_checksum() {
    let t = copy_of("crc");
    let p = t.join("snap").join("vmstate");
    let mut b = std::fs::read(&p).unwrap();
    let n = b.len();
    b[n - 10] ^= 0x20;
    std::fs::write(&p, b).unwrap();
    has(
        &restore_fails(&t.join("snap"), &[]),
        "state file checksum mismatch",
    );
}

#[test]
fn other_major_version_is_refused_and_minor_is_accepted_to_the_next_check() {
    let t = copy_of("version");
    let p = t.join("snap").join("vmstate");
    let mut b = std::fs::read(&p).unwrap();
    b[8] = 2;
    b[10] = 0;
    std::fs::write(&p, &b).unwrap();
    has(
        &restore_fails(&t.join("snap"), &[]),
        "snapshot format 2.0 is not supported (this VMM reads 1.x)",
    );
    // A newer minor passes the version check (then fails on the memory size asked for).
    b[8] = 1;
    b[10] = 9;
    std::fs::write(&p, &b).unwrap();
    has(
        &restore_fails(&t.join("snap"), &["--mem-mib", "64"]),
        "memory size mismatch: the snapshot has 128 MiB, 64 MiB asked for",
    );
}

#[test]
fn overlay_copy_names_must_be_plain_names_inside_the_snapshot() {
    let t = copy_of("overlayname");
    let dir = t.join("snap");
    let good = read_state(&dir);
    // The empty name (found by the snapshot_state fuzz target) would open the snapshot
    // directory itself as the overlay copy.
    for name in ["", "../disk.img", "/etc/hostname", ".hidden"] {
        let mut s = good.clone();
        s["devices"][0]["device"]["overlay_file"] = json!(name);
        write_state(&dir, &s);
        has(
            &restore_fails(&dir, &[]),
            &format!("overlay file name {name:?}"),
        );
    }
}

#[test]
fn memory_size_and_vcpu_mismatch() {
    let t = copy_of("memsize");
    has(
        &restore_fails(&t.join("snap"), &["--mem-mib", "256"]),
        "memory size mismatch: the snapshot has 128 MiB, 256 MiB asked for",
    );
    has(
        &restore_fails(&t.join("snap"), &["--vcpus", "2"]),
        "vCPU count mismatch: the snapshot has 1, 2 asked for",
    );
}

#[test]
fn another_host_cpu_is_refused() {
    let t = copy_of("cpu");
    let snap = t.join("snap");
    let mut s = read_state(&snap);
    let model = s["host"]["cpu_model"].as_u64().unwrap();
    s["host"]["cpu_model"] = json!(model + 1);
    write_state(&snap, &s);
    let e = restore_fails(&snap, &[]);
    has(&e, "host CPU mismatch: the snapshot was taken on");
    has(&e, &format!("model {}", model + 1));
    // Same model, but a CPU feature this host lacks.
    let mut s = read_state(&snap);
    s["host"]["cpu_model"] = json!(model);
    for f in s["host"]["cpu_features"].as_array_mut().unwrap() {
        if f["function"] == 7 && f["index"] == 0 {
            f["ebx"] = json!(u32::MAX);
        }
    }
    write_state(&snap, &s);
    has(
        &restore_fails(&snap, &[]),
        "host CPU lacks features the guest uses: CPUID leaf 0x7.0 ebx",
    );
}

#[test]
fn truncated_memory_file_is_refused() {
    let t = copy_of("truncated");
    let mem = t.join("snap").join("memory");
    let f = std::fs::OpenOptions::new().write(true).open(&mem).unwrap();
    f.set_len(64 << 20).unwrap();
    drop(f);
    has(
        &restore_fails(&t.join("snap"), &[]),
        "memory file is 67108864 bytes, the guest has 134217728 bytes of RAM",
    );
    std::fs::remove_file(&mem).unwrap();
    let e = restore_fails(&t.join("snap"), &[]);
    has(&e, "memory: No such file");
}

#[test]
fn missing_disk_is_named() {
    let t = copy_of("disk");
    let snap = t.join("snap");
    let gone = t.join("moved-away.img");
    let e = restore_fails(&snap, &["--disk", &format!("path={}", gone.display())]);
    has(&e, &gone.display().to_string());
    has(&e, "No such file");
    // The snapshot's own disk path gone.
    let mut s = read_state(&snap);
    s["devices"][0]["device"]["config"]["path"] = json!(gone.display().to_string());
    write_state(&snap, &s);
    has(&restore_fails(&snap, &[]), &gone.display().to_string());
    // More replacements than the snapshot has devices.
    let e = restore_fails(&snap, &["--disk", "path=/a", "--disk", "path=/b"]);
    has(
        &e,
        "2 disk and 0 NIC replacements given; the snapshot has 1 disk(s) and 0 NIC(s)",
    );
}

#[test]
fn directories_that_are_not_snapshots() {
    let t = TempDir::new("notasnap");
    let empty = t.join("empty");
    std::fs::create_dir(&empty).unwrap();
    has(
        &restore_fails(&empty, &[]),
        "is not a snapshot: it has no vmstate file",
    );
    let junk = t.join("junk");
    std::fs::create_dir(&junk).unwrap();
    std::fs::write(junk.join("vmstate"), "hello, I am a text file\n").unwrap();
    has(
        &restore_fails(&junk, &[]),
        "its vmstate file is not a microvirt snapshot state file",
    );
    has(
        &restore_fails(&t.join("missing"), &[]),
        "is not a snapshot: No such file",
    );
    let file = t.join("file");
    std::fs::write(&file, "x").unwrap();
    has(
        &restore_fails(&file, &[]),
        "is not a snapshot: not a directory",
    );
    // A valid header around a payload that is not a VM.
    let odd = t.join("odd");
    std::fs::create_dir(&odd).unwrap();
    std::fs::write(odd.join("vmstate"), format::encode(b"{\"hello\": 1}")).unwrap();
    has(&restore_fails(&odd, &[]), "the state file does not parse");
}

/// `microvm` in a private mount namespace with a 64 KiB tmpfs at `full/` and a read-only
/// tmpfs at `ro/` (both gone with the process).
fn vm_with_small_mounts(t: &TempDir) -> Proc {
    let (full, ro) = (t.join("full"), t.join("ro"));
    std::fs::create_dir_all(&full).unwrap();
    std::fs::create_dir_all(&ro).unwrap();
    let kernel = guest().pvh.display().to_string();
    let script = format!(
        "mount -t tmpfs -o size=64k tmpfs '{}' && mount -t tmpfs -o ro,size=1m tmpfs '{}' && \
         exec '{MICROVM}' --kernel '{kernel}' --cmdline testguest.scenario=counter \
         --control-socket '{}'",
        full.display(),
        ro.display(),
        t.join("ctl.sock").display()
    );
    let mut c = Command::new("unshare");
    c.args(["-m", "--propagation", "private", "sh", "-c", &script]);
    Proc::spawn(c)
}

fn still_running(vm: &mut Proc, sock: &Path) {
    assert_eq!(
        control(sock, json!({"cmd": "state"}))["state"],
        "running",
        "{}",
        vm.context()
    );
    let seq = counters(vm.drain(), 1).last().map_or(0, |c| c.0);
    vm.wait_line("progress after the failed snapshot", |l| {
        parse_counter(l).is_some_and(|c| c.0 >= seq + 2)
    });
}

#[test]
fn snapshot_into_a_full_or_read_only_or_used_directory_fails_and_the_vm_runs_on() {
    let t = TempDir::new("targets");
    let mut vm = vm_with_small_mounts(&t);
    let sock = t.join("ctl.sock");
    vm.wait_line("counter", |l| l.starts_with("counter: seq=2 "));

    let req = |dir: &Path| json!({"cmd": "snapshot", "dir": dir.display().to_string()});
    let full_target = t.join("full").join("snap");
    let a = control(&sock, req(&full_target));
    assert_eq!(a["ok"], false, "{a}");
    has(a["error"].as_str().unwrap(), "No space left on device");
    still_running(&mut vm, &sock);
    // Nothing left behind in the full file system (seen through the VM's mount namespace).
    let inside = PathBuf::from(format!(
        "/proc/{}/root{}",
        vm.pid(),
        t.join("full").display()
    ));
    let left: Vec<_> = std::fs::read_dir(&inside).unwrap().collect();
    assert!(left.is_empty(), "left in the full tmpfs: {left:?}");

    let a = control(&sock, req(&t.join("ro").join("snap")));
    assert_eq!(a["ok"], false, "{a}");
    has(a["error"].as_str().unwrap(), "Read-only file system");
    still_running(&mut vm, &sock);

    let used = t.join("used");
    std::fs::create_dir(&used).unwrap();
    std::fs::write(used.join("precious"), "keep me").unwrap();
    let a = control(&sock, req(&used));
    has(a["error"].as_str().unwrap(), "is not empty");
    assert_eq!(
        std::fs::read_to_string(used.join("precious")).unwrap(),
        "keep me"
    );
    let a = control(&sock, json!({"cmd": "snapshot", "dir": "relative/dir"}));
    has(a["error"].as_str().unwrap(), "must be an absolute path");
    let a = control(&sock, json!({"cmd": "snapshot"}));
    has(a["error"].as_str().unwrap(), "needs \"dir\"");
    still_running(&mut vm, &sock);

    // After all that, a snapshot still works and restores.
    let good = t.join("good");
    snapshot(&sock, &good);
    let seq = counters(vm.drain(), 1).last().unwrap().0;
    assert_eq!(control(&sock, json!({"cmd": "stop"}))["state"], "stopped");
    drop(vm);
    let mut clone = Proc::microvm(&["--restore", &good.display().to_string()]);
    clone.wait_line("the clone's counter", |l| {
        parse_counter(l).is_some_and(|c| c.0 >= seq + 2)
    });
    assert!(counters(&clone.seen, 1)[0].0 <= seq + 2);
}
