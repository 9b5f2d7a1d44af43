//! Snapshot and restore of a running VM, end to end with `microvm` and the test guest on
//! /dev/kvm: the guest continues where it was (counters in memory and registers of every
//! vCPU), disk and network requests in flight are neither lost nor repeated, clones share the
//! memory file, and bad snapshots or targets fail cleanly.

mod common;
mod snapshot_common;
mod virtio_common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::channel;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::guest;
use snapshot_common::*;
use virtio_common::{ScratchNetns, ETH_P};

/// Boots the counter guest, takes a snapshot once it has printed a few lines, and returns
/// (the paused original, the last complete line it printed, the counters in the memory file).
fn counter_snapshot(
    t: &TempDir,
    vcpus: u8,
    extra_cmdline: &str,
) -> (Proc, Vec<u64>, Vec<u64>, u64) {
    let kernel = guest().pvh.display().to_string();
    let sock = t.join("orig.sock");
    let cmdline = format!("testguest.scenario=counter {extra_cmdline}");
    let vc = vcpus.to_string();
    let mut orig = Proc::microvm(&[
        "--kernel",
        &kernel,
        "--vcpus",
        &vc,
        "--cmdline",
        &cmdline,
        "--control-socket",
        &sock.display().to_string(),
    ]);
    let addr = counters_addr(&mut orig);
    orig.wait_line("counter line 5", |l| l.starts_with("counter: seq=5 "));
    let snap = t.join("snap");
    let a = snapshot(&sock, &snap);
    assert_eq!(a["ramBytes"], 128u64 << 20);
    // Paused: no more output.
    std::thread::sleep(Duration::from_millis(200));
    let before = counters(orig.drain(), usize::from(vcpus));
    std::thread::sleep(Duration::from_millis(300));
    let after = counters(orig.drain(), usize::from(vcpus));
    assert_eq!(
        before.len(),
        after.len(),
        "the VM ran on after the snapshot"
    );
    let last = after.last().expect("counter lines").clone();
    let saved = saved_counters(&snap.join("memory"), addr, usize::from(vcpus));
    (
        orig,
        last.1.into_iter().chain([last.0]).collect(),
        saved,
        addr,
    )
}

fn counter_continues(vcpus: u8) {
    let t = TempDir::new(&format!("counter{vcpus}"));
    let n = usize::from(vcpus);
    let (orig, last, saved, _) = counter_snapshot(&t, vcpus, "");
    let last_seq = last[n];
    let snap = t.join("snap");
    for i in 0..n {
        assert!(
            saved[i] >= last[i],
            "cpu{i}: memory file has {} below the last printed {}",
            saved[i],
            last[i]
        );
    }
    drop(orig);
    let files = fingerprint(&snap);

    let mut clone = Proc::microvm(&["--restore", &snap.display().to_string()]);
    clone.wait_line("three counter lines", |l| {
        parse_counter(l).is_some_and(|c| c.0 >= last_seq + 4)
    });
    let lines = counters(clone.drain(), n);
    assert!(
        !clone
            .seen
            .iter()
            .any(|l| l.contains("microvirt-testguest:")),
        "the restored guest booted again:\n{}",
        clone.seen.join("\n")
    );
    let first = &lines[0];
    assert!(
        first.0 == last_seq + 1 || first.0 == last_seq + 2,
        "the clone's first line has seq {} after {last_seq}: {}",
        first.0,
        clone.context()
    );
    for i in 0..n {
        assert!(
            first.1[i] >= saved[i],
            "cpu{i} restarted: {} < saved {}",
            first.1[i],
            saved[i]
        );
        let end = &lines.last().unwrap().1;
        assert!(end[i] > first.1[i], "cpu{i} does not run after restore");
    }
    drop(clone);
    assert_eq!(fingerprint(&snap), files, "the snapshot's files changed");
}

#[test]
fn restore_continues_the_counter_with_1_vcpu() {
    counter_continues(1);
}

#[test]
fn restore_continues_the_counters_of_4_vcpus() {
    counter_continues(4);
}

