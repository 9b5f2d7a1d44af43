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
//! | containerRootfs | not yet (docs/oci-images.md) | `path`: a directory with `rootfs/` (and `config.json`), built into a read-only erofs image once per tree fingerprint in the cache ([`crate::oci::cache_dir`]), else `<vol>.erofs` in the runtime directory |
//!
//! containerDisks are used through a per-VMI copy-on-write overlay in the runtime directory (the
//! image is never written, so any number of VMIs share it), unless the disk is read-only.
//!
//! Volume and disk names become path components, so they must be DNS labels (checked when the
//! VMI is read, see `vmi.rs`). In pod mode, and for the files the launcher creates in the
//! runtime directory in both modes, files are opened with [`paths::open_beneath`] (no symbolic
//! link followed below the mount or runtime directory) and the VMM gets `/proc/self/fd/N` of the
//! launcher's descriptor, so it opens exactly the file that was checked. Run mode's own local
//! paths (images, PVC paths on the user's machine) are the user's and are used as given.

use std::fs::File;
use std::os::unix::fs::FileTypeExt;
use std::path::{Component, Path, PathBuf};

use vmm::devices::virtio::BlockConfig;

use crate::cloudinit::{CloudInitError, NoCloudSeed};
use crate::paths::{self, open_beneath, OpenMode};
use crate::vmi::{VmiDocument, VmiError, Volume};

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("disk {0:?} names no volume in spec.volumes")]
    NoVolume(String),
    #[error("volume {0:?} has no source (containerDisk, persistentVolumeClaim, emptyDisk, cloudInitNoCloud or containerRootfs)")]
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
    /// An OCI image's files as a read-only erofs image ([`crate::oci`]).
    ContainerRootfs,
}

#[derive(Debug)]
pub struct PreparedDisk {
    pub name: String,
    pub kind: DiskKind,
    /// What the VMM opens (paths may be `/proc/self/fd/N` of `held`).
    pub config: BlockConfig,
    /// The same with the files' real paths, for status and logs.
    pub shown: BlockConfig,
    /// Descriptors behind `/proc/self/fd/N` paths in `config`; keep them open until the VMM
    /// has opened the disks.
    pub held: Vec<File>,
    /// A `containerRootfs` disk's image configuration, read once with its files.
    pub image: Option<crate::oci::ImageConfig>,
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
    Ok(root.join(relative_inside(rel, volume)?))
}

/// `rel` as a relative path that stays inside its root: leading `/` dropped, `..` refused.
pub fn relative_inside(rel: &str, volume: &str) -> Result<PathBuf, DiskError> {
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
    Ok(rel.to_path_buf())
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

/// A disk file: the path the VMM opens, the path shown, and the descriptor behind it.
struct DiskFile {
    vmm_path: PathBuf,
    shown: PathBuf,
    held: Option<File>,
}

impl DiskFile {
    /// A local file used by path (run mode).
    fn local(p: PathBuf) -> Self {
        Self {
            vmm_path: p.clone(),
            shown: p,
            held: None,
        }
    }

    /// `root/rel` opened without following links; the VMM reopens the descriptor.
    fn beneath(volume: &str, root: &Path, rel: &Path, mode: OpenMode) -> Result<Self, DiskError> {
        let shown = root.join(rel);
        let f = open_beneath(root, rel, mode).map_err(io_err(volume, &shown))?;
        Ok(Self {
            vmm_path: paths::proc_path(&f),
            shown,
            held: Some(f),
        })
    }

    fn file(&self) -> Option<&File> {
        self.held.as_ref()
    }
}

/// Whether a descriptor is a regular file or a block device.
fn is_disk(f: &File) -> std::io::Result<bool> {
    let t = f.metadata()?.file_type();
    Ok(t.is_file() || t.is_block_device())
}

/// A PVC location in pod mode: `pvcs/<vol>` is a directory with `disk.img`, or the block
/// device itself.
fn pvc_disk_pod(
    volume: &str,
    root: &Path,
    pvc_devices: &Path,
    read_only: bool,
) -> Result<DiskFile, DiskError> {
    let mode = if read_only {
        OpenMode::ReadOnly
    } else {
        OpenMode::ReadWrite
    };
    let mount = Path::new("pvcs").join(volume);
    let meta = match std::fs::symlink_metadata(root.join(&mount)) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return pvc_block_device(
                volume,
                &pvc_devices.join(volume),
                read_only,
                &root.join(&mount),
            )
        }
        Err(e) => return Err(io_err(volume, &root.join(&mount))(e)),
    };
    let rel = if meta.is_dir() {
        mount.join("disk.img")
    } else {
        mount
    };
    let d = DiskFile::beneath(volume, root, &rel, mode)?;
    match d.file().map(is_disk) {
        Some(Ok(true)) => Ok(d),
        _ => Err(invalid(
            volume,
            format!("{} is not a file or block device", d.shown.display()),
        )),
    }
}

