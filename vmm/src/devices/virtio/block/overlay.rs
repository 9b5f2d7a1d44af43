//! Copy-on-write overlay for stateless VMIs.
//!
//! Choice: a sparse per-VM overlay file with a persisted allocation bitmap
//! (no qcow2 overlay). Reasons: no extra crate, trivially auditable, data moves
//! with `pread`/`pwrite` straight into guest memory, and the base stays a
//! read-only image that any number of VMs can share: a raw file, or a qcow2 image
//! (`qcow2/`, chosen by its magic number; the guest sees its virtual size).
//!
//! - The base image is opened `O_RDONLY` with a shared `flock`: it is never
//!   written, and a VM that wants to write it (`path=` without overlay)
//!   cannot lock it while overlay users exist.
//! - The overlay file is opened read-write with an exclusive `flock`, so two
//!   VMs can never share one overlay (and so never see each other's writes).
//! - Layout of the overlay file:
//!   `[0, 4 KiB)` header (magic `MVOVRLY1`, version, capacity, base length,
//!   bitmap and data offsets, the base's identity), `[4 KiB, data_offset)` allocation bitmap (one
//!   bit per 512-byte sector, 1 = sector lives in the overlay),
//!   `[data_offset, data_offset + capacity)` the sectors, sparse; data_offset
//!   is 1 MiB-aligned so hole punching works on whole file-system blocks.
//! - Reads take each sector from the overlay if its bit is set, else from
//!   the base. Writes go to the overlay; a write covering only part of a
//!   sector not yet in the overlay first copies that sector up from the base.
//!   Discard and write-zeroes punch a hole in the overlay and set the bits; on a
//!   file system that cannot punch holes a discard is ignored (it is a hint) and
//!   write-zeroes is reported unsupported (nothing is written).
//! - Durability: the bitmap is updated in memory at once and persisted on
//!   FLUSH as `fdatasync(data)`, write dirty bitmap pages, `fdatasync` again,
//!   so a crash never leaves a bit set for data that is not on disk. Unflushed
//!   writes may be lost on a crash (as on a real disk). Dropping the overlay
//!   flushes it the same way, in the same order.
//! - The overlay belongs to one base: the header records the base's length,
//!   device and inode numbers and modification time (version 2). Reopening
//!   an overlay ([`Overlay::open`]) refuses a base that differs in any of them;
//!   a snapshot's overlay copied for a restore ([`Overlay::restore`]) may meet
//!   the same image through another file (another node, another mount), so
//!   there the length and modification time must match and the header then
//!   takes this base's device and inode. A version 1 overlay (no identity)
//!   is checked by capacity only and upgraded. A non-empty file that is not
//!   an overlay is refused, never overwritten.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::disk::{
    check_range, fdatasync, image_len, lock_file, open_image, pread_exact, punch_hole, pwrite_all,
    read_into, DiskBackend, DiskError, GuestSlice, SECTOR_SIZE,
};
use super::open::read_only_backend;

const MAGIC: &[u8; 8] = b"MVOVRLY1";
/// 2: the header records the base's identity ([`BaseIdentity`]).
const VERSION: u32 = 2;
const HEADER_SIZE: u64 = 4096;
const DATA_ALIGN: u64 = 1 << 20;
const BITMAP_PAGE: usize = 4096;

/// A read-only base image (raw or qcow2) plus a per-VM copy-on-write overlay file.
pub struct Overlay {
    /// Its capacity is the overlay's.
    base: Box<dyn DiskBackend>,
    overlay: File,
    path: String,
    capacity: u64,
    bitmap_offset: u64,
    data_offset: u64,
    /// One bit per sector.
    bitmap: Vec<u8>,
    /// Bitmap pages changed since the last flush.
    dirty: Vec<bool>,
    /// Cleared once the file system answered `EOPNOTSUPP` to a hole punch.
    can_punch: bool,
}

/// Which base image an overlay belongs to (header bytes 56..88 of a version 2 overlay).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BaseIdentity {
    /// Length of the base in bytes.
    pub len: u64,
    pub dev: u64,
    pub ino: u64,
    pub mtime_sec: i64,
    pub mtime_nsec: u32,
}

