//! Seed inputs: meaningful operation sequences for each target, encoded in the layout the
//! target reads (see [`crate::input`]). `cargo run --features seeds --bin seeds` writes them to
//! `corpus/<target>/seed-*`; libFuzzer starts from them and `cargo fuzz cmin` keeps those that
//! still add coverage.

use crate::input::Seed;

/// `(target, name, bytes)` for every seed.
pub fn all() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut v = Vec::new();
    for (name, bytes) in blk(false) {
        v.push(("blk_raw", name, bytes));
    }
    for (name, bytes) in blk(true) {
        v.push(("blk_overlay", name, bytes));
    }
    v
}

/// Builds `blk_raw` / `blk_overlay` inputs.
pub struct BlkSeed(Seed);

impl BlkSeed {
    /// A disk of `sectors` (1..=96) whole sectors, read-only or not (raw only), on tmpfs or the
    /// temporary directory, with a queue of `4 << qshift` entries.
    pub fn new(ro: bool, sectors: u8, tmp: bool, qshift: u8) -> Self {
        let mut s = Seed::new();
        s.u8(u8::from(ro) | (u8::from(tmp) << 2))
            .u8(sectors - 1)
            .u8(0x3c)
            .u8(qshift);
        Self(s)
    }

    fn sector(&mut self, sector: u8) -> &mut Self {
        self.0.u8(0).u8(sector);
        self
    }

    fn header(&mut self, kind: u8) -> &mut Self {
        self.0.u8(0).u8(kind).u32(0).u8(0).u8(0);
        self
    }

    /// Read or write (`kind` 0 / 1) `nsec` sectors at `sector`, split over `parts` buffers.
    pub fn rw(&mut self, write: bool, sector: u8, nsec: u8, parts: u8) -> &mut Self {
        self.header(u8::from(write)).sector(sector);
        self.0.u8(nsec).u8(0);
        if nsec == 0 {
            self.0.u8(0);
        } else {
            self.0.u8(parts - 1);
            for i in 1..parts {
                self.0.u16(100 * u16::from(i));
            }
        }
        if !write && nsec > 0 {
            self.0.u8(0); // status in its own descriptor
        }
        self.0.u8(0); // 16-byte header
        self
    }

    pub fn flush(&mut self) -> &mut Self {
        self.header(2).sector(0);
        self.0.u8(0).u8(0).u8(200).u8(0).u8(0);
        self
    }

    pub fn get_id(&mut self, len: u8) -> &mut Self {
        self.header(3).sector(0);
        self.0.u8(0).u8(0).u8(len).u8(1).u8(0);
        self
    }

    /// Discard (or write zeroes) with segments `(sector, sectors, unmap)`.
    pub fn discard(&mut self, zeroes: bool, segs: &[(u8, u8, bool)]) -> &mut Self {
        self.header(if zeroes { 5 } else { 4 }).sector(0);
        self.0.u8(segs.len() as u8 - 1);
        for &(s, n, unmap) in segs {
            self.0
                .u8(0)
                .u8(s)
                .u8(0)
                .u8(n)
                .u8(if unmap { 200 } else { 0 });
        }
        self.0.u8(0).u8(0).u8(0);
        self
    }

    pub fn kick(&mut self) -> &mut Self {
        self.0.u8(3);
        self
    }

    pub fn reset(&mut self) -> &mut Self {
        self.0.u8(5);
        self
    }

    pub fn reopen(&mut self) -> &mut Self {
        self.0.u8(6);
        self
    }

    pub fn bytes(&self) -> Vec<u8> {
        self.0 .0.clone()
    }
}

fn blk(overlay: bool) -> Vec<(String, Vec<u8>)> {
    let mut v = Vec::new();
    let mut s = BlkSeed::new(false, 64, false, 2);
    s.rw(true, 3, 2, 2)
        .kick()
        .rw(false, 2, 4, 3)
        .kick()
        .flush()
        .get_id(20)
        .kick();
    v.push(("write-read".to_string(), s.bytes()));
    let mut s = BlkSeed::new(false, 16, true, 1);
    s.rw(true, 0, 8, 1)
        .discard(false, &[(1, 2, false), (6, 1, false)])
        .discard(true, &[(4, 1, true)])
        .rw(false, 0, 8, 4)
        .kick()
        .reopen()
        .rw(false, 0, 8, 2)
        .kick();
    v.push(("discard-zeroes-reopen".to_string(), s.bytes()));
    let mut s = BlkSeed::new(false, 8, false, 0);
    s.rw(false, 7, 2, 1)
        .rw(true, 8, 1, 1)
        .rw(false, 8, 0, 1)
        .kick()
        .reset()
        .get_id(5)
        .kick();
    v.push(("edges-reset".to_string(), s.bytes()));
    if !overlay {
        let mut s = BlkSeed::new(true, 8, false, 0);
        s.rw(true, 0, 1, 1)
            .rw(false, 0, 1, 1)
            .discard(false, &[(0, 1, false)])
            .kick();
        v.push(("read-only".to_string(), s.bytes()));
    }
    v
}
