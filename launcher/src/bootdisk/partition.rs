//! Partition tables of a boot disk: GPT (primary header and entry array, both CRC-checked) and
//! MBR (the four primary entries). Sectors are 512 bytes, as virtio-blk presents them.
//!
//! Everything read is untrusted: the entry array is read in one piece of at most
//! [`GPT_MAX_ARRAY`] bytes, entries are bounded by the disk and the header's usable range, and
//! nothing is sized by the input beyond those caps.

use super::source::Source;

pub const SECTOR: u64 = 512;
/// Largest GPT entry array read (the usual 128 entries of 128 bytes are 16 KiB).
pub const GPT_MAX_ARRAY: u64 = 1 << 20;
/// Most partitions kept (GPT allows more; a boot disk has a handful).
pub const MAX_PARTITIONS: usize = 128;

/// GPT partition type GUIDs (lower case, as the kernel and blkid print them).
pub const GPT_LINUX_ROOT_X86_64: &str = "4f68bce3-e8cd-4db1-96e7-fbcaf984b709";
pub const GPT_LINUX_FS: &str = "0fc63daf-8483-4772-8e79-3d69d8477de4";
pub const GPT_EFI_SYSTEM: &str = "c12a7328-f81f-11d2-ba4b-00a0c93ec93b";
pub const GPT_XBOOTLDR: &str = "bc13c2ff-59e6-4262-a352-b275fd6f7172";
pub const GPT_BIOS_BOOT: &str = "21686148-6449-6e6f-744e-656564454649";

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TableKind {
    /// GUID partition table; the disk GUID.
    Gpt { disk_guid: String },
    /// MBR; the 32-bit disk signature.
    Mbr { signature: u32 },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    /// 1-based, as Linux numbers them (`/dev/vda<number>`).
    pub number: u32,
    /// Byte offset and length on the disk.
    pub start: u64,
    pub len: u64,
    /// GPT: the type GUID; MBR: the type byte as two hex digits (`83`).
    pub type_id: String,
    /// GPT: the unique partition GUID (`PARTUUID=`); MBR: `<signature>-<number>` as Linux
    /// forms it (empty when the signature is 0).
    pub partuuid: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    pub kind: TableKind,
    pub partitions: Vec<Partition>,
}

impl Table {
    pub fn name(&self) -> &'static str {
        match self.kind {
            TableKind::Gpt { .. } => "GPT",
            TableKind::Mbr { .. } => "MBR",
        }
    }
}

