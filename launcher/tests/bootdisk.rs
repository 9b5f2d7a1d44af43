//! `virt-launcher run` of KubeVirt-style VMIs whose only disk is a partitioned cloud-style
//! image, on this machine's /dev/kvm: the launcher finds the kernel, initrd and command line
//! the image's boot configuration (GRUB, BLS, extlinux) names and boots them directly. The
//! "kernel" is the test guest's bzImage placed in the image as `/boot/vmlinuz-…`; the test
//! guest prints the command line it got and the size and byte sum of its initrd.
//!
//! The images are built here, per test, in a temporary directory: `mkfs.ext4 -d` (e2fsprogs),
//! `sfdisk` (GPT and MBR), `qemu-img convert -O qcow2 -c` (packages installed when missing).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use microvirt_testsupport::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_virt-launcher");
/// The test guest as a bzImage (launcher/build.rs).
const BZIMAGE: &str = concat!(env!("OUT_DIR"), "/testguest-bzImage");

const FS_UUID: &str = "0b9e3c1a-5d2f-4e8b-9a61-7c3d2e1f0a11";
const BOOT_FS_UUID: &str = "6f1d2c3b-4a59-4877-8695-a4b3c2d1e0f9";
const PART_UUID: &str = "a1b2c3d4-e5f6-4711-8899-aabbccddeeff";
const MBR_ID: &str = "0x1234abcd";
const KERNEL_NAME: &str = "vmlinuz-6.1.0-99-cloud-amd64";
const INITRD_NAME: &str = "initrd.img-6.1.0-99-cloud-amd64";

fn tools() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        microvirt_testhost::cmd::ensure_packages(&["fdisk", "e2fsprogs", "qemu-utils"])
            .expect("installing fdisk, e2fsprogs and qemu-utils");
    });
}

