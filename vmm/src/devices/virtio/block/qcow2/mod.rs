//! Read-only qcow2 images (versions 2 and 3), as the base of a copy-on-write overlay or as a
//! read-only disk. KubeVirt containerDisks and published cloud images are qcow2.
//!
//! Choice: our own reader, not the `imago` crate. imago reads these images correctly, but it
//! is a general read-write block layer (backing chains, refcounts, external data files,
//! caches sized by its own policy); bounding what a hostile image can make it allocate or do
//! would mean auditing all of it and following every release. A read-only reader needs only
//! the header, the L1/L2 lookup and inflating compressed clusters: a few hundred lines whose
//! every bound is stated here and fuzzed (`fuzz/fuzz_targets/blk_qcow2.rs`).
//!
//! The file is untrusted input:
//! - `header.rs`: every field used is checked when the image is opened (cluster size 512
//!   bytes..2 MiB, virtual size at most 1 TiB, L1 table cluster-aligned, large enough for the
//!   virtual size, at most 32 MiB and inside the file). Refused with a one-line reason:
//!   backing files (a containerDisk is one standalone file), encryption, external data files,
//!   extended L2 entries, the `corrupt` bit, unknown incompatible features, zstd compression
//!   (with the `qemu-img convert` command that makes it zlib). Refcounts, internal snapshots,
//!   header extensions and the `dirty` bit are ignored: nothing here writes the image.
//! - `table.rs`: L1 and L2 entries are read through a cache of at most 128 pages of 4 KiB
//!   (512 KiB), never a whole table; every table and data offset is checked (aligned, inside
//!   the file) when used.
//! - `compressed.rs`: compressed clusters (zlib; raw deflate via `miniz_oxide`) are read into a
//!   buffer of two clusters and inflated to exactly one cluster; the last one inflated is kept.
//! - Memory is bounded by the cluster size (at most 2 MiB), not by anything else in the file;
//!   nothing panics on the file's contents. A damaged table or cluster found while the guest
//!   reads fails that request (virtio-blk IOERR); the disk keeps working.
//!
//! zstd-compressed images are refused, not read: the pure-Rust decoder (`ruzstd`) sizes its
//! buffers by the window size a frame header claims (up to 100 MiB) rather than by the
//! cluster, and the release build aborts on a panic, so a decoder fault on a hostile image
//! would take the VMM down. `qemu-img convert -O qcow2 -c -o compression_type=zlib` (QEMU's
//! default compression) makes such an image readable.
//!
//! The format is detected by the magic number "QFI\xfb" ([`is_qcow2`]), never by the file name.
//! A guest-writable disk is never probed into a qcow2 image: a writable disk that starts with
//! the magic is refused (see `open::open_disk`), so a guest cannot turn its raw disk into one.

mod compressed;
pub mod header;
mod table;

use std::fs::File;
use std::path::Path;

use super::disk::{
    check_range, image_len, pread_exact, DiskBackend, DiskError, GuestSlice, SECTOR_SIZE,
};
use compressed::Inflater;
use header::Header;
use table::{Mapping, Tables};

pub use header::has_magic as is_qcow2;

/// A read-only qcow2 image.
pub struct Qcow2 {
    file: File,
    path: String,
    header: Header,
    capacity: u64,
    tables: Tables,
    inflater: Inflater,
}

impl std::fmt::Debug for Qcow2 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qcow2")
            .field("path", &self.path)
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

/// A run of guest bytes read the same way.
#[derive(Clone, Copy)]
enum Piece {
    Zero,
    /// From this host offset on.
    Data(u64),
}

impl Qcow2 {
    /// Checks the header of `file` (opened read-only, a qcow2 image) and makes the reader.
    pub fn from_file(file: File, path: &Path) -> Result<Self, DiskError> {
        let path = path.display().to_string();
        let file_len = image_len(&file)?;
        let header = header::parse(&file, file_len).map_err(|reason| DiskError::Qcow2 {
            path: path.clone(),
            reason,
        })?;
        Ok(Self {
            capacity: header.size / SECTOR_SIZE * SECTOR_SIZE,
            tables: Tables::new(&header, file_len),
            inflater: Inflater::new(header.cluster_size(), file_len),
            file,
            path,
            header,
        })
    }

