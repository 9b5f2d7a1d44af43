//! The test host ("L1"): Debian's generic kernel with KVM modules, and an initramfs that carries
//! busybox, our binaries with their shared libraries, the guest images and a generated init.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cmd::{self, CmdError};
use crate::images::GuestImages;

/// Kernel modules loaded in the test host, in order: each after the modules it depends on
/// (`modinfo -F depends` in Debian's 6.1 package; plain `.ko` there, `.ko.xz` in some other
/// builds: both are handled). After KVM and TUN come what pod networking (`netsetup`'s
/// masquerade binding) and the namespace fixtures of the network scenarios need: veth, the
/// bridge, and nf_tables with the NAT chain type and the `nat` expression (`meta`, `payload`,
/// `cmp` and `immediate` are part of nf_tables itself). libcrc32c asks the crypto API for
/// "crc32c" (softdep): the generic implementation is loaded first as the test host has no
/// modprobe/modules.dep. A module that fails to load is reported and the others still load.
pub const MODULES: &[(&str, &str)] = &[
    ("irqbypass", "kernel/virt/lib/irqbypass.ko"),
    ("ccp", "kernel/drivers/crypto/ccp/ccp.ko"),
    ("kvm", "kernel/arch/x86/kvm/kvm.ko"),
    ("kvm-amd", "kernel/arch/x86/kvm/kvm-amd.ko"),
    ("tun", "kernel/drivers/net/tun.ko"),
    ("veth", "kernel/drivers/net/veth.ko"),
    ("llc", "kernel/net/llc/llc.ko"),
    ("stp", "kernel/net/802/stp.ko"),
    ("bridge", "kernel/net/bridge/bridge.ko"),
    ("crc32c_generic", "kernel/crypto/crc32c_generic.ko"),
    ("libcrc32c", "kernel/lib/libcrc32c.ko"),
    ("nfnetlink", "kernel/net/netfilter/nfnetlink.ko"),
    (
        "nf_defrag_ipv4",
        "kernel/net/ipv4/netfilter/nf_defrag_ipv4.ko",
    ),
    (
        "nf_defrag_ipv6",
        "kernel/net/ipv6/netfilter/nf_defrag_ipv6.ko",
    ),
    ("nf_conntrack", "kernel/net/netfilter/nf_conntrack.ko"),
    ("nf_nat", "kernel/net/netfilter/nf_nat.ko"),
    ("nf_tables", "kernel/net/netfilter/nf_tables.ko"),
    ("nft_chain_nat", "kernel/net/netfilter/nft_chain_nat.ko"),
    ("nft_nat", "kernel/net/netfilter/nft_nat.ko"),
];

/// Parameters for [`MODULES`] (`insmod NAME.ko PARAMS`). `kvm-amd npt=0`: the nested guests run
/// on shadow page tables, not on QEMU-TCG's emulation of nested paging. With nested paging, a
/// stress of back-to-back Linux boots in the test host (`tools/boot-loop.py`) ended about every
/// third guest early in its boot with a triple fault, or left it re-taking a page fault at a
/// garbage RIP, under QEMU 7.2 (one thread or several, with transparent huge pages or without)
/// and 10.0; with shadow paging 40 of 40 booted (docs/testing.md, "Nested paging in the test
/// host").
pub const MODULE_PARAMS: &[(&str, &str)] = &[("kvm-amd", "npt=0")];

