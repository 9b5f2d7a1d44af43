//! Snapshot and restore through `virt-launcher` on this machine's /dev/kvm with the built-in
//! demo guest: `virt-launcher snapshot DIR` on the control socket, `run --restore DIR
//! --paused`, `resume`; the VMI's containerDisk overlay travels with the snapshot, and a VMI
//! that does not match the snapshot is refused before anything runs. The `ticker` guest (a VM
//! pool's member) shows what clones of one snapshot share and where they diverge.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use microvirt_testsupport::{Spawned, TempDir};

const BIN: &str = env!("CARGO_BIN_EXE_virt-launcher");
const WAIT: Duration = Duration::from_secs(60);

/// `virt-launcher ARGS`, its output collected; killed when dropped.
fn launcher(args: &[&str]) -> Spawned {
    Spawned::spawn(Command::new(BIN).args(args))
}

fn client(args: &[&str]) -> (Output, serde_json::Value) {
    let out = Command::new(BIN).args(args).output().unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (out, v)
}

fn vmi(dir: &Path, name: &str, memory: &str, kernel_args: &str) -> PathBuf {
    let p = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &p,
        format!(
            "apiVersion: microvirt.io/v1alpha1\nkind: VirtualMachineInstance\n\
             metadata: {{name: {name}}}\nspec:\n  domain:\n    memory: {{guest: {memory}}}\n    \
             firmware: {{kernelBoot: {{kernelArgs: \"{kernel_args}\"}}}}\n    devices:\n      \
             disks: [{{name: root}}]\n  volumes:\n    - {{name: root, containerDisk: {{image: local, path: base.img}}}}\n"
        ),
    )
    .unwrap();
    p
}

#[test]
fn snapshot_then_restore_paused_resume_with_the_containerdisk_overlay() {
    let t = TempDir::new("flow");
    let base = t.join("base.img");
    std::fs::write(&base, vec![0u8; 1 << 20]).unwrap();
    let k = 200;
    let args = format!("testguest.scenario=stream testguest.stream_count={k}");
    let vmi_file = vmi(t.path(), "snapvm", "32Mi", &args);
    let (s1, s2) = (t.join("one.sock"), t.join("two.sock"));
    let (rt1, rt2) = (t.join("rt1"), t.join("rt2"));
    let vmi_s = vmi_file.display().to_string();
    let mut one = launcher(&[
        "run",
        &vmi_s,
        "--control-socket",
        &s1.display().to_string(),
        "--runtime-dir",
        &rt1.display().to_string(),
    ]);
    one.wait_for_stdout("stream: 60", WAIT);
    let snap = t.join("snap");
    let (out, a) = client(&[
        "snapshot",
        &snap.display().to_string(),
        "--socket",
        &s1.display().to_string(),
    ]);
    assert!(out.status.success(), "{out:?}; {}", one.output());
    assert_eq!(a["state"], "paused", "{a}");
    assert!(a["overlayBytes"].as_u64().unwrap() > 0, "{a}");
    assert!(snap.join("disk0.overlay").is_file());
    let (_, st) = client(&["status", "--socket", &s1.display().to_string()]);
    assert_eq!(st["state"], "paused");
    let (out, _) = client(&["stop", "--socket", &s1.display().to_string()]);
    assert!(out.status.success());
    assert_eq!(one.wait(WAIT).0.code(), Some(5), "{}", one.output());
    let printed = one.stdout();

    // A VMI that asks for other memory is refused before anything runs.
    let other = vmi(t.path(), "bigger", "64Mi", &args);
    let out = Command::new(BIN)
        .args(["run", &other.display().to_string(), "--restore"])
        .arg(&snap)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("memory size mismatch: the snapshot has 32 MiB, 64 MiB asked for"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "the guest ran: {out:?}");

    let mut two = launcher(&[
        "run",
        &vmi_s,
        "--restore",
        &snap.display().to_string(),
        "--paused",
        "--control-socket",
        &s2.display().to_string(),
        "--runtime-dir",
        &rt2.display().to_string(),
    ]);
    let end = Instant::now() + WAIT;
    while std::os::unix::net::UnixStream::connect(&s2).is_err() {
        assert!(Instant::now() < end, "no control socket; {}", two.output());
        std::thread::sleep(Duration::from_millis(10));
    }
    let (_, st) = client(&["status", "--socket", &s2.display().to_string()]);
    assert_eq!(st["state"], "paused", "{st}");
    assert_eq!(st["booted"], false, "{st}");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        two.stdout().is_empty(),
        "ran while paused: {}",
        two.output()
    );
    // What the node agent follows: the watch stream never says "booted" while "paused" (the
    // resume of a restored VM records its boot time while the request runs; a watcher would
    // report a pause that never was).
    let mut watch = std::os::unix::net::UnixStream::connect(&s2).unwrap();
    std::io::Write::write_all(&mut watch, b"{\"cmd\":\"watch\"}\n").unwrap();
    watch.set_read_timeout(Some(WAIT)).unwrap();
    let mut watch = BufReader::new(watch);
    let (out, a) = client(&["resume", "--socket", &s2.display().to_string()]);
    assert!(out.status.success(), "{a}");
    let mut seen = Vec::new();
    loop {
        let mut l = String::new();
        watch.read_line(&mut l).unwrap();
        let v: serde_json::Value = serde_json::from_str(l.trim()).unwrap();
        seen.push(format!("{}/{}", v["state"], v["booted"]));
        assert!(
            !(v["state"] == "paused" && v["booted"] == true),
            "watch said booted while paused: {seen:?}"
        );
        if v["state"] == "running" && v["booted"] == true {
            break;
        }
    }
    drop(watch);
    // A snapshot of the restored VM (its RAM maps the snapshot's file: the VMM thread asks
    // `mincore` which pages it wrote), under the launcher's seccomp filters, then on.
    let snap2 = t.join("snap2");
    let (out, a) = client(&[
        "snapshot",
        &snap2.display().to_string(),
        "--socket",
        &s2.display().to_string(),
    ]);
    assert!(out.status.success(), "{out:?}; {}", two.output());
    assert_eq!(a["state"], "paused", "{a}");
    assert!(snap2.join("vmstate").is_file());
    let (out, a) = client(&["resume", "--socket", &s2.display().to_string()]);
    assert!(out.status.success(), "{a}");
    two.wait_for_stdout(&format!("stream: done {k} blk=ok net=none"), WAIT);
    assert!(two.wait(WAIT).0.success(), "{}", two.output());
    let stdout = two.stdout();
    assert!(
        !stdout.contains("stream: start"),
        "the restored guest started over:\n{stdout}"
    );
    assert!(printed.contains("stream: start"));
    assert!(
        two.output().contains("guest restored and running in"),
        "{}",
        two.output()
    );
    // The restore's own overlay (a copy of the saved one, then written on); the image and the
    // first run's overlay are as they were.
    assert!(rt2.join("root.overlay").is_file());
    assert_eq!(std::fs::read(&base).unwrap(), vec![0u8; 1 << 20]);
}

