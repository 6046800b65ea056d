//! Finite-field Diffie-Hellman over the RFC 7919 groups, as DH-HMAC-CHAP uses it: public values
//! and the session key are big-endian and padded to the size of the prime (Linux's `ffdheXXXX(dh)`
//! does the same), the generator is 2.

use super::ffdhe;
use num_bigint::BigUint;
use std::sync::OnceLock;

/// DH group identifiers (DHGID) of DH-HMAC-CHAP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DhGroup {
    Null = 0,
    Ffdhe2048 = 1,
    Ffdhe3072 = 2,
    Ffdhe4096 = 3,
    Ffdhe6144 = 4,
    Ffdhe8192 = 5,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DhError {
    #[error("the NULL DH group has no key exchange")]
    NullGroup,
    #[error("the peer's DH value is {got} bytes, the group needs {need}")]
    Length { need: usize, got: usize },
    #[error("the peer's DH value is outside 2..p-2")]
    OutOfRange,
}

impl DhGroup {
    pub const ALL: [DhGroup; 6] = [
        DhGroup::Null,
        DhGroup::Ffdhe2048,
        DhGroup::Ffdhe3072,
        DhGroup::Ffdhe4096,
        DhGroup::Ffdhe6144,
        DhGroup::Ffdhe8192,
    ];

    pub fn from_id(id: u8) -> Option<DhGroup> {
        DhGroup::ALL.into_iter().find(|g| *g as u8 == id)
    }

    pub fn id(self) -> u8 {
        self as u8
    }

    /// `null`, `ffdhe2048`, ... (nvmet's configfs names).
    pub fn name(self) -> &'static str {
        match self {
            DhGroup::Null => "null",
            DhGroup::Ffdhe2048 => "ffdhe2048",
            DhGroup::Ffdhe3072 => "ffdhe3072",
            DhGroup::Ffdhe4096 => "ffdhe4096",
            DhGroup::Ffdhe6144 => "ffdhe6144",
            DhGroup::Ffdhe8192 => "ffdhe8192",
        }
    }

    pub fn parse(s: &str) -> Option<DhGroup> {
        let s = s.trim().to_ascii_lowercase();
        DhGroup::ALL.into_iter().find(|g| g.name() == s)
    }

    /// Bytes of the prime, of public values and of the session key (0 for NULL).
    pub fn value_len(self) -> usize {
        match self {
            DhGroup::Null => 0,
            DhGroup::Ffdhe2048 => 256,
            DhGroup::Ffdhe3072 => 384,
            DhGroup::Ffdhe4096 => 512,
            DhGroup::Ffdhe6144 => 768,
            DhGroup::Ffdhe8192 => 1024,
        }
    }

    /// Bytes of random private exponent: at least twice the group's security strength in bits
    /// (RFC 7919 section 5.2), so a short exponent keeps the exchange fast without weakening it.
    pub fn private_len(self) -> usize {
        match self {
            DhGroup::Null => 0,
            DhGroup::Ffdhe2048 | DhGroup::Ffdhe3072 => 32,
            DhGroup::Ffdhe4096 => 40,
            DhGroup::Ffdhe6144 => 48,
            DhGroup::Ffdhe8192 => 56,
        }
    }

    fn prime(self) -> Option<&'static BigUint> {
        static PRIMES: [OnceLock<BigUint>; 5] =
            [OnceLock::new(), OnceLock::new(), OnceLock::new(), OnceLock::new(), OnceLock::new()];
        let (i, hex) = match self {
            DhGroup::Null => return None,
            DhGroup::Ffdhe2048 => (0, ffdhe::FFDHE2048),
            DhGroup::Ffdhe3072 => (1, ffdhe::FFDHE3072),
            DhGroup::Ffdhe4096 => (2, ffdhe::FFDHE4096),
            DhGroup::Ffdhe6144 => (3, ffdhe::FFDHE6144),
            DhGroup::Ffdhe8192 => (4, ffdhe::FFDHE8192),
        };
        Some(PRIMES[i].get_or_init(|| BigUint::parse_bytes(hex.as_bytes(), 16).expect("RFC 7919 prime is valid hex")))
    }
}

/// One side's ephemeral key: private exponent x and public value 2^x mod p.
pub struct DhKeyPair {
    group: DhGroup,
    private: BigUint,
    public: Vec<u8>,
}

