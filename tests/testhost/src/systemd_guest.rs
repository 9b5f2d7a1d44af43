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
//! [`bench`] boots it to `multi-user.target` under `microvm` and under QEMU `-M microvm,acpi=on`
//! (`cargo xtask bench-systemd`).
//!
//! Cached under `~/.cache/microvirt/stock/systemd-<hash>/`, keyed by this recipe and the
//! candidate versions of the kernel, systemd, cloud-init and initramfs-tools from this machine's
//! apt lists (~1.5 min to build, ~140 MB).

use std::path::PathBuf;
use std::process::Command;

use crate::cmd;
use crate::stock::{self, StockError, StockGuest};

/// Bump when the recipe below changes what it produces.
const RECIPE: &[u8] = b"microvirt-systemd-guest-v2";
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
    /// Copies of the image's `/boot/vmlinuz-<release>` and `/boot/initrd.img-<release>`, for
    /// booting it with a VMM's own kernel options ([`bench`]).
    pub vmlinuz: PathBuf,
    pub initrd: PathBuf,
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
        vmlinuz: dir.join("vmlinuz"),
        initrd: dir.join("initrd.img"),
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
        for (f, to) in [
            (format!("boot/vmlinuz-{release}"), &out.vmlinuz),
            (format!("boot/initrd.img-{release}"), &out.initrd),
        ] {
            if !root.join(&f).exists() {
                return Err(StockError::Missing(root.join(f)));
            }
            cmd::copy(&root.join(&f), to)?;
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

/// One boot in [`bench`]: test-host seconds from the VMM's start.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    /// `microvm` or `qemu`.
    pub vmm: String,
    pub run: usize,
    /// The kernel's first line (`Linux version`).
    pub kernel: Option<f64>,
    /// systemd's first line (`systemd ... running in system mode`): kernel + initramfs done.
    pub systemd: Option<f64>,
    /// `Reached target multi-user.target`.
    pub multi_user: Option<f64>,
}

/// The test-host shell of [`bench`]: `runs` boots of the image under `microvm` and under QEMU
/// `-M microvm,acpi=on -accel kvm`, interleaved, with the same kernel and initramfs (the
/// image's), the same qcow2 disk (microvm: a copy-on-write overlay; QEMU: `snapshot=on`),
/// memory, vCPUs and command line (microvm's defaults, given to QEMU too without the
/// `virtio_mmio.device=` entries, then the grub.cfg's, then `cloud-init=disabled`). No NIC and
/// no cloud-init seed: both VMs boot the same units (without `cloud-init=disabled`, cloud-init
/// would look for a metadata service that is not there, and the first try held multi-user.target
/// back past 1200 s in a busy test host; `systemd.mask=serial-getty@ttyS0.service` keeps a
/// getty off the console whose `Reached target` line marks the end: in one run of the CI test
/// that shares it with a getty the line never came). Each VM
/// is killed at `multi-user.target`; a VM that never gets there is killed after 1200 s.
/// Prints `T VMM RUN kernel|systemd|multi-user SECS` lines.
pub fn bench_body(runs: usize) -> String {
    let defaults = stock::MICROVM_DEFAULT_ARGS;
    let args = format!(
        "root=UUID={FS_UUID} ro {ARGS} cloud-init=disabled systemd.mask=serial-getty@ttyS0.service"
    );
    format!(
        r#"export WORK=/tmp/systemd-bench; mkdir -p $WORK; cd $WORK
# QEMU's snapshot=on puts its temporary overlay in $TMPDIR (default /var/tmp: not in the test host)
export TMPDIR=$WORK
now() {{ cut -d' ' -f1 /proc/uptime; }}
el() {{ awk -v a=$(now) -v b=$t0 'BEGIN{{print a-b}}'; }}
# stamp VMM RUN: T lines at the kernel's first line, systemd's and multi-user.target (where it
# kills the VM); the console goes to $WORK/VMMRUN.log, its first 25 lines to the test host's
# console too (what a VM that never gets to its kernel printed).
stamp() {{
	_n=0
	while IFS= read -r l; do
		_n=$((_n + 1))
		[ $_n -le 25 ] && echo "[$1$2] $l"
		case "$l" in
		*"Linux version "*) echo "T $1 $2 kernel $(el)" ;;
		*"running in system mode"*) echo "T $1 $2 systemd $(el)" ;;
		# milestones of the kernel + initramfs phase (M lines: read by people, not parsed)
		*"Run /init as init process"*|*"Loading, please wait"*|*"Begin: Loading essential drivers"*|\
		*"Begin: Running /scripts/local-premount"*|*"Begin: Will now check root file system"*|\
		*"EXT4-fs (vda1): mounted"*|*"Begin: Running /scripts/init-bottom"*|*"crng init done"*|\
		*"virtio_blk virtio"*"[vda]"*|*"Waiting for"*)
			echo "M $1 $2 $(el) $(echo "$l" | cut -c1-90)" ;;
		*"Reached target"*"Multi-User System"*)
			echo "T $1 $2 multi-user $(el)"
			kill -9 "$(cat vmm.pid)" 2>/dev/null ;;
		esac
		echo "$l" >> "$1$2.log"
	done
}}
# bounded VMM...: runs it in the background (pid in vmm.pid), killed after 1200 s. The guard
# must not hold the pipe to `stamp` open (its `sleep` outlives it): the pipeline would not end
# until the sleep did, and the next VM would start 1200 s late.
bounded() {{
	"$@" 2>&1 &
	echo $! > vmm.pid
	( sleep 1200; kill -9 "$(cat vmm.pid)" 2>/dev/null ) > /dev/null 2>&1 &
	_guard=$!
	wait "$(cat vmm.pid)"
	kill $_guard 2>/dev/null
}}
for i in $(seq 1 {runs}); do
	rm -f overlay.img
	t0=$(now)
	bounded /bin/microvm --kernel "$SD_VMLINUZ" --initrd "$SD_INITRD" --mem-mib 512 --vcpus 2 \
		--disk "path=$SYSTEMD_QCOW2,overlay=$WORK/overlay.img" --cmdline "{args}" | stamp microvm $i
	grep -q "Multi-User System" microvm$i.log || {{ echo "T microvm $i failed"; tail -n 20 microvm$i.log; }}
	t0=$(now)
	bounded /bin/qemu-system-x86_64 -L /usr/share/qemu -M microvm,acpi=on,x-option-roms=off,rtc=off \
		-accel kvm -cpu host -m 512 -smp 2 -nodefaults -no-user-config -nographic -serial stdio \
		-monitor none -no-reboot -kernel "$SD_VMLINUZ" -initrd "$SD_INITRD" -append "{defaults} {args}" \
		-drive "id=d0,file=$SYSTEMD_QCOW2,format=qcow2,if=none,snapshot=on" \
		-device virtio-blk-device,drive=d0 | stamp qemu $i
	grep -q "Multi-User System" qemu$i.log || {{ echo "T qemu $i failed"; tail -n 20 qemu$i.log; }}
	rm -f microvm$i.log qemu$i.log
