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

/// An AML `PkgLength` at the start of `b`: (the length it encodes, the bytes it takes).
pub fn aml_pkg_length(b: &[u8]) -> Option<(usize, usize)> {
    let lead = *b.first()?;
    let extra = usize::from(lead >> 6);
    if extra == 0 {
        return Some((usize::from(lead & 0x3f), 1));
    }
    let mut len = usize::from(lead & 0x0f);
    for i in 0..extra {
        len |= usize::from(*b.get(1 + i)?) << (4 + 8 * i);
    }
    Some((len, 1 + extra))
}

/// An AML integer constant at the start of `b` (Zero, One, Ones, Byte/Word/DWord/QWordConst):
/// (its value, the bytes it takes).
pub fn aml_integer(b: &[u8]) -> Option<(u64, usize)> {
    let le = |n: usize| -> Option<u64> {
        let bytes = b.get(1..1 + n)?;
        Some(
            bytes
                .iter()
                .rev()
                .fold(0u64, |v, &x| (v << 8) | u64::from(x)),
        )
    };
    match *b.first()? {
        0x00 => Some((0, 1)),
        0x01 => Some((1, 1)),
        0xff => Some((u64::MAX, 1)),
        0x0a => Some((le(1)?, 2)),
        0x0b => Some((le(2)?, 3)),
        0x0c => Some((le(4)?, 5)),
        0x0e => Some((le(8)?, 9)),
        _ => None,
    }
}

/// What the DSDT says about a VM generation ID device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VmGenIdDevice {
    /// `Name (_HID, "QEMUVGID")` in the device.
    pub hid: bool,
    /// `Name (_CID, "VM_Gen_Counter")` in the device.
    pub cid: bool,
    /// The address `Method (ADDR) { Return (Package { low, high }) }` returns.
    pub addr: Option<u64>,
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Finds `Device (<name>)` in the AML `aml` (a table body) and reads its `_HID`, `_CID` and the
/// package its `ADDR` method returns, without an interpreter: the device is found by its
/// `DeviceOp PkgLength NameSeg` bytes, and only its own bytes are searched.
pub fn aml_vmgenid(aml: &[u8], name: &[u8; 4]) -> Option<VmGenIdDevice> {
    let mut from = 0;
    let dev = loop {
        // DeviceOp is ExtOpPrefix 0x5b, 0x82; then PkgLength (from its first byte), NameSeg.
        let at = from + find(aml.get(from..)?, &[0x5b, 0x82])?;
        let pkg = aml.get(at + 2..)?;
        if let Some((len, n)) = aml_pkg_length(pkg) {
            if pkg.get(n..n + 4) == Some(&name[..]) && len >= n + 4 {
                break pkg.get(n + 4..len)?;
            }
        }
        from = at + 2;
    };
    let string_name = |seg: &[u8; 4], value: &[u8]| {
        let mut want = [0u8; 64];
        let l = 6 + value.len() + 1;
        if l > want.len() {
            return false;
        }
        want[0] = 0x08; // NameOp
        want[1..5].copy_from_slice(seg);
        want[5] = 0x0d; // StringPrefix
        want[6..6 + value.len()].copy_from_slice(value);
        want[l - 1] = 0;
        find(dev, &want[..l]).is_some()
    };
    let hid = string_name(b"_HID", b"QEMUVGID");
    let cid = string_name(b"_CID", b"VM_Gen_Counter");
    let addr = (|| {
        // MethodOp PkgLength "ADDR" MethodFlags ReturnOp PackageOp PkgLength NumElements=2
        // low high
        let mut from = 0;
        let body = loop {
            let at = from + find(dev.get(from..)?, &[0x14])?;
            let pkg = dev.get(at + 1..)?;
            if let Some((len, n)) = aml_pkg_length(pkg) {
                if pkg.get(n..n + 4) == Some(&b"ADDR"[..]) && len >= n + 5 {
                    break pkg.get(n + 5..len)?;
                }
            }
            from = at + 1;
        };
        if body.first() != Some(&0xa4) || body.get(1) != Some(&0x12) {
            return None;
        }
        let (_, n) = aml_pkg_length(body.get(2..)?)?;
        let p = body.get(2 + n..)?;
        if p.first() != Some(&2) {
            return None;
        }
        let (low, a) = aml_integer(p.get(1..)?)?;
        let (high, _) = aml_integer(p.get(1 + a..)?)?;
        if low > u64::from(u32::MAX) || high > u64::from(u32::MAX) {
            return None;
        }
        Some(low | (high << 32))
    })();
    Some(VmGenIdDevice { hid, cid, addr })
}