/// `(n, uptime-ms, boot-id, rng)` of every `tick` line in `out`.
fn ticks(out: &str) -> Vec<(u64, u64, String, String)> {
    out.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("tick ")?;
            let field = |k: &str| {
                rest.split_whitespace()
                    .find_map(|w| w.strip_prefix(k))
                    .map(str::to_string)
            };
            Some((
                field("n=")?.parse().ok()?,
                field("uptime-ms=")?.parse().ok()?,
                field("boot-id=")?,
                field("rng=")?,
            ))
        })
        .collect()
}

/// The ticker guest of a VM pool member: two clones restored from one snapshot continue its
/// tick count and uptime and keep its boot id (state drawn before the snapshot is shared), and
/// the first tick after the gap reseeds the generator, so the clones' random numbers diverge.
#[test]
fn ticker_clones_continue_the_count_share_the_boot_id_and_reseed() {
    let t = TempDir::new("ticker");
    std::fs::write(t.join("base.img"), vec![0u8; 1 << 20]).unwrap();
    let vmi_file = vmi(
        t.path(),
        "tickvm",
        "32Mi",
        "testguest.scenario=ticker testguest.tick_ms=50",
    );
    let vmi_s = vmi_file.display().to_string();
    let sock = t.join("orig.sock");
    let mut orig = launcher(&[
        "run",
        &vmi_s,
        "--control-socket",
        &sock.display().to_string(),
        "--runtime-dir",
        &t.join("rt-orig").display().to_string(),
    ]);
    orig.wait_for_stdout("tick n=5 ", WAIT);
    let snap = t.join("snap");
    let (out, a) = client(&[
        "snapshot",
        &snap.display().to_string(),
        "--socket",
        &sock.display().to_string(),
    ]);
    assert!(out.status.success(), "{out:?}; {}", orig.output());
    assert_eq!(a["state"], "paused", "{a}");
    let (out, _) = client(&["stop", "--socket", &sock.display().to_string()]);
    assert!(out.status.success());
    orig.wait(WAIT);
    let before = ticks(&orig.stdout());
    let last = before.last().cloned().expect("ticks before the snapshot");
    assert!(last.0 >= 5, "{before:?}");
    // More than three periods pass before the clones run.
    std::thread::sleep(Duration::from_millis(400));

    let mut clones: Vec<Spawned> = (0..2)
        .map(|i| {
            launcher(&[
                "run",
                &vmi_s,
                "--restore",
                &snap.display().to_string(),
                "--runtime-dir",
                &t.join(format!("rt-clone{i}")).display().to_string(),
            ])
        })
        .collect();
    for c in &mut clones {
        c.wait_for_stdout("rng reseeded", WAIT);
        c.wait_for_stdout(&format!("tick n={} ", last.0 + 3), WAIT);
    }
    let after: Vec<_> = clones.iter().map(|c| ticks(&c.stdout())).collect();
    for (c, a) in clones.iter().zip(&after) {
        assert!(
            !c.stdout().contains("ticker: boot-id="),
            "a clone booted again: {}",
            c.output()
        );
        let first = &a[0];
        assert_eq!(first.0, last.0 + 1, "the count continues: {a:?}");
        assert!(
            first.1 > last.1,
            "uptime continues from the snapshot: {last:?} then {first:?}"
        );
        assert!(a.iter().all(|x| x.2 == last.2), "boot id shared: {a:?}");
    }
    let rng = |a: &Vec<(u64, u64, String, String)>| -> Vec<String> {
        a.iter().map(|x| x.3.clone()).collect()
    };
    let (r0, r1) = (rng(&after[0]), rng(&after[1]));
    assert!(
        r0.iter().zip(&r1).all(|(a, b)| a != b),
        "clones still draw the same numbers after the reseed: {r0:?} vs {r1:?}"
    );
}
