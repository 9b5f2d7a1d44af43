//! Disk backends: a raw image file, and an in-memory disk for tests,
//! benchmarks and fuzzing. The copy-on-write overlay is in `overlay.rs`, the read-only qcow2
//! reader in `qcow2/`; [`open_disk`] and [`read_only_backend`] choose raw or qcow2 by the
//! image's magic number.
//!
//! Backends move data straight between the file and guest memory
//! (`pread`/`pwrite` into [`VolatileSlice`]s), without bounce buffers.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

use vm_memory::{Bytes, VolatileSlice};

/// Sector size of the virtio-blk protocol.
pub const SECTOR_SIZE: u64 = 512;

/// A guest-memory buffer (no dirty tracking).
pub type GuestSlice<'a> = VolatileSlice<'a, ()>;

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("cannot open {path}: {source}")]
    Open { path: String, source: io::Error },
    #[error("{path} is locked by another user (another VM?): {source}")]
    Locked { path: String, source: io::Error },
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    #[error("guest memory access failed: {0}")]
    Memory(String),
    #[error("access {offset:#x}+{len:#x} beyond the end of the disk ({capacity:#x})")]
    OutOfRange {
        offset: u64,
        len: u64,
        capacity: u64,
    },
    #[error("disk is read-only")]
    ReadOnly,
    #[error("overlay {path}: {reason}")]
    Overlay { path: String, reason: String },
    #[error("the disk has no copy-on-write overlay to save")]
    NotAnOverlay,
    #[error("{0} is not supported by the file system holding the disk")]
    Unsupported(&'static str),
    /// A qcow2 image refused when opened, or a damaged part of it met while reading.
    #[error("{path}: qcow2: {reason}")]
    Qcow2 { path: String, reason: String },
}

/// Storage behind a virtio-blk device. Offsets and lengths are in bytes and
/// already checked against [`DiskBackend::capacity`] by the request code.
pub trait DiskBackend: Send {
    /// Usable size in bytes (a multiple of [`SECTOR_SIZE`]).
    fn capacity(&self) -> u64;
    /// Writes, discards and write-zeroes fail.
    fn read_only(&self) -> bool;
    /// Fill `dst` with the disk contents at `offset`.
    fn read_at(&mut self, offset: u64, dst: &GuestSlice) -> Result<(), DiskError>;
    /// Store `src` at `offset`.
    fn write_at(&mut self, offset: u64, src: &GuestSlice) -> Result<(), DiskError>;
    /// Make every completed write durable (returns only once it is).
    fn flush(&mut self) -> Result<(), DiskError>;
    /// The guest no longer needs `len` bytes at `offset`: a hint (virtio-blk leaves the
    /// contents unspecified). File backends punch a hole (the range then reads as zeroes); where
    /// the file system cannot, the hint is ignored — nothing is written.
    fn discard(&mut self, offset: u64, len: u64) -> Result<(), DiskError>;
    /// Make `len` bytes at `offset` read as zero, without writing them:
    /// [`DiskError::Unsupported`] where the file system cannot (the guest is told and
    /// writes zeroes itself).
    fn write_zeroes(&mut self, offset: u64, len: u64) -> Result<(), DiskError>;
    /// Copy-on-write overlays: flush, then write the overlay file's whole contents to `out`
    /// (a snapshot keeps it). Other backends hold the user's data and have nothing to save.
    fn save_overlay(&mut self, _out: &File) -> Result<u64, DiskError> {
        Err(DiskError::NotAnOverlay)
    }
}

pub(crate) fn check_range(offset: u64, len: u64, capacity: u64) -> Result<(), DiskError> {
    match offset.checked_add(len) {
        Some(end) if end <= capacity => Ok(()),
        _ => Err(DiskError::OutOfRange {
            offset,
            len,
            capacity,
        }),
    }
}

