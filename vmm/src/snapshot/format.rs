//! The state file's container: a fixed header, then the serde payload.
//!
//! ```text
//! offset  size  field
//!      0     8  magic "MVSNAPST"
//!      8     2  format major (little endian)   a reader refuses any other major
//!     10     2  format minor                    minors only add optional fields
//!     12     4  reserved, 0
//!     16     8  payload length in bytes
//!     24     8  CRC-64/XZ of the payload
//!     32     …  payload: UTF-8 JSON (see `state.rs`)
//! ```
//!
//! The file is exactly `32 + payload length` bytes; anything shorter is truncated, anything
//! longer is refused too.

use std::fmt;

pub const MAGIC: &[u8; 8] = b"MVSNAPST";
pub const FORMAT_MAJOR: u16 = 1;
/// 1.1 added `machine.acpi` and `acpi_pm` (optional); 1.2 `machine.vmgenid` (optional).
pub const FORMAT_MINOR: u16 = 2;
pub const HEADER_LEN: usize = 32;
/// A state file larger than this is not ours (the payload is tens of KiB).
pub const MAX_PAYLOAD: u64 = 64 << 20;

/// A format version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Version {
    pub major: u16,
    pub minor: u16,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

pub const CURRENT: Version = Version {
    major: FORMAT_MAJOR,
    minor: FORMAT_MINOR,
};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FormatError {
    #[error("not a microvirt snapshot state file (bad magic)")]
    Magic,
    #[error("state file is truncated ({have} of {need} bytes)")]
    Truncated { have: u64, need: u64 },
    #[error("state file has {0} bytes of trailing data")]
    Trailing(u64),
    #[error(
        "snapshot format {found} is not supported (this VMM reads {}.x)",
        FORMAT_MAJOR
    )]
    Version { found: Version },
    #[error("state file payload of {0} bytes is implausibly large")]
    TooLarge(u64),
    #[error("state file checksum mismatch (stored {stored:016x}, computed {computed:016x}): the file is corrupt")]
    Checksum { stored: u64, computed: u64 },
}

/// Header plus payload, ready to be written.
pub fn encode(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_MAJOR.to_le_bytes());
    out.extend_from_slice(&FORMAT_MINOR.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc64(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}

/// Checks the header, length, version and checksum; returns the version and the payload.
pub fn decode(file: &[u8]) -> Result<(Version, &[u8]), FormatError> {
    if file.len() < MAGIC.len() || &file[..MAGIC.len()] != MAGIC {
        return Err(FormatError::Magic);
    }
    if file.len() < HEADER_LEN {
        return Err(FormatError::Truncated {
            have: file.len() as u64,
            need: HEADER_LEN as u64,
        });
    }
    let version = Version {
        major: u16_at(file, 8),
        minor: u16_at(file, 10),
    };
    if version.major != FORMAT_MAJOR {
        return Err(FormatError::Version { found: version });
    }
    let len = u64_at(file, 16);
    if len > MAX_PAYLOAD {
        return Err(FormatError::TooLarge(len));
    }
    let need = HEADER_LEN as u64 + len;
    let have = file.len() as u64;
    if have < need {
        return Err(FormatError::Truncated { have, need });
    }
    if have > need {
        return Err(FormatError::Trailing(have - need));
    }
    let payload = &file[HEADER_LEN..];
    let stored = u64_at(file, 24);
    let computed = crc64(payload);
    if stored != computed {
        return Err(FormatError::Checksum { stored, computed });
    }
    Ok((version, payload))
}

/// CRC-64/XZ (ECMA-182 polynomial, reflected, init and xorout all ones).
pub fn crc64(data: &[u8]) -> u64 {
    const POLY: u64 = 0xc96c_5795_d787_0f42; // 0x42f0e1eba9ea3693 reflected
    static TABLE: std::sync::OnceLock<[u64; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = [0u64; 256];
        for (i, slot) in t.iter_mut().enumerate() {
            let mut c = i as u64;
            for _ in 0..8 {
                c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            }
            *slot = c;
        }
        t
    });
    let mut crc = !0u64;
    for &b in data {
        crc = table[((crc ^ u64::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc64_xz_check_value() {
        assert_eq!(crc64(b"123456789"), 0x995d_c9bb_df19_39fa);
        assert_eq!(crc64(b""), 0);
    }

    #[test]
    fn round_trip_and_every_kind_of_damage() {
        let f = encode(b"{\"a\":1}");
        assert_eq!(decode(&f).unwrap(), (CURRENT, &b"{\"a\":1}"[..]));
        assert_eq!(
            decode(b"hello world, not a snapshot"),
            Err(FormatError::Magic)
        );
        assert_eq!(decode(b""), Err(FormatError::Magic));
        assert!(matches!(
            decode(&f[..20]),
            Err(FormatError::Truncated { have: 20, need: 32 })
        ));
        assert!(matches!(
            decode(&f[..f.len() - 1]),
            Err(FormatError::Truncated { .. })
        ));
        let mut long = f.clone();
        long.push(0);
        assert_eq!(decode(&long), Err(FormatError::Trailing(1)));
        let mut bad = f.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert!(matches!(decode(&bad), Err(FormatError::Checksum { .. })));
        let mut v2 = f.clone();
        v2[8] = 2;
        let e = decode(&v2).unwrap_err();
        assert_eq!(
            e,
            FormatError::Version {
                found: Version {
                    major: 2,
                    minor: FORMAT_MINOR
                }
            }
        );
        assert_eq!(
            e.to_string(),
            format!("snapshot format 2.{FORMAT_MINOR} is not supported (this VMM reads 1.x)")
        );
        // A newer minor of the same major is read.
        let mut minor = f.clone();
        minor[10] = 7;
        assert_eq!(decode(&minor).unwrap().0, Version { major: 1, minor: 7 });
        let mut huge = f;
        huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(decode(&huge), Err(FormatError::TooLarge(_))));
    }
}
