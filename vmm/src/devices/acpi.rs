//! The ACPI platform registers the FADT and the DSDT point at: four byte-wide I/O ports at
//! [`ACPI_PM_PORT`](crate::arch::x86_64::layout::ACPI_PM_PORT).
//!
//! | offset | register | guest access |
//! |---|---|---|
//! | 0 | GED event | read: pending events (bit 0: power button, bit 1: VM generation ID changed), cleared by the read; the DSDT's `\_SB.GED._EVT` reads it |
//! | 1 | sleep control (FADT `SLEEP_CONTROL_REG`) | write `SLP_TYP << 2 \| SLP_EN`: with `SLP_TYP` = [`S5_SLP_TYP`] the VM ends as a guest power-off |
//! | 2 | sleep status (FADT `SLEEP_STATUS_REG`) | reads 0 (never woken); writes ignored |
//! | 3 | reset (FADT `RESET_REG`) | write [`RESET_VALUE`]: the VM ends as a guest reset |
//!
//! Unlike virtio device I/O (never on vCPU threads), these registers are handled inline on the
//! vCPU thread that touches them, as the i8042 and the UART are: each access is a few
//! instructions and at most one eventfd write, nothing that blocks.
//!
//! Every access of any width at any offset is accepted: a read returns the register bytes it
//! covers (0 past the end), a write acts byte by byte on the registers it covers.

use std::convert::Infallible;

use serde::{Deserialize, Serialize};

use crate::devices::bus::BusDevice;
use crate::devices::interrupt::{IrqLine, PowerOffLine, ResetLine};
use crate::persist::Persist;

pub const REG_GED_EVENT: u64 = 0;
pub const REG_SLEEP_CONTROL: u64 = 1;
pub const REG_SLEEP_STATUS: u64 = 2;
pub const REG_RESET: u64 = 3;
/// Number of registers (bytes).
pub const REG_COUNT: u64 = 4;

/// The GED event bit of the power button.
pub const EVENT_POWER_BUTTON: u8 = 1 << 0;
/// The GED event bit of a new VM generation ID (`_EVT` notifies `\_SB.VGEN`).
pub const EVENT_VMGENID: u8 = 1 << 1;
/// What the guest writes to the reset register (the FADT's `RESET_VALUE`).
pub const RESET_VALUE: u8 = 0x42;
/// The `SLP_TYP` of S5 (soft off), as the DSDT's `\_S5_` package gives it.
pub const S5_SLP_TYP: u8 = 5;
/// Sleep control register fields (ACPI 6.5 §4.8.3.7).
const SLP_TYP_SHIFT: u8 = 2;
const SLP_TYP_MASK: u8 = 0x7 << SLP_TYP_SHIFT;
const SLP_EN: u8 = 1 << 5;

/// What a snapshot keeps of the device: the events the guest has not read yet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcpiPmState {
    pub ged_pending: u8,
}

/// The GED event, sleep and reset registers.
pub struct AcpiPmDevice {
    ged_pending: u8,
    ged_irq: IrqLine,
    reset: ResetLine,
    poweroff: PowerOffLine,
}

/// What restored registers get from the new VM: as [`AcpiPmDevice::new`].
pub struct AcpiPmArgs {
    pub ged_irq: IrqLine,
    pub reset: ResetLine,
    pub poweroff: PowerOffLine,
}

impl Persist for AcpiPmDevice {
    type State = AcpiPmState;
    type Args<'a> = AcpiPmArgs;
    /// Any pending events are taken.
    type Error = Infallible;

    fn save(&self) -> AcpiPmState {
        AcpiPmState {
            ged_pending: self.ged_pending,
        }
    }

    /// Registers with the saved pending events; the interrupt is raised again by
    /// [`AcpiPmDevice::raise_if_pending`].
    fn restore(args: AcpiPmArgs, s: &AcpiPmState) -> Result<Self, Infallible> {
        let mut d = Self::new(args.ged_irq, args.reset, args.poweroff);
        d.ged_pending = s.ged_pending;
        Ok(d)
    }
}