impl DhKeyPair {
    /// A key pair from `random` ([`DhGroup::private_len`] bytes of the caller's randomness).
    pub fn new(group: DhGroup, random: &[u8]) -> Result<DhKeyPair, DhError> {
        let p = group.prime().ok_or(DhError::NullGroup)?;
        // x in 2..2^(8n)+1: never 0 or 1, far below p-1.
        let private = BigUint::from_bytes_be(random) + 2u32;
        let public = pad(&BigUint::from(2u32).modpow(&private, p), group.value_len());
        Ok(DhKeyPair { group, private, public })
    }

    pub fn group(&self) -> DhGroup {
        self.group
    }

    /// The public value, padded to the size of the prime.
    pub fn public(&self) -> &[u8] {
        &self.public
    }

    /// The session key Ks = peer^x mod p, padded to the size of the prime. The peer's value must
    /// be the group's size and lie in 2..p-2 (1 and p-1 would force a known key).
    pub fn session_key(&self, peer: &[u8]) -> Result<Vec<u8>, DhError> {
        let p = self.group.prime().ok_or(DhError::NullGroup)?;
        let need = self.group.value_len();
        if peer.len() != need {
            return Err(DhError::Length { need, got: peer.len() });
        }
        let y = BigUint::from_bytes_be(peer);
        if y < BigUint::from(2u32) || y >= p - 1u32 {
            return Err(DhError::OutOfRange);
        }
        Ok(pad(&y.modpow(&self.private, p), need))
    }
}

fn pad(v: &BigUint, len: usize) -> Vec<u8> {
    let bytes = v.to_bytes_be();
    let mut out = vec![0u8; len.saturating_sub(bytes.len())];
    out.extend_from_slice(&bytes);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primes_have_the_rfc_7919_shape() {
        for g in DhGroup::ALL.into_iter().skip(1) {
            let p = g.prime().unwrap();
            let bytes = p.to_bytes_be();
            assert_eq!(bytes.len(), g.value_len(), "{g:?}");
            // Top and bottom 64 bits are all ones by construction.
            assert!(bytes[..8].iter().chain(&bytes[bytes.len() - 8..]).all(|b| *b == 0xFF), "{g:?}");
            // Fermat: 2^(p-1) = 1 mod p (a cheap check that no digit was lost).
            if g.value_len() <= 512 {
                assert_eq!(BigUint::from(2u32).modpow(&(p - 1u32), p), BigUint::from(1u32), "{g:?}");
            }
        }
    }

    #[test]
    fn both_sides_derive_the_same_session_key() {
        for g in [DhGroup::Ffdhe2048, DhGroup::Ffdhe3072] {
            let a = DhKeyPair::new(g, &[0x11; 32]).unwrap();
            let b = DhKeyPair::new(g, &[0x22; 32]).unwrap();
            assert_eq!(a.public().len(), g.value_len());
            let ka = a.session_key(b.public()).unwrap();
            let kb = b.session_key(a.public()).unwrap();
            assert_eq!(ka, kb);
            assert_eq!(ka.len(), g.value_len());
            let c = DhKeyPair::new(g, &[0x33; 32]).unwrap();
            assert_ne!(c.session_key(b.public()).unwrap(), ka);
        }
    }

    #[test]
    fn hostile_public_values_are_refused() {
        let g = DhGroup::Ffdhe2048;
        let a = DhKeyPair::new(g, &[5; 32]).unwrap();
        assert_eq!(a.session_key(&[1; 10]), Err(DhError::Length { need: 256, got: 10 }));
        let mut one = vec![0u8; 256];
        one[255] = 1;
        assert_eq!(a.session_key(&one), Err(DhError::OutOfRange));
        let p_minus_1 = pad(&(g.prime().unwrap() - 1u32), 256);
        assert_eq!(a.session_key(&p_minus_1), Err(DhError::OutOfRange));
        assert_eq!(a.session_key(&[0xFF; 256]), Err(DhError::OutOfRange));
        assert!(DhKeyPair::new(DhGroup::Null, &[]).is_err());
    }

    #[test]
    fn names_and_ids() {
        assert_eq!(DhGroup::parse("FFDHE4096"), Some(DhGroup::Ffdhe4096));
        assert_eq!(DhGroup::parse("null"), Some(DhGroup::Null));
        assert_eq!(DhGroup::parse("modp2048"), None);
        assert_eq!(DhGroup::from_id(5), Some(DhGroup::Ffdhe8192));
        assert_eq!(DhGroup::from_id(6), None);
    }
}
