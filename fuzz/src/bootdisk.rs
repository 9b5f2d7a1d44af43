//! `bootdisk` and `bootcfg`: the launcher's boot-disk reader (`launcher::bootdisk`): what it
//! finds on a hostile cloud image (a containerDisk or PVC of a VMI without a kernel of its own).
//!
//! `bootdisk`: the input is a **sparse disk image** — a little-endian `u32` disk size (capped
//! at [`MAX_DISK`], rounded down to whole sectors), then chunks of (`u32` offset, `u16`
//! length, bytes) written over a zero-filled disk (clipped at its end) — so that a few KiB of
//! input describe a partitioned disk with ext4 file systems, and mutations land on the
//! metadata. [`bootdisk::inspect`] runs on it, then the kernel and initrd are extracted into
//! counting sinks. Checked, besides "no panic, no hang, bounded memory":
//! - an error is one non-empty line;
//! - the partition table's partitions lie inside the disk and do not overlap; their numbers
//!   rise; on GPT every partition has a PARTUUID;
//! - a kernel found names an ext4 partition of the table, absolute paths, at most the caps'
//!   initrds and command-line bytes; extracting it either fails in one line or yields at most
//!   [`bootdisk::KERNEL_MAX`] and [`bootdisk::INITRD_MAX`] bytes, the initrd a multiple of 4;
//! - without a kernel, the root for a fallback kernel is `PARTUUID=<a GPT partition's>` or
//!   `/dev/vda<N>` of an MBR partition;
//! - inspecting the same bytes again gives the same answer.
//!
//! `bootcfg`: the boot-configuration text parsers on any text (first byte: 0 GRUB with a
//! `grubenv` after a NUL, 1 BLS, 2 extlinux/syslinux, 3 grubenv). Checked: errors are one
//! non-empty line; an entry found passes the bounds every parser promises (absolute paths of
//! at most 1024 bytes, at most 16 initrds, a command line of at most 4096 bytes without
//! control characters); the parse is deterministic; the grubenv stays within its caps.

use std::collections::BTreeMap;
use std::io::Write;

use launcher::bootdisk::entry::{self, Entry};
use launcher::bootdisk::partition::{self, TableKind};
use launcher::bootdisk::{self, bls, extlinux, grub, Found};

/// Largest disk a `bootdisk` input describes.
pub const MAX_DISK: u64 = 8 << 20;

/// A disk from a sparse description (see the module documentation).
pub fn sparse_disk(data: &[u8]) -> Vec<u8> {
    let Some(size) = data.get(..4) else {
        return Vec::new();
    };
    let size = u64::from(u32::from_le_bytes([size[0], size[1], size[2], size[3]]));
    let size = (size.min(MAX_DISK) / 512 * 512) as usize;
    let mut disk = vec![0u8; size];
    let mut rest = &data[4..];
    while rest.len() >= 6 {
        let off = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let len = u16::from_le_bytes([rest[4], rest[5]]) as usize;
        rest = &rest[6..];
        let n = len.min(rest.len());
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        if off < size {
            let end = (off + n).min(size);
            disk[off..end].copy_from_slice(&chunk[..end - off]);
        }
    }
    disk
}

/// The sparse description of `disk`: its non-zero 512-byte sectors, runs merged.
pub fn encode_sparse(disk: &[u8]) -> Vec<u8> {
    let mut out = (disk.len() as u32).to_le_bytes().to_vec();
    let mut i = 0;
    while i < disk.len() {
        let s = &disk[i..(i + 512).min(disk.len())];
        if s.iter().all(|b| *b == 0) {
            i += 512;
            continue;
        }
        let start = i;
        while i < disk.len()
            && i - start < 60_000
            && disk[i..(i + 512).min(disk.len())].iter().any(|b| *b != 0)
        {
            i += 512;
        }
        let end = i.min(disk.len());
        out.extend_from_slice(&(start as u32).to_le_bytes());
        out.extend_from_slice(&((end - start) as u16).to_le_bytes());
        out.extend_from_slice(&disk[start..end]);
    }
    out
}

