//! Helpers shared by the virtio unit tests.

use virtio_queue::Queue;
use vm_memory::GuestAddress;

use super::common::VirtioCommon;
use super::{ActivateError, VirtioDevice};
use crate::devices::interrupt::IrqLine;
use crate::vstate::memory::GuestMemoryMmap;

/// 16 MiB of guest memory at 0.
pub fn mem() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 16 << 20)]).unwrap()
}

/// A device that records what the transport does to it.
pub struct DummyDevice {
    pub common: VirtioCommon,
    pub active: bool,
    pub activated_queues: Vec<Queue>,
    pub config: Vec<u8>,
}

impl DummyDevice {
    /// Offers VERSION_1 and bit 3.
    pub fn new(sizes: &[u16]) -> Self {
        Self::with_features(sizes, 0)
    }

    /// Offers VERSION_1, bit 3 and `extra`.
    pub fn with_features(sizes: &[u16], extra: u64) -> Self {
        let features = (1 << 32) | (1 << 3) | extra;
        Self {
            common: VirtioCommon::new(features, sizes, IrqLine::new(5).unwrap()).unwrap(),
            active: false,
            activated_queues: Vec::new(),
            config: (0..16).collect(),
        }
    }
}

impl VirtioDevice for DummyDevice {
    fn device_type(&self) -> u32 {
        42
    }
    fn common(&self) -> &VirtioCommon {
        &self.common
    }
    fn common_mut(&mut self) -> &mut VirtioCommon {
        &mut self.common
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        super::read_config_bytes(&self.config, offset, data);
    }
    fn write_config(&mut self, offset: u64, data: &[u8]) {
        let o = offset as usize;
        self.config[o..o + data.len()].copy_from_slice(data);
    }
    fn activate(&mut self, _mem: GuestMemoryMmap, queues: Vec<Queue>) -> Result<(), ActivateError> {
        self.active = true;
        self.activated_queues = queues;
        Ok(())
    }
    fn reset(&mut self) {
        self.active = false;
    }
    fn is_activated(&self) -> bool {
        self.active
    }
}

/// A file path under the temp dir, removed on drop.
pub struct TempPath(pub std::path::PathBuf);

impl TempPath {
    pub fn new(tag: &str) -> Self {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let p =
            std::env::temp_dir().join(format!("microvirt-test-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        TempPath(p)
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A temp file of `len` bytes of `fill`.
pub fn temp_image(len: usize, fill: u8) -> TempPath {
    let p = TempPath::new("img");
    std::fs::write(&p.0, vec![fill; len]).unwrap();
    p
}

pub use super::testing::*;
/// A directory under the temp dir, removed (with its contents) on drop.
pub use microvirt_testsupport::TempDir;

/// Runs `f(dir)` on a thread of its own that has a private mount namespace, in which a fresh
/// `fstype` file system (mount options `data`) is mounted at `dir`. The mount exists only in
/// that namespace and disappears with the thread, also when `f` panics (the panic is passed
/// on).
pub fn with_private_mount<T: Send>(
    fstype: &str,
    data: &str,
    f: impl FnOnce(&std::path::Path) -> T + Send,
) -> T {
    use std::ffi::CString;
    let dir = TempDir::new(&format!("mnt-{fstype}"));
    let path = dir.path().to_owned();
    let r = std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: unshare affects only this thread's mount namespace (CLONE_NEWNS implies
            // CLONE_FS, which a thread may unshare on its own).
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNS) }, 0, "unshare");
            let root = CString::new("/").unwrap();
            // SAFETY: valid C strings; keeps mounts made here from propagating out.
            let r = unsafe {
                libc::mount(
                    std::ptr::null(),
                    root.as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                )
            };
            assert_eq!(r, 0, "make / private: {}", std::io::Error::last_os_error());
            let (src, target) = (
                CString::new(fstype).unwrap(),
                CString::new(path.as_os_str().as_encoded_bytes()).unwrap(),
            );
            let opts = CString::new(data).unwrap();
            // SAFETY: valid C strings.
            let r = unsafe {
                libc::mount(
                    src.as_ptr(),
                    target.as_ptr(),
                    src.as_ptr(),
                    0,
                    opts.as_ptr().cast(),
                )
            };
            assert_eq!(r, 0, "mount {fstype}: {}", std::io::Error::last_os_error());
            f(&path)
        })
        .join()
    });
    drop(dir);
    match r {
        Ok(v) => v,
        Err(p) => std::panic::resume_unwind(p),
    }
}

/// A loop block device over a file (`losetup`), detached on drop.
pub struct LoopDevice(pub std::path::PathBuf);

impl LoopDevice {
    pub fn attach(file: &std::path::Path, read_only: bool) -> Self {
        let mut c = std::process::Command::new("losetup");
        c.args(["--find", "--show"]);
        if read_only {
            c.arg("--read-only");
        }
        let out = c.arg(file).output().expect("run losetup");
        assert!(
            out.status.success(),
            "losetup {}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        LoopDevice(String::from_utf8_lossy(&out.stdout).trim().into())
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .arg("-d")
            .arg(&self.0)
            .status();
    }
}

/// Bytes this thread passed to write system calls so far (`/proc/thread-self/io`, `wchar`).
pub fn thread_write_bytes() -> u64 {
    let io = std::fs::read_to_string("/proc/thread-self/io").expect("read /proc/thread-self/io");
    io.lines()
        .find_map(|l| l.strip_prefix("wchar: "))
        .and_then(|v| v.trim().parse().ok())
        .expect("wchar in /proc/thread-self/io")
}

/// Runs `open` again while it fails with [`DiskError::Locked`](super::block::DiskError), for at
/// most 30 s. For tests that reopen a file they just closed: another test thread that spawns a
/// process can hold a copy of the closed descriptor — and its `flock` — from its fork until
/// its child's exec. That is microseconds on a quiet machine, but the child may wait for a core
/// on a busy one: 2 s were not enough there (`an_overlay_belongs_to_its_base` failed 2 times in
/// about 80 runs at load 5–8), and the wait ends as soon as the lock is free.
pub fn retry_locked<T>(
    mut open: impl FnMut() -> Result<T, super::block::DiskError>,
) -> Result<T, super::block::DiskError> {
    let t = std::time::Instant::now();
    loop {
        match open() {
            Err(super::block::DiskError::Locked { .. })
                if t.elapsed() < std::time::Duration::from_secs(30) =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            r => return r,
        }
    }
}

/// Runs `qemu-img` (Debian `qemu-utils`) with `args`, installing the package first when it is
/// missing and this runs as root; panics with what to do otherwise.
pub fn qemu_img(args: &[&str]) {
    use std::process::Command;
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        if Command::new("qemu-img").arg("--version").output().is_ok() {
            return;
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let _ = Command::new("apt-get").args(["update", "-q"]).status();
            let _ = Command::new("apt-get")
                .env("DEBIAN_FRONTEND", "noninteractive")
                .args([
                    "install",
                    "-y",
                    "-q",
                    "--no-install-recommends",
                    "qemu-utils",
                ])
                .status();
        }
    });
    let out = Command::new("qemu-img")
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run qemu-img ({e}): the qcow2 tests need Debian's qemu-utils \
             (apt-get install qemu-utils; `cargo xtask test` installs it)"
            )
        });
    assert!(
        out.status.success(),
        "qemu-img {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}
