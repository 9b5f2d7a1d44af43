//! Address-decoded buses for port I/O and MMIO.
//!
//! vCPU threads look up the device that owns an address and call it with the
//! offset into its range. Devices never pick their own address: the device
//! manager inserts them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// A device reachable through a bus. `offset` is relative to the start of the
/// range the device was inserted at.
pub trait BusDevice: Send {
    /// Handle a guest read. `data.len()` is the access width (1, 2, 4 or 8).
    fn read(&mut self, offset: u64, data: &mut [u8]);
    /// Handle a guest write.
    fn write(&mut self, offset: u64, data: &[u8]);
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BusError {
    #[error("bus range {base:#x}+{len:#x} overlaps an existing device")]
    Overlap { base: u64, len: u64 },
    #[error("bus range at {base:#x} has zero length")]
    ZeroLength { base: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Range {
    base: u64,
    len: u64,
}

/// A shared handle to a device on a bus.
pub type SharedDevice = Arc<Mutex<dyn BusDevice>>;

#[derive(Default, Clone)]
pub struct Bus {
    devices: BTreeMap<Range, SharedDevice>,
}

impl Bus {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(&mut self, device: SharedDevice, base: u64, len: u64) -> Result<(), BusError> {
        if len == 0 {
            return Err(BusError::ZeroLength { base });
        }
        let end = base
            .checked_add(len - 1)
            .ok_or(BusError::Overlap { base, len })?;
        // The closest range starting at or below `end` is the only candidate for overlap.
        if let Some((r, _)) = self
            .devices
            .range(
                ..=Range {
                    base: end,
                    len: u64::MAX,
                },
            )
            .next_back()
        {
            if r.base + (r.len - 1) >= base {
                return Err(BusError::Overlap { base, len });
            }
        }
        self.devices.insert(Range { base, len }, device);
        Ok(())
    }

    /// The device covering `addr` and the offset of `addr` inside its range.
    pub fn resolve(&self, addr: u64) -> Option<(&SharedDevice, u64)> {
        let (r, dev) = self
            .devices
            .range(
                ..=Range {
                    base: addr,
                    len: u64::MAX,
                },
            )
            .next_back()?;
        let off = addr - r.base;
        (off < r.len).then_some((dev, off))
    }

    /// Dispatch a read. Returns false (and fills `data` with all-ones) when no
    /// device covers `addr`.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.resolve(addr) {
            Some((dev, off)) => {
                dev.lock()
                    .expect("bus device lock poisoned")
                    .read(off, data);
                true
            }
            None => {
                data.fill(0xff);
                false
            }
        }
    }

    /// Dispatch a write. Returns false when no device covers `addr`.
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.resolve(addr) {
            Some((dev, off)) => {
                dev.lock()
                    .expect("bus device lock poisoned")
                    .write(off, data);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Echo(u8);
    impl BusDevice for Echo {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(self.0.wrapping_add(offset as u8));
        }
        fn write(&mut self, _offset: u64, data: &[u8]) {
            self.0 = data[0];
        }
    }

    fn dev(v: u8) -> SharedDevice {
        Arc::new(Mutex::new(Echo(v)))
    }

    #[test]
    fn lookup_offsets_and_unknown_addresses() {
        let mut bus = Bus::new();
        bus.insert(dev(10), 0x100, 0x10).unwrap();
        bus.insert(dev(20), 0x110, 0x10).unwrap();
        let mut b = [0u8; 1];
        assert!(bus.read(0x103, &mut b));
        assert_eq!(b[0], 13);
        assert!(bus.read(0x110, &mut b));
        assert_eq!(b[0], 20);
        assert!(!bus.read(0x120, &mut b));
        assert_eq!(b[0], 0xff);
        assert!(!bus.read(0xff, &mut b));
        assert!(bus.write(0x11f, &[1]));
        bus.read(0x110, &mut b);
        assert_eq!(b[0], 1);
    }

    #[test]
    fn overlap_and_zero_length_refused() {
        let mut bus = Bus::new();
        bus.insert(dev(0), 0x100, 0x10).unwrap();
        assert!(bus.insert(dev(0), 0x10f, 1).is_err());
        assert!(bus.insert(dev(0), 0xf0, 0x11).is_err());
        assert!(bus.insert(dev(0), 0x80, 0x100).is_err());
        assert_eq!(
            bus.insert(dev(0), 0x200, 0),
            Err(BusError::ZeroLength { base: 0x200 })
        );
        bus.insert(dev(0), 0xf0, 0x10).unwrap();
        bus.insert(dev(0), u64::MAX, 1).unwrap();
    }
}