/// Restored paused, the guest waits for `resume`; a snapshot of the restored VM restores
/// again (the memory of a restored VM lives in the old file plus its own pages), and the
/// guest's clocks advance by the real time between snapshot and restore.
#[test]
fn paused_restore_resume_resnapshot_and_clock_advance() {
    let t = TempDir::new("paused");
    let (orig, last, _, _) = counter_snapshot(&t, 1, "");
    drop(orig);
    let snap = t.join("snap");
    let sock = t.join("clone.sock");
    std::thread::sleep(Duration::from_millis(1500));
    let t0 = Instant::now();
    let mut clone = Proc::microvm(&[
        "--restore",
        &snap.display().to_string(),
        "--paused",
        "--control-socket",
        &sock.display().to_string(),
    ]);
    wait_socket(&sock);
    assert_eq!(control(&sock, json!({"cmd": "state"}))["state"], "paused");
    // Snapshot the restored VM before it ran: its clocks were advanced at restore.
    let snap2 = t.join("snap2");
    snapshot(&sock, &snap2);
    let gap = t0.elapsed();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        counters(clone.drain(), 1).is_empty(),
        "a paused restore ran the guest: {}",
        clone.context()
    );
    let a = control(&sock, json!({"cmd": "resume"}));
    assert_eq!(a["state"], "running", "{a}");
    clone.wait_line("counter after resume", |l| {
        parse_counter(l).is_some_and(|c| c.0 >= last[1] + 3)
    });
    // Snapshot the running clone, restore that: it continues again.
    let snap3 = t.join("snap3");
    snapshot(&sock, &snap3);
    let last3 = counters(clone.drain(), 1).last().unwrap().0;
    drop(clone);
    let mut clone2 = Proc::microvm(&["--restore", &snap3.display().to_string()]);
    clone2.wait_line("counter from the second snapshot", |l| {
        parse_counter(l).is_some_and(|c| c.0 >= last3 + 2)
    });
    let first2 = counters(clone2.drain(), 1)[0].0;
    assert!(
        first2 == last3 + 1 || first2 == last3 + 2,
        "seq {first2} after {last3}"
    );

    // The clock: kvm-clock and the TSC of snap2 are ahead of snap's by about the time that
    // passed between taking snap and restoring it.
    let state = |d: &Path| -> Value {
        let b = std::fs::read(d.join("vmstate")).unwrap();
        let (_, payload) = vmm::snapshot::format::decode(&b).unwrap();
        serde_json::from_slice(payload).unwrap()
    };
    let (s1, s2) = (state(&snap), state(&snap2));
    let realtime_gap =
        s2["vm"]["realtime_ns"].as_u64().unwrap() - s1["vm"]["realtime_ns"].as_u64().unwrap();
    let clock = |s: &Value| -> u64 {
        use base64::Engine;
        let b = base64::engine::general_purpose::STANDARD
            .decode(s["vm"]["clock"].as_str().unwrap())
            .unwrap();
        u64::from_le_bytes(b[..8].try_into().unwrap())
    };
    let clock_gap = clock(&s2).wrapping_sub(clock(&s1));
    assert!(
        (1_500_000_000..31_500_000_000).contains(&realtime_gap),
        "realtime gap {realtime_gap}"
    );
    // kvm-clock stood still while the guest was away except for the advance (and the few
    // milliseconds the paused clone existed before snap2 was read).
    let slack = gap.as_nanos() as u64 + 200_000_000;
    assert!(
        clock_gap + 200_000_000 >= realtime_gap && clock_gap <= realtime_gap + slack,
        "kvm-clock advanced {clock_gap} ns for {realtime_gap} ns of real time"
    );
    let tsc = |s: &Value| -> u64 {
        s["vcpus"][0]["msrs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["index"] == 0x10)
            .map(|m| m["data"].as_u64().unwrap())
            .unwrap()
    };
    let khz = s1["vcpus"][0]["tsc_khz"].as_u64().expect("TSC frequency");
    let tsc_gap_ns = (tsc(&s2) - tsc(&s1)) as u128 * 1_000_000 / u128::from(khz);
    assert!(
        tsc_gap_ns as u64 + 200_000_000 >= realtime_gap,
        "TSC advanced {tsc_gap_ns} ns for {realtime_gap} ns of real time"
    );
}