/// Errors while preparing the test host.
#[derive(Debug, thiserror::Error)]
pub enum L1Error {
    #[error(transparent)]
    Cmd(#[from] CmdError),
    #[error("cannot find the kernel package behind linux-image-amd64 in `apt-cache depends`")]
    NoKernelPackage,
    #[error("{0} not found in the unpacked kernel package")]
    MissingFile(PathBuf),
}

/// Debian's test-host kernel and its decompressed modules.
#[derive(Debug, Clone)]
pub struct L1Kernel {
    pub vmlinuz: PathBuf,
    /// `(name, path of the .ko)` in load order.
    pub modules: Vec<(String, PathBuf)>,
}

fn progress(msg: &str) {
    eprintln!("[testhost] {msg}");
}

/// Fetches (apt-get download, dpkg-deb -x) and caches Debian's `linux-image-amd64` kernel.
pub fn kernel() -> Result<L1Kernel, L1Error> {
    let deps = cmd::output(Command::new("apt-cache").args(["depends", "linux-image-amd64"]))?;
    let pkg = deps
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|p| p.starts_with("linux-image-"))
        .map(str::to_string)
        .ok_or(L1Error::NoKernelPackage)?;
    let dir = cmd::cache_root().join("testhost").join(&pkg);
    let root = dir.join("root");
    // A cache made with an older module list lacks the newer modules: unpack again.
    let complete = |dir: &Path| {
        dir.join("done").exists()
            && module_dir(&dir.join("root"))
                .is_ok_and(|m| MODULES.iter().all(|(_, rel)| m.join(rel).exists()))
    };
    let _lock = if complete(&dir) {
        None
    } else {
        Some(cmd::CacheLock::acquire(
            &cmd::cache_root().join("testhost.lock"),
            "fetching the test-host kernel",
        )?)
    };
    if !complete(&dir) {
        progress(&format!("fetching {pkg} (apt-get download) ..."));
        // Download first: a failed download leaves a previous (older) unpacked cache in place.
        cmd::mkdirs(&dir)?;
        cmd::sh(&format!(
            "rm -f {d}/done {d}/{pkg}_*.deb",
            d = cmd::quote(&dir)
        ))?;
        cmd::run(
            Command::new("apt-get")
                .current_dir(&dir)
                .args(["download", "-q", &pkg]),
        )?;
        cmd::remove_dir(&root)?;
        cmd::mkdirs(&root)?;
        // Only the kernel and the few modules are needed: unpack those, not all 400 MB.
        let wanted: String = MODULES
            .iter()
            .map(|(_, rel)| format!(" '*/{rel}*'"))
            .collect();
        cmd::sh(&format!(
            "cd {d} && dpkg-deb --fsys-tarfile {pkg}_*.deb | tar -C root -x --wildcards './boot/vmlinuz-*'{wanted} && rm -f {pkg}_*.deb",
            d = cmd::quote(&dir),
        ))?;
        let moddir = module_dir(&root)?;
        for (_, rel) in MODULES {
            let xz = moddir.join(format!("{rel}.xz"));
            let plain = moddir.join(rel);
            if xz.exists() {
                cmd::run(Command::new("xz").arg("-d").arg("-f").arg(&xz))?;
            }
            if !plain.exists() {
                return Err(L1Error::MissingFile(plain));
            }
        }
        cmd::write(&dir.join("done"), b"")?;
    }
    let moddir = module_dir(&root)?;
    let boot = root.join("boot");
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
        .ok_or_else(|| L1Error::MissingFile(boot.join("vmlinuz-*")))?;
    let modules = MODULES
        .iter()
        .map(|(n, rel)| (n.to_string(), moddir.join(rel)))
        .collect();
    Ok(L1Kernel { vmlinuz, modules })
}

