//! `DHHC-1:` secrets, as `nvme gen-dhchap-key` writes them and nvmet's configfs and nvme-cli's
//! `--dhchap-secret` take them: `DHHC-1:XX:<base64 of key || CRC-32 of key, little endian>:`,
//! where XX names the hash that transforms the key before use (00 none, 01 SHA-256, 02 SHA-384,
//! 03 SHA-512) and the key is 32, 48 or 64 bytes.

use super::crypto::hmac;
use super::HashId;
use base64::Engine;
use std::fmt;

const PREFIX: &str = "DHHC-1:";
const KEY_LENGTHS: [usize; 3] = [32, 48, 64];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("a DH-HMAC-CHAP secret starts with 'DHHC-1:' (as `nvme gen-dhchap-key` prints it)")]
    Prefix,
    #[error("the transformation hash after 'DHHC-1:' must be 00, 01, 02 or 03, not '{0}'")]
    Hash(String),
    #[error("the key part is not valid base64")]
    Base64,
    #[error("the key is {0} bytes; DH-HMAC-CHAP keys are 32, 48 or 64 bytes (plus a 4-byte CRC)")]
    Length(usize),
    #[error("the key's CRC-32 does not match: the secret was mistyped or truncated")]
    Crc,
}

/// A DH-HMAC-CHAP secret: the key and the hash that transforms it (None: used as is).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    pub key: Vec<u8>,
    pub transform: Option<HashId>,
}

// Secrets never reach logs in full.
impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({} bytes, transform {:?})", self.key.len(), self.transform.map(HashId::name))
    }
}

impl Secret {
    pub fn parse(text: &str) -> Result<Secret, SecretError> {
        let rest = text.trim().strip_prefix(PREFIX).ok_or(SecretError::Prefix)?;
        let (hash, rest) = rest.split_once(':').ok_or(SecretError::Prefix)?;
        let transform = match hash {
            "00" => None,
            "01" | "02" | "03" => HashId::from_id(hash.as_bytes()[1] - b'0'),
            other => return Err(SecretError::Hash(other.chars().take(8).collect())),
        };
        let b64 = rest.strip_suffix(':').unwrap_or(rest);
        if b64.len() > 128 {
            return Err(SecretError::Length(b64.len() * 3 / 4));
        }
        let raw = base64::engine::general_purpose::STANDARD.decode(b64).map_err(|_| SecretError::Base64)?;
        if raw.len() < 4 || !KEY_LENGTHS.contains(&(raw.len() - 4)) {
            return Err(SecretError::Length(raw.len().saturating_sub(4)));
        }
        let (key, crc) = raw.split_at(raw.len() - 4);
        if crc32fast::hash(key).to_le_bytes() != crc {
            return Err(SecretError::Crc);
        }
        Ok(Secret { key: key.to_vec(), transform })
    }

    /// The `DHHC-1:XX:...:` text of this secret.
    pub fn encode(&self) -> String {
        let mut raw = self.key.clone();
        raw.extend_from_slice(&crc32fast::hash(&self.key).to_le_bytes());
        let b64 = base64::engine::general_purpose::STANDARD.encode(raw);
        format!("{PREFIX}{:02}:{b64}:", self.transform.map_or(0, HashId::id))
    }

    /// The key as the HMAC of a response uses it: HMAC(key, NQN || "NVMe-over-Fabrics") with the
    /// transformation hash, or the key itself when there is none. `nqn` is the host NQN for the
    /// host's secret, the subsystem NQN for the controller's.
    pub fn transformed(&self, nqn: &str) -> Vec<u8> {
        match self.transform {
            None => self.key.clone(),
            Some(h) => hmac(h, &self.key, &[nqn.as_bytes(), b"NVMe-over-Fabrics"]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Printed by nvme-cli 2.3: `nvme gen-dhchap-key --secret=000102..1f --hmac=1
    /// --nqn=nqn.2014-08.org.nvmexpress:uuid:test` (which prints the transformed key) and the
    /// same with `--hmac=0 -l 32` (the key itself).
    const NVME_CLI_TRANSFORMED: &str = "DHHC-1:01:WulleCBkG4oCs0iIC3Cit9gBDCLWiZ9PNXuhqytWkBIZkvGy:";
    const NVME_CLI_PLAIN: &str = "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";

    #[test]
    fn parses_what_nvme_cli_prints_and_writes_it_back() {
        let plain = Secret::parse(NVME_CLI_PLAIN).unwrap();
        assert_eq!(plain.key, (0u8..32).collect::<Vec<_>>());
        assert_eq!(plain.transform, None);
        assert_eq!(plain.encode(), NVME_CLI_PLAIN);
        let t = Secret::parse(NVME_CLI_TRANSFORMED).unwrap();
        assert_eq!(t.transform, Some(HashId::Sha256));
        assert_eq!(t.encode(), NVME_CLI_TRANSFORMED);
    }

    #[test]
    fn transformation_matches_nvme_cli() {
        let secret = Secret { key: (0u8..32).collect(), transform: Some(HashId::Sha256) };
        let expected = Secret::parse(NVME_CLI_TRANSFORMED).unwrap().key;
        assert_eq!(secret.transformed("nqn.2014-08.org.nvmexpress:uuid:test"), expected);
        // No transformation: the key itself.
        let plain = Secret::parse(NVME_CLI_PLAIN).unwrap();
        assert_eq!(plain.transformed("any"), plain.key);
    }

    #[test]
    fn every_length_and_hash_round_trips() {
        for len in KEY_LENGTHS {
            for transform in [None, Some(HashId::Sha256), Some(HashId::Sha384), Some(HashId::Sha512)] {
                let s = Secret { key: (0..len).map(|i| (i * 7) as u8).collect(), transform };
                assert_eq!(Secret::parse(&s.encode()).unwrap(), s);
                // The trailing colon is optional, surrounding blanks are ignored.
                let text = format!("  {}\n", s.encode().trim_end_matches(':'));
                assert_eq!(Secret::parse(&text).unwrap(), s);
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn any_text_parses_or_fails_without_panicking(text in "\\PC{0,120}", tail in "[A-Za-z0-9+/=:]{0,100}") {
            let _ = Secret::parse(&text);
            let _ = Secret::parse(&format!("DHHC-1:01:{tail}"));
        }
    }

    #[test]
    fn bad_secrets_are_refused_with_a_reason() {
        assert_eq!(Secret::parse("DHHC-2:00:AAAA:"), Err(SecretError::Prefix));
        assert_eq!(Secret::parse("DHHC-1:07:AAAA:"), Err(SecretError::Hash("07".into())));
        assert_eq!(Secret::parse("DHHC-1:00:!!!!:"), Err(SecretError::Base64));
        assert_eq!(Secret::parse("DHHC-1:00:AAAA:"), Err(SecretError::Length(0)));
        let mut bad = NVME_CLI_PLAIN.to_string();
        bad.replace_range(10..11, "B");
        assert_eq!(Secret::parse(&bad), Err(SecretError::Crc));
        let huge = format!("DHHC-1:00:{}:", "A".repeat(100_000));
        assert!(matches!(Secret::parse(&huge), Err(SecretError::Length(_))));
        assert!(!format!("{:?}", Secret::parse(NVME_CLI_PLAIN).unwrap()).contains("AAEC"));
    }
}
