//! A minimal i8042 keyboard controller: enough for the guest to reset the
//! machine (`reboot=k` writes 0xFE to port 0x64) and for the VMM to inject
//! Ctrl-Alt-Del (graceful shutdown request).
//!
//! Inserted on the PIO bus at 0x60 with a length of 5, so offset 0 is the data
//! port (0x60) and offset 4 the status/command port (0x64).

use std::collections::VecDeque;
use std::convert::Infallible;

use crate::devices::bus::BusDevice;
use crate::devices::interrupt::{IrqLine, ResetLine};
use crate::persist::Persist;

const OFS_DATA: u64 = 0;
const OFS_STATUS: u64 = 4;

const CMD_READ_CTR: u8 = 0x20;
const CMD_WRITE_CTR: u8 = 0x60;
const CMD_DISABLE_AUX: u8 = 0xa7;
const CMD_ENABLE_AUX: u8 = 0xa8;
const CMD_TEST_AUX: u8 = 0xa9;
const CMD_SELF_TEST: u8 = 0xaa;
const CMD_TEST_KBD: u8 = 0xab;
const CMD_DISABLE_KBD: u8 = 0xad;
const CMD_ENABLE_KBD: u8 = 0xae;
const CMD_READ_OUTP: u8 = 0xd0;
const CMD_WRITE_OUTP: u8 = 0xd1;
const CMD_RESET_CPU: u8 = 0xfe;

const SB_OUT_DATA_AVAIL: u8 = 0x01;
const SB_I8042_CMD_DATA: u8 = 0x08;
const SB_KBD_ENABLED: u8 = 0x10;

const CTR_KBD_INT: u8 = 0x01;
const CTR_SYSTEM_FLAG: u8 = 0x04;
/// The controller translates keyboard scancode set 2 to set 1 (PC firmware leaves this on,
/// and Linux's i8042 driver assumes it unless booted with `i8042.direct`).
const CTR_XLATE: u8 = 0x40;
const CTR_KBD_DISABLE: u8 = 0x10;

const KBD_ACK: u8 = 0xfa;
const KBD_CMD_SETLEDS: u8 = 0xed;
const KBD_CMD_SCANSET: u8 = 0xf0;
const KBD_CMD_GETID: u8 = 0xf2;
const KBD_CMD_SETREP: u8 = 0xf3;
const KBD_CMD_RESET: u8 = 0xff;
/// An MF2 keyboard with translation, as PC firmware reports it.
const KBD_ID: [u8; 2] = [0xab, 0x83];
const KBD_SCANSET_2: u8 = 0x02;
const KBD_RESET_OK: u8 = 0xaa;
const SELF_TEST_OK: u8 = 0x55;

/// Ctrl, Alt, Delete pressed, then released, in scancode set 2 (what the keyboard sends).
pub const CTRL_ALT_DEL_SET2: [u8; 11] = [
    0x14, 0x11, 0xe0, 0x71, 0xe0, 0xf0, 0x71, 0xf0, 0x11, 0xf0, 0x14,
];
/// The same keys as the guest reads them with translation on (scancode set 1).
pub const CTRL_ALT_DEL_SET1: [u8; 8] = [0x1d, 0x38, 0xe0, 0x53, 0xe0, 0xd3, 0xb8, 0x9d];

/// Buffer bound: a stuck guest cannot make the VMM grow memory.
const OUT_BUF_MAX: usize = 64;

pub struct I8042Device {
    reset: ResetLine,
    irq: IrqLine,
    status: u8,
    ctr: u8,
    cmd: u8,
    outp: u8,
    buf: VecDeque<u8>,
    /// The keyboard command whose parameter byte comes next.
    kbd_param_for: Option<u8>,
}

/// The controller's registers and output buffer, for snapshots.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct I8042State {
    pub status: u8,
    pub ctr: u8,
    pub cmd: u8,
    pub outp: u8,
    pub buf: Vec<u8>,
    pub kbd_param_for: Option<u8>,
}

/// What a restored controller gets from the new VM: the line its reset command raises and its
/// interrupt line.
pub struct I8042Args {
    pub reset: ResetLine,
    pub irq: IrqLine,
}

impl Persist for I8042Device {
    type State = I8042State;
    type Args<'a> = I8042Args;
    /// Any saved state is taken (the output buffer bounded as always).
    type Error = Infallible;

    /// The registers and pending output bytes.
    fn save(&self) -> I8042State {
        I8042State {
            status: self.status,
            ctr: self.ctr,
            cmd: self.cmd,
            outp: self.outp,
            buf: self.buf.iter().copied().collect(),
            kbd_param_for: self.kbd_param_for,
        }
    }

    /// A controller with the saved registers and output buffer.
    fn restore(args: I8042Args, s: &I8042State) -> Result<Self, Infallible> {
        let mut d = Self::new(args.reset, args.irq);
        d.status = s.status;
        d.ctr = s.ctr;
        d.cmd = s.cmd;
        d.outp = s.outp;
        d.buf = s.buf.iter().copied().take(OUT_BUF_MAX).collect();
        d.kbd_param_for = s.kbd_param_for;
        Ok(d)
    }
}