/// Smaps totals (kB) of the mapping of `file` in process `pid`.
fn smaps_of(pid: u32, file: &Path) -> BTreeMap<String, u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let name = file.display().to_string();
    let mut out = BTreeMap::new();
    let mut inside = false;
    for l in text.lines() {
        let header = l.split_whitespace().next().is_some_and(|f| {
            f.contains('-') && f.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
        });
        if header {
            inside = l.ends_with(&name);
            continue;
        }
        if inside {
            if let Some((k, v)) = l.split_once(':') {
                if let Some(kb) = v.trim().strip_suffix(" kB") {
                    *out.entry(k.to_string()).or_default() += kb.trim().parse::<u64>().unwrap_or(0);
                }
            }
        }
    }
    out
}

/// Ten VMs restored from one snapshot at once run independently, share the memory file's
/// pages (page cache), and never change it.
#[test]
fn ten_clones_from_one_snapshot_share_its_memory_file() {
    let t = TempDir::new("clones");
    const MIB: u64 = 8;
    let (orig, last, _, _) = counter_snapshot(
        &t,
        1,
        &format!("testguest.touch_mib={MIB} testguest.reread=1 testguest.counter_every=200"),
    );
    drop(orig);
    let snap = t.join("snap");
    let mem = snap.join("memory");
    let files = fingerprint(&snap);
    let expected_sum =
        (0..MIB * 256).fold(0u64, |s, p| s.wrapping_add(((16 << 20) + p * 4096) | 1));
    let mut clones: Vec<(Proc, PathBuf)> = (0..10)
        .map(|i| {
            let sock = t.join(format!("c{i}.sock"));
            let p = Proc::microvm(&[
                "--restore",
                &snap.display().to_string(),
                "--control-socket",
                &sock.display().to_string(),
            ]);
            (p, sock)
        })
        .collect();
    for (c, _) in clones.iter_mut() {
        c.wait_line("two lines from the clone", |l| {
            parse_counter(l).is_some_and(|c| c.0 >= last[1] + 3)
        });
        for (seq, _, sum) in counters(&c.seen, 1) {
            assert_eq!(sum, Some(expected_sum), "clone memory differs at seq {seq}");
        }
    }
    // Independent: pausing one leaves the others running.
    let (first, rest) = clones.split_at_mut(1);
    assert_eq!(
        control(&first[0].1, json!({"cmd": "pause"}))["state"],
        "paused"
    );
    let paused_at = counters(first[0].0.drain(), 1).len();
    let others: Vec<u64> = rest
        .iter_mut()
        .map(|(c, _)| counters(c.drain(), 1).last().unwrap().0)
        .collect();
    for ((c, _), seq) in rest.iter_mut().zip(others) {
        c.wait_line("progress while another clone is paused", |l| {
            parse_counter(l).is_some_and(|x| x.0 >= seq + 2)
        });
    }
    assert_eq!(counters(first[0].0.drain(), 1).len(), paused_at);

    // Shared: every clone maps the file; its pages are in each clone's RSS once, but the
    // proportional share counts them once over all ten.
    let mut total_rss = 0;
    let mut total_pss = 0;
    for (c, _) in &clones {
        let m = smaps_of(c.pid(), &mem);
        let rss = m.get("Rss").copied().unwrap_or(0);
        let pss = m.get("Pss").copied().unwrap_or(0);
        let shared = m.get("Shared_Clean").copied().unwrap_or(0);
        eprintln!(
            "clone {}: memory file mapping Rss {rss} kB Pss {pss} kB Shared_Clean {shared} kB",
            c.pid()
        );
        assert!(
            rss >= MIB * 1024,
            "the clone did not read its memory: {m:?}"
        );
        assert!(shared >= MIB * 1024, "pages not shared: {m:?}");
        assert!(
            pss * 3 < rss,
            "PSS {pss} kB not well below RSS {rss} kB: {m:?}"
        );
        total_rss += rss;
        total_pss += pss;
    }
    eprintln!("ten clones: memory file Rss {total_rss} kB, Pss {total_pss} kB in total");
    assert!(total_pss * 4 < total_rss, "Pss {total_pss} Rss {total_rss}");
    drop(clones);
    assert_eq!(fingerprint(&snap), files, "a clone changed the snapshot");
}

