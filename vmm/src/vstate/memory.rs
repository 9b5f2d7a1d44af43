//! Guest memory and what backs it.
//!
//! - A freshly built VM gets one **memfd** holding all RAM regions back to back (region `i` at
//!   file offset `sum(len[..i])`), mapped `MAP_SHARED`. The kernel allocates its pages only when
//!   the guest (or a device) touches them, so `SEEK_DATA`/`SEEK_HOLE` on the memfd list exactly
//!   the touched pages: a snapshot writes those and nothing else ([`GuestRam::dump`]).
//! - A restored VM maps the snapshot's memory file **`MAP_PRIVATE`**, opened read-only: pages
//!   load from the page cache on first access and are shared by every VM restored from the same
//!   file; a guest write copies the page into the VM's own anonymous memory. The file is never
//!   written.
//!
//! Every mapping is made by [`map_region`], the one place for per-mapping advice (e.g.
//! `madvise(MADV_HUGEPAGE)`).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{
    FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryRegion, GuestRegionMmap, MmapRegion,
};

/// The guest memory type used across the VMM.
pub type GuestMemoryMmap = vm_memory::GuestMemoryMmap<()>;

/// Host page size the dump works in.
pub const PAGE_SIZE: u64 = 4096;

#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("memfd_create for guest RAM: {0}")]
    Memfd(io::Error),
    #[error("sizing guest RAM to {bytes} bytes: {source}")]
    Size { bytes: u64, source: io::Error },
    #[error("mapping guest RAM region at {addr:#x} ({len} bytes): {detail}")]
    Map { addr: u64, len: u64, detail: String },
    #[error("guest RAM regions: {0}")]
    Regions(String),
    #[error("memory file is {actual} bytes, the snapshot's guest RAM is {expected} bytes (truncated or not this snapshot's file)")]
    FileSize { expected: u64, actual: u64 },
    #[error("reading the memory file size: {0}")]
    Stat(io::Error),
    #[error("writing guest memory: {0}")]
    Write(io::Error),
    #[error("finding touched guest pages: {0}")]
    Scan(io::Error),
}

/// What backs guest RAM.
#[derive(Debug)]
pub enum Backing {
    /// A fresh VM: a memfd, mapped shared.
    Memfd(Arc<File>),
    /// A restored VM: the snapshot's memory file (read-only), mapped private.
    SnapshotFile(Arc<File>),
}

/// Guest RAM: the mappings KVM and the devices use, and the file behind them.
#[derive(Debug)]
pub struct GuestRam {
    mem: GuestMemoryMmap,
    backing: Backing,
    size: u64,
}

/// What [`GuestRam::dump`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DumpStats {
    /// Guest RAM size (the memory file's length; only touched pages hold data).
    pub ram_bytes: u64,
    /// Pages the guest touched (or that the restored file already held), looked at.
    pub candidate_bytes: u64,
    /// Bytes written to the memory file (touched pages that are not all zeroes).
    pub written_bytes: u64,
}

fn total_len(ranges: &[(GuestAddress, usize)]) -> u64 {
    ranges.iter().map(|r| r.1 as u64).sum()
}

/// Maps `len` bytes of `file` at `offset` with `flags` (`MAP_SHARED` or `MAP_PRIVATE`) for the
/// guest region at `addr`.
fn map_region(
    file: &Arc<File>,
    offset: u64,
    addr: GuestAddress,
    len: usize,
    flags: i32,
) -> Result<GuestRegionMmap<()>, MemoryError> {
    let map_err = |detail: String| MemoryError::Map {
        addr: addr.0,
        len: len as u64,
        detail,
    };
    let region: MmapRegion<()> = MmapRegionBuilder::new(len)
        .with_file_offset(FileOffset::from_arc(file.clone(), offset))
        .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
        .with_mmap_flags(flags | libc::MAP_NORESERVE)
        .build()
        .map_err(|e| map_err(e.to_string()))?;
    GuestRegionMmap::new(region, addr).ok_or_else(|| map_err("address overflow".into()))
}

