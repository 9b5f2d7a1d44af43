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

/// Which images to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageSet {
    /// The Linux guest images (kernel build, minutes cold; cached by `cargo xtask images`).
    pub linux_guest: bool,
    /// The virt-handler image (needs the `microvirt-handler` crate).
    pub handler: bool,
}

impl ImageSet {
    /// Everything (`cargo xtask oci-images`, `cargo xtask cluster up`).
    pub const ALL: ImageSet = ImageSet {
        linux_guest: true,
        handler: true,
    };
    /// What the whole-system tests boot: binaries and the demo guest.
    pub const TESTS: ImageSet = ImageSet {
        linux_guest: false,
        handler: true,
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

/// `cargo build --release` of the binaries that go into images; returns their directory.
pub fn build_release_binaries(set: ImageSet) -> Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut args = vec![
        "build",
        "--release",
        "-p",
        "microvirt-launcher",
        "--bin",
        "virt-launcher",
        "-p",
        "microvirt-operator",
        "--bin",
        "virt-operator",
    ];
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
        .context("running cargo build --release")?;
    if !st.success() {
        bail!("cargo {} failed ({st})", args.join(" "));
    }
    Ok(target.join("release"))
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
    let bins = build_release_binaries(set)?;
    let mut images = vec![
        binary_image(
            LAUNCHER,
            &bins.join("virt-launcher"),
            "usr/bin/virt-launcher",
        )?,
        binary_image(
            OPERATOR,
            &bins.join("virt-operator"),
            "usr/bin/virt-operator",
        )?,
    ];
    if set.handler {
        images.push(binary_image(
            HANDLER,
            &bins.join("virt-handler"),
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
