//! The test guest's virtio drivers against `microvm --disk/--net` on
//! /dev/kvm: real image files (read-write, read-only, copy-on-write overlay)
//! and a real TAP inside a network namespace this test creates, with an
//! AF_PACKET responder there. Asserts the guest's console lines and the
//! files on the host.

mod common;
mod virtio_common;

use common::*;
use std::fs;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use virtio_common::{responder, ScratchNetns};

fn lines_with<'a>(r: &'a Run, prefix: &str) -> Vec<&'a str> {
    r.stdout.lines().filter(|l| l.starts_with(prefix)).collect()
}

fn has(r: &Run, line: &str) {
    assert!(
        r.stdout.lines().any(|l| l.trim() == line),
        "no line {line:?} in:\n{}\nstderr:\n{}",
        r.stdout,
        r.stderr
    );
}

#[test]
fn blk_rw_ro_overlay_and_hostile_from_the_guest() {
    let d = TempDir::new("virtio-blk");
    let rw = d.join("rw.img");
    let ro = d.join("ro.img");
    let base = d.join("base.img");
    let ovl = d.join("vm.ovl");
    let _ = fs::remove_file(&ovl);
    fs::write(&rw, vec![0u8; 1 << 20]).unwrap();
    let ro_data: Vec<u8> = (0..(512 * 1024)).map(|i| (i % 251) as u8).collect();
    fs::write(&ro, &ro_data).unwrap();
    let base_data: Vec<u8> = (0..(2 << 20)).map(|i| (i / 512) as u8).collect();
    fs::write(&base, &base_data).unwrap();

    let kernel = guest().pvh.to_str().unwrap().to_string();
    let disk_rw = format!("path={},id=disk-rw-01", rw.display());
    let disk_ro = format!("path={},ro,id=disk-ro-02", ro.display());
    let disk_ovl = format!(
        "path={},overlay={},id=disk-ovl-03",
        base.display(),
        ovl.display()
    );
    let r = run(
        &[
            "--kernel",
            &kernel,
            "--disk",
            &disk_rw,
            "--disk",
            &disk_ro,
            "--disk",
            &disk_ovl,
            "--cmdline",
            "testguest.scenario=blk",
        ],
        b"",
    );
    r.assert_ok();
    has(&r, "blk0: capacity=2048 ro=0 id=disk-rw-01");
    has(&r, "blk0: write-flush-read ok");
    has(&r, "blk1: capacity=1024 ro=1 id=disk-ro-02");
    has(&r, "blk1: ro-write status=1");
    has(&r, "blk2: capacity=4096 ro=0 id=disk-ovl-03");
    has(&r, "blk2: write-flush-read ok");
    // A read into 0xff_0000_0000 (outside guest memory): IOERR, and the
    // device (and the VMM) keep working.
    for i in 0..3 {
        has(&r, &format!("blk{i}: hostile status=1"));
        let regs = lines_with(&r, &format!("blk{i}: registers after hostile:"));
        assert_eq!(regs.len(), 1, "{}", r.stdout);
        assert!(regs[0].contains("magic=74726976"), "{}", regs[0]);
    }
    // Host side: the rw image got the guest's sectors 1..8, nothing else.
    let rw_after = fs::read(&rw).unwrap();
    assert!(rw_after[..512].iter().all(|&b| b == 0));
    assert!(
        rw_after[512..9 * 512].iter().any(|&b| b != 0),
        "guest data not on disk"
    );
    assert!(rw_after[9 * 512..].iter().all(|&b| b == 0));
    // The read-only image and the overlay's base are byte-identical.
    assert_eq!(fs::read(&ro).unwrap(), ro_data, "read-only image modified");
    assert_eq!(fs::read(&base).unwrap(), base_data, "overlay base modified");
    assert!(
        fs::metadata(&ovl).unwrap().len() > 0,
        "overlay file created"
    );
    // (Isolation of two VMs' overlays on one base: virtio_kvm.rs.) `d` goes with its files.
}

/// FNV-1a (32 bits), as the test guest prints it for a disk's first 4 KiB.
fn fnv1a(b: &[u8]) -> u32 {
    b.iter().fold(0x811c_9dc5u32, |h, &x| {
        (h ^ u32::from(x)).wrapping_mul(0x0100_0193)
    })
}

