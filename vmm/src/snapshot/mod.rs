//! Snapshots of a running VM: a directory with
//!
//! | file | what |
//! |---|---|
//! | `vmstate` | header (magic, format version, length, CRC-64) + JSON payload ([`state::MicrovmState`]): host facts, vCPUs, VM, devices |
//! | `memory` | guest RAM, regions back to back, as a sparse file: only pages the guest touched hold data |
//! | `disk<N>.overlay` | the copy-on-write overlay of virtio device N (disks with `overlay=` only) |
//!
//! A snapshot directory is written once: the target must be absent or empty. Files are written
//! under temporary names and renamed at the end, `vmstate` last, so a directory with a
//! `vmstate` is complete; a failed snapshot removes what it wrote.
//!
//! Threads: [`SnapshotFiles::create`] and [`SnapshotFiles::commit`] run on the thread that asked
//! (the control socket's), which creates, opens and renames files; the VMM thread only writes
//! through the descriptors it is handed ([`SnapshotWriter`]) and never opens a path, so its
//! seccomp filter can forbid `openat`. Restore ([`LoadedSnapshot::open`]) runs while the VM is
//! being built, before any guest code.
//!
//! Format and semantics: `docs/snapshot.md`.

pub mod blob;
pub mod format;
pub mod host;
pub mod state;

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use self::format::{FormatError, Version};
use self::state::MicrovmState;

pub const STATE_FILE: &str = "vmstate";
pub const MEMORY_FILE: &str = "memory";

/// The file holding virtio device `device`'s overlay.
pub fn overlay_file_name(device: usize) -> String {
    format!("disk{device}.overlay")
}

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("{dir} is not a snapshot: {detail}")]
    NotASnapshot { dir: String, detail: String },
    #[error("snapshot {dir}: {source}")]
    Format { dir: String, source: FormatError },
    #[error("snapshot {dir}: the state file does not parse: {detail}")]
    Payload { dir: String, detail: String },
    #[error("snapshot {dir}: inconsistent state: {detail}")]
    Inconsistent { dir: String, detail: String },
    #[error("snapshot {dir}: {file}: {source}")]
    File {
        dir: String,
        file: String,
        source: io::Error,
    },
    #[error("snapshot {dir}: memory file is {actual} bytes, the guest has {expected} bytes of RAM (truncated or not this snapshot's file)")]
    MemorySize {
        dir: String,
        expected: u64,
        actual: u64,
    },
    #[error("snapshot directory {dir}: {detail}")]
    Target { dir: String, detail: String },
}

fn shown(p: &Path) -> String {
    p.display().to_string()
}

/// The descriptors the VMM thread writes a snapshot through.
#[derive(Debug)]
pub struct SnapshotWriter {
    pub state: File,
    pub memory: File,
    /// `(virtio device index, file)` for every disk with an overlay.
    pub overlays: Vec<(usize, File)>,
}

impl SnapshotWriter {
    pub fn overlay(&self, device: usize) -> Option<&File> {
        self.overlays
            .iter()
            .find(|(i, _)| *i == device)
            .map(|(_, f)| f)
    }
}

/// What a snapshot wrote and how long the guest was paused for it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotSummary {
    /// Guest RAM size.
    pub ram_bytes: u64,
    /// Pages the guest had touched (looked at).
    pub touched_bytes: u64,
    /// Bytes written to the memory file.
    pub memory_bytes: u64,
    /// Bytes of disk overlays copied.
    pub overlay_bytes: u64,
    /// Size of the state file.
    pub state_bytes: u64,
    /// How long the vCPUs were paused for the snapshot (0 when the VM was already paused).
    pub paused_us: u64,
    /// Time spent writing the snapshot on the VMM thread.
    pub write_us: u64,
    /// The VM was running when the snapshot was asked for (it is paused now).
    pub was_running: bool,
}

/// The files of a snapshot being written (on the requesting thread).
#[derive(Debug)]
pub struct SnapshotFiles {
    dir: PathBuf,
    created_dir: bool,
    /// `(temporary, final)` names, `vmstate` last.
    names: Vec<(PathBuf, PathBuf)>,
    writer: Option<SnapshotWriter>,
    committed: bool,
}

fn partial(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!(".{name}.partial"))
}

