//! File systems on a boot disk's partitions: ext2/3/4 read through the `ext4-view` crate
//! (read-only), every other file system recognised by its magic number only, to name it in a
//! refusal.
//!
//! `ext4-view` sizes its block-group table by the superblock, so the superblock is checked here
//! first: the file system must fit its partition and have at most [`MAX_GROUPS`] block groups.
//! Reads never leave the partition, and every file read is capped by its caller.

use std::cell::RefCell;
use std::io::Write;
use std::rc::Rc;

use ext4_view::{Ext4, Ext4Error, Ext4Read};

use super::partition::Partition;
use super::source::Source;

/// Most block groups accepted (8 TiB with 4 KiB blocks; `ext4-view` keeps one descriptor each).
pub const MAX_GROUPS: u64 = 1 << 16;
/// Most directory entries looked at in one directory.
pub const MAX_DIR_ENTRIES: usize = 1024;

/// A disk shared by the file systems of its partitions.
pub type SharedDisk = Rc<RefCell<Box<dyn Source>>>;

/// One partition of the disk, as `ext4-view` reads it.
struct PartReader {
    disk: SharedDisk,
    start: u64,
    len: u64,
}

#[derive(Debug)]
struct OutOfPartition;

impl std::fmt::Display for OutOfPartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("read outside the partition")
    }
}
impl std::error::Error for OutOfPartition {}

#[derive(Debug)]
struct ReadError(String);
impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for ReadError {}

impl Ext4Read for PartReader {
    fn read(
        &mut self,
        start_byte: u64,
        dst: &mut [u8],
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync + 'static>> {
        match start_byte.checked_add(dst.len() as u64) {
            Some(end) if end <= self.len => {}
            _ => return Err(Box::new(OutOfPartition)),
        }
        self.disk
            .borrow_mut()
            .read(self.start + start_byte, dst)
            .map_err(|e| Box::new(ReadError(e)) as _)
    }
}

/// What a partition holds, by magic number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FsKind {
    Ext4,
    /// Any other recognised file system (its name), or `None` for unknown contents.
    Other(Option<&'static str>),
}

fn read_part(disk: &SharedDisk, p: &Partition, at: u64, buf: &mut [u8]) -> bool {
    if at + buf.len() as u64 > p.len {
        return false;
    }
    disk.borrow_mut().read(p.start + at, buf).is_ok()
}