impl I8042Device {
    /// Back to the power-on registers, nothing buffered (an in-place reboot).
    pub fn reset(&mut self) {
        self.status = SB_KBD_ENABLED;
        self.ctr = CTR_KBD_INT | CTR_SYSTEM_FLAG | CTR_XLATE;
        self.cmd = 0;
        self.outp = 0;
        self.buf.clear();
        self.kbd_param_for = None;
    }

    /// Raises the interrupt when bytes wait for the guest and it has keyboard interrupts on.
    pub fn raise_if_pending(&self) {
        self.raise_if_enabled();
    }

    /// `reset` is raised when the guest asks for a CPU reset.
    pub fn new(reset: ResetLine, irq: IrqLine) -> Self {
        let mut d = Self {
            reset,
            irq,
            status: 0,
            ctr: 0,
            cmd: 0,
            outp: 0,
            buf: VecDeque::new(),
            kbd_param_for: None,
        };
        d.reset();
        d
    }

    fn push(&mut self, b: u8) {
        if self.buf.len() < OUT_BUF_MAX {
            self.buf.push_back(b);
        }
        self.status |= SB_OUT_DATA_AVAIL;
    }

    fn raise_if_enabled(&self) {
        if self.ctr & CTR_KBD_INT != 0 && self.ctr & CTR_KBD_DISABLE == 0 && !self.buf.is_empty() {
            let _ = self.irq.trigger();
        }
    }

    /// Queues the Ctrl-Alt-Del key sequence and interrupts the guest.
    pub fn trigger_ctrl_alt_del(&mut self) {
        if self.ctr & CTR_XLATE != 0 {
            self.push_all(&CTRL_ALT_DEL_SET1);
        } else {
            self.push_all(&CTRL_ALT_DEL_SET2);
        }
        self.raise_if_enabled();
    }

    fn pop(&mut self) -> u8 {
        let b = self.buf.pop_front().unwrap_or(0);
        if self.buf.is_empty() {
            self.status &= !SB_OUT_DATA_AVAIL;
        } else {
            self.raise_if_enabled();
        }
        b
    }

    fn command(&mut self, cmd: u8) {
        self.cmd = 0;
        self.status |= SB_I8042_CMD_DATA;
        match cmd {
            CMD_READ_CTR => self.push(self.ctr),
            CMD_WRITE_CTR | CMD_WRITE_OUTP => self.cmd = cmd,
            CMD_READ_OUTP => self.push(self.outp),
            CMD_SELF_TEST => self.push(SELF_TEST_OK),
            CMD_TEST_KBD | CMD_TEST_AUX => self.push(0),
            CMD_DISABLE_KBD => self.ctr |= CTR_KBD_DISABLE,
            CMD_ENABLE_KBD => self.ctr &= !CTR_KBD_DISABLE,
            CMD_DISABLE_AUX | CMD_ENABLE_AUX => {}
            CMD_RESET_CPU => {
                crate::guest_log!(
                    log::Level::Info,
                    "guest requested a reset through the i8042"
                );
                if let Err(e) = self.reset.raise() {
                    log::error!("i8042: signalling reset: {e}");
                }
            }
            other => crate::guest_log!(log::Level::Debug, "i8042: ignoring command {other:#x}"),
        }
    }

    fn data_write(&mut self, v: u8) {
        self.status &= !SB_I8042_CMD_DATA;
        match std::mem::take(&mut self.cmd) {
            CMD_WRITE_CTR => self.ctr = v,
            CMD_WRITE_OUTP => self.outp = v,
            _ => {
                self.keyboard_byte(v);
                self.raise_if_enabled();
            }
        }
    }

    /// A byte sent to the PS/2 keyboard behind the controller. Answers the commands
    /// Linux's atkbd driver sends while probing, so it never waits for a timeout.
    fn keyboard_byte(&mut self, v: u8) {
        if let Some(cmd) = self.kbd_param_for.take() {
            // The parameter of SETLEDS / SETREP / SCANCODE SET.
            self.push(KBD_ACK);
            if cmd == KBD_CMD_SCANSET && v == 0 {
                self.push(KBD_SCANSET_2);
            }
            return;
        }
        self.push(KBD_ACK);
        match v {
            KBD_CMD_RESET => self.push(KBD_RESET_OK),
            KBD_CMD_GETID => self.push_all(&KBD_ID),
            KBD_CMD_SETLEDS | KBD_CMD_SETREP | KBD_CMD_SCANSET => self.kbd_param_for = Some(v),
            _ => {}
        }
    }

    fn push_all(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.push(*b);
        }
    }
}