impl SnapshotFiles {
    /// Creates `dir` (absent or empty) and the files of a snapshot of a VM whose virtio devices
    /// `overlay_devices` have disk overlays.
    pub fn create(dir: &Path, overlay_devices: &[usize]) -> Result<Self, SnapshotError> {
        let target = |detail: String| SnapshotError::Target {
            dir: shown(dir),
            detail,
        };
        let created_dir = match std::fs::metadata(dir) {
            Ok(m) if !m.is_dir() => return Err(target("exists and is not a directory".into())),
            Ok(_) => {
                let mut it = std::fs::read_dir(dir).map_err(|e| target(e.to_string()))?;
                if it.next().is_some() {
                    return Err(target(
                        "is not empty (a snapshot directory is written once)".into(),
                    ));
                }
                false
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::create_dir_all(dir)
                    .map_err(|e| target(format!("cannot create it: {e}")))?;
                true
            }
            Err(e) => return Err(target(e.to_string())),
        };
        let mut me = Self {
            dir: dir.to_path_buf(),
            created_dir,
            names: Vec::new(),
            writer: None,
            committed: false,
        };
        let mut open = |name: &str| -> Result<File, SnapshotError> {
            let tmp = partial(dir, name);
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(|e| target(format!("cannot create {name}: {e}")))?;
            me.names.push((tmp, dir.join(name)));
            Ok(f)
        };
        let memory = open(MEMORY_FILE)?;
        let mut overlays = Vec::new();
        for &d in overlay_devices {
            overlays.push((d, open(&overlay_file_name(d))?));
        }
        let state = open(STATE_FILE)?;
        me.writer = Some(SnapshotWriter {
            state,
            memory,
            overlays,
        });
        Ok(me)
    }

    /// Duplicates of the descriptors, for the VMM thread.
    pub fn writer(&self) -> Result<SnapshotWriter, SnapshotError> {
        let w = self.writer.as_ref().expect("files are open until commit");
        let dup = |f: &File| {
            f.try_clone().map_err(|e| SnapshotError::Target {
                dir: shown(&self.dir),
                detail: format!("dup: {e}"),
            })
        };
        Ok(SnapshotWriter {
            state: dup(&w.state)?,
            memory: dup(&w.memory)?,
            overlays: w
                .overlays
                .iter()
                .map(|(i, f)| Ok((*i, dup(f)?)))
                .collect::<Result<_, SnapshotError>>()?,
        })
    }

    /// Makes the written snapshot visible: renames every file to its final name (`vmstate`
    /// last) and syncs the directory.
    pub fn commit(mut self) -> Result<(), SnapshotError> {
        let err = |detail: String| SnapshotError::Target {
            dir: shown(&self.dir),
            detail,
        };
        self.writer = None;
        for (tmp, fin) in &self.names {
            std::fs::rename(tmp, fin).map_err(|e| err(format!("rename: {e}")))?;
        }
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| err(format!("sync: {e}")))?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for SnapshotFiles {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        for (tmp, fin) in &self.names {
            let _ = std::fs::remove_file(tmp);
            let _ = std::fs::remove_file(fin);
        }
        if self.created_dir {
            let _ = std::fs::remove_dir(&self.dir);
        }
    }
}

/// A snapshot opened for restore: state parsed and checked, files open read-only.
#[derive(Debug)]
pub struct LoadedSnapshot {
    pub dir: PathBuf,
    pub version: Version,
    pub state: MicrovmState,
    /// The memory file, read-only.
    pub memory: File,
    /// `(virtio device index, overlay copy)`, read-only.
    pub overlays: Vec<(usize, File)>,
}