fn module_dir(root: &Path) -> Result<PathBuf, L1Error> {
    let base = root.join("lib/modules");
    std::fs::read_dir(&base)
        .map_err(|source| CmdError::Io {
            what: "listing",
            path: base.clone(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.is_dir())
        .ok_or(L1Error::MissingFile(base))
}

/// What goes into a test-host initramfs.
#[derive(Debug, Clone)]
pub struct InitramfsSpec<'a> {
    pub kernel: &'a L1Kernel,
    pub images: &'a GuestImages,
    /// Binaries copied to `/bin/<file name>` with their shared libraries.
    pub binaries: Vec<PathBuf>,
    /// Also install qemu-system-x86_64 and its microvm firmware (benchmark).
    pub with_qemu: bool,
    /// Extra files: (path inside the initramfs, contents).
    pub files: Vec<(String, Vec<u8>)>,
    /// Files copied in: (path inside the initramfs, file on this machine).
    pub copies: Vec<(String, PathBuf)>,
    /// The init script (PID 1 of the test host).
    pub init: String,
}

/// Builds an uncompressed newc cpio at `out` (uncompressed: TCG would spend seconds in gunzip).
pub fn build_initramfs(spec: &InitramfsSpec<'_>, out: &Path) -> Result<(), L1Error> {
    let stage = out.with_extension("stage");
    cmd::remove_dir(&stage)?;
    for d in [
        "bin", "dev", "proc", "sys", "tmp", "mods", "guest", "run", "etc",
    ] {
        cmd::mkdirs(&stage.join(d))?;
    }
    symlink("bin", &stage.join("sbin"))?;
    cmd::mkdirs(&stage.join("usr"))?;
    symlink("../bin", &stage.join("usr/bin"))?;
    symlink("../bin", &stage.join("usr/sbin"))?;
    cmd::copy(Path::new("/bin/busybox"), &stage.join("bin/busybox"))?;
    for (name, ko) in &spec.kernel.modules {
        cmd::copy(ko, &stage.join("mods").join(format!("{name}.ko")))?;
    }
    // Hard links would be cheaper, but the cache may be on another filesystem.
    for (from, name) in [
        (&spec.images.vmlinux, "vmlinux"),
        (&spec.images.bzimage, "bzImage"),
        (&spec.images.rootfs, "rootfs.ext4"),
        (&spec.images.initrd, "rootfs.cpio"),
    ] {
        cmd::copy(from, &stage.join("guest").join(name))?;
    }
    let mut bins = spec.binaries.clone();
    if spec.with_qemu {
        crate::cmd::ensure_packages(&["qemu-system-x86"])?;
        bins.push(PathBuf::from("/usr/bin/qemu-system-x86_64"));
        // QEMU looks for its data relative to its binary (/bin/../share/qemu) unless given -L.
        symlink("usr/share", &stage.join("share"))?;
        // -M microvm boots qboot; -nodefaults still looks up a few data files.
        for f in [
            "bios-microvm.bin",
            "qboot.rom",
            "linuxboot_dma.bin",
            "pvh.bin",
            "kvmvapic.bin",
        ] {
            let p = Path::new("/usr/share/qemu").join(f);
            if p.exists() {
                let real = std::fs::canonicalize(&p).unwrap_or(p.clone());
                cmd::copy(&real, &stage.join("usr/share/qemu").join(f))?;
            }
        }
    }
    for bin in &bins {
        let name = bin
            .file_name()
            .ok_or_else(|| L1Error::MissingFile(bin.clone()))?;
        cmd::copy(bin, &stage.join("bin").join(name))?;
        for lib in cmd::shared_libs(bin)? {
            let dest = stage.join(lib.strip_prefix("/").unwrap_or(&lib));
            if !dest.exists() {
                cmd::copy(&lib, &dest)?;
            }
        }
    }
    // Debian's dynamic loader path is /lib64/ld-linux-x86-64.so.2; /lib is a real dir here.
    for (path, data) in &spec.files {
        let dest = stage.join(path.trim_start_matches('/'));
        if let Some(parent) = dest.parent() {
            cmd::mkdirs(parent)?;
        }
        cmd::write(&dest, data)?;
    }
    for (path, from) in &spec.copies {
        cmd::copy(from, &stage.join(path.trim_start_matches('/')))?;
    }
    cmd::write(&stage.join("init"), spec.init.as_bytes())?;
    // The kernel opens /dev/console for init before anything is mounted.
    cmd::sh(&format!(
        "mknod -m 600 {} c 5 1",
        cmd::quote(&stage.join("dev/console"))
    ))?;
    cmd::sh(&format!(
        "chmod 0755 {stage}/init && cd {stage} && find . | cpio -o -H newc --quiet > {out}",
        stage = cmd::quote(&stage),
        out = cmd::quote(out),
    ))?;
    cmd::remove_dir(&stage)?;
    Ok(())
}

fn symlink(target: &str, at: &Path) -> Result<(), CmdError> {
    std::os::unix::fs::symlink(target, at).map_err(|source| CmdError::Io {
        what: "symlinking",
        path: at.to_path_buf(),
        source,
    })
}
