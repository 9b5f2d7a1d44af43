//! A stock distribution guest, built from Debian's packages only: bookworm's
//! `linux-image-cloud-amd64` kernel, an initramfs made by initramfs-tools for it, and a small
//! busybox root (`guest-images/stock/init`) on the first partition of a partitioned raw disk.
//!
//! The kernel and initramfs come out of a minimal chroot made with `mmdebstrap` (root mode)
//! with the kernel package, `initramfs-tools`, `busybox` and `zstd` installed: the kernel's
//! postinst runs `update-initramfs` as on any Debian system (`MODULES=most`, zstd). Only
//! `/boot/vmlinuz-*`, `/boot/initrd.img-*`, the kernel config and two modules the
//! power-button scenario loads (`button.ko`, `evdev.ko`) are kept, under
//! `~/.cache/microvirt/stock/<kernel package>_<version>-<hash>/`, keyed by the kernel
//! package's version, initramfs-tools' version and this recipe. The disk is cached next to it,
//! keyed by the init script, busybox-static's version and the kernel directory.
//! [`cloud_image`] lays the same pieces out as a Debian cloud image (GPT, the kernel and
//! initramfs under `/boot`, a Debian-style `grub.cfg`, `qemu-img convert -O qcow2 -c`), cached
//! under `cloud-<hash>/`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cmd::{self, CmdError};

/// The root file system's `/sbin/init`.
pub const STOCK_INIT: &[u8] = include_bytes!("../../../guest-images/stock/init");
/// Bump when the recipe below changes what it produces.
const RECIPE_VERSION: &[u8] = b"microvirt-stock-v1";
/// The Debian metapackage whose kernel is booted.
pub const META_PACKAGE: &str = "linux-image-cloud-amd64";
/// The suite the chroot is made from.
pub const SUITE: &str = "bookworm";
/// Packages this machine needs to build the guest.
pub const HOST_PACKAGES: &[&str] = &["mmdebstrap", "fdisk", "e2fsprogs", "busybox-static"];
/// Size of the root file system (the partition); the disk has 1 MiB before it.
pub const ROOTFS_MIB: u64 = 16;
/// The MBR disk identifier: partition 1 is `PARTUUID=6d766d31-01`.
pub const DISK_ID: &str = "0x6d766d31";
/// Modules copied onto the root (paths below `/lib/modules/<release>/`).
const MODULES: &[(&str, &str)] = &[
    ("button", "kernel/drivers/acpi/button.ko"),
    ("evdev", "kernel/drivers/input/evdev.ko"),
];

/// Errors while building the stock guest.
#[derive(Debug, thiserror::Error)]
pub enum StockError {
    #[error(transparent)]
    Cmd(#[from] CmdError),
    #[error("cannot find the kernel package behind {META_PACKAGE} in `apt-cache depends`")]
    NoKernelPackage,
    #[error("no candidate version of {0} in `apt-cache policy`")]
    NoCandidate(String),
    #[error("{0} not found in the chroot")]
    Missing(PathBuf),
}

/// The built guest.
#[derive(Debug, Clone)]
pub struct StockGuest {
    /// Debian's kernel package (e.g. `linux-image-6.1.0-57-cloud-amd64`) and its version.
    pub kernel_package: String,
    pub kernel_version: String,
    /// `uname -r` of the kernel.
    pub release: String,
    /// bzImage.
    pub vmlinuz: PathBuf,
    /// The initramfs-tools initramfs.
    pub initrd: PathBuf,
    /// The kernel's config.
    pub config: PathBuf,
    /// Raw disk, MBR, partition 1 = ext4 root.
    pub disk: PathBuf,
}

impl StockGuest {
    /// `(environment variable, file)` of each piece, as the scenarios expect them
    /// ([`crate::scenarios::Prepared::guest_files`]).
    pub fn guest_files(&self) -> Vec<(String, PathBuf)> {
        vec![
            ("STOCK_VMLINUZ".into(), self.vmlinuz.clone()),
            ("STOCK_INITRD".into(), self.initrd.clone()),
            ("STOCK_DISK".into(), self.disk.clone()),
        ]
    }
}

pub(crate) fn progress(msg: &str) {
    eprintln!("[stock] {msg}");
}

/// The kernel package behind the metapackage and its candidate version, and initramfs-tools'
/// candidate version, from this machine's apt lists.
fn resolve() -> Result<(String, String, String), StockError> {
    let deps = cmd::output(Command::new("apt-cache").args(["depends", META_PACKAGE]))?;
    let pkg = deps
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|p| p.starts_with("linux-image-"))
        .map(str::to_string)
        .ok_or(StockError::NoKernelPackage)?;
    let version = candidate(&pkg)?;
    let itools = candidate("initramfs-tools")?;
    Ok((pkg, version, itools))
}

