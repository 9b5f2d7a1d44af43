//! The boot disk of a VMI that names no kernel of its own: what the image's boot loader would
//! boot, found without running it (no firmware in a microVM).
//!
//! [`inspect`] reads the partition table ([`partition`]: GPT or MBR), opens the ext2/3/4 file
//! systems on it ([`fs`], through `ext4-view`; other file systems are named, not read), and
//! looks, in this order, on each ext4 partition in table order, for
//!
//! 1. Boot Loader Specification entries ([`bls`]): `/loader/entries/*.conf`,
//!    `/boot/loader/entries/*.conf`;
//! 2. GRUB's default entry ([`grub`]): `/boot/grub/grub.cfg`, `/grub/grub.cfg`,
//!    `/boot/grub2/grub.cfg`, `/grub2/grub.cfg` (with `grubenv` next to it);
//! 3. syslinux's default label ([`extlinux`]): `extlinux.conf` / `syslinux.cfg` in
//!    `/boot/extlinux`, `/extlinux`, `/boot/syslinux`, `/syslinux`, `/`.
//!
//! The first configuration found decides; its kernel and initrds are read from the partition
//! it names (GRUB's `search --fs-uuid --set=root`), else from its own partition, where a path
//! that is not there is also tried under `/boot` (a `/boot` on the root file system). The
//! command line is the entry's, with the distribution's `root=` kept. Without any
//! configuration, [`Found::NoKernel`] names the root partition for a fallback kernel.
//!
//! Everything on the disk is untrusted: caps on every file read ([`KERNEL_MAX`],
//! [`INITRD_MAX`], [`CONFIG_MAX`]), on the number of file systems opened
//! ([`MAX_FILE_SYSTEMS`]), and in each parser; errors are one line; nothing panics (fuzzed:
//! `fuzz/` targets `bootdisk` and `bootcfg`).

pub mod bls;
pub mod entry;
pub mod extlinux;
pub mod fs;
pub mod grub;
pub mod partition;
pub mod source;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io::Write;
use std::rc::Rc;

use entry::Entry;
use fs::{Ext4Fs, FsKind, SharedDisk};
use partition::{Partition, Probe, Table, TableKind};
use source::Source;

/// Largest kernel read from an image.
pub const KERNEL_MAX: u64 = 64 << 20;
/// Largest initrd (all of an entry's initrds together) read from an image.
pub const INITRD_MAX: u64 = 512 << 20;
/// Largest boot configuration file read.
pub const CONFIG_MAX: u64 = 1 << 20;
/// Most ext4 file systems opened on one disk.
pub const MAX_FILE_SYSTEMS: usize = 16;
/// Most BLS entry files read.
pub const MAX_BLS_FILES: usize = 64;

const BLS_DIRS: &[&str] = &["/loader/entries", "/boot/loader/entries"];
const GRUB_CFGS: &[&str] = &[
    "/boot/grub/grub.cfg",
    "/grub/grub.cfg",
    "/boot/grub2/grub.cfg",
    "/grub2/grub.cfg",
];
const EXTLINUX_CFGS: &[&str] = &[
    "/boot/extlinux/extlinux.conf",
    "/extlinux/extlinux.conf",
    "/boot/syslinux/syslinux.cfg",
    "/syslinux/syslinux.cfg",
    "/boot/syslinux/extlinux.conf",
    "/extlinux.conf",
    "/syslinux.cfg",
];
/// What marks a root file system (for the fallback kernel's `root=`).
const ROOT_MARKERS: &[&str] = &["/sbin/init", "/usr/sbin/init", "/etc/os-release"];

/// What was looked for, for the `NoBootableKernel` message.
pub const LOOKED_FOR: &str = "BLS entries (/loader/entries, /boot/loader/entries), GRUB's \
     grub.cfg (/boot/grub, /grub, /boot/grub2, /grub2), extlinux.conf/syslinux.cfg";

/// One partition and what is on it.
pub struct Part {
    pub partition: Partition,
    pub fs: PartFs,
}