done
rm -f overlay.img
"#
    )
}

/// Parses the `T ...` lines of [`bench_body`]'s output (also when the test host's console
/// prefixes them).
pub fn parse_bench(lines: &[String]) -> Vec<Sample> {
    let mut out: Vec<Sample> = Vec::new();
    for t in stock::t_lines(lines) {
        let i = stock::sample_index(
            &mut out,
            |s| s.vmm == t.vmm && s.run == t.run,
            || Sample {
                vmm: t.vmm.to_string(),
                run: t.run,
                ..Default::default()
            },
        );
        let secs = t.values.first().copied();
        match t.what {
            "kernel" => out[i].kernel = secs,
            "systemd" => out[i].systemd = secs,
            "multi-user" => out[i].multi_user = secs,
            _ => {}
        }
    }
    out
}

/// Boots the image `runs` times under each VMM in one test-host boot (with QEMU in it).
pub fn bench(
    prep: &crate::scenarios::Prepared,
    guest: &SystemdGuest,
    runs: usize,
    echo: bool,
) -> Result<(Vec<Sample>, crate::qemu::Console), crate::scenarios::ScenarioError> {
    let files = [
        ("SD_VMLINUZ", &guest.vmlinuz),
        ("SD_INITRD", &guest.initrd),
        ("SYSTEMD_QCOW2", &guest.qcow2),
    ]
    .iter()
    .map(|(var, p)| (var.to_string(), (*p).clone()))
    .collect();
    let console = crate::stock::run_in_test_host(
        prep,
        files,
        Vec::new(),
        &bench_body(runs),
        "systemd-bench",
        std::time::Duration::from_secs(120 + 2 * 1300 * runs as u64),
        echo,
    )?;
    Ok((parse_bench(&console.lines), console))
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

    #[test]
    fn bench_lines_parse_into_samples() {
        let lines: Vec<String> = [
            "[l1   10.00] T microvm 1 kernel 2.5",
            "T microvm 1 systemd 30.25",
            "[l1   99.00] T microvm 1 multi-user 170.5",
            "T qemu 1 kernel 3",
            "T qemu 1 failed",
            "[l1 1.0] [sd] Linux version 6.1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let s = parse_bench(&lines);
        assert_eq!(s.len(), 2);
        assert_eq!(
            s[0],
            Sample {
                vmm: "microvm".into(),
                run: 1,
                kernel: Some(2.5),
                systemd: Some(30.25),
                multi_user: Some(170.5),
            }
        );
        assert_eq!((s[1].kernel, s[1].multi_user), (Some(3.0), None));
        let body = bench_body(3);
        assert!(body.contains("seq 1 3") && body.contains("acpi=on"));
        assert!(body.contains(&format!("root=UUID={FS_UUID} ro {ARGS}")));
    }
}
