//! microvirt's container images, built from this workspace without a registry or base image
//! (see `microvirt_testsupport::oci`): release binaries with the shared libraries they load,
//! and kernelBoot / containerDisk images of the guest images.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use microvirt_testsupport::oci::{self, BuiltImage, Entry, Image};

/// The launcher (`virt-launcher pod` in every VMI's pod).
pub const LAUNCHER: &str = "microvirt/virt-launcher:dev";
/// The operator (Deployment `virt-operator`).
pub const OPERATOR: &str = "microvirt/virt-operator:dev";
/// The node agent and device plugin (DaemonSet `virt-handler`).
pub const HANDLER: &str = "microvirt/virt-handler:dev";
/// kernelBoot image with the built-in demo guest (microvirt's no_std test guest, PVH ELF) at
/// `/boot/vmlinux`: boots on any machine with `/dev/kvm`.
pub const DEMO_KERNEL: &str = "microvirt/demo-kernel:dev";
/// kernelBoot image with the Linux guest kernel of `guest-images/` at `/boot/vmlinux` (PVH ELF)
/// and `/boot/bzImage`: the operator's default kernel.
pub const GUEST_KERNEL: &str = "microvirt/guest-kernel:dev";
/// containerDisk image with the busybox root file system of `guest-images/` at
/// `/disk/rootfs.ext4`.
pub const GUEST_ROOTFS: &str = "microvirt/guest-rootfs:dev";

/// Where the kernel sits in a kernelBoot image (the operator's default `kernelPath`).
pub const KERNEL_PATH: &str = "/boot/vmlinux";

/// The full reference containerd stores for a short Docker-style name.
pub fn full_name(short: &str) -> String {
    let first = short.split('/').next().unwrap_or("");
    if short.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost") {
        short.to_string()
    } else if short.contains('/') {
        format!("docker.io/{short}")
    } else {
        format!("docker.io/library/{short}")
    }
}

/// Which cargo profile the binaries in the images come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// `--release` (LTO): what people deploy and the benchmark measures.
    Release,
    /// The dev profile `cargo test` builds anyway, debug info stripped: the whole-system tests
    /// use it so CI compiles nothing twice.
    Dev,
}

/// Which images to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageSet {
    /// The Linux guest images (kernel build, minutes cold; cached by `cargo xtask images`).
    pub linux_guest: bool,
    /// The virt-handler image.
    pub handler: bool,
    /// Where the binaries come from.
    pub profile: Profile,
}

impl ImageSet {
    /// Everything, release binaries (`cargo xtask oci-images`, `cargo xtask cluster up`).
    pub const ALL: ImageSet = ImageSet {
        linux_guest: true,
        handler: true,
        profile: Profile::Release,
    };
    /// What the whole-system tests boot: binaries (dev profile) and the demo guest.
    pub const TESTS: ImageSet = ImageSet {
        linux_guest: false,
        handler: true,
        profile: Profile::Dev,
    };
    /// The benchmark: release binaries and the demo guest.
    pub const BENCH: ImageSet = ImageSet {
        linux_guest: false,
        handler: true,
        profile: Profile::Release,
    };
}

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
}

fn target_dir() -> PathBuf {
    let root = workspace_root();
    let t = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    if t.is_absolute() {
        t
    } else {
        root.join(t)
    }
}

/// `cargo build [--release]` of the binaries that go into images; returns their directory.
pub fn build_binaries(set: ImageSet) -> Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut args = vec!["build"];
    if set.profile == Profile::Release {
        args.push("--release");
    }
    args.extend([
        "-p",
        "microvirt-launcher",
        "--bin",
        "virt-launcher",
        "-p",
        "microvirt-operator",
        "--bin",
        "virt-operator",
    ]);
    if set.handler {
        args.extend(["-p", "microvirt-handler", "--bin", "virt-handler"]);
    }
    eprintln!("[oci-images] cargo {}", args.join(" "));
    let target = target_dir();
    let st = Command::new(cargo)
        .current_dir(workspace_root())
        .env("CARGO_TARGET_DIR", &target)
        .args(&args)
        .status()
        .context("running cargo build")?;
    if !st.success() {
        bail!("cargo {} failed ({st})", args.join(" "));
    }
    Ok(target.join(match set.profile {
        Profile::Release => "release",
        Profile::Dev => "debug",
    }))
}

