//! `containerRootfs` volumes: a VM whose root file system is an OCI container image and whose
//! workload is the image's entrypoint (docs/oci-images.md).
//!
//! The launcher turns the image's files into a read-only erofs disk (`mkfs.erofs`, Debian's
//! `erofs-utils`), resolves what runs from the image's configuration and the volume's
//! overrides ([`microvirt_crds::workload::resolve`]), and boots the Linux kernel with an
//! initramfs of its own: the guest init `microvirt-init` (`guest-images/init`) as `/init` and
//! the [`Workload`] as JSON. The init mounts the disk under a writable overlay, runs the
//! workload and reports its exit status to the VMM before the VM powers off.
//!
//! An image is the user's, and untrusted: its tree is walked (links never followed) and refused
//! over [`Limits`] before anything reads file contents; `mkfs.erofs` stores links, device nodes
//! and set-uid bits as they are, which matter only inside the guest. In run mode the image is a
//! local directory ([`ImageDir`]).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use microvirt_crds::workload::{EnvVar, Overrides, WORKLOAD_PATH};
pub use microvirt_crds::workload::{ImageConfig, Workload};

/// Where the launcher looks for the guest init when `--guest-init` is not given: this
/// environment variable, else `microvirt-init` next to the launcher's executable.
pub const GUEST_INIT_ENV: &str = "MICROVIRT_GUEST_INIT";
pub const GUEST_INIT_NAME: &str = "microvirt-init";
/// Longest image configuration read, in bytes.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Bounds on an image's tree, checked before it is built into a disk.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Files, directories, links and nodes, all counted.
    pub entries: u64,
    /// Sum of the regular files' sizes (apparent sizes: a sparse file counts whole).
    pub bytes: u64,
    /// Directory nesting.
    pub depth: usize,
}

/// The limits `virt-launcher` applies.
pub const LIMITS: Limits = Limits {
    entries: 1_000_000,
    bytes: 16 << 30,
    depth: 256,
};

/// What the walk found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TreeStats {
    pub entries: u64,
    pub bytes: u64,
    /// SHA-256 (hex) over every entry's path, type, mode, owner, size, times (ctime too, which
    /// any change of contents, metadata or extended attributes moves, and nobody can set),
    /// device number and link target, in a fixed order: equal for an unchanged tree, the key
    /// of its erofs image in the cache ([`cache_dir`]).
    pub fingerprint: String,
}

/// Bumped when what goes into an erofs image changes (the `mkfs.erofs` options).
const IMAGE_FORMAT: &[u8] = b"microvirt-erofs-v1";

/// Walks `root` without following links, refuses it over `limits`, and fingerprints it.
pub fn check_tree(root: &Path, limits: Limits) -> Result<TreeStats, String> {
    use sha2::Digest;
    let meta = std::fs::symlink_metadata(root).map_err(|e| format!("{}: {e}", root.display()))?;
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", root.display()));
    }
    let mut stats = TreeStats::default();
    let mut hash = sha2::Sha256::new();
    hash.update(IMAGE_FORMAT);
    let mut stack = vec![(root.to_path_buf(), 0usize)];
    while let Some((dir, depth)) = stack.pop() {
        if depth >= limits.depth {
            return Err(format!(
                "directories nested deeper than {} levels (at {})",
                limits.depth,
                dir.display()
            ));
        }
        let mut names = Vec::new();
        for e in std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))? {
            let e = e.map_err(|e| format!("{}: {e}", dir.display()))?;
            stats.entries += 1;
            if stats.entries > limits.entries {
                return Err(format!("more than {} files", limits.entries));
            }
            names.push(e.file_name());
        }
        names.sort_unstable();
        let mut subdirs = Vec::new();
        for name in names {
            let path = dir.join(&name);
            let m = path
                .symlink_metadata()
                .map_err(|err| format!("{}: {err}", path.display()))?;
            let rel = path.strip_prefix(root).unwrap_or(&path);
            hash.update(rel.as_os_str().as_encoded_bytes());
            hash.update([0]);
            for v in [
                u64::from(m.mode()),
                u64::from(m.uid()),
                u64::from(m.gid()),
                m.size(),
                m.mtime() as u64,
                m.mtime_nsec() as u64,
                m.ctime() as u64,
                m.ctime_nsec() as u64,
                m.rdev(),
            ] {
                hash.update(v.to_le_bytes());
            }
            if m.file_type().is_symlink() {
                let target = std::fs::read_link(&path)
                    .map_err(|err| format!("{}: {err}", path.display()))?;
                hash.update(target.as_os_str().as_encoded_bytes());
                hash.update([0]);
            }
            if m.is_file() {
                stats.bytes = stats.bytes.saturating_add(m.size());
                if stats.bytes > limits.bytes {
                    return Err(format!(
                        "its files hold more than {} bytes (a sparse file counts whole)",
                        limits.bytes
                    ));
                }
            } else if m.is_dir() {
                subdirs.push(path);
            }
        }
        // Visited in name order (popped last-first).
        stack.extend(subdirs.into_iter().rev().map(|d| (d, depth + 1)));
    }
    stats.fingerprint = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok(stats)
}

