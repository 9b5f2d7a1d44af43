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

/// Tracks Ctrl/Alt state in scancode set 1 or set 2 and reports Del while both are down.
#[derive(Default)]
pub struct CtrlAltDel {
    set1: Decoder,
    set2: Decoder,
}

#[derive(Default)]
struct Decoder {
    ctrl: bool,
    alt: bool,
    extended: bool,
    release: bool,
}

impl CtrlAltDel {
    /// Feeds one byte; returns true once Ctrl+Alt+Del has been pressed.
    pub fn feed(&mut self, b: u8) -> bool {
        let a = self.set1.feed_set1(b);
        let c = self.set2.feed_set2(b);
        a || c
    }
}

impl Decoder {
    fn feed_set1(&mut self, b: u8) -> bool {
        if b == 0xe0 {
            self.extended = true;
            return false;
        }
        self.extended = false;
        let down = b & 0x80 == 0;
        match b & 0x7f {
            0x1d => self.ctrl = down,
            0x38 => self.alt = down,
            // 0x53: keypad Del / (with E0) Delete.
            0x53 => return down && self.ctrl && self.alt,
            _ => {}
        }
        false
    }

    fn feed_set2(&mut self, b: u8) -> bool {
        match b {
            0xe0 => {
                self.extended = true;
                return false;
            }
            0xf0 => {
                self.release = true;
                return false;
            }
            _ => {}
        }
        self.extended = false;
        let down = !core::mem::take(&mut self.release);
        match b {
            0x14 => self.ctrl = down,
            0x11 => self.alt = down,
            // 0x71: keypad Del / (with E0) Delete.
            0x71 => return down && self.ctrl && self.alt,
            _ => {}
        }
        false
    }
}
