//! Disks from volumes: container-disk overlays, PVC files and block devices, empty disks, qcow2,
//! the rng device, and volume names that are refused.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use microvirt_testsupport::TempDir;

use crate::harness::{demo_vmi, pod_document, run_cmd, Launcher, LoopDevice, Pod, BIN};

/// The test guest's blk pattern: 64-bit word `w` of sector `s`.
fn pattern(s: u64, w: u64) -> u64 {
    0x6d76_0000_0000_0000 ^ (s << 32) ^ (w << 8) ^ s.wrapping_mul(0x9e37_79b9)
}

fn word(img: &[u8], sector: u64, w: u64) -> u64 {
    let off = (sector * 512 + w * 8) as usize;
    u64::from_le_bytes(img[off..off + 8].try_into().unwrap())
}

fn blk_vmi(dir: &Path, name: &str) -> PathBuf {
    demo_vmi(
        dir,
        name,
        "testguest.scenario=blk",
        "    devices:\n      disks:\n        - {name: root, serial: root-disk}\n        - {name: data}\n        - {name: scratch}\n        - {name: seed}\n  volumes:\n    - {name: root, containerDisk: {image: local, path: base.img}}\n    - {name: data, persistentVolumeClaim: {claimName: pvc}}\n    - {name: scratch, emptyDisk: {capacity: 3Mi}}\n    - {name: seed, cloudInitNoCloud: {userData: \"#cloud-config\"}}\n",
    )
}

#[test]
fn disks_from_volumes_overlay_isolation_pvc_persistence_empty_disk() {
    let t = TempDir::new("disks");
    let base = t.path().join("base.img");
    let base_bytes: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 253) as u8).collect();
    std::fs::write(&base, &base_bytes).unwrap();
    std::fs::create_dir_all(t.path().join("pvc")).unwrap();
    let pvc = t.path().join("pvc/disk.img");
    std::fs::write(&pvc, vec![0u8; 2 << 20]).unwrap();
    let vmi = blk_vmi(t.path(), "disks");

    // Two launchers at once on one containerDisk image, each with its own runtime directory.
    // The PVC is used by the first only (a second writer would be refused by the lock), so
    // the second VMI names a PVC of its own.
    std::fs::create_dir_all(t.path().join("pvc2")).unwrap();
    std::fs::write(t.path().join("pvc2/disk.img"), vec![0u8; 1 << 20]).unwrap();
    let vmi2 = t.path().join("disks2.yaml");
    std::fs::write(
        &vmi2,
        std::fs::read_to_string(&vmi)
            .unwrap()
            .replace("claimName: pvc}", "claimName: pvc2}")
            .replace("name: disks}", "name: disks2}"),
    )
    .unwrap();
    let rt1 = t.path().join("rt1");
    let rt2 = t.path().join("rt2");
    let mut a = Launcher::spawn(&mut run_cmd(
        &vmi,
        &["--runtime-dir", rt1.to_str().unwrap()],
    ));
    let mut b = Launcher::spawn(&mut run_cmd(
        &vmi2,
        &["--runtime-dir", rt2.to_str().unwrap()],
    ));
    for l in [&mut a, &mut b] {
        let (st, _) = l.wait(Duration::from_secs(30));
        assert_eq!(
            st.code(),
            Some(0),
            "stdout:\n{}\nstderr:\n{}",
            l.stdout(),
            l.stderr()
        );
        let out = l.stdout();
        // Order = spec order: vda root (serial), vdb data, vdc scratch (3 MiB), vdd seed (ro).
        for line in [
            "blk0: capacity=2048 ro=0 id=root-disk",
            "blk0: write-flush-read ok",
            "blk1: write-flush-read ok",
            "blk2: capacity=6144 ro=0 id=",
            "blk2: write-flush-read ok",
            "blk3: ro-write status=1",
        ] {
            assert!(out.contains(line), "missing {line:?}:\n{out}");
        }
        assert!(
            out.contains("blk3: capacity=") && out.contains(" ro=1 "),
            "{out}"
        );
    }
    // The image is untouched; each VMI's writes are in its own overlay.
    assert_eq!(std::fs::read(&base).unwrap(), base_bytes);
    for rt in [&rt1, &rt2] {
        let ov = std::fs::read(rt.join("root.overlay")).unwrap();
        assert_eq!(&ov[..8], b"MVOVRLY1");
    }
    // The PVC kept the guest's writes (sectors 1..=8 hold the pattern).
    let img = std::fs::read(&pvc).unwrap();
    for s in 1..=8 {
        assert_eq!(word(&img, s, 0), pattern(s, 0), "sector {s}");
        assert_eq!(word(&img, s, 63), pattern(s, 63), "sector {s}");
    }
    // A second run of the same VMI starts from a fresh overlay (stateless containerDisk)
    // while the PVC still holds the data of the first run.
    std::fs::write(rt1.join("root.overlay"), b"stale, must be replaced").unwrap();
    let mut c = Launcher::spawn(&mut run_cmd(
        &vmi,
        &["--runtime-dir", rt1.to_str().unwrap()],
    ));
    let (st, _) = c.wait(Duration::from_secs(30));
    assert_eq!(st.code(), Some(0), "{}", c.stderr());
    assert_eq!(
        &std::fs::read(rt1.join("root.overlay")).unwrap()[..8],
        b"MVOVRLY1"
    );
    assert_eq!(std::fs::read(&pvc).unwrap(), img);
}

