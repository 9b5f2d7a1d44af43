//! Wraps a 64-bit ELF (linked at 1 MiB, with a 64-bit entry at image start + 0x200) in a minimal
//! bzImage: a two-sector real-mode header (boot protocol 2.15, `XLF_KERNEL_64`) followed by the
//! flat protected-mode image. Only the 64-bit entry is usable; the real-mode entry halts.

/// Where the image is linked and loaded.
pub const LOAD_ADDR: u64 = 0x10_0000;
/// Offset of the 64-bit entry inside the protected-mode image.
pub const ENTRY64_OFFSET: usize = 0x200;
/// Setup sectors after the boot sector.
pub const SETUP_SECTS: u8 = 1;
/// Real-mode entry (reached through the jump at 0x200): just halts.
const REAL_MODE_STUB: usize = 0x280;
/// Flat images larger than this are refused.
const MAX_IMAGE: u64 = 64 << 20;

/// Why an ELF could not be wrapped.
#[derive(Debug, thiserror::Error)]
pub enum BzImageError {
    #[error("not a little-endian x86_64 ELF64 executable")]
    NotElf,
    #[error("ELF program header table out of bounds")]
    Phdrs,
    #[error(
        "segment at {paddr:#x} (+{memsz:#x}) is outside [{LOAD_ADDR:#x}, {LOAD_ADDR:#x} + 64 MiB)"
    )]
    Segment { paddr: u64, memsz: u64 },
    #[error("segment file range out of bounds")]
    SegmentData,
    #[error("no loadable segment starts at {LOAD_ADDR:#x}")]
    NoImage,
    #[error("no jmp at image offset {ENTRY64_OFFSET:#x} (the 64-bit bzImage entry)")]
    NoEntry,
}

fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(off..off + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(off..off + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(off..off + 8)?.try_into().ok()?))
}

/// The flat image (file-backed bytes of every PT_LOAD, from `LOAD_ADDR`) and the total memory
/// size including `.bss`.
pub fn flatten(elf: &[u8]) -> Result<(Vec<u8>, u64), BzImageError> {
    const PT_LOAD: u32 = 1;
    if elf.get(0..4) != Some(b"\x7fELF")
        || elf.get(4) != Some(&2)
        || elf.get(5) != Some(&1)
        || u16_at(elf, 18) != Some(62)
    {
        return Err(BzImageError::NotElf);
    }
    let phoff = u64_at(elf, 32).ok_or(BzImageError::NotElf)? as usize;
    let phentsize = usize::from(u16_at(elf, 54).ok_or(BzImageError::NotElf)?);
    let phnum = usize::from(u16_at(elf, 56).ok_or(BzImageError::NotElf)?);
    if phentsize < 56 {
        return Err(BzImageError::Phdrs);
    }
    let mut image = Vec::new();
    let mut mem_end = 0u64;
    let mut starts_at_load = false;
    for i in 0..phnum {
        let ph = phoff
            .checked_add(i * phentsize)
            .ok_or(BzImageError::Phdrs)?;
        let ph = elf
            .get(ph..ph.checked_add(56).ok_or(BzImageError::Phdrs)?)
            .ok_or(BzImageError::Phdrs)?;
        if u32_at(ph, 0) != Some(PT_LOAD) {
            continue;
        }
        let (offset, paddr, filesz, memsz) = (
            u64_at(ph, 8).unwrap_or(0),
            u64_at(ph, 24).unwrap_or(0),
            u64_at(ph, 32).unwrap_or(0),
            u64_at(ph, 40).unwrap_or(0),
        );
        let rel = paddr.checked_sub(LOAD_ADDR);
        let end = rel.and_then(|r| r.checked_add(memsz.max(filesz)));
        let (Some(rel), Some(end)) = (rel, end) else {
            return Err(BzImageError::Segment { paddr, memsz });
        };
        if end > MAX_IMAGE {
            return Err(BzImageError::Segment { paddr, memsz });
        }
        starts_at_load |= rel == 0;
        mem_end = mem_end.max(end);
        if filesz == 0 {
            continue;
        }
        let data = usize::try_from(offset)
            .ok()
            .and_then(|o| elf.get(o..o.checked_add(filesz as usize)?))
            .ok_or(BzImageError::SegmentData)?;
        let (rel, fend) = (rel as usize, (rel + filesz) as usize);
        if image.len() < fend {
            image.resize(fend, 0);
        }
        image[rel..fend].copy_from_slice(data);
    }
    if !starts_at_load {
        return Err(BzImageError::NoImage);
    }
    // e9 = jmp rel32, eb = jmp rel8.
    if !matches!(image.get(ENTRY64_OFFSET), Some(0xe9 | 0xeb)) {
        return Err(BzImageError::NoEntry);
    }
    Ok((image, mem_end))
}