/// A `volumeMode: Block` claim: the device node `dev` (not a link), opened here; the VMM
/// reopens the descriptor.
fn pvc_block_device(
    volume: &str,
    dev: &Path,
    read_only: bool,
    mount: &Path,
) -> Result<DiskFile, DiskError> {
    use std::os::unix::fs::OpenOptionsExt;
    let missing = || {
        invalid(
            volume,
            format!(
                "neither {} (volumeMode: Filesystem) nor the block device {} (volumeMode: Block) is there",
                mount.display(),
                dev.display()
            ),
        )
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(!read_only)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dev)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => missing(),
            _ => io_err(volume, dev)(e),
        })?;
    if !f.metadata().is_ok_and(|m| m.file_type().is_block_device()) {
        return Err(missing());
    }
    Ok(DiskFile {
        vmm_path: paths::proc_path(&f),
        shown: dev.to_path_buf(),
        held: Some(f),
    })
}

/// A PVC location in run mode: a directory means its `disk.img`; a file or block device is
/// the disk.
fn pvc_disk_local(volume: &str, path: &Path) -> Result<DiskFile, DiskError> {
    let meta = std::fs::metadata(path).map_err(io_err(volume, path))?;
    if meta.is_dir() {
        let img = path.join("disk.img");
        if !img.is_file() {
            return Err(invalid(
                volume,
                format!("{} has no disk.img", path.display()),
            ));
        }
        Ok(DiskFile::local(img))
    } else if meta.is_file() || meta.file_type().is_block_device() {
        Ok(DiskFile::local(path.to_path_buf()))
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

/// The first regular file (by name, links not followed) in `root/rel`.
fn first_file(volume: &str, root: &Path, rel: &Path) -> Result<PathBuf, DiskError> {
    let dir = root.join(rel);
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(io_err(volume, &dir))?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| rel.join(e.file_name()))
        .collect();
    names.sort();
    names
        .into_iter()
        .next()
        .ok_or_else(|| invalid(volume, format!("no disk image in {}", dir.display())))
}

/// Creates (or truncates) the sparse file `dir/name` of `capacity` bytes, rounded up to whole
/// sectors, without following links below `dir`.
pub fn create_sparse(
    volume: &str,
    dir: &Path,
    name: &Path,
    capacity: u64,
) -> Result<File, DiskError> {
    let cap = capacity.div_ceil(512) * 512;
    if cap == 0 {
        return Err(invalid(volume, "emptyDisk capacity must be more than 0"));
    }
    let path = dir.join(name);
    let f = open_beneath(dir, name, OpenMode::Create).map_err(io_err(volume, &path))?;
    f.set_len(cap).map_err(io_err(volume, &path))?;
    Ok(f)
}

/// Below the pod root: where the operator mounts cloud-init Secrets.
const CLOUD_INIT_DIR: &str = "cloud-init";
/// Largest cloud-init file read from a Secret (a Secret holds at most 1 MiB).
const SECRET_FILE_MAX: u64 = 1 << 20;

/// The first of `names` in the Secret mount `dir`; `None` when the directory or the files do
/// not exist. (Secret volumes are links into a timestamped directory that the kubelet writes;
/// they are followed.)
fn secret_file(volume: &str, dir: &Path, names: &[&str]) -> Result<Option<Vec<u8>>, DiskError> {
    use std::io::Read;
    for n in names {
        let p = dir.join(n);
        let f = match File::open(&p) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_err(volume, &p)(e)),
        };
        let mut data = Vec::new();
        f.take(SECRET_FILE_MAX + 1)
            .read_to_end(&mut data)
            .map_err(io_err(volume, &p))?;
        if data.len() as u64 > SECRET_FILE_MAX {
            return Err(invalid(
                volume,
                format!("{} is larger than {SECRET_FILE_MAX} bytes", p.display()),
            ));
        }
        return Ok(Some(data));
    }
    Ok(None)
}