impl AcpiPmDevice {
    /// `ged_irq`: the GED's interrupt; `reset` / `poweroff` are raised when the guest resets /
    /// powers off through the registers.
    pub fn new(ged_irq: IrqLine, reset: ResetLine, poweroff: PowerOffLine) -> Self {
        Self {
            ged_pending: 0,
            ged_irq,
            reset,
            poweroff,
        }
    }

    /// Presses the power button: records the event and raises the GED interrupt; the guest's
    /// `_EVT` method reads the event and notifies the power button device.
    pub fn press_power_button(&mut self) -> std::io::Result<()> {
        self.ged_pending |= EVENT_POWER_BUTTON;
        self.ged_irq.trigger()
    }

    /// Records that the VM generation ID changed, without raising the interrupt: a restore
    /// queues it before the vCPUs' interrupt controllers are restored, and
    /// [`AcpiPmDevice::raise_if_pending`] raises it once they are.
    pub fn queue_generation_change(&mut self) {
        self.ged_pending |= EVENT_VMGENID;
    }

    /// No event pending (an in-place reboot).
    pub fn reset(&mut self) {
        self.ged_pending = 0;
    }

    /// After a restore: raises the GED interrupt again while an event waits to be read (the
    /// edge may have been taken but not handled; an extra one only makes `_EVT` read 0).
    pub fn raise_if_pending(&self) {
        if self.ged_pending != 0 {
            if let Err(e) = self.ged_irq.trigger() {
                log::warn!("re-raising the GED interrupt: {e}");
            }
        }
    }

    fn read_reg(&mut self, reg: u64) -> u8 {
        match reg {
            REG_GED_EVENT => std::mem::take(&mut self.ged_pending),
            _ => 0,
        }
    }

    fn write_reg(&mut self, reg: u64, v: u8) {
        match reg {
            REG_SLEEP_CONTROL if v & SLP_EN != 0 => {
                let typ = (v & SLP_TYP_MASK) >> SLP_TYP_SHIFT;
                if typ == S5_SLP_TYP {
                    log::debug!("ACPI: the guest entered S5");
                    if let Err(e) = self.poweroff.raise() {
                        log::error!("ACPI power-off: {e}");
                    }
                } else {
                    log::debug!("ACPI: sleep type {typ} is not supported; ignored");
                }
            }
            REG_RESET if v == RESET_VALUE => {
                log::debug!("ACPI: the guest wrote the reset register");
                if let Err(e) = self.reset.raise() {
                    log::error!("ACPI reset: {e}");
                }
            }
            _ => {}
        }
    }
}

impl BusDevice for AcpiPmDevice {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        for (i, b) in data.iter_mut().enumerate() {
            *b = offset
                .checked_add(i as u64)
                .map_or(0, |reg| self.read_reg(reg));
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        for (i, &v) in data.iter().enumerate() {
            if let Some(reg) = offset.checked_add(i as u64) {
                self.write_reg(reg, v);
            }
        }
    }