fn run(cmd: &mut Command) {
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The initrd: 64 KiB and 5 bytes of a fixed pseudo-random pattern (not a multiple of 4, so the
/// launcher's padding shows).
fn initrd_bytes() -> Vec<u8> {
    let mut x: u32 = 0x1234_5678;
    (0..65541)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// The test guest's `initrd:` line for the initrd it should get (padded to 4 bytes).
fn initrd_line(parts: &[&[u8]]) -> String {
    let len: usize = parts.iter().map(|p| p.len().next_multiple_of(4)).sum();
    let sum = parts
        .iter()
        .flat_map(|p| p.iter())
        .fold(0u32, |s, b| s.wrapping_add(u32::from(*b)));
    format!("initrd: {len} bytes sum={sum:08x}")
}

/// An ext4 image of `mib` MiB at `img` holding `files` (path, contents) and the directories
/// they need, with file system UUID `uuid`.
fn ext4(dir: &Path, img: &Path, mib: u64, uuid: &str, files: &[(&str, &[u8])]) {
    let root = dir.join(format!("{}.d", img.file_name().unwrap().to_string_lossy()));
    std::fs::create_dir_all(&root).unwrap();
    for (p, data) in files {
        let f = root.join(p.trim_start_matches('/'));
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(&f, data).unwrap();
    }
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-U", uuid, "-d"])
        .arg(&root)
        .arg(img)
        .arg(format!("{mib}M")));
}

enum Label {
    Gpt,
    Mbr,
}

/// A disk at `disk` with the given partition images, each in its own partition (1 MiB
/// aligned), GPT or MBR. The first GPT partition gets [`PART_UUID`] and the type
/// `root_type` ("L": Linux file system; a GUID for others).
fn partitioned(disk: &Path, label: Label, parts: &[&Path], first_type: &str) {
    let mut script = match label {
        Label::Gpt => "label: gpt\n".to_string(),
        Label::Mbr => format!("label: dos\nlabel-id: {MBR_ID}\n"),
    };
    let mut start = 2048u64;
    for (i, p) in parts.iter().enumerate() {
        let sectors = std::fs::metadata(p).unwrap().len().div_ceil(512);
        let typ = if i == 0 { first_type } else { "L" };
        script.push_str(&format!("start={start}, size={sectors}, type={typ}"));
        if i == 0 && matches!(label, Label::Gpt) {
            script.push_str(&format!(", uuid={PART_UUID}"));
        }
        script.push('\n');
        start += sectors.next_multiple_of(2048);
    }
    let f = std::fs::File::create(disk).unwrap();
    f.set_len((start + 2048) * 512).unwrap();
    drop(f);
    let mut child = Command::new("sfdisk")
        .args(["--quiet", "--no-reread", "--no-tell-kernel"])
        .arg(disk)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "sfdisk: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut start = 2048u64;
    for p in parts {
        run(Command::new("dd")
            .arg(format!("if={}", p.display()))
            .arg(format!("of={}", disk.display()))
            .args(["bs=512", "conv=notrunc,sparse", "status=none"])
            .arg(format!("seek={start}")));
        start += std::fs::metadata(p)
            .unwrap()
            .len()
            .div_ceil(512)
            .next_multiple_of(2048);
    }
}

fn qcow2(raw: &Path) -> PathBuf {
    let q = raw.with_extension("qcow2");
    run(Command::new("qemu-img")
        .args(["convert", "-q", "-O", "qcow2", "-c"])
        .arg(raw)
        .arg(&q));
    q
}

/// A KubeVirt-style VMI: one containerDisk (the image at `disk`), no kernelBoot container;
/// `kernel_args`: the VMI's kernelArgs, if any.
fn vmi(dir: &Path, name: &str, disk: &Path, kernel_args: Option<&str>) -> PathBuf {
    let firmware = match kernel_args {
        Some(a) => format!("    firmware: {{kernelBoot: {{kernelArgs: \"{a}\"}}}}\n"),
        None => String::new(),
    };
    let p = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &p,
        format!(
            "apiVersion: microvirt.io/v1alpha1\nkind: VirtualMachineInstance\n\
             metadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 5\n  domain:\n    \
             memory: {{guest: 32Mi}}\n{firmware}    devices:\n      disks: [{{name: root}}]\n  \
             volumes:\n    - {{name: root, containerDisk: {{image: example/cloud:1, path: {}}}}}\n",
            disk.display()
        ),
    )
    .unwrap();
    p
}

/// The operator's VMI document for the same VMI: its default kernel (the test guest) filled
/// in as a fallback (`defaultKernel`), as `virt-launcher pod` gets it.
fn operator_document(dir: &Path, name: &str, disk: &Path) -> PathBuf {
    let doc = serde_json::json!({
        "apiVersion": "microvirt.io/v1alpha1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "domain": {
                "memory": {"guest": "32Mi"},
                "firmware": {"kernelBoot": {"container": {
                    "image": "microvirt/guest-kernel:dev", "kernelPath": BZIMAGE}}},
                "devices": {"disks": [{"name": "root"}]}
            },
            "volumes": [{"name": "root", "containerDisk": {
                "image": "example/cloud:1", "path": disk}}]
        },
        "defaultKernel": {"kernelArgs": "root=/dev/vda rw testguest.scenario=basic"}
    });
    let p = dir.join(format!("{name}.json"));
    std::fs::write(&p, serde_json::to_vec(&doc).unwrap()).unwrap();
    p
}

struct Run {
    out: Output,
    stdout: String,
    stderr: String,
    termination: String,
}

/// Runs `virt-launcher run` to its end (the test guest resets after printing).
fn launch(vmi: &Path) -> Run {
    let log = vmi.with_extension("termination");
    let out = Command::new(BIN)
        .arg("run")
        .arg(vmi)
        .arg("--termination-log")
        .arg(&log)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    Run {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        termination: std::fs::read_to_string(&log).unwrap_or_default(),
        out,
    }
}

impl Run {
    /// The test guest's `cmdline:` line.
    fn cmdline(&self) -> &str {
        self.stdout
            .lines()
            .find_map(|l| l.strip_prefix("cmdline: "))
            .unwrap_or_else(|| panic!("no command line printed:\n{}\n{}", self.stdout, self.stderr))
    }