pub(crate) fn candidate(pkg: &str) -> Result<String, StockError> {
    let out = cmd::output(Command::new("apt-cache").args(["policy", pkg]))?;
    out.lines()
        .filter_map(|l| l.trim().strip_prefix("Candidate: "))
        .map(str::trim)
        .find(|v| *v != "(none)")
        .map(str::to_string)
        .ok_or_else(|| StockError::NoCandidate(pkg.into()))
}

/// The mmdebstrap command line (without the target directory).
fn mmdebstrap_args(pkg: &str, version: &str) -> Vec<String> {
    vec![
        "--variant=essential".into(),
        format!("--include={pkg}={version},initramfs-tools,busybox,zstd"),
        "--dpkgopt=path-exclude=/usr/share/doc/*".into(),
        "--dpkgopt=path-exclude=/usr/share/man/*".into(),
        "--dpkgopt=path-exclude=/usr/share/locale/*".into(),
        "--quiet".into(),
        SUITE.into(),
    ]
}

/// Builds (or finds cached) the stock guest. Installs the host packages it needs first.
pub fn build() -> Result<StockGuest, StockError> {
    cmd::ensure_packages(HOST_PACKAGES)?;
    let (pkg, version, itools) = match resolve() {
        Ok(r) => r,
        Err(_) => {
            // Lists never fetched (a fresh machine): fetch them once.
            let _ = cmd::run(Command::new("apt-get").args(["update", "-q"]));
            resolve()?
        }
    };
    let boot = boot_files(&pkg, &version, &itools).or_else(|e| {
        // The mirror may have moved past this machine's lists: refresh them and try again.
        progress(&format!("{e}; apt-get update and one more try"));
        let _ = cmd::run(Command::new("apt-get").args(["update", "-q"]));
        let (pkg, version, itools) = resolve()?;
        boot_files(&pkg, &version, &itools)
    })?;
    let disk = disk(&boot)?;
    Ok(StockGuest { disk, ..boot })
}

/// The kernel, initramfs, config and modules, from an mmdebstrap chroot (cached).
fn boot_files(pkg: &str, version: &str, itools: &str) -> Result<StockGuest, StockError> {
    let args = mmdebstrap_args(pkg, version);
    let key = cmd::sha256_hex(&[RECIPE_VERSION, itools.as_bytes(), args.join(" ").as_bytes()])?;
    let dir = cmd::cache_root()
        .join("stock")
        .join(format!("{pkg}_{version}-{}", &key[..12]));
    let done = dir.join("done");
    let _lock = if done.exists() {
        None
    } else {
        Some(cmd::CacheLock::acquire(
            &cmd::cache_root().join("stock.lock"),
            "building the stock Debian guest",
        )?)
    };
    if !done.exists() {
        let t = std::time::Instant::now();
        progress(&format!(
            "mmdebstrap {SUITE} with {pkg} {version}, initramfs-tools {itools} (~1-2 min) ..."
        ));
        cmd::remove_dir(&dir)?;
        cmd::mkdirs(&dir)?;
        let chroot = dir.join("chroot");
        let r = cmd::run(Command::new("mmdebstrap").args(&args).arg(&chroot))
            .map_err(StockError::from)
            .and_then(|()| take_from_chroot(&chroot, &dir));
        // The chroot is ~300 MB and nothing else needs it.
        let _ = cmd::remove_dir(&chroot);
        r?;
        cmd::write(&done, b"")?;
        progress(&format!(
            "built in {:.0} s: {}",
            t.elapsed().as_secs_f64(),
            dir.display()
        ));
    }
    let release = String::from_utf8_lossy(&cmd::read(&dir.join("release"))?)
        .trim()
        .to_string();
    Ok(StockGuest {
        kernel_package: pkg.into(),
        kernel_version: version.into(),
        release,
        vmlinuz: dir.join("vmlinuz"),
        initrd: dir.join("initrd.img"),
        config: dir.join("config"),
        disk: PathBuf::new(),
    })
}

