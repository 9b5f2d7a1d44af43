//! Assigns virtio-mmio devices their 4 KiB MMIO slot and their GSI.
//!
//! Slots are handed out in order from [`VIRTIO_MMIO_START`] and GSIs from
//! [`VIRTIO_IRQ_FIRST`]; devices never choose their own address. Allocation is
//! two-phase: [`MmioDeviceManager::peek_next`] says what the next device
//! would get, [`MmioDeviceManager::commit`] records it once the device is
//! fully attached, so a failed attach leaves no entry on the command line.
//!
//! The manager's list is the one source of what the guest is told about these devices: the
//! kernel command line's `virtio_mmio.device=` entries ([`MmioDeviceManager::cmdline_entries`])
//! and the DSDT's `LNRO0005` devices ([`MmioDeviceManager::append_aml`]).

use acpi_tables::aml::{Device, Memory32Fixed, Name, Path, ResourceTemplate};
use acpi_tables::Aml;
use serde::{Deserialize, Serialize};

use crate::arch::x86_64::layout::{
    VIRTIO_IRQ_FIRST, VIRTIO_IRQ_LAST, VIRTIO_MMIO_END, VIRTIO_MMIO_SLOT_SIZE, VIRTIO_MMIO_START,
};

/// Allocation errors.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MmioError {
    #[error("no virtio-mmio address left: slots end at {end:#x}")]
    AddressesExhausted { end: u64 },
    #[error("no GSI left for virtio-mmio devices (GSIs {first}..={last} all used)")]
    IrqsExhausted { first: u32, last: u32 },
    #[error("slot {addr:#x}/GSI {irq} is not the next free one")]
    OutOfOrder { addr: u64, irq: u32 },
}

/// One device's MMIO range and GSI.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmioSlot {
    pub addr: u64,
    pub len: u64,
    pub irq: u32,
}

/// An attached device as recorded by the manager.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmioDeviceInfo {
    pub slot: MmioSlot,
    /// Human-readable name for logs, e.g. `virtio-blk(/img/root.raw)`.
    pub name: String,
}

/// Hands out virtio-mmio slots and GSIs in attach order.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MmioDeviceManager {
    next_addr: u64,
    next_irq: u32,
    end: u64,
    last_irq: u32,
    devices: Vec<MmioDeviceInfo>,
}

impl Default for MmioDeviceManager {
    fn default() -> Self {
        Self::new()
    }
}

impl MmioDeviceManager {
    /// The x86_64 layout: slots in `[VIRTIO_MMIO_START, VIRTIO_MMIO_END)`,
    /// GSIs `VIRTIO_IRQ_FIRST..=VIRTIO_IRQ_LAST`.
    pub fn new() -> Self {
        Self::with_limits(
            VIRTIO_MMIO_START,
            VIRTIO_MMIO_END,
            VIRTIO_IRQ_FIRST,
            VIRTIO_IRQ_LAST,
        )
    }

    /// A manager over an explicit window (tests).
    pub fn with_limits(start: u64, end: u64, first_irq: u32, last_irq: u32) -> Self {
        Self {
            next_addr: start,
            next_irq: first_irq,
            end,
            last_irq,
            devices: Vec::new(),
        }
    }

    /// The slot the next device would get, without taking it.
    pub fn peek_next(&self) -> Result<MmioSlot, MmioError> {
        let fits = self
            .next_addr
            .checked_add(VIRTIO_MMIO_SLOT_SIZE)
            .is_some_and(|e| e <= self.end);
        if !fits {
            return Err(MmioError::AddressesExhausted { end: self.end });
        }
        if self.next_irq > self.last_irq {
            return Err(MmioError::IrqsExhausted {
                first: self.next_irq - self.devices.len() as u32,
                last: self.last_irq,
            });
        }
        Ok(MmioSlot {
            addr: self.next_addr,
            len: VIRTIO_MMIO_SLOT_SIZE,
            irq: self.next_irq,
        })
    }

    /// Record `slot` (which must be the one `peek_next` returned) as used.
    pub fn commit(&mut self, slot: MmioSlot, name: String) -> Result<(), MmioError> {
        if self.peek_next()? != slot {
            return Err(MmioError::OutOfOrder {
                addr: slot.addr,
                irq: slot.irq,
            });
        }
        self.next_addr += slot.len;
        self.next_irq += 1;
        self.devices.push(MmioDeviceInfo { slot, name });
        Ok(())
    }

    /// `peek_next` + `commit` in one step.
    pub fn allocate(&mut self, name: &str) -> Result<MmioSlot, MmioError> {
        let slot = self.peek_next()?;
        self.commit(slot, name.to_string())?;
        Ok(slot)
    }