/// `image_config`: set for a `containerRootfs` volume (its image's configuration).
fn volume_disk(
    doc: &VmiDocument,
    vol: &Volume,
    layout: &Layout,
    scratch: &Path,
    devices: &mut BlockDevices,
    image_config: &mut Option<crate::oci::ImageConfig>,
) -> Result<(DiskKind, DiskFile, bool, bool), DiskError> {
    let name = vol.name.as_str();
    if let Some(cd) = &vol.container_disk {
        let d = match layout {
            Layout::Pod { root, .. } => {
                let mount = Path::new("container-disks").join(name);
                let rel = match cd.path.as_deref() {
                    Some(p) => mount.join(relative_inside(p, name)?),
                    None => first_file(name, root, &mount.join("disk"))?,
                };
                DiskFile::beneath(name, root, &rel, OpenMode::ReadOnly)?
            }
            Layout::Local { base_dir, .. } => match cd.path.as_deref() {
                Some(p) => DiskFile::local(local(base_dir, p)),
                None => {
                    return Err(invalid(
                        name,
                        "containerDisk.path must name a local image file in run mode (images are not pulled)",
                    ))
                }
            },
        };
        let regular = match d.file() {
            Some(f) => f.metadata().is_ok_and(|m| m.is_file()),
            None => d.vmm_path.is_file(),
        };
        if !regular {
            return Err(invalid(
                name,
                format!("containerDisk image {} is not a file", d.shown.display()),
            ));
        }
        return Ok((DiskKind::ContainerDisk, d, true, false));
    }
    if let Some(cr) = &vol.container_rootfs {
        let dir = match (layout, cr.path.as_deref()) {
            (Layout::Local { base_dir, .. }, Some(p)) => local(base_dir, p),
            (Layout::Local { .. }, None) => {
                return Err(invalid(
                    name,
                    "containerRootfs.path must name a local image directory in run mode (images are not pulled)",
                ))
            }
            (Layout::Pod { .. }, _) => {
                return Err(invalid(
                    name,
                    "containerRootfs is not supported in a launcher pod yet (only virt-launcher run; docs/oci-images.md)",
                ))
            }
        };
        let image = crate::oci::ImageDir::open(&dir).map_err(|e| invalid(name, e))?;
        let t = std::time::Instant::now();
        let stats = crate::oci::check_tree(&image.rootfs, crate::oci::LIMITS)
            .map_err(|e| invalid(name, format!("image refused: {e}")))?;
        log::info!(
            "volume {name:?}: the image {} has {} files, {} MiB",
            image.rootfs.display(),
            stats.entries,
            stats.bytes >> 20
        );
        let f = match crate::oci::cache_dir() {
            Some(cache) => {
                let (path, built) = crate::oci::cached_erofs(&image.rootfs, &stats, &cache)
                    .map_err(|e| invalid(name, e))?;
                log::info!(
                    "volume {name:?}: {} {} in {} ms",
                    path.display(),
                    if built { "built" } else { "found in the cache" },
                    t.elapsed().as_millis()
                );
                DiskFile::local(path)
            }
            None => {
                let rel = PathBuf::from(format!("{name}.erofs"));
                crate::oci::build_erofs(&image.rootfs, &scratch.join(&rel))
                    .map_err(|e| invalid(name, e))?;
                log::info!(
                    "volume {name:?}: {} built in {} ms (no cache directory)",
                    scratch.join(&rel).display(),
                    t.elapsed().as_millis()
                );
                DiskFile::beneath(name, scratch, &rel, OpenMode::ReadOnly)?
            }
        };
        *image_config = Some(image.config);
        return Ok((DiskKind::ContainerRootfs, f, false, true));
    }
    if let Some(pvc) = &vol.persistent_volume_claim {
        let read_only = pvc.read_only.unwrap_or(false);
        let d = match layout {
            Layout::Pod { root, pvc_devices } => match devices.0.remove(name) {
                Some(d) => d,
                None => pvc_disk_pod(name, root, pvc_devices, read_only)?,
            },
            Layout::Local { base_dir, pvc_root } => {
                let loc = if pvc.claim_name.contains('/') {
                    local(base_dir, &pvc.claim_name)
                } else {
                    pvc_root.join(&pvc.claim_name)
                };
                pvc_disk_local(name, &loc)?
            }
        };
        return Ok((DiskKind::PersistentVolumeClaim, d, false, read_only));
    }
    if let Some(ed) = &vol.empty_disk {
        let cap = ed.capacity.bytes("emptyDisk.capacity")?;
        let (dir, rel) = match layout {
            Layout::Pod { root, .. } => (
                root.clone(),
                Path::new("empty-disks").join(name).join("disk.img"),
            ),
            Layout::Local { .. } => (
                scratch.to_path_buf(),
                PathBuf::from(format!("{name}.empty.img")),
            ),
        };
        let f = create_sparse(name, &dir, &rel, cap)?;
        let d = DiskFile {
            vmm_path: paths::proc_path(&f),
            shown: dir.join(rel),
            held: Some(f),
        };
        return Ok((DiskKind::EmptyDisk, d, false, false));
    }
    if let Some(ci) = &vol.cloud_init_no_cloud {
        let id = doc.instance_id();
        let ci_err = |source| DiskError::CloudInit {
            volume: name.into(),
            source,
        };
        let mut seed = NoCloudSeed::from_volume(ci, id, doc.hostname()).map_err(ci_err)?;
        match layout {
            Layout::Pod { root, .. } => {
                // The operator mounts the data from Secrets (ours for inline data, or the
                // user's secretRef); the VMI document does not carry it.
                let dir = root.join(CLOUD_INIT_DIR).join(name);
                let user = secret_file(name, &dir.join("userdata"), &["userdata", "userData"])?;
                match (user, &ci.secret_ref) {
                    (Some(u), _) => seed.user_data = u,
                    (None, Some(r)) => {
                        return Err(invalid(
                            name,
                            format!(
                                "secretRef {:?}: no user data mounted at {}",
                                r.name,
                                dir.join("userdata").display()
                            ),
                        ))
                    }
                    (None, None) => {}
                }
                let net = secret_file(
                    name,
                    &dir.join("networkdata"),
                    &["networkdata", "networkData"],
                )?;
                match (net, &ci.network_data_secret_ref) {
                    (Some(n), _) => {
                        seed.network_config = Some(
                            String::from_utf8(n)
                                .map_err(|_| invalid(name, "the network data is not UTF-8 text"))?,
                        )
                    }
                    (None, Some(r)) => {
                        return Err(invalid(
                            name,
                            format!(
                                "networkDataSecretRef {:?}: no network data mounted at {}",
                                r.name,
                                dir.join("networkdata").display()
                            ),
                        ))
                    }
                    (None, None) => {}
                }
            }
            Layout::Local { .. } => {
                if ci.secret_ref.is_some() || ci.network_data_secret_ref.is_some() {
                    return Err(invalid(
                        name,
                        "secretRef and networkDataSecretRef need the launcher pod (run mode reads no Secrets); use userData or networkData",
                    ));
                }
            }
        }
        let rel = PathBuf::from(format!("{name}.cidata.img"));
        let shown = scratch.join(&rel);
        let mut f = open_beneath(scratch, &rel, OpenMode::Create).map_err(io_err(name, &shown))?;
        seed.write_to(&mut f).map_err(ci_err)?;
        let d = DiskFile {
            vmm_path: paths::proc_path(&f),
            shown,
            held: Some(f),
        };
        return Ok((DiskKind::CloudInitNoCloud, d, false, true));
    }
    Err(DiskError::NoSource(name.into()))
}

