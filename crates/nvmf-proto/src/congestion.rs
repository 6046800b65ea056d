//! The rule for a TCP congestion control name, shared by nvmf-target (`tcp_congestion`) and
//! nvmf-perf (`--tcp_congestion`) so that both refuse the same names. It lives here because this
//! is the one crate both depend on that does no I/O; setting the name on a socket stays with each.

/// A name the kernel could know as a TCP congestion control (`cubic`, `bbr`, ...): 1-15 bytes
/// of a-z, 0-9 and `_` (TCP_CA_NAME_MAX is 16 with the NUL). Whether this machine has it is
/// known only when a socket is set.
pub fn is_congestion_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 15 && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_pass_and_others_are_refused() {
        for good in ["cubic", "bbr", "reno", "dctcp", "h_tcp2", "abcdefghijklmno"] {
            assert!(is_congestion_name(good), "{good:?}");
        }
        for bad in ["", "Cubic", "bb r", "a-b", "cubic\n", "abcdefghijklmnop", "bbr;rm", "é"] {
            assert!(!is_congestion_name(bad), "{bad:?}");
        }
    }
}