    fn booted(&self) {
        assert_eq!(
            self.out.status.code(),
            Some(0),
            "stdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
        assert!(
            self.stdout.contains("microvirt-testguest: entry=linux64"),
            "not the bzImage's 64-bit entry:\n{}",
            self.stdout
        );
    }

    fn failed(&self, reason: &str, first_line_has: &str) {
        assert_eq!(
            self.out.status.code(),
            Some(3),
            "stdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
        assert!(
            self.termination.contains(&format!("\nreason={reason}\n")),
            "{}",
            self.termination
        );
        let first = self.termination.lines().next().unwrap_or("");
        eprintln!("{reason}: {first}");
        assert!(
            first.contains(first_line_has),
            "{first_line_has:?} not in {first:?}"
        );
        assert!(!self.stdout.contains("microvirt-testguest"), "a guest ran");
    }
}

fn kernel() -> Vec<u8> {
    std::fs::read(BZIMAGE).unwrap()
}

/// Debian's layout: GPT, one ext4 root with /boot, GRUB's generated grub.cfg; raw and qcow2.
#[test]
fn grub_on_gpt_raw_and_qcow2_boots_the_image_kernel() {
    tools();
    let t = TempDir::new("grub");
    let initrd = initrd_bytes();
    let grub = format!(
        "set default=\"0\"\n\
         menuentry 'Debian GNU/Linux' --class debian $menuentry_id_option 'gnulinux-simple-{FS_UUID}' {{\n\
         \tinsmod ext2\n\
         \tsearch --no-floppy --fs-uuid --set=root {FS_UUID}\n\
         \tlinux\t/boot/{KERNEL_NAME} root=PARTUUID={PART_UUID} ro console=ttyS0,115200 testguest.scenario=basic from=grub\n\
         \tinitrd\t/boot/{INITRD_NAME}\n}}\n\
         menuentry 'recovery' {{\n\tlinux /boot/{KERNEL_NAME} single\n}}\n"
    );
    let fs = t.path().join("root.ext4");
    ext4(
        t.path(),
        &fs,
        16,
        FS_UUID,
        &[
            (&format!("/boot/{KERNEL_NAME}"), &kernel()),
            (&format!("/boot/{INITRD_NAME}"), &initrd),
            ("/boot/grub/grub.cfg", grub.as_bytes()),
            ("/sbin/init", b"#!/bin/sh\n"),
        ],
    );
    let disk = t.path().join("disk.raw");
    partitioned(&disk, Label::Gpt, &[&fs], "L");
    for (name, image) in [("grub-raw", disk.clone()), ("grub-qcow2", qcow2(&disk))] {
        let r = launch(&vmi(t.path(), name, &image, Some("user.arg=1")));
        r.booted();
        let c = r.cmdline();
        assert!(
            c.ends_with(&format!(
                "root=PARTUUID={PART_UUID} ro console=ttyS0,115200 testguest.scenario=basic from=grub user.arg=1"
            )),
            "{name}: {c}"
        );
        assert!(
            c.starts_with("console=ttyS0 "),
            "the VMM's defaults first: {c}"
        );
        assert!(
            r.stdout.contains(&initrd_line(&[&initrd])),
            "{name}: {}",
            r.stdout
        );
        assert!(
            r.stderr.contains("GRUB default entry \"Debian GNU/Linux\""),
            "{}",
            r.stderr
        );
    }
}

/// Fedora's layout on an MBR disk: a separate /boot partition with BLS entries (paths relative
/// to it), root on partition 2; two entries, the newer version wins; two initrds.
#[test]
fn bls_on_a_separate_boot_partition_of_an_mbr_disk() {
    tools();
    let t = TempDir::new("bls");
    let initrd = initrd_bytes();
    let early = b"early-microcode-archive".to_vec();
    let entry = |v: &str, from: &str| {
        format!(
            "title Fedora Linux ({v})\nversion {v}\nlinux /{KERNEL_NAME}\ninitrd /early.img\ninitrd /{INITRD_NAME}\n\
             options root=UUID={FS_UUID} ro $tuned from={from} testguest.scenario=basic\n"
        )
    };
    let boot = t.path().join("boot.ext4");
    ext4(
        t.path(),
        &boot,
        8,
        BOOT_FS_UUID,
        &[
            (&format!("/{KERNEL_NAME}"), &kernel()),
            (&format!("/{INITRD_NAME}"), &initrd),
            ("/early.img", &early),
            (
                "/loader/entries/a-6.9.12.conf",
                entry("6.9.12", "old").as_bytes(),
            ),
            (
                "/loader/entries/b-6.10.1.conf",
                entry("6.10.1", "new").as_bytes(),
            ),
            (
                "/grub2/grubenv",
                b"# GRUB Environment Block\ntuned=quiet\n#########\n",
            ),
        ],
    );
    let root = t.path().join("root.ext4");
    ext4(
        t.path(),
        &root,
        8,
        FS_UUID,
        &[("/etc/os-release", b"ID=fedora\n")],
    );
    let disk = t.path().join("disk.raw");
    partitioned(&disk, Label::Mbr, &[&boot, &root], "83");
    let r = launch(&vmi(t.path(), "bls", &disk, None));
    r.booted();
    assert!(
        r.cmdline().ends_with(&format!(
            "root=UUID={FS_UUID} ro quiet from=new testguest.scenario=basic"
        )),
        "{}",
        r.cmdline()
    );
    assert!(
        r.stdout.contains(&initrd_line(&[&early, &initrd])),
        "{}",
        r.stdout
    );
}

/// extlinux.conf (relative paths) on a GPT disk, qcow2.
#[test]
fn extlinux_on_gpt_qcow2() {
    tools();
    let t = TempDir::new("extlinux");
    let cfg = format!(
        "DEFAULT cloud\nTIMEOUT 0\nLABEL rescue\n  LINUX /boot/none\nLABEL cloud\n  KERNEL ../{KERNEL_NAME}\n  \
         APPEND root=PARTUUID={PART_UUID} rw from=extlinux testguest.scenario=basic\n"
    );
    let fs = t.path().join("root.ext4");
    ext4(
        t.path(),
        &fs,
        8,
        FS_UUID,
        &[
            (&format!("/boot/{KERNEL_NAME}"), &kernel()),
            ("/boot/extlinux/extlinux.conf", cfg.as_bytes()),
        ],
    );
    let disk = t.path().join("disk.raw");
    partitioned(&disk, Label::Gpt, &[&fs], "L");
    let r = launch(&vmi(t.path(), "extlinux", &qcow2(&disk), None));
    r.booted();
    assert!(
        r.cmdline().ends_with(&format!(
            "root=PARTUUID={PART_UUID} rw from=extlinux testguest.scenario=basic"
        )),
        "{}",
        r.cmdline()
    );
    assert!(r.stdout.contains("initrd: none"), "{}", r.stdout);
}

/// A partitioned disk without a kernel: the operator's default kernel (here the test guest,
/// in the document the operator writes) boots with root on the image's root partition —
/// PARTUUID on GPT, the device node on MBR — never `root=/dev/vda`.
#[test]
fn a_disk_without_kernel_boots_the_default_kernel_on_its_root_partition() {
    tools();
    let t = TempDir::new("nokernel");
    let fs = t.path().join("root.ext4");
    ext4(t.path(), &fs, 8, FS_UUID, &[("/sbin/init", b"#!/bin/sh\n")]);
    let swap = t.path().join("swap.img");
    std::fs::write(&swap, vec![0u8; 1 << 20]).unwrap();
    let gpt = t.path().join("gpt.raw");
    // GPT: the root file system is partition 1 (type Linux root x86-64).
    partitioned(
        &gpt,
        Label::Gpt,
        &[&fs, &swap],
        "4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709",
    );
    let r = launch(&operator_document(t.path(), "nokernel-gpt", &qcow2(&gpt)));
    r.booted();
    assert!(
        r.cmdline().ends_with(&format!(
            "root=PARTUUID={PART_UUID} rw testguest.scenario=basic"
        )),
        "{}",
        r.cmdline()
    );
    assert!(!r.cmdline().contains("root=/dev/vda "), "{}", r.cmdline());
    // MBR: the root is partition 2, found by /sbin/init.
    let mbr = t.path().join("mbr.raw");
    partitioned(&mbr, Label::Mbr, &[&swap, &fs], "82");
    let r = launch(&operator_document(t.path(), "nokernel-mbr", &mbr));
    r.booted();
    assert!(
        r.cmdline()
            .ends_with("root=/dev/vda2 rw testguest.scenario=basic"),
        "{}",
        r.cmdline()
    );
    // An unpartitioned file system keeps the default arguments (root=/dev/vda).
    let r = launch(&operator_document(t.path(), "nokernel-bare", &fs));
    r.booted();
    assert!(
        r.cmdline()
            .ends_with("root=/dev/vda rw testguest.scenario=basic"),
        "{}",
        r.cmdline()
    );
}

/// Damaged boot disks fail the VMI with their reason (exit 3, the termination message names
/// the damage), and no guest runs.
#[test]
fn damaged_boot_disks_fail_with_their_reason() {
    tools();
    let t = TempDir::new("damaged");
    let with_grub = |name: &str, linux: &str| -> PathBuf {
        let grub = format!("menuentry 'x' {{\n{linux}\n}}\n");
        let fs = t.path().join(format!("{name}.ext4"));
        ext4(
            t.path(),
            &fs,
            8,
            FS_UUID,
            &[
                (&format!("/boot/{KERNEL_NAME}"), &kernel()),
                ("/boot/grub/grub.cfg", grub.as_bytes()),
            ],
        );
        let disk = t.path().join(format!("{name}.raw"));
        partitioned(&disk, Label::Gpt, &[&fs], "L");
        disk
    };
    // A boot configuration that names a missing kernel.
    let disk = with_grub("missing", "linux /boot/vmlinuz-nothere root=/dev/vda1");
    launch(&vmi(t.path(), "missing", &disk, None)).failed(
        "NoBootableKernel",
        "kernel /boot/vmlinuz-nothere not found on partition 1",
    );
    // One that points at a file system outside the disk's partitions.
    let disk = with_grub(
        "outside",
        &format!("search --fs-uuid --set=root 11111111-2222-3333-4444-555555555555\nlinux /boot/{KERNEL_NAME}"),
    );
    launch(&vmi(t.path(), "outside", &disk, None))
        .failed("NoBootableKernel", "no ext4 partition has this file system");
    // A damaged GPT header.
    let disk = with_grub("badgpt", &format!("linux /boot/{KERNEL_NAME}"));
    let mut bytes = std::fs::read(&disk).unwrap();
    bytes[512 + 40] ^= 0xff;
    std::fs::write(&disk, &bytes).unwrap();
    launch(&vmi(t.path(), "badgpt", &disk, None)).failed("NoBootableKernel", "GPT header CRC");
    // A file system the launcher does not read, and no kernel anywhere it can read.
    let mut xfs = vec![0u8; 1 << 20];
    xfs[..4].copy_from_slice(b"XFSB");
    let part = t.path().join("xfs.img");
    std::fs::write(&part, &xfs).unwrap();
    let disk = t.path().join("xfs.raw");
    partitioned(&disk, Label::Gpt, &[&part], "L");
    launch(&vmi(t.path(), "xfs", &disk, None))
        .failed("NoBootableKernel", "1: xfs, not read (only ext2/3/4 are)");
    // A truncated qcow2 image.
    let good = with_grub("trunc", &format!("linux /boot/{KERNEL_NAME}"));
    let q = qcow2(&good);
    let len = std::fs::metadata(&q).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&q).unwrap();
    f.set_len(len / 3).unwrap();
    drop(f);
    let r = launch(&vmi(t.path(), "trunc", &q, None));
    r.failed("NoBootableKernel", "qcow2");
}

/// `virt-launcher pod` with the operator's document and a containerDisk packed as KubeVirt packs
/// it (`disk/<file>.qcow2` in the image, no `path`): the image's kernel boots rather than the
/// default kernel image (the demo guest here, PVH entry), which boots only for a disk without
/// a kernel, with root on the image's root partition.
#[test]
fn pod_mode_prefers_the_image_kernel_over_the_default_kernel_image() {
    tools();
    let t = TempDir::new("pod");
    let grub = format!(
        "menuentry 'Debian GNU/Linux' {{\n linux /boot/{KERNEL_NAME} root=PARTUUID={PART_UUID} ro from=pod-grub testguest.scenario=basic\n}}\n"
    );
    let with_kernel = t.path().join("k.ext4");
    ext4(
        t.path(),
        &with_kernel,
        8,
        FS_UUID,
        &[
            (&format!("/boot/{KERNEL_NAME}"), &kernel()),
            ("/boot/grub/grub.cfg", grub.as_bytes()),
        ],
    );
    let without = t.path().join("n.ext4");
    ext4(
        t.path(),
        &without,
        8,
        FS_UUID,
        &[("/sbin/init", b"#!/bin/sh\n")],
    );
    for (name, fs, entry, cmdline_end) in [
        (
            "image-kernel",
            &with_kernel,
            "entry=linux64",
            format!("root=PARTUUID={PART_UUID} ro from=pod-grub testguest.scenario=basic"),
        ),
        (
            "default-kernel",
            &without,
            "entry=pvh",
            format!("root=PARTUUID={PART_UUID} rw testguest.scenario=basic"),
        ),
    ] {
        let raw = t.path().join(format!("{name}.raw"));
        partitioned(&raw, Label::Gpt, &[fs], "L");
        let q = qcow2(&raw);
        let root = t.path().join(name);
        let disk_dir = root.join("container-disks/root/disk");
        std::fs::create_dir_all(&disk_dir).unwrap();
        std::fs::copy(&q, disk_dir.join("disk.qcow2")).unwrap();
        std::fs::create_dir_all(root.join("kernel-boot/boot")).unwrap();
        std::fs::write(
            root.join("kernel-boot/boot/vmlinux"),
            launcher::demo::DEMO_GUEST,
        )
        .unwrap();
        std::fs::create_dir_all(root.join("vmi")).unwrap();
        let doc = serde_json::json!({
            "apiVersion": "microvirt.io/v1alpha1",
            "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "namespace": "default", "uid": "0000-1111"},
            "spec": {
                "terminationGracePeriodSeconds": 5,
                "domain": {
                    "memory": {"guest": "32Mi"},
                    "firmware": {"kernelBoot": {"container": {
                        "image": "microvirt/guest-kernel:dev", "kernelPath": "/boot/vmlinux"}}},
                    "devices": {"disks": [{"name": "root"}]}
                },
                "volumes": [{"name": "root", "containerDisk": {"image": "example/cloud:1"}}]
            },
            "guestMemoryBytes": 33554432u64,
            "vcpus": 1,
            "defaultKernel": {"kernelArgs": "root=/dev/vda rw testguest.scenario=basic"}
        });
        std::fs::write(root.join("vmi/vmi.json"), doc.to_string()).unwrap();
        let log = t.path().join(format!("{name}.termination"));
        let out = Command::new(BIN)
            .arg("pod")
            .env("MICROVIRT_ROOT", &root)
            .env("MICROVIRT_TERMINATION_LOG", &log)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{name}:\n{stdout}\n{stderr}");
        assert!(
            stdout.contains(&format!("microvirt-testguest: {entry}")),
            "{name}:\n{stdout}"
        );
        let cmdline = stdout
            .lines()
            .find_map(|l| l.strip_prefix("cmdline: "))
            .unwrap_or_else(|| panic!("{name}: no command line:\n{stdout}"));
        assert!(cmdline.ends_with(&cmdline_end), "{name}: {cmdline}");
        assert!(!cmdline.contains("root=/dev/vda "), "{name}: {cmdline}");
        // The extracted kernel was an unlinked file: nothing is left in the runtime directory.
        let left: Vec<_> = std::fs::read_dir(root.join("run"))
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("boot-disk"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
