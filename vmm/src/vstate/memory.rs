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
//!
//! Every mapping is made by [`map_region`], the one place for per-mapping placement and advice:
//! each region is placed at a 2 MiB-aligned host address ([`with_huge_aligned_placement`]), so
//! that KVM can map the guest with 2 MiB pages wherever the host backs it with huge pages (one
//! nested-paging fault per 2 MiB instead of per 4 KiB). Fresh RAM is shmem: it gets transparent
//! huge pages as `/sys/kernel/mm/transparent_hugepage/shmem_enabled` allows, and is advised
//! (`MADV_HUGEPAGE`) when that knob is `advise` ([`advise_huge_pages`]). A restored VM's private
//! file mapping is aligned but not advised: the kernel gives no transparent huge pages to
//! copy-on-write pages of a file mapping, and page-cache folios come as the file system makes them.

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

/// Size of a transparent huge page on x86_64.
pub const HUGE_PAGE_SIZE: usize = 2 << 20;

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
    let region: MmapRegion<()> = with_huge_aligned_placement(
        len,
        || {
            MmapRegionBuilder::new(len)
                .with_file_offset(FileOffset::from_arc(file.clone(), offset))
                .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
                .with_mmap_flags(flags | libc::MAP_NORESERVE)
                .build()
        },
        |r| r.as_ptr() as usize,
    )
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
        advise_huge_pages(&mem, ThpKnob::Shmem);
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

    /// Zeroes all guest RAM (an in-place reboot): the memfd's pages are punched out, so they
    /// read as zeroes again and the host gets the memory back (`fallocate`, no new descriptor).
    /// A restored VM's RAM (a private mapping of the snapshot file) cannot be cleared this way.
    /// The vCPUs must be paused and no device may touch guest memory meanwhile.
    pub fn clear(&self) -> Result<(), MemoryError> {
        let Backing::Memfd(f) = &self.backing else {
            return Err(MemoryError::Write(io::Error::other(
                "RAM mapped from a snapshot file cannot be cleared",
            )));
        };
        // SAFETY: fallocate on our own memfd over its whole length; it only frees pages, which
        // every mapping of the memfd (ours, KVM's) then reads as zeroes.
        let rc = unsafe {
            libc::fallocate(
                f.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                0,
                self.size as libc::off_t,
            )
        };
        if rc != 0 {
            return Err(MemoryError::Write(io::Error::last_os_error()));
        }
        Ok(())
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

fn mmap_none(addr: usize, len: usize, extra_flags: i32) -> Option<usize> {
    // SAFETY: an inaccessible, unbacked mapping; with MAP_FIXED_NOREPLACE the kernel never
    // replaces an existing mapping.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | extra_flags,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p as usize)
}

fn munmap(addr: usize, len: usize) {
    // SAFETY: only called on mappings this module created itself and nobody else uses.
    unsafe { libc::munmap(addr as *mut libc::c_void, len) };
}

/// Runs `map` (which creates one `size`-byte mapping at a kernel-chosen address, e.g. through
/// vm-memory) so that the kernel chooses a 2 MiB-aligned address. Kernels before 6.7 place large
/// anonymous (and memfd) mappings at 4 KiB alignment; KVM then cannot map the guest with 2 MiB
/// pages even when the host backs it with huge pages.
///
/// How: the kernel places a mapping at the top of the highest free gap that fits it. A probe
/// mapping shows where that is; a small inaccessible placeholder then lowers the top of that gap
/// so that a `size`-byte mapping below it starts on a 2 MiB boundary; the placeholder is removed
/// once `map` ran. This only steers placement: if another thread maps memory meanwhile (the
/// VMM's CPUID helper thread, a test running alongside), or the gap is too tight, the mapping
/// lands elsewhere. `addr` tells where it landed: a misaligned result is dropped (`map` must
/// undo its mapping on drop, as vm-memory's regions do) and the steering tried again, up to
/// [`PLACEMENT_TRIES`] times; after that the last mapping is kept (correct, only without 2 MiB
/// pages). Existing mappings are never touched (`MAP_FIXED_NOREPLACE`). Works for any backing.
pub fn with_huge_aligned_placement<T, E>(
    size: usize,
    mut map: impl FnMut() -> Result<T, E>,
    addr: impl Fn(&T) -> usize,
) -> Result<T, E> {
    let mut tries = 1;
    loop {
        let r = steer_once(size, &mut map)?;
        if addr(&r).is_multiple_of(HUGE_PAGE_SIZE) || tries == PLACEMENT_TRIES {
            return Ok(r);
        }
        tries += 1;
    }
}

/// How often [`with_huge_aligned_placement`] tries for an aligned address.
pub const PLACEMENT_TRIES: usize = 4;

fn steer_once<T>(size: usize, map: impl FnOnce() -> T) -> T {
    let placeholder = (|| {
        // The probe must land where a plain `size`-byte mapping would: an anonymous mapping
        // whose length is a multiple of 2 MiB is aligned by the kernel itself (6.7+), a memfd
        // mapping is not. For such lengths, probe one page longer and take the probe's top
        // (the gap's top is the same).
        let extra = if size.is_multiple_of(HUGE_PAGE_SIZE) {
            4096
        } else {
            0
        };
        let probe = mmap_none(0, size + extra, 0)?;
        munmap(probe, size + extra);
        let probe = probe + extra;
        let misalign = probe % HUGE_PAGE_SIZE;
        if misalign == 0 {
            return None;
        }
        // The mapping should go to [probe - misalign, probe - misalign + size): block the
        // `misalign` bytes above that, at the top of the gap.
        let end = probe - misalign + size;
        match mmap_none(end, misalign, libc::MAP_FIXED_NOREPLACE) {
            Some(p) if p == end => Some((end, misalign)),
            Some(p) => {
                // An old kernel took the address as a hint only.
                munmap(p, misalign);
                None
            }
            None => None,
        }
    })();
    let r = map();
    if let Some((addr, len)) = placeholder {
        munmap(addr, len);
    }
    r
}

/// Which transparent-huge-page policy applies to guest memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThpKnob {
    /// Anonymous memory: `/sys/kernel/mm/transparent_hugepage/enabled`.
    Anonymous,
    /// memfd/shmem memory: `/sys/kernel/mm/transparent_hugepage/shmem_enabled`.
    Shmem,
}

