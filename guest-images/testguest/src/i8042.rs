//! i8042 keyboard controller: reset line and the Ctrl+Alt+Del key sequence.

use crate::io::{inb, outb};

const DATA: u16 = 0x60;
const STATUS: u16 = 0x64;
const CMD: u16 = 0x64;
const STATUS_OUT_FULL: u8 = 1 << 0;
const CMD_RESET: u8 = 0xfe;

/// Pulses the CPU reset line (the VMM exits 0).
pub fn reset() {
    outb(CMD, CMD_RESET);
}

/// Returns a byte from the output buffer if one is there.
pub fn try_read() -> Option<u8> {
    let st = inb(STATUS);
    if st != 0xff && st & STATUS_OUT_FULL != 0 {
        Some(inb(DATA))
    } else {
        None
    }
}

pub use crate::parse::CtrlAltDel;
