//! cloud-init NoCloud seed disk: a small VFAT (FAT12 + long file names) image labelled
//! `CIDATA` holding `user-data`, `meta-data` and optionally `network-config`, written
//! entirely in Rust (no mkfs/genisoimage at run time).
//!
//! Layout: 512-byte sectors, 1 reserved (boot) sector, two FATs, a 64-entry root directory,
//! then the data clusters. The cluster count is kept between 2000 and 4084 so every reader
//! (Linux `vfat`, blkid) sees FAT12; larger content gets larger clusters.

use std::path::Path;

use base64::Engine;

use crate::vmi::CloudInitNoCloud;

const SECTOR: usize = 512;
const ROOT_ENTRIES: usize = 64;
const ROOT_SECTORS: usize = ROOT_ENTRIES * 32 / SECTOR;
const FATS: usize = 2;
const MIN_CLUSTERS: usize = 2000;
/// FAT12 holds fewer than 4085 clusters.
const MAX_CLUSTERS: usize = 4084;
const LABEL: &[u8; 11] = b"CIDATA     ";
/// Fixed timestamp (2024-01-01 00:00:00) so identical input gives an identical image.
const FAT_DATE: u16 = ((2024 - 1980) << 9) | (1 << 5) | 1;
const ATTR_ARCHIVE: u8 = 0x20;
const ATTR_VOLUME_ID: u8 = 0x08;
const ATTR_LFN: u8 = 0x0f;
const EOC: u16 = 0xfff;

#[derive(Debug, thiserror::Error)]
pub enum CloudInitError {
    #[error("cloud-init data too large for the seed image ({0} bytes)")]
    TooLarge(usize),
    #[error("cloud-init: too many files")]
    TooManyFiles,
    #[error("cloud-init file name {0:?} is not 1-255 ASCII characters")]
    BadName(String),
    #[error("cloudInitNoCloud.{field} is not valid base64: {detail}")]
    Base64 { field: &'static str, detail: String },
    #[error("cloudInitNoCloud.networkDataBase64 is not UTF-8 text")]
    NetworkDataText,
    #[error("writing the cloud-init image {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}

/// The files of a NoCloud seed, from the VMI's `cloudInitNoCloud` volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoCloudSeed {
    pub user_data: Vec<u8>,
    pub meta_data: String,
    pub network_config: Option<String>,
}

impl NoCloudSeed {
    /// `meta-data` gets `instance-id` (`firmware.uuid`, else the VMI's uid, else its name) and `local-hostname`
    /// (the VMI's name); `network-config` is `networkData` when given.
    pub fn from_volume(
        src: &CloudInitNoCloud,
        instance_id: &str,
        hostname: &str,
    ) -> Result<Self, CloudInitError> {
        let decode = |field: &'static str, b: &str| {
            base64::engine::general_purpose::STANDARD
                .decode(b.trim())
                .map_err(|e| CloudInitError::Base64 {
                    field,
                    detail: e.to_string(),
                })
        };
        let user_data = match (&src.user_data, &src.user_data_base64) {
            (Some(t), _) => t.clone().into_bytes(),
            (None, Some(b)) => decode("userDataBase64", b)?,
            (None, None) => Vec::new(),
        };
        let network_config = match (&src.network_data, &src.network_data_base64) {
            (Some(t), _) => Some(t.clone()),
            (None, Some(b)) => Some(
                String::from_utf8(decode("networkDataBase64", b)?)
                    .map_err(|_| CloudInitError::NetworkDataText)?,
            ),
            (None, None) => None,
        };
        let meta_data = format!(
            "instance-id: {}\nlocal-hostname: {}\n",
            yaml_scalar(instance_id),
            yaml_scalar(hostname)
        );
        Ok(Self {
            user_data,
            meta_data,
            network_config,
        })
    }