impl std::fmt::Debug for Overlay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Overlay")
            .field("path", &self.path)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl BaseIdentity {
    fn of(base: &File) -> std::io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let m = base.metadata()?;
        Ok(Self {
            len: image_len(base)?,
            dev: m.dev(),
            ino: m.ino(),
            mtime_sec: m.mtime(),
            mtime_nsec: m.mtime_nsec() as u32,
        })
    }

    /// Same content as far as a restore can tell: length and modification time.
    fn same_image(&self, o: &Self) -> bool {
        self.len == o.len && self.mtime_sec == o.mtime_sec && self.mtime_nsec == o.mtime_nsec
    }
}

impl std::fmt::Display for BaseIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} bytes, device {:#x} inode {}, modified {}.{:09}",
            self.len, self.dev, self.ino, self.mtime_sec, self.mtime_nsec
        )
    }
}

/// How [`Overlay::with_file`] checks an existing overlay's base.
#[derive(Clone, Copy, PartialEq, Eq)]
enum BaseCheck {
    /// Reopening: the very same file (length, device, inode, modification time).
    SameFile,
    /// A snapshot's overlay: the same image (length, modification time), maybe another file.
    SameImage,
}
fn round_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

impl Overlay {
    /// Open `base` read-only and `overlay_path` (created if missing)
    /// read-write.
    pub fn open(base_path: &Path, overlay_path: &Path) -> Result<Self, DiskError> {
        let overlay = open_overlay_file(overlay_path)?;
        Self::with_file(base_path, overlay, overlay_path, BaseCheck::SameFile)
    }

    /// Open `base` read-only and make `overlay_path` a copy of the overlay `saved` (a snapshot's
    /// copy of this disk's overlay; sparse, as `saved` is). The copy is made only once the
    /// overlay file is locked, so an overlay another VM uses is never overwritten.
    pub fn restore(base_path: &Path, overlay_path: &Path, saved: &File) -> Result<Self, DiskError> {
        let overlay = open_overlay_file(overlay_path)?;
        overlay.set_len(0)?;
        copy_sparse(saved, &overlay)?;
        Self::with_file(base_path, overlay, overlay_path, BaseCheck::SameImage)
    }