impl BusDevice for I8042Device {
    fn register_name(&self, offset: u64) -> Option<&'static str> {
        match offset {
            OFS_DATA => Some("data"),
            OFS_STATUS => Some("status/command"),
            _ => None,
        }
    }

    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0xff);
        let v = match offset {
            OFS_DATA => self.pop(),
            OFS_STATUS => self.status,
            _ => return,
        };
        if let Some(d) = data.first_mut() {
            *d = v;
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let Some(v) = data.first().copied() else {
            return;
        };
        match offset {
            OFS_DATA => self.data_write(v),
            OFS_STATUS => self.command(v),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev() -> (I8042Device, ResetLine, IrqLine) {
        let reset = ResetLine::new().unwrap();
        let irq = IrqLine::new(1).unwrap();
        (I8042Device::new(reset.clone(), irq.clone()), reset, irq)
    }

    fn rd(d: &mut I8042Device, off: u64) -> u8 {
        let mut b = [0u8];
        d.read(off, &mut b);
        b[0]
    }

    #[test]
    fn reset_command_signals() {
        let (mut d, reset, _) = dev();
        assert!(
            reset.eventfd().read().is_err(),
            "no reset before the command"
        );
        assert!(!reset.is_raised());
        d.write(OFS_STATUS, &[CMD_RESET_CPU]);
        assert!(reset.is_raised(), "the vCPU that wrote it holds");
        assert_eq!(reset.eventfd().read().unwrap(), 1);
    }

    #[test]
    fn ctrl_alt_del_is_delivered_with_interrupt() {
        let (mut d, _, irq) = dev();
        d.trigger_ctrl_alt_del();
        assert_eq!(irq.eventfd().read().unwrap(), 1);
        assert_eq!(drain(&mut d), CTRL_ALT_DEL_SET1);
        // A guest that turned translation off gets the keyboard's own set 2 codes.
        d.write(OFS_STATUS, &[CMD_WRITE_CTR]);
        d.write(OFS_DATA, &[CTR_KBD_INT]);
        d.trigger_ctrl_alt_del();
        assert_eq!(drain(&mut d), CTRL_ALT_DEL_SET2);
    }

    fn drain(d: &mut I8042Device) -> Vec<u8> {
        let mut got = Vec::new();
        while rd(d, OFS_STATUS) & SB_OUT_DATA_AVAIL != 0 {
            got.push(rd(d, OFS_DATA));
        }
        got
    }

    #[test]
    fn keyboard_answers_the_probe_sequence() {
        let (mut d, _, irq) = dev();
        d.write(OFS_DATA, &[KBD_CMD_RESET]);
        assert_eq!(drain(&mut d), [KBD_ACK, KBD_RESET_OK]);
        // One interrupt per byte the driver still has to read.
        assert_eq!(irq.eventfd().read().unwrap(), 2);
        d.write(OFS_DATA, &[KBD_CMD_GETID]);
        assert_eq!(drain(&mut d), [KBD_ACK, 0xab, 0x83]);
        // Commands with a parameter: each byte is acknowledged, the parameter is not a command.
        d.write(OFS_DATA, &[KBD_CMD_SETLEDS]);
        d.write(OFS_DATA, &[KBD_CMD_RESET]);
        assert_eq!(drain(&mut d), [KBD_ACK, KBD_ACK]);
        d.write(OFS_DATA, &[KBD_CMD_SCANSET]);
        d.write(OFS_DATA, &[0]);
        assert_eq!(drain(&mut d), [KBD_ACK, KBD_ACK, KBD_SCANSET_2]);
        d.write(OFS_DATA, &[0xf4]);
        assert_eq!(drain(&mut d), [KBD_ACK]);
    }

    #[test]
    fn state_round_trip() {
        let (mut d, _, _) = dev();
        d.write(OFS_DATA, &[KBD_CMD_SETLEDS]);
        d.write(OFS_STATUS, &[CMD_WRITE_CTR]);
        let st = d.save();
        let (_, reset, irq) = dev();
        let Ok(mut r) = I8042Device::restore(I8042Args { reset, irq }, &st);
        assert_eq!(r.save(), st);
        // Bytes waiting (the SETLEDS ack) with keyboard interrupts on: raised again.
        r.raise_if_pending();
        assert_eq!(r.irq.eventfd().read().unwrap(), 1);
        // The pending command byte: the next data write is the CTR.
        r.write(OFS_DATA, &[0x45]);
        r.write(OFS_STATUS, &[CMD_READ_CTR]);
        assert_eq!(drain(&mut r).last(), Some(&0x45));
    }

    #[test]
    fn ctr_round_trip_and_self_test() {
        let (mut d, _, _) = dev();
        d.write(OFS_STATUS, &[CMD_WRITE_CTR]);
        d.write(OFS_DATA, &[0x47]);
        d.write(OFS_STATUS, &[CMD_READ_CTR]);
        assert_eq!(rd(&mut d, OFS_DATA), 0x47);
        d.write(OFS_STATUS, &[CMD_SELF_TEST]);
        assert_eq!(rd(&mut d, OFS_DATA), SELF_TEST_OK);
        assert_eq!(rd(&mut d, OFS_STATUS) & SB_OUT_DATA_AVAIL, 0);
        // Unknown offsets read all-ones, the buffer is bounded.
        assert_eq!(rd(&mut d, 2), 0xff);
        for _ in 0..1000 {
            d.write(OFS_DATA, &[0xff]);
        }
        assert!(d.buf.len() <= OUT_BUF_MAX);
    }
}