    pub fn files(&self) -> Vec<(&str, &[u8])> {
        let mut f: Vec<(&str, &[u8])> = vec![
            ("meta-data", self.meta_data.as_bytes()),
            ("user-data", &self.user_data),
        ];
        if let Some(n) = &self.network_config {
            f.push(("network-config", n.as_bytes()));
        }
        f
    }

    /// Writes the seed image to `path`.
    pub fn write_image(&self, path: &Path) -> Result<(), CloudInitError> {
        let img = build_vfat(&self.files())?;
        std::fs::write(path, img).map_err(|source| CloudInitError::Write {
            path: path.display().to_string(),
            source,
        })
    }

    /// Writes the image into an open (empty) file.
    pub fn write_to(&self, f: &mut std::fs::File) -> Result<(), CloudInitError> {
        use std::io::Write;
        let img = build_vfat(&self.files())?;
        f.write_all(&img).map_err(|source| CloudInitError::Write {
            path: "the cloud-init image".into(),
            source,
        })
    }
}

/// Quotes a YAML scalar when it could be misread (names and uids normally need no quoting).
fn yaml_scalar(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
    if plain {
        s.to_string()
    } else {
        serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
    }
}

fn set_fat12(fat: &mut [u8], cluster: usize, value: u16) {
    let off = cluster * 3 / 2;
    if cluster & 1 == 0 {
        fat[off] = value as u8;
        fat[off + 1] = (fat[off + 1] & 0xf0) | ((value >> 8) as u8 & 0x0f);
    } else {
        fat[off] = (fat[off] & 0x0f) | ((value << 4) as u8 & 0xf0);
        fat[off + 1] = (value >> 4) as u8;
    }
}

/// Checksum of an 8.3 name, stored in each of its long-name entries.
pub fn lfn_checksum(short: &[u8; 11]) -> u8 {
    short
        .iter()
        .fold(0u8, |sum, &b| sum.rotate_right(1).wrapping_add(b))
}

