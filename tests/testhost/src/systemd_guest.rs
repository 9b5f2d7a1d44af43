//! A Debian bookworm cloud image with **systemd and cloud-init**, built from Debian's packages
//! only: what a user's own cloud image looks like, for the scenarios that need a whole
//! distribution (multi-user.target, DHCP by systemd-networkd, cloud-init user data, logind's
//! power key, `systemctl reboot`).
//!
//! `mmdebstrap --variant=essential` with the stock guest's kernel package (the same version as
//! [`crate::stock::build`]), initramfs-tools, systemd-sysv, udev, dbus, cloud-init and
//! e2fsprogs; then, as Debian's cloud images have them: an `/etc/fstab` naming the root by
//! UUID, systemd-networkd enabled (cloud-init renders the NIC's DHCP for it), and a
//! `/boot/grub/grub.cfg` whose default entry boots `/boot/vmlinuz-<release>` with Debian's
//! cloud command line (serial console, no `quiet`). The root goes onto partition 1 of a GPT disk
//! (ext4, UUID [`FS_UUID`]) and the disk through `qemu-img convert -O qcow2 -c`, as a
//! containerDisk holds it. Nothing of microvirt is in the image.
//!
//! Cached under `~/.cache/microvirt/stock/systemd-<hash>/`, keyed by this recipe and the
//! candidate versions of the kernel, systemd, cloud-init and initramfs-tools from this machine's
//! apt lists (~1.5 min to build, ~140 MB).

use std::path::PathBuf;
use std::process::Command;

use crate::cmd;
use crate::stock::{self, StockError, StockGuest};

/// Bump when the recipe below changes what it produces.
const RECIPE: &[u8] = b"microvirt-systemd-guest-v1";
/// The root file system's UUID (the grub.cfg's `root=UUID=`, the fstab's).
pub const FS_UUID: &str = "6d766d31-5d5d-4c1d-9e11-c10d1ae0a502";
/// Packages installed next to the kernel.
pub const PACKAGES: &[&str] = &[
    "initramfs-tools",
    "zstd",
    "busybox",
    "systemd-sysv",
    "udev",
    "dbus",
    "e2fsprogs",
    "cloud-init",
];
/// Size of the root partition (the installed system is ~390 MB).
pub const ROOTFS_MIB: u64 = 640;
/// The grub.cfg's command line after `root=UUID=... ro`: Debian's cloud images' serial console.
pub const ARGS: &str = "console=tty0 console=ttyS0,115200 earlyprintk=ttyS0,115200 consoleblank=0";

/// The built image.
#[derive(Debug, Clone)]
pub struct SystemdGuest {
    /// The qcow2 containerDisk image.
    pub qcow2: PathBuf,
    /// `uname -r` of its kernel.
    pub release: String,
    /// `dpkg-query -W` of the root: what is in the image.
    pub versions: PathBuf,
}

/// The grub.cfg: one default entry, as Debian's `update-grub` writes it (reduced).
pub fn grub_cfg(release: &str) -> String {
    let u = FS_UUID;
    format!(
        "set default=\"0\"\nset timeout=0\nserial --speed=115200\n\
         terminal_input serial console\nterminal_output serial console\n\
         menuentry 'Debian GNU/Linux' --class debian --class gnu-linux --class gnu --class os \
         $menuentry_id_option 'gnulinux-simple-{u}' {{\n\
         \tinsmod ext2\n\
         \tsearch --no-floppy --fs-uuid --set=root {u}\n\
         \techo\t'Loading Linux {release} ...'\n\
         \tlinux\t/boot/vmlinuz-{release} root=UUID={u} ro {ARGS}\n\
         \techo\t'Loading initial ramdisk ...'\n\
         \tinitrd\t/boot/initrd.img-{release}\n}}\n"
    )
}