/// Copies the boot files and modules out of the chroot into `dir`.
fn take_from_chroot(chroot: &Path, dir: &Path) -> Result<(), StockError> {
    let boot = chroot.join("boot");
    let vmlinuz = std::fs::read_dir(&boot)
        .map_err(|source| CmdError::Io {
            what: "listing",
            path: boot.clone(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
        })
        .ok_or_else(|| StockError::Missing(boot.join("vmlinuz-*")))?;
    let release = vmlinuz
        .file_name()
        .map(|n| {
            n.to_string_lossy()
                .trim_start_matches("vmlinuz-")
                .to_string()
        })
        .unwrap_or_default();
    let initrd = boot.join(format!("initrd.img-{release}"));
    if !initrd.exists() {
        return Err(StockError::Missing(initrd));
    }
    cmd::copy(&vmlinuz, &dir.join("vmlinuz"))?;
    cmd::copy(&initrd, &dir.join("initrd.img"))?;
    cmd::copy(&boot.join(format!("config-{release}")), &dir.join("config"))?;
    let moddir = chroot.join("lib/modules").join(&release);
    for (name, rel) in MODULES {
        let plain = moddir.join(rel);
        let xz = moddir.join(format!("{rel}.xz"));
        if !plain.exists() && xz.exists() {
            cmd::run(Command::new("xz").arg("-d").arg("-k").arg(&xz))?;
        }
        if !plain.exists() {
            return Err(StockError::Missing(plain));
        }
        cmd::copy(&plain, &dir.join(format!("{name}.ko")))?;
    }
    // What went into the initramfs, for the record.
    let versions = cmd::output(
        Command::new("dpkg-query")
            .arg(format!(
                "--admindir={}",
                chroot.join("var/lib/dpkg").display()
            ))
            .args(["-W", "-f=${Package} ${Version}\n"]),
    )?;
    cmd::write(&dir.join("versions"), versions)?;
    cmd::write(&dir.join("release"), &release)?;
    Ok(())
}

/// The partitioned raw disk (cached): MBR, partition 1 from 1 MiB, ext4 with busybox-static,
/// the init and the two modules.
fn disk(boot: &StockGuest) -> Result<PathBuf, StockError> {
    let busybox = cmd::dpkg_version("busybox-static")?;
    let kdir = boot
        .vmlinuz
        .parent()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let key = cmd::sha256_hex(&[
        RECIPE_VERSION,
        STOCK_INIT,
        busybox.as_bytes(),
        kdir.as_bytes(),
    ])?;
    let dir = cmd::cache_root()
        .join("stock")
        .join(format!("disk-{}", &key[..16]));
    let img = dir.join("disk.img");
    cached_build(&dir, "the stock guest's disk", || {
        progress("building the root disk (MBR, ext4 on partition 1)");
        let stage = dir.join("stage");
        stage_root(boot, &stage)?;
        one_partition_disk(
            &dir,
            &stage,
            &["-L", "stock-root"],
            ROOTFS_MIB,
            // The whole disk: 1 MiB before the partition.
            ROOTFS_MIB + 1,
            &format!("label: dos\\nlabel-id: {DISK_ID}\\nunit: sectors\\n\\nstart=2048, size={}, type=83\\n", ROOTFS_MIB * 2048),
            &img,
        )
    })?;
    Ok(img)
}

/// Builds into `dir` once: returns at once when `dir` holds a finished build, else takes the
/// stock cache's lock, looks again (another process may have built it meanwhile), clears `dir`
/// and runs `build`, then marks `dir` finished.
pub(crate) fn cached_build(
    dir: &Path,
    what: &str,
    build: impl FnOnce() -> Result<(), StockError>,
) -> Result<(), StockError> {
    cached_build_under(&cmd::cache_root().join("stock.lock"), dir, what, build)
}

/// [`cached_build`] under the lock file `lock` (a cache of its own need not wait for the stock
/// cache's builds).
pub(crate) fn cached_build_under(
    lock: &Path,
    dir: &Path,
    what: &str,
    build: impl FnOnce() -> Result<(), StockError>,
) -> Result<(), StockError> {
    let done = dir.join("done");
    if done.exists() {
        return Ok(());
    }
    let _lock = cmd::CacheLock::acquire(lock, &format!("building {what}"))?;
    if done.exists() {
        return Ok(());
    }
    cmd::remove_dir(dir)?;
    build()?;
    cmd::write(&done, b"")?;
    Ok(())
}

/// Writes `img`: a disk of `disk_mib` MiB laid out by the sfdisk script `layout`, whose one
/// partition (at 1 MiB) holds an ext4 of `fs_mib` MiB made from `stage` with the extra
/// `mkfs.ext4` arguments `mkfs`. Removes `stage` and the file system image afterwards.
pub(crate) fn one_partition_disk(
    dir: &Path,
    stage: &Path,
    mkfs: &[&str],
    fs_mib: u64,
    disk_mib: u64,
    layout: &str,
    img: &Path,
) -> Result<(), StockError> {
    let fs = dir.join("root.ext4");
    cmd::run(
        Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .args(mkfs)
            .args(["-E", "root_owner=0:0", "-d"])
            .arg(stage)
            .arg(&fs)
            .arg(format!("{fs_mib}M")),
    )?;
    cmd::run(
        Command::new("truncate")
            .arg("-s")
            .arg(format!("{disk_mib}M"))
            .arg(img),
    )?;
    cmd::sh(&format!(
        "printf '{layout}' | sfdisk -q {img}",
        img = cmd::quote(img)
    ))?;
    cmd::sh(&format!(
        "dd if={fs} of={img} bs=1M seek=1 conv=notrunc status=none",
        fs = cmd::quote(&fs),
        img = cmd::quote(img)
    ))?;
    cmd::remove_dir(stage)?;
    let _ = std::fs::remove_file(&fs);
    Ok(())
}

/// Fills `stage` with the root file system: busybox-static and its applets, the init as
/// `/sbin/init` and the two modules.
fn stage_root(boot: &StockGuest, stage: &Path) -> Result<(), StockError> {
    for d in [
        "bin",
        "dev",
        "proc",
        "sys",
        "tmp",
        "run",
        "root",
        "lib/modules",
    ] {
        cmd::mkdirs(&stage.join(d))?;
    }
    std::os::unix::fs::symlink("bin", stage.join("sbin")).map_err(|source| CmdError::Io {
        what: "symlinking",
        path: stage.join("sbin"),
        source,
    })?;
    cmd::copy(Path::new("/bin/busybox"), &stage.join("bin/busybox"))?;
    let applets = cmd::output(Command::new("/bin/busybox").arg("--list"))?;
    for a in applets.lines().map(str::trim) {
        if a.is_empty() || a == "busybox" || a == "init" || a.contains('/') {
            continue;
        }
        let _ = std::os::unix::fs::symlink("busybox", stage.join("bin").join(a));
    }
    cmd::write(&stage.join("bin/init"), STOCK_INIT)?;
    for (name, _) in MODULES {
        let ko = boot.vmlinuz.with_file_name(format!("{name}.ko"));
        cmd::copy(&ko, &stage.join("lib/modules").join(format!("{name}.ko")))?;
    }
    cmd::sh(&format!(
        "chmod 0755 {}",
        cmd::quote(&stage.join("bin/init"))
    ))?;
    Ok(())
}

/// The ext4 file-system UUID of the cloud image's root (its `grub.cfg` says `root=UUID=` this).
pub const CLOUD_FS_UUID: &str = "6d766d31-c10d-4a6e-8b1e-5d0c10d1ae01";
/// Size of the cloud image's root partition (the kernel and initramfs are on it).
pub const CLOUD_ROOTFS_MIB: u64 = 64;
/// What the cloud image's default GRUB entry adds after `root=UUID=... ro` (Debian's cloud
/// images' serial console, `quiet` as Debian's `GRUB_CMDLINE_LINUX_DEFAULT`, and the init's
/// scenario: boot, reboot once, power off on the second boot).
pub const CLOUD_ARGS: &str =
    "console=tty0 console=ttyS0,115200 quiet microvirt.scenario=reboot-once";

/// The stock guest laid out as a Debian cloud image.
#[derive(Debug, Clone)]
pub struct CloudImage {
    /// `qemu-img convert -O qcow2 -c` of the partitioned disk.
    pub qcow2: PathBuf,
    /// The partitioned disk itself (raw), the same bytes the qcow2 holds.
    pub raw: PathBuf,
    /// `uname -r` of the kernel in its `/boot`.
    pub release: String,
}

/// One `menuentry` as Debian's `/etc/grub.d/10_linux` writes it.
fn grub_entry(indent: &str, title: &str, id: &str, release: &str, args: &str) -> String {
    let u = CLOUD_FS_UUID;
    format!(
        "{indent}menuentry '{title}' --class debian --class gnu-linux --class gnu --class os \
         $menuentry_id_option '{id}' {{\n\
         {indent}\tload_video\n{indent}\tinsmod gzio\n{indent}\tinsmod part_gpt\n{indent}\tinsmod ext2\n\
         {indent}\tsearch --no-floppy --fs-uuid --set=root {u}\n\
         {indent}\techo\t'Loading Linux {release} ...'\n\
         {indent}\tlinux\t/boot/vmlinuz-{release} root=UUID={u} ro {args}\n\
         {indent}\techo\t'Loading initial ramdisk ...'\n\
         {indent}\tinitrd\t/boot/initrd.img-{release}\n\
         {indent}}}\n"
    )
}

/// The grub.cfg of the cloud image, in the shape Debian's `update-grub` writes it: the default
/// entry, then an "Advanced options" submenu with the same kernel and a recovery entry.
pub fn cloud_grub_cfg(release: &str) -> String {
    let u = CLOUD_FS_UUID;
    let mut s = String::from(
        "#\n# DO NOT EDIT THIS FILE\n#\n\
         # It is automatically generated by grub-mkconfig using templates\n\
         # from /etc/grub.d and settings from /etc/default/grub\n#\n\n\
         ### BEGIN /etc/grub.d/00_header ###\n\
         if [ -s $prefix/grubenv ]; then\n  load_env\nfi\n\
         if [ \"${next_entry}\" ] ; then\n   set default=\"${next_entry}\"\n   set next_entry=\n\
         \x20  save_env next_entry\n   set boot_once=true\nelse\n   set default=\"0\"\nfi\n\
         if [ x\"${feature_menuentry_id}\" = xy ]; then\n  menuentry_id_option=\"--id\"\n\
         else\n  menuentry_id_option=\"\"\nfi\nexport menuentry_id_option\n\
         serial --speed=115200\nterminal_input serial console\nterminal_output serial console\n\
         set timeout=0\n### END /etc/grub.d/00_header ###\n\n### BEGIN /etc/grub.d/10_linux ###\n",
    );
    s += &grub_entry(
        "",
        "Debian GNU/Linux",
        &format!("gnulinux-simple-{u}"),
        release,
        CLOUD_ARGS,
    );
    s += &format!(
        "submenu 'Advanced options for Debian GNU/Linux' $menuentry_id_option \
         'gnulinux-advanced-{u}' {{\n"
    );
    s += &grub_entry(
        "\t",
        &format!("Debian GNU/Linux, with Linux {release}"),
        &format!("gnulinux-{release}-advanced-{u}"),
        release,
        CLOUD_ARGS,
    );
    s += &grub_entry(
        "\t",
        &format!("Debian GNU/Linux, with Linux {release} (recovery mode)"),
        &format!("gnulinux-{release}-recovery-{u}"),
        release,
        "single microvirt.scenario=recovery",
    );
    s += "}\n### END /etc/grub.d/10_linux ###\n";
    s
}

/// The cloud image (cached): a GPT disk whose one partition (from 1 MiB) is an ext4 root with
/// UUID [`CLOUD_FS_UUID`] holding the stock root of [`build`] plus `/boot/vmlinuz-<release>`,
/// `/boot/initrd.img-<release>`, `/boot/config-<release>` and `/boot/grub/grub.cfg`
/// ([`cloud_grub_cfg`]), kept raw and converted with `qemu-img convert -O qcow2 -c`. Keyed by the recipe,
/// the init, the grub.cfg, busybox-static's and qemu-utils' versions and the kernel directory.
pub fn cloud_image(boot: &StockGuest) -> Result<CloudImage, StockError> {
    cmd::ensure_packages(&["qemu-utils"])?;
    let busybox = cmd::dpkg_version("busybox-static")?;
    let qemu = cmd::dpkg_version("qemu-utils")?;
    let grub = cloud_grub_cfg(&boot.release);
    let kdir = boot
        .vmlinuz
        .parent()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let key = cmd::sha256_hex(&[
        RECIPE_VERSION,
        b"cloud-image-v2",
        STOCK_INIT,
        grub.as_bytes(),
        busybox.as_bytes(),
        qemu.as_bytes(),
        kdir.as_bytes(),
    ])?;
    let dir = cmd::cache_root()
        .join("stock")
        .join(format!("cloud-{}", &key[..16]));
    let qcow2 = dir.join("debian-cloud.qcow2");
    let img = dir.join("debian-cloud.img");
    let out = CloudImage {
        qcow2: qcow2.clone(),
        raw: img.clone(),
        release: boot.release.clone(),
    };
    cached_build(&dir, "the stock guest's cloud image", || {
        progress("building the cloud image (GPT, ext4 root with /boot and grub.cfg, qcow2)");
        let stage = dir.join("stage");
        stage_root(boot, &stage)?;
        let r = &boot.release;
        cmd::mkdirs(&stage.join("boot/grub"))?;
        cmd::copy(&boot.vmlinuz, &stage.join(format!("boot/vmlinuz-{r}")))?;
        cmd::copy(&boot.initrd, &stage.join(format!("boot/initrd.img-{r}")))?;
        cmd::copy(&boot.config, &stage.join(format!("boot/config-{r}")))?;
        cmd::write(&stage.join("boot/grub/grub.cfg"), grub.as_bytes())?;
        one_partition_disk(
            &dir,
            &stage,
            &["-L", "debian-root", "-U", CLOUD_FS_UUID],
            CLOUD_ROOTFS_MIB,
            // 1 MiB before the partition, 1 MiB after it for the backup GPT.
            CLOUD_ROOTFS_MIB + 2,
            &format!(
                "label: gpt\\nunit: sectors\\n\\nstart=2048, size={}, type=0FC63DAF-8483-4772-8E79-3D69D8477DE4, name=root\\n",
                CLOUD_ROOTFS_MIB * 2048
            ),
            &img,
        )?;
        cmd::run(
            Command::new("qemu-img")
                .args(["convert", "-q", "-f", "raw", "-O", "qcow2", "-c"])
                .arg(&img)
                .arg(&qcow2),
        )?;
        Ok(())
    })?;
    Ok(out)
}

/// microvm's default kernel arguments (without its `virtio_mmio.device=` entries), which the
/// benchmarks give QEMU too so that both guests boot with one command line.
pub const MICROVM_DEFAULT_ARGS: &str =
    "console=ttyS0 reboot=k panic=1 pci=off i8042.noaux i8042.nomux i8042.dumbkbd swiotlb=noforce";

/// One boot of the stock guest in [`bench`] (test-host seconds from the VMM's start).
#[derive(Debug, Clone, PartialEq)]
pub struct StockSample {
    /// `microvm` or `qemu`.
    pub vmm: String,
    pub run: usize,
    /// Start → the root's `microvirt: init up` line.
    pub init_secs: Option<f64>,
    /// Start → the VMM's exit after the guest's S5 power-off.
    pub exit_secs: Option<f64>,
    /// The guest's own uptime at its init line (kernel + initramfs).
    pub guest_uptime_at_init: Option<f64>,
}

/// The test-host shell that boots the stock guest `runs` times under `microvm` and under QEMU
/// `-M microvm,acpi=on`, interleaved, with the same kernel, initramfs, disks, NIC, memory,
/// vCPUs and command line (microvm's defaults, given to QEMU too without the
/// `virtio_mmio.device=` entries), and prints `T VMM RUN init|end SECS [UPTIME]` lines.
pub fn bench_body(runs: usize) -> String {
    let defaults = MICROVM_DEFAULT_ARGS;
    format!(
        r#"export WORK=/tmp/stock-bench; mkdir -p $WORK; cd $WORK
dd if=/dev/zero of=data.img bs=1M count=4 2>/dev/null
tunctl -t sbtap0 >/dev/null; ip link set sbtap0 up
now() {{ cut -d' ' -f1 /proc/uptime; }}
# stamp VMM RUN: the console, prefixed, and a T line at the guest's init
stamp() {{ while IFS= read -r l; do case "$l" in *"microvirt: init up"*) echo "T $1 $2 init $(awk -v a=$(now) -v b=$t0 'BEGIN{{print a-b}}') ${{l##* }}";; esac; echo "[$1$2] $l"; done; }}
for i in $(seq 1 {runs}); do
	cp "$STOCK_DISK" root.img
	t0=$(now)
	/bin/microvm --kernel "$STOCK_VMLINUZ" --initrd "$STOCK_INITRD" --mem-mib 512 --vcpus 2 \
		--disk path=root.img --disk path=data.img,ro --net tap=sbtap0,mac=06:00:0a:00:04:02 \
		--cmdline "root=/dev/vda1 ro quiet" 2>&1 | stamp microvm $i
	echo "T microvm $i end $(awk -v a=$(now) -v b=$t0 'BEGIN{{print a-b}}')"
	cp "$STOCK_DISK" root.img
	t0=$(now)
	/bin/qemu-system-x86_64 -L /usr/share/qemu -M microvm,acpi=on,x-option-roms=off,rtc=off -accel kvm -cpu host \
		-m 512 -smp 2 -nodefaults -no-user-config -nographic -serial stdio -monitor none -no-reboot \
		-kernel "$STOCK_VMLINUZ" -initrd "$STOCK_INITRD" -append "{defaults} root=/dev/vda1 ro quiet" \
		-drive id=d0,file=root.img,format=raw,if=none -device virtio-blk-device,drive=d0 \
		-drive id=d1,file=data.img,format=raw,if=none,readonly=on -device virtio-blk-device,drive=d1 \
		-netdev tap,id=n0,ifname=sbtap0,script=no,downscript=no -device virtio-net-device,netdev=n0,mac=06:00:0a:00:04:02 \
		2>&1 | stamp qemu $i
	echo "T qemu $i end $(awk -v a=$(now) -v b=$t0 'BEGIN{{print a-b}}')"
done
ip link del sbtap0 2>/dev/null
"#
    )
}

