//! Which kernel a VMI boots, with which initrd and command line:
//!
//! - the user's: `firmware.kernelBoot.container` that the operator did not fill in (no
//!   `defaultKernel` in the document), with `kernelArgs` — the boot disk is not looked at;
//! - else the boot disk's own (the first disk, [`crate::bootdisk`]): the kernel, initrd and
//!   command line its boot configuration boots, plus the VMI's `kernelArgs`;
//! - else a fallback: the operator's default kernel (pod mode), or the built-in demo guest
//!   (run mode without a kernel), with `kernelArgs`, else the default kernel arguments — on a
//!   partitioned disk with `root=` pointing at the image's root partition instead;
//! - nothing bootable: [`KernelError::NoBootableKernel`] (the VMI fails with that reason).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use vmm::devices::virtio::block::disk::{open_image, RawFile};
use vmm::devices::virtio::block::open::read_only_backend;

use crate::bootdisk::{self, source::Backend, Found};
use crate::demo::DemoKernel;
use crate::disks::{self, Layout, PreparedDisk};
use crate::paths::{self, OpenMode};
use crate::vmi::VmiDocument;

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("firmware.kernelBoot.container: {0}")]
    Kernel(String),
    #[error("the built-in demo guest: {0}")]
    Demo(std::io::Error),
    /// Nothing to boot: the boot disk has no kernel, and no fallback applies.
    #[error("no bootable kernel: {0}")]
    NoBootableKernel(String),
    #[error("extracting the boot disk's kernel into {dir}: {detail}")]
    Extract { dir: String, detail: String },
}

/// Why a pod without a kernel image has no fallback.
const NO_DEMO: &str = "the operator names none, and a pod never boots the built-in demo guest";

/// The kernel chosen, as the VMM takes it.
pub struct Chosen {
    pub kernel: PathBuf,
    pub initrd: Option<PathBuf>,
    pub cmdline: Option<String>,
    pub demo: Option<DemoKernel>,
    /// Descriptors behind `/proc/self/fd/N` paths (kept until the VMM has opened them).
    pub held: Vec<File>,
    /// For the log: where the kernel came from.
    pub summary: String,
}

/// The kernel or initrd: in pod mode opened inside the kernel-boot image without following
/// links (the VMM reopens the descriptor, which is pushed to `held`); in run mode a local path.
pub fn kernel_path(layout: &Layout, p: &str, held: &mut Vec<File>) -> Result<PathBuf, KernelError> {
    let kerr = |e: String| KernelError::Kernel(e);
    let path = match layout {
        Layout::Pod { root, .. } => {
            let rel = disks::relative_inside(p, "kernel-boot").map_err(|e| kerr(e.to_string()))?;
            let dir = root.join("kernel-boot");
            let f = paths::open_beneath(&dir, &rel, paths::OpenMode::ReadOnly)
                .map_err(|e| kerr(e.to_string()))?;
            if !f.metadata().is_ok_and(|m| m.is_file()) {
                return Err(kerr(format!("{} is not a file", dir.join(rel).display())));
            }
            let path = paths::proc_path(&f);
            held.push(f);
            path
        }
        Layout::Local { base_dir, .. } => disks::local(base_dir, p),
    };
    if !path.is_file() {
        return Err(kerr(format!("{} is not a file", path.display())));
    }
    Ok(path)
}

/// `args` with every `root=` word replaced by `root=<root>`; `root=<root>` first when there
/// was none.
pub fn with_root(args: &str, root: &str) -> String {
    let mut words: Vec<String> = args
        .split_ascii_whitespace()
        .filter(|w| !w.starts_with("root="))
        .map(str::to_string)
        .collect();
    words.insert(0, format!("root={root}"));
    words.join(" ")
}

fn join_args(a: &str, b: Option<&str>) -> String {
    match b.map(str::trim).filter(|b| !b.is_empty()) {
        Some(b) if a.is_empty() => b.to_string(),
        Some(b) => format!("{a} {b}"),
        None => a.to_string(),
    }
}

/// The fallback kernel (the operator's default kernel, or the demo guest in run mode).
enum Fallback {
    Container {
        kernel: PathBuf,
        initrd: Option<PathBuf>,
        default_args: Option<String>,
    },
    Demo,
    None,
}