/// `volumeMode: Block` claims' devices opened ahead of [`prepare_with`]: in the pod the
/// launcher opens them while it is still root (the container runtime makes the nodes root's),
/// before it becomes its own user.
#[derive(Default)]
pub struct BlockDevices(std::collections::BTreeMap<String, DiskFile>);

/// Opens the device of every persistentVolumeClaim volume that is a Block claim in the pod
/// (its device node is there and no file system mount is); nothing in run mode.
pub fn open_block_devices(doc: &VmiDocument, layout: &Layout) -> Result<BlockDevices, DiskError> {
    let mut out = BlockDevices::default();
    let Layout::Pod { root, pvc_devices } = layout else {
        return Ok(out);
    };
    for vol in &doc.spec.volumes {
        let Some(pvc) = &vol.persistent_volume_claim else {
            continue;
        };
        let mount = root.join("pvcs").join(&vol.name);
        let dev = pvc_devices.join(&vol.name);
        if std::fs::symlink_metadata(&mount).is_err() && std::fs::symlink_metadata(&dev).is_ok() {
            let d = pvc_block_device(&vol.name, &dev, pvc.read_only.unwrap_or(false), &mount)?;
            out.0.insert(vol.name.clone(), d);
        }
    }
    Ok(out)
}

/// Prepares every disk of the VMI, in spec order. `scratch` (the runtime directory) receives
/// overlays, cloud-init images and (run mode) emptyDisks.
pub fn prepare(
    doc: &VmiDocument,
    layout: &Layout,
    scratch: &Path,
) -> Result<Vec<PreparedDisk>, DiskError> {
    prepare_with(doc, layout, scratch, BlockDevices::default())
}