/// An 8.3 alias such as `USER-D~1` for a long name (`n` makes it unique).
fn short_alias(name: &str, n: usize) -> [u8; 11] {
    let mut out = [b' '; 11];
    let tail = format!("~{n}");
    let base: Vec<u8> = name
        .bytes()
        .filter(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_')
        .map(|b| b.to_ascii_uppercase())
        .take(8 - tail.len())
        .collect();
    out[..base.len()].copy_from_slice(&base);
    out[base.len()..base.len() + tail.len()].copy_from_slice(tail.as_bytes());
    out
}

fn dir_entry(name: &[u8; 11], attr: u8, cluster: u16, size: u32) -> [u8; 32] {
    let mut e = [0u8; 32];
    e[..11].copy_from_slice(name);
    e[11] = attr;
    for off in [16, 18, 24] {
        e[off..off + 2].copy_from_slice(&FAT_DATE.to_le_bytes());
    }
    e[26..28].copy_from_slice(&cluster.to_le_bytes());
    e[28..32].copy_from_slice(&size.to_le_bytes());
    e
}

/// Long-name entries for `name`, in on-disk order (last part first).
fn lfn_entries(name: &str, checksum: u8) -> Vec<[u8; 32]> {
    let units: Vec<u16> = name.encode_utf16().collect();
    let parts = units.len().div_ceil(13);
    let mut out = Vec::with_capacity(parts);
    for p in (0..parts).rev() {
        let mut chars = [0xffffu16; 13];
        for (i, c) in chars.iter_mut().enumerate() {
            let k = p * 13 + i;
            if k < units.len() {
                *c = units[k];
            } else if k == units.len() {
                *c = 0;
            }
        }
        let mut e = [0u8; 32];
        e[0] = (p as u8 + 1) | if p + 1 == parts { 0x40 } else { 0 };
        e[11] = ATTR_LFN;
        e[13] = checksum;
        let slots = (1..11)
            .step_by(2)
            .chain((14..26).step_by(2))
            .chain((28..32).step_by(2));
        for (slot, c) in slots.zip(chars) {
            e[slot..slot + 2].copy_from_slice(&c.to_le_bytes());
        }
        out.push(e);
    }
    out
}

/// Builds a FAT12 image with long file names holding `files` in its root directory.
pub fn build_vfat(files: &[(&str, &[u8])]) -> Result<Vec<u8>, CloudInitError> {
    for (name, _) in files {
        if name.is_empty() || name.len() > 255 || !name.is_ascii() {
            return Err(CloudInitError::BadName(name.to_string()));
        }
    }
    let total: usize = files.iter().map(|(_, d)| d.len()).sum();
    // Cluster size: the smallest power-of-two sectors per cluster that fits the data.
    let mut spc = 1usize;
    let needed = |spc: usize| -> usize {
        files
            .iter()
            .map(|(_, d)| d.len().div_ceil(SECTOR * spc))
            .sum()
    };
    while needed(spc) > MAX_CLUSTERS {
        spc *= 2;
        if spc > 64 {
            return Err(CloudInitError::TooLarge(total));
        }
    }
    let clusters = needed(spc).max(MIN_CLUSTERS);
    let fat_sectors = ((clusters + 2) * 3 / 2 + 1).div_ceil(SECTOR);
    let data_start = 1 + FATS * fat_sectors + ROOT_SECTORS;
    let total_sectors = data_start + clusters * spc;
    let total_sectors16 =
        u16::try_from(total_sectors).map_err(|_| CloudInitError::TooLarge(total))?;
    let mut img = vec![0u8; total_sectors * SECTOR];

    // Boot sector with the BIOS parameter block.
    let b = &mut img[..SECTOR];
    b[..3].copy_from_slice(&[0xeb, 0x3c, 0x90]);
    b[3..11].copy_from_slice(b"MICROVRT");
    b[11..13].copy_from_slice(&(SECTOR as u16).to_le_bytes());
    b[13] = spc as u8;
    b[14..16].copy_from_slice(&1u16.to_le_bytes());
    b[16] = FATS as u8;
    b[17..19].copy_from_slice(&(ROOT_ENTRIES as u16).to_le_bytes());
    b[19..21].copy_from_slice(&total_sectors16.to_le_bytes());
    b[21] = 0xf8;
    b[22..24].copy_from_slice(&(fat_sectors as u16).to_le_bytes());
    b[24..26].copy_from_slice(&32u16.to_le_bytes());
    b[26..28].copy_from_slice(&64u16.to_le_bytes());
    b[36] = 0x80;
    b[38] = 0x29;
    b[39..43].copy_from_slice(&0x4349_4441u32.to_le_bytes());
    b[43..54].copy_from_slice(LABEL);
    b[54..62].copy_from_slice(b"FAT12   ");
    b[510] = 0x55;
    b[511] = 0xaa;

    let mut fat = vec![0u8; fat_sectors * SECTOR];
    set_fat12(&mut fat, 0, 0xff8);
    set_fat12(&mut fat, 1, EOC);
    let mut root: Vec<[u8; 32]> = vec![dir_entry(LABEL, ATTR_VOLUME_ID, 0, 0)];
    let mut next = 2usize;
    for (i, (name, data)) in files.iter().enumerate() {
        let n = data.len().div_ceil(SECTOR * spc);
        let first = if n == 0 { 0 } else { next };
        for k in 0..n {
            let c = next + k;
            set_fat12(&mut fat, c, if k + 1 == n { EOC } else { (c + 1) as u16 });
            let off = (data_start + (c - 2) * spc) * SECTOR;
            let chunk = &data[k * SECTOR * spc..data.len().min((k + 1) * SECTOR * spc)];
            img[off..off + chunk.len()].copy_from_slice(chunk);
        }
        next += n;
        let short = short_alias(name, i + 1);
        root.extend(lfn_entries(name, lfn_checksum(&short)));
        root.push(dir_entry(
            &short,
            ATTR_ARCHIVE,
            first as u16,
            data.len() as u32,
        ));
    }
    if root.len() > ROOT_ENTRIES {
        return Err(CloudInitError::TooManyFiles);
    }
    for f in 0..FATS {
        let off = (1 + f * fat_sectors) * SECTOR;
        img[off..off + fat.len()].copy_from_slice(&fat);
    }
    let root_off = (1 + FATS * fat_sectors) * SECTOR;
    for (i, e) in root.iter().enumerate() {
        img[root_off + i * 32..root_off + (i + 1) * 32].copy_from_slice(e);
    }
    Ok(img)
}

/// A minimal FAT12 reader for tests: the volume label and the root directory's files by
/// long name. Written independently of the writer's helpers (own parsing of every field).
#[cfg(test)]
pub(crate) mod reader {
    use std::collections::BTreeMap;

    fn u16_at(b: &[u8], o: usize) -> usize {
        usize::from(u16::from_le_bytes([b[o], b[o + 1]]))
    }

    pub struct Fat {
        pub label: String,
        pub files: BTreeMap<String, Vec<u8>>,
        pub clusters: usize,
    }

    pub fn read(img: &[u8]) -> Fat {
        assert_eq!(&img[510..512], &[0x55, 0xaa], "boot signature");
        let bps = u16_at(img, 11);
        let spc = usize::from(img[13]);
        let reserved = u16_at(img, 14);
        let nfats = usize::from(img[16]);
        let root_entries = u16_at(img, 17);
        let total = u16_at(img, 19);
        let fat_sz = u16_at(img, 22);
        assert_eq!(total * bps, img.len(), "image size matches the BPB");
        let root_start = (reserved + nfats * fat_sz) * bps;
        let root_secs = (root_entries * 32).div_ceil(bps);
        let data_start = root_start + root_secs * bps;
        let clusters = (total - data_start / bps) / spc;
        assert!(clusters < 4085, "FAT12 by cluster count");
        let fat = &img[reserved * bps..(reserved + fat_sz) * bps];
        for k in 1..nfats {
            let copy = &img[(reserved + k * fat_sz) * bps..(reserved + (k + 1) * fat_sz) * bps];
            assert_eq!(fat, copy, "FAT copies agree");
        }
        let entry = |c: usize| -> usize {
            let v = u16_at(fat, c * 3 / 2);
            if c & 1 == 1 {
                v >> 4
            } else {
                v & 0xfff
            }
        };
        let mut label = String::new();
        let mut files = BTreeMap::new();
        let mut lfn: Vec<(u8, String)> = Vec::new();
        for i in 0..root_entries {
            let e = &img[root_start + i * 32..root_start + i * 32 + 32];
            if e[0] == 0 {
                break;
            }
            if e[11] == 0x0f {
                let mut units = Vec::new();
                for o in (1..11)
                    .step_by(2)
                    .chain((14..26).step_by(2))
                    .chain((28..32).step_by(2))
                {
                    let u = u16::from_le_bytes([e[o], e[o + 1]]);
                    if u == 0 || u == 0xffff {
                        break;
                    }
                    units.push(u);
                }
                lfn.push((e[0] & 0x1f, String::from_utf16(&units).expect("utf16")));
                continue;
            }
            if e[11] & 0x08 != 0 {
                label = String::from_utf8_lossy(&e[..11]).trim_end().to_string();
                continue;
            }
            lfn.sort_by_key(|(n, _)| *n);
            let name: String = lfn.drain(..).map(|(_, s)| s).collect();
            let size = u32::from_le_bytes([e[28], e[29], e[30], e[31]]) as usize;
            let mut c = u16_at(e, 26);
            let mut data = Vec::new();
            while (2..0xff8).contains(&c) && data.len() < size {
                let off = data_start + (c - 2) * spc * bps;
                data.extend_from_slice(&img[off..off + spc * bps]);
                c = entry(c);
            }
            data.truncate(size);
            assert_eq!(data.len(), size, "chain of {name} holds its size");
            files.insert(name, data);
        }
        Fat {
            label,
            files,
            clusters,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_round_trip() {
        let src = CloudInitNoCloud {
            user_data: Some("#cloud-config\nhostname: demo\n".into()),
            user_data_base64: None,
            network_data: Some("version: 2\n".into()),
            ..Default::default()
        };
        let seed = NoCloudSeed::from_volume(&src, "uid-1", "demo").unwrap();
        let img = build_vfat(&seed.files()).unwrap();
        let fat = reader::read(&img);
        assert_eq!(fat.label, "CIDATA");
        assert_eq!(fat.files.len(), 3);
        assert_eq!(fat.files["user-data"], b"#cloud-config\nhostname: demo\n");
        assert_eq!(
            fat.files["meta-data"],
            b"instance-id: uid-1\nlocal-hostname: demo\n"
        );
        assert_eq!(fat.files["network-config"], b"version: 2\n");
        assert!((2000..4085).contains(&fat.clusters));
    }

    #[test]
    fn multi_cluster_files_and_big_content() {
        let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let small = vec![7u8; 1300];
        let img = build_vfat(&[
            ("a-long-file-name-here.txt", &small),
            ("big", &big),
            ("empty", &[]),
        ])
        .unwrap();
        let fat = reader::read(&img);
        assert_eq!(fat.files["a-long-file-name-here.txt"], small);
        assert_eq!(fat.files["big"], big);
        assert_eq!(fat.files["empty"], b"");
        assert!(build_vfat(&[("x", &vec![0u8; 200 << 20])]).is_err());
        assert!(build_vfat(&[("", b"")]).is_err());
    }

    #[test]
    fn base64_and_quoting() {
        let src = CloudInitNoCloud {
            user_data: None,
            user_data_base64: Some("aGVsbG8=".into()),
            network_data: None,
            ..Default::default()
        };
        let seed = NoCloudSeed::from_volume(&src, "a b", "h").unwrap();
        assert_eq!(seed.user_data, b"hello");
        assert!(seed.meta_data.contains("instance-id: \"a b\""));
        assert_eq!(seed.files().len(), 2);
        let bad = CloudInitNoCloud {
            user_data_base64: Some("!!".into()),
            ..Default::default()
        };
        assert!(NoCloudSeed::from_volume(&bad, "i", "h").is_err());
        // networkDataBase64 (KubeVirt's field) becomes network-config; it must be text.
        let net = CloudInitNoCloud {
            network_data_base64: Some("dmVyc2lvbjogMgo=".into()),
            ..Default::default()
        };
        let seed = NoCloudSeed::from_volume(&net, "i", "h").unwrap();
        assert_eq!(seed.network_config.as_deref(), Some("version: 2\n"));
        assert_eq!(seed.files().len(), 3);
        let not_text = CloudInitNoCloud {
            network_data_base64: Some("/w==".into()),
            ..Default::default()
        };
        let e = NoCloudSeed::from_volume(&not_text, "i", "h").unwrap_err();
        assert!(e.to_string().contains("not UTF-8"), "{e}");
        let not_b64 = CloudInitNoCloud {
            network_data_base64: Some("%%".into()),
            ..Default::default()
        };
        let e = NoCloudSeed::from_volume(&not_b64, "i", "h").unwrap_err();
        assert!(e.to_string().contains("networkDataBase64"), "{e}");
    }

    #[test]
    fn checksum_known_value() {
        // Computed by hand from the rotate-right-and-add definition for "USER-D~1   ".
        let mut s = 0u8;
        for &b in b"USER-D~1   " {
            s = (if s & 1 == 1 { 0x80u8 } else { 0 })
                .wrapping_add(s >> 1)
                .wrapping_add(b);
        }
        assert_eq!(lfn_checksum(b"USER-D~1   "), s);
    }
}