    /// The image file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The checked header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    fn damaged(&self, reason: String) -> DiskError {
        DiskError::Qcow2 {
            path: self.path.clone(),
            reason,
        }
    }

    /// Writes `len` guest bytes at `at` (relative to `dst`) as `piece` says.
    fn put(&self, dst: &GuestSlice, at: u64, len: u64, piece: Piece) -> Result<(), DiskError> {
        let sub = dst
            .subslice(at as usize, len as usize)
            .map_err(|e| DiskError::Memory(e.to_string()))?;
        match piece {
            Piece::Zero => fill_zero(&sub),
            // Bytes past end-of-file (the tail of the last cluster) read as zero.
            Piece::Data(host) => Ok(pread_exact(&self.file, host, &sub)?),
        }
    }
}

/// Zeroes `s`.
fn fill_zero(s: &GuestSlice) -> Result<(), DiskError> {
    static ZEROS: [u8; 4096] = [0; 4096];
    let mut done = 0;
    while done < s.len() {
        let n = (s.len() - done).min(ZEROS.len());
        s.subslice(done, n)
            .map_err(|e| DiskError::Memory(e.to_string()))?
            .copy_from(&ZEROS[..n]);
        done += n;
    }
    Ok(())
}

impl DiskBackend for Qcow2 {
    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn read_only(&self) -> bool {
        true
    }

    fn read_at(&mut self, offset: u64, dst: &GuestSlice) -> Result<(), DiskError> {
        let len = dst.len() as u64;
        check_range(offset, len, self.capacity)?;
        let bits = self.header.cluster_bits;
        let cs = 1u64 << bits;
        let end = offset + len;
        let mut pos = offset;
        // The run being gathered: (start relative to `dst`, length, how).
        let mut run: Option<(u64, u64, Piece)> = None;
        while pos < end {
            let in_cluster = pos & (cs - 1);
            let n = (cs - in_cluster).min(end - pos);
            let at = pos - offset;
            let piece = match self.tables.lookup(&self.file, pos >> bits) {
                Ok(Mapping::Zero) => Piece::Zero,
                Ok(Mapping::Data(host)) => Piece::Data(host + in_cluster),
                Ok(Mapping::Compressed { off, len: clen }) => {
                    if let Some((a, l, p)) = run.take() {
                        self.put(dst, a, l, p)?;
                    }
                    let data = match self.inflater.cluster(&self.file, off, clen) {
                        Ok(d) => d,
                        Err(r) => return Err(self.damaged(r)),
                    };
                    let sub = dst
                        .subslice(at as usize, n as usize)
                        .map_err(|e| DiskError::Memory(e.to_string()))?;
                    let from = in_cluster as usize;
                    sub.copy_from(&data[from..from + n as usize]);
                    pos += n;
                    continue;
                }
                Err(r) => return Err(self.damaged(r)),
            };
            run = match (run, piece) {
                (Some((a, l, Piece::Zero)), Piece::Zero) => Some((a, l + n, Piece::Zero)),
                (Some((a, l, Piece::Data(h))), Piece::Data(next)) if h + l == next => {
                    Some((a, l + n, Piece::Data(h)))
                }
                (prev, piece) => {
                    if let Some((a, l, p)) = prev {
                        self.put(dst, a, l, p)?;
                    }
                    Some((at, n, piece))
                }
            };
            pos += n;
        }
        if let Some((a, l, p)) = run {
            self.put(dst, a, l, p)?;
        }
        Ok(())
    }

    fn write_at(&mut self, _offset: u64, _src: &GuestSlice) -> Result<(), DiskError> {
        Err(DiskError::ReadOnly)
    }

    fn flush(&mut self) -> Result<(), DiskError> {
        Ok(())
    }

    fn discard(&mut self, _offset: u64, _len: u64) -> Result<(), DiskError> {
        Err(DiskError::ReadOnly)
    }

    fn write_zeroes(&mut self, _offset: u64, _len: u64) -> Result<(), DiskError> {
        Err(DiskError::ReadOnly)
    }
}

#[cfg(test)]
mod tests;