/// A qcow2 image (zlib-compressed, made by Debian's qemu-img) as an overlay's base and as a
/// read-only disk: the guest reads the raw source's bytes and sees the virtual size; its
/// writes land in the overlay, the qcow2 file is untouched.
#[test]
fn blk_qcow2_base_under_an_overlay_and_read_only_from_the_guest() {
    let d = TempDir::new("virtio-blk-qcow2");
    let raw = d.join("src.raw");
    let img = d.join("base.qcow2");
    let ovl = d.join("vm.ovl");
    let _ = fs::remove_file(&ovl);
    // 2 MiB + 512: compressible text with holes (so some clusters are compressed, some absent).
    let data: Vec<u8> = (0..(2 << 20) + 512)
        .map(|i: usize| {
            if (i / 65536) % 3 == 2 {
                0
            } else {
                (i / 7 % 251) as u8
            }
        })
        .collect();
    fs::write(&raw, &data).unwrap();
    let out = Command::new("qemu-img")
        .args(["convert", "-q", "-c", "-f", "raw", "-O", "qcow2"])
        .arg(&raw)
        .arg(&img)
        .output()
        .expect("qemu-img (Debian qemu-utils; `cargo xtask test` installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = fs::read(&img).unwrap();
    let kernel = guest().pvh.to_str().unwrap().to_string();
    let disk_ovl = format!("path={},overlay={},id=q-ovl", img.display(), ovl.display());
    let disk_ro = format!("path={},ro,id=q-ro", img.display());
    let r = run(
        &[
            "--kernel",
            &kernel,
            "--disk",
            &disk_ovl,
            "--disk",
            &disk_ro,
            "--cmdline",
            "testguest.scenario=blk",
        ],
        b"",
    );
    r.assert_ok();
    let sectors = data.len() / 512;
    let head = format!("head status=0 fnv1a={:08x}", fnv1a(&data[..4096]));
    has(&r, &format!("blk0: capacity={sectors} ro=0 id=q-ovl"));
    has(&r, &format!("blk0: {head}"));
    has(&r, "blk0: write-flush-read ok");
    has(&r, &format!("blk1: capacity={sectors} ro=1 id=q-ro"));
    has(&r, &format!("blk1: {head}"));
    has(&r, "blk1: ro-write status=1");
    for i in 0..2 {
        has(&r, &format!("blk{i}: hostile status=1"));
    }
    assert!(fs::read(&img).unwrap() == before, "qcow2 base modified");
    // The guest's sectors 1..=8 are in the overlay, the rest is the base's.
    let mut o = vmm::devices::virtio::block::overlay::Overlay::open(&img, &ovl).unwrap();
    let mut back = vec![0u8; 16384];
    vmm::devices::virtio::block::disk::read_into(&mut o, 0, &mut back).unwrap();
    assert!(back[..512] == data[..512]);
    assert!(
        back[512..9 * 512] != data[512..9 * 512],
        "guest writes not in the overlay"
    );
    assert!(back[9 * 512..] == data[9 * 512..16384]);
}

/// `microvm` inside the namespace (so the TAP it creates lives there).
#[test]
fn rng_entropy_for_the_guest_and_no_panic_on_a_driver_mistake() {
    let kernel = guest().pvh.to_str().unwrap().to_string();
    let r = run(
        &[
            "--kernel",
            &kernel,
            "--rng",
            "--cmdline",
            "testguest.scenario=rng",
        ],
        b"",
    );
    r.assert_ok();
    let read = r.line("rng: read ");
    let nonzero: u32 = read
        .strip_prefix("64 bytes nonzero=")
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{read}"));
    // 64 random bytes: the chance that more than 8 are zero is below 1e-9.
    assert!(nonzero >= 56, "{read}");
    assert!(read.ends_with(" differ=1"), "{read}");
    has(&r, "rng: readonly-buffer len=0");
    has(&r, "rng: after-mistake len=64");
    has(&r, "rng: end");
    // The device sits after the disks and NICs and appears on the command line.
    assert!(
        r.line("cmdline: ")
            .contains("virtio_mmio.device=4K@0xc0001000:5"),
        "{}",
        r.stdout
    );
    // Without --rng there is no device.
    let r = run(
        &["--kernel", &kernel, "--cmdline", "testguest.scenario=rng"],
        b"",
    );
    r.assert_ok();
    has(&r, "rng: no device");
}

fn spawn_in_netns(ns: &ScratchNetns, args: &[&str]) -> std::process::Child {
    ns.command(env!("CARGO_BIN_EXE_microvm"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn microvm in the netns")
}

fn wait_for_link(ns: &ScratchNetns, tap: &str) {
    let t = Instant::now();
    loop {
        let ok = Command::new("ip")
            .args(["-n", ns.name(), "link", "show", tap])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success();
        if ok {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "TAP {tap} never appeared"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn net_ping_pong_and_many_frames_in_order_from_the_guest() {
    let id = std::process::id() % 100_000;
    let ns = ScratchNetns::new("virtio-guest");
    let tap = format!("mvgtap{id}");
    let kernel = guest().pvh.to_str().unwrap().to_string();
    let net = format!("tap={tap},mac=52:54:00:12:34:56");
    const K: u32 = 100;
    let cmdline = format!("testguest.scenario=net testguest.net_count={K}");
    let child = spawn_in_netns(
        &ns,
        &["--kernel", &kernel, "--net", &net, "--cmdline", &cmdline],
    );
    wait_for_link(&ns, &tap);
    ns.ip(&["link", "set", &tap, "up"]);
    let stop = Arc::new(AtomicBool::new(false));
    let resp = responder(&ns, &tap, stop.clone());
    let r = finish(child, Duration::from_secs(60));
    stop.store(true, Ordering::SeqCst);
    let answered = resp.join().unwrap();
    r.assert_ok();
    has(&r, "net: mac=52:54:00:12:34:56 tx/rx ok");
    has(&r, &format!("net: received {K} in order"));
    assert!(answered > K, "responder answered {answered}");
}