/// What the host does with transparent huge pages for a mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThpMode {
    /// Huge pages where possible without asking (`always`, shmem `always`/`within_size`/`force`).
    Always,
    /// Only for mappings advised with `MADV_HUGEPAGE` (`madvise`, shmem `advise`).
    Advise,
    /// Never (`never`, shmem `never`/`deny`), or no THP in the host kernel.
    Never,
}

impl ThpKnob {
    fn path(self) -> &'static str {
        match self {
            ThpKnob::Anonymous => "/sys/kernel/mm/transparent_hugepage/enabled",
            ThpKnob::Shmem => "/sys/kernel/mm/transparent_hugepage/shmem_enabled",
        }
    }

    /// The host's current mode (Never when the knob cannot be read).
    pub fn mode(self) -> ThpMode {
        std::fs::read_to_string(self.path())
            .map(|s| parse_thp_mode(&s))
            .unwrap_or(ThpMode::Never)
    }
}

/// Parses a THP knob (`always [madvise] never`): the bracketed word is the mode.
pub fn parse_thp_mode(text: &str) -> ThpMode {
    let selected = text
        .split_whitespace()
        .find_map(|w| w.strip_prefix('[')?.strip_suffix(']'));
    match selected {
        Some("always" | "within_size" | "force") => ThpMode::Always,
        Some("madvise" | "advise") => ThpMode::Advise,
        _ => ThpMode::Never,
    }
}

