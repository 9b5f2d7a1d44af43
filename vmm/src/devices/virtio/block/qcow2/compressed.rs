//! Compressed clusters (zlib: raw deflate, as QEMU writes them).
//!
//! Bounds: the compressed bytes read are at most twice the cluster size (the L2 entry's
//! encoding cannot say more) and never past end-of-file; the output is exactly one cluster,
//! never more (a stream that would inflate further stops there, a "decompression bomb" costs
//! one cluster of output); a stream that ends short of a cluster is an error. Inflating is
//! linear in its input, so a request's CPU time is bounded by its size. The buffers are
//! allocated once, on the first compressed cluster, and the last cluster inflated is kept, so
//! sequential 4 KiB reads inflate each cluster once.

use std::fs::File;

use miniz_oxide::inflate::core::{decompress, inflate_flags, DecompressorOxide};
use miniz_oxide::inflate::TINFLStatus;

use super::header::read_up_to;

pub struct Inflater {
    cluster_size: usize,
    file_len: u64,
    state: Option<Box<State>>,
}

struct State {
    inflater: DecompressorOxide,
    input: Vec<u8>,
    output: Vec<u8>,
    /// Host offset and length of the cluster now in `output` (`u64::MAX`: none). Both: two
    /// L2 entries may name one offset with different lengths, and a read must not depend on
    /// which came first.
    cached: (u64, u64),
}

impl Inflater {
    pub fn new(cluster_size: u64, file_len: u64) -> Self {
        Self {
            cluster_size: cluster_size as usize,
            file_len,
            state: None,
        }
    }

    /// The cluster compressed in `len` bytes at host offset `off` (below end-of-file), inflated.
    pub fn cluster(&mut self, file: &File, off: u64, len: u64) -> Result<&[u8], String> {
        let cs = self.cluster_size;
        let st = self.state.get_or_insert_with(|| {
            Box::new(State {
                inflater: DecompressorOxide::new(),
                input: vec![0; 2 * cs],
                output: vec![0; cs],
                cached: (u64::MAX, 0),
            })
        });
        if st.cached == (off, len) {
            return Ok(&st.output);
        }
        st.cached = (u64::MAX, 0);
        let key = (off, len);
        // The encoding bounds `len` at 2 clusters; the file may end before it (QEMU does not
        // pad the last compressed cluster).
        let len = len
            .min(st.input.len() as u64)
            .min(self.file_len.saturating_sub(off)) as usize;
        let got = read_up_to(file, &mut st.input[..len], off)
            .map_err(|e| format!("cannot read the compressed cluster at {off:#x}: {e}"))?;
        st.inflater.init();
        let (status, _, out) = decompress(
            &mut st.inflater,
            &st.input[..got],
            &mut st.output,
            0,
            inflate_flags::TINFL_FLAG_USING_NON_WRAPPING_OUTPUT_BUF,
        );
        // A full cluster is what counts: trailing input (padding) is allowed, as in QEMU.
        let ok = out == cs && matches!(status, TINFLStatus::Done | TINFLStatus::HasMoreOutput);
        if !ok {
            return Err(format!(
                "damaged image: the compressed cluster at {off:#x} ({got} bytes) does not inflate \
                 to one cluster ({status:?} after {out} of {cs} bytes)"
            ));
        }
        st.cached = key;
        Ok(&st.output)
    }
}