/// AF_PACKET responder in `ns` on every interface: answers `microvirt req <i> <t>` with
/// `microvirt ack <i> <t>` on the interface it came in on and records (interface, i, t).
fn stream_responder(
    ns: &ScratchNetns,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<(i32, u64, u64)>> {
    let (ready_tx, ready_rx) = channel();
    let h = ns.spawn(move || {
        // SAFETY: plain socket syscall.
        let s = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(ETH_P.to_be())) };
        assert!(s >= 0);
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 50_000,
        };
        // SAFETY: valid timeval pointer and size.
        unsafe {
            libc::setsockopt(
                s,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as u32,
            )
        };
        ready_tx.send(()).unwrap();
        let mut log = Vec::new();
        let mut buf = [0u8; 2048];
        while !stop.load(Ordering::SeqCst) {
            // SAFETY: zeroed sockaddr_ll is valid; recvfrom fills it.
            let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut flen = std::mem::size_of::<libc::sockaddr_ll>() as u32;
            // SAFETY: buf and from are valid for the given lengths.
            let n = unsafe {
                libc::recvfrom(
                    s,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    0,
                    &mut from as *mut _ as *mut libc::sockaddr,
                    &mut flen,
                )
            };
            if n < 14 || from.sll_pkttype == libc::PACKET_OUTGOING {
                continue;
            }
            let f = &buf[..n as usize];
            let Some(rest) = f[14..].strip_prefix(b"microvirt req ") else {
                continue;
            };
            let text: String = rest
                .iter()
                .take_while(|b| b.is_ascii_digit() || **b == b' ')
                .map(|&b| b as char)
                .collect();
            let mut nums = text.split_whitespace().map(|v| v.parse::<u64>().unwrap());
            let (i, t) = (nums.next().unwrap(), nums.next().unwrap());
            log.push((from.sll_ifindex, i, t));
            let mut reply = Vec::new();
            reply.extend_from_slice(&f[6..12]);
            reply.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x99]);
            reply.extend_from_slice(&ETH_P.to_be_bytes());
            reply.extend_from_slice(format!("microvirt ack {i} {t}").as_bytes());
            reply.resize(60, 0);
            let mut to = from;
            to.sll_protocol = ETH_P.to_be();
            // SAFETY: reply and `to` are valid for their lengths.
            unsafe {
                libc::sendto(
                    s,
                    reply.as_ptr().cast(),
                    reply.len(),
                    0,
                    &to as *const _ as *const libc::sockaddr,
                    std::mem::size_of::<libc::sockaddr_ll>() as u32,
                )
            };
        }
        // SAFETY: closing our socket.
        unsafe { libc::close(s) };
        log
    });
    ready_rx.recv_timeout(WAIT).expect("responder ready");
    h
}

fn ifindex(ns: &ScratchNetns, name: &str) -> i32 {
    let out = Command::new("ip")
        .args(["-n", ns.name(), "-o", "link", "show", name])
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    s.split(':').next().unwrap().trim().parse().unwrap()
}

fn in_netns(ns: &ScratchNetns, args: &[&str]) -> Proc {
    let mut c = ns.command(MICROVM);
    c.args(args);
    Proc::spawn(c)
}

