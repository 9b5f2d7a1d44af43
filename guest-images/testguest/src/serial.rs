//! COM1 (8250/16550) at 0x3f8, polled.

use crate::io::{inb, outb, pause};
use core::fmt;

const COM1: u16 = 0x3f8;
const THR: u16 = COM1;
const RBR: u16 = COM1;
const LSR: u16 = COM1 + 5;
const LSR_DATA_READY: u8 = 1 << 0;
const LSR_THR_EMPTY: u8 = 1 << 5;
/// Give up waiting for THRE after this many polls (a UART that never drains must not hang the
/// guest; each poll is a VM exit, tens of microseconds under PVM).
const THRE_POLL_LIMIT: u32 = 10_000;

/// Writes one byte, waiting (bounded) for the transmit holding register to be empty.
pub fn write_byte(b: u8) {
    let mut n = 0;
    while inb(LSR) & LSR_THR_EMPTY == 0 && n < THRE_POLL_LIMIT {
        pause();
        n += 1;
    }
    outb(THR, b);
}

/// Returns a received byte if one is waiting.
pub fn try_read_byte() -> Option<u8> {
    let lsr = inb(LSR);
    // An absent UART reads all-ones; don't take that as "data ready" forever.
    if lsr != 0xff && lsr & LSR_DATA_READY != 0 {
        Some(inb(RBR))
    } else {
        None
    }
}

/// Blocks until a byte arrives.
pub fn read_byte() -> u8 {
    loop {
        if let Some(b) = try_read_byte() {
            return b;
        }
        pause();
    }
}

/// `core::fmt` sink for COM1; `\n` goes out as `\n` only.
pub struct Serial;

impl fmt::Write for Serial {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for b in s.bytes() {
            write_byte(b);
        }
        Ok(())
    }
}

/// Writes raw bytes (non-printable ones as `\xNN`).
pub fn write_bytes_escaped(bytes: &[u8]) {
    for &b in bytes {
        if (0x20..0x7f).contains(&b) {
            write_byte(b);
        } else {
            let hex = b"0123456789abcdef";
            write_byte(b'\\');
            write_byte(b'x');
            write_byte(hex[usize::from(b >> 4)]);
            write_byte(hex[usize::from(b & 0xf)]);
        }
    }
}

/// `print!` to COM1.
#[macro_export]
macro_rules! print {
    ($($arg:tt)*) => {{
        let _ = core::fmt::Write::write_fmt(&mut $crate::serial::Serial, format_args!($($arg)*));
    }};
}

/// `println!` to COM1.
#[macro_export]
macro_rules! println {
    () => { $crate::print!("\n") };
    ($($arg:tt)*) => {{
        $crate::print!($($arg)*);
        $crate::print!("\n");
    }};
}
