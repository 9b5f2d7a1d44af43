//! The qcow2 header (versions 2 and 3): parsed and checked once, when the image is opened.
//!
//! Every field that the reader uses is bounded here; fields it does not use (refcounts,
//! internal snapshots, header extensions) are ignored, since a read-only reader needs neither.
//! A refusal is one line naming what is wrong.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// "QFI\xfb".
pub const MAGIC: [u8; 4] = *b"QFI\xfb";

/// Smallest and largest cluster sizes (QEMU's limits: 512 bytes to 2 MiB).
pub const MIN_CLUSTER_BITS: u32 = 9;
pub const MAX_CLUSTER_BITS: u32 = 21;
/// Largest virtual size accepted (1 TiB), far beyond any cloud image. The size is the file's
/// word, not its length, and a copy-on-write overlay keeps one bit per sector of it in memory
/// (`overlay.rs`): this caps that bitmap at 256 MiB of address space (committed only where
/// the guest writes, or read whole when an existing overlay is reopened).
pub const MAX_VIRTUAL_SIZE: u64 = 1 << 40;
/// Largest L1 table accepted, in bytes (QEMU's limit). The table is never read whole into
/// memory: its entries are read page by page through the table cache.
pub const MAX_L1_BYTES: u64 = 32 << 20;
/// Longest backing file name shown in the refusal (QEMU allows 1023 bytes).
const MAX_BACKING_NAME: u64 = 1023;

/// Length of a version 2 header; a version 3 header is at least 104 bytes.
const V2_HEADER_LEN: u32 = 72;
const V3_MIN_HEADER_LEN: u32 = 104;

/// Incompatible feature bits (version 3).
const INCOMPAT_DIRTY: u64 = 1 << 0;
const INCOMPAT_CORRUPT: u64 = 1 << 1;
const INCOMPAT_DATA_FILE: u64 = 1 << 2;
const INCOMPAT_COMPRESSION: u64 = 1 << 3;
const INCOMPAT_EXTL2: u64 = 1 << 4;

/// How compressed clusters are compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// Raw deflate (RFC 1951, no zlib wrapper), QEMU's default.
    Zlib,
}

/// The fields the reader uses, all checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub version: u32,
    /// log2 of the cluster size, in `MIN_CLUSTER_BITS..=MAX_CLUSTER_BITS`.
    pub cluster_bits: u32,
    /// Virtual (guest-visible) size in bytes, at most [`MAX_VIRTUAL_SIZE`].
    pub size: u64,
    /// Number of L1 entries: enough for `size`, and the table lies inside the file.
    pub l1_size: u64,
    /// File offset of the L1 table, cluster-aligned.
    pub l1_offset: u64,
    pub compression: Compression,
}

impl Header {
    pub fn cluster_size(&self) -> u64 {
        1 << self.cluster_bits
    }

    /// log2 of the number of entries in one L2 table (a cluster of 8-byte entries).
    pub fn l2_bits(&self) -> u32 {
        self.cluster_bits - 3
    }
}

fn be32(h: &[u8], o: usize) -> u32 {
    u32::from_be_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]])
}

fn be64(h: &[u8], o: usize) -> u64 {
    (u64::from(be32(h, o)) << 32) | u64::from(be32(h, o + 4))
}

