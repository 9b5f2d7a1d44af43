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
//! - a read error is a qcow2 error or an I/O error, never anything else (out of range, memory);
//! - writes are refused (the image is read-only), and the file is never modified.

use std::path::Path;

use vmm::devices::virtio::block::disk::{read_into, DiskBackend, DiskError, SECTOR_SIZE};
use vmm::devices::virtio::block::qcow2::header::{MAGIC, MAX_VIRTUAL_SIZE};
use vmm::devices::virtio::block::qcow2::Qcow2;

use crate::scratch;

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
