//! The NVMe TLS PSK interchange format, `NVMeTLSkey-1:HH:<base64>:`.
//!
//! `HH` names the transform from the configured PSK to the retained PSK: `00` none (the configured
//! PSK is used as the retained PSK), `01` HKDF with SHA-256, `02` HKDF with SHA-384. The base64 part
//! (standard alphabet, padded) carries the key (32 or 48 bytes) followed by the CRC-32 (the zlib /
//! IEEE 802.3 one) of the key, least significant byte first. This is what `nvme gen-tls-key` prints
//! and what libnvme, the kernel's keyring tools and SPDK read.

use std::fmt;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;

use crate::secret::Secret;
use crate::TlsHash;

/// Longest input [`ConfiguredPsk::parse`] looks at, surrounding whitespace included. The longest
/// valid key (SHA-384, 48 bytes) is 89 characters.
pub const MAX_INTERCHANGE_INPUT: usize = 256;

const PREFIX: &str = "NVMeTLSkey-";

/// The `HH` field: how the configured PSK becomes the retained PSK.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PskTransform {
    /// `00`: the configured PSK is the retained PSK.
    None,
    /// `01`: HKDF with SHA-256.
    Sha256,
    /// `02`: HKDF with SHA-384.
    Sha384,
}

impl PskTransform {
    pub fn code(self) -> u8 {
        match self {
            PskTransform::None => 0,
            PskTransform::Sha256 => 1,
            PskTransform::Sha384 => 2,
        }
    }

    pub fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(PskTransform::None),
            1 => Some(PskTransform::Sha256),
            2 => Some(PskTransform::Sha384),
            _ => None,
        }
    }

    /// The hash the transform runs with (`None` for `00`).
    pub fn hash(self) -> Option<TlsHash> {
        match self {
            PskTransform::None => None,
            PskTransform::Sha256 => Some(TlsHash::Sha256),
            PskTransform::Sha384 => Some(TlsHash::Sha384),
        }
    }

    fn allows_len(self, len: usize) -> bool {
        match self {
            PskTransform::None => len == 32 || len == 48,
            PskTransform::Sha256 => len == 32,
            PskTransform::Sha384 => len == 48,
        }
    }
}

impl fmt::Display for PskTransform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:02}", self.code())
    }
}

/// Why a key string or key bytes were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("TLS key is {len} bytes long; at most {max} are accepted")]
    TooLong { len: usize, max: usize },
    #[error("TLS key is empty")]
    Empty,
    #[error("TLS key does not start with 'NVMeTLSkey-' (expected NVMeTLSkey-1:HH:<base64>:)")]
    NotInterchange,
    #[error("TLS key has version '{0}'; only version 1 (NVMeTLSkey-1:...) is known")]
    UnsupportedVersion(String),
    #[error("TLS key hash field '{0}' is not 00 (none), 01 (SHA-256) or 02 (SHA-384)")]
    BadTransform(String),
    #[error("TLS key is malformed: {0}")]
    Malformed(&'static str),
    #[error("TLS key base64 part does not decode: {0}")]
    Base64(String),
    #[error("TLS key holds {len} key bytes; hash field {transform} takes {expected}")]
    BadLength { transform: PskTransform, len: usize, expected: &'static str },
    #[error("TLS key CRC-32 mismatch (stored {stored:08x}, computed {computed:08x}): the key was mistyped or truncated")]
    Crc { stored: u32, computed: u32 },
    #[error("cannot get random bytes for a new key: {0}")]
    Random(String),
}

/// A configured PSK as read from the interchange format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfiguredPsk {
    transform: PskTransform,
    key: Secret,
}

fn expected_lengths(t: PskTransform) -> &'static str {
    match t {
        PskTransform::None => "32 or 48",
        PskTransform::Sha256 => "32",
        PskTransform::Sha384 => "48",
    }
}

impl ConfiguredPsk {
    /// Key bytes with their transform; 32 or 48 bytes, 32 for `01`, 48 for `02`.
    pub fn new(transform: PskTransform, key: &[u8]) -> Result<Self, KeyError> {
        if !transform.allows_len(key.len()) {
            return Err(KeyError::BadLength {
                transform,
                len: key.len(),
                expected: expected_lengths(transform),
            });
        }
        Ok(ConfiguredPsk { transform, key: Secret::from_slice(key) })
    }

