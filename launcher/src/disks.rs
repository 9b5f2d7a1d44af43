//! VMI volumes → virtio-blk disks, in `spec.domain.devices.disks` order (/dev/vda, /dev/vdb…).
//!
//! Where each volume's data is found depends on the mode ([`Layout`]):
//!
//! | volume | pod mode (docs/launcher-pod.md) | run mode (local files) |
//! |---|---|---|
//! | containerDisk | `<root>/container-disks/<vol>/<path>` (default: first file in `disk/`) | `path`, absolute or relative to the VMI file's directory |
//! | persistentVolumeClaim | `<root>/pvcs/<vol>`: `disk.img` inside (`volumeMode: Filesystem`), else the block device `<pvc-devices>/<vol>` (`volumeMode: Block`, default `/dev/microvirt/pvcs`) | `claimName`: a path when it has a `/`, else `<pvc-root>/<claimName>`; a directory means its `disk.img`; a block device is the disk |
//! | emptyDisk | sparse `<root>/empty-disks/<vol>/disk.img` | sparse file in the runtime directory |
//! | cloudInitNoCloud | VFAT `cidata` image in the runtime directory | same |
//!
//! containerDisks are used through a per-VMI copy-on-write overlay in the runtime directory (the
//! image is never written, so any number of VMIs share it), unless the disk is read-only.

use std::os::unix::fs::FileTypeExt;
use std::path::{Component, Path, PathBuf};

use vmm::devices::virtio::BlockConfig;

use crate::cloudinit::{CloudInitError, NoCloudSeed};
use crate::vmi::{VmiDocument, VmiError, Volume};

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("disk {0:?} names no volume in spec.volumes")]
    NoVolume(String),
    #[error("volume {0:?} has no source (containerDisk, persistentVolumeClaim, emptyDisk or cloudInitNoCloud)")]
    NoSource(String),
    #[error("volume {volume:?}: {detail}")]
    Invalid { volume: String, detail: String },
    #[error("volume {volume:?}: {path}: {source}")]
    Io {
        volume: String,
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Quantity(#[from] VmiError),
    #[error("volume {volume:?}: {source}")]
    CloudInit {
        volume: String,
        source: CloudInitError,
    },
}

/// Where volume data lives.
#[derive(Clone, Debug)]
pub enum Layout {
    /// `virt-launcher run`: local files.
    Local {
        /// Relative paths in the VMI are relative to this directory (the VMI file's).
        base_dir: PathBuf,
        /// Where `persistentVolumeClaim.claimName` without a `/` is looked up.
        pvc_root: PathBuf,
    },
    /// `virt-launcher pod`: the pod's mounts under `root` (normally `/var/run/microvirt`);
    /// `volumeMode: Block` claims are devices in `pvc_devices` ([`PVC_DEVICE_DIR`]).
    Pod { root: PathBuf, pvc_devices: PathBuf },
}

/// Where the operator puts `volumeMode: Block` claims in the launcher container
/// (`volumeDevices`), one device per volume name.
pub const PVC_DEVICE_DIR: &str = "/dev/microvirt/pvcs";

/// What a disk was made from (for status and logs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskKind {
    ContainerDisk,
    PersistentVolumeClaim,
    EmptyDisk,
    CloudInitNoCloud,
}

#[derive(Clone, Debug)]
pub struct PreparedDisk {
    pub name: String,
    pub kind: DiskKind,
    pub config: BlockConfig,
}

fn io_err(volume: &str, path: &Path) -> impl FnOnce(std::io::Error) -> DiskError {
    let (volume, path) = (volume.to_string(), path.display().to_string());
    move |source| DiskError::Io {
        volume,
        path,
        source,
    }
}

fn invalid(volume: &str, detail: impl Into<String>) -> DiskError {
    DiskError::Invalid {
        volume: volume.to_string(),
        detail: detail.into(),
    }
}

/// A path inside a mounted image: leading `/` dropped, `..` refused.
pub fn inside(root: &Path, rel: &str, volume: &str) -> Result<PathBuf, DiskError> {
    let rel = Path::new(rel.trim_start_matches('/'));
    if rel.as_os_str().is_empty()
        || rel
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(invalid(
            volume,
            format!(
                "path {:?} must stay inside the mounted image",
                rel.display()
            ),
        ));
    }
    Ok(root.join(rel))
}

