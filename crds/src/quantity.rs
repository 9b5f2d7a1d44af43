//! Kubernetes resource quantities (`128Mi`, `1G`, `1.5Gi`, `1e9`, `134217728`) as whole bytes.
//!
//! One parser for the operator (pod resources, flags) and the launcher (guest memory, emptyDisk
//! capacity); the CRD's CEL rules use the API server's `isQuantity`/`quantity`, and
//! `operator/tests/apiserver/quantities.rs` checks that the API server and this parser accept the
//! same strings and order them the same way.
//!
//! The grammar is apimachinery's `resource.ParseQuantity` (v0.34):
//!
//! ```text
//! quantity  ::= [sign] number suffix
//! number    ::= digits | digits "." | digits "." digits | "." digits      ("." alone is 0)
//! suffix    ::= "" | Ki | Mi | Gi | Ti | Pi | Ei | n | u | m | k | M | G | T | P | E
//!             | ("e" | "E") [sign] digits                                  (decimal exponent)
//! ```
//!
//! No white space, no `K`, no `kB`; the digits may be missing (`Mi` and `.` are 0). Like `Quantity.Value()`, a fractional number of bytes is
//! rounded up (`1500m` → 2, `0.1` → 1). Unlike the API server, which caps binary-suffixed
//! quantities at 2^63-1, values beyond 64 bits are refused here (the CRD's rules bound every
//! quantity field at `1Ei` so the cap is never reached).

/// Why a quantity could not be turned into bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Not a Kubernetes quantity.
    #[error("{0:?} is not a quantity (examples: 128Mi, 1Gi, 500M, 1.5Gi, 134217728)")]
    Syntax(String),
    /// Negative, or more bytes than 64 bits hold.
    #[error("{0:?} is not a non-negative number of bytes that fits 64 bits")]
    Range(String),
}

/// The scale a suffix applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scale {
    /// × 2^n (`Ki` … `Ei`).
    Binary(u32),
    /// × 10^n (`n` … `E`, `e<n>`, no suffix).
    Decimal(i64),
}

/// A quantity split the way apimachinery's scanner splits it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Parts<'a> {
    negative: bool,
    /// Integer digits, leading zeros removed (may be empty = 0).
    int: &'a str,
    /// Digits after the decimal point.
    frac: &'a str,
    scale: Scale,
}

fn scale_of(suffix: &str) -> Option<Scale> {
    let s = match suffix {
        "Ki" => Scale::Binary(10),
        "Mi" => Scale::Binary(20),
        "Gi" => Scale::Binary(30),
        "Ti" => Scale::Binary(40),
        "Pi" => Scale::Binary(50),
        "Ei" => Scale::Binary(60),
        "n" => Scale::Decimal(-9),
        "u" => Scale::Decimal(-6),
        "m" => Scale::Decimal(-3),
        "" => Scale::Decimal(0),
        "k" => Scale::Decimal(3),
        "M" => Scale::Decimal(6),
        "G" => Scale::Decimal(9),
        "T" => Scale::Decimal(12),
        "P" => Scale::Decimal(15),
        "E" => Scale::Decimal(18),
        _ => {
            let exp = suffix
                .strip_prefix('e')
                .or_else(|| suffix.strip_prefix('E'))
                .filter(|e| !e.is_empty())?;
            let exp: i64 = exp.parse().ok()?;
            // apimachinery parses the exponent as int64 and keeps it as int32 (truncating).
            Scale::Decimal(i64::from(exp as i32))
        }
    };
    Some(s)
}

fn digits_end(s: &[u8], from: usize) -> usize {
    s[from..]
        .iter()
        .position(|c| !c.is_ascii_digit())
        .map_or(s.len(), |p| from + p)
}

/// Split `s` as apimachinery's `parseQuantityString` + suffix interpretation do.
fn split(s: &str) -> Option<Parts<'_>> {
    if s.is_empty() {
        return None;
    }
    let b = s.as_bytes();
    let mut pos = 0;
    let negative = match b[0] {
        b'-' => {
            pos = 1;
            true
        }
        b'+' => {
            pos = 1;
            false
        }
        _ => false,
    };
    while pos < b.len() && b[pos] == b'0' {
        pos += 1;
    }
    let int_end = digits_end(b, pos);
    let int = &s[pos..int_end];
    pos = int_end;
    let mut frac = "";
    if pos < b.len() && b[pos] == b'.' {
        let end = digits_end(b, pos + 1);
        frac = &s[pos + 1..end];
        pos = end;
    }
    // The suffix: letters of the known suffixes, then an optional signed exponent.
    let suffix_start = pos;
    while pos < b.len() && b"eEinumkKMGTP".contains(&b[pos]) {
        pos += 1;
    }
    if pos < b.len() && (b[pos] == b'-' || b[pos] == b'+') {
        pos += 1;
    }
    if digits_end(b, pos) != b.len() {
        return None;
    }
    let scale = scale_of(&s[suffix_start..])?;
    Some(Parts {
        negative,
        int,
        frac,
        scale,
    })
}

/// Whether `s` is a Kubernetes quantity (the API server's `isQuantity`).
pub fn is_quantity(s: &str) -> bool {
    split(s).is_some()
}

/// Multiply a big-endian decimal digit string by 2^shift in place.
fn mul_pow2(digits: &mut Vec<u8>, mut shift: u32) {
    while shift > 0 {
        let step = shift.min(32);
        shift -= step;
        let factor = 1u64 << step;
        let mut carry = 0u64;
        for d in digits.iter_mut().rev() {
            let v = u64::from(*d) * factor + carry;
            *d = (v % 10) as u8;
            carry = v / 10;
        }
        while carry > 0 {
            digits.insert(0, (carry % 10) as u8);
            carry /= 10;
        }
    }
}