/// Lets the host back guest memory with transparent huge pages where it allows that. Nothing is
/// populated: memory the guest never touches stays unbacked and out of the VMM's RSS; touched
/// memory comes in 2 MiB pages, which lets KVM map the guest with 2 MiB pages (one nested-paging
/// fault per 2 MiB) when the mapping is 2 MiB aligned ([`with_huge_aligned_placement`]).
///
/// `MADV_HUGEPAGE` is given only when the host's mode for `knob` is `madvise`/`advise`: without it
/// there would be no huge pages. In `always` mode the memory gets huge pages anyway, and advising
/// would only add the synchronous defragmentation the host's `defrag` setting applies to advised
/// mappings (`madvise` by default): a fault then compacts memory before it is served, which
/// stalled the guest for 0.3-3 s in the test host (docs/boot-time.md). Returns the regions
/// advised; refusals are logged at debug level and otherwise ignored.
pub fn advise_huge_pages(mem: &GuestMemoryMmap, knob: ThpKnob) -> usize {
    if knob.mode() != ThpMode::Advise {
        return 0;
    }
    let mut advised = 0;
    for r in mem.iter() {
        let (ptr, len) = (r.as_ptr(), r.len() as usize);
        // SAFETY: [ptr, ptr+len) is a live mapping owned by `mem`; MADV_HUGEPAGE only changes
        // how future faults in it are served, never its contents.
        let rc = unsafe { libc::madvise(ptr.cast(), len, libc::MADV_HUGEPAGE) };
        if rc == 0 {
            advised += 1;
        } else {
            log::debug!(
                "guest memory at {ptr:p}: MADV_HUGEPAGE refused: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    advised
}

/// Whether every region's host address is 2 MiB aligned (KVM can then map 2 MiB guest pages
/// with 2 MiB host pages).
pub fn huge_page_aligned(mem: &GuestMemoryMmap) -> bool {
    mem.iter()
        .all(|r| (r.as_ptr() as usize).is_multiple_of(HUGE_PAGE_SIZE))
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

    /// Resident KiB of the guest memory's own mappings (mincore: other threads' allocations
    /// do not count).
    fn resident_kib(mem: &GuestMemoryMmap) -> u64 {
        mem.iter()
            .map(|r| {
                let len = r.len() as usize;
                let mut v = vec![0u8; len.div_ceil(4096)];
                // SAFETY: a live, page-aligned mapping of `len` bytes owned by `mem`; `v` has
                // one byte per page.
                let rc = unsafe { libc::mincore(r.as_ptr().cast(), len, v.as_mut_ptr()) };
                assert_eq!(rc, 0);
                v.iter().filter(|b| *b & 1 != 0).count() as u64 * 4
            })
            .sum()
    }

    #[test]
    fn thp_modes() {
        assert_eq!(parse_thp_mode("always [madvise] never\n"), ThpMode::Advise);
        assert_eq!(parse_thp_mode("[always] madvise never"), ThpMode::Always);
        assert_eq!(parse_thp_mode("always madvise [never]"), ThpMode::Never);
        let shmem = |m: &str| {
            parse_thp_mode(
                &"always within_size advise never deny force"
                    .replace(&format!(" {m} "), &format!(" [{m}] ")),
            )
        };
        assert_eq!(shmem("advise"), ThpMode::Advise);
        assert_eq!(shmem("within_size"), ThpMode::Always);
        assert_eq!(shmem("never"), ThpMode::Never);
        assert_eq!(shmem("deny"), ThpMode::Never);
        assert_eq!(parse_thp_mode(""), ThpMode::Never);
    }

    /// Whether this is the child process in which `test` runs alone; in the parent, runs that
    /// child, asserts it passed and returns false. The placement only steers the kernel's choice
    /// of address and holds while no other thread maps memory meanwhile (documented on
    /// [`with_huge_aligned_placement`]); the other tests of this binary run alongside and do
    /// (an alignment test failed once in CI, on a busy machine).
    fn alone(test: &str) -> bool {
        const CHILD: &str = "MICROVIRT_MEMORY_TEST_ALONE";
        if std::env::var_os(CHILD).is_some() {
            return true;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", &format!("vstate::memory::tests::{test}")])
            .args(["--test-threads=1", "--nocapture"])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "child: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        false
    }

    #[test]
    fn guest_memory_is_huge_page_aligned() {
        if !alone("guest_memory_is_huge_page_aligned") {
            return;
        }
        for mib in [2usize, 6, 130, 256] {
            // Shift the free address space around with odd-sized mappings first.
            let odd = mmap_none(0, (mib + 3) * 4096, 0).unwrap();
            let ram = GuestRam::create(&[(GuestAddress(0), mib << 20)]).unwrap();
            let at: Vec<_> = ram.memory().iter().map(|r| r.as_ptr()).collect();
            assert!(huge_page_aligned(ram.memory()), "{mib} MiB at {at:?}");
            munmap(odd, (mib + 3) * 4096);
        }
        // A size the kernel would not align by itself.
        let odd = GuestRam::create(&[(GuestAddress(0), (64 << 20) + 4096)]).unwrap();
        assert!(huge_page_aligned(odd.memory()));
        // Two regions, as with more than 3 GiB of RAM (addresses only; nothing is touched),
        // and the same regions restored from a memory file (private mappings; a file system
        // with large folios may align them by itself, to their file offsets).
        let two = [
            (GuestAddress(0), 64 << 20),
            (GuestAddress(1 << 32), 64 << 20),
        ];
        let ram = GuestRam::create(&two).unwrap();
        assert!(huge_page_aligned(ram.memory()));
        let dir = std::env::temp_dir().join(format!("mv-memalign-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("memory");
        ram.dump(&File::create(&path).unwrap()).unwrap();
        let restored = GuestRam::from_snapshot(File::open(&path).unwrap(), &two).unwrap();
        assert!(huge_page_aligned(restored.memory()));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn placement_aligns_what_the_kernel_would_not_and_leaves_nothing_behind() {
        if !alone("placement_aligns_what_the_kernel_would_not_and_leaves_nothing_behind") {
            return;
        }
        // Sizes that are not 2 MiB multiples: no kernel aligns those by itself.
        for size in [(8 << 20) + 4096, (3 << 20) + 12288, (2 << 20) + 4096] {
            let plain = mmap_none(0, size, 0).unwrap();
            // Misaligned tries are dropped by the helper: a guard unmaps them.
            struct Mapping(usize, usize);
            impl Drop for Mapping {
                fn drop(&mut self) {
                    if self.0 != 0 {
                        munmap(self.0, self.1);
                    }
                }
            }
            let mut m = with_huge_aligned_placement(
                size,
                || mmap_none(0, size, 0).map(|p| Mapping(p, size)).ok_or(()),
                |m| m.0,
            )
            .unwrap();
            let r = std::mem::replace(&mut m.0, 0);
            assert_eq!(
                r % HUGE_PAGE_SIZE,
                0,
                "size {size:#x} (unsteered: {plain:#x})"
            );
            // Right above the mapping nothing is left behind: the range can be mapped again.
            let above = r + size;
            let p = mmap_none(above, 4096, libc::MAP_FIXED_NOREPLACE);
            assert_eq!(p, Some(above));
            munmap(above, 4096);
            munmap(r, size);
            munmap(plain, size);
        }
    }

    #[test]
    fn advice_keeps_untouched_memory_unbacked() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 512 << 20)]).unwrap();
        let expected = usize::from(ThpKnob::Anonymous.mode() == ThpMode::Advise);
        assert_eq!(advise_huge_pages(&mem, ThpKnob::Anonymous), expected);
        assert_eq!(resident_kib(&mem), 0);
        // Touch one byte: at most one huge page comes in, not the 512 MiB.
        mem.write_obj(1u8, GuestAddress(100 << 20)).unwrap();
        let grown = resident_kib(&mem);
        assert!((4..=2 * 1024).contains(&grown), "resident: {grown} KiB");
        assert_eq!(mem.read_obj::<u8>(GuestAddress(100 << 20)).unwrap(), 1);

        // The same for memfd RAM (advised when the shmem knob says `advise`).
        let ram = GuestRam::create(&[(GuestAddress(0), 512 << 20)]).unwrap();
        assert_eq!(resident_kib(ram.memory()), 0);
        ram.memory()
            .write_obj(1u8, GuestAddress(300 << 20))
            .unwrap();
        let grown = resident_kib(ram.memory());
        assert!(
            (4..=2 * 1024).contains(&grown),
            "memfd resident: {grown} KiB"
        );
    }
}