    /// Checks (or, when empty, initialises) the locked `overlay` against the base image.
    fn with_file(
        base_path: &Path,
        overlay: File,
        overlay_path: &Path,
        check: BaseCheck,
    ) -> Result<Self, DiskError> {
        let base = open_image(base_path, true)?;
        let ident = BaseIdentity::of(&base)?;
        let path = overlay_path.display().to_string();
        let err = |reason: String| DiskError::Overlay {
            path: path.clone(),
            reason,
        };
        // Refuse an overlay that is the base itself (same inode).
        {
            use std::os::unix::fs::MetadataExt;
            let (b, o) = (base.metadata()?, overlay.metadata()?);
            if b.dev() == o.dev() && b.ino() == o.ino() {
                return Err(err("overlay is the base image".into()));
            }
        }
        // The guest sees the base's capacity: a raw file's length, a qcow2 image's virtual size.
        let base = read_only_backend(base, base_path)?;
        let capacity = base.capacity();
        let sectors = capacity / SECTOR_SIZE;
        let bitmap_len = round_up(sectors.div_ceil(8), BITMAP_PAGE as u64);
        let bitmap_offset = HEADER_SIZE;
        let data_offset = round_up(bitmap_offset + bitmap_len, DATA_ALIGN);
        let existing = overlay.metadata()?.len();
        let mut me = Self {
            base,
            overlay,
            path: path.clone(),
            capacity,
            bitmap_offset,
            data_offset,
            bitmap: vec![0; bitmap_len as usize],
            dirty: vec![false; (bitmap_len as usize) / BITMAP_PAGE],
            can_punch: true,
        };
        if existing == 0 {
            me.write_header(&ident)?;
            me.overlay.set_len(data_offset + capacity)?;
            fdatasync(&me.overlay)?;
        } else {
            let mut magic = [0u8; 8];
            me.overlay
                .read_exact_at(&mut magic, 0)
                .map_err(|_| err("too short for a header".into()))?;
            if &magic != MAGIC {
                return Err(err(
                    "not a microvirt overlay (bad magic); refusing to overwrite".into(),
                ));
            }
            let mut h = [0u8; 88];
            me.overlay
                .read_exact_at(&mut h, 0)
                .map_err(|_| err("too short for a header".into()))?;
            let u32_at = |o: usize| u32::from_le_bytes(h[o..o + 4].try_into().expect("4 bytes"));
            let u64_at = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().expect("8 bytes"));
            let version = u32_at(8);
            if version != 1 && version != VERSION {
                return Err(err(format!("unknown version {version}")));
            }
            let (cap, blen, boff, doff) = (u64_at(16), u64_at(32), u64_at(40), u64_at(48));
            if cap != capacity || blen != bitmap_len || boff != bitmap_offset || doff != data_offset
            {
                return Err(err(format!(
                    "made for a base of {cap} bytes, this base has {capacity} bytes"
                )));
            }
            if version == 1 {
                log::warn!(
                    "overlay {path}: version 1 records no base identity; only the capacity was \
                     checked (upgraded to version {VERSION})"
                );
                me.write_header(&ident)?;
            } else {
                let made_for = BaseIdentity {
                    len: u64_at(24),
                    dev: u64_at(56),
                    ino: u64_at(64),
                    mtime_sec: u64_at(72) as i64,
                    mtime_nsec: u32_at(80),
                };
                let ok = match check {
                    BaseCheck::SameFile => made_for == ident,
                    BaseCheck::SameImage => made_for.same_image(&ident),
                };
                if !ok {
                    return Err(err(format!(
                        "belongs to another base image: made for {made_for}, {} is {ident}; \
                         refusing it (remove the overlay to start over from this base)",
                        base_path.display()
                    )));
                }
                if made_for != ident {
                    me.write_header(&ident)?;
                }
            }
            me.overlay
                .read_exact_at(&mut me.bitmap, bitmap_offset)
                .map_err(|e| err(format!("cannot read bitmap: {e}")))?;
        }
        Ok(me)
    }

    fn write_header(&self, base: &BaseIdentity) -> Result<(), DiskError> {
        let mut h = vec![0u8; HEADER_SIZE as usize];
        h[0..8].copy_from_slice(MAGIC);
        h[8..12].copy_from_slice(&VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&(SECTOR_SIZE as u32).to_le_bytes());
        h[16..24].copy_from_slice(&self.capacity.to_le_bytes());
        h[24..32].copy_from_slice(&base.len.to_le_bytes());
        h[32..40].copy_from_slice(&(self.bitmap.len() as u64).to_le_bytes());
        h[40..48].copy_from_slice(&self.bitmap_offset.to_le_bytes());
        h[48..56].copy_from_slice(&self.data_offset.to_le_bytes());
        h[56..64].copy_from_slice(&base.dev.to_le_bytes());
        h[64..72].copy_from_slice(&base.ino.to_le_bytes());
        h[72..80].copy_from_slice(&base.mtime_sec.to_le_bytes());
        h[80..84].copy_from_slice(&base.mtime_nsec.to_le_bytes());
        self.overlay.write_all_at(&h, 0)?;
        Ok(())
    }

    fn allocated(&self, sector: u64) -> bool {
        self.bitmap[(sector / 8) as usize] & (1 << (sector % 8)) != 0
    }

    fn set_allocated(&mut self, first: u64, count: u64) {
        for s in first..first + count {
            let byte = (s / 8) as usize;
            self.bitmap[byte] |= 1 << (s % 8);
            self.dirty[byte / BITMAP_PAGE] = true;
        }
    }

    /// Writes the overlay's complete, flushed contents (header, bitmap, data) to `out`, as a
    /// sparse copy. Uses only the descriptors it is given.
    pub fn save_to(&mut self, out: &File) -> Result<u64, DiskError> {
        self.flush()?;
        out.set_len(0)?;
        Ok(copy_sparse(&self.overlay, out)?)
    }

    /// Number of sectors stored in the overlay.
    pub fn allocated_sectors(&self) -> u64 {
        self.bitmap.iter().map(|b| u64::from(b.count_ones())).sum()
    }

    fn persist_bitmap(&mut self) -> Result<(), DiskError> {
        for (i, d) in self.dirty.iter_mut().enumerate() {
            if *d {
                let page = &self.bitmap[i * BITMAP_PAGE..(i + 1) * BITMAP_PAGE];
                self.overlay
                    .write_all_at(page, self.bitmap_offset + (i * BITMAP_PAGE) as u64)?;
                *d = false;
            }
        }
        Ok(())
    }

    /// Copy `sector` from the base into the overlay (before a partial write).
    fn copy_up(&mut self, sector: u64) -> Result<(), DiskError> {
        let mut buf = [0u8; SECTOR_SIZE as usize];
        let off = sector * SECTOR_SIZE;
        read_into(self.base.as_mut(), off, &mut buf)?;
        self.overlay.write_all_at(&buf, self.data_offset + off)?;
        self.set_allocated(sector, 1);
        Ok(())
    }
}