/// `pread` until `dst` is full; bytes past end-of-file read as zero.
pub(crate) fn pread_exact(file: &File, offset: u64, dst: &GuestSlice) -> io::Result<()> {
    let guard = dst.ptr_guard_mut();
    let ptr = guard.as_ptr();
    let len = dst.len();
    let mut done = 0usize;
    while done < len {
        let off = offset
            .checked_add(done as u64)
            .and_then(|o| i64::try_from(o).ok())
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: `ptr` points to `len` bytes of mapped guest memory that stay
        // mapped while `guard` lives; we write at most `len - done` bytes at
        // `ptr + done`. Concurrent guest access is allowed by the volatile
        // memory model (the guest owns the buffer semantics).
        let r = unsafe { libc::pread(file.as_raw_fd(), ptr.add(done).cast(), len - done, off) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            let zeros = vec![0u8; len - done];
            dst.write_slice(&zeros, done)
                .map_err(|e| io::Error::other(e.to_string()))?;
            return Ok(());
        }
        done += r as usize;
    }
    Ok(())
}

/// `pwrite` all of `src`.
pub(crate) fn pwrite_all(file: &File, offset: u64, src: &GuestSlice) -> io::Result<()> {
    let guard = src.ptr_guard();
    let ptr = guard.as_ptr();
    let len = src.len();
    let mut done = 0usize;
    while done < len {
        let off = offset
            .checked_add(done as u64)
            .and_then(|o| i64::try_from(o).ok())
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: `ptr` points to `len` readable bytes of mapped guest memory
        // that stay mapped while `guard` lives; we read `len - done` bytes at
        // `ptr + done`.
        let r = unsafe { libc::pwrite(file.as_raw_fd(), ptr.add(done).cast(), len - done, off) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            return Err(io::Error::from(io::ErrorKind::WriteZero));
        }
        done += r as usize;
    }
    Ok(())
}

/// `fallocate(mode | FALLOC_FL_KEEP_SIZE)` on `[offset, offset + len)`. `Ok(false)`: the file
/// system (or block device) does not support this mode (`EOPNOTSUPP`); nothing was changed.
fn fallocate_keep_size(file: &File, mode: libc::c_int, offset: u64, len: u64) -> io::Result<bool> {
    if len == 0 {
        return Ok(true);
    }
    let (o, l) = match (i64::try_from(offset), i64::try_from(len)) {
        (Ok(o), Ok(l)) => (o, l),
        _ => return Err(io::Error::from(io::ErrorKind::InvalidInput)),
    };
    loop {
        // SAFETY: plain syscall on an owned fd, no memory is passed.
        let r =
            unsafe { libc::fallocate(file.as_raw_fd(), mode | libc::FALLOC_FL_KEEP_SIZE, o, l) };
        if r == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EOPNOTSUPP) => return Ok(false),
            _ => return Err(e),
        }
    }
}

/// Deallocates `[offset, offset + len)` so it reads as zeroes (`FALLOC_FL_PUNCH_HOLE`).
/// `Ok(false)` when the file system cannot punch holes: nothing was changed. There is
/// deliberately no fallback that writes zeroes: a guest may ask for gigabytes at once.
pub(crate) fn punch_hole(file: &File, offset: u64, len: u64) -> io::Result<bool> {
    fallocate_keep_size(file, libc::FALLOC_FL_PUNCH_HOLE, offset, len)
}

/// Makes `[offset, offset + len)` read as zeroes without writing them: `FALLOC_FL_ZERO_RANGE`,
/// else `FALLOC_FL_PUNCH_HOLE`. `Ok(false)` when the file system supports neither (nothing was
/// changed; the caller reports the request unsupported and the guest writes zeroes itself, in
/// requests of normal size).
pub(crate) fn zero_range(file: &File, offset: u64, len: u64) -> io::Result<bool> {
    if fallocate_keep_size(file, libc::FALLOC_FL_ZERO_RANGE, offset, len)? {
        return Ok(true);
    }
    punch_hole(file, offset, len)
}

/// Size of an opened disk image in bytes: `lseek(SEEK_END)`, which is the length of a regular
/// file and the size of a block device (whose `st_size` is 0).
pub(crate) fn image_len(file: &File) -> io::Result<u64> {
    // SAFETY: plain syscall on an owned fd; the offset it moves is restored below and nothing
    // else uses the offset (all I/O is positional).
    let end = unsafe { libc::lseek(file.as_raw_fd(), 0, libc::SEEK_END) };
    if end < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::lseek(file.as_raw_fd(), 0, libc::SEEK_SET) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(end as u64)
}