impl LoadedSnapshot {
    /// Opens and checks the snapshot in `dir`. Nothing in it is written.
    pub fn open(dir: &Path) -> Result<Self, SnapshotError> {
        let d = shown(dir);
        let not = |detail: &str| SnapshotError::NotASnapshot {
            dir: d.clone(),
            detail: detail.to_string(),
        };
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(not("not a directory")),
            Err(e) => return Err(not(&e.to_string())),
        }
        let file_err = |file: &str| {
            let (dir, file) = (d.clone(), file.to_string());
            move |source| SnapshotError::File { dir, file, source }
        };
        let mut f = match File::open(dir.join(STATE_FILE)) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(not("it has no vmstate file"))
            }
            Err(e) => return Err(file_err(STATE_FILE)(e)),
        };
        let len = f.metadata().map_err(file_err(STATE_FILE))?.len();
        if len > format::HEADER_LEN as u64 + format::MAX_PAYLOAD {
            return Err(SnapshotError::Format {
                dir: d,
                source: FormatError::TooLarge(len),
            });
        }
        let mut bytes = Vec::with_capacity(len as usize);
        f.read_to_end(&mut bytes).map_err(file_err(STATE_FILE))?;
        let (version, payload) = format::decode(&bytes).map_err(|source| {
            if source == FormatError::Magic {
                not("its vmstate file is not a microvirt snapshot state file")
            } else {
                SnapshotError::Format {
                    dir: d.clone(),
                    source,
                }
            }
        })?;
        let state: MicrovmState =
            serde_json::from_slice(payload).map_err(|e| SnapshotError::Payload {
                dir: d.clone(),
                detail: e.to_string(),
            })?;
        check_consistent(&state).map_err(|detail| SnapshotError::Inconsistent {
            dir: d.clone(),
            detail,
        })?;
        let memory = File::open(dir.join(MEMORY_FILE)).map_err(file_err(MEMORY_FILE))?;
        let expected: u64 = state.machine.memory_regions.iter().map(|r| r.1).sum();
        let actual = memory.metadata().map_err(file_err(MEMORY_FILE))?.len();
        if actual != expected {
            return Err(SnapshotError::MemorySize {
                dir: d,
                expected,
                actual,
            });
        }
        let mut overlays = Vec::new();
        for (i, dev) in state.devices.virtio.iter().enumerate() {
            if let crate::device_manager::persist::DeviceState::Block(b) = &dev.device {
                if let Some(name) = &b.overlay_file {
                    // A plain name inside the directory (an empty one would open the
                    // directory itself).
                    if name.is_empty() || name.contains('/') || name.starts_with('.') {
                        return Err(SnapshotError::Inconsistent {
                            dir: d,
                            detail: format!("overlay file name {name:?}"),
                        });
                    }
                    let f = File::open(dir.join(name)).map_err(file_err(name))?;
                    overlays.push((i, f));
                }
            }
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            version,
            state,
            memory,
            overlays,
        })
    }

    pub fn overlay(&self, device: usize) -> Option<&File> {
        self.overlays
            .iter()
            .find(|(i, _)| *i == device)
            .map(|(_, f)| f)
    }
}

/// Checks that the payload describes a machine this VMM can build.
fn check_consistent(s: &MicrovmState) -> Result<(), String> {
    let m = &s.machine;
    if m.vcpus == 0
        || m.vcpus > crate::arch::x86_64::layout::MAX_VCPUS
        || s.vcpus.len() != usize::from(m.vcpus)
    {
        return Err(format!(
            "{} vCPU states for {} vCPUs",
            s.vcpus.len(),
            m.vcpus
        ));
    }
    for (i, v) in s.vcpus.iter().enumerate() {
        if usize::from(v.id) != i {
            return Err(format!("vCPU state {i} has id {}", v.id));
        }
    }
    let expected = crate::arch::x86_64::boot::memory_regions(m.mem_mib << 20);
    let same = expected.len() == m.memory_regions.len()
        && expected
            .iter()
            .zip(&m.memory_regions)
            .all(|(e, r)| e.0 .0 == r.0 && e.1 as u64 == r.1);
    if !same || !(crate::config::MIN_MEM_MIB..=crate::config::MAX_MEM_MIB).contains(&m.mem_mib) {
        return Err(format!(
            "memory regions {:x?} do not match {} MiB of RAM",
            m.memory_regions, m.mem_mib
        ));
    }
    Ok(())
}

/// Writes the state file (header + payload) through `out`; returns its size.
pub fn write_state(out: &mut File, state: &MicrovmState) -> io::Result<u64> {
    let payload = serde_json::to_vec(state).map_err(io::Error::other)?;
    let bytes = format::encode(&payload);
    out.write_all(&bytes)?;
    Ok(bytes.len() as u64)
}

/// Takes a snapshot of the VM behind `controller` into `dir` (see the module docs). Runs on
/// the calling thread, which must be allowed to create files; the VM is paused while the
/// snapshot is written and left paused (`resume` continues it). Any error leaves `dir` as it
/// was and the VM in the state it had.
pub fn create(controller: &crate::VmmController, dir: &Path) -> Result<SnapshotSummary, String> {
    let files =
        SnapshotFiles::create(dir, controller.overlay_devices()).map_err(|e| e.to_string())?;
    let writer = files.writer().map_err(|e| e.to_string())?;
    let summary = controller.snapshot(writer)?;
    if let Err(e) = files.commit() {
        if summary.was_running {
            // The VM ran before: a failed snapshot leaves it running.
            let _ = controller.request(crate::Action::Resume);
        }
        return Err(e.to_string());
    }
    Ok(summary)
}