fn collect(
    file: &Arc<File>,
    ranges: &[(GuestAddress, usize)],
    flags: i32,
) -> Result<GuestMemoryMmap, MemoryError> {
    let mut offset = 0u64;
    let mut regions = Vec::with_capacity(ranges.len());
    for &(addr, len) in ranges {
        regions.push(map_region(file, offset, addr, len, flags)?);
        offset += len as u64;
    }
    GuestMemoryMmap::from_regions(regions).map_err(|e| MemoryError::Regions(e.to_string()))
}

impl GuestRam {
    /// Fresh guest RAM for `ranges` (sorted by address): one memfd, mapped shared.
    pub fn create(ranges: &[(GuestAddress, usize)]) -> Result<Self, MemoryError> {
        let size = total_len(ranges);
        // SAFETY: memfd_create takes a NUL-terminated name and flags; it returns a new fd or -1.
        let fd = unsafe { libc::memfd_create(c"microvm-guest-ram".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(MemoryError::Memfd(io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just returned by memfd_create and nothing else owns it.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(size).map_err(|source| MemoryError::Size {
            bytes: size,
            source,
        })?;
        let file = Arc::new(file);
        let mem = collect(&file, ranges, libc::MAP_SHARED)?;
        Ok(Self {
            mem,
            backing: Backing::Memfd(file),
            size,
        })
    }

    /// Guest RAM for `ranges` from a snapshot's memory file, mapped private (copy on write).
    /// The file must be exactly as long as the ranges.
    pub fn from_snapshot(
        file: File,
        ranges: &[(GuestAddress, usize)],
    ) -> Result<Self, MemoryError> {
        let size = total_len(ranges);
        let actual = file.metadata().map_err(MemoryError::Stat)?.len();
        if actual != size {
            return Err(MemoryError::FileSize {
                expected: size,
                actual,
            });
        }
        let file = Arc::new(file);
        let mem = collect(&file, ranges, libc::MAP_PRIVATE)?;
        Ok(Self {
            mem,
            backing: Backing::SnapshotFile(file),
            size,
        })
    }

    /// The mappings (cheap to clone: regions are shared).
    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    /// Total RAM in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn backing(&self) -> &Backing {
        &self.backing
    }

    /// Writes guest RAM into `out` as a sparse file of [`GuestRam::size`] bytes: only pages the
    /// guest touched are looked at, and of those only the ones that are not all zeroes are
    /// written; everything else stays a hole (reads as zeroes). Uses only `out`'s descriptor
    /// (`ftruncate`, `pwrite`) and this VM's own descriptors (`lseek`, `mincore`), so it runs
    /// on the VMM thread without opening anything.
    ///
    /// The vCPUs must be paused and no device may write guest memory meanwhile (devices run on
    /// the calling thread).
    pub fn dump(&self, out: &File) -> Result<DumpStats, MemoryError> {
        out.set_len(self.size).map_err(MemoryError::Write)?;
        let mut stats = DumpStats {
            ram_bytes: self.size,
            ..Default::default()
        };
        for region in self.mem.iter() {
            let file_off = region
                .file_offset()
                .map(|f| f.start())
                .ok_or_else(|| MemoryError::Scan(io::Error::other("region without a file")))?;
            let len = region.len();
            let host = region.as_ptr() as usize;
            let pages = self.touched_pages(file_off, host, len)?;
            // SAFETY: [host, host + len) is this region's live mapping, owned by `self.mem`;
            // the caller guarantees nothing writes guest memory while the slice is used.
            let bytes = unsafe { std::slice::from_raw_parts(host as *const u8, len as usize) };
            let mut run: Option<(u64, u64)> = None;
            let flush = |run: &mut Option<(u64, u64)>| -> Result<u64, MemoryError> {
                if let Some((start, end)) = run.take() {
                    out.write_all_at(&bytes[start as usize..end as usize], file_off + start)
                        .map_err(MemoryError::Write)?;
                    return Ok(end - start);
                }
                Ok(0)
            };
            for (start, end) in pages {
                stats.candidate_bytes += end - start;
                let mut p = start;
                while p < end {
                    let page = &bytes[p as usize..(p + PAGE_SIZE) as usize];
                    if is_zero(page) {
                        stats.written_bytes += flush(&mut run)?;
                    } else {
                        run = match run {
                            Some((s, e)) if e == p => Some((s, p + PAGE_SIZE)),
                            other => {
                                let mut r = other;
                                stats.written_bytes += flush(&mut r)?;
                                Some((p, p + PAGE_SIZE))
                            }
                        };
                    }
                    p += PAGE_SIZE;
                }
            }
            stats.written_bytes += flush(&mut run)?;
        }
        Ok(stats)
    }

    /// Page-aligned ranges (offsets into the region) that may hold non-zero data.
    fn touched_pages(
        &self,
        file_off: u64,
        host: usize,
        len: u64,
    ) -> Result<Vec<(u64, u64)>, MemoryError> {
        match &self.backing {
            Backing::Memfd(f) => data_extents(f, file_off, len),
            Backing::SnapshotFile(f) => {
                // Pages the file holds, plus pages resident in this mapping (a page the guest
                // wrote was copied into private memory and is resident).
                let mut marks = vec![false; (len / PAGE_SIZE) as usize];
                for (s, e) in data_extents(f, file_off, len)? {
                    marks[(s / PAGE_SIZE) as usize..(e / PAGE_SIZE) as usize].fill(true);
                }
                let mut vec = vec![0u8; marks.len()];
                // SAFETY: `host` is the page-aligned start of a live mapping of `len` bytes and
                // `vec` has one byte per page of it.
                let rc = unsafe {
                    libc::mincore(host as *mut libc::c_void, len as usize, vec.as_mut_ptr())
                };
                if rc != 0 {
                    return Err(MemoryError::Scan(io::Error::last_os_error()));
                }
                for (m, v) in marks.iter_mut().zip(&vec) {
                    *m |= v & 1 != 0;
                }
                Ok(runs(&marks))
            }
        }
    }
}

/// Runs of `true` in `marks` as byte ranges.
fn runs(marks: &[bool]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, &m) in marks.iter().enumerate() {
        match (m, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s as u64 * PAGE_SIZE, i as u64 * PAGE_SIZE));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s as u64 * PAGE_SIZE, marks.len() as u64 * PAGE_SIZE));
    }
    out
}