/// A local path: absolute as is, relative to `base`.
pub fn local(base: &Path, p: &str) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

/// A PVC location: a directory means its `disk.img`; a file or block device is the disk.
fn pvc_disk(volume: &str, path: &Path) -> Result<PathBuf, DiskError> {
    let meta = std::fs::metadata(path).map_err(io_err(volume, path))?;
    if meta.is_dir() {
        let img = path.join("disk.img");
        if !img.is_file() {
            return Err(invalid(
                volume,
                format!("{} has no disk.img", path.display()),
            ));
        }
        Ok(img)
    } else if meta.is_file() || meta.file_type().is_block_device() {
        Ok(path.to_path_buf())
    } else {
        Err(invalid(
            volume,
            format!(
                "{} is not a directory, file or block device",
                path.display()
            ),
        ))
    }
}

/// The first regular file (by name) in `dir`.
fn first_file(volume: &str, dir: &Path) -> Result<PathBuf, DiskError> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io_err(volume, dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    names.sort();
    names
        .into_iter()
        .next()
        .ok_or_else(|| invalid(volume, format!("no disk image in {}", dir.display())))
}

/// Creates (or truncates) a sparse file of `capacity` bytes, rounded up to whole sectors.
pub fn create_sparse(volume: &str, path: &Path, capacity: u64) -> Result<(), DiskError> {
    let cap = capacity.div_ceil(512) * 512;
    if cap == 0 {
        return Err(invalid(volume, "emptyDisk capacity must be more than 0"));
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io_err(volume, dir))?;
    }
    let f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(path)
        .map_err(io_err(volume, path))?;
    f.set_len(cap).map_err(io_err(volume, path))
}

fn volume_disk(
    doc: &VmiDocument,
    vol: &Volume,
    layout: &Layout,
    scratch: &Path,
) -> Result<(DiskKind, BlockConfig, bool), DiskError> {
    let name = vol.name.as_str();
    if let Some(cd) = &vol.container_disk {
        let path = match layout {
            Layout::Pod { root, .. } => {
                let mount = root.join("container-disks").join(name);
                match cd.path.as_deref() {
                    Some(p) => inside(&mount, p, name)?,
                    None => first_file(name, &mount.join("disk"))?,
                }
            }
            Layout::Local { base_dir, .. } => match cd.path.as_deref() {
                Some(p) => local(base_dir, p),
                None => {
                    return Err(invalid(
                        name,
                        "containerDisk.path must name a local image file in run mode (images are not pulled)",
                    ))
                }
            },
        };
        if !path.is_file() {
            return Err(invalid(
                name,
                format!("containerDisk image {} is not a file", path.display()),
            ));
        }
        return Ok((DiskKind::ContainerDisk, BlockConfig::new(path), true));
    }
    if let Some(pvc) = &vol.persistent_volume_claim {
        let loc = match layout {
            Layout::Pod { root, pvc_devices } => {
                let mount = root.join("pvcs").join(name);
                if mount.exists() {
                    mount
                } else {
                    let dev = pvc_devices.join(name);
                    if !std::fs::metadata(&dev).is_ok_and(|m| m.file_type().is_block_device()) {
                        return Err(invalid(
                            name,
                            format!(
                                "neither {} (volumeMode: Filesystem) nor the block device {} \
                                 (volumeMode: Block) is there",
                                mount.display(),
                                dev.display()
                            ),
                        ));
                    }
                    dev
                }
            }
            Layout::Local { base_dir, pvc_root } => {
                if pvc.claim_name.contains('/') {
                    local(base_dir, &pvc.claim_name)
                } else {
                    pvc_root.join(&pvc.claim_name)
                }
            }
        };
        let mut c = BlockConfig::new(pvc_disk(name, &loc)?);
        c.read_only = pvc.read_only.unwrap_or(false);
        return Ok((DiskKind::PersistentVolumeClaim, c, false));
    }
    if let Some(ed) = &vol.empty_disk {
        let cap = ed.capacity.bytes("emptyDisk.capacity")?;
        let path = match layout {
            Layout::Pod { root, .. } => root.join("empty-disks").join(name).join("disk.img"),
            Layout::Local { .. } => scratch.join(format!("{name}.empty.img")),
        };
        create_sparse(name, &path, cap)?;
        return Ok((DiskKind::EmptyDisk, BlockConfig::new(path), false));
    }
    if let Some(ci) = &vol.cloud_init_no_cloud {
        let id = doc.metadata.uid.as_deref().unwrap_or_else(|| doc.name());
        let seed = NoCloudSeed::from_volume(ci, id, doc.name()).map_err(|source| {
            DiskError::CloudInit {
                volume: name.into(),
                source,
            }
        })?;
        let path = scratch.join(format!("{name}.cidata.img"));
        seed.write_image(&path)
            .map_err(|source| DiskError::CloudInit {
                volume: name.into(),
                source,
            })?;
        let mut c = BlockConfig::new(path);
        c.read_only = true;
        return Ok((DiskKind::CloudInitNoCloud, c, false));
    }
    Err(DiskError::NoSource(name.into()))
}