/// Opens (creating it when missing) and exclusively locks an overlay file.
fn open_overlay_file(overlay_path: &Path) -> Result<File, DiskError> {
    let overlay = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(overlay_path)
        .map_err(|source| DiskError::Open {
            path: overlay_path.display().to_string(),
            source,
        })?;
    lock_file(&overlay, overlay_path, true)?;
    Ok(overlay)
}

/// Copies `src` into the empty file `dst`: only `src`'s data extents are written, holes stay
/// holes; `dst` ends up as long as `src`. Returns the bytes copied.
pub fn copy_sparse(src: &File, dst: &File) -> std::io::Result<u64> {
    let len = src.metadata()?.len();
    let extents = crate::vstate::memory::data_extents(src, 0, len)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut copied = 0u64;
    for (start, end) in extents {
        let end = end.min(len);
        let mut pos = start;
        while pos < end {
            let n = ((end - pos) as usize).min(buf.len());
            read_full_at(src, &mut buf[..n], pos)?;
            dst.write_all_at(&buf[..n], pos)?;
            pos += n as u64;
            copied += n as u64;
        }
    }
    dst.set_len(len)?;
    Ok(copied)
}

/// `read_exact_at`, but bytes past end-of-file read as zero.
fn read_full_at(f: &File, buf: &mut [u8], off: u64) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], off + done as u64) {
            Ok(0) => {
                buf[done..].fill(0);
                break;
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl DiskBackend for Overlay {
    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn read_only(&self) -> bool {
        false
    }

    fn read_at(&mut self, offset: u64, dst: &GuestSlice) -> Result<(), DiskError> {
        let len = dst.len() as u64;
        check_range(offset, len, self.capacity)?;
        let end = offset + len;
        let mut pos = offset;
        while pos < end {
            let sector = pos / SECTOR_SIZE;
            let alloc = self.allocated(sector);
            let mut run_end = (sector + 1) * SECTOR_SIZE;
            while run_end < end && self.allocated(run_end / SECTOR_SIZE) == alloc {
                run_end += SECTOR_SIZE;
            }
            let run_end = run_end.min(end);
            let sub = dst
                .subslice((pos - offset) as usize, (run_end - pos) as usize)
                .map_err(|e| DiskError::Memory(e.to_string()))?;
            if alloc {
                pread_exact(&self.overlay, self.data_offset + pos, &sub)?;
            } else {
                self.base.read_at(pos, &sub)?;
            }
            pos = run_end;
        }
        Ok(())
    }

    fn write_at(&mut self, offset: u64, src: &GuestSlice) -> Result<(), DiskError> {
        let len = src.len() as u64;
        check_range(offset, len, self.capacity)?;
        let end = offset + len;
        let mut pos = offset;
        while pos < end {
            let sector = pos / SECTOR_SIZE;
            let in_sector = pos % SECTOR_SIZE;
            let n = if in_sector == 0 && end - pos >= SECTOR_SIZE {
                // Whole sectors: write straight through.
                (end - pos) / SECTOR_SIZE * SECTOR_SIZE
            } else {
                if !self.allocated(sector) {
                    self.copy_up(sector)?;
                }
                (SECTOR_SIZE - in_sector).min(end - pos)
            };
            let sub = src
                .subslice((pos - offset) as usize, n as usize)
                .map_err(|e| DiskError::Memory(e.to_string()))?;
            pwrite_all(&self.overlay, self.data_offset + pos, &sub)?;
            if in_sector == 0 && n >= SECTOR_SIZE {
                self.set_allocated(sector, n / SECTOR_SIZE);
            }
            pos += n;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), DiskError> {
        fdatasync(&self.overlay)?;
        if self.dirty.iter().any(|&d| d) {
            self.persist_bitmap()?;
            fdatasync(&self.overlay)?;
        }
        Ok(())
    }

    fn discard(&mut self, offset: u64, len: u64) -> Result<(), DiskError> {
        match self.write_zeroes(offset, len) {
            // A hint: where holes cannot be punched, the data simply stays.
            Err(DiskError::Unsupported(_)) => Ok(()),
            r => r,
        }
    }

    fn save_overlay(&mut self, out: &File) -> Result<u64, DiskError> {
        self.save_to(out)
    }

    fn write_zeroes(&mut self, offset: u64, len: u64) -> Result<(), DiskError> {
        check_range(offset, len, self.capacity)?;
        if !offset.is_multiple_of(SECTOR_SIZE) || !len.is_multiple_of(SECTOR_SIZE) {
            return Err(DiskError::OutOfRange {
                offset,
                len,
                capacity: self.capacity,
            });
        }
        if !self.can_punch || !punch_hole(&self.overlay, self.data_offset + offset, len)? {
            if self.can_punch {
                log::info!(
                    "overlay {}: the file system cannot punch holes; discards are ignored and \
                     write-zeroes is reported unsupported",
                    self.path
                );
                self.can_punch = false;
            }
            return Err(DiskError::Unsupported("punching a hole in the overlay"));
        }
        self.set_allocated(offset / SECTOR_SIZE, len / SECTOR_SIZE);
        Ok(())
    }
}

impl Drop for Overlay {
    /// A [`flush`](DiskBackend::flush): data synced before the bitmap that points at it.
    fn drop(&mut self) {
        if let Err(e) = self.flush() {
            crate::guest_log!(
                log::Level::Error,
                "overlay {}: cannot flush on close: {e}",
                self.path
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::test_utils::{mem, retry_locked, temp_image, TempPath};
    use std::os::unix::fs::FileExt;
    use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

    fn read(
        d: &mut Overlay,
        m: &crate::vstate::memory::GuestMemoryMmap,
        off: u64,
        len: usize,
    ) -> Vec<u8> {
        let s = m.get_slice(GuestAddress(0x10_0000), len).unwrap();
        d.read_at(off, &s).unwrap();
        let mut v = vec![0; len];
        s.copy_to(&mut v);
        v
    }

    fn write(d: &mut Overlay, m: &crate::vstate::memory::GuestMemoryMmap, off: u64, data: &[u8]) {
        m.write_slice(data, GuestAddress(0x20_0000)).unwrap();
        let s = m.get_slice(GuestAddress(0x20_0000), data.len()).unwrap();
        d.write_at(off, &s).unwrap();
    }

    #[test]
    fn base_untouched_and_two_overlays_isolated_and_persistent() {
        let base = temp_image(1 << 20, 0x5a);
        let before = std::fs::read(&base.0).unwrap();
        let (o1, o2) = (TempPath::new("ovl1"), TempPath::new("ovl2"));
        let m = mem();
        {
            let mut a = Overlay::open(&base.0, &o1.0).unwrap();
            let mut b = Overlay::open(&base.0, &o2.0).unwrap();
            write(&mut a, &m, 4096, &[1u8; 8192]);
            write(&mut b, &m, 4096, &[2u8; 512]);
            // Unaligned partial-sector write: copy-up keeps the rest of the sector.
            write(&mut a, &m, 100_003, &[9u8; 10]);
            a.flush().unwrap();
            b.flush().unwrap();
            assert_eq!(read(&mut a, &m, 4096, 8192), vec![1u8; 8192]);
            let rb = read(&mut b, &m, 4096, 1024);
            assert_eq!(&rb[..512], &[2u8; 512]);
            assert_eq!(&rb[512..], &[0x5a; 512]);
            let p = read(&mut a, &m, 99_840, 512); // sector 195 holds offset 100_003
            assert_eq!(&p[..163], &[0x5a; 163][..]);
            assert_eq!(&p[163..173], &[9u8; 10]);
            assert_eq!(&p[173..], &[0x5a; 339][..]);
            // The same overlay cannot be opened twice.
            assert!(matches!(
                Overlay::open(&base.0, &o1.0),
                Err(DiskError::Locked { .. })
            ));
            // Nor can the base be opened for writing meanwhile.
            assert!(matches!(
                super::super::disk::RawFile::open(&base.0, false),
                Err(DiskError::Locked { .. })
            ));
            a.write_zeroes(0, 1024).unwrap();
            assert_eq!(read(&mut a, &m, 0, 1024), vec![0u8; 1024]);
        }
        assert_eq!(
            std::fs::read(&base.0).unwrap(),
            before,
            "base image modified"
        );
        // Reopen: the bitmap was persisted.
        let mut a = retry_locked(|| Overlay::open(&base.0, &o1.0)).unwrap();
        assert_eq!(read(&mut a, &m, 4096, 8192), vec![1u8; 8192]);
        assert_eq!(read(&mut a, &m, 0, 1024), vec![0u8; 1024]);
        assert_eq!(read(&mut a, &m, 200_000, 512), vec![0x5a; 512]);
        // Sectors 0-1, 8-23 and 195.
        assert_eq!(a.allocated_sectors(), 2 + 16 + 1);
        // The overlay file is sparse: far smaller on disk than the capacity.
        use std::os::unix::fs::MetadataExt;
        assert!(std::fs::metadata(&o1.0).unwrap().blocks() * 512 < 1 << 20);
    }

    /// Sets `path`'s modification time to `sec`.`nsec`.
    fn set_mtime(path: &Path, sec: i64, nsec: i64) {
        let f = OpenOptions::new().write(true).open(path).unwrap();
        let t = [
            libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_OMIT,
            },
            libc::timespec {
                tv_sec: sec,
                tv_nsec: nsec,
            },
        ];
        // SAFETY: futimens on an owned fd with a two-element timespec array.
        assert_eq!(
            unsafe { libc::futimens(std::os::fd::AsRawFd::as_raw_fd(&f), t.as_ptr()) },
            0
        );
    }

    fn refused(r: Result<Overlay, DiskError>) -> String {
        match r {
            Err(e @ DiskError::Overlay { .. }) => e.to_string(),
            Err(e) => panic!("other error: {e}"),
            Ok(_) => panic!("accepted"),
        }
    }

    #[test]
    fn an_overlay_belongs_to_its_base() {
        let m = mem();
        let base = temp_image(256 * 1024, 0x5a);
        set_mtime(&base.0, 1_700_000_000, 123);
        let o = TempPath::new("ovl");
        {
            let mut a = Overlay::open(&base.0, &o.0).unwrap();
            write(&mut a, &m, 0, &[3u8; 512]);
        }
        // Another image of the same size (what `cp` of another VM's disk would give).
        let other = temp_image(256 * 1024, 0x5a);
        set_mtime(&other.0, 1_700_000_000, 123);
        let e = refused(retry_locked(|| Overlay::open(&other.0, &o.0)));
        assert!(e.contains("belongs to another base image"), "{e}");
        assert!(e.contains("inode"), "{e}");
        // The base itself, modified since (its mtime moved).
        set_mtime(&base.0, 1_700_000_001, 123);
        let e = refused(retry_locked(|| Overlay::open(&base.0, &o.0)));
        assert!(e.contains("modified 1700000000.000000123"), "{e}");
        set_mtime(&base.0, 1_700_000_000, 123);
        let mut a = retry_locked(|| Overlay::open(&base.0, &o.0)).unwrap();
        assert_eq!(read(&mut a, &m, 0, 512), vec![3u8; 512]);

        // A snapshot's copy restored over the same image through another file: accepted, and
        // the overlay now belongs to that file.
        let saved = TempPath::new("saved");
        a.save_to(&File::create(&saved.0).unwrap()).unwrap();
        drop(a);
        let o2 = TempPath::new("ovl2");
        let mut r = Overlay::restore(&other.0, &o2.0, &File::open(&saved.0).unwrap()).unwrap();
        assert_eq!(read(&mut r, &m, 0, 1024)[..512], [3u8; 512]);
        assert_eq!(read(&mut r, &m, 512, 512), vec![0x5a; 512]);
        drop(r);
        assert!(retry_locked(|| Overlay::open(&other.0, &o2.0)).is_ok());
        refused(retry_locked(|| Overlay::open(&base.0, &o2.0)));
        // ... but not over an image modified at another time or of another length.
        set_mtime(&other.0, 1_600_000_000, 0);
        let o3 = TempPath::new("ovl3");
        let e = refused(Overlay::restore(
            &other.0,
            &o3.0,
            &File::open(&saved.0).unwrap(),
        ));
        assert!(e.contains("belongs to another base image"), "{e}");
        let longer = temp_image(256 * 1024 + 7, 0x5a);
        set_mtime(&longer.0, 1_700_000_000, 123);
        let e = refused(Overlay::restore(
            &longer.0,
            &o3.0,
            &File::open(&saved.0).unwrap(),
        ));
        assert!(e.contains("262151 bytes"), "{e}");
    }

    #[test]
    fn a_version_1_overlay_is_checked_by_capacity_and_upgraded() {
        let m = mem();
        let base = temp_image(64 * 1024, 0x22);
        let o = TempPath::new("ovl");
        {
            let mut a = Overlay::open(&base.0, &o.0).unwrap();
            write(&mut a, &m, 512, &[9u8; 512]);
        }
        // Make it what version 1 wrote: no identity.
        let f = OpenOptions::new().write(true).open(&o.0).unwrap();
        f.write_all_at(&1u32.to_le_bytes(), 8).unwrap();
        f.write_all_at(&[0u8; 32], 56).unwrap();
        drop(f);
        let mut a = retry_locked(|| Overlay::open(&base.0, &o.0)).unwrap();
        assert_eq!(read(&mut a, &m, 512, 512), vec![9u8; 512]);
        drop(a);
        let mut h = [0u8; 88];
        File::open(&o.0).unwrap().read_exact_at(&mut h, 0).unwrap();
        assert_eq!(u32::from_le_bytes(h[8..12].try_into().unwrap()), VERSION);
        assert_ne!(&h[56..88], &[0u8; 32], "identity recorded");
    }

    /// Dropping an overlay with unflushed writes syncs the data before writing the bitmap that
    /// points at it, and syncs again after (what FLUSH does), as `strace` of a child process
    /// shows.
    #[test]
    fn drop_syncs_data_before_the_bitmap() {
        const CHILD: &str = "MICROVIRT_OVERLAY_DROP_CHILD";
        if let Some(dir) = std::env::var_os(CHILD) {
            // The traced child: create, write one whole sector (no copy-up), drop.
            let dir = std::path::PathBuf::from(dir);
            let m = mem();
            let mut a = Overlay::open(&dir.join("base.img"), &dir.join("vm.ovl")).unwrap();
            write(&mut a, &m, 4096, &[5u8; 4096]);
            drop(a);
            return;
        }
        let dir = crate::devices::virtio::test_utils::TempDir::new("ovl-strace");
        std::fs::write(dir.join("base.img"), vec![1u8; 64 * 1024]).unwrap();
        let log = dir.join("strace.log");
        let out = std::process::Command::new("strace")
            .args(["-f", "-qq", "-e", "trace=pwrite64,fdatasync,fsync", "-o"])
            .arg(&log)
            .arg(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "devices::virtio::block::overlay::tests::drop_syncs_data_before_the_bitmap",
                "--test-threads=1",
            ])
            .env(CHILD, dir.path())
            .output()
            .expect("run strace (Debian package strace)");
        assert!(
            out.status.success(),
            "child: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let trace = std::fs::read_to_string(&log).unwrap();
        // What happened to the overlay after the guest's data was written (at the data offset,
        // 1 MiB here): "S" for a sync, "B" for a bitmap write (at 4096), "D" for data.
        let mut events = String::new();
        let mut seen_data = false;
        for l in trace.lines() {
            let call = l.split_once(' ').map_or(l, |(_, c)| c).trim_start();
            if call.starts_with("pwrite64(") {
                let off: u64 = call
                    .rsplit_once(", ")
                    .and_then(|(_, r)| r.split(')').next())
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or_else(|| panic!("pwrite64 offset in {l:?}"));
                if off >= DATA_ALIGN {
                    seen_data = true;
                    events.push('D');
                } else if seen_data && off >= HEADER_SIZE {
                    events.push('B');
                }
            } else if seen_data && (call.starts_with("fdatasync(") || call.starts_with("fsync(")) {
                events.push('S');
            }
        }
        assert_eq!(events, "DSBS", "overlay writes and syncs:\n{trace}");
    }

    #[test]
    fn refuses_foreign_files_and_mismatched_bases() {
        let base = temp_image(64 * 1024, 0);
        let other = temp_image(4096, 7);
        assert!(matches!(
            Overlay::open(&base.0, &other.0),
            Err(DiskError::Overlay { .. })
        ));
        assert_eq!(std::fs::read(&other.0).unwrap(), vec![7; 4096]);
        let o = TempPath::new("ovl");
        drop(Overlay::open(&base.0, &o.0).unwrap());
        let bigger = temp_image(128 * 1024, 0);
        assert!(matches!(
            retry_locked(|| Overlay::open(&bigger.0, &o.0)),
            Err(DiskError::Overlay { .. })
        ));
        assert!(Overlay::open(&base.0, &base.0).is_err());
    }
}