/// What sector 0 (and 1) hold.
#[derive(Debug, PartialEq, Eq)]
pub enum Probe {
    /// A partition table that parsed.
    Table(Table),
    /// No partition table: sector 0 has no MBR signature, or is a file system's boot sector.
    None,
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn le64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// CRC-32 (IEEE 802.3, reflected, as GPT uses it).
pub fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xedb8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

/// A GUID's 16 on-disk bytes (first three fields little-endian) in the usual text form.
pub fn guid(b: &[u8]) -> String {
    format!(
        "{:08x}-{:04x}-{:04x}-{:02x}{:02x}-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
        le32(b, 0),
        le16(b, 4),
        le16(b, 6),
        b[8],
        b[9],
        b[10],
        b[11],
        b[12],
        b[13],
        b[14],
        b[15]
    )
}

/// Whether sector 0 is a FAT or NTFS boot sector (an unpartitioned file system whose boot
/// code would otherwise read as partition entries).
fn fs_boot_sector(s: &[u8]) -> bool {
    let jump = s[0] == 0xeb || s[0] == 0xe9;
    jump && (&s[0x36..0x39] == b"FAT" || &s[0x52..0x55] == b"FAT" || &s[3..7] == b"NTFS")
}

/// Reads the partition table of `disk`. `Err` is a damaged table (one line).
pub fn probe(disk: &mut dyn Source) -> Result<Probe, String> {
    let size = disk.size();
    if size < 2 * SECTOR {
        return Ok(Probe::None);
    }
    let mut s0 = [0u8; 512];
    disk.read(0, &mut s0)
        .map_err(|e| format!("reading sector 0: {e}"))?;
    if s0[510] != 0x55 || s0[511] != 0xaa || fs_boot_sector(&s0) {
        return Ok(Probe::None);
    }
    let entries: Vec<&[u8]> = (0..4).map(|i| &s0[446 + 16 * i..462 + 16 * i]).collect();
    if entries.iter().any(|e| e[4] == 0xee) {
        return gpt(disk, size).map(Probe::Table);
    }
    mbr(&s0, size).map(Probe::Table)
}

fn mbr(s0: &[u8], size: u64) -> Result<Table, String> {
    let signature = le32(s0, 440);
    let mut partitions = Vec::new();
    for i in 0..4usize {
        let e = &s0[446 + 16 * i..462 + 16 * i];
        let number = i as u32 + 1;
        let kind = e[4];
        if kind == 0 {
            continue;
        }
        if e[0] & 0x7f != 0 {
            return Err(format!(
                "MBR partition {number}: boot flag {:#04x} (not 0x00 or 0x80): not a partition table",
                e[0]
            ));
        }
        let (first, count) = (u64::from(le32(e, 8)), u64::from(le32(e, 12)));
        if first == 0 || count == 0 {
            return Err(format!(
                "MBR partition {number}: starts at sector {first} with {count} sectors"
            ));
        }
        let end = (first + count) * SECTOR;
        if end > size {
            return Err(format!(
                "MBR partition {number}: sectors {first}..{} end beyond the disk ({} sectors)",
                first + count,
                size / SECTOR
            ));
        }
        // Extended partitions hold logical ones, which are not searched.
        if matches!(kind, 0x05 | 0x0f | 0x85) {
            continue;
        }
        partitions.push(Partition {
            number,
            start: first * SECTOR,
            len: count * SECTOR,
            type_id: format!("{kind:02x}"),
            partuuid: if signature == 0 {
                String::new()
            } else {
                format!("{signature:08x}-{number:02x}")
            },
        });
    }
    check_overlap(&partitions, "MBR")?;
    Ok(Table {
        kind: TableKind::Mbr { signature },
        partitions,
    })
}

fn check_overlap(parts: &[Partition], what: &str) -> Result<(), String> {
    for (i, a) in parts.iter().enumerate() {
        for b in &parts[i + 1..] {
            if a.start < b.start + b.len && b.start < a.start + a.len {
                return Err(format!(
                    "{what} partitions {} and {} overlap",
                    a.number, b.number
                ));
            }
        }
    }
    Ok(())
}

fn gpt(disk: &mut dyn Source, size: u64) -> Result<Table, String> {
    let sectors = size / SECTOR;
    let mut h = [0u8; 512];
    disk.read(SECTOR, &mut h)
        .map_err(|e| format!("reading the GPT header: {e}"))?;
    if &h[0..8] != b"EFI PART" {
        return Err("protective MBR, but no GPT header (\"EFI PART\") in sector 1".into());
    }
    let hsize = le32(&h, 12) as usize;
    if !(92..=512).contains(&hsize) {
        return Err(format!("GPT header size {hsize} (92 to 512)"));
    }
    let stored = le32(&h, 16);
    let mut copy = h;
    copy[16..20].fill(0);
    let computed = crc32(&copy[..hsize]);
    if stored != computed {
        return Err(format!(
            "GPT header CRC {stored:#010x}, computed {computed:#010x}: the header is damaged"
        ));
    }
    if le64(&h, 24) != 1 {
        return Err(format!(
            "GPT header says it is at sector {}, not 1",
            le64(&h, 24)
        ));
    }
    let (first_usable, last_usable) = (le64(&h, 40), le64(&h, 48));
    if first_usable > last_usable || last_usable >= sectors {
        return Err(format!(
            "GPT usable sectors {first_usable}..={last_usable} do not fit the disk ({sectors} sectors)"
        ));
    }
    let disk_guid = guid(&h[56..72]);
    let array_lba = le64(&h, 72);
    let count = u64::from(le32(&h, 80));
    let esize = u64::from(le32(&h, 84));
    if esize < 128 || !esize.is_power_of_two() || esize > 4096 {
        return Err(format!(
            "GPT entry size {esize} (a power of two, 128 to 4096)"
        ));
    }
    let array_len = count * esize;
    if array_len > GPT_MAX_ARRAY {
        return Err(format!(
            "GPT entry array of {count} entries of {esize} bytes is larger than {GPT_MAX_ARRAY} bytes"
        ));
    }
    let array_end = array_lba
        .checked_mul(SECTOR)
        .and_then(|s| s.checked_add(array_len));
    if array_lba < 2 || array_end.is_none_or(|e| e > size) {
        return Err(format!(
            "GPT entry array at sector {array_lba} ({array_len} bytes) is outside the disk"
        ));
    }
    let mut array = vec![0u8; array_len as usize];
    disk.read(array_lba * SECTOR, &mut array)
        .map_err(|e| format!("reading the GPT entry array: {e}"))?;
    let stored = le32(&h, 88);
    let computed = crc32(&array);
    if stored != computed {
        return Err(format!(
            "GPT entry array CRC {stored:#010x}, computed {computed:#010x}: the entries are damaged"
        ));
    }
    let mut partitions = Vec::new();
    for (i, e) in array.chunks_exact(esize as usize).enumerate() {
        if e[..16].iter().all(|b| *b == 0) {
            continue;
        }
        let number = i as u32 + 1;
        let (first, last) = (le64(e, 32), le64(e, 40));
        if first > last || first < first_usable || last > last_usable {
            return Err(format!(
                "GPT partition {number}: sectors {first}..={last} outside the usable {first_usable}..={last_usable}"
            ));
        }
        if partitions.len() == MAX_PARTITIONS {
            return Err(format!("more than {MAX_PARTITIONS} GPT partitions"));
        }
        partitions.push(Partition {
            number,
            start: first * SECTOR,
            len: (last - first + 1) * SECTOR,
            type_id: guid(&e[0..16]),
            partuuid: guid(&e[16..32]),
        });
    }
    check_overlap(&partitions, "GPT")?;
    Ok(Table {
        kind: TableKind::Gpt { disk_guid },
        partitions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A disk of `sectors` zero sectors.
    fn disk(sectors: usize) -> Vec<u8> {
        vec![0; sectors * 512]
    }

    fn mbr_entry(d: &mut [u8], i: usize, kind: u8, first: u32, count: u32) {
        let e = &mut d[446 + 16 * i..462 + 16 * i];
        e[4] = kind;
        e[8..12].copy_from_slice(&first.to_le_bytes());
        e[12..16].copy_from_slice(&count.to_le_bytes());
    }

    fn sign(d: &mut [u8]) {
        d[510] = 0x55;
        d[511] = 0xaa;
    }

    #[test]
    fn crc32_known_value() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
    }

    #[test]
    fn guid_text_is_mixed_endian() {
        let b = [
            0xe3, 0xbc, 0x68, 0x4f, 0xcd, 0xe8, 0xb1, 0x4d, 0x96, 0xe7, 0xfb, 0xca, 0xf9, 0x84,
            0xb7, 0x09,
        ];
        assert_eq!(guid(&b), GPT_LINUX_ROOT_X86_64);
    }

    #[test]
    fn no_signature_means_no_table() {
        let mut d = disk(64);
        assert_eq!(probe(&mut d.as_slice()).unwrap(), Probe::None);
        // A FAT boot sector with the signature is a file system, not a table.
        sign(&mut d);
        d[0] = 0xeb;
        d[0x52..0x55].copy_from_slice(b"FAT");
        mbr_entry(&mut d, 0, 0x83, 1, 1000);
        assert_eq!(probe(&mut d.as_slice()).unwrap(), Probe::None);
    }

    #[test]
    fn mbr_partitions() {
        let mut d = disk(64);
        sign(&mut d);
        d[440..444].copy_from_slice(&0x1234_abcdu32.to_le_bytes());
        mbr_entry(&mut d, 0, 0x83, 2, 10);
        mbr_entry(&mut d, 1, 0x05, 20, 10);
        mbr_entry(&mut d, 2, 0x83, 40, 24);
        let Probe::Table(t) = probe(&mut d.as_slice()).unwrap() else {
            panic!()
        };
        assert_eq!(
            t.kind,
            TableKind::Mbr {
                signature: 0x1234_abcd
            }
        );
        assert_eq!(t.partitions.len(), 2, "extended partition skipped");
        assert_eq!(t.partitions[0].start, 1024);
        assert_eq!(t.partitions[0].len, 5120);
        assert_eq!(t.partitions[1].number, 3);
        assert_eq!(t.partitions[1].partuuid, "1234abcd-03");
        assert_eq!(t.partitions[1].type_id, "83");
    }

    #[test]
    fn bogus_mbr_entries_are_refused() {
        let mut d = disk(64);
        sign(&mut d);
        mbr_entry(&mut d, 0, 0x83, 2, 100);
        let e = probe(&mut d.as_slice()).unwrap_err();
        assert!(e.contains("beyond the disk"), "{e}");
        mbr_entry(&mut d, 0, 0x83, 2, 10);
        mbr_entry(&mut d, 1, 0x83, 5, 10);
        let e = probe(&mut d.as_slice()).unwrap_err();
        assert!(e.contains("overlap"), "{e}");
        mbr_entry(&mut d, 1, 0, 0, 0);
        d[446] = 0x12;
        let e = probe(&mut d.as_slice()).unwrap_err();
        assert!(e.contains("boot flag"), "{e}");
    }

    /// A GPT disk of 128 sectors with the given partitions (first, last, unique GUID byte).
    fn gpt_disk(parts: &[(u64, u64, u8)]) -> Vec<u8> {
        let mut d = disk(128);
        sign(&mut d);
        mbr_entry(&mut d, 0, 0xee, 1, 127);
        let mut array = vec![0u8; 128 * 128];
        for (i, (first, last, id)) in parts.iter().enumerate() {
            let e = &mut array[i * 128..(i + 1) * 128];
            e[0..16].copy_from_slice(&[
                0xaf, 0x3d, 0xc6, 0x0f, 0x83, 0x84, 0x72, 0x47, 0x8e, 0x79, 0x3d, 0x69, 0xd8, 0x47,
                0x7d, 0xe4,
            ]);
            e[16..32].fill(*id);
            e[32..40].copy_from_slice(&first.to_le_bytes());
            e[40..48].copy_from_slice(&last.to_le_bytes());
        }
        d[2 * 512..2 * 512 + array.len()].copy_from_slice(&array);
        let h = &mut d[512..1024];
        h[0..8].copy_from_slice(b"EFI PART");
        h[8..12].copy_from_slice(&0x0001_0000u32.to_le_bytes());
        h[12..16].copy_from_slice(&92u32.to_le_bytes());
        h[24..32].copy_from_slice(&1u64.to_le_bytes());
        h[32..40].copy_from_slice(&127u64.to_le_bytes());
        h[40..48].copy_from_slice(&34u64.to_le_bytes());
        h[48..56].copy_from_slice(&94u64.to_le_bytes());
        h[56..72].fill(0x42);
        h[72..80].copy_from_slice(&2u64.to_le_bytes());
        h[80..84].copy_from_slice(&128u32.to_le_bytes());
        h[84..88].copy_from_slice(&128u32.to_le_bytes());
        h[88..92].copy_from_slice(&crc32(&array).to_le_bytes());
        let c = crc32(&h[..92]);
        h[16..20].copy_from_slice(&c.to_le_bytes());
        d
    }

    #[test]
    fn gpt_partitions() {
        let d = gpt_disk(&[(34, 40, 0x11), (41, 94, 0x22)]);
        let Probe::Table(t) = probe(&mut d.as_slice()).unwrap() else {
            panic!()
        };
        assert_eq!(t.name(), "GPT");
        assert_eq!(t.partitions.len(), 2);
        assert_eq!(t.partitions[0].type_id, GPT_LINUX_FS);
        assert_eq!(
            t.partitions[1].partuuid,
            "22222222-2222-2222-2222-222222222222"
        );
        assert_eq!(t.partitions[1].start, 41 * 512);
        assert_eq!(t.partitions[1].len, 54 * 512);
    }

    #[test]
    fn damaged_gpt_is_refused() {
        let mut d = gpt_disk(&[(34, 40, 0x11)]);
        d[512 + 60] ^= 1;
        let e = probe(&mut d.as_slice()).unwrap_err();
        assert!(e.contains("GPT header CRC"), "{e}");
        let mut d = gpt_disk(&[(34, 40, 0x11)]);
        d[2 * 512 + 20] ^= 1;
        let e = probe(&mut d.as_slice()).unwrap_err();
        assert!(e.contains("entry array CRC"), "{e}");
        let d = gpt_disk(&[(34, 100, 0x11)]);
        let e = probe(&mut d.as_slice()).unwrap_err();
        assert!(e.contains("outside the usable"), "{e}");
        let d = gpt_disk(&[(34, 50, 0x11), (50, 60, 0x12)]);
        let e = probe(&mut d.as_slice()).unwrap_err();
        assert!(e.contains("overlap"), "{e}");
        let mut d = gpt_disk(&[]);
        d[512..520].fill(0);
        let e = probe(&mut d.as_slice()).unwrap_err();
        assert!(e.contains("no GPT header"), "{e}");
    }
}