/// Builds the bzImage bytes for `elf`.
pub fn from_elf(elf: &[u8]) -> Result<Vec<u8>, BzImageError> {
    let (image, mem_end) = flatten(elf)?;
    let setup_len = (usize::from(SETUP_SECTS) + 1) * 512;
    let mut out = vec![0u8; setup_len];
    let put16 =
        |b: &mut [u8], off: usize, v: u16| b[off..off + 2].copy_from_slice(&v.to_le_bytes());
    let put32 =
        |b: &mut [u8], off: usize, v: u32| b[off..off + 4].copy_from_slice(&v.to_le_bytes());
    out[0x1f1] = SETUP_SECTS;
    put16(&mut out, 0x1fe, 0xaa55); // boot_flag
    out[0x200] = 0xeb; // jump over the header to the real-mode stub at 0x280
    out[0x201] = (REAL_MODE_STUB - 0x202) as u8;
    out[0x202..0x206].copy_from_slice(b"HdrS");
    put16(&mut out, 0x206, 0x020f); // protocol version 2.15
    out[0x211] = 0x01; // loadflags: LOADED_HIGH
    put32(&mut out, 0x214, LOAD_ADDR as u32); // code32_start
    put32(&mut out, 0x22c, 0x7fff_ffff); // initrd_addr_max
    put32(&mut out, 0x230, 0x20_0000); // kernel_alignment
    out[0x234] = 0; // relocatable_kernel: no
    out[0x235] = 21; // min_alignment (log2): 2 MiB
    put16(&mut out, 0x236, 0x0001); // xloadflags: XLF_KERNEL_64
    put32(&mut out, 0x238, 2047); // cmdline_size
    out[0x258..0x260].copy_from_slice(&LOAD_ADDR.to_le_bytes()); // pref_address
    put32(
        &mut out,
        0x260,
        mem_end.div_ceil(4096).saturating_mul(4096) as u32,
    ); // init_size
    out[REAL_MODE_STUB..REAL_MODE_STUB + 4].copy_from_slice(&[0xfa, 0xf4, 0xeb, 0xfd]); // cli; hlt; jmp .-1
    out.extend_from_slice(&image);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 with one PT_LOAD at `paddr` holding `data` (memsz = filesz + bss).
    fn elf(paddr: u64, data: &[u8], bss: u64) -> Vec<u8> {
        let mut e = vec![0u8; 64 + 56];
        e[0..4].copy_from_slice(b"\x7fELF");
        e[4] = 2;
        e[5] = 1;
        e[6] = 1;
        e[16..18].copy_from_slice(&2u16.to_le_bytes());
        e[18..20].copy_from_slice(&62u16.to_le_bytes());
        e[24..32].copy_from_slice(&(paddr + 0x200).to_le_bytes());
        e[32..40].copy_from_slice(&64u64.to_le_bytes());
        e[54..56].copy_from_slice(&56u16.to_le_bytes());
        e[56..58].copy_from_slice(&1u16.to_le_bytes());
        let ph = &mut e[64..120];
        ph[0..4].copy_from_slice(&1u32.to_le_bytes());
        ph[8..16].copy_from_slice(&120u64.to_le_bytes());
        ph[16..24].copy_from_slice(&paddr.to_le_bytes());
        ph[24..32].copy_from_slice(&paddr.to_le_bytes());
        ph[32..40].copy_from_slice(&(data.len() as u64).to_le_bytes());
        ph[40..48].copy_from_slice(&(data.len() as u64 + bss).to_le_bytes());
        e.extend_from_slice(data);
        e
    }

    fn code() -> Vec<u8> {
        let mut c = vec![0xccu8; 0x300];
        c[0x200] = 0xe9;
        c
    }

    #[test]
    fn header_fields_and_payload() {
        let c = code();
        let bz = from_elf(&elf(LOAD_ADDR, &c, 0x5000)).unwrap();
        assert_eq!(&bz[0x202..0x206], b"HdrS");
        assert_eq!(u16_at(&bz, 0x1fe), Some(0xaa55));
        assert_eq!(bz[0x1f1], SETUP_SECTS);
        assert_eq!(bz[0x211] & 1, 1);
        assert_eq!(u16_at(&bz, 0x236), Some(1));
        assert_eq!(bz[0x202 + usize::from(bz[0x201])], 0xfa);
        assert_eq!(u32_at(&bz, 0x214), Some(LOAD_ADDR as u32));
        assert_eq!(u32_at(&bz, 0x260), Some(0x6000)); // 0x300 + 0x5000 rounded up
        let setup = (usize::from(SETUP_SECTS) + 1) * 512;
        assert_eq!(&bz[setup..], &c[..]);
        assert_eq!(bz[setup + ENTRY64_OFFSET], 0xe9);
    }

    #[test]
    fn rejects_bad_input() {
        assert!(matches!(from_elf(b"not an elf"), Err(BzImageError::NotElf)));
        assert!(matches!(
            from_elf(&elf(0x1000, &code(), 0)),
            Err(BzImageError::Segment { .. })
        ));
        assert!(matches!(
            from_elf(&elf(LOAD_ADDR, &[0xcc; 0x300], 0)),
            Err(BzImageError::NoEntry)
        ));
        let mut truncated = elf(LOAD_ADDR, &code(), 0);
        truncated.truncate(200);
        assert!(matches!(
            from_elf(&truncated),
            Err(BzImageError::SegmentData)
        ));
        let mut bad_phoff = elf(LOAD_ADDR, &code(), 0);
        bad_phoff[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(from_elf(&bad_phoff).is_err());
    }
}