/// One `T VMM RUN WHAT [NUMBER...]` line of a benchmark's test-host output.
#[derive(Debug, Clone, PartialEq)]
pub struct TLine<'a> {
    pub vmm: &'a str,
    pub run: usize,
    pub what: &'a str,
    /// The numbers after WHAT, up to the first word that is not one.
    pub values: Vec<f64>,
}

/// The `T ...` lines of a benchmark's output, also when the test host's console prefixed them
/// (`[l1 12.3] T ...`); other lines are skipped.
pub fn t_lines(lines: &[String]) -> Vec<TLine<'_>> {
    lines
        .iter()
        .filter_map(|l| {
            let rest = l
                .split_once("] T ")
                .map(|(_, r)| r)
                .or(l.strip_prefix("T "))?;
            let mut w = rest.split_whitespace();
            let vmm = w.next()?;
            let run = w.next()?.parse().ok()?;
            let what = w.next()?;
            let values = w.map_while(|v| v.parse().ok()).collect();
            Some(TLine {
                vmm,
                run,
                what,
                values,
            })
        })
        .collect()
}

/// The position of the sample `is` picks in `out`, pushing `new()` first when there is none.
pub fn sample_index<T>(
    out: &mut Vec<T>,
    is: impl Fn(&T) -> bool,
    new: impl FnOnce() -> T,
) -> usize {
    match out.iter().position(is) {
        Some(i) => i,
        None => {
            out.push(new());
            out.len() - 1
        }
    }
}