/// Counts bytes, keeps none.
struct Count(u64);
impl Write for Count {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0 += b.len() as u64;
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn one_line(e: &str) {
    assert!(!e.is_empty(), "empty error");
    assert!(!e.contains('\n'), "error on several lines: {e:?}");
}

fn check_entry(e: &Entry) {
    // Resolved paths may have gained a `/boot` prefix.
    assert!(
        e.kernel.starts_with('/') && e.kernel.len() <= entry::PATH_MAX + 5,
        "{e:?}"
    );
    assert!(e.initrds.len() <= entry::MAX_INITRDS, "{e:?}");
    for i in &e.initrds {
        assert!(
            i.starts_with('/') && i.len() <= entry::PATH_MAX + 5,
            "{e:?}"
        );
    }
    assert!(e.options.len() <= entry::OPTIONS_MAX, "{e:?}");
    assert!(!e.options.chars().any(char::is_control), "{e:?}");
}

/// A summary of an inspection, to compare two runs.
fn summary(r: &Result<bootdisk::Inspection, String>) -> String {
    match r {
        Ok(i) => format!("{:?} {:?}", i.table, i.found),
        Err(e) => format!("err {e}"),
    }
}

/// The `bootdisk` target.
pub fn run(data: &[u8]) {
    let disk = sparse_disk(data);
    let size = disk.len() as u64;
    let first = bootdisk::inspect(Box::new(disk.clone()));
    trace!("bootdisk: {}", summary(&first));
    let again = bootdisk::inspect(Box::new(disk));
    assert_eq!(summary(&first), summary(&again), "not deterministic");
    let i = match first {
        Ok(i) => i,
        Err(e) => return one_line(&e),
    };
    assert_eq!(i.disk_size(), size);
    if let Some(t) = &i.table {
        let mut last = 0;
        for (n, p) in t.partitions.iter().enumerate() {
            assert!(p.number > last, "partition numbers do not rise: {t:?}");
            last = p.number;
            assert!(p.len > 0 && p.start + p.len <= size, "{p:?} outside {size}");
            for q in &t.partitions[n + 1..] {
                assert!(
                    p.start + p.len <= q.start || q.start + q.len <= p.start,
                    "overlap {t:?}"
                );
            }
            if matches!(t.kind, TableKind::Gpt { .. }) {
                assert_eq!(p.partuuid.len(), 36, "{p:?}");
            }
        }
        assert_eq!(i.parts.len(), t.partitions.len());
    }
    match &i.found {
        Found::Unpartitioned => assert!(i.table.is_none()),
        Found::Kernel(k) => {
            check_entry(&k.entry);
            assert!(k.part < i.parts.len());
            assert!(matches!(i.parts[k.part].fs, bootdisk::PartFs::Ext4(_)));
            let (mut kw, mut iw) = (Count(0), Count(0));
            match i.extract(&mut kw, &mut iw) {
                Ok((kl, il)) => {
                    assert_eq!((kl, il), (kw.0, iw.0));
                    assert!(kl <= bootdisk::KERNEL_MAX && il <= bootdisk::INITRD_MAX + 3);
                    assert_eq!(il % 4, 0);
                    if k.entry.initrds.is_empty() {
                        assert_eq!(il, 0);
                    }
                }
                Err(e) => one_line(&e),
            }
        }
        Found::NoKernel { root, looked } => {
            one_line(looked);
            let t = i.table.as_ref().expect("a table");
            if let Some(r) = root {
                let ok = match &t.kind {
                    TableKind::Gpt { .. } => t
                        .partitions
                        .iter()
                        .any(|p| r == &format!("PARTUUID={}", p.partuuid)),
                    TableKind::Mbr { .. } => t
                        .partitions
                        .iter()
                        .any(|p| r == &format!("/dev/vda{}", p.number)),
                };
                assert!(ok, "root {r} is no partition of {t:?}");
            }
        }
    }
    // The partition table alone agrees with the inspection.
    let mut d = sparse_disk(data);
    let p = partition::probe(&mut d);
    match (&p, &i.table) {
        (Ok(partition::Probe::Table(a)), Some(b)) => assert_eq!(a, b),
        (Ok(partition::Probe::None), None) => {}
        (p, t) => panic!("probe {p:?} but inspection table {t:?}"),
    }
}

fn cfg_result(r: Result<Entry, String>) -> Result<Entry, String> {
    match &r {
        Ok(e) => check_entry(e),
        Err(e) => one_line(e),
    }
    r
}

/// The `bootcfg` target.
pub fn run_cfg(data: &[u8]) {
    let Some((&mode, text)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(text);
    match mode % 4 {
        0 => {
            let (cfg, env) = text.split_once('\0').unwrap_or((&text, ""));
            let env = grub::parse_env(env);
            let a = cfg_result(grub::default_entry(cfg, &env));
            let b = grub::default_entry(cfg, &env);
            assert_eq!(a, b);
        }
        1 => {
            let env: BTreeMap<String, String> =
                [("kernelopts".to_string(), "root=/dev/vda1 ro".to_string())].into();
            let r = bls::parse("/loader/entries/x.conf", &text, &env);
            match &r {
                Ok(e) => {
                    check_entry(&e.entry);
                    let picked = bls::pick(vec![e.clone(), e.clone()]).expect("an entry");
                    assert_eq!(&picked, e);
                }
                Err(e) => one_line(e),
            }
            // Version comparison is an order: antisymmetric on any two words.
            let mut words = text.split_ascii_whitespace();
            if let (Some(x), Some(y)) = (words.next(), words.next()) {
                assert_eq!(bls::version_cmp(x, y), bls::version_cmp(y, x).reverse());
                assert_eq!(bls::version_cmp(x, x), std::cmp::Ordering::Equal);
            }
        }
        2 => {
            let a = cfg_result(extlinux::default_entry(&text, "/boot/extlinux"));
            assert_eq!(a, extlinux::default_entry(&text, "/boot/extlinux"));
        }
        _ => {
            let env = grub::parse_env(&text);
            assert!(env.len() <= grub::MAX_VARS);
            assert!(env.values().all(|v| v.len() <= grub::MAX_VALUE));
        }
    }
}

/// Seeds for `bootcfg`: the configurations the launcher's unit tests use, shaped like
/// Debian's grub.cfg, a Fedora BLS entry and an extlinux.conf.
pub fn cfg_seeds() -> Vec<(String, Vec<u8>)> {
    let with = |mode: u8, t: &str| {
        let mut v = vec![mode];
        v.extend_from_slice(t.as_bytes());
        v
    };
    vec![
        (
            "grub-debian".into(),
            with(
                0,
                "if [ \"${next_entry}\" ] ; then\n set default=\"${next_entry}\"\nelse\n set default=\"0\"\nfi\n\
                 menuentry 'Debian GNU/Linux' --class debian $menuentry_id_option 'gnulinux-simple-0b9e' {\n\
                 \tinsmod ext2\n\tsearch --no-floppy --fs-uuid --set=root 0b9e-abcd\n\
                 \tlinux\t/boot/vmlinuz-6.1.0-13-cloud-amd64 root=PARTUUID=6a8c ro console=ttyS0,115200 $extra\n\
                 \tinitrd\t/boot/initrd.img-6.1.0-13-cloud-amd64\n}\n\
                 submenu 'Advanced' $menuentry_id_option 'adv' {\n\
                 \tmenuentry 'recovery' {\n\t\tlinux ($root)/boot/vmlinuz single\n\t}\n}\n\0saved_entry=adv>0\nextra=quiet\n",
            ),
        ),
        (
            "bls-fedora".into(),
            with(
                1,
                "title Fedora Linux (6.8.5-301.fc40.x86_64) 40\nversion 6.8.5-301.fc40.x86_64\n\
                 linux /vmlinuz-6.8.5-301.fc40.x86_64\ninitrd /initramfs-6.8.5-301.fc40.x86_64.img\n\
                 options root=UUID=a1b2 ro rootflags=subvol=root $kernelopts\ngrub_class fedora\n",
            ),
        ),
        (
            "extlinux".into(),
            with(
                2,
                "DEFAULT linux\nTIMEOUT 10\nLABEL rescue\n  LINUX /boot/vmlinuz-rescue\nLABEL linux\n  KERNEL vmlinuz-6.1\n  \
                 INITRD initrd.img-6.1,extra.img\n  APPEND root=UUID=1234 ro console=ttyS0 initrd=/x.img\n",
            ),
        ),
        (
            "grubenv".into(),
            with(3, "# GRUB Environment Block\nsaved_entry=1>2\nkernelopts=root=UUID=x ro\n####\n"),
        ),
    ]
}

/// Seeds for `bootdisk`: small partitioned disks (GPT and MBR) with ext4 file systems (1 KiB
/// blocks, no journal) holding a GRUB, BLS or extlinux configuration, a stand-in kernel and
/// initrd, or no kernel; built with `mkfs.ext4 -d` and `sfdisk` (e2fsprogs, fdisk) and written
/// in the sparse form. Run by the `seeds` binary, not by the tests (they read the committed
/// files).
pub fn image_seeds() -> Vec<(String, Vec<u8>)> {
    use std::process::{Command, Stdio};
    let dir = std::env::temp_dir().join(format!("bootdisk-seeds-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("seed directory");
    let ext4 = |name: &str, files: &[(&str, &str)]| -> Vec<u8> {
        let root = dir.join(format!("{name}.d"));
        for (p, data) in files {
            let f = root.join(p.trim_start_matches('/'));
            std::fs::create_dir_all(f.parent().expect("parent")).expect("mkdir");
            std::fs::write(&f, data).expect("write");
        }
        std::fs::create_dir_all(&root).expect("mkdir");
        let img = dir.join(format!("{name}.ext4"));
        let st = Command::new("mkfs.ext4")
            .args([
                "-q",
                "-F",
                "-b",
                "1024",
                "-N",
                "32",
                "-O",
                "^has_journal,^resize_inode",
            ])
            .args(["-U", "0b9e3c1a-5d2f-4e8b-9a61-7c3d2e1f0a11", "-d"])
            .arg(&root)
            .arg(&img)
            .arg("256K")
            .status()
            .expect("mkfs.ext4 (e2fsprogs)");
        assert!(st.success());
        std::fs::read(&img).expect("read")
    };
    let disk = |label: &str, parts: &[Vec<u8>]| -> Vec<u8> {
        let mut script = format!("label: {label}\n");
        if label == "dos" {
            script.push_str("label-id: 0x1234abcd\n");
        }
        let mut start = 64usize;
        let mut layout = Vec::new();
        for (i, p) in parts.iter().enumerate() {
            let sectors = p.len() / 512;
            script.push_str(&format!("start={start}, size={sectors}, type=L"));
            if i == 0 && label == "gpt" {
                script.push_str(", uuid=a1b2c3d4-e5f6-4711-8899-aabbccddeeff");
            }
            script.push('\n');
            layout.push(start);
            start += sectors;
        }
        let mut d = vec![0u8; (start + 64) * 512];
        let path = dir.join("disk.raw");
        std::fs::write(&path, &d).expect("write");
        let mut c = Command::new("sfdisk")
            .args(["--quiet", "--no-reread", "--no-tell-kernel"])
            .arg(&path)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("sfdisk (fdisk)");
        c.stdin
            .take()
            .expect("stdin")
            .write_all(script.as_bytes())
            .expect("script");
        assert!(c.wait().expect("sfdisk").success());
        d = std::fs::read(&path).expect("read");
        for (p, s) in parts.iter().zip(layout) {
            d[s * 512..s * 512 + p.len()].copy_from_slice(p);
        }
        d
    };
    let kernel = "MZ stand-in kernel";
    let grub = "set default=\"0\"\nmenuentry 'Debian' {\n search --fs-uuid --set=root 0b9e3c1a-5d2f-4e8b-9a61-7c3d2e1f0a11\n linux /boot/vmlinuz-6.1 root=PARTUUID=a1b2c3d4-e5f6-4711-8899-aabbccddeeff ro\n initrd /boot/initrd.img-6.1\n}\n";
    let bls = "title Fedora\nversion 6.8\nlinux /vmlinuz-6.8\ninitrd /initramfs-6.8.img\noptions root=UUID=x ro\n";
    let ext = "DEFAULT l\nLABEL l\n KERNEL ../vmlinuz\n APPEND root=/dev/vda1 rw\n";
    let out = vec![
        (
            "gpt-grub",
            disk(
                "gpt",
                &[ext4(
                    "grub",
                    &[
                        ("/boot/vmlinuz-6.1", kernel),
                        ("/boot/initrd.img-6.1", "initrd"),
                        ("/boot/grub/grub.cfg", grub),
                        ("/sbin/init", "#!/bin/sh\n"),
                    ],
                )],
            ),
        ),
        (
            "mbr-bls",
            disk(
                "dos",
                &[
                    ext4(
                        "bls",
                        &[
                            ("/vmlinuz-6.8", kernel),
                            ("/initramfs-6.8.img", "initrd"),
                            ("/loader/entries/f.conf", bls),
                        ],
                    ),
                    ext4("root", &[("/etc/os-release", "ID=fedora\n")]),
                ],
            ),
        ),
        (
            "gpt-extlinux",
            disk(
                "gpt",
                &[ext4(
                    "ext",
                    &[
                        ("/boot/vmlinuz", kernel),
                        ("/boot/extlinux/extlinux.conf", ext),
                    ],
                )],
            ),
        ),
        (
            "gpt-nokernel",
            disk("gpt", &[ext4("nok", &[("/sbin/init", "#!/bin/sh\n")])]),
        ),
    ];
    let _ = std::fs::remove_dir_all(&dir);
    out.into_iter()
        .map(|(n, d)| (n.to_string(), encode_sparse(&d)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_round_trip() {
        let mut d = vec![0u8; 8192];
        d[700] = 1;
        d[5000..5100].fill(7);
        assert_eq!(sparse_disk(&encode_sparse(&d)), d);
        assert_eq!(sparse_disk(&[]), Vec::<u8>::new());
        // Chunks past the end are clipped.
        let mut s = 1024u32.to_le_bytes().to_vec();
        s.extend_from_slice(&1000u32.to_le_bytes());
        s.extend_from_slice(&100u16.to_le_bytes());
        s.extend_from_slice(&[9u8; 100]);
        let d = sparse_disk(&s);
        assert_eq!(d.len(), 1024);
        assert_eq!(&d[1000..], &[9u8; 24]);
    }
}