    /// Devices in attach order.
    pub fn devices(&self) -> &[MmioDeviceInfo] {
        &self.devices
    }

    /// Kernel command-line entries, one per device in attach order:
    /// `virtio_mmio.device=4K@0xc0001000:5`.
    pub fn cmdline_entries(&self) -> Vec<String> {
        self.devices
            .iter()
            .map(|d| {
                format!(
                    "virtio_mmio.device={}K@{:#x}:{}",
                    d.slot.len / 1024,
                    d.slot.addr,
                    d.slot.irq
                )
            })
            .collect()
    }

    /// Appends one DSDT device per device in attach order (inside `\_SB`): `V000`, `V001`, ...
    /// with `_HID "LNRO0005"` (virtio-mmio, as Linux's `virtio_mmio` driver matches it), `_UID`
    /// = the index, and `_CRS`: the slot as a read-write `Memory32Fixed`, the GSI as an
    /// edge-triggered, active-high interrupt.
    pub fn append_aml(&self, sink: &mut Vec<u8>) {
        for (i, d) in self.devices.iter().enumerate() {
            // The x86_64 window is below 4 GiB and holds far fewer than 0x1000 slots; a
            // manager made with other limits skips what a DSDT cannot name.
            let (Ok(base), Ok(len)) = (u32::try_from(d.slot.addr), u32::try_from(d.slot.len))
            else {
                log::warn!(
                    "{}: slot {:#x} is above 4 GiB; not in the DSDT",
                    d.name,
                    d.slot.addr
                );
                continue;
            };
            if i >= 0x1000 {
                break;
            }
            Device::new(
                Path::new(&format!("V{i:03X}")),
                vec![
                    &Name::new("_HID".into(), &"LNRO0005"),
                    &Name::new("_UID".into(), &(i as u32)),
                    &Name::new(
                        "_CRS".into(),
                        &ResourceTemplate::new(vec![
                            &Memory32Fixed::new(true, base, len),
                            &crate::acpi::aml::edge_interrupt(d.slot.irq),
                        ]),
                    ),
                ],
            )
            .to_aml_bytes(sink);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_and_irqs_in_order_with_cmdline() {
        let mut m = MmioDeviceManager::new();
        let a = m.allocate("a").unwrap();
        let b = m.allocate("b").unwrap();
        assert_eq!(
            a,
            MmioSlot {
                addr: 0xc000_1000,
                len: 0x1000,
                irq: 5
            }
        );
        assert_eq!(
            b,
            MmioSlot {
                addr: 0xc000_2000,
                len: 0x1000,
                irq: 6
            }
        );
        assert_eq!(
            m.cmdline_entries(),
            vec![
                "virtio_mmio.device=4K@0xc0001000:5",
                "virtio_mmio.device=4K@0xc0002000:6"
            ]
        );
    }

    #[test]
    fn peek_does_not_consume_and_commit_checks_order() {
        let mut m = MmioDeviceManager::new();
        let s = m.peek_next().unwrap();
        assert_eq!(m.peek_next().unwrap(), s);
        assert!(m.cmdline_entries().is_empty());
        let wrong = MmioSlot { irq: 9, ..s };
        assert_eq!(
            m.commit(wrong, "x".into()),
            Err(MmioError::OutOfOrder {
                addr: s.addr,
                irq: 9
            })
        );
        m.commit(s, "x".into()).unwrap();
        assert_eq!(m.peek_next().unwrap().addr, s.addr + 0x1000);
    }

    #[test]
    fn irqs_exhausted_after_nineteen_devices() {
        let mut m = MmioDeviceManager::new();
        for i in 0..(VIRTIO_IRQ_LAST - VIRTIO_IRQ_FIRST + 1) {
            assert_eq!(m.allocate("d").unwrap().irq, VIRTIO_IRQ_FIRST + i);
        }
        assert_eq!(
            m.allocate("d"),
            Err(MmioError::IrqsExhausted { first: 5, last: 23 })
        );
        assert_eq!(m.devices().len(), 19);
    }

    #[test]
    fn addresses_exhausted() {
        let mut m = MmioDeviceManager::with_limits(0x1000, 0x3000, 5, 100);
        m.allocate("a").unwrap();
        m.allocate("b").unwrap();
        assert_eq!(
            m.allocate("c"),
            Err(MmioError::AddressesExhausted { end: 0x3000 })
        );
        let mut m = MmioDeviceManager::with_limits(u64::MAX - 0x800, u64::MAX, 5, 100);
        assert!(matches!(
            m.allocate("a"),
            Err(MmioError::AddressesExhausted { .. })
        ));
    }
}