/// Reads up to `buf.len()` bytes at `off`; returns how many there were before end-of-file.
pub(super) fn read_up_to(file: &File, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        let Some(at) = off.checked_add(done as u64) else {
            break;
        };
        match file.read_at(&mut buf[done..], at) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Whether `file` starts with the qcow2 magic number.
pub fn has_magic(file: &File) -> std::io::Result<bool> {
    let mut m = [0u8; 4];
    Ok(read_up_to(file, &mut m, 0)? == 4 && m == MAGIC)
}

/// The backing file name at `off`, for the refusal message: at most [`MAX_BACKING_NAME`]
/// bytes, only if it lies inside the file, shown escaped.
fn backing_name(file: &File, file_len: u64, off: u64, len: u32) -> String {
    let len = u64::from(len).min(MAX_BACKING_NAME);
    match off.checked_add(len) {
        Some(end) if end <= file_len && len > 0 => {
            let mut buf = vec![0u8; len as usize];
            match read_up_to(file, &mut buf, off) {
                Ok(n) if n == buf.len() => {
                    format!("'{}'", String::from_utf8_lossy(&buf).escape_debug())
                }
                _ => "(unreadable name)".into(),
            }
        }
        _ => "(name outside the file)".into(),
    }
}

/// Parses and checks the header of the qcow2 image `file` (`file_len` bytes long).
pub fn parse(file: &File, file_len: u64) -> Result<Header, String> {
    let mut h = [0u8; V3_MIN_HEADER_LEN as usize + 1];
    let got = read_up_to(file, &mut h, 0).map_err(|e| format!("cannot read the header: {e}"))?;
    if got < V2_HEADER_LEN as usize {
        return Err(format!(
            "the file is {file_len} bytes, too short for a header (truncated image)"
        ));
    }
    if h[0..4] != MAGIC {
        return Err("not a qcow2 image (bad magic number)".into());
    }
    let version = be32(&h, 4);
    if version != 2 && version != 3 {
        return Err(format!(
            "version {version} is not supported (only versions 2 and 3)"
        ));
    }
    let cluster_bits = be32(&h, 20);
    if !(MIN_CLUSTER_BITS..=MAX_CLUSTER_BITS).contains(&cluster_bits) {
        return Err(format!(
            "cluster_bits {cluster_bits} is out of range ({MIN_CLUSTER_BITS}..={MAX_CLUSTER_BITS}: \
             512 bytes to 2 MiB clusters)"
        ));
    }
    let cluster_size = 1u64 << cluster_bits;

    let (mut compression, mut incompat) = (Compression::Zlib, 0u64);
    if version == 3 {
        if got < V3_MIN_HEADER_LEN as usize {
            return Err(format!(
                "the file is {file_len} bytes, too short for a version 3 header (truncated image)"
            ));
        }
        let header_len = be32(&h, 100);
        if header_len < V3_MIN_HEADER_LEN || u64::from(header_len) > cluster_size {
            return Err(format!(
                "header length {header_len} is out of range ({V3_MIN_HEADER_LEN}..={cluster_size})"
            ));
        }
        incompat = be64(&h, 72);
        if incompat & INCOMPAT_COMPRESSION != 0 {
            let ty = if header_len > V3_MIN_HEADER_LEN && got > V3_MIN_HEADER_LEN as usize {
                h[104]
            } else {
                0
            };
            compression = match ty {
                0 => Compression::Zlib,
                1 => {
                    return Err(
                        "zstd-compressed clusters are not supported: convert the image \
                                with qemu-img convert -O qcow2 -c -o compression_type=zlib IN OUT"
                            .into(),
                    )
                }
                t => return Err(format!("unknown compression type {t}")),
            };
        }
    }
    // Refusals in the order a user can act on them: backing file first.
    let backing_off = be64(&h, 8);
    if backing_off != 0 {
        return Err(format!(
            "backing file {} is not supported: a containerDisk is one standalone image; flatten \
             it with qemu-img convert -O qcow2 IN OUT",
            backing_name(file, file_len, backing_off, be32(&h, 16))
        ));
    }
    if incompat & INCOMPAT_CORRUPT != 0 {
        return Err(
            "the image is marked corrupt (incompatible feature 'corrupt'); repair it with \
                    qemu-img check -r all"
                .into(),
        );
    }
    if incompat & INCOMPAT_DATA_FILE != 0 {
        return Err(
            "incompatible feature 'external data file' is not supported: a containerDisk is one \
             standalone image; convert it with qemu-img convert -O qcow2 IN OUT"
                .into(),
        );
    }
    if incompat & INCOMPAT_EXTL2 != 0 {
        return Err(
            "incompatible feature 'extended L2 entries' is not supported; convert the image with \
             qemu-img convert -O qcow2 IN OUT"
                .into(),
        );
    }
    // 'dirty' only says the refcounts may be stale; they are not read here.
    let unknown = incompat & !(INCOMPAT_DIRTY | INCOMPAT_COMPRESSION);
    if unknown != 0 {
        let bits: Vec<String> = (0..64)
            .filter(|b| unknown & (1 << b) != 0)
            .map(|b| b.to_string())
            .collect();
        return Err(format!(
            "unknown incompatible feature bit(s) {} are not supported",
            bits.join(", ")
        ));
    }
    let crypt = be32(&h, 32);
    if crypt != 0 {
        return Err(format!(
            "encrypted images are not supported (encryption method {crypt})"
        ));
    }

    let size = be64(&h, 24);
    if size > MAX_VIRTUAL_SIZE {
        return Err(format!(
            "virtual size {size} bytes is larger than the {MAX_VIRTUAL_SIZE} bytes supported"
        ));
    }
    let l1_size = u64::from(be32(&h, 36));
    let l1_offset = be64(&h, 40);
    // One L1 entry maps an L2 table: 2^(cluster_bits - 3) clusters.
    let per_l1 = 1u64 << (2 * cluster_bits - 3);
    let needed = size.div_ceil(per_l1);
    if l1_size < needed {
        return Err(format!(
            "L1 table of {l1_size} entries is too small for a virtual size of {size} bytes \
             ({needed} needed)"
        ));
    }
    let l1_bytes = l1_size * 8;
    if l1_bytes > MAX_L1_BYTES {
        return Err(format!(
            "L1 table of {l1_size} entries is larger than {MAX_L1_BYTES} bytes"
        ));
    }
    if l1_size > 0 {
        if l1_offset == 0 || !l1_offset.is_multiple_of(cluster_size) {
            return Err(format!(
                "L1 table offset {l1_offset:#x} is not a non-zero multiple of the cluster size"
            ));
        }
        match l1_offset.checked_add(l1_bytes) {
            Some(end) if end <= file_len => {}
            _ => {
                return Err(format!(
                    "L1 table at {l1_offset:#x} ({l1_bytes} bytes) lies beyond the end of the \
                     file ({file_len} bytes; truncated or damaged image)"
                ))
            }
        }
    }
    Ok(Header {
        version,
        cluster_bits,
        size,
        l1_size,
        l1_offset,
        compression,
    })
}
