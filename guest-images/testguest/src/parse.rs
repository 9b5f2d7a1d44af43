//! Pure parsing helpers (no hardware access), also compiled into host unit tests by
//! `testguest-build` (`tests/guest_logic.rs`).

/// Values of all `key=value` parameters named `key` in a command line, in order.
pub fn params<'a>(cmdline: &'a [u8], key: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
    cmdline
        .split(|&b| b == b' ' || b == b'\t' || b == b'\n')
        .filter_map(move |tok| tok.strip_prefix(key.as_bytes())?.strip_prefix(b"="))
}

/// Decimal or `0x` hexadecimal, without overflow; `None` for anything else.
pub fn parse_num(s: &[u8]) -> Option<u64> {
    let (digits, radix) = match s {
        [b'0', b'x' | b'X', rest @ ..] => (rest, 16),
        _ => (s, 10),
    };
    if digits.is_empty() {
        return None;
    }
    let mut v: u64 = 0;
    for &d in digits {
        let x = (d as char).to_digit(radix)?;
        v = v.checked_mul(u64::from(radix))?.checked_add(u64::from(x))?;
    }
    Some(v)
}

/// A size like `4K`, `1M`, `4096` or `0x1000`.
pub fn parse_size(s: &[u8]) -> Option<u64> {
    let (num, mul) = match s.last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 1u64 << 10),
        b'M' | b'm' => (&s[..s.len() - 1], 1u64 << 20),
        _ => (s, 1),
    };
    parse_num(num)?.checked_mul(mul)
}

/// `<size>@<addr>[:<irq>]` (the value of `virtio_mmio.device=`): returns (size, addr, irq).
pub fn parse_virtio_mmio(v: &[u8]) -> Option<(u64, u64, Option<u64>)> {
    let at = v.iter().position(|&b| b == b'@')?;
    let (size, rest) = (&v[..at], &v[at + 1..]);
    let (addr, irq) = match rest.iter().position(|&b| b == b':') {
        Some(c) => (&rest[..c], Some(parse_num(&rest[c + 1..])?)),
        None => (rest, None),
    };
    Some((parse_size(size)?, parse_num(addr)?, irq))
}

/// The decimal number after the last space of `b`, ignoring anything from the first NUL on.
pub fn trailing_number(b: &[u8]) -> Option<u64> {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    let b = &b[..end];
    let start = b.iter().rposition(|&c| c == b' ')? + 1;
    let digits = &b[start..];
    if digits.iter().all(u8::is_ascii_digit) {
        parse_num(digits)
    } else {
        None
    }
}

/// Tracks Ctrl/Alt state in scancode set 1 and set 2 at once and reports Del (either the
/// E0-prefixed Delete or keypad Del) pressed while both are down.
#[derive(Default)]
pub struct CtrlAltDel {
    set1: Keys,
    set2: Keys,
}

#[derive(Default)]
struct Keys {
    ctrl: bool,
    alt: bool,
    release: bool,
}

impl CtrlAltDel {
    /// Feeds one byte from the keyboard controller; true once Ctrl+Alt+Del is pressed.
    pub fn feed(&mut self, b: u8) -> bool {
        let a = self.set1.feed_set1(b);
        let c = self.set2.feed_set2(b);
        a || c
    }
}

impl Keys {
    fn feed_set1(&mut self, b: u8) -> bool {
        if b == 0xe0 {
            return false;
        }
        let down = b & 0x80 == 0;
        match b & 0x7f {
            0x1d => self.ctrl = down,
            0x38 => self.alt = down,
            0x53 => return down && self.ctrl && self.alt,
            _ => {}
        }
        false
    }

    fn feed_set2(&mut self, b: u8) -> bool {
        match b {
            0xe0 => return false,
            0xf0 => {
                self.release = true;
                return false;
            }
            _ => {}
        }
        let down = !core::mem::take(&mut self.release);
        match b {
            0x14 => self.ctrl = down,
            0x11 => self.alt = down,
            0x71 => return down && self.ctrl && self.alt,
            _ => {}
        }
        false
    }
}

/// `<prefix><a> <b>` (frame padding after `b` ignored): the two decimal numbers.
pub fn two_numbers(b: &[u8], prefix: &[u8]) -> Option<(u64, u64)> {
    let rest = b.strip_prefix(prefix)?;
    let end = rest.iter().position(|&c| c == 0).unwrap_or(rest.len());
    let rest = &rest[..end];
    let sp = rest.iter().position(|&c| c == b' ')?;
    let (a, b) = (&rest[..sp], &rest[sp + 1..]);
    if a.is_empty() || !a.iter().all(u8::is_ascii_digit) || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some((parse_num(a)?, parse_num(b)?))
}