/// Builds (or finds cached) the image for the stock guest's kernel.
pub fn build(boot: &StockGuest) -> Result<SystemdGuest, StockError> {
    cmd::ensure_packages(&["mmdebstrap", "qemu-utils", "e2fsprogs", "fdisk"])?;
    let mut key_parts: Vec<Vec<u8>> = vec![
        RECIPE.to_vec(),
        boot.kernel_package.clone().into_bytes(),
        boot.kernel_version.clone().into_bytes(),
        grub_cfg(&boot.release).into_bytes(),
    ];
    for p in ["systemd", "cloud-init", "initramfs-tools", "python3"] {
        key_parts.push(format!("{p}={}", stock::candidate(p)?).into_bytes());
    }
    let parts: Vec<&[u8]> = key_parts.iter().map(Vec::as_slice).collect();
    let key = cmd::sha256_hex(&parts)?;
    let dir = cmd::cache_root()
        .join("stock")
        .join(format!("systemd-{}", &key[..16]));
    let out = SystemdGuest {
        qcow2: dir.join("debian-systemd.qcow2"),
        release: boot.release.clone(),
        versions: dir.join("versions"),
    };
    stock::cached_build(&dir, "the systemd Debian cloud image", || {
        let t = std::time::Instant::now();
        stock::progress(&format!(
            "mmdebstrap bookworm: {} {} with systemd and cloud-init (~1-2 min) ...",
            boot.kernel_package, boot.kernel_version
        ));
        cmd::mkdirs(&dir)?;
        let root = dir.join("root");
        let include = format!(
            "--include={}={},{}",
            boot.kernel_package,
            boot.kernel_version,
            PACKAGES.join(",")
        );
        cmd::run(
            Command::new("mmdebstrap")
                .args(["--variant=essential", &include])
                .args([
                    "--dpkgopt=path-exclude=/usr/share/doc/*",
                    "--dpkgopt=path-exclude=/usr/share/man/*",
                    "--dpkgopt=path-exclude=/usr/share/locale/*",
                    "--quiet",
                    stock::SUITE,
                ])
                .arg(&root),
        )?;
        let release = &boot.release;
        for f in [
            format!("boot/vmlinuz-{release}"),
            format!("boot/initrd.img-{release}"),
        ] {
            if !root.join(&f).exists() {
                return Err(StockError::Missing(root.join(f)));
            }
        }
        cmd::write(
            &root.join("etc/fstab"),
            format!("UUID={FS_UUID} / ext4 rw,discard,errors=remount-ro 0 1\n"),
        )?;
        cmd::write(&root.join("etc/hostname"), "debian\n")?;
        cmd::run(
            Command::new("systemctl")
                .arg(format!("--root={}", root.display()))
                .args(["enable", "systemd-networkd.service"]),
        )?;
        cmd::mkdirs(&root.join("boot/grub"))?;
        cmd::write(&root.join("boot/grub/grub.cfg"), grub_cfg(release))?;
        let versions = cmd::output(
            Command::new("dpkg-query")
                .arg(format!(
                    "--admindir={}",
                    root.join("var/lib/dpkg").display()
                ))
                .args(["-W", "-f=${Package} ${Version}\n"]),
        )?;
        cmd::write(&out.versions, versions)?;
        stock::progress("laying the root out as a cloud image (GPT, ext4, qcow2 -c) ...");
        let img = dir.join("disk.img");
        stock::one_partition_disk(
            &dir,
            &root,
            &["-L", "debian-root", "-U", FS_UUID],
            ROOTFS_MIB,
            // 1 MiB before the partition, 1 MiB after it for the backup GPT.
            ROOTFS_MIB + 2,
            &format!(
                "label: gpt\\nunit: sectors\\n\\nstart=2048, size={}, type=0FC63DAF-8483-4772-8E79-3D69D8477DE4, name=root\\n",
                ROOTFS_MIB * 2048
            ),
            &img,
        )?;
        cmd::run(
            Command::new("qemu-img")
                .args(["convert", "-q", "-f", "raw", "-O", "qcow2", "-c"])
                .arg(&img)
                .arg(&out.qcow2),
        )?;
        let _ = std::fs::remove_file(&img);
        stock::progress(&format!(
            "built in {:.0} s: {}",
            t.elapsed().as_secs_f64(),
            out.qcow2.display()
        ));
        Ok(())
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grub_cfg_boots_the_release_with_root_by_uuid() {
        let g = grub_cfg("6.1.0-57-cloud-amd64");
        assert!(g.contains(&format!(
            "\tlinux\t/boot/vmlinuz-6.1.0-57-cloud-amd64 root=UUID={FS_UUID} ro {ARGS}\n"
        )));
        assert!(g.contains("\tinitrd\t/boot/initrd.img-6.1.0-57-cloud-amd64\n"));
        assert!(g.starts_with("set default=\"0\"\n"));
    }
}
