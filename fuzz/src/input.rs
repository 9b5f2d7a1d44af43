//! Turning fuzzer bytes into decisions, and seed inputs back into bytes.
//!
//! [`Input`] reads little-endian fields from the front of the data; once the data runs out every
//! field reads as zero, so any byte string is a valid input and libFuzzer's mutations (insert,
//! erase, copy parts) shift decisions around instead of being rejected. [`Seed`] writes the same
//! fields, so seed inputs can be built from meaningful operations (see `seeds.rs`).

/// Fuzzer data read front to back.
pub struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Self { data, pos: 0 }
    }

    /// No bytes left.
    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos = self.pos.saturating_add(1);
        b
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }

    pub fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// A value in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u32) -> u32 {
        debug_assert!(n > 0);
        if n <= 256 {
            u32::from(self.u8()) % n
        } else {
            self.u32() % n
        }
    }

    /// Up to `n` bytes (fewer when the data runs out).
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let start = self.pos.min(self.data.len());
        let end = start.saturating_add(n).min(self.data.len());
        self.pos = self.pos.saturating_add(n);
        &self.data[start..end]
    }

    /// Everything not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        let start = self.pos.min(self.data.len());
        self.pos = self.data.len();
        &self.data[start..]
    }
}

/// Writes fields in the layout [`Input`] reads them.
#[derive(Default, Clone)]
pub struct Seed(pub Vec<u8>);

impl Seed {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_fields_and_zero_past_the_end() {
        let mut s = Seed::new();
        s.u8(7)
            .u16(0x1234)
            .u32(0xdead_beef)
            .u64(u64::MAX - 1)
            .bytes(b"ab");
        let data = s.into_bytes();
        let mut i = Input::new(&data);
        assert_eq!(i.u8(), 7);
        assert_eq!(i.u16(), 0x1234);
        assert_eq!(i.u32(), 0xdead_beef);
        assert_eq!(i.u64(), u64::MAX - 1);
        assert!(!i.is_empty());
        assert_eq!(i.bytes(5), b"ab");
        assert!(i.is_empty());
        assert_eq!(i.u32(), 0);
        assert_eq!(i.bytes(3), b"");
        assert_eq!(i.below(10), 0);
    }
}