/// Parses the `T ...` lines of [`bench_body`]'s output.
pub fn parse_bench(lines: &[String]) -> Vec<StockSample> {
    let mut out: Vec<StockSample> = Vec::new();
    for t in t_lines(lines) {
        let Some(&secs) = t.values.first() else {
            continue;
        };
        let i = sample_index(
            &mut out,
            |s| s.vmm == t.vmm && s.run == t.run,
            || StockSample {
                vmm: t.vmm.to_string(),
                run: t.run,
                init_secs: None,
                exit_secs: None,
                guest_uptime_at_init: None,
            },
        );
        match t.what {
            "init" => {
                out[i].init_secs = Some(secs);
                out[i].guest_uptime_at_init = t.values.get(1).copied();
            }
            "end" => out[i].exit_secs = Some(secs),
            _ => {}
        }
    }
    out
}

/// Boots the stock guest `runs` times under each VMM in one test-host boot (with QEMU in it).
pub fn bench(
    prep: &crate::scenarios::Prepared,
    guest: &StockGuest,
    runs: usize,
    echo: bool,
) -> Result<(Vec<StockSample>, crate::qemu::Console), crate::scenarios::ScenarioError> {
    let console = run_in_test_host(
        prep,
        guest.guest_files(),
        Vec::new(),
        &bench_body(runs),
        "stock-bench",
        std::time::Duration::from_secs(120 + 400 * runs as u64),
        echo,
    )?;
    Ok((parse_bench(&console.lines), console))
}

