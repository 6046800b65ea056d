//! Sizes as the CLI, the TOML file and the model backend's parameters write them. Imports
//! nothing from the crate, so config/ and backend/ both use it without importing each other.

/// Parses sizes as the CLI and the TOML file write them: `512`, `4k`, `1m`, `64MiB`, `1GiB`
/// (k/m/g/t and KiB/MiB/GiB/TiB are powers of 1024).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" | "kb" => 10,
        "m" | "mib" | "mb" => 20,
        "g" | "gib" | "gb" => 30,
        "t" | "tib" | "tb" => 40,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_powers_of_1024() {
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("4k"), Some(4096));
        assert_eq!(parse_size("1m"), Some(1 << 20));
        assert_eq!(parse_size("64MiB"), Some(64 << 20));
        assert_eq!(parse_size("1GiB"), Some(1 << 30));
        assert_eq!(parse_size("1x"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("99999999999999999999t"), None);
    }
}