/// A qcow2 containerDisk (zlib-compressed clusters, made by Debian's qemu-img) under the
/// launcher's seccomp filters: the guest reads the raw source's first 4 KiB, sees the virtual
/// size and writes to the overlay; a second disk reads the same image read-only.
#[test]
fn a_qcow2_container_disk_under_the_filters() {
    let t = TempDir::new("qcow2");
    let raw = t.path().join("src.raw");
    let data: Vec<u8> = (0..(3usize << 20))
        .map(|i| {
            if (i >> 16) % 3 == 2 {
                0
            } else {
                (i / 5 % 241) as u8
            }
        })
        .collect();
    std::fs::write(&raw, &data).unwrap();
    let img = t.path().join("cloud.qcow2");
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
    let before = std::fs::read(&img).unwrap();
    let vmi = demo_vmi(
        t.path(),
        "qcow2",
        "testguest.scenario=blk",
        "    devices:\n      disks:\n        - {name: root}\n        - {name: copy, disk: {readonly: true}}\n  volumes:\n    - {name: root, containerDisk: {image: local, path: cloud.qcow2}}\n    - {name: copy, containerDisk: {image: local, path: cloud.qcow2}}\n",
    );
    let mut l = Launcher::spawn(&mut run_cmd(&vmi, &[]));
    let (st, _) = l.wait(Duration::from_secs(30));
    assert_eq!(st.code(), Some(0), "{}\n{}", l.stdout(), l.stderr());
    let out = l.stdout();
    let fnv = data[..4096].iter().fold(0x811c_9dc5u32, |h, &x| {
        (h ^ u32::from(x)).wrapping_mul(0x0100_0193)
    });
    let sectors = data.len() / 512;
    for line in [
        format!("blk0: capacity={sectors} ro=0 id="),
        format!("blk0: head status=0 fnv1a={fnv:08x}"),
        "blk0: write-flush-read ok".to_string(),
        format!("blk1: capacity={sectors} ro=1 id="),
        format!("blk1: head status=0 fnv1a={fnv:08x}"),
        "blk1: ro-write status=1".to_string(),
    ] {
        assert!(out.contains(&line), "missing {line:?}:\n{out}");
    }
    assert!(
        std::fs::read(&img).unwrap() == before,
        "containerDisk image modified"
    );
}