/// Recognises the file system on `p` by its magic number.
pub fn identify(disk: &SharedDisk, p: &Partition) -> FsKind {
    let mut sb = [0u8; 1024];
    if read_part(disk, p, 1024, &mut sb) && sb[0x38..0x3a] == [0x53, 0xef] {
        return FsKind::Ext4;
    }
    let mut s0 = [0u8; 4096];
    let have0 = read_part(disk, p, 0, &mut s0[..512]);
    if have0 && &s0[0..4] == b"XFSB" {
        return FsKind::Other(Some("xfs"));
    }
    if have0 && (&s0[0..4] == b"hsqs") {
        return FsKind::Other(Some("squashfs"));
    }
    if have0 && &s0[0..6] == b"LUKS\xba\xbe" {
        return FsKind::Other(Some("LUKS (encrypted)"));
    }
    if have0 && (&s0[0x36..0x39] == b"FAT" || &s0[0x52..0x55] == b"FAT") {
        return FsKind::Other(Some("vfat"));
    }
    if have0 && &s0[3..7] == b"NTFS" {
        return FsKind::Other(Some("ntfs"));
    }
    let mut bt = [0u8; 8];
    if read_part(disk, p, 0x10040, &mut bt) && &bt == b"_BHRfS_M" {
        return FsKind::Other(Some("btrfs"));
    }
    if read_part(disk, p, 0, &mut s0) && &s0[4086..4096] == b"SWAPSPACE2" {
        return FsKind::Other(Some("swap"));
    }
    FsKind::Other(None)
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Checks the ext2/3/4 superblock bounds that `ext4-view` sizes memory by.
fn check_superblock(sb: &[u8; 1024], part_len: u64) -> Result<(), String> {
    let log = le32(sb, 0x18);
    if log > 6 {
        return Err(format!(
            "ext4 block size 2^{} (at most 64 KiB)",
            u64::from(log) + 10
        ));
    }
    let block = 1024u64 << log;
    let incompat = le32(sb, 0x60);
    let hi = if incompat & 0x80 != 0 {
        u64::from(le32(sb, 0x150))
    } else {
        0
    };
    let blocks = (hi << 32) | u64::from(le32(sb, 0x4));
    let fs_len = blocks.checked_mul(block);
    if fs_len.is_none_or(|l| l > part_len) {
        return Err(format!(
            "ext4 file system of {blocks} blocks of {block} bytes is larger than its partition ({part_len} bytes)"
        ));
    }
    let per_group = u64::from(le32(sb, 0x20));
    let first = u64::from(le32(sb, 0x14));
    if per_group == 0 {
        return Err("ext4 superblock: 0 blocks per group".into());
    }
    let groups = blocks.saturating_sub(first).div_ceil(per_group);
    if groups > MAX_GROUPS {
        return Err(format!(
            "ext4 file system with {groups} block groups (at most {MAX_GROUPS})"
        ));
    }
    Ok(())
}

/// An ext2/3/4 file system on one partition.
pub struct Ext4Fs {
    fs: Ext4,
    uuid: String,
}

fn e(path: &str, err: Ext4Error) -> String {
    format!("{path}: {err}")
}

/// Whether an error means "no such file" (as opposed to a damaged file system).
fn not_found(err: &Ext4Error) -> bool {
    matches!(err, Ext4Error::NotFound)
}

impl Ext4Fs {
    pub fn open(disk: &SharedDisk, p: &Partition) -> Result<Self, String> {
        let mut sb = [0u8; 1024];
        if !read_part(disk, p, 1024, &mut sb) {
            return Err("cannot read the ext4 superblock".into());
        }
        check_superblock(&sb, p.len)?;
        let reader = PartReader {
            disk: disk.clone(),
            start: p.start,
            len: p.len,
        };
        let fs = Ext4::load(Box::new(reader)).map_err(|err| format!("ext4: {err}"))?;
        let uuid = fs.uuid().to_string();
        Ok(Self { fs, uuid })
    }

    /// The file system UUID (`root=UUID=`, GRUB's `search --fs-uuid`).
    pub fn uuid(&self) -> &str {
        &self.uuid
    }

    /// The size of the regular file at `path` (links followed), `None` when there is none.
    pub fn file_len(&self, path: &str) -> Result<Option<u64>, String> {
        match self.fs.metadata(path) {
            Ok(m) if m.file_type().is_regular_file() => Ok(Some(m.len())),
            Ok(_) => Ok(None),
            Err(err) if not_found(&err) || matches!(err, Ext4Error::NotADirectory) => Ok(None),
            Err(err) => Err(e(path, err)),
        }
    }

    /// Whether `path` exists (any type).
    pub fn exists(&self, path: &str) -> bool {
        self.fs.exists(path).unwrap_or(false)
    }

    /// The text file at `path`, at most `cap` bytes; `None` when there is none.
    pub fn read_text(&self, path: &str, cap: u64) -> Result<Option<String>, String> {
        let Some(len) = self.file_len(path)? else {
            return Ok(None);
        };
        if len > cap {
            return Err(format!("{path}: {len} bytes, more than {cap}"));
        }
        let mut out = Vec::with_capacity(len as usize);
        self.copy(path, cap, &mut out)?;
        String::from_utf8(out)
            .map(Some)
            .map_err(|_| format!("{path}: not UTF-8 text"))
    }

    /// Copies the regular file at `path` (at most `cap` bytes) to `out`; returns its length.
    pub fn copy(&self, path: &str, cap: u64, out: &mut dyn Write) -> Result<u64, String> {
        let mut f = self.fs.open(path).map_err(|err| e(path, err))?;
        let len = f.metadata().len();
        if !f.metadata().file_type().is_regular_file() {
            return Err(format!("{path}: not a regular file"));
        }
        if len > cap {
            return Err(format!("{path}: {len} bytes, more than {cap}"));
        }
        let mut buf = vec![0u8; 256 << 10];
        let mut done = 0u64;
        while done < len {
            let n = f.read_bytes(&mut buf).map_err(|err| e(path, err))?;
            if n == 0 {
                return Err(format!("{path}: ended after {done} of {len} bytes"));
            }
            let n = (n as u64).min(len - done);
            out.write_all(&buf[..n as usize])
                .map_err(|err| format!("{path}: writing: {err}"))?;
            done += n;
        }
        Ok(done)
    }

    /// Names of the regular files in the directory `dir` (at most [`MAX_DIR_ENTRIES`] looked
    /// at), sorted; empty when there is no such directory.
    pub fn list(&self, dir: &str) -> Result<Vec<String>, String> {
        let rd = match self.fs.read_dir(dir) {
            Ok(rd) => rd,
            Err(err) if not_found(&err) || matches!(err, Ext4Error::NotADirectory) => {
                return Ok(Vec::new())
            }
            Err(err) => return Err(e(dir, err)),
        };
        let mut names = Vec::new();
        for entry in rd.take(MAX_DIR_ENTRIES) {
            let entry = entry.map_err(|err| e(dir, err))?;
            let Ok(name) = entry.file_name().as_str().map(str::to_string) else {
                continue;
            };
            if entry.file_type().is_ok_and(|t| t.is_regular_file()) {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sb(log: u32, blocks: u32, per_group: u32) -> [u8; 1024] {
        let mut s = [0u8; 1024];
        s[0x38] = 0x53;
        s[0x39] = 0xef;
        s[0x18..0x1c].copy_from_slice(&log.to_le_bytes());
        s[0x4..0x8].copy_from_slice(&blocks.to_le_bytes());
        s[0x20..0x24].copy_from_slice(&per_group.to_le_bytes());
        s
    }

    #[test]
    fn superblock_bounds() {
        assert!(check_superblock(&sb(2, 1000, 32768), 4096 * 1000).is_ok());
        let e = check_superblock(&sb(2, 1001, 32768), 4096 * 1000).unwrap_err();
        assert!(e.contains("larger than its partition"), "{e}");
        let e = check_superblock(&sb(7, 1, 1), 1 << 30).unwrap_err();
        assert!(e.contains("block size"), "{e}");
        // Found by the bootdisk fuzz target: the message's exponent overflowed.
        let e = check_superblock(&sb(u32::MAX, 1, 1), 1 << 30).unwrap_err();
        assert!(e.contains("2^4294967305"), "{e}");
        let e = check_superblock(&sb(0, 1 << 20, 1), 1 << 30).unwrap_err();
        assert!(e.contains("block groups"), "{e}");
        let e = check_superblock(&sb(0, 10, 0), 1 << 30).unwrap_err();
        assert!(e.contains("per group"), "{e}");
    }

    #[test]
    fn identifies_other_file_systems() {
        let mut d = vec![0u8; 1 << 20];
        d[0..4].copy_from_slice(b"XFSB");
        let p = Partition {
            number: 1,
            start: 0,
            len: 1 << 20,
            type_id: String::new(),
            partuuid: String::new(),
        };
        let disk: SharedDisk = Rc::new(RefCell::new(Box::new(d.clone())));
        assert_eq!(identify(&disk, &p), FsKind::Other(Some("xfs")));
        d[0..4].fill(0);
        d[0x10040..0x10048].copy_from_slice(b"_BHRfS_M");
        let disk: SharedDisk = Rc::new(RefCell::new(Box::new(d)));
        assert_eq!(identify(&disk, &p), FsKind::Other(Some("btrfs")));
    }
}