/// A disk under writes and a NIC under traffic across snapshot and restore (onto another
/// TAP and another overlay): every request completes exactly once.
#[test]
fn disk_writes_and_network_traffic_survive_restore_exactly_once() {
    let id = std::process::id() % 100_000;
    let t = TempDir::new("stream");
    let ns = ScratchNetns::new("snap-stream");
    let (tap_a, tap_b) = (format!("mvsa{id}"), format!("mvsb{id}"));
    for tap in [&tap_a, &tap_b] {
        ns.ip(&["tuntap", "add", "dev", tap, "mode", "tap", "vnet_hdr"]);
        ns.ip(&["link", "set", tap, "up"]);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let responder = stream_responder(&ns, stop.clone());
    let base = t.join("base.img");
    std::fs::write(&base, vec![0u8; 1 << 20]).unwrap();
    let base_before = fingerprint(t.path())["base.img"];
    const K: u64 = 300;
    let kernel = guest().pvh.display().to_string();
    let sock = t.join("orig.sock");
    let cmdline = format!("testguest.scenario=stream testguest.stream_count={K}");
    let mut orig = in_netns(
        &ns,
        &[
            "--kernel",
            &kernel,
            "--disk",
            &format!(
                "path={},overlay={}",
                base.display(),
                t.join("o1.ovl").display()
            ),
            "--net",
            &format!("tap={tap_a},mac=52:54:00:00:00:07"),
            "--cmdline",
            &cmdline,
            "--control-socket",
            &sock.display().to_string(),
        ],
    );
    orig.wait_line("stream start", |l| {
        l.starts_with("stream: start count=300 blk=1 net=1")
    });
    orig.wait_line("stream progress", |l| l == "stream: 100");
    let snap = t.join("snap");
    let a = snapshot(&sock, &snap);
    assert!(a["overlayBytes"].as_u64().unwrap() > 0, "{a}");
    assert!(snap.join("disk0.overlay").is_file());
    drop(orig);
    let mut clone = in_netns(
        &ns,
        &[
            "--restore",
            &snap.display().to_string(),
            "--disk",
            &format!(
                "path={},overlay={}",
                base.display(),
                t.join("o2.ovl").display()
            ),
            "--net",
            &format!("tap={tap_b}"),
        ],
    );
    let done = clone.wait_line("the stream's end", |l| l.starts_with("stream: done"));
    eprintln!("clone: {done}");
    let st = clone.wait_exit(WAIT);
    stop.store(true, Ordering::SeqCst);
    let log = responder.join().unwrap();
    assert!(st.success(), "clone failed: {}", clone.context());
    assert!(
        done.starts_with(&format!("stream: done {K} blk=ok net=ok "))
            && done.contains(" dup_rx=0 "),
        "{}",
        clone.context()
    );
    assert!(
        !clone.seen.iter().any(|l| l.starts_with("stream: start")),
        "the clone started over: {}",
        clone.context()
    );
    // Every request reached the network, no transmission twice.
    let mut seen = BTreeSet::new();
    for &(_, i, t) in &log {
        assert!(seen.insert((i, t)), "request {i} try {t} transmitted twice");
    }
    let numbers: BTreeSet<u64> = log.iter().map(|e| e.1).collect();
    assert_eq!(numbers, (0..K).collect(), "requests missing on the wire");
    // Before the snapshot on the original's TAP, afterwards on the clone's.
    let (ia, ib) = (ifindex(&ns, &tap_a), ifindex(&ns, &tap_b));
    let max_a = log.iter().filter(|e| e.0 == ia).map(|e| e.1).max().unwrap();
    let min_b = log.iter().filter(|e| e.0 == ib).map(|e| e.1).min().unwrap();
    assert!(
        max_a >= 100 && min_b <= max_a + 1 && min_b >= max_a,
        "tapA up to {max_a}, tapB from {min_b}"
    );
    assert_eq!(
        fingerprint(t.path())["base.img"],
        base_before,
        "the base image changed"
    );
    for tap in [&tap_a, &tap_b] {
        let _ = Command::new("ip")
            .args(["-n", ns.name(), "link", "del", tap])
            .status();
    }
}

/// A disk request still in flight when a snapshot is asked for (its write blocked: the
/// overlay's file system is frozen): the snapshot waits for it to complete, and the restored
/// guest sees every request completed exactly once.
#[test]
fn a_disk_request_in_flight_at_snapshot_time_completes_exactly_once() {
    let t = TempDir::new("inflight");
    let img = ext4_image(&t, "ovl.ext4", &[]);
    let mnt = t.join("mnt");
    let base = t.join("base.img");
    std::fs::write(&base, vec![0u8; 4 << 20]).unwrap();
    const K: u64 = 4000;
    let kernel = guest().pvh.display().to_string();
    let sock = t.join("orig.sock");
    // The guest waits for its requests (it may take a minute; the snapshot sits in between).
    let cmdline = format!(
        "testguest.scenario=stream testguest.stream_count={K} testguest.blk_timeout_ms=60000"
    );
    let mut orig = microvm_with_mount(
        &img,
        &mnt,
        &[
            "--kernel",
            &kernel,
            "--disk",
            &format!(
                "path={},overlay={}",
                base.display(),
                mnt.join("o1.ovl").display()
            ),
            "--cmdline",
            &cmdline,
            "--control-socket",
            &sock.display().to_string(),
        ],
        false,
    );
    orig.wait_line("stream progress", |l| l == "stream: 50");
    let mut frozen = Frozen::freeze(orig.pid(), &mnt);
    // The guest's next write is stuck in the disk's I/O thread.
    wait_thread_state(orig.pid(), "blk-io0", 'D');
    let snap = t.join("snap");
    let (tx, rx) = channel();
    let (s, d) = (sock.clone(), snap.clone());
    let taker = std::thread::spawn(move || {
        let a = control(
            &s,
            json!({"cmd": "snapshot", "dir": d.display().to_string()}),
        );
        let _ = tx.send(());
        a
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(500)).is_err(),
        "the snapshot was written while a request was in flight"
    );
    frozen.thaw();
    let a = taker.join().unwrap();
    assert_eq!(a["ok"], true, "snapshot failed: {a}");
    let at = orig
        .drain()
        .iter()
        .rev()
        .find_map(|l| {
            l.strip_prefix("stream: ")
                .and_then(|n| n.parse::<u64>().ok())
        })
        .unwrap();
    assert!(at < K, "the stream ended before the snapshot");
    drop(orig);
    let mut clone = Proc::microvm(&[
        "--restore",
        &snap.display().to_string(),
        "--disk",
        &format!(
            "path={},overlay={}",
            base.display(),
            t.join("o2.ovl").display()
        ),
    ]);
    let done = clone.wait_line("the stream's end", |l| l.starts_with("stream: done"));
    assert!(clone.wait_exit(WAIT).success(), "{}", clone.context());
    assert!(
        done.starts_with(&format!("stream: done {K} blk=ok net=none")),
        "{}",
        clone.context()
    );
    assert!(
        !clone.seen.iter().any(|l| l.starts_with("stream: start")),
        "the clone started over: {}",
        clone.context()
    );
}

/// A guest using virtio-rng across snapshot and restore: the restored device goes on
/// answering (its queue positions and negotiated state come back).
#[test]
fn rng_works_after_restore() {
    let t = TempDir::new("rng");
    let kernel = guest().pvh.display().to_string();
    let sock = t.join("orig.sock");
    let mut orig = Proc::microvm(&[
        "--kernel",
        &kernel,
        "--rng",
        "--cmdline",
        "testguest.scenario=rng testguest.rng_wait=1",
        "--control-socket",
        &sock.display().to_string(),
    ]);
    orig.wait_line("rng waiting", |l| l == "rng: waiting");
    assert!(orig.seen.iter().any(|l| l == "rng: after-mistake len=64"));
    let snap = t.join("snap");
    snapshot(&sock, &snap);
    drop(orig);
    let mut c = Command::new(MICROVM);
    c.args(["--restore", &snap.display().to_string()]);
    let mut clone = Proc::spawn_with_input(c);
    clone.send("go\n");
    let l = clone.wait_line("a read after restore", |l| l.starts_with("rng: after-wait"));
    assert_eq!(l, "rng: after-wait len=64 differ=1", "{}", clone.context());
    clone.wait_line("the end", |l| l == "rng: end");
    assert!(clone.wait_exit(WAIT).success(), "{}", clone.context());
}

#[test]
fn a_restored_acpi_vm_has_its_power_button_and_powers_off() {
    let t = TempDir::new("acpi");
    let kernel = guest().pvh.display().to_string();
    let sock = t.join("orig.sock");
    let mut orig = Proc::microvm(&[
        "--kernel",
        &kernel,
        "--vcpus",
        "2",
        "--cmdline",
        "testguest.scenario=acpi testguest.acpi_button=1",
        "--control-socket",
        &sock.display().to_string(),
    ]);
    orig.wait_line("the wait for the button", |l| {
        l == "acpi: waiting for the power button"
    });
    let snap = t.join("snap");
    snapshot(&sock, &snap);
    drop(orig);
    let state = std::fs::read(snap.join(vmm::snapshot::STATE_FILE)).unwrap();
    let text = String::from_utf8_lossy(&state);
    assert!(text.contains("\"acpi\":true"), "machine.acpi not saved");
    let sock2 = t.join("clone.sock");
    let mut clone = Proc::microvm(&[
        "--restore",
        &snap.display().to_string(),
        "--control-socket",
        &sock2.display().to_string(),
    ]);
    wait_socket(&sock2);
    let a = control(&sock2, json!({"cmd": "power-button"}));
    assert_eq!(a["ok"], true, "{a}");
    clone.wait_line("the button", |l| l == "acpi: power button pressed");
    assert!(clone.wait_exit(WAIT).success(), "{}", clone.context());
    assert!(
        clone.context().contains("guest powered off; VM stopped"),
        "{}",
        clone.context()
    );
}

/// The hex ID in a `vmgenid:` line (`... id=<32 hex digits>`).
fn genid_of(line: &str) -> String {
    let id = line
        .split(' ')
        .find_map(|w| w.strip_prefix("id="))
        .unwrap_or_else(|| panic!("no id in {line:?}"));
    assert_eq!(id.len(), 32, "{line}");
    assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{line}");
    id.to_string()
}

/// The guest finds `\_SB.VGEN` in the DSDT and reads its generation ID (random at boot, in
/// memory the e820 map reserves); every restore of one snapshot writes a new ID before the
/// guest runs and notifies it through the GED (event bit and interrupt); two clones and the
/// original see three different IDs, and the snapshot's memory file keeps the original's.
#[test]
fn every_restore_gives_the_guest_a_new_vm_generation_id() {
    let t = TempDir::new("vmgenid");
    let kernel = guest().pvh.display().to_string();
    let sock = t.join("orig.sock");
    let mut orig = Proc::microvm(&[
        "--kernel",
        &kernel,
        "--cmdline",
        "testguest.scenario=vmgenid",
        "--control-socket",
        &sock.display().to_string(),
    ]);
    let dev = orig.wait_line("the device", |l| l.starts_with("vmgenid: device="));
    assert_eq!(
        dev,
        format!(
            "vmgenid: device=VGEN hid=1 cid=1 addr={:#x} ram=0",
            vmm::arch::x86_64::layout::VMGENID_ADDR
        ),
        "{}",
        orig.context()
    );
    let first = genid_of(&orig.wait_line("the ID", |l| l.starts_with("vmgenid: id=")));
    assert_ne!(first, "0".repeat(32), "{}", orig.context());
    orig.wait_line("the wait", |l| l == "vmgenid: waiting for a change");
    let snap = t.join("snap");
    snapshot(&sock, &snap);
    drop(orig);
    let saved = {
        use std::os::unix::fs::FileExt;
        let mut b = [0u8; 16];
        File::open(snap.join("memory"))
            .unwrap()
            .read_exact_at(&mut b, vmm::arch::x86_64::layout::VMGENID_ADDR)
            .unwrap();
        b.iter().map(|x| format!("{x:02x}")).collect::<String>()
    };
    assert_eq!(saved, first, "the memory file holds the original's ID");
    let files = fingerprint(&snap);

    let mut seen = vec![first.clone()];
    for _ in 0..2 {
        let mut clone = Proc::microvm(&["--restore", &snap.display().to_string()]);
        let l = clone.wait_line("the notification", |l| l.starts_with("vmgenid: notified "));
        assert!(
            l.starts_with("vmgenid: notified n=1 irq=1 id="),
            "{l}: {}",
            clone.context()
        );
        let id = genid_of(&l);
        assert!(!seen.contains(&id), "{id} seen before: {seen:?}");
        seen.push(id);
        drop(clone);
    }
    assert_eq!(fingerprint(&snap), files, "the snapshot's files changed");
}
