//! virtio-blk: raw image files, read-only disks, FLUSH, GET_ID, DISCARD,
//! WRITE_ZEROES, a copy-on-write overlay mode and read-only qcow2 images (overlay bases and
//! `ro` disks).
//!
//! - `request.rs`: pure request parsing/processing over descriptor chains.
//! - `disk.rs`: backends (raw file or block device, in-memory); `overlay.rs`: copy-on-write;
//!   `qcow2/`: the read-only qcow2 reader.
//! - `device.rs`: the [`VirtioDevice`](super::VirtioDevice) (features,
//!   config space, activation, submitting and completing requests);
//!   `io_thread.rs`: the per-disk thread that does the blocking disk I/O;
//!   `event_handler.rs`: event-loop glue.

pub mod device;
pub mod disk;
pub mod event_handler;
pub mod io_thread;
pub mod open;
pub mod overlay;
pub mod persist;
pub mod qcow2;
pub mod request;

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub use device::{BlockDevice, IoThreadOptions};
pub use disk::DiskError;

/// Maximum serial length (virtio-blk GET_ID returns 20 bytes).
pub const MAX_ID_BYTES: usize = request::VIRTIO_BLK_ID_BYTES;

/// One `--disk` / JSON `disks[]` entry.
///
/// CLI syntax: `path=IMG[,ro][,id=SERIAL][,overlay=PATH]`.
/// JSON: `{"path": "IMG", "ro": false, "id": "SERIAL", "overlay": "PATH"}`
/// (only `path` is required; unknown keys are refused).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawBlockConfig", into = "RawBlockConfig")]
pub struct BlockConfig {
    /// Disk image (with `overlay`, the read-only base image): raw, or qcow2 when it starts with
    /// the qcow2 magic number and is read-only (`ro`) or an overlay's base.
    pub path: PathBuf,
    /// Guest cannot write; the image is opened `O_RDONLY`.
    pub read_only: bool,
    /// Serial returned by GET_ID (at most 20 bytes).
    pub id: Option<String>,
    /// Copy-on-write overlay file (created if missing); `path` is never written.
    pub overlay: Option<PathBuf>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBlockConfig {
    path: PathBuf,
    #[serde(default)]
    ro: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    overlay: Option<PathBuf>,
}

impl TryFrom<RawBlockConfig> for BlockConfig {
    type Error = BlockConfigError;
    fn try_from(r: RawBlockConfig) -> Result<Self, Self::Error> {
        let c = BlockConfig {
            path: r.path,
            read_only: r.ro,
            id: r.id,
            overlay: r.overlay,
        };
        c.validate()?;
        Ok(c)
    }
}

impl From<BlockConfig> for RawBlockConfig {
    fn from(c: BlockConfig) -> Self {
        RawBlockConfig {
            path: c.path,
            ro: c.read_only,
            id: c.id,
            overlay: c.overlay,
        }
    }
}

/// Invalid disk configuration.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BlockConfigError {
    #[error("disk: missing path= (syntax: path=IMG[,ro][,id=SERIAL][,overlay=PATH])")]
    MissingPath,
    #[error("disk: unknown key {0:?} (known: path, ro, id, overlay)")]
    UnknownKey(String),
    #[error("disk: key {0:?} given twice")]
    Duplicate(String),
    #[error("disk: key {0:?} needs a value ({0}=...)")]
    EmptyValue(String),
    #[error("disk: `ro` takes no value (got ro={0:?})")]
    RoValue(String),
    #[error("disk: id {0:?} is {1} bytes, at most 20 allowed")]
    IdTooLong(String, usize),
    #[error("disk: `ro` and `overlay=` exclude each other (an overlay disk is writable)")]
    RoWithOverlay,
    #[error("disk: overlay path is the image path")]
    OverlayIsBase,
}

impl BlockConfig {
    /// A writable disk without serial or overlay.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            read_only: false,
            id: None,
            overlay: None,
        }
    }

    /// Check the rules the parser and JSON loader enforce.
    pub fn validate(&self) -> Result<(), BlockConfigError> {
        if self.path.as_os_str().is_empty() {
            return Err(BlockConfigError::MissingPath);
        }
        if let Some(id) = &self.id {
            if id.len() > MAX_ID_BYTES {
                return Err(BlockConfigError::IdTooLong(id.clone(), id.len()));
            }
        }
        if let Some(o) = &self.overlay {
            if self.read_only {
                return Err(BlockConfigError::RoWithOverlay);
            }
            if o.as_os_str().is_empty() {
                return Err(BlockConfigError::EmptyValue("overlay".into()));
            }
            if *o == self.path {
                return Err(BlockConfigError::OverlayIsBase);
            }
        }
        Ok(())
    }

    /// The GET_ID answer: the serial zero-padded to 20 bytes.
    pub fn id_bytes(&self) -> [u8; MAX_ID_BYTES] {
        let mut b = [0u8; MAX_ID_BYTES];
        if let Some(id) = &self.id {
            let n = id.len().min(MAX_ID_BYTES);
            b[..n].copy_from_slice(&id.as_bytes()[..n]);
        }
        b
    }
}