fn use_fallback(
    fallback: Fallback,
    held: Vec<File>,
    cmdline: Option<String>,
    why: String,
) -> Result<Chosen, KernelError> {
    match fallback {
        Fallback::Container { kernel, initrd, .. } => Ok(Chosen {
            kernel,
            initrd,
            cmdline,
            demo: None,
            held,
            summary: format!("the operator's default kernel ({why})"),
        }),
        Fallback::Demo => {
            let d = DemoKernel::new().map_err(KernelError::Demo)?;
            Ok(Chosen {
                kernel: d.path(),
                initrd: None,
                cmdline,
                demo: Some(d),
                held,
                summary: format!("the built-in demo guest ({why})"),
            })
        }
        Fallback::None => Err(KernelError::NoBootableKernel(why)),
    }
}

/// Opens the boot disk read-only as the VMM will read it: an overlay's base or a read-only
/// disk as raw or qcow2 (by its magic number), a disk the guest writes as raw only.
fn open_boot_disk(d: &PreparedDisk) -> Result<Backend, String> {
    let c = &d.config;
    let file = open_image(&c.path, true).map_err(|e| e.to_string())?;
    let backend = if c.read_only || c.overlay.is_some() {
        read_only_backend(file, &c.path).map_err(|e| e.to_string())?
    } else {
        Box::new(RawFile::from_file(file, true).map_err(|e| e.to_string())?)
    };
    Ok(Backend(backend))
}

/// A file in `dir` that is unlinked at once: the VMM reads it through `/proc/self/fd/N`, and
/// it disappears with the descriptor.
fn scratch_file(dir: &Path, name: &str) -> Result<File, KernelError> {
    let err = |e: std::io::Error| KernelError::Extract {
        dir: dir.display().to_string(),
        detail: e.to_string(),
    };
    let f = paths::open_beneath(dir, Path::new(name), OpenMode::Create).map_err(err)?;
    std::fs::remove_file(dir.join(name)).map_err(err)?;
    Ok(f)
}