/// A persistentVolumeClaim that is a block device (what a `volumeMode: Block` claim is) has
/// its real size, and `devices.rng: {}` gives the guest entropy.
#[test]
fn a_block_device_pvc_and_rng() {
    let t = TempDir::new("blockpvc");
    let backing = t.path().join("backing.img");
    std::fs::write(&backing, vec![0u8; 2 << 20]).unwrap();
    let lo = LoopDevice::attach(&backing);
    let spec = format!(
        "    devices:\n      rng: {{}}\n      disks:\n        - {{name: data}}\n  volumes:\n    - {{name: data, persistentVolumeClaim: {{claimName: {}}}}}\n",
        lo.0.display()
    );
    let vmi = demo_vmi(t.path(), "blockpvc", "testguest.scenario=blk", &spec);
    let mut l = Launcher::spawn(&mut run_cmd(&vmi, &[]));
    let (st, _) = l.wait(Duration::from_secs(30));
    assert_eq!(st.code(), Some(0), "{}\n{}", l.stdout(), l.stderr());
    let out = l.stdout();
    for line in ["blk0: capacity=4096 ro=0 id=", "blk0: write-flush-read ok"] {
        assert!(out.contains(line), "missing {line:?}:\n{out}");
    }
    drop(lo);
    let img = std::fs::read(&backing).unwrap();
    for s in 1..=8 {
        assert_eq!(word(&img, s, 0), pattern(s, 0), "sector {s}");
    }
    // The same VMI's rng device, read by the guest.
    let vmi = demo_vmi(
        t.path(),
        "rng",
        "testguest.scenario=rng",
        "    devices:\n      rng: {}\n",
    );
    let mut l = Launcher::spawn(&mut run_cmd(&vmi, &[]));
    let (st, _) = l.wait(Duration::from_secs(30));
    assert_eq!(st.code(), Some(0), "{}\n{}", l.stdout(), l.stderr());
    let out = l.stdout();
    assert!(out.contains("rng: read 64 bytes nonzero="), "{out}");
    assert!(out.contains(" differ=1"), "{out}");
    assert!(out.contains("rng: readonly-buffer len=0"), "{out}");
    // Without it, no device.
    let vmi = demo_vmi(t.path(), "norng", "testguest.scenario=rng", "");
    let mut l = Launcher::spawn(&mut run_cmd(&vmi, &[]));
    let (st, _) = l.wait(Duration::from_secs(30));
    assert_eq!(st.code(), Some(0), "{}\n{}", l.stdout(), l.stderr());
    assert!(l.stdout().contains("rng: no device"), "{}", l.stdout());
}

/// Names that become paths: an emptyDisk named `../pvcs/data` would be created as
/// `<root>/empty-disks/../pvcs/data/disk.img`, i.e. truncate the PVC's image. The launcher
/// refuses such names (pod mode and local YAML alike) before touching any file.
#[test]
fn volume_and_disk_names_that_are_not_dns_labels_are_refused() {
    let mut doc: serde_json::Value =
        serde_json::from_str(&pod_document("names", "testguest.scenario=basic", 5)).unwrap();
    doc["spec"]["domain"]["devices"]["disks"] =
        serde_json::json!([{"name": "data"}, {"name": "../pvcs/data"}]);
    doc["spec"]["volumes"] = serde_json::json!([
        {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
        {"name": "../pvcs/data", "emptyDisk": {"capacity": "1Mi"}}
    ]);
    let pod = Pod::new("names", &doc.to_string());
    let img = pod.root().join("pvcs/data/disk.img");
    std::fs::create_dir_all(img.parent().unwrap()).unwrap();
    let content = vec![0x5au8; 8 << 20];
    std::fs::write(&img, &content).unwrap();
    let out = pod.cmd(&["pod"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let msg = std::fs::read_to_string(pod.term_log()).unwrap();
    assert!(
        msg.starts_with("invalid VMI document: ")
            && msg
                .contains("spec.domain.devices.disks[1].name \"../pvcs/data\" must be a DNS label"),
        "{msg}"
    );
    assert!(msg.contains("reason=InvalidVMI\n"), "{msg}");
    assert_eq!(
        std::fs::read(&img).unwrap(),
        content,
        "the PVC image is untouched"
    );

    // Local YAML: the same check, for every path-bearing name.
    let t = TempDir::new("names-run");
    for (what, extra) in [
        (
            "spec.volumes[0].name",
            "    devices: {disks: []}\n  volumes: [{name: ../x, emptyDisk: {capacity: 1Mi}}]\n",
        ),
        (
            "spec.domain.devices.disks[0].name",
            "    devices: {disks: [{name: Root}]}\n  volumes: [{name: root, emptyDisk: {capacity: 1Mi}}]\n",
        ),
    ] {
        let vmi = demo_vmi(t.path(), "names", "", extra);
        let out = Command::new(BIN).arg("run").arg(&vmi).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{what}: {err}");
        assert!(err.contains(what) && err.contains("must be a DNS label"), "{what}: {err}");
    }
    let vmi = t.path().join("badname.yaml");
    std::fs::write(&vmi, "metadata: {name: ../../etc}\n").unwrap();
    let out = Command::new(BIN).arg("run").arg(&vmi).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("metadata.name") && err.contains("DNS subdomain"),
        "{err}"
    );
}