/// [`prepare`], with Block claims' devices opened already ([`open_block_devices`]).
pub fn prepare_with(
    doc: &VmiDocument,
    layout: &Layout,
    scratch: &Path,
    mut devices: BlockDevices,
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
        let mut image = None;
        let (kind, file, overlay, ro) =
            volume_disk(doc, vol, layout, scratch, &mut devices, &mut image)?;
        let mut config = BlockConfig::new(&file.vmm_path);
        let mut shown = BlockConfig::new(&file.shown);
        let mut held: Vec<File> = file.held.into_iter().collect();
        let readonly = ro || disk.disk.as_ref().and_then(|d| d.readonly).unwrap_or(false);
        if readonly {
            config.read_only = true;
        } else if overlay {
            // Stateless: a fresh overlay per VMI run, so earlier writes never reappear.
            let rel = PathBuf::from(format!("{}.overlay", disk.name));
            let ov = scratch.join(&rel);
            let f =
                open_beneath(scratch, &rel, OpenMode::Create).map_err(io_err(&disk.name, &ov))?;
            config.overlay = Some(paths::proc_path(&f));
            shown.overlay = Some(ov);
            held.push(f);
        }
        config.id = disk.serial.clone();
        shown.read_only = config.read_only;
        shown.id = config.id.clone();
        config
            .validate()
            .map_err(|e| invalid(&disk.name, e.to_string()))?;
        out.push(PreparedDisk {
            name: disk.name.clone(),
            kind,
            config,
            shown,
            held,
            image,
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
        assert_eq!(disks[0].shown.overlay, Some(scratch.join("root.overlay")));
        // The VMM gets the launcher's descriptor of the (fresh, empty) overlay.
        let ov = disks[0].config.overlay.clone().unwrap();
        assert!(ov.starts_with("/proc/self/fd/"), "{ov:?}");
        assert_eq!(
            std::fs::metadata(scratch.join("root.overlay"))
                .unwrap()
                .len(),
            0,
            "stale overlay truncated"
        );
        assert_eq!(disks[0].config.id.as_deref(), Some("r1"));
        assert!(disks[1].config.read_only);
        assert_eq!(disks[2].config.path, dir.join("pvcs/data/disk.img"));
        assert!(disks[2].config.read_only);
        let meta = std::fs::metadata(&disks[3].config.path).unwrap();
        assert_eq!(meta.len(), 3072);
        assert_eq!(disks[3].shown.path, scratch.join("scratch.empty.img"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Pod mode: a symbolic link where a volume's file should be is refused, whatever it
    /// points to, and what it points to is left alone.
    #[test]
    fn pod_mode_does_not_follow_links_in_volumes() {
        let dir = std::env::temp_dir().join(format!("launcher-disklinks-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let root = dir.join("root");
        for d in [
            "pvcs/data",
            "container-disks/img/disk",
            "empty-disks/scratch",
            "run",
        ] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        let victim = dir.join("victim.img");
        std::fs::write(&victim, vec![7u8; 4096]).unwrap();
        let layout = Layout::Pod {
            root: root.clone(),
            pvc_devices: dir.join("dev"),
        };
        let scratch = root.join("run");
        let cases = [
            (
                "pvcs/data/disk.img",
                "{name: v, persistentVolumeClaim: {claimName: c}}",
                "data",
            ),
            (
                "container-disks/img/disk/a.img",
                "{name: v, containerDisk: {image: i, path: disk/a.img}}",
                "img",
            ),
            (
                "empty-disks/scratch/disk.img",
                "{name: v, emptyDisk: {capacity: 1Mi}}",
                "scratch",
            ),
        ];
        for (link, vol, name) in cases {
            std::os::unix::fs::symlink(&victim, root.join(link)).unwrap();
            let vol = vol.replace("name: v", &format!("name: {name}"));
            let d = doc(&format!(
                "spec: {{domain: {{devices: {{disks: [{{name: {name}}}]}}}}, volumes: [{vol}]}}"
            ));
            let e = prepare(&d, &layout, &scratch).unwrap_err().to_string();
            assert!(e.contains("symbolic link"), "{link}: {e}");
            assert_eq!(std::fs::read(&victim).unwrap(), vec![7u8; 4096], "{link}");
        }
        // A linked containerDisk is not picked as "the first file in disk/" either.
        let d = doc("spec: {domain: {devices: {disks: [{name: img}]}}, volumes: [{name: img, containerDisk: {image: i}}]}");
        let e = prepare(&d, &layout, &scratch).unwrap_err().to_string();
        assert!(e.contains("no disk image"), "{e}");
        // An overlay or cloud-init image planted as a link in the runtime directory.
        std::fs::write(
            root.join("container-disks/img/disk/real.img"),
            vec![0u8; 4096],
        )
        .unwrap();
        std::os::unix::fs::symlink(&victim, scratch.join("img.overlay")).unwrap();
        let e = prepare(&d, &layout, &scratch).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        std::os::unix::fs::symlink(&victim, scratch.join("seed.cidata.img")).unwrap();
        let d = doc("spec: {domain: {devices: {disks: [{name: seed}]}}, volumes: [{name: seed, cloudInitNoCloud: {userData: x}}]}");
        let e = prepare(&d, &layout, &scratch).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read(&victim).unwrap(), vec![7u8; 4096]);
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
        assert_eq!(disks[0].shown.path, devs.join("data"));
        assert_eq!(disks[0].kind, DiskKind::PersistentVolumeClaim);
        // Opened here (no link followed), handed to the VMM as a descriptor.
        let held = std::fs::metadata(&disks[0].config.path).unwrap();
        assert!(held.file_type().is_block_device());
        assert_eq!(held.rdev(), rdev);
        // A file system claim (its mount) wins when both are there.
        std::fs::create_dir_all(root.join("pvcs/data")).unwrap();
        std::fs::write(root.join("pvcs/data/disk.img"), vec![0u8; 4096]).unwrap();
        let disks = prepare(&d, &layout, &dir.join("run")).unwrap();
        assert_eq!(disks[0].shown.path, root.join("pvcs/data/disk.img"));
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

    /// A qcow2 image of `size` virtual bytes with nothing allocated (version 3, 64 KiB
    /// clusters): header, then the L1 table in cluster 1.
    fn empty_qcow2(size: u64) -> Vec<u8> {
        let mut h = vec![0u8; 65536];
        h[0..4].copy_from_slice(b"QFI\xfb");
        h[4..8].copy_from_slice(&3u32.to_be_bytes());
        h[20..24].copy_from_slice(&16u32.to_be_bytes());
        h[24..32].copy_from_slice(&size.to_be_bytes());
        let l1 = size.div_ceil(1 << 29) as u32;
        h[36..40].copy_from_slice(&l1.to_be_bytes());
        h[40..48].copy_from_slice(&65536u64.to_be_bytes());
        h[96..100].copy_from_slice(&4u32.to_be_bytes());
        h[100..104].copy_from_slice(&104u32.to_be_bytes());
        h.resize(65536 + 8 * l1 as usize, 0);
        h
    }

    /// KubeVirt's packing: the qcow2 image is the file in the containerDisk's `disk/`, any
    /// name. The VMM takes it as qcow2 by its magic number; the guest sees, and the overlay is
    /// sized by, its virtual size, not the file's length.
    #[test]
    fn a_qcow2_container_disk_has_its_virtual_size() {
        use vmm::devices::interrupt::IrqLine;
        use vmm::devices::virtio::block::{BlockDevice, IoThreadOptions};
        use vmm::devices::virtio::VirtioDevice;
        let dir = std::env::temp_dir().join(format!("launcher-qcow2-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let root = dir.join("root");
        std::fs::create_dir_all(root.join("container-disks/img/disk")).unwrap();
        std::fs::create_dir_all(root.join("run")).unwrap();
        let image = empty_qcow2(3 << 30);
        std::fs::write(root.join("container-disks/img/disk/cirros.qcow2"), &image).unwrap();
        let layout = Layout::Pod {
            root: root.clone(),
            pvc_devices: dir.join("dev"),
        };
        let scratch = root.join("run");
        for ro in [false, true] {
            let d = doc(&format!(
                "spec: {{domain: {{devices: {{disks: [{{name: img, disk: {{readonly: {ro}}}}}]}}}}, \
                 volumes: [{{name: img, containerDisk: {{image: i}}}}]}}"
            ));
            let p = prepare(&d, &layout, &scratch).unwrap();
            assert!(p[0].shown.path.ends_with("disk/cirros.qcow2"));
            assert_eq!(p[0].config.overlay.is_some(), !ro);
            let dev = BlockDevice::from_config(
                &p[0].config,
                IrqLine::new(5).unwrap(),
                IoThreadOptions::default(),
            )
            .unwrap();
            let mut cap = [0u8; 8];
            dev.read_config(0, &mut cap);
            assert_eq!(u64::from_le_bytes(cap), (3 << 30) / 512, "ro={ro}");
            if !ro {
                let ovl = std::fs::metadata(scratch.join("img.overlay")).unwrap();
                assert!(ovl.len() >= 3 << 30, "overlay of {} bytes", ovl.len());
            }
            drop(dev);
        }
        assert_eq!(
            std::fs::read(root.join("container-disks/img/disk/cirros.qcow2")).unwrap(),
            image
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
