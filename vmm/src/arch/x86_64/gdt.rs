//! Global descriptor table entries for the boot CPU.

use kvm_bindings::kvm_segment;

/// Builds a GDT entry from flags (the upper 4 bits of byte 6 and byte 5), base and limit.
pub const fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    ((base as u64 & 0xff00_0000) << (56 - 24))
        | ((flags as u64 & 0x0000_f0ff) << 40)
        | ((limit as u64 & 0x000f_0000) << (48 - 16))
        | ((base as u64 & 0x00ff_ffff) << 16)
        | (limit as u64 & 0x0000_ffff)
}

fn get_base(entry: u64) -> u64 {
    ((entry & 0xff00_0000_0000_0000) >> 32)
        | ((entry & 0x0000_00ff_0000_0000) >> 16)
        | ((entry & 0x0000_0000_ffff_0000) >> 16)
}

fn get_limit(entry: u64) -> u32 {
    let limit = (((entry & 0x000f_0000_0000_0000) >> 32) | (entry & 0x0000_0000_0000_ffff)) as u32;
    // With G set the limit counts 4 KiB pages.
    if get_g(entry) == 1 {
        (limit << 12) | 0xfff
    } else {
        limit
    }
}

fn get_g(entry: u64) -> u8 {
    ((entry & 0x0080_0000_0000_0000) >> 55) as u8
}
fn get_db(entry: u64) -> u8 {
    ((entry & 0x0040_0000_0000_0000) >> 54) as u8
}
fn get_l(entry: u64) -> u8 {
    ((entry & 0x0020_0000_0000_0000) >> 53) as u8
}
fn get_avl(entry: u64) -> u8 {
    ((entry & 0x0010_0000_0000_0000) >> 52) as u8
}
fn get_p(entry: u64) -> u8 {
    ((entry & 0x0000_8000_0000_0000) >> 47) as u8
}
fn get_dpl(entry: u64) -> u8 {
    ((entry & 0x0000_6000_0000_0000) >> 45) as u8
}
fn get_s(entry: u64) -> u8 {
    ((entry & 0x0000_1000_0000_0000) >> 44) as u8
}
fn get_type(entry: u64) -> u8 {
    ((entry & 0x0000_0f00_0000_0000) >> 40) as u8
}

/// The KVM segment register value for GDT entry `entry` at index `table_index`.
pub fn kvm_segment_from_gdt(entry: u64, table_index: u8) -> kvm_segment {
    kvm_segment {
        base: get_base(entry),
        limit: get_limit(entry),
        selector: u16::from(table_index) * 8,
        type_: get_type(entry),
        present: get_p(entry),
        dpl: get_dpl(entry),
        db: get_db(entry),
        s: get_s(entry),
        l: get_l(entry),
        g: get_g(entry),
        avl: get_avl(entry),
        padding: 0,
        unusable: u8::from(get_p(entry) == 0),
    }
}

/// GDT for the 64-bit Linux entry: null, 64-bit code, data, TSS.
pub const GDT_LONG_MODE: [u64; 4] = [
    gdt_entry(0, 0, 0),
    gdt_entry(0xa09b, 0, 0xfffff),
    gdt_entry(0xc093, 0, 0xfffff),
    gdt_entry(0x808b, 0, 0xfffff),
];

/// GDT for the PVH entry (32-bit protected mode): null, 32-bit code, data, TSS.
pub const GDT_PROTECTED_MODE: [u64; 4] = [
    gdt_entry(0, 0, 0),
    gdt_entry(0xc09b, 0, 0xffff_ffff),
    gdt_entry(0xc093, 0, 0xffff_ffff),
    gdt_entry(0x008b, 0, 0x67),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_mode_code_segment() {
        let s = kvm_segment_from_gdt(GDT_LONG_MODE[1], 1);
        assert_eq!(
            (s.selector, s.type_, s.l, s.db, s.g, s.present, s.s),
            (8, 0xb, 1, 0, 1, 1, 1)
        );
        assert_eq!(s.limit, 0xffff_ffff);
        assert_eq!(s.base, 0);
    }

    #[test]
    fn protected_mode_segments() {
        let cs = kvm_segment_from_gdt(GDT_PROTECTED_MODE[1], 1);
        assert_eq!((cs.l, cs.db, cs.type_), (0, 1, 0xb));
        let ds = kvm_segment_from_gdt(GDT_PROTECTED_MODE[2], 2);
        assert_eq!((ds.selector, ds.type_, ds.db), (16, 3, 1));
        let tr = kvm_segment_from_gdt(GDT_PROTECTED_MODE[3], 3);
        assert_eq!((tr.s, tr.type_, tr.limit), (0, 0xb, 0x67));
        let null = kvm_segment_from_gdt(0, 0);
        assert_eq!(null.unusable, 1);
    }

    #[test]
    fn base_and_limit_round_trip() {
        let e = gdt_entry(0x4093, 0x1234_5678, 0xabcde);
        assert_eq!(get_base(e), 0x1234_5678);
        assert_eq!(get_limit(e), 0xabcde);
    }
}
