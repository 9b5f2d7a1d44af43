//! `blk_qcow2`: the read-only qcow2 reader (`vmm::devices::virtio::block::qcow2`) on an image
//! that is the input, written to a scratch file: a hostile containerDisk.
//!
//! Checked, besides "no panic, no hang, bounded memory" (libFuzzer's limits):
//! - a refusal is one line, and a file that starts with the qcow2 magic is refused as qcow2
//!   ([`DiskError::Qcow2`]) or for I/O, never taken as raw;
//! - an accepted image has a capacity in whole sectors, at most the supported virtual size;
//! - reads are consistent: a 64 KiB read at each of [`READS`] offsets spread over the disk
//!   succeeds exactly when the same range read as 4 KiB pieces, in reverse order, does, with
//!   the same bytes (so neither the table cache nor the inflated-cluster cache, nor the
//!   merging of contiguous clusters, changes what a read returns); a read again gives the same;
//! - reads agree with [`model`], a second, plain reading of the qcow2 specification (no caches,
//!   no merging, sector by sector over the input bytes): where it finds the data the bytes are
//!   the same, and where it finds damage outside compressed clusters the read fails (for
//!   compressed clusters, only the bytes are compared where both inflate: two inflater calls
//!   may disagree on where exactly a damaged stream gives up);
//! - a read error is a qcow2 error or an I/O error, never anything else (out of range, memory);
//! - writes are refused (the image is read-only), and the file is never modified.

use std::path::Path;

use vmm::devices::virtio::block::disk::{read_into, DiskBackend, DiskError, SECTOR_SIZE};
use vmm::devices::virtio::block::qcow2::header::{MAGIC, MAX_VIRTUAL_SIZE};
use vmm::devices::virtio::block::qcow2::Qcow2;

use crate::scratch;

/// What the specification says a sector holds.
#[derive(Debug, PartialEq, Eq)]
pub enum Sector {
    Data(Vec<u8>),
    /// In a compressed cluster that inflates to this cluster (`None`: it does not).
    Compressed(Option<Vec<u8>>),
    /// Damage: a read of it must fail.
    Damaged,
}

fn be64(img: &[u8], at: u64) -> Option<u64> {
    let at = usize::try_from(at).ok()?;
    let b = img.get(at..at.checked_add(8)?)?;
    Some(u64::from_be_bytes(b.try_into().ok()?))
}

/// Sector `sector` of the image `img` (whose header the reader accepted): the L1 and L2
/// entries read from the input bytes, decoded as the qcow2 specification describes them.
pub fn model(img: &[u8], version: u32, cluster_bits: u32, l1_offset: u64, sector: u64) -> Sector {
    const MASK: u64 = 0x00ff_ffff_ffff_fe00;
    let cs = 1u64 << cluster_bits;
    let len = img.len() as u64;
    let pos = sector * 512;
    let cluster = pos >> cluster_bits;
    let l2_entries = cs / 8;
    let Some(l1e) = be64(img, l1_offset + 8 * (cluster / l2_entries)) else {
        return Sector::Damaged;
    };
    let l2 = l1e & MASK;
    if l2 == 0 {
        return Sector::Data(vec![0; 512]);
    }
    if !l2.is_multiple_of(cs) {
        return Sector::Damaged;
    }
    let Some(e) = be64(img, l2 + 8 * (cluster % l2_entries)) else {
        return Sector::Damaged;
    };
    let within = (pos % cs) as usize;
    if e & (1 << 62) != 0 {
        let x = 62 - (cluster_bits - 8);
        let off = e & ((1u64 << x) - 1);
        let n = ((e >> x) & ((1u64 << (cluster_bits - 8)) - 1)) + 1;
        if off >= len {
            return Sector::Damaged;
        }
        let end = (off + n * 512 - off % 512).min(len);
        let out = match miniz_oxide::inflate::decompress_to_vec_with_limit(
            &img[off as usize..end as usize],
            cs as usize,
        ) {
            Ok(v) => v,
            Err(e) => e.output,
        };
        return Sector::Compressed(
            (out.len() == cs as usize).then(|| out[within..within + 512].to_vec()),
        );
    }
    if e & 1 != 0 {
        return if version >= 3 {
            Sector::Data(vec![0; 512])
        } else {
            Sector::Damaged
        };
    }
    let off = e & MASK;
    if off == 0 {
        return Sector::Data(vec![0; 512]);
    }
    if !off.is_multiple_of(cs) || off >= len {
        return Sector::Damaged;
    }
    let mut v = vec![0u8; 512];
    let start = (off + within as u64).min(len) as usize;
    let end = (start + 512).min(img.len());
    v[..end - start].copy_from_slice(&img[start..end]);
    Sector::Data(v)
}