/// A copy of a dev-profile binary without debug info (a tenth of the size), next to it.
fn stripped(bin: &Path) -> Result<PathBuf> {
    let dir = bin
        .parent()
        .context("binary without a directory")?
        .join("oci-stripped");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let out = dir.join(bin.file_name().context("binary without a name")?);
    let tmp = out.with_extension("tmp");
    let st = Command::new("objcopy")
        .arg("--strip-debug")
        .arg(bin)
        .arg(&tmp)
        .status()
        .context("running objcopy (binutils)")?;
    if !st.success() {
        bail!("objcopy --strip-debug {} failed ({st})", bin.display());
    }
    std::fs::rename(&tmp, &out).with_context(|| format!("moving {}", out.display()))?;
    Ok(out)
}

fn binary_image(name: &str, bin: &Path, dest: &str) -> Result<Image> {
    let mut entries = oci::binary_with_libraries(bin, dest)
        .with_context(|| format!("collecting {} and its libraries", bin.display()))?;
    // Programs expect a writable /tmp and an /etc; the kubelet mounts /etc/hosts,
    // /etc/resolv.conf and /dev/termination-log over these.
    entries.push(Entry {
        path: "tmp".into(),
        mode: 0o1777,
        content: oci::Content::Dir,
    });
    entries.push(Entry::dir("etc"));
    entries.push(Entry::bytes(
        "etc/passwd",
        "root:x:0:0:root:/:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/:/sbin/nologin\n",
    ));
    entries.push(Entry::bytes("etc/group", "root:x:0:\nnonroot:x:65532:\n"));
    Ok(Image {
        name: full_name(name),
        entries,
        entrypoint: vec![dest.to_string()],
        env: vec!["PATH=/usr/local/bin:/usr/bin:/bin".into()],
        labels: vec![("org.opencontainers.image.source".into(), "microvirt".into())],
        ..Default::default()
    })
}

/// Builds (or finds cached) the images of `set`; archives go to `<cache root>/oci/`.
pub fn build(set: ImageSet) -> Result<Vec<BuiltImage>> {
    let cache = microvirt_testsupport::cache_root()?.join("oci");
    let bins = build_binaries(set)?;
    let bin = |name: &str| -> Result<PathBuf> {
        let p = bins.join(name);
        match set.profile {
            Profile::Release => Ok(p),
            Profile::Dev => stripped(&p),
        }
    };
    let mut images = vec![
        binary_image(LAUNCHER, &bin("virt-launcher")?, "usr/bin/virt-launcher")?,
        binary_image(OPERATOR, &bin("virt-operator")?, "usr/bin/virt-operator")?,
    ];
    if set.handler {
        images.push(binary_image(
            HANDLER,
            &bin("virt-handler")?,
            "usr/bin/virt-handler",
        )?);
    }
    let guest = testguest_build::build().context("building the test guest")?;
    images.push(Image {
        name: full_name(DEMO_KERNEL),
        entries: vec![Entry::file("boot/vmlinux", &guest.pvh, false)],
        labels: vec![(
            "io.microvirt.kernel".into(),
            "microvirt test guest (built-in demo), PVH ELF".into(),
        )],
        ..Default::default()
    });
    if set.linux_guest {
        let (g, _) = microvirt_testhost::images::build().context("building the guest images")?;
        images.push(Image {
            name: full_name(GUEST_KERNEL),
            entries: vec![
                Entry::file("boot/vmlinux", &g.vmlinux, false),
                Entry::file("boot/bzImage", &g.bzimage, false),
            ],
            labels: vec![(
                "io.microvirt.kernel".into(),
                "guest-images Linux kernel (tinyconfig + microvm.config), PVH ELF".into(),
            )],
            ..Default::default()
        });
        images.push(Image {
            name: full_name(GUEST_ROOTFS),
            entries: vec![Entry::file("disk/rootfs.ext4", &g.rootfs, false)],
            ..Default::default()
        });
    }
    let mut built = Vec::new();
    for i in images {
        let b = i
            .build(&cache)
            .with_context(|| format!("writing image {}", i.name))?;
        eprintln!(
            "[oci-images] {} {} ({:.1} MiB) {}",
            b.name,
            b.manifest_digest,
            b.layer_size as f64 / (1024.0 * 1024.0),
            b.archive.display()
        );
        built.push(b);
    }
    Ok(built)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_normalize_like_containerd() {
        assert_eq!(
            full_name("microvirt/virt-launcher:dev"),
            "docker.io/microvirt/virt-launcher:dev"
        );
        assert_eq!(full_name("busybox:1"), "docker.io/library/busybox:1");
        assert_eq!(full_name("quay.io/a/b:c"), "quay.io/a/b:c");
        assert_eq!(full_name("localhost:5000/a:b"), "localhost:5000/a:b");
    }
}