/// Where run mode keeps the erofs images it built, by fingerprint ([`TreeStats`]), so that an
/// unchanged image is built once (and a restore reads the very disk its snapshot saw):
/// `$MICROVIRT_ROOTFS_CACHE`, else `$XDG_CACHE_HOME/microvirt/rootfs`, else
/// `$HOME/.cache/microvirt/rootfs`; None without any (each run then builds its own, in its
/// runtime directory). Nothing removes entries: delete the directory to reclaim the space.
pub fn cache_dir() -> Option<PathBuf> {
    let var = |k| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("MICROVIRT_ROOTFS_CACHE")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("microvirt/rootfs")))
        .or_else(|| var("HOME").map(|d| d.join(".cache/microvirt/rootfs")))
}

/// The erofs image of `rootfs` (fingerprint `stats`) in `cache`: taken as it is when there,
/// else built beside it and renamed into place (a concurrent builder of the same image loses
/// nothing). Returns the path and whether it was built now.
pub fn cached_erofs(
    rootfs: &Path,
    stats: &TreeStats,
    cache: &Path,
) -> Result<(PathBuf, bool), String> {
    let path = cache.join(format!("{}.erofs", stats.fingerprint));
    if path.is_file() {
        return Ok((path, false));
    }
    std::fs::create_dir_all(cache).map_err(|e| format!("{}: {e}", cache.display()))?;
    let tmp = cache.join(format!(".{}.{}.tmp", stats.fingerprint, std::process::id()));
    build_erofs(rootfs, &tmp)?;
    std::fs::rename(&tmp, &path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("{}: {e}", path.display())
    })?;
    Ok((path, true))
}

/// An image in run mode: a directory with the image's files in `rootfs/` and, optionally, its
/// OCI image configuration in `config.json` (the image's config blob: `config.Entrypoint`,
/// `Cmd`, `Env`, `WorkingDir`, `User`).
#[derive(Debug)]
pub struct ImageDir {
    pub rootfs: PathBuf,
    pub config: ImageConfig,
}

impl ImageDir {
    pub fn open(dir: &Path) -> Result<Self, String> {
        let rootfs = dir.join("rootfs");
        if !rootfs.is_dir() {
            return Err(format!(
                "{} has no rootfs/ directory (the image's files)",
                dir.display()
            ));
        }
        let path = dir.join("config.json");
        let config = match std::fs::metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => ImageConfig::default(),
            Err(e) => return Err(format!("{}: {e}", path.display())),
            Ok(m) if m.len() > MAX_CONFIG_BYTES => {
                return Err(format!(
                    "{}: longer than {MAX_CONFIG_BYTES} bytes",
                    path.display()
                ))
            }
            Ok(_) => {
                parse_config(&std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?)
                    .map_err(|e| format!("{}: {e}", path.display()))?
            }
        };
        Ok(Self { rootfs, config })
    }
}

/// The `config` object of an OCI image configuration (absent: an empty configuration).
pub fn parse_config(bytes: &[u8]) -> Result<ImageConfig, String> {
    #[derive(serde::Deserialize)]
    struct Blob {
        #[serde(default)]
        config: Option<ImageConfig>,
    }
    let b: Blob = serde_json::from_slice(bytes)
        .map_err(|e| format!("not an OCI image configuration: {e}"))?;
    Ok(b.config.unwrap_or_default())
}

