//! Intel MultiProcessor table: find the floating pointer and list the processor entries.

use crate::io::{phys_read, phys_u16, phys_u32, phys_u8};

/// Most processors recorded.
pub const MAX_CPUS: usize = 64;
/// Upper bound on the configuration table size we walk.
const MAX_TABLE_LEN: u64 = 0x1_0000;
/// Upper bound on entries walked.
const MAX_ENTRIES: u16 = 1024;

/// What the MP table says.
pub struct MpInfo {
    /// Number of enabled processor entries.
    pub cpus: usize,
    /// Their local APIC IDs (first `MAX_CPUS`).
    pub apic_ids: [u8; MAX_CPUS],
    /// APIC ID of the entry flagged as BSP, if any.
    pub bsp_apic_id: Option<u8>,
    pub ioapics: usize,
}

fn checksum_ok(addr: u64, len: u64) -> bool {
    let mut buf = [0u8; 256];
    let mut sum = 0u8;
    let mut off = 0;
    while off < len {
        let n = (len - off).min(buf.len() as u64) as usize;
        if !phys_read(addr + off, &mut buf[..n]) {
            return false;
        }
        sum = buf[..n].iter().fold(sum, |s, &b| s.wrapping_add(b));
        off += n as u64;
    }
    sum == 0
}

fn find_floating_pointer() -> Option<u64> {
    // EBDA (where the VMM puts it), the last KiB of base memory, then the BIOS ROM area.
    for (start, end) in [(0x9_fc00u64, 0xa_0000u64), (0xf_0000, 0x10_0000)] {
        let mut a = start;
        while a + 16 <= end {
            if phys_u32(a) == u32::from_le_bytes(*b"_MP_") && checksum_ok(a, 16) {
                return Some(a);
            }
            a += 16;
        }
    }
    None
}

/// Parses the MP table; `None` when there is none (or it is malformed).
pub fn parse() -> Option<MpInfo> {
    let fp = find_floating_pointer()?;
    let table = u64::from(phys_u32(fp + 4));
    if table == 0 || phys_u32(table) != u32::from_le_bytes(*b"PCMP") {
        return None;
    }
    let base_len = u64::from(phys_u16(table + 4));
    if !(0x2c..=MAX_TABLE_LEN).contains(&base_len) || !checksum_ok(table, base_len) {
        return None;
    }
    let count = phys_u16(table + 0x22).min(MAX_ENTRIES);
    let end = table + base_len;
    let mut info = MpInfo {
        cpus: 0,
        apic_ids: [0; MAX_CPUS],
        bsp_apic_id: None,
        ioapics: 0,
    };
    let mut p = table + 0x2c;
    for _ in 0..count {
        if p >= end {
            break;
        }
        let len = match phys_u8(p) {
            0 => {
                if p + 20 > end {
                    break;
                }
                let apic_id = phys_u8(p + 1);
                let flags = phys_u8(p + 3);
                if flags & 1 != 0 {
                    if info.cpus < MAX_CPUS {
                        info.apic_ids[info.cpus] = apic_id;
                    }
                    info.cpus += 1;
                    if flags & 2 != 0 {
                        info.bsp_apic_id = Some(apic_id);
                    }
                }
                20
            }
            2 => {
                info.ioapics += 1;
                8
            }
            1 | 3 | 4 => 8,
            _ => break,
        };
        p += len;
    }
    Some(info)
}
