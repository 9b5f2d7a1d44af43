//! Builds the real test guest and checks the properties the VMM's loaders depend on.

use testguest_build::bzimage::{self, ENTRY64_OFFSET, LOAD_ADDR};

const PT_LOAD: u32 = 1;
const PT_NOTE: u32 = 4;

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes(b[o..o + 2].try_into().unwrap())
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

struct Phdr {
    ty: u32,
    offset: u64,
    paddr: u64,
    filesz: u64,
}

fn phdrs(elf: &[u8]) -> Vec<Phdr> {
    let phoff = u64_at(elf, 32) as usize;
    let n = usize::from(u16_at(elf, 56));
    (0..n)
        .map(|i| {
            let p = phoff + i * 56;
            Phdr {
                ty: u32_at(elf, p),
                offset: u64_at(elf, p + 8),
                paddr: u64_at(elf, p + 24),
                filesz: u64_at(elf, p + 32),
            }
        })
        .collect()
}

/// The (type, name, desc) of every note in the PT_NOTE segments.
fn notes(elf: &[u8]) -> Vec<(u32, Vec<u8>, Vec<u8>)> {
    let mut out = vec![];
    for ph in phdrs(elf).into_iter().filter(|p| p.ty == PT_NOTE) {
        let (mut p, end) = (ph.offset as usize, (ph.offset + ph.filesz) as usize);
        while p + 12 <= end {
            let (namesz, descsz, ty) = (
                u32_at(elf, p) as usize,
                u32_at(elf, p + 4) as usize,
                u32_at(elf, p + 8),
            );
            let name = elf[p + 12..p + 12 + namesz].to_vec();
            let d = p + 12 + namesz.div_ceil(4) * 4;
            out.push((ty, name, elf[d..d + descsz].to_vec()));
            p = d + descsz.div_ceil(4) * 4;
        }
    }
    out
}

#[test]
fn builds_pvh_linux64_and_bzimage() {
    let a = testguest_build::build().expect("build the test guest");
    let pvh = std::fs::read(&a.pvh).unwrap();
    let linux64 = std::fs::read(&a.linux64).unwrap();
    let bz = std::fs::read(&a.bzimage).unwrap();

    for elf in [&pvh, &linux64] {
        assert_eq!(&elf[0..4], b"\x7fELF");
        assert_eq!(u16_at(elf, 16), 2, "ET_EXEC, not PIE");
        assert_eq!(u16_at(elf, 18), 62, "x86_64");
        let loads: Vec<_> = phdrs(elf).into_iter().filter(|p| p.ty == PT_LOAD).collect();
        assert_eq!(loads.len(), 1, "one loadable segment");
        assert_eq!(loads[0].paddr, LOAD_ADDR, "linked at 1 MiB");
        let entry = u64_at(elf, 24);
        assert!(
            entry > LOAD_ADDR && entry < LOAD_ADDR + loads[0].filesz,
            "entry {entry:#x} inside the image"
        );
    }

    // PVH: exactly one PT_NOTE whose only note is Xen/18 with a 32-bit entry inside the image,
    // different from the 64-bit e_entry (it is 32-bit code).
    let n = notes(&pvh);
    assert_eq!(n.len(), 1, "{n:?}");
    let (ty, name, desc) = &n[0];
    assert_eq!((*ty, name.as_slice()), (18, &b"Xen\0"[..]));
    assert_eq!(desc.len(), 4);
    let pvh_entry = u64::from(u32_at(desc, 0));
    assert!(pvh_entry >= LOAD_ADDR && pvh_entry != u64_at(&pvh, 24));

    // linux64: no notes at all, so the VMM's ELF loader reports no PVH capability.
    assert!(phdrs(&linux64).iter().all(|p| p.ty != PT_NOTE));
    assert_eq!(
        u64_at(&pvh, 24),
        u64_at(&linux64, 24),
        "same code, same 64-bit entry"
    );

    // bzImage: header + the flat linux64 image, whose byte 0x200 jumps to e_entry.
    let (flat, _) = bzimage::flatten(&linux64).unwrap();
    let setup = (usize::from(bz[0x1f1]) + 1) * 512;
    assert_eq!(&bz[0x202..0x206], b"HdrS");
    assert_eq!(&bz[setup..], &flat[..]);
    assert_eq!(flat[ENTRY64_OFFSET], 0xe9, "jmp rel32");
    let rel = i32::from_le_bytes(
        flat[ENTRY64_OFFSET + 1..ENTRY64_OFFSET + 5]
            .try_into()
            .unwrap(),
    );
    let target = (LOAD_ADDR + ENTRY64_OFFSET as u64 + 5).wrapping_add_signed(i64::from(rel));
    assert_eq!(
        target,
        u64_at(&linux64, 24),
        "bzImage 64-bit entry reaches _start64"
    );

    // A second build with nothing changed returns the same files quickly.
    let t = std::time::Instant::now();
    let b = testguest_build::build().unwrap();
    assert_eq!(b.pvh, a.pvh);
    assert!(t.elapsed().as_secs() < 30);
}