pub enum PartFs {
    Ext4(Ext4Fs),
    /// ext4 whose superblock or metadata could not be read: why.
    Damaged(String),
    /// Another file system (its name) or unknown contents.
    Other(Option<&'static str>),
    /// Not opened: more than [`MAX_FILE_SYSTEMS`] ext4 file systems.
    Skipped,
}

/// The image kernel chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageKernel {
    /// Paths resolved on the partition `part` (index into [`Inspection::parts`]).
    pub entry: Entry,
    pub part: usize,
    /// For logs and status: which configuration, entry and partition.
    pub source: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// No partition table: the disk is a bare file system (or unknown), used as it is.
    Unpartitioned,
    /// The kernel the image's boot configuration boots.
    Kernel(ImageKernel),
    /// No boot configuration anywhere. `root`: the `root=` value for a fallback kernel
    /// (`PARTUUID=…` on GPT, `/dev/vdaN` on MBR) when a root file system was found; `looked`:
    /// what was searched, for the refusal.
    NoKernel {
        root: Option<String>,
        looked: String,
    },
}

/// A boot disk after [`inspect`].
pub struct Inspection {
    disk: SharedDisk,
    pub table: Option<Table>,
    pub parts: Vec<Part>,
    pub found: Found,
}

fn describe_parts(parts: &[Part]) -> String {
    let mut out = Vec::new();
    for p in parts {
        let n = p.partition.number;
        out.push(match &p.fs {
            PartFs::Ext4(_) => format!("{n}: ext4"),
            PartFs::Damaged(e) => format!("{n}: damaged ext4 ({})", entry::clip(e)),
            PartFs::Other(Some(name)) => format!("{n}: {name}, not read (only ext2/3/4 are)"),
            PartFs::Other(None) => format!("{n}: no known file system"),
            PartFs::Skipped => format!("{n}: not opened (more than {MAX_FILE_SYSTEMS} ext4)"),
        });
    }
    if out.is_empty() {
        "no partitions".into()
    } else {
        format!("partitions {}", out.join(", "))
    }
}

/// Reads `disk`'s partition table and file systems and finds what to boot. `Err`: the disk
/// cannot be read as a boot disk (damaged table, damaged configuration, a configuration that
/// names a missing file); one line.
pub fn inspect(disk: Box<dyn Source>) -> Result<Inspection, String> {
    let disk: SharedDisk = Rc::new(RefCell::new(disk));
    let probe = {
        let mut d = disk.borrow_mut();
        partition::probe(d.as_mut())?
    };
    let table = match probe {
        Probe::None => {
            return Ok(Inspection {
                disk,
                table: None,
                parts: Vec::new(),
                found: Found::Unpartitioned,
            })
        }
        Probe::Table(t) => t,
    };
    let mut parts = Vec::new();
    let mut opened = 0;
    for p in &table.partitions {
        let fs = match fs::identify(&disk, p) {
            FsKind::Ext4 if opened == MAX_FILE_SYSTEMS => PartFs::Skipped,
            FsKind::Ext4 => {
                opened += 1;
                match Ext4Fs::open(&disk, p) {
                    Ok(f) => PartFs::Ext4(f),
                    Err(e) => PartFs::Damaged(e),
                }
            }
            FsKind::Other(name) => PartFs::Other(name),
        };
        parts.push(Part {
            partition: p.clone(),
            fs,
        });
    }
    let found = find(&table, &parts)?;
    Ok(Inspection {
        disk,
        table: Some(table),
        parts,
        found,
    })
}

fn ext4(parts: &[Part]) -> impl Iterator<Item = (usize, &Ext4Fs)> {
    parts.iter().enumerate().filter_map(|(i, p)| match &p.fs {
        PartFs::Ext4(f) => Some((i, f)),
        _ => None,
    })
}

/// The GRUB environment block next to a GRUB or BLS configuration.
fn grubenv(fs: &Ext4Fs) -> BTreeMap<String, String> {
    for p in [
        "/boot/grub/grubenv",
        "/grub/grubenv",
        "/boot/grub2/grubenv",
        "/grub2/grubenv",
    ] {
        if let Ok(Some(t)) = fs.read_text(p, CONFIG_MAX) {
            return grub::parse_env(&t);
        }
    }
    BTreeMap::new()
}