impl FromStr for BlockConfig {
    type Err = BlockConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (mut path, mut ro, mut id, mut overlay) = (None, false, None, None);
        let mut seen = std::collections::HashSet::new();
        for item in s.split(',') {
            let (key, val) = match item.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (item, None),
            };
            if key.is_empty() && val.is_none() {
                continue; // tolerate "a,,b" and a trailing comma
            }
            if !seen.insert(key.to_string()) {
                return Err(BlockConfigError::Duplicate(key.into()));
            }
            let need = |v: Option<&str>| match v {
                Some(v) if !v.is_empty() => Ok(v.to_string()),
                _ => Err(BlockConfigError::EmptyValue(key.into())),
            };
            match key {
                "path" => path = Some(PathBuf::from(need(val)?)),
                "ro" => match val {
                    None => ro = true,
                    Some(v) => return Err(BlockConfigError::RoValue(v.into())),
                },
                "id" => id = Some(need(val)?),
                "overlay" => overlay = Some(PathBuf::from(need(val)?)),
                k => return Err(BlockConfigError::UnknownKey(k.into())),
            }
        }
        let c = BlockConfig {
            path: path.ok_or(BlockConfigError::MissingPath)?,
            read_only: ro,
            id,
            overlay,
        };
        c.validate()?;
        Ok(c)
    }
}

impl fmt::Display for BlockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "path={}", self.path.display())?;
        if self.read_only {
            write!(f, ",ro")?;
        }
        if let Some(id) = &self.id {
            write!(f, ",id={id}")?;
        }
        if let Some(o) = &self.overlay {
            write!(f, ",overlay={}", o.display())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cli_syntax() {
        let c: BlockConfig = "path=/img/a.raw,ro,id=serial-1".parse().unwrap();
        assert_eq!(
            c,
            BlockConfig {
                path: "/img/a.raw".into(),
                read_only: true,
                id: Some("serial-1".into()),
                overlay: None
            }
        );
        let c: BlockConfig = "path=/b,overlay=/run/b.ovl".parse().unwrap();
        assert_eq!(
            c.overlay.as_deref(),
            Some(std::path::Path::new("/run/b.ovl"))
        );
        assert!(!c.read_only);
        assert_eq!(c.to_string().parse::<BlockConfig>().unwrap(), c);
        let c: BlockConfig = "path=/x,id=abcdefghijklmnopqrst".parse().unwrap();
        assert_eq!(&c.id_bytes(), b"abcdefghijklmnopqrst");
        assert_eq!(&BlockConfig::new("/x").id_bytes(), &[0u8; 20]);
    }

    #[test]
    fn clear_errors_for_bad_cli_input() {
        use BlockConfigError::*;
        let e = |s: &str| s.parse::<BlockConfig>().unwrap_err();
        assert_eq!(e("ro,id=x"), MissingPath);
        assert_eq!(e(""), MissingPath);
        assert_eq!(e("path="), EmptyValue("path".into()));
        assert_eq!(e("path=/a,size=3"), UnknownKey("size".into()));
        assert_eq!(e("path=/a,readonly"), UnknownKey("readonly".into()));
        assert_eq!(e("path=/a,path=/b"), Duplicate("path".into()));
        assert_eq!(e("path=/a,ro=yes"), RoValue("yes".into()));
        assert_eq!(
            e("path=/a,id=abcdefghijklmnopqrstu"),
            IdTooLong("abcdefghijklmnopqrstu".into(), 21)
        );
        assert_eq!(e("path=/a,ro,overlay=/o"), RoWithOverlay);
        assert_eq!(e("path=/a,overlay=/a"), OverlayIsBase);
        assert_eq!(e("path=/a,id="), EmptyValue("id".into()));
        assert!(e("path=/a,bogus")
            .to_string()
            .contains("unknown key \"bogus\""));
    }

    #[test]
    fn json_round_trip_and_errors() {
        let c: BlockConfig = serde_json::from_str(r#"{"path":"/a","ro":true,"id":"x"}"#).unwrap();
        assert_eq!(c, "path=/a,ro,id=x".parse().unwrap());
        let back: BlockConfig = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        let c: BlockConfig = serde_json::from_str(r#"{"path":"/a"}"#).unwrap();
        assert_eq!(c, BlockConfig::new("/a"));
        let err = |j: &str| {
            serde_json::from_str::<BlockConfig>(j)
                .unwrap_err()
                .to_string()
        };
        assert!(err(r#"{"path":"/a","size":1}"#).contains("unknown field `size`"));
        assert!(err(r#"{"ro":true}"#).contains("missing field `path`"));
        assert!(err(r#"{"path":"/a","id":"abcdefghijklmnopqrstuvwxyz"}"#).contains("at most 20"));
        assert!(err(r#"{"path":"/a","ro":true,"overlay":"/o"}"#).contains("exclude"));
    }
}