fn lseek(file: &File, offset: u64, whence: i32) -> io::Result<Option<u64>> {
    // SAFETY: lseek on a descriptor we own; no memory is passed.
    let r = unsafe { libc::lseek(file.as_raw_fd(), offset as libc::off_t, whence) };
    if r < 0 {
        let e = io::Error::last_os_error();
        // ENXIO: no data (or hole) at or after `offset`.
        return if e.raw_os_error() == Some(libc::ENXIO) {
            Ok(None)
        } else {
            Err(e)
        };
    }
    Ok(Some(r as u64))
}

/// Data extents of `file` inside `[base, base + len)`, relative to `base`, page-aligned.
pub fn data_extents(file: &File, base: u64, len: u64) -> Result<Vec<(u64, u64)>, MemoryError> {
    let end = base + len;
    let mut out = Vec::new();
    let mut pos = base;
    while pos < end {
        let Some(data) = lseek(file, pos, libc::SEEK_DATA).map_err(MemoryError::Scan)? else {
            break;
        };
        if data >= end {
            break;
        }
        let hole = lseek(file, data, libc::SEEK_HOLE)
            .map_err(MemoryError::Scan)?
            .unwrap_or(end)
            .min(end);
        let s = (data - base) / PAGE_SIZE * PAGE_SIZE;
        let e = (hole - base).div_ceil(PAGE_SIZE) * PAGE_SIZE;
        out.push((s, e.min(len)));
        pos = hole.max(data + 1);
    }
    Ok(out)
}

