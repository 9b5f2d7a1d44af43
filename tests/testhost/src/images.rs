//! Guest images: the microVM kernel (ELF vmlinux + bzImage) and the busybox ext4 root filesystem.
//!
//! Built from Debian's `linux-source-6.1` with `guest-images/kernel/microvm.config` merged on top of
//! `tinyconfig`, and from `busybox-static` with `guest-images/rootfs/init` as `/init`. Artifacts are
//! cached under `~/.cache/microvirt/images/<sha256 of the inputs>/`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::cmd::{self, CmdError};

/// The kernel config fragment kept in the repository.
pub const KERNEL_FRAGMENT: &[u8] = include_bytes!("../../../guest-images/kernel/microvm.config");
/// The guest's `/init`.
pub const INIT_SCRIPT: &[u8] = include_bytes!("../../../guest-images/rootfs/init");
/// udhcpc's event script in the guest (`/bin/dhcp-script`).
pub const DHCP_SCRIPT: &[u8] = include_bytes!("../../../guest-images/rootfs/dhcp-script");
/// Bump when the recipe in this file changes in a way that changes the artifacts.
const RECIPE_VERSION: &[u8] = b"microvirt-images-v2";
/// Size of the root filesystem image.
pub const ROOTFS_MIB: u64 = 32;

/// Debian packages the image build needs.
pub const BUILD_PACKAGES: &[&str] = &[
    "linux-source-6.1",
    "bc",
    "flex",
    "bison",
    "libelf-dev",
    "libssl-dev",
    "busybox-static",
    "e2fsprogs",
    "xz-utils",
    "cpio",
    "make",
    "gcc",
];

