//! Sizes as people write them on command lines and in config files, for the target's and the
//! host's parsers alike: `512`, `4k`, `128K`, `1m`, `64MiB`, `1GiB`, `2t`.

/// Why a size did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("expected a number with an optional unit (4k, 1MiB)")]
    NoNumber,
    #[error("unknown unit {0:?} (use k, m, g, t or KiB, MiB, GiB, TiB)")]
    UnknownUnit(String),
    #[error("number too large")]
    TooLarge,
}

/// Parses a byte count. Every unit is a power of 1024 (fio's default kb_base), with or
/// without `B`/`iB`, any case, spaces around it allowed.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(SizeError::NoNumber);
    }
    let n: u64 = num.parse().map_err(|_| SizeError::TooLarge)?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(SizeError::UnknownUnit(unit.trim().to_string())),
    };
    n.checked_mul(1u64 << shift).ok_or(SizeError::TooLarge)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_powers_of_1024() {
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("4 K"), Ok(4096));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("2tb"), Ok(2 << 40));
        assert_eq!(parse_size("1x"), Err(SizeError::UnknownUnit("x".into())));
        assert_eq!(parse_size(""), Err(SizeError::NoNumber));
        assert_eq!(parse_size("k"), Err(SizeError::NoNumber));
        assert_eq!(parse_size("-4k"), Err(SizeError::NoNumber));
        assert_eq!(parse_size("99999999999999999999"), Err(SizeError::TooLarge));
        assert_eq!(parse_size("16777216t"), Err(SizeError::TooLarge));
    }
}