/// `fdatasync`, retried on EINTR.
pub(crate) fn fdatasync(file: &File) -> io::Result<()> {
    loop {
        // SAFETY: plain syscall on an owned fd.
        let r = unsafe { libc::fdatasync(file.as_raw_fd()) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Take an advisory `flock` so two VMs cannot write one file (exclusive) or
/// write a file another VM reads (shared).
pub(crate) fn lock_file(file: &File, path: &Path, exclusive: bool) -> Result<(), DiskError> {
    let op = if exclusive {
        libc::LOCK_EX
    } else {
        libc::LOCK_SH
    } | libc::LOCK_NB;
    // SAFETY: plain syscall on an owned fd.
    let r = unsafe { libc::flock(file.as_raw_fd(), op) };
    if r == 0 {
        Ok(())
    } else {
        Err(DiskError::Locked {
            path: path.display().to_string(),
            source: io::Error::last_os_error(),
        })
    }
}

/// The descriptor `N` when `path` is `/proc/self/fd/N`.
fn embedder_fd(path: &Path) -> Option<std::os::fd::RawFd> {
    path.strip_prefix("/proc/self/fd")
        .ok()?
        .to_str()?
        .parse()
        .ok()
}

/// A duplicate of descriptor `fd`, which must be open for writing unless `read_only`.
fn dup_image(fd: std::os::fd::RawFd, read_only: bool) -> io::Result<File> {
    use std::os::fd::FromRawFd;
    // SAFETY: F_GETFL reads the flags of a descriptor number; no memory is involved.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    if !read_only && flags & libc::O_ACCMODE == libc::O_RDONLY {
        return Err(io::Error::other(
            "the descriptor is open read-only and the disk is writable",
        ));
    }
    // SAFETY: as above; the new descriptor is ours alone.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `dup` is a fresh descriptor that only this File owns.
    Ok(unsafe { File::from_raw_fd(dup) })
}

/// Opens a disk image. `/proc/self/fd/N` names a descriptor the embedder opened (e.g. before
/// it gave up the privileges to): it is duplicated, not reopened, since a reopen checks the
/// permissions again.
pub fn open_image(path: &Path, read_only: bool) -> Result<File, DiskError> {
    let opened = match embedder_fd(path) {
        Some(fd) => dup_image(fd, read_only),
        None => OpenOptions::new().read(true).write(!read_only).open(path),
    };
    let file = opened.map_err(|source| DiskError::Open {
        path: path.display().to_string(),
        source,
    })?;
    lock_file(&file, path, !read_only)?;
    Ok(file)
}

/// Reads `buf.len()` bytes at `offset` of `disk` into a host buffer.
pub fn read_into(disk: &mut dyn DiskBackend, offset: u64, buf: &mut [u8]) -> Result<(), DiskError> {
    let s = GuestSlice::from(buf);
    disk.read_at(offset, &s)
}

/// A raw disk image file. Read-only disks are opened `O_RDONLY`.
#[derive(Debug)]
pub struct RawFile {
    file: File,
    capacity: u64,
    read_only: bool,
    /// Cleared once the file system answered `EOPNOTSUPP` to a hole punch.
    can_punch: bool,
}

impl RawFile {
    /// Open `path` (read-write unless `read_only`) and lock it (exclusive
    /// for read-write, shared for read-only).
    pub fn open(path: &Path, read_only: bool) -> Result<Self, DiskError> {
        Self::from_file(open_image(path, read_only)?, read_only)
    }

    /// The raw disk in `file` (opened and locked as [`RawFile::open`] does).
    pub fn from_file(file: File, read_only: bool) -> Result<Self, DiskError> {
        let len = image_len(&file)?;
        Ok(Self {
            file,
            capacity: len / SECTOR_SIZE * SECTOR_SIZE,
            read_only,
            can_punch: true,
        })
    }
}

impl DiskBackend for RawFile {
    fn capacity(&self) -> u64 {
        self.capacity
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn read_at(&mut self, offset: u64, dst: &GuestSlice) -> Result<(), DiskError> {
        check_range(offset, dst.len() as u64, self.capacity)?;
        Ok(pread_exact(&self.file, offset, dst)?)
    }
    fn write_at(&mut self, offset: u64, src: &GuestSlice) -> Result<(), DiskError> {
        if self.read_only {
            return Err(DiskError::ReadOnly);
        }
        check_range(offset, src.len() as u64, self.capacity)?;
        Ok(pwrite_all(&self.file, offset, src)?)
    }
    fn flush(&mut self) -> Result<(), DiskError> {
        if self.read_only {
            return Ok(());
        }
        Ok(fdatasync(&self.file)?)
    }
    fn discard(&mut self, offset: u64, len: u64) -> Result<(), DiskError> {
        if self.read_only {
            return Err(DiskError::ReadOnly);
        }
        check_range(offset, len, self.capacity)?;
        if self.can_punch && !punch_hole(&self.file, offset, len)? {
            log::info!("virtio-blk: the file system cannot punch holes; discards are ignored");
            self.can_punch = false;
        }
        Ok(())
    }
    fn write_zeroes(&mut self, offset: u64, len: u64) -> Result<(), DiskError> {
        if self.read_only {
            return Err(DiskError::ReadOnly);
        }
        check_range(offset, len, self.capacity)?;
        if zero_range(&self.file, offset, len)? {
            Ok(())
        } else {
            Err(DiskError::Unsupported("zeroing a range without writing it"))
        }
    }
}

/// A disk in a `Vec` (tests, benchmarks, fuzzing).
#[derive(Debug, Clone)]
pub struct MemDisk {
    pub data: Vec<u8>,
    pub read_only: bool,
    /// Number of `flush` calls seen.
    pub flushes: u64,
}

impl MemDisk {
    pub fn new(capacity: usize, read_only: bool) -> Self {
        Self {
            data: vec![0; capacity / SECTOR_SIZE as usize * SECTOR_SIZE as usize],
            read_only,
            flushes: 0,
        }
    }

    fn range(&self, offset: u64, len: u64) -> Result<std::ops::Range<usize>, DiskError> {
        check_range(offset, len, self.data.len() as u64)?;
        Ok(offset as usize..(offset + len) as usize)
    }
}

impl DiskBackend for MemDisk {
    fn capacity(&self) -> u64 {
        self.data.len() as u64
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn read_at(&mut self, offset: u64, dst: &GuestSlice) -> Result<(), DiskError> {
        let r = self.range(offset, dst.len() as u64)?;
        dst.copy_from(&self.data[r]);
        Ok(())
    }
    fn write_at(&mut self, offset: u64, src: &GuestSlice) -> Result<(), DiskError> {
        if self.read_only {
            return Err(DiskError::ReadOnly);
        }
        let r = self.range(offset, src.len() as u64)?;
        src.copy_to(&mut self.data[r]);
        Ok(())
    }
    fn flush(&mut self) -> Result<(), DiskError> {
        self.flushes += 1;
        Ok(())
    }
    fn discard(&mut self, offset: u64, len: u64) -> Result<(), DiskError> {
        self.write_zeroes(offset, len)
    }
    fn write_zeroes(&mut self, offset: u64, len: u64) -> Result<(), DiskError> {
        if self.read_only {
            return Err(DiskError::ReadOnly);
        }
        let r = self.range(offset, len)?;
        self.data[r].fill(0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::block::request;
    use crate::devices::virtio::test_utils::{
        mem, temp_image, thread_write_bytes, with_private_mount, LoopDevice, TestQueue,
    };

    /// `/proc/self/fd/N` is the embedder's descriptor, duplicated: its access mode holds (a
    /// reopen by root would have given write access) and the data is the file's.
    #[test]
    fn proc_self_fd_paths_are_duplicated_not_reopened() {
        let img = temp_image(4096, 9);
        let f = File::open(&img.0).unwrap();
        let path = std::path::PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()));
        let e = RawFile::open(&path, false).unwrap_err().to_string();
        assert!(e.contains("open read-only"), "{e}");
        let d = RawFile::open(&path, true).unwrap();
        assert_eq!(d.capacity(), 4096);
        let mut b = [0u8; 1];
        use std::os::unix::fs::FileExt;
        d.file.read_exact_at(&mut b, 100).unwrap();
        assert_eq!(b[0], 9);
        drop(f);
        // The duplicate outlives the embedder's descriptor.
        d.file.read_exact_at(&mut b, 0).unwrap();
        assert_eq!(b[0], 9);
    }
    use std::os::unix::fs::FileExt;
    use vm_memory::{GuestAddress, GuestMemoryBackend};

    #[test]
    fn raw_file_round_trip_flush_discard_zeroes() {
        let img = temp_image(64 * 1024 + 100, 0xaa);
        let m = mem();
        let mut d = RawFile::open(&img.0, false).unwrap();
        assert_eq!(d.capacity(), 64 * 1024);
        let s = m.get_slice(GuestAddress(0x1000), 4096).unwrap();
        s.copy_from(&[7u8; 4096]);
        d.write_at(8192, &s).unwrap();
        d.flush().unwrap();
        let r = m.get_slice(GuestAddress(0x9000), 4096).unwrap();
        d.read_at(8192, &r).unwrap();
        let mut back = [0u8; 4096];
        r.copy_to(&mut back);
        assert_eq!(back, [7u8; 4096]);
        d.discard(8192, 4096).unwrap();
        d.read_at(8192, &r).unwrap();
        r.copy_to(&mut back);
        assert_eq!(back, [0u8; 4096]);
        d.write_zeroes(0, 512).unwrap();
        let f = std::fs::read(&img.0).unwrap();
        assert!(f[..512].iter().all(|&b| b == 0));
        assert!(f[512..8192].iter().all(|&b| b == 0xaa));
        assert!(matches!(
            d.read_at(64 * 1024 - 512, &r),
            Err(DiskError::OutOfRange { .. })
        ));
        assert!(matches!(
            d.read_at(u64::MAX - 10, &r),
            Err(DiskError::OutOfRange { .. })
        ));
    }

    #[test]
    fn read_only_file_refuses_writes_and_is_opened_rdonly() {
        let img = temp_image(4096, 0x11);
        let mut d = RawFile::open(&img.0, true).unwrap();
        // The fd really is O_RDONLY.
        // SAFETY: F_GETFL on an owned fd.
        let fl = unsafe { libc::fcntl(d.file.as_raw_fd(), libc::F_GETFL) };
        assert_eq!(fl & libc::O_ACCMODE, libc::O_RDONLY);
        let m = mem();
        let s = m.get_slice(GuestAddress(0), 512).unwrap();
        assert!(matches!(d.write_at(0, &s), Err(DiskError::ReadOnly)));
        assert!(matches!(d.discard(0, 512), Err(DiskError::ReadOnly)));
        assert!(matches!(d.write_zeroes(0, 512), Err(DiskError::ReadOnly)));
        d.flush().unwrap();
        assert_eq!(std::fs::read(&img.0).unwrap(), vec![0x11; 4096]);
    }

    #[test]
    fn a_block_device_has_its_real_size() {
        // A loop device over a 3 MiB + 100 byte file: the device is 3 MiB (whole sectors of
        // the file), its inode's st_size is 0.
        let img = temp_image((3 << 20) + 100, 0x5c);
        let lo = LoopDevice::attach(&img.0, false);
        assert_eq!(
            std::fs::metadata(&lo.0).unwrap().len(),
            0,
            "st_size of a device"
        );
        let mut d = RawFile::open(&lo.0, false).unwrap();
        assert_eq!(d.capacity(), 3 << 20);
        let m = mem();
        let r = m.get_slice(GuestAddress(0x9000), 512).unwrap();
        d.read_at((3 << 20) - 512, &r).unwrap();
        let mut back = [0u8; 512];
        r.copy_to(&mut back);
        assert_eq!(back, [0x5c; 512]);
        // The device the guest sees has that capacity too.
        let dev = crate::devices::virtio::block::BlockDevice::new(
            Box::new(d),
            [0; 20],
            crate::devices::interrupt::IrqLine::new(5).unwrap(),
        )
        .unwrap();
        let mut cap = [0u8; 8];
        crate::devices::virtio::VirtioDevice::read_config(&dev, 0, &mut cap);
        assert_eq!(u64::from_le_bytes(cap), (3 << 20) / 512);
    }

    #[test]
    fn without_hole_punching_discard_writes_nothing_and_write_zeroes_is_unsupported() {
        // ramfs has no fallocate at all: no hole punching, no zero range.
        with_private_mount("ramfs", "", |dir| {
            let path = dir.join("disk.img");
            let f = std::fs::File::create(&path).unwrap();
            f.set_len(64 << 20).unwrap();
            f.write_all_at(&[0x77; 4096], 0).unwrap();
            drop(f);
            let mut d = RawFile::open(&path, false).unwrap();
            let before = thread_write_bytes();
            // Discard all of it: a hint the file system cannot act on; nothing is written.
            d.discard(0, 64 << 20).unwrap();
            d.discard(4096, 8192).unwrap();
            assert_eq!(thread_write_bytes() - before, 0, "bytes written by discard");
            // Write-zeroes must not write zeroes either: it is reported unsupported.
            assert!(matches!(
                d.write_zeroes(0, 32 << 20),
                Err(DiskError::Unsupported(_))
            ));
            assert_eq!(
                thread_write_bytes() - before,
                0,
                "bytes written by write-zeroes"
            );
            // The guest is told: VIRTIO_BLK_S_UNSUPP (Linux then writes zeroes itself).
            let m = mem();
            let mut tq = TestQueue::new(&m, 0x1000, 16);
            let mut hdr = [0u8; 16];
            hdr[0..4].copy_from_slice(&request::VIRTIO_BLK_T_WRITE_ZEROES.to_le_bytes());
            m.write_slice(&hdr, GuestAddress(0x10000)).unwrap();
            let mut seg = 0u64.to_le_bytes().to_vec();
            seg.extend_from_slice(&(1u32 << 16).to_le_bytes());
            seg.extend_from_slice(&request::WRITE_ZEROES_FLAG_UNMAP.to_le_bytes());
            m.write_slice(&seg, GuestAddress(0x20000)).unwrap();
            tq.add_chain(&[
                (0x10000, 16, false),
                (0x20000, 16, false),
                (0x30000, 1, true),
            ]);
            let ctx = request::BlockContext { id: [0; 20] };
            let out = request::process_queue(&mut tq.queue(), &m, &mut d, &ctx);
            assert_eq!((out.used, out.fatal), (1, None));
            assert_eq!(
                m.read_obj::<u8>(GuestAddress(0x30000)).unwrap(),
                request::VIRTIO_BLK_S_UNSUPP
            );
            assert_eq!(
                thread_write_bytes() - before,
                0,
                "bytes written by the request"
            );
            // The data is still there (a discard leaves contents unspecified).
            let m = mem();
            let r = m.get_slice(GuestAddress(0x9000), 4096).unwrap();
            d.read_at(0, &r).unwrap();
            let mut back = [0u8; 4096];
            r.copy_to(&mut back);
            assert_eq!(back, [0x77; 4096]);
            // The copy-on-write overlay on such a file system behaves the same.
            let base = dir.join("base.img");
            std::fs::write(&base, vec![0x11u8; 1 << 20]).unwrap();
            let mut o = super::super::overlay::Overlay::open(&base, &dir.join("vm.ovl")).unwrap();
            let before = thread_write_bytes();
            o.discard(0, 1 << 20).unwrap();
            assert!(matches!(
                o.write_zeroes(0, 1 << 20),
                Err(DiskError::Unsupported(_))
            ));
            assert_eq!(
                thread_write_bytes() - before,
                0,
                "bytes written to the overlay"
            );
            o.read_at(0, &r).unwrap();
            r.copy_to(&mut back);
            assert_eq!(back, [0x11; 4096]);
        });
    }

    #[test]
    fn writable_image_is_locked_against_a_second_writer() {
        let img = temp_image(4096, 0);
        let _a = RawFile::open(&img.0, false).unwrap();
        assert!(matches!(
            RawFile::open(&img.0, false),
            Err(DiskError::Locked { .. })
        ));
        assert!(matches!(
            RawFile::open(&img.0, true),
            Err(DiskError::Locked { .. })
        ));
    }
}
