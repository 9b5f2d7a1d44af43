//! L1/L2 lookup: which host cluster holds a guest cluster.
//!
//! Tables are read in pages of at most 4 KiB (for clusters under 4 KiB a page is a whole
//! table) through a cache of [`CACHE_PAGES`] pages: at most
//! 512 KiB, whatever the image says. With 64 KiB clusters one page of an L2 table maps
//! 32 MiB of the disk, so sequential reads fetch a table page once per 32 MiB. L1 pages go
//! through the same cache, so the L1 table is never read whole.

use std::fs::File;

use super::header::{read_up_to, Header};

/// Pages held by the cache.
pub const CACHE_PAGES: usize = 128;
/// Largest page (bytes).
const MAX_PAGE: u64 = 4096;

/// Bits 9..=55 of L1 and standard L2 entries: a host offset.
const OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;
/// L2 entry: the cluster is compressed.
const L2_COMPRESSED: u64 = 1 << 62;
/// L2 entry (version 3): the cluster reads as zeroes.
const L2_ZERO: u64 = 1;

/// Where the data of one guest cluster is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mapping {
    /// Unallocated, or a zero cluster: reads as zeroes.
    Zero,
    /// A whole cluster at this host offset (cluster-aligned, below end-of-file).
    Data(u64),
    /// Compressed: `len` bytes at host offset `off` (`off` below end-of-file; `len` at most
    /// twice the cluster size, by the encoding).
    Compressed { off: u64, len: u64 },
}

struct Page {
    /// File offset of the page; `u64::MAX` when the slot is empty.
    off: u64,
    last_used: u64,
    data: Vec<u8>,
}

/// The table cache and lookup.
pub struct Tables {
    cluster_bits: u32,
    version: u32,
    l1_size: u64,
    l1_offset: u64,
    file_len: u64,
    page: u64,
    pages: Vec<Page>,
    tick: u64,
}

impl Tables {
    pub fn new(h: &Header, file_len: u64) -> Self {
        Self {
            cluster_bits: h.cluster_bits,
            version: h.version,
            l1_size: h.l1_size,
            l1_offset: h.l1_offset,
            file_len,
            page: h.cluster_size().min(MAX_PAGE),
            pages: Vec::new(),
            tick: 0,
        }
    }

    /// The big-endian 8-byte entry `index` of the table at `table` (cluster-aligned).
    fn entry(&mut self, file: &File, table: u64, index: u64) -> Result<u64, String> {
        let at = index
            .checked_mul(8)
            .and_then(|b| b.checked_add(table))
            .filter(|&a| a.checked_add(8).is_some_and(|end| end <= self.file_len))
            .ok_or_else(|| {
                format!(
                    "table entry {index} of the table at {table:#x} lies beyond the end of the \
                     file ({} bytes; truncated or damaged image)",
                    self.file_len
                )
            })?;
        // Tables are cluster-aligned and a page divides a cluster: a page never spans two.
        let page_off = at - at % self.page;
        self.tick += 1;
        let slot = match self.pages.iter().position(|p| p.off == page_off) {
            Some(i) => i,
            None => self.load(file, page_off)?,
        };
        let p = &mut self.pages[slot];
        p.last_used = self.tick;
        let i = (at - page_off) as usize;
        let b: [u8; 8] = p.data[i..i + 8].try_into().map_err(|_| "page size")?;
        Ok(u64::from_be_bytes(b))
    }

    /// Reads the page at `off` into a free or the least recently used slot.
    fn load(&mut self, file: &File, off: u64) -> Result<usize, String> {
        let slot = if self.pages.len() < CACHE_PAGES {
            self.pages.push(Page {
                off: u64::MAX,
                last_used: 0,
                data: vec![0; self.page as usize],
            });
            self.pages.len() - 1
        } else {
            self.pages
                .iter()
                .enumerate()
                .min_by_key(|(_, p)| p.last_used)
                .map_or(0, |(i, _)| i)
        };
        let p = &mut self.pages[slot];
        p.off = u64::MAX;
        let n = read_up_to(file, &mut p.data, off)
            .map_err(|e| format!("cannot read the table page at {off:#x}: {e}"))?;
        // Past end-of-file (only beyond the entries checked in `entry`): zeroes.
        p.data[n..].fill(0);
        p.off = off;
        Ok(slot)
    }

    /// Where guest cluster `cluster` is.
    pub fn lookup(&mut self, file: &File, cluster: u64) -> Result<Mapping, String> {
        let l2_bits = self.cluster_bits - 3;
        let l1_index = cluster >> l2_bits;
        if l1_index >= self.l1_size {
            // The header check makes the L1 table cover the virtual size.
            return Err(format!("cluster {cluster} is outside the L1 table"));
        }
        let l1e = self.entry(file, self.l1_offset, l1_index)?;
        let l2 = l1e & OFFSET_MASK;
        if l2 == 0 {
            return Ok(Mapping::Zero);
        }
        let cluster_size = 1u64 << self.cluster_bits;
        if !l2.is_multiple_of(cluster_size) {
            return Err(format!(
                "damaged image: L1 entry {l1_index} points to an L2 table at {l2:#x}, which is \
                 not cluster-aligned"
            ));
        }
        let l2e = self.entry(file, l2, cluster & ((1 << l2_bits) - 1))?;
        self.decode(cluster, l2e)
    }

    fn decode(&self, cluster: u64, e: u64) -> Result<Mapping, String> {
        let cluster_size = 1u64 << self.cluster_bits;
        if e & L2_COMPRESSED != 0 {
            // Bits 0..x: host offset; bits x..62: additional 512-byte sectors.
            let x = 62 - (self.cluster_bits - 8);
            let off = e & ((1 << x) - 1);
            let sectors = ((e >> x) & ((1 << (self.cluster_bits - 8)) - 1)) + 1;
            let len = sectors * 512 - (off & 511);
            if off >= self.file_len {
                return Err(format!(
                    "damaged image: compressed cluster {cluster} at {off:#x} lies beyond the end \
                     of the file ({} bytes)",
                    self.file_len
                ));
            }
            return Ok(Mapping::Compressed { off, len });
        }
        if e & L2_ZERO != 0 {
            if self.version >= 3 {
                return Ok(Mapping::Zero);
            }
            return Err(format!(
                "damaged image: L2 entry of cluster {cluster} has the zero flag, which version 2 \
                 does not have"
            ));
        }
        let off = e & OFFSET_MASK;
        if off == 0 {
            return Ok(Mapping::Zero);
        }
        if !off.is_multiple_of(cluster_size) {
            return Err(format!(
                "damaged image: cluster {cluster} at {off:#x} is not cluster-aligned"
            ));
        }
        if off >= self.file_len {
            return Err(format!(
                "damaged image: cluster {cluster} at {off:#x} lies beyond the end of the file \
                 ({} bytes)",
                self.file_len
            ));
        }
        Ok(Mapping::Data(off))
    }
}