/// Number of 64 KiB reads, spread evenly over the capacity.
pub const READS: u64 = 12;
const READ: u64 = 64 * 1024;
const PIECE: u64 = 4096;

fn read(d: &mut Qcow2, off: u64, len: u64) -> Result<Vec<u8>, DiskError> {
    let mut v = vec![0u8; len as usize];
    read_into(d, off, &mut v).map(|()| v)
}

fn check_read_error(e: &DiskError, what: &str) {
    assert!(
        matches!(e, DiskError::Qcow2 { .. } | DiskError::Io(_)),
        "{what}: unexpected error {e:?}"
    );
    assert!(!e.to_string().contains('\n'), "{what}: {e}");
}

pub fn run(data: &[u8]) {
    let path = scratch::dir(0).join(scratch::file_name("image.qcow2"));
    std::fs::write(&path, data).expect("write the image");
    check(&path, data);
}

fn check(path: &Path, data: &[u8]) {
    let file = std::fs::File::open(path).expect("open the image");
    let magic = data.len() >= 4 && data[..4] == MAGIC;
    let mut d = match Qcow2::from_file(file, path) {
        Ok(d) => d,
        Err(e) => {
            let m = e.to_string();
            assert!(!m.contains('\n'), "refusal on one line: {m}");
            assert!(
                matches!(e, DiskError::Qcow2 { .. } | DiskError::Io(_)),
                "refused with {e:?}"
            );
            trace!("refused: {m}");
            return;
        }
    };
    assert!(magic, "accepted without the magic number");
    let cap = d.capacity();
    trace!("accepted: {:?}, capacity {cap}", d.header());
    assert!(
        cap % SECTOR_SIZE == 0 && cap <= MAX_VIRTUAL_SIZE,
        "capacity {cap}"
    );
    assert!(d.read_only());
    let one = vec![0u8; 512];
    let mut buf = one.clone();
    let s = vm_memory::VolatileSlice::from(&mut buf[..]);
    assert!(matches!(d.write_at(0, &s), Err(DiskError::ReadOnly)));
    if cap == 0 {
        return;
    }
    for i in 0..READS {
        let off = (cap / READS * i) / SECTOR_SIZE * SECTOR_SIZE;
        let len = READ.min(cap - off);
        let whole = read(&mut d, off, len);
        let mut pieces: Vec<(u64, Result<Vec<u8>, DiskError>)> = Vec::new();
        let mut p = off + len;
        while p > off {
            let start = p.saturating_sub(PIECE).max(off);
            pieces.push((start, read(&mut d, start, p - start)));
            p = start;
        }
        trace!("read {off:#x}+{len:#x}: {:?}", whole.as_ref().map(|_| ()));
        let h = d.header().clone();
        let sectors: Vec<Sector> = (off / SECTOR_SIZE..(off + len) / SECTOR_SIZE)
            .map(|sec| model(data, h.version, h.cluster_bits, h.l1_offset, sec))
            .collect();
        match &whole {
            Ok(w) => {
                for (k, m) in sectors.iter().enumerate() {
                    let got = &w[k * 512..(k + 1) * 512];
                    let at = off + k as u64 * 512;
                    match m {
                        Sector::Data(v) | Sector::Compressed(Some(v)) => {
                            assert!(got == &v[..], "sector at {at:#x} differs from the model")
                        }
                        Sector::Damaged => {
                            panic!("read at {off:#x} succeeded over damage at {at:#x}")
                        }
                        Sector::Compressed(None) => {}
                    }
                }
            }
            Err(e) => assert!(
                sectors
                    .iter()
                    .any(|m| matches!(m, Sector::Damaged | Sector::Compressed(_))),
                "read at {off:#x} failed ({e}) where the model finds no damage"
            ),
        }
        match &whole {
            Ok(w) => {
                for (start, r) in &pieces {
                    let b = (start - off) as usize;
                    match r {
                        Ok(v) => assert!(
                            v[..] == w[b..b + v.len()],
                            "piece at {start:#x} differs from the whole read at {off:#x}"
                        ),
                        Err(e) => panic!(
                            "piece at {start:#x} failed ({e}), whole read at {off:#x} did not"
                        ),
                    }
                }
                let again = read(&mut d, off, len).expect("second read");
                assert!(again == *w, "second read at {off:#x} differs");
            }
            Err(e) => {
                check_read_error(e, "whole read");
                assert!(
                    pieces.iter().any(|(_, r)| r.is_err()),
                    "whole read at {off:#x} failed ({e}), every piece succeeded"
                );
                for (_, r) in &pieces {
                    if let Err(e) = r {
                        check_read_error(e, "piece");
                    }
                }
            }
        }
    }
    assert!(
        std::fs::read(path).expect("read back") == data,
        "image modified"
    );
}