/// Builds the read-only erofs image of `rootfs` at `out` with `mkfs.erofs`.
pub fn build_erofs(rootfs: &Path, out: &Path) -> Result<(), String> {
    let _ = std::fs::remove_file(out);
    let output = Command::new("mkfs.erofs")
        .arg("--quiet")
        .arg(out)
        .arg(rootfs)
        .output()
        .map_err(|e| format!("running mkfs.erofs (Debian package erofs-utils): {e}"))?;
    if !output.status.success() {
        let err = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = err.lines().rev().take(5).collect();
        return Err(format!(
            "mkfs.erofs {} failed ({}): {}",
            rootfs.display(),
            output.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
        ));
    }
    Ok(())
}

/// The guest init: `explicit`, else [`GUEST_INIT_ENV`], else next to this executable. It must be
/// a static executable (the initramfs has no dynamic loader).
pub fn find_init(explicit: Option<&Path>) -> Result<PathBuf, String> {
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None => match std::env::var_os(GUEST_INIT_ENV) {
            Some(p) => PathBuf::from(p),
            None => std::env::current_exe()
                .map_err(|e| format!("locating {GUEST_INIT_NAME}: {e}"))?
                .with_file_name(GUEST_INIT_NAME),
        },
    };
    let bytes = std::fs::read(&path).map_err(|e| {
        format!(
            "the guest init {}: {e} (build it static: RUSTFLAGS='-C target-feature=+crt-static' cargo build --release -p microvirt-init --target x86_64-unknown-linux-gnu; name it with --guest-init or {GUEST_INIT_ENV})",
            path.display()
        )
    })?;
    check_static(&bytes).map_err(|e| format!("the guest init {}: {e}", path.display()))?;
    Ok(path)
}