/// Prepares every disk of the VMI, in spec order. `scratch` (the runtime directory) receives
/// overlays, cloud-init images and (run mode) emptyDisks.
pub fn prepare(
    doc: &VmiDocument,
    layout: &Layout,
    scratch: &Path,
) -> Result<Vec<PreparedDisk>, DiskError> {
    let mut out = Vec::new();
    for disk in &doc.spec.domain.devices.disks {
        let vol = doc
            .spec
            .volumes
            .iter()
            .find(|v| v.name == disk.name)
            .ok_or_else(|| DiskError::NoVolume(disk.name.clone()))?;
        if let Some(bus) = disk.disk.as_ref().and_then(|d| d.bus.as_deref()) {
            if bus != "virtio" {
                return Err(invalid(
                    &disk.name,
                    format!("bus {bus:?}: only virtio exists"),
                ));
            }
        }
        let (kind, mut config, overlay) = volume_disk(doc, vol, layout, scratch)?;
        let readonly = disk.disk.as_ref().and_then(|d| d.readonly).unwrap_or(false);
        if readonly {
            config.read_only = true;
        } else if overlay {
            // Stateless: a fresh overlay per VMI run, so earlier writes never reappear.
            let ov = scratch.join(format!("{}.overlay", disk.name));
            match std::fs::remove_file(&ov) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(&disk.name, &ov)(e)),
            }
            config.overlay = Some(ov);
        }
        config.id = disk.serial.clone();
        config
            .validate()
            .map_err(|e| invalid(&disk.name, e.to_string()))?;
        out.push(PreparedDisk {
            name: disk.name.clone(),
            kind,
            config,
        });
    }
    for v in &doc.spec.volumes {
        if !doc
            .spec
            .domain
            .devices
            .disks
            .iter()
            .any(|d| d.name == v.name)
        {
            log::warn!("volume {:?} is not attached: no disk names it", v.name);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(yaml: &str) -> VmiDocument {
        VmiDocument::parse(yaml, "test").unwrap()
    }

    #[test]
    fn order_kinds_and_flags() {
        let dir = std::env::temp_dir().join(format!("launcher-disks-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("pvcs/data")).unwrap();
        std::fs::write(dir.join("base.img"), vec![0u8; 4096]).unwrap();
        std::fs::write(dir.join("pvcs/data/disk.img"), vec![0u8; 4096]).unwrap();
        let d = doc(r#"
metadata: {name: t}
spec:
  domain:
    devices:
      disks:
        - {name: root, serial: r1}
        - {name: ci}
        - {name: data, disk: {readonly: true}}
        - {name: scratch}
  volumes:
    - {name: scratch, emptyDisk: {capacity: 3Ki}}
    - {name: data, persistentVolumeClaim: {claimName: data}}
    - {name: ci, cloudInitNoCloud: {userData: "hi"}}
    - {name: root, containerDisk: {image: x, path: base.img}}
    - {name: unused, emptyDisk: {capacity: 1Mi}}
"#);
        let layout = Layout::Local {
            base_dir: dir.clone(),
            pvc_root: dir.join("pvcs"),
        };
        let scratch = dir.join("run");
        std::fs::create_dir_all(&scratch).unwrap();
        std::fs::write(scratch.join("root.overlay"), b"stale").unwrap();
        let disks = prepare(&d, &layout, &scratch).unwrap();
        let names: Vec<_> = disks.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["root", "ci", "data", "scratch"]);
        assert_eq!(disks[0].kind, DiskKind::ContainerDisk);
        assert_eq!(disks[0].config.overlay, Some(scratch.join("root.overlay")));
        assert!(
            !scratch.join("root.overlay").exists(),
            "stale overlay removed"
        );
        assert_eq!(disks[0].config.id.as_deref(), Some("r1"));
        assert!(disks[1].config.read_only);
        assert_eq!(disks[2].config.path, dir.join("pvcs/data/disk.img"));
        assert!(disks[2].config.read_only);
        let meta = std::fs::metadata(&disks[3].config.path).unwrap();
        assert_eq!(meta.len(), 3072);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn pod_mode_block_pvc_is_the_device_in_the_device_dir() {
        use std::os::unix::fs::MetadataExt;
        let dir = std::env::temp_dir().join(format!("launcher-blockpvc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (root, devs) = (dir.join("root"), dir.join("dev"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&devs).unwrap();
        // A block device node for a real loop device, as the container runtime creates it.
        let backing = dir.join("backing.img");
        std::fs::write(&backing, vec![0u8; 1 << 20]).unwrap();
        let out = std::process::Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&backing)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let lo = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let detach = || {
            let _ = std::process::Command::new("losetup")
                .args(["-d", &lo])
                .status();
        };
        let rdev = std::fs::metadata(&lo).unwrap().rdev();
        let node =
            std::ffi::CString::new(devs.join("data").as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: valid C string; creates a device node in our temp directory.
        let r = unsafe { libc::mknod(node.as_ptr(), libc::S_IFBLK | 0o600, rdev) };
        detach();
        assert_eq!(r, 0, "mknod: {}", std::io::Error::last_os_error());
        let layout = Layout::Pod {
            root: root.clone(),
            pvc_devices: devs.clone(),
        };
        let d = doc("spec: {domain: {devices: {disks: [{name: data}]}}, volumes: [{name: data, persistentVolumeClaim: {claimName: c}}]}");
        let disks = prepare(&d, &layout, &dir.join("run")).unwrap();
        assert_eq!(disks[0].config.path, devs.join("data"));
        assert_eq!(disks[0].kind, DiskKind::PersistentVolumeClaim);
        // A file system claim (its mount) wins when both are there.
        std::fs::create_dir_all(root.join("pvcs/data")).unwrap();
        std::fs::write(root.join("pvcs/data/disk.img"), vec![0u8; 4096]).unwrap();
        let disks = prepare(&d, &layout, &dir.join("run")).unwrap();
        assert_eq!(disks[0].config.path, root.join("pvcs/data/disk.img"));
        // Something that is not a block device in the device directory is refused.
        std::fs::remove_dir_all(root.join("pvcs")).unwrap();
        std::fs::remove_file(devs.join("data")).unwrap();
        std::fs::write(devs.join("data"), b"not a device").unwrap();
        let e = prepare(&d, &layout, &dir.join("run"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("volumeMode: Block"), "{e}");
        assert!(e.contains(&devs.join("data").display().to_string()), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn errors_are_named() {
        let layout = Layout::Pod {
            root: PathBuf::from("/nonexistent-root"),
            pvc_devices: PathBuf::from("/nonexistent-devices"),
        };
        let e = prepare(
            &doc("spec: {domain: {devices: {disks: [{name: a}]}}}"),
            &layout,
            Path::new("/tmp"),
        )
        .unwrap_err();
        assert!(matches!(e, DiskError::NoVolume(_)));
        let e = prepare(
            &doc("spec: {domain: {devices: {disks: [{name: a}]}}, volumes: [{name: a, containerDisk: {image: i, path: ../../etc/passwd}}]}"),
            &layout,
            Path::new("/tmp"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("inside the mounted image"), "{e}");
        let e = prepare(
            &doc("spec: {domain: {devices: {disks: [{name: a}]}}, volumes: [{name: a, persistentVolumeClaim: {claimName: c}}]}"),
            &layout,
            Path::new("/tmp"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("/nonexistent-root/pvcs/a"), "{e}");
        assert!(e.to_string().contains("/nonexistent-devices/a"), "{e}");
    }
}