    fn register_name(&self, offset: u64) -> Option<&'static str> {
        Some(match offset {
            REG_GED_EVENT => "ged-event",
            REG_SLEEP_CONTROL => "sleep-control",
            REG_SLEEP_STATUS => "sleep-status",
            REG_RESET => "reset",
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev() -> (AcpiPmDevice, IrqLine, ResetLine, PowerOffLine) {
        let irq = IrqLine::new(3).unwrap();
        let reset = ResetLine::new().unwrap();
        let off = PowerOffLine::new().unwrap();
        (
            AcpiPmDevice::new(irq.clone(), reset.clone(), off.clone()),
            irq,
            reset,
            off,
        )
    }

    #[test]
    fn power_button_event_is_read_once_and_raises_the_irq() {
        let (mut d, irq, _, _) = dev();
        let mut b = [0xffu8];
        d.read(REG_GED_EVENT, &mut b);
        assert_eq!(b, [0]);
        d.press_power_button().unwrap();
        assert_eq!(irq.eventfd().read().unwrap(), 1);
        assert_eq!(d.save().ged_pending, EVENT_POWER_BUTTON);
        d.read(REG_GED_EVENT, &mut b);
        assert_eq!(b, [EVENT_POWER_BUTTON]);
        d.read(REG_GED_EVENT, &mut b);
        assert_eq!(b, [0]);
    }

    #[test]
    fn s5_powers_off_other_sleep_types_do_not() {
        let (mut d, _, reset, off) = dev();
        // S3 (SLP_TYP 3) and S5 without SLP_EN: nothing.
        d.write(REG_SLEEP_CONTROL, &[(3 << 2) | SLP_EN]);
        d.write(REG_SLEEP_CONTROL, &[S5_SLP_TYP << 2]);
        assert!(off.eventfd().read().is_err());
        // What Linux's acpi_hw_extended_sleep writes: clear the wake status, then S5 | SLP_EN.
        d.write(REG_SLEEP_STATUS, &[0x80]);
        d.write(REG_SLEEP_CONTROL, &[(S5_SLP_TYP << 2) | SLP_EN]);
        assert!(off.is_raised(), "the vCPU that wrote it holds");
        assert_eq!(off.eventfd().read().unwrap(), 1);
        assert!(reset.eventfd().read().is_err());
    }

    #[test]
    fn reset_value_resets_anything_else_is_ignored() {
        let (mut d, _, reset, off) = dev();
        d.write(REG_RESET, &[0x41]);
        assert!(reset.eventfd().read().is_err());
        assert!(!reset.is_raised());
        d.write(REG_RESET, &[RESET_VALUE]);
        assert!(reset.is_raised(), "the vCPU that wrote it holds");
        assert_eq!(reset.eventfd().read().unwrap(), 1);
        assert!(off.eventfd().read().is_err());
    }

    #[test]
    fn any_width_and_offset_is_handled() {
        let (mut d, _, reset, off) = dev();
        d.press_power_button().unwrap();
        // A 4-byte read from offset 0 covers all registers and clears the event.
        let mut four = [0xffu8; 4];
        d.read(0, &mut four);
        assert_eq!(four, [EVENT_POWER_BUTTON, 0, 0, 0]);
        // Past the end and at the top of the address space: zeros, no panic.
        let mut eight = [0xffu8; 8];
        d.read(u64::MAX - 2, &mut eight);
        assert_eq!(eight, [0; 8]);
        d.write(u64::MAX - 2, &[0xff; 8]);
        // A dword write at offset 0 that carries S5|SLP_EN in byte 1 and the reset value in
        // byte 3 does both, byte by byte.
        d.write(0, &[0, (S5_SLP_TYP << 2) | SLP_EN, 0, RESET_VALUE]);
        assert_eq!(off.eventfd().read().unwrap(), 1);
        assert_eq!(reset.eventfd().read().unwrap(), 1);
        assert_eq!(d.register_name(1), Some("sleep-control"));
        assert_eq!(d.register_name(9), None);
    }

    #[test]
    fn a_generation_change_is_queued_then_raised_and_read_with_the_button() {
        let (mut d, irq, _, _) = dev();
        d.queue_generation_change();
        assert!(irq.eventfd().read().is_err(), "queued, not raised");
        d.raise_if_pending();
        assert_eq!(irq.eventfd().read().unwrap(), 1);
        d.press_power_button().unwrap();
        let mut b = [0u8];
        d.read(REG_GED_EVENT, &mut b);
        assert_eq!(b, [EVENT_VMGENID | EVENT_POWER_BUTTON]);
        d.read(REG_GED_EVENT, &mut b);
        assert_eq!(b, [0]);
    }

    #[test]
    fn state_round_trip_re_raises_a_pending_event() {
        let (mut d, irq, _, _) = dev();
        d.press_power_button().unwrap();
        let _ = irq.eventfd().read();
        let st = d.save();
        let (_, irq2, reset, poweroff) = dev();
        let args = AcpiPmArgs {
            ged_irq: irq2.clone(),
            reset,
            poweroff,
        };
        let Ok(mut r) = AcpiPmDevice::restore(args, &st);
        assert_eq!(r.save(), st);
        r.raise_if_pending();
        assert_eq!(irq2.eventfd().read().unwrap(), 1);
        let mut b = [0u8];
        r.read(REG_GED_EVENT, &mut b);
        assert_eq!(b, [EVENT_POWER_BUTTON]);
        r.raise_if_pending();
        assert!(irq2.eventfd().read().is_err());
    }
}