/// An x86-64 ELF executable without a program interpreter (`PT_INTERP`).
pub fn check_static(elf: &[u8]) -> Result<(), String> {
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| {
        elf.get(o..o + 4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
    };
    let u64_at = |o: usize| {
        elf.get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
    };
    if elf.get(0..4) != Some(b"\x7fELF") || elf.get(4) != Some(&2) || u16_at(18) != Some(62) {
        return Err("not an x86-64 ELF executable".into());
    }
    let (phoff, phentsize, phnum) = match (u64_at(32), u16_at(54), u16_at(56)) {
        (Some(o), Some(s), Some(n)) => (o as usize, s as usize, n as usize),
        _ => return Err("truncated ELF header".into()),
    };
    for i in 0..phnum {
        let at = phoff
            .checked_add(i.checked_mul(phentsize).ok_or("bad program headers")?)
            .ok_or("bad program headers")?;
        match u32_at(at) {
            Some(3) => {
                return Err(
                    "dynamically linked (it needs a loader the initramfs lacks): build it static"
                        .into(),
                )
            }
            Some(_) => {}
            None => return Err("truncated program headers".into()),
        }
    }
    Ok(())
}

/// What a `containerRootfs` volume runs: the image's configuration with the volume's overrides
/// ([`microvirt_crds::workload::resolve`]), its root on `root_device`.
pub fn workload(
    image: &ImageConfig,
    volume: &crate::vmi::ContainerRootfs,
    root_device: &str,
    hostname: &str,
) -> Result<Workload, microvirt_crds::workload::WorkloadError> {
    microvirt_crds::workload::resolve(image, &overrides(volume), root_device, hostname, 0)
}

/// The VMI's overrides of a `containerRootfs` volume.
pub fn overrides(v: &crate::vmi::ContainerRootfs) -> Overrides {
    Overrides {
        command: v.command.clone(),
        args: v.args.clone(),
        env: v
            .env
            .iter()
            .map(|e| EnvVar {
                name: e.name.clone(),
                value: e.value.clone().unwrap_or_default(),
            })
            .collect(),
        working_dir: v.working_dir.clone(),
    }
}

/// The initramfs (`newc` cpio, uncompressed): the init as `/init`, the workload at
/// [`WORKLOAD_PATH`], `/dev/console` (so the kernel gives the init its console), and the
/// init's mount points.
pub fn initramfs(init: &[u8], workload: &Workload) -> Vec<u8> {
    let json = serde_json::to_vec(workload).expect("a workload serialises");
    let mut w = Cpio::default();
    for d in ["dev", "proc", "sys", "microvirt", "newroot", "lower", "rw"] {
        w.entry(d, 0o040755, &[], (0, 0));
    }
    w.entry("dev/console", 0o020600, &[], (5, 1));
    w.entry("init", 0o100755, init, (0, 0));
    w.entry(
        WORKLOAD_PATH.trim_start_matches('/'),
        0o100644,
        &json,
        (0, 0),
    );
    w.finish()
}

#[derive(Default)]
struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, data: &[u8], rdev: (u32, u32)) {
        self.ino += 1;
        let nlink = if mode & 0o170000 == 0o040000 { 2 } else { 1 };
        let fields = [
            self.ino,
            mode,
            0,
            0,
            nlink,
            0,
            data.len() as u32,
            0,
            0,
            rdev.0,
            rdev.1,
            name.len() as u32 + 1,
            0,
        ];
        self.out.extend_from_slice(b"070701");
        for f in fields {
            self.out.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[], (0, 0));
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    use microvirt_testsupport::TempDir;

    fn dir(name: &str) -> TempDir {
        TempDir::new(&format!("oci-{name}"))
    }

    /// An archive entry: (name, mode, data, rdev).
    type Entry = (String, u32, Vec<u8>, (u32, u32));

    /// Entries of a newc archive.
    fn read_cpio(mut b: &[u8]) -> Vec<Entry> {
        let mut out = Vec::new();
        let start = b.as_ptr() as usize;
        loop {
            assert_eq!(&b[..6], b"070701");
            let f = |i: usize| {
                u32::from_str_radix(std::str::from_utf8(&b[6 + i * 8..14 + i * 8]).unwrap(), 16)
                    .unwrap()
            };
            let (mode, size, rmaj, rmin, namesize) =
                (f(1), f(6) as usize, f(9), f(10), f(11) as usize);
            let name = std::str::from_utf8(&b[110..110 + namesize - 1])
                .unwrap()
                .to_string();
            assert_eq!(b[110 + namesize - 1], 0);
            let data_at = (110 + namesize).next_multiple_of(4);
            let data = b[data_at..data_at + size].to_vec();
            let next = (data_at + size).next_multiple_of(4);
            assert_eq!((b.as_ptr() as usize - start) % 4, 0);
            b = &b[next..];
            if name == "TRAILER!!!" {
                assert!(b.is_empty());
                return out;
            }
            out.push((name, mode, data, (rmaj, rmin)));
        }
    }

    #[test]
    fn the_initramfs_holds_the_init_the_workload_and_a_console() {
        let w = Workload {
            argv: vec!["python3".into(), "-m".into(), "http.server".into()],
            root_device: "/dev/vda".into(),
            working_dir: "/".into(),
            ..Default::default()
        };
        let entries = read_cpio(&initramfs(b"\x7fELF-the-init", &w));
        let get = |n: &str| {
            entries
                .iter()
                .find(|e| e.0 == n)
                .unwrap_or_else(|| panic!("{n}"))
        };
        assert_eq!(get("init").1, 0o100755);
        assert_eq!(get("init").2, b"\x7fELF-the-init");
        let back: Workload = serde_json::from_slice(&get("microvirt/workload.json").2).unwrap();
        assert_eq!(back, w);
        assert_eq!(
            (get("dev/console").1, get("dev/console").3),
            (0o020600, (5, 1))
        );
        for d in ["dev", "proc", "sys", "microvirt", "newroot", "lower", "rw"] {
            assert_eq!(get(d).1, 0o040755, "{d}");
        }
    }

    #[test]
    fn trees_over_the_limits_are_refused_without_following_links() {
        let d = dir("tree");
        let r = d.path().join("rootfs");
        std::fs::create_dir_all(r.join("a/b/c")).unwrap();
        std::fs::write(r.join("a/f"), vec![1u8; 1000]).unwrap();
        // A link out of the tree (to the whole host) is an entry, never walked.
        std::os::unix::fs::symlink("/", r.join("a/host")).unwrap();
        let sparse = std::fs::File::create(r.join("sparse")).unwrap();
        sparse.set_len(1 << 40).unwrap();
        let big = Limits {
            entries: 100,
            bytes: 2 << 40,
            depth: 10,
        };
        let stats = check_tree(&r, big).unwrap();
        assert_eq!((stats.entries, stats.bytes), (6, 1000 + (1 << 40)));
        let e = check_tree(
            &r,
            Limits {
                bytes: 1 << 30,
                ..big
            },
        )
        .unwrap_err();
        assert!(e.contains("more than 1073741824 bytes"), "{e}");
        let e = check_tree(&r, Limits { entries: 5, ..big }).unwrap_err();
        assert!(e.contains("more than 5 files"), "{e}");
        let e = check_tree(&r, Limits { depth: 3, ..big }).unwrap_err();
        assert!(e.contains("deeper than 3"), "{e}");
        assert!(check_tree(&r.join("sparse"), big)
            .unwrap_err()
            .contains("not a directory"));
    }

    #[test]
    fn the_fingerprint_moves_with_any_change_and_only_then() {
        let d = dir("fp");
        let r = d.path().join("rootfs");
        std::fs::create_dir_all(r.join("etc/x")).unwrap();
        std::fs::write(r.join("etc/passwd"), "root:x:0:0::/:/bin/sh\n").unwrap();
        std::os::unix::fs::symlink("passwd", r.join("etc/link")).unwrap();
        let fp = || check_tree(&r, LIMITS).unwrap().fingerprint;
        let first = fp();
        assert_eq!(first.len(), 64);
        assert_eq!(fp(), first, "an unchanged tree");
        let mut seen = vec![first];
        let mut changed = |what: &str| {
            let now = fp();
            assert!(
                !seen.contains(&now),
                "{what} did not change the fingerprint"
            );
            seen.push(now);
        };
        std::fs::write(r.join("etc/passwd"), "root:x:0:0::/:/bin/bash\n").unwrap();
        changed("new contents");
        std::fs::set_permissions(r.join("etc/passwd"), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        changed("a mode");
        std::fs::remove_file(r.join("etc/link")).unwrap();
        std::os::unix::fs::symlink("group", r.join("etc/link")).unwrap();
        changed("a link target");
        std::fs::write(r.join("etc/x/new"), "").unwrap();
        changed("a new file");
    }

    #[test]
    fn an_unchanged_image_is_built_once_into_the_cache() {
        let d = dir("cache");
        let r = d.path().join("rootfs");
        std::fs::create_dir_all(r.join("bin")).unwrap();
        std::fs::write(r.join("bin/app"), "#!/bin/sh\necho hi\n").unwrap();
        let stats = check_tree(&r, LIMITS).unwrap();
        let cache = d.path().join("cache");
        let (path, built) = cached_erofs(&r, &stats, &cache).expect("mkfs.erofs (erofs-utils)");
        assert!(built && path.is_file());
        assert_eq!(path, cache.join(format!("{}.erofs", stats.fingerprint)));
        let (again, built) = cached_erofs(&r, &stats, &cache).unwrap();
        assert_eq!((again, built), (path.clone(), false));
        // Nothing else is left in the cache (the temporary file was renamed).
        assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 1);
        // erofs's superblock magic at 1024.
        let img = std::fs::read(&path).unwrap();
        assert_eq!(&img[1024..1028], &0xe0f5_e1e2u32.to_le_bytes());
    }

    #[test]
    fn image_directories_and_their_configuration() {
        let d = dir("imgdir");
        assert!(ImageDir::open(d.path()).unwrap_err().contains("no rootfs/"));
        std::fs::create_dir(d.path().join("rootfs")).unwrap();
        assert_eq!(
            ImageDir::open(d.path()).unwrap().config,
            ImageConfig::default()
        );
        std::fs::write(
            d.path().join("config.json"),
            r#"{"architecture":"amd64","os":"linux","config":{"Entrypoint":["python3"],"Cmd":["-V"],"Env":["A=1"],"WorkingDir":"/app","User":"1000"}}"#,
        )
        .unwrap();
        let c = ImageDir::open(d.path()).unwrap().config;
        assert_eq!(c.entrypoint, Some(vec!["python3".to_string()]));
        assert_eq!(c.user.as_deref(), Some("1000"));
        std::fs::write(d.path().join("config.json"), "[1]").unwrap();
        assert!(ImageDir::open(d.path())
            .unwrap_err()
            .contains("not an OCI image configuration"));
    }

    #[test]
    fn only_a_static_executable_can_be_the_init() {
        // This test binary is dynamically linked (a plain `cargo test` build).
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert!(check_static(&me)
            .unwrap_err()
            .contains("dynamically linked"));
        // The static test guest builder's output is not needed: a minimal header with no
        // program headers is static.
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[18] = 62;
        assert_eq!(check_static(&elf), Ok(()));
        elf[32..40].copy_from_slice(&1000u64.to_le_bytes());
        elf[56] = 1; // one program header, beyond the end
        assert!(check_static(&elf).unwrap_err().contains("truncated"));
        assert!(check_static(b"#!/bin/sh\n").is_err());
    }
}