/// Boots the test host once (with QEMU in it) with `files` — `(VARIABLE, file here)` — copied
/// under `/guest/extra/` (lower-case variable names) and their variables exported, `binaries` in
/// `/bin` besides microvm, and runs `body` as its shell; `tag` names the initramfs and the console
/// log in the work dir. The benchmarks' common part (stock, disk, systemd).
pub(crate) fn run_in_test_host(
    prep: &crate::scenarios::Prepared,
    files: Vec<(String, PathBuf)>,
    binaries: Vec<PathBuf>,
    body: &str,
    tag: &str,
    timeout: std::time::Duration,
    echo: bool,
) -> Result<crate::qemu::Console, crate::scenarios::ScenarioError> {
    let kernel = match &prep.l1 {
        Some(k) => k.clone(),
        None => crate::l1::kernel()?,
    };
    let exports: String = files
        .iter()
        .map(|(var, _)| format!("export {var}=/guest/extra/{}\n", var.to_ascii_lowercase()))
        .collect();
    let initramfs = prep.workdir.join(format!("l1-{tag}.cpio"));
    crate::l1::build_initramfs(
        &crate::l1::InitramfsSpec {
            kernel: &kernel,
            images: &prep.images,
            binaries: std::iter::once(prep.microvm.clone())
                .chain(binaries)
                .collect(),
            with_qemu: true,
            files: Vec::new(),
            copies: files
                .into_iter()
                .map(|(var, p)| (format!("/guest/extra/{}", var.to_ascii_lowercase()), p))
                .collect(),
            init: crate::scenarios::l1_init(&format!("{exports}{body}")),
        },
        &initramfs,
    )?;
    let monitor = prep.workdir.join("qemu-monitor.sock");
    let console = crate::qemu::run_console(
        crate::qemu::qemu_tcg_command(
            &kernel.vmlinuz,
            &initramfs,
            crate::qemu::TEST_HOST_APPEND,
            "2G",
            &monitor,
        ),
        &crate::qemu::RunOptions {
            name: "l1".into(),
            timeout,
            log: prep.workdir.join(format!("{tag}-console.log")),
            echo,
            done_marker: crate::qemu::DONE_MARKER.into(),
            monitor: Some(monitor),
            silence: None,
        },
    )?;
    let _ = std::fs::remove_file(&initramfs);
    Ok(console)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cloud_grub_cfg_has_debians_shape() {
        let cfg = cloud_grub_cfg("6.1.0-9-cloud-amd64");
        let linux: Vec<&str> = cfg
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix("linux\t"))
            .collect();
        assert_eq!(linux.len(), 3, "{cfg}");
        assert_eq!(
            linux[0],
            format!("/boot/vmlinuz-6.1.0-9-cloud-amd64 root=UUID={CLOUD_FS_UUID} ro {CLOUD_ARGS}")
        );
        assert!(linux[2].contains(" single "), "{cfg}");
        assert_eq!(
            cfg.matches("initrd\t/boot/initrd.img-6.1.0-9-cloud-amd64\n")
                .count(),
            3
        );
        assert!(cfg.contains("set default=\"0\"") && cfg.contains("submenu 'Advanced options"));
        assert_eq!(cfg.matches('{').count(), cfg.matches('}').count(), "{cfg}");
    }

    #[test]
    fn bench_lines_parse_into_samples() {
        let lines: Vec<String> = [
            "[l1   79.16] T microvm 1 init 53.46 46.02",
            "[l1   79.20] [microvm1] microvirt: init up 46.02",
            "[l1   94.53] T microvm 1 end 68.9",
            "[l1  177.48] T qemu 1 init 82.85 52.59",
            "T qemu 1 end 101.7",
            "T qemu 2 init x",
            "[l1 1.0] noise T",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let s = parse_bench(&lines);
        assert_eq!(s.len(), 2);
        assert_eq!(
            s[0],
            StockSample {
                vmm: "microvm".into(),
                run: 1,
                init_secs: Some(53.46),
                exit_secs: Some(68.9),
                guest_uptime_at_init: Some(46.02),
            }
        );
        assert_eq!(s[1].vmm, "qemu");
        assert_eq!(s[1].exit_secs, Some(101.7));
        assert!(bench_body(2).contains("seq 1 2") && bench_body(2).contains("acpi=on"));
    }
}
