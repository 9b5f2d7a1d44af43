//! Parsing Kubernetes resource quantities (`128Mi`, `1G`, `1.5Gi`, `134217728`) into bytes.

/// Why a quantity could not be turned into bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Not a number with a known suffix.
    #[error("{0:?} is not a quantity (examples: 128Mi, 1Gi, 500M, 134217728)")]
    Syntax(String),
    /// Negative, fractional byte count, or larger than u64.
    #[error("{0:?} is not a whole, non-negative number of bytes that fits 64 bits")]
    Range(String),
}

/// Parse a quantity into a whole number of bytes (rounding fractional bytes up).
pub fn parse_bytes(s: &str) -> Result<u64, QuantityError> {
    let t = s.trim();
    let syntax = || QuantityError::Syntax(s.to_string());
    let range = || QuantityError::Range(s.to_string());
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    if num.is_empty() {
        return Err(syntax());
    }
    // (numerator multiplier, denominator divisor)
    let (mul, div): (u128, u128) = match suffix {
        "" => (1, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        "m" => (1, 1000),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        _ => return Err(syntax()),
    };
    let num = num.strip_prefix('+').unwrap_or(num);
    if num.starts_with('-') {
        return Err(range());
    }
    let (int_part, frac_part) = match num.split_once('.') {
        Some((i, f)) => (i, f),
        None => (num, ""),
    };
    if (int_part.is_empty() && frac_part.is_empty())
        || !int_part.chars().all(|c| c.is_ascii_digit())
        || !frac_part.chars().all(|c| c.is_ascii_digit())
        || frac_part.len() > 9
    {
        return Err(syntax());
    }
    let int: u128 = if int_part.is_empty() {
        0
    } else {
        int_part.parse().map_err(|_| range())?
    };
    let frac: u128 = if frac_part.is_empty() {
        0
    } else {
        frac_part.parse().map_err(|_| syntax())?
    };
    let scale = 10u128.pow(frac_part.len() as u32);
    // value = (int + frac/scale) * mul / div, rounded up.
    let numer = int
        .checked_mul(scale)
        .and_then(|v| v.checked_add(frac))
        .and_then(|v| v.checked_mul(mul))
        .ok_or_else(range)?;
    let denom = scale * div;
    let bytes = numer.div_ceil(denom);
    u64::try_from(bytes).map_err(|_| range())
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
    fn parses_binary_and_decimal_suffixes() {
        assert_eq!(parse_bytes("128Mi"), Ok(128 << 20));
        assert_eq!(parse_bytes("1Gi"), Ok(1 << 30));
        assert_eq!(parse_bytes("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse_bytes("500M"), Ok(500_000_000));
        assert_eq!(parse_bytes("134217728"), Ok(134_217_728));
        assert_eq!(parse_bytes("1k"), Ok(1000));
        assert_eq!(parse_bytes("1500m"), Ok(2));
        assert_eq!(parse_bytes(" 16Mi "), Ok(16 << 20));
    }

    #[test]
    fn refuses_garbage_and_negative() {
        assert!(matches!(parse_bytes(""), Err(QuantityError::Syntax(_))));
        assert!(matches!(parse_bytes("Mi"), Err(QuantityError::Syntax(_))));
        assert!(matches!(parse_bytes("12XB"), Err(QuantityError::Syntax(_))));
        assert!(matches!(
            parse_bytes("1.2.3"),
            Err(QuantityError::Syntax(_))
        ));
        assert!(matches!(parse_bytes("-1Mi"), Err(QuantityError::Range(_))));
        assert!(matches!(
            parse_bytes("99999999Ei"),
            Err(QuantityError::Range(_))
        ));
    }

    #[test]
    fn formats_in_largest_exact_unit() {
        assert_eq!(format_bytes(160 << 20), "160Mi");
        assert_eq!(format_bytes(2 << 30), "2Gi");
        assert_eq!(format_bytes(1536 << 20), "1536Mi");
        assert_eq!(format_bytes(1000), "1000");
    }
}
