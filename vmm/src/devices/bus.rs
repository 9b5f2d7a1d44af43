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
    /// The name of the register at `offset`, for exit statistics.
    fn register_name(&self, _offset: u64) -> Option<&'static str> {
        None
    }
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

#[derive(Clone)]
struct Entry {
    device: SharedDevice,
    name: String,
}

#[derive(Default, Clone)]
pub struct Bus {
    devices: BTreeMap<Range, Entry>,
}

impl Bus {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(&mut self, device: SharedDevice, base: u64, len: u64) -> Result<(), BusError> {
        self.insert_named(device, base, len, format!("device@{base:#x}"))
    }

    /// Like [`Bus::insert`], with the name exit statistics show for the device.
    pub fn insert_named(
        &mut self,
        device: SharedDevice,
        base: u64,
        len: u64,
        name: impl Into<String>,
    ) -> Result<(), BusError> {
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
        self.devices.insert(
            Range { base, len },
            Entry {
                device,
                name: name.into(),
            },
        );
        Ok(())
    }

    /// The device covering `addr` and the offset of `addr` inside its range.
    pub fn resolve(&self, addr: u64) -> Option<(&SharedDevice, u64)> {
        self.entry(addr).map(|(e, off)| (&e.device, off))
    }

    fn entry(&self, addr: u64) -> Option<(&Entry, u64)> {
        let (r, e) = self
            .devices
            .range(
                ..=Range {
                    base: addr,
                    len: u64::MAX,
                },
            )
            .next_back()?;
        let off = addr - r.base;
        (off < r.len).then_some((e, off))
    }

    /// (device name, register) of `addr`: the register's name when the device knows it, else
    /// the offset. None when no device covers `addr`.
    pub fn describe(&self, addr: u64) -> Option<(String, String)> {
        let (e, off) = self.entry(addr)?;
        let reg = match e.device.lock() {
            Ok(d) => d.register_name(off),
            Err(_) => None,
        };
        Some((
            e.name.clone(),
            reg.map_or_else(|| format!("+{off:#x}"), str::to_string),
        ))
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
    fn describe_names_device_and_offset() {
        struct Named;
        impl BusDevice for Named {
            fn read(&mut self, _: u64, _: &mut [u8]) {}
            fn write(&mut self, _: u64, _: &[u8]) {}
            fn register_name(&self, offset: u64) -> Option<&'static str> {
                (offset == 5).then_some("LSR")
            }
        }
        let mut bus = Bus::new();
        bus.insert_named(Arc::new(Mutex::new(Named)), 0x3f8, 8, "serial")
            .unwrap();
        bus.insert(dev(1), 0x60, 1).unwrap();
        assert_eq!(bus.describe(0x3fd), Some(("serial".into(), "LSR".into())));
        assert_eq!(bus.describe(0x3f9), Some(("serial".into(), "+0x1".into())));
        assert_eq!(
            bus.describe(0x60),
            Some(("device@0x60".into(), "+0x0".into()))
        );
        assert_eq!(bus.describe(0x61), None);
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