/// Errors from building the guest images.
#[derive(Debug, thiserror::Error)]
pub enum ImagesError {
    #[error(transparent)]
    Cmd(#[from] CmdError),
    #[error("no linux-source tarball in /usr/src (is linux-source-6.1 installed?)")]
    NoSource,
    #[error("kernel build produced no {0}")]
    Missing(PathBuf),
    #[error("the kernel configuration lost options of guest-images/kernel/microvm.config (a dependency is off): {0}")]
    Unmet(String),
}

/// The fragment's `CONFIG_X=y|n` lines that the final configuration does not carry (a `y`
/// whose dependencies are off is dropped silently by `olddefconfig`).
pub fn unmet_options(fragment: &str, config: &str) -> Vec<String> {
    let set: std::collections::HashSet<&str> = config.lines().collect();
    fragment
        .lines()
        .filter_map(|l| {
            let (opt, v) = l.trim().split_once('=')?;
            let opt = opt.strip_prefix("CONFIG_").map(|_| opt)?;
            let ok = match v {
                "n" => !set.contains(format!("{opt}=y").as_str()),
                _ => set.contains(l.trim()),
            };
            (!ok).then(|| l.trim().to_string())
        })
        .collect()
}

/// Paths of the built guest artifacts.
#[derive(Debug, Clone)]
pub struct GuestImages {
    pub dir: PathBuf,
    /// ELF vmlinux (PVH entry note).
    pub vmlinux: PathBuf,
    /// bzImage of the same kernel.
    pub bzimage: PathBuf,
    /// ext4 root filesystem image (busybox, `/init`).
    pub rootfs: PathBuf,
    /// The same root filesystem as an uncompressed initramfs (newc cpio), for disk-less boots.
    pub initrd: PathBuf,
    /// The kernel's final .config.
    pub config: PathBuf,
}

/// Wall-clock time of each step of a build (empty when everything was cached).
#[derive(Debug, Default, Clone)]
pub struct BuildTimes {
    pub steps: Vec<(String, f64)>,
    pub cached: bool,
}

fn progress(msg: &str) {
    eprintln!("[images] {msg}");
}

/// Parallel make jobs: `$MICROVIRT_JOBS` or 2.
pub fn jobs() -> String {
    std::env::var("MICROVIRT_JOBS").unwrap_or_else(|_| "2".into())
}

/// Hash of every input that determines the artifacts.
pub fn input_hash() -> Result<String, ImagesError> {
    let linux = cmd::dpkg_version("linux-source-6.1")?;
    let busybox = cmd::dpkg_version("busybox-static")?;
    Ok(cmd::sha256_hex(&[
        RECIPE_VERSION,
        KERNEL_FRAGMENT,
        INIT_SCRIPT,
        DHCP_SCRIPT,
        linux.as_bytes(),
        busybox.as_bytes(),
    ])?)
}

/// Hash of the kernel's inputs only (fragment, source version, recipe).
pub fn kernel_hash() -> Result<String, ImagesError> {
    let linux = cmd::dpkg_version("linux-source-6.1")?;
    Ok(cmd::sha256_hex(&[
        RECIPE_VERSION,
        KERNEL_FRAGMENT,
        linux.as_bytes(),
    ])?)
}

impl GuestImages {
    fn at(dir: &Path) -> Self {
        GuestImages {
            dir: dir.to_path_buf(),
            vmlinux: dir.join("vmlinux"),
            bzimage: dir.join("bzImage"),
            rootfs: dir.join("rootfs.ext4"),
            initrd: dir.join("rootfs.cpio"),
            config: dir.join("kernel.config"),
        }
    }
}

/// Builds (or finds cached) guest images. Installs missing build packages first.
pub fn build() -> Result<(GuestImages, BuildTimes), ImagesError> {
    cmd::ensure_packages(BUILD_PACKAGES)?;
    let hash = input_hash()?;
    let dir = cmd::cache_root().join("images").join(&hash[..16]);
    let images = GuestImages::at(&dir);
    let mut times = BuildTimes::default();
    if dir.join("done").exists() {
        progress(&format!("cached: {}", dir.display()));
        times.cached = true;
        return Ok((images, times));
    }
    // Several test binaries may ask at once: one builds, the others wait and find it cached.
    let _lock =
        cmd::CacheLock::acquire(&cmd::cache_root().join("images.lock"), "the guest images")?;
    if dir.join("done").exists() {
        progress(&format!("cached: {}", dir.display()));
        times.cached = true;
        return Ok((images, times));
    }
    cmd::mkdirs(&dir)?;
    let t = Instant::now();
    // The kernel is the slow part: it is cached on its own inputs, so editing the init only
    // rebuilds the rootfs.
    let kdir = cmd::cache_root()
        .join("kernels")
        .join(&kernel_hash()?[..16]);
    let kernel = GuestImages::at(&kdir);
    if !kdir.join("done").exists() {
        cmd::mkdirs(&kdir)?;
        build_kernel(&kdir, &kernel, &mut times)?;
        cmd::write(&kdir.join("done"), b"")?;
    } else {
        progress(&format!("kernel cached: {}", kdir.display()));
    }
    for (from, to) in [
        (&kernel.vmlinux, &images.vmlinux),
        (&kernel.bzimage, &images.bzimage),
        (&kernel.config, &images.config),
    ] {
        cmd::copy(from, to)?;
    }
    let r = Instant::now();
    build_rootfs(&dir, &images.rootfs, &images.initrd)?;
    times
        .steps
        .push(("rootfs".into(), r.elapsed().as_secs_f64()));
    cmd::write(&dir.join("done"), b"")?;
    progress(&format!(
        "built in {:.1} s: {}",
        t.elapsed().as_secs_f64(),
        dir.display()
    ));
    Ok((images, times))
}

fn source_tree() -> Result<PathBuf, ImagesError> {
    let version = cmd::dpkg_version("linux-source-6.1")?;
    let tarball = Path::new("/usr/src/linux-source-6.1.tar.xz");
    if !tarball.exists() {
        return Err(ImagesError::NoSource);
    }
    let root = cmd::cache_root()
        .join("src")
        .join(format!("linux-{version}"));
    let tree = root.join("linux-source-6.1");
    if root.join("done").exists() {
        return Ok(tree);
    }
    progress(&format!("unpacking {} ...", tarball.display()));
    cmd::remove_dir(&root)?;
    cmd::mkdirs(&root)?;
    cmd::run(
        Command::new("tar")
            .arg("-C")
            .arg(&root)
            .arg("-xf")
            .arg(tarball),
    )?;
    cmd::write(&root.join("done"), b"")?;
    Ok(tree)
}

fn build_kernel(
    dir: &Path,
    images: &GuestImages,
    times: &mut BuildTimes,
) -> Result<(), ImagesError> {
    let t = Instant::now();
    let src = source_tree()?;
    times
        .steps
        .push(("unpack source".into(), t.elapsed().as_secs_f64()));
    let out = dir.join("kbuild");
    cmd::mkdirs(&out)?;
    let fragment = dir.join("microvm.config");
    cmd::write(&fragment, KERNEL_FRAGMENT)?;
    let make = |args: &[&str]| -> Result<(), CmdError> {
        cmd::run(
            Command::new("make")
                .current_dir(&src)
                .arg(format!("O={}", out.display()))
                .args(args),
        )
    };
    progress("configuring kernel (tinyconfig + microvm.config)");
    make(&["-s", "tinyconfig"])?;
    cmd::run(
        Command::new("scripts/kconfig/merge_config.sh")
            .current_dir(&src)
            .arg("-m")
            .arg("-O")
            .arg(&out)
            .arg(out.join(".config"))
            .arg(&fragment),
    )?;
    make(&["-s", "olddefconfig"])?;
    let unmet = unmet_options(
        &String::from_utf8_lossy(KERNEL_FRAGMENT),
        &std::fs::read_to_string(out.join(".config")).map_err(|source| CmdError::Io {
            what: "reading",
            path: out.join(".config"),
            source,
        })?,
    );
    if !unmet.is_empty() {
        return Err(ImagesError::Unmet(unmet.join(", ")));
    }
    let t = Instant::now();
    progress(&format!(
        "building kernel (make -j{} bzImage; ~3.5 min on 2 cores) ...",
        jobs()
    ));
    make(&["-s", &format!("-j{}", jobs()), "bzImage"])?;
    times
        .steps
        .push(("kernel build".into(), t.elapsed().as_secs_f64()));
    for (from, to) in [
        (out.join("vmlinux"), &images.vmlinux),
        (out.join("arch/x86/boot/bzImage"), &images.bzimage),
        (out.join(".config"), &images.config),
    ] {
        if !from.exists() {
            return Err(ImagesError::Missing(from));
        }
        cmd::copy(&from, to)?;
    }
    // Debug info and symbols are not needed to boot; keep the image small for the initramfs.
    let _ = cmd::run(
        Command::new("strip")
            .arg("--strip-debug")
            .arg(&images.vmlinux),
    );
    cmd::remove_dir(&out)?;
    Ok(())
}

/// Builds the ext4 root filesystem with `mkfs.ext4 -d` (no loop mounts), and the same tree as a cpio.
pub fn build_rootfs(dir: &Path, image: &Path, initrd: &Path) -> Result<(), ImagesError> {
    progress("building rootfs (busybox-static, mkfs.ext4 -d)");
    let stage = dir.join("rootfs-stage");
    cmd::remove_dir(&stage)?;
    for d in ["bin", "dev", "proc", "sys", "tmp", "mnt", "root", "etc"] {
        cmd::mkdirs(&stage.join(d))?;
    }
    std::os::unix::fs::symlink("bin", stage.join("sbin")).map_err(|source| CmdError::Io {
        what: "symlinking",
        path: stage.join("sbin"),
        source,
    })?;
    cmd::copy(Path::new("/bin/busybox"), &stage.join("bin/busybox"))?;
    let applets = cmd::output(Command::new("/bin/busybox").arg("--list"))?;
    for a in applets.lines().map(str::trim).filter(|a| !a.is_empty()) {
        if a == "busybox" || a.contains('/') {
            continue;
        }
        let link = stage.join("bin").join(a);
        let _ = std::os::unix::fs::symlink("busybox", link);
    }
    cmd::write(&stage.join("init"), INIT_SCRIPT)?;
    cmd::write(&stage.join("bin/dhcp-script"), DHCP_SCRIPT)?;
    cmd::write(&stage.join("etc/hostname"), b"microvirt-guest\n")?;
    cmd::sh(&format!(
        "chmod 0755 {init} {dhcp} && rm -f {sbin_init} && ln -s ../init {bin_init}",
        init = cmd::quote(&stage.join("init")),
        dhcp = cmd::quote(&stage.join("bin/dhcp-script")),
        sbin_init = cmd::quote(&stage.join("bin/init")),
        bin_init = cmd::quote(&stage.join("bin/init")),
    ))?;
    // An initramfs needs /dev/console before devtmpfs is mounted (harmless on the ext4 image).
    if let Err(e) = cmd::sh(&format!(
        "mknod -m 600 {} c 5 1",
        cmd::quote(&stage.join("dev/console"))
    )) {
        progress(&format!("warning: no /dev/console node in the rootfs: {e}"));
    }
    cmd::sh(&format!(
        "cd {} && find . | cpio -o -H newc --quiet > {}",
        cmd::quote(&stage),
        cmd::quote(initrd)
    ))?;
    let _ = std::fs::remove_file(image);
    cmd::run(
        Command::new("mkfs.ext4")
            .args([
                "-q",
                "-F",
                "-L",
                "microvirt-root",
                "-E",
                "root_owner=0:0",
                "-d",
            ])
            .arg(&stage)
            .arg(image)
            .arg(format!("{ROOTFS_MIB}M")),
    )?;
    cmd::remove_dir(&stage)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_the_configuration_dropped_are_named() {
        let fragment = "# c\nCONFIG_A=y\nCONFIG_B=y\nCONFIG_C=n\nCONFIG_D=n\nCONFIG_E=\"x\"\n";
        let config = "CONFIG_A=y\n# CONFIG_B is not set\n# CONFIG_C is not set\nCONFIG_D=y\nCONFIG_E=\"x\"\n";
        assert_eq!(
            unmet_options(fragment, config),
            ["CONFIG_B=y", "CONFIG_D=n"]
        );
        // The shipped fragment is well formed: every option line is CONFIG_X=value.
        for l in String::from_utf8_lossy(KERNEL_FRAGMENT)
            .lines()
            .map(str::trim)
        {
            assert!(
                l.is_empty() || l.starts_with('#') || l.starts_with("CONFIG_"),
                "{l}"
            );
        }
    }
}