/// Parse a quantity into a whole number of bytes (a fractional number of bytes rounds up).
pub fn parse_bytes(s: &str) -> Result<u64, QuantityError> {
    let p = split(s).ok_or_else(|| QuantityError::Syntax(s.to_string()))?;
    let range = || QuantityError::Range(s.to_string());
    // value = 0.<digits> shifted: digits = int ++ frac, with `point` digits after the point.
    let mut digits: Vec<u8> = p
        .int
        .bytes()
        .chain(p.frac.bytes())
        .map(|c| c - b'0')
        .collect();
    let mut point = i64::try_from(p.frac.len()).map_err(|_| range())?;
    match p.scale {
        Scale::Binary(n) => mul_pow2(&mut digits, n),
        Scale::Decimal(e) => point -= e,
    }
    let first = digits.iter().position(|&d| d != 0);
    let Some(first) = first else {
        return Ok(0); // zero, also "-0" and "."
    };
    if p.negative {
        return Err(range());
    }
    let len = i64::try_from(digits.len()).map_err(|_| range())?;
    // Digits before the point: len - point (may be negative or beyond len).
    let int_len = len - point;
    let (int_digits, frac_nonzero): (&[u8], bool) = if int_len <= 0 {
        (&[], true)
    } else if int_len >= len {
        // Whole number; `int_len - len` zeros follow.
        let significant = len - i64::try_from(first).map_err(|_| range())? + (int_len - len);
        if significant > 20 {
            return Err(range());
        }
        let mut v: u128 = 0;
        for &d in &digits[first..] {
            v = v * 10 + u128::from(d);
        }
        for _ in 0..(int_len - len) {
            v *= 10;
        }
        return u64::try_from(v).map_err(|_| range());
    } else {
        let cut = usize::try_from(int_len).map_err(|_| range())?;
        (&digits[..cut], digits[cut..].iter().any(|&d| d != 0))
    };
    let int_digits = &int_digits[int_digits
        .iter()
        .position(|&d| d != 0)
        .unwrap_or(int_digits.len())..];
    if int_digits.len() > 20 {
        return Err(range());
    }
    let mut v: u128 = 0;
    for &d in int_digits {
        v = v * 10 + u128::from(d);
    }
    if frac_nonzero {
        v += 1;
    }
    u64::try_from(v).map_err(|_| range())
}

/// Format bytes as a quantity in the largest binary unit that divides it exactly.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u32); 4] = [("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)];
    for (suffix, shift) in UNITS {
        let unit = 1u64 << shift;
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_binary_decimal_and_exponent_forms() {
        let cases: &[(&str, u64)] = &[
            ("128Mi", 128 << 20),
            ("1Gi", 1 << 30),
            ("1.5Gi", 3 << 29),
            ("500M", 500_000_000),
            ("134217728", 134_217_728),
            ("1k", 1000),
            ("1500m", 2),
            ("1e3", 1000),
            ("1E3", 1000),
            ("1e+3", 1000),
            ("1.5e3", 1500),
            ("2e-1", 1),
            ("1E", 1_000_000_000_000_000_000),
            ("+16Mi", 16 << 20),
            ("0016Mi", 16 << 20),
            ("16.Mi", 16 << 20),
            (".5Ki", 512),
            ("0.015625Gi", 16 << 20),
            ("16.777216M", 16_777_216),
            ("1.6777216e7", 16_777_216),
            ("500u", 1),
            ("1n", 1),
            ("0", 0),
            ("-0", 0),
            (".", 0),
            ("+", 0),
            ("Mi", 0), // no digits is zero
            ("0.0001Ki", 1),
            ("1Ei", 1 << 60),
            ("15Ei", 15 << 60),
            ("18446744073709551615", u64::MAX),
            ("0.000000000000000000000000000000000000000000001Gi", 1),
            ("1e4294967296", 1), // the exponent keeps 32 bits, as in apimachinery
        ];
        for (s, want) in cases {
            assert_eq!(parse_bytes(s), Ok(*want), "{s}");
            assert!(is_quantity(s), "{s}");
        }
    }

    #[test]
    fn refuses_what_the_api_server_refuses_and_what_does_not_fit() {
        for s in [
            "", " 16Mi", "16Mi ", "12XB", "1.2.3", "1K", "1kb", "1mi", "1e", "1e3e", "1Ki3",
            "0x10", "1_000", "1,5Gi", "--1", "1 Mi",
        ] {
            assert_eq!(
                parse_bytes(s),
                Err(QuantityError::Syntax(s.into())),
                "{s:?}"
            );
            assert!(!is_quantity(s), "{s:?}");
        }
        for s in [
            "-1Mi",
            "-0.5",
            "16Ei",
            "99999999Ei",
            "18446744073709551616",
            "1e20",
            "1e999999",
        ] {
            assert_eq!(parse_bytes(s), Err(QuantityError::Range(s.into())), "{s:?}");
            assert!(is_quantity(s), "{s:?}");
        }
    }

    #[test]
    fn formats_in_largest_exact_unit() {
        assert_eq!(format_bytes(160 << 20), "160Mi");
        assert_eq!(format_bytes(2 << 30), "2Gi");
        assert_eq!(format_bytes(1536 << 20), "1536Mi");
        assert_eq!(format_bytes(1000), "1000");
    }
}