    /// A fresh random key: 32 bytes for `01`, 48 for `02`, and `len` (32 or 48) for `00`.
    pub fn generate(transform: PskTransform, len: usize) -> Result<Self, KeyError> {
        let len = match transform {
            PskTransform::Sha256 => 32,
            PskTransform::Sha384 => 48,
            PskTransform::None => len,
        };
        if !transform.allows_len(len) {
            return Err(KeyError::BadLength { transform, len, expected: expected_lengths(transform) });
        }
        let mut fresh = vec![0u8; len];
        getrandom::getrandom(&mut fresh).map_err(|e| KeyError::Random(e.to_string()))?;
        let bytes = Secret::new(fresh);
        Ok(ConfiguredPsk { transform, key: bytes })
    }

    pub fn transform(&self) -> PskTransform {
        self.transform
    }

    pub fn key(&self) -> &[u8] {
        self.key.as_bytes()
    }

    /// The hash of the cipher suite that goes with this key: the transform's hash, or for `00`
    /// the one the key length implies (32 bytes: SHA-256, 48: SHA-384), as libnvme decides.
    pub fn cipher_hash(&self) -> TlsHash {
        match self.transform.hash() {
            Some(h) => h,
            None if self.key.len() == 48 => TlsHash::Sha384,
            None => TlsHash::Sha256,
        }
    }

    /// Parses `NVMeTLSkey-1:HH:<base64>:`. Leading and trailing ASCII whitespace (a newline from
    /// a key file) is ignored; anything else that is not exactly the format is an error.
    pub fn parse(input: &str) -> Result<Self, KeyError> {
        if input.len() > MAX_INTERCHANGE_INPUT {
            return Err(KeyError::TooLong { len: input.len(), max: MAX_INTERCHANGE_INPUT });
        }
        let s = input.trim_ascii();
        if s.is_empty() {
            return Err(KeyError::Empty);
        }
        let rest = s.strip_prefix(PREFIX).ok_or(KeyError::NotInterchange)?;
        let (version, rest) = rest.split_once(':').ok_or(KeyError::Malformed("no ':' after the version"))?;
        if version != "1" {
            return Err(KeyError::UnsupportedVersion(printable(version)));
        }
        let (hh, rest) = rest.split_once(':').ok_or(KeyError::Malformed("no ':' after the hash field"))?;
        let transform = match hh {
            "00" => PskTransform::None,
            "01" => PskTransform::Sha256,
            "02" => PskTransform::Sha384,
            other => return Err(KeyError::BadTransform(printable(other))),
        };
        let body = rest.strip_suffix(':').ok_or(KeyError::Malformed("no ':' after the base64 part"))?;
        if body.is_empty() {
            return Err(KeyError::Malformed("empty base64 part"));
        }
        if body.contains(':') {
            return Err(KeyError::Malformed("more fields than NVMeTLSkey-1:HH:<base64>:"));
        }
        // 52 bytes (48 + CRC) encode to 72 characters; anything longer cannot be a key.
        if body.len() > 72 {
            return Err(KeyError::BadLength {
                transform,
                len: body.len() / 4 * 3,
                expected: expected_lengths(transform),
            });
        }
        let raw = Secret::new(STANDARD.decode(body).map_err(|e| KeyError::Base64(e.to_string()))?);
        let raw = raw.as_bytes();
        if raw.len() < 4 || !transform.allows_len(raw.len() - 4) {
            return Err(KeyError::BadLength {
                transform,
                len: raw.len().saturating_sub(4),
                expected: expected_lengths(transform),
            });
        }
        let (key, crc) = raw.split_at(raw.len() - 4);
        let stored = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
        let computed = crc32fast::hash(key);
        if stored != computed {
            return Err(KeyError::Crc { stored, computed });
        }
        ConfiguredPsk::new(transform, key)
    }

    /// The interchange string, `NVMeTLSkey-1:HH:<base64 of key || CRC-32 LE>:`. Secret: do not log.
    pub fn to_interchange(&self) -> String {
        let key = self.key.as_bytes();
        let mut v = Vec::with_capacity(key.len() + 4);
        v.extend_from_slice(key);
        v.extend_from_slice(&crc32fast::hash(key).to_le_bytes());
        let raw = Secret::new(v);
        format!("{PREFIX}1:{:02}:{}:", self.transform.code(), STANDARD.encode(raw.as_bytes()))
    }
}