fn find(table: &Table, parts: &[Part]) -> Result<Found, String> {
    // 1. BLS.
    for (i, fs) in ext4(parts) {
        for dir in BLS_DIRS {
            let files: Vec<String> = fs
                .list(dir)?
                .into_iter()
                .filter(|n| n.ends_with(".conf"))
                .take(MAX_BLS_FILES)
                .collect();
            if files.is_empty() {
                continue;
            }
            let env = grubenv(fs);
            let mut entries = Vec::new();
            let mut first_err = None;
            for f in &files {
                let path = format!("{dir}/{f}");
                let text = fs
                    .read_text(&path, CONFIG_MAX)
                    .map_err(|e| format!("BLS entry {e}"))?
                    .unwrap_or_default();
                match bls::parse(&path, &text, &env) {
                    Ok(e) => entries.push(e),
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            let Some(chosen) = bls::pick(entries) else {
                return Err(first_err.unwrap_or_else(|| format!("no usable BLS entry in {dir}")));
            };
            let source = format!(
                "BLS entry {} (partition {})",
                chosen.file, parts[i].partition.number
            );
            return resolve(parts, i, dir, chosen.entry, source).map(Found::Kernel);
        }
    }
    // 2. GRUB.
    for (i, fs) in ext4(parts) {
        for cfg in GRUB_CFGS {
            let Some(text) = fs.read_text(cfg, CONFIG_MAX)? else {
                continue;
            };
            let e = grub::default_entry(&text, &grubenv(fs)).map_err(|e| format!("{cfg}: {e}"))?;
            let source = format!(
                "GRUB default entry {:?} of {cfg} (partition {})",
                entry::clip(&e.title),
                parts[i].partition.number
            );
            return resolve(parts, i, cfg, e, source).map(Found::Kernel);
        }
    }
    // 3. extlinux / syslinux.
    for (i, fs) in ext4(parts) {
        for cfg in EXTLINUX_CFGS {
            let Some(text) = fs.read_text(cfg, CONFIG_MAX)? else {
                continue;
            };
            let dir = cfg
                .rsplit_once('/')
                .map_or("/", |(d, _)| if d.is_empty() { "/" } else { d });
            let e = extlinux::default_entry(&text, dir).map_err(|e| format!("{cfg}: {e}"))?;
            let source = format!(
                "extlinux label {:?} of {cfg} (partition {})",
                entry::clip(&e.title),
                parts[i].partition.number
            );
            return resolve(parts, i, cfg, e, source).map(Found::Kernel);
        }
    }
    Ok(Found::NoKernel {
        root: root_partition(table, parts),
        looked: format!(
            "{} table, {}; looked for {LOOKED_FOR} on the ext4 partitions",
            table.name(),
            describe_parts(parts)
        ),
    })
}

/// The root partition for a fallback kernel: GPT's "Linux root (x86-64)" type, else the first
/// ext4 file system with `/sbin/init`, `/usr/sbin/init` or `/etc/os-release`.
fn root_partition(table: &Table, parts: &[Part]) -> Option<String> {
    let typed = parts.iter().find(|p| {
        p.partition.type_id == partition::GPT_LINUX_ROOT_X86_64
            && matches!(table.kind, TableKind::Gpt { .. })
    });
    let part = typed.or_else(|| {
        ext4(parts)
            .find(|(_, fs)| ROOT_MARKERS.iter().any(|m| fs.exists(m)))
            .map(|(i, _)| &parts[i])
    })?;
    Some(match table.kind {
        TableKind::Gpt { .. } => format!("PARTUUID={}", part.partition.partuuid),
        TableKind::Mbr { .. } => format!("/dev/vda{}", part.partition.number),
    })
}

/// Resolves `e`'s paths to files on one partition: the one its GRUB `search` names, else `i`.
fn resolve(
    parts: &[Part],
    i: usize,
    cfg: &str,
    mut e: Entry,
    source: String,
) -> Result<ImageKernel, String> {
    let target = match &e.root_uuid {
        Some(u) => ext4(parts)
            .find(|(_, fs)| fs.uuid().eq_ignore_ascii_case(u))
            .map(|(j, _)| j)
            .ok_or_else(|| {
                format!(
                    "{source}: `search --fs-uuid {}`: no ext4 partition has this file system",
                    entry::clip(u)
                )
            })?,
        None => i,
    };
    let PartFs::Ext4(fs) = &parts[target].fs else {
        return Err(format!("{source}: partition is not ext4"));
    };
    let boot_prefixed = cfg.starts_with("/boot/");
    let locate = |p: &str, cap: u64, what: &str| -> Result<(String, u64), String> {
        let mut tried = vec![p.to_string()];
        if boot_prefixed || target != i {
            tried.push(format!("/boot{p}"));
        }
        for t in &tried {
            if let Some(len) = fs.file_len(t).map_err(|e| format!("{source}: {e}"))? {
                if len > cap {
                    return Err(format!(
                        "{source}: {what} {t} is {len} bytes, more than {cap}"
                    ));
                }
                return Ok((t.clone(), len));
            }
        }
        Err(format!(
            "{source}: {what} {} not found on partition {}",
            entry::clip(p),
            parts[target].partition.number
        ))
    };
    e.kernel = locate(&e.kernel, KERNEL_MAX, "kernel")?.0;
    let mut total = 0u64;
    let mut initrds = Vec::new();
    for p in &e.initrds {
        let (path, len) = locate(p, INITRD_MAX, "initrd")?;
        total = total.saturating_add(len.next_multiple_of(4));
        if total > INITRD_MAX {
            return Err(format!(
                "{source}: the initrds are more than {INITRD_MAX} bytes together"
            ));
        }
        initrds.push(path);
    }
    e.initrds = initrds;
    Ok(ImageKernel {
        entry: e,
        part: target,
        source,
    })
}

impl Inspection {
    /// Copies the chosen kernel to `kernel` and its initrds, concatenated (each padded to 4
    /// bytes, as Linux reads a list of cpio archives), to `initrd`. Returns the two lengths.
    pub fn extract(
        &self,
        kernel: &mut dyn Write,
        initrd: &mut dyn Write,
    ) -> Result<(u64, u64), String> {
        let Found::Kernel(k) = &self.found else {
            return Err("no image kernel to extract".into());
        };
        let PartFs::Ext4(fs) = &self.parts[k.part].fs else {
            return Err("the kernel's partition is not ext4".into());
        };
        let klen = fs.copy(&k.entry.kernel, KERNEL_MAX, kernel)?;
        let mut ilen = 0u64;
        for p in &k.entry.initrds {
            let n = fs.copy(p, INITRD_MAX.saturating_sub(ilen), initrd)?;
            let pad = n.next_multiple_of(4) - n;
            initrd
                .write_all(&[0u8; 3][..pad as usize])
                .map_err(|e| format!("writing the initrd: {e}"))?;
            ilen += n + pad;
        }
        Ok((klen, ilen))
    }

    /// The disk's size in bytes.
    pub fn disk_size(&self) -> u64 {
        self.disk.borrow().size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpartitioned_and_empty_disks() {
        let i = inspect(Box::new(vec![0u8; 4096])).unwrap();
        assert_eq!(i.found, Found::Unpartitioned);
        let i = inspect(Box::new(Vec::new())).unwrap();
        assert_eq!(i.found, Found::Unpartitioned);
    }

    #[test]
    fn partitioned_without_file_systems_has_no_kernel() {
        let mut d = vec![0u8; 64 * 512];
        d[510] = 0x55;
        d[511] = 0xaa;
        d[446 + 4] = 0x83;
        d[446 + 8] = 2;
        d[446 + 12] = 10;
        let i = inspect(Box::new(d)).unwrap();
        match i.found {
            Found::NoKernel { root, looked } => {
                assert_eq!(root, None);
                assert!(
                    looked.contains("MBR table, partitions 1: no known file system"),
                    "{looked}"
                );
            }
            f => panic!("{f:?}"),
        }
    }
}