/// Chooses the kernel (see the module documentation). `boot_disk`: the first disk, prepared;
/// `scratch`: where the boot disk's kernel and initrd are extracted; `inspect`: look at the
/// boot disk at all (not when restoring a snapshot, whose kernel is already in memory).
pub fn choose(
    doc: &VmiDocument,
    layout: &Layout,
    demo_allowed: bool,
    boot_disk: Option<&PreparedDisk>,
    scratch: &Path,
    inspect: bool,
) -> Result<Chosen, KernelError> {
    let kb = doc.kernel_boot();
    let container = kb.and_then(|k| k.container.as_ref());
    let user_args = kb.and_then(|k| k.kernel_args.as_deref());
    let mut held = Vec::new();
    let fallback = match container {
        Some(c) => {
            let k = c
                .kernel_path
                .as_deref()
                .ok_or_else(|| KernelError::Kernel("kernelPath is required".into()))?;
            let kernel = kernel_path(layout, k, &mut held)?;
            let initrd = match c.initrd_path.as_deref() {
                Some(i) => Some(kernel_path(layout, i, &mut held)?),
                None => None,
            };
            let Some(dk) = &doc.default_kernel else {
                // The user's kernel: the disk is not looked at.
                return Ok(Chosen {
                    kernel,
                    initrd,
                    cmdline: user_args.map(str::to_string),
                    demo: None,
                    held,
                    summary: "kernelBoot.container".into(),
                });
            };
            Fallback::Container {
                kernel,
                initrd,
                default_args: dk.kernel_args.clone(),
            }
        }
        None if demo_allowed => Fallback::Demo,
        None => Fallback::None,
    };
    let fallback_args = |root: Option<&str>| -> Option<String> {
        let base = match &fallback {
            Fallback::Container { default_args, .. } => user_args
                .map(str::to_string)
                .or_else(|| default_args.clone()),
            _ => user_args.map(str::to_string),
        };
        match root {
            // The user's own root= stays; the default arguments' is replaced.
            Some(_)
                if user_args.is_some_and(|a| {
                    a.split_ascii_whitespace().any(|w| w.starts_with("root="))
                }) =>
            {
                base
            }
            Some(r) => Some(with_root(base.as_deref().unwrap_or(""), r)),
            None => base,
        }
    };
    let Some(disk) = boot_disk.filter(|_| inspect) else {
        let why = if inspect && matches!(fallback, Fallback::None) {
            format!("the VMI has no disk to boot from and names no kernel ({NO_DEMO})")
        } else if inspect {
            "the VMI has no disk".to_string()
        } else {
            "restoring a snapshot".to_string()
        };
        if matches!(fallback, Fallback::None) && !inspect {
            return Err(KernelError::Kernel(
                "none given, and a pod never boots the built-in demo guest".into(),
            ));
        }
        let args = fallback_args(None);
        return use_fallback(fallback, held, args, why);
    };
    let name = &disk.name;
    let no_boot = |m: String| KernelError::NoBootableKernel(format!("disk {name:?}: {m}"));
    let source = open_boot_disk(disk).map_err(no_boot)?;
    let inspection = bootdisk::inspect(Box::new(source)).map_err(no_boot)?;
    match &inspection.found {
        Found::Unpartitioned => {
            let args = fallback_args(None);
            use_fallback(
                fallback,
                held,
                args,
                format!("disk {name:?} has no partition table"),
            )
            .map_err(|e| match e {
                KernelError::NoBootableKernel(_) => no_boot(format!(
                    "no partition table, so no boot configuration to read, and no default kernel ({NO_DEMO})"
                )),
                e => e,
            })
        }
        Found::NoKernel {
            root: Some(root),
            looked,
        } if !matches!(fallback, Fallback::None) => {
            log::info!("boot disk {name:?}: no kernel ({looked})");
            let args = fallback_args(Some(root));
            use_fallback(
                fallback,
                held,
                args,
                format!("disk {name:?} has no kernel; root={root}"),
            )
        }
        Found::NoKernel { root, looked } => {
            let why = match (root, &fallback) {
                (_, Fallback::None) => {
                    "no kernel on the disk and no default kernel (the operator names none)"
                }
                (None, _) => "no kernel on the disk and no root file system for the default kernel",
                (Some(_), _) => "no kernel on the disk",
            };
            Err(no_boot(format!("{why}: {looked}")))
        }
        Found::Kernel(k) => {
            let kfile = scratch_file(scratch, "boot-disk-kernel")?;
            let ifile = scratch_file(scratch, "boot-disk-initrd")?;
            let (klen, ilen) = {
                let mut kw = BufWriter::new(&kfile);
                let mut iw = BufWriter::new(&ifile);
                let lens = inspection.extract(&mut kw, &mut iw).map_err(no_boot)?;
                let flush = |w: &mut BufWriter<&File>| {
                    w.flush().map_err(|e| KernelError::Extract {
                        dir: scratch.display().to_string(),
                        detail: e.to_string(),
                    })
                };
                flush(&mut kw)?;
                flush(&mut iw)?;
                lens
            };
            let cmdline = join_args(&k.entry.options, user_args);
            log::info!(
                "boot disk {name:?}: {} — kernel {} ({klen} bytes), {} initrd(s) ({ilen} bytes), command line {cmdline:?}",
                k.source,
                k.entry.kernel,
                k.entry.initrds.len()
            );
            let kernel = paths::proc_path(&kfile);
            held.push(kfile);
            let initrd = if k.entry.initrds.is_empty() {
                None
            } else {
                let p = paths::proc_path(&ifile);
                held.push(ifile);
                Some(p)
            };
            Ok(Chosen {
                kernel,
                initrd,
                cmdline: Some(cmdline),
                demo: None,
                held,
                summary: format!("the boot disk's kernel: {}", k.source),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_replaced_or_added() {
        assert_eq!(
            with_root("root=/dev/vda rw", "PARTUUID=ab"),
            "root=PARTUUID=ab rw"
        );
        assert_eq!(with_root("quiet", "/dev/vda2"), "root=/dev/vda2 quiet");
        assert_eq!(with_root("", "/dev/vda2"), "root=/dev/vda2");
        assert_eq!(join_args("a b", Some(" c ")), "a b c");
        assert_eq!(join_args("", Some("c")), "c");
        assert_eq!(join_args("a", None), "a");
    }
}