/// At most 16 characters of a field, escaped, for an error message.
fn printable(s: &str) -> String {
    let mut out: String = s.chars().take(16).flat_map(char::escape_default).collect();
    if s.chars().count() > 16 {
        out.push_str("...");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // libnvme test/psk.c: the same 32/48 key bytes and their exported strings.
    const K32: [u8; 32] = [
        0x55, 0x12, 0xDB, 0xB6, 0x73, 0x7D, 0x01, 0x06, 0xF6, 0x59, 0x75, 0xB7, 0x73, 0xDF, 0xB0, 0x11, 0xFF, 0xC3,
        0x44, 0xBC, 0xF4, 0x42, 0xE2, 0xDD, 0x6D, 0x8B, 0xC4, 0x87, 0x0B, 0x5D, 0x5B, 0x03,
    ];

    pub(crate) fn k48() -> Vec<u8> {
        let mut v = K32.to_vec();
        v.extend_from_slice(&K32[16..]);
        v
    }

    #[test]
    fn libnvme_export_vectors() {
        let cases: [(PskTransform, Vec<u8>, &str); 3] = [
            (PskTransform::None, K32.to_vec(), "NVMeTLSkey-1:00:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:"),
            (PskTransform::Sha256, K32.to_vec(), "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:"),
            (
                PskTransform::Sha384,
                k48(),
                "NVMeTLSkey-1:02:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwP/w0S89ELi3W2LxIcLXVsDn8kXZQ==:",
            ),
        ];
        for (t, key, s) in cases {
            let k = ConfiguredPsk::new(t, &key).unwrap();
            assert_eq!(k.to_interchange(), s);
            let p = ConfiguredPsk::parse(s).unwrap();
            assert_eq!(p.transform(), t);
            assert_eq!(p.key(), &key[..]);
        }
    }

    #[test]
    fn libnvme_config_key_round_trips() {
        // libnvme test/config/data/tls_key-1.json
        let s = "NVMeTLSkey-1:01:Hhc5sFjwSZ6w5hPY19tqprajYtuYci3tN+Z2wGViDk3rpSR+:";
        let k = ConfiguredPsk::parse(s).unwrap();
        assert_eq!(k.key().len(), 32);
        assert_eq!(k.to_interchange(), s);
        assert_eq!(ConfiguredPsk::parse(&format!("  {s}\n")).unwrap(), k);
    }

    #[test]
    fn hostile_inputs_have_clear_errors() {
        let good = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
        type Check = fn(&KeyError) -> bool;
        let cases: Vec<(String, Check)> = vec![
            ("".into(), |e| matches!(e, KeyError::Empty)),
            ("x".repeat(300), |e| matches!(e, KeyError::TooLong { .. })),
            ("DHHC-1:01:abc:".into(), |e| matches!(e, KeyError::NotInterchange)),
            (good.replace("-1:", "-2:"), |e| matches!(e, KeyError::UnsupportedVersion(v) if v == "2")),
            (good.replace(":01:", ":03:"), |e| matches!(e, KeyError::BadTransform(_))),
            (good.replace(":01:", ":1:"), |e| matches!(e, KeyError::BadTransform(_))),
            (good.replace(":01:", ":02:"), |e| matches!(e, KeyError::BadLength { len: 32, .. })),
            (good.trim_end_matches(':').into(), |e| matches!(e, KeyError::Malformed(_))),
            ("NVMeTLSkey-1:01::".into(), |e| matches!(e, KeyError::Malformed(_))),
            ("NVMeTLSkey-1:01:a:b:".into(), |e| matches!(e, KeyError::Malformed(_))),
            ("NVMeTLSkey-1:01:!!!!:".into(), |e| matches!(e, KeyError::Base64(_))),
            ("NVMeTLSkey-1:01:AAAA:".into(), |e| matches!(e, KeyError::BadLength { .. })),
            (good.replace("VRL", "VRM"), |e| matches!(e, KeyError::Crc { .. })),
            (format!("NVMeTLSkey-1:00:{}:", "A".repeat(200)), |e| matches!(e, KeyError::BadLength { .. })),
            ("NVMeTLSkey-1\u{0}:01:x:".into(), |e| matches!(e, KeyError::UnsupportedVersion(_))),
        ];
        for (input, check) in cases {
            let err = ConfiguredPsk::parse(&input).unwrap_err();
            assert!(check(&err), "{input:?} gave {err:?}");
            assert!(!err.to_string().is_empty());
        }
    }

    #[test]
    fn generate_round_trips_and_is_random() {
        for (t, len) in [(PskTransform::None, 32), (PskTransform::None, 48), (PskTransform::Sha256, 0), (PskTransform::Sha384, 0)] {
            let a = ConfiguredPsk::generate(t, len).unwrap();
            let b = ConfiguredPsk::generate(t, len).unwrap();
            assert_ne!(a.key(), b.key());
            assert_eq!(ConfiguredPsk::parse(&a.to_interchange()).unwrap(), a);
        }
        assert!(ConfiguredPsk::generate(PskTransform::None, 16).is_err());
    }

    #[test]
    fn debug_does_not_print_the_key() {
        let k = ConfiguredPsk::new(PskTransform::Sha256, &K32).unwrap();
        let d = format!("{k:?}");
        assert!(d.contains("32 bytes") && !d.contains("85"), "{d}");
    }
}