fn is_zero(page: &[u8]) -> bool {
    let (head, words, tail) = {
        // SAFETY: u64 has no invalid bit patterns; align_to only reinterprets aligned bytes.
        unsafe { page.align_to::<u64>() }
    };
    head.iter().all(|&b| b == 0) && words.iter().all(|&w| w == 0) && tail.iter().all(|&b| b == 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::Bytes;

    fn ranges() -> Vec<(GuestAddress, usize)> {
        vec![(GuestAddress(0), 1 << 20), (GuestAddress(1 << 32), 1 << 20)]
    }

    #[test]
    fn memfd_dump_writes_only_touched_non_zero_pages_and_restores_private() {
        let ram = GuestRam::create(&ranges()).unwrap();
        assert_eq!(ram.size(), 2 << 20);
        ram.memory()
            .write_obj(0xdead_beefu64, GuestAddress(0x3000))
            .unwrap();
        ram.memory()
            .write_obj(0x1234u32, GuestAddress((1 << 32) + 0x5008))
            .unwrap();
        // Touched but zero: looked at, not written.
        ram.memory().write_obj(0u64, GuestAddress(0x8000)).unwrap();
        let dir = std::env::temp_dir().join(format!("mv-memtest-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("memory");
        let out = File::create(&path).unwrap();
        let stats = ram.dump(&out).unwrap();
        drop(out);
        assert_eq!(stats.ram_bytes, 2 << 20);
        assert_eq!(stats.written_bytes, 2 * PAGE_SIZE, "{stats:?}");
        assert!(stats.candidate_bytes >= 3 * PAGE_SIZE, "{stats:?}");
        let f = File::open(&path).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 2 << 20);
        let ext = data_extents(&f, 0, 2 << 20).unwrap();
        let data: u64 = ext.iter().map(|(s, e)| e - s).sum();
        assert!(data <= 2 * PAGE_SIZE, "sparse: {ext:?}");

        // Restore: private mapping, the file never changes.
        let restored = GuestRam::from_snapshot(File::open(&path).unwrap(), &ranges()).unwrap();
        let v: u64 = restored.memory().read_obj(GuestAddress(0x3000)).unwrap();
        assert_eq!(v, 0xdead_beef);
        let v: u32 = restored
            .memory()
            .read_obj(GuestAddress((1 << 32) + 0x5008))
            .unwrap();
        assert_eq!(v, 0x1234);
        restored
            .memory()
            .write_obj(7u64, GuestAddress(0x3000))
            .unwrap();
        restored
            .memory()
            .write_obj(9u64, GuestAddress(0x9000))
            .unwrap();
        let mut b = [0u8; 8];
        File::open(&path)
            .unwrap()
            .read_exact_at(&mut b, 0x3000)
            .unwrap();
        assert_eq!(u64::from_le_bytes(b), 0xdead_beef, "file unchanged");

        // A second dump of the restored VM has its own writes and the file's data.
        let path2 = dir.join("memory2");
        let out2 = File::create(&path2).unwrap();
        let s2 = restored.dump(&out2).unwrap();
        assert_eq!(s2.written_bytes, 3 * PAGE_SIZE, "{s2:?}");
        let again = GuestRam::from_snapshot(File::open(&path2).unwrap(), &ranges()).unwrap();
        let a: u64 = again.memory().read_obj(GuestAddress(0x3000)).unwrap();
        let b: u64 = again.memory().read_obj(GuestAddress(0x9000)).unwrap();
        let c: u32 = again
            .memory()
            .read_obj(GuestAddress((1 << 32) + 0x5008))
            .unwrap();
        assert_eq!((a, b, c), (7, 9, 0x1234));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn wrong_file_size_is_refused() {
        let dir = std::env::temp_dir().join(format!("mv-memsize-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("m");
        let f = File::create(&p).unwrap();
        f.set_len(1 << 20).unwrap();
        let e = GuestRam::from_snapshot(File::open(&p).unwrap(), &ranges()).unwrap_err();
        assert!(
            matches!(
                e,
                MemoryError::FileSize {
                    expected,
                    actual
                } if expected == 2 << 20 && actual == 1 << 20
            ),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn runs_of_marks() {
        assert_eq!(
            runs(&[true, true, false, true]),
            vec![(0, 2 * PAGE_SIZE), (3 * PAGE_SIZE, 4 * PAGE_SIZE)]
        );
        assert!(runs(&[false, false]).is_empty());
        assert!(is_zero(&[0u8; 4096]));
        let mut p = [0u8; 4096];
        p[4095] = 1;
        assert!(!is_zero(&p));
    }
}
