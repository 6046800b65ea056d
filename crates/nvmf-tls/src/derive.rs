//! From a configured PSK to the TLS PSK and its identity, as the NVMe/TCP transport specification
//! defines it (TP 8011, and TP 8018 for the `NVMe1` identity with the PSK digest):
//!
//! 1. Retained PSK = HKDF-Expand-Label(HKDF-Extract(0, configured PSK), "HostNQN", NQNh, L) with the
//!    key's transform hash and L = length of the configured PSK; for transform `00` the configured
//!    PSK is the retained PSK.
//! 2. PSK digest (identity version 1 only) = Base64(HMAC(retained PSK, NQNh || " " || NQNc || " " ||
//!    "NVMe-over-Fabrics")) with the cipher suite's hash.
//! 3. Identity: `NVMe0R<hh> <NQNh> <NQNc>` (version 0) or `NVMe1R<hh> <NQNh> <NQNc> <digest>`
//!    (version 1); `hh` is `01` for SHA-256 (TLS_AES_128_GCM_SHA256), `02` for SHA-384
//!    (TLS_AES_256_GCM_SHA384).
//! 4. TLS PSK = HKDF-Expand-Label(HKDF-Extract(0, retained PSK), "nvme-tls-psk", context, L), where
//!    the context is the whole identity for version 0 and `"<hh> <digest>"` for version 1 (as
//!    libnvme and the kernel's `nvme_auth_derive_tls_psk` compute it).
//!
//! The `compat` variant reproduces what nvme-cli's `--compat` selects: libnvme's older, incorrect
//! HkdfLabel, whose length is little-endian and whose label and context carry no length bytes.
//! Keys derived that way only interoperate with peers that derive them the same way.

use hmac::{Hmac, Mac};
use sha2::{Sha256, Sha384};

use crate::key::ConfiguredPsk;
use crate::secret::Secret;
use crate::TlsHash;

/// Longest NQN the specification allows, in bytes.
pub const MAX_NQN_LEN: usize = 223;

/// Which PSK identity form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IdentityVersion {
    /// `NVMe0R<hh> <hostnqn> <subnqn>` (TP 8011).
    V0,
    /// `NVMe1R<hh> <hostnqn> <subnqn> <digest>` (TP 8018).
    V1,
}

/// How to derive: the identity form and whether to reproduce libnvme's `--compat` HkdfLabel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Derivation {
    pub version: IdentityVersion,
    pub compat: bool,
}

impl Default for Derivation {
    fn default() -> Self {
        Derivation { version: IdentityVersion::V1, compat: false }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeriveError {
    #[error("{which} NQN is empty")]
    EmptyNqn { which: &'static str },
    #[error("{which} NQN is {len} bytes; at most 223 are allowed")]
    NqnTooLong { which: &'static str, len: usize },
    #[error("{which} NQN contains whitespace or a control character, which a PSK identity cannot carry")]
    NqnBadChar { which: &'static str },
    #[error("HKDF label context is {len} bytes; TLS 1.3's HkdfLabel holds at most 255 (use identity version 1 for long NQNs)")]
    ContextTooLong { len: usize },
    #[error("TLS PSK is {len} bytes; {hash} takes {expected}")]
    BadPskLength { hash: TlsHash, len: usize, expected: usize },
    #[error("PSK identity '{0}' is not an NVMe identity (NVMe<0|1>R<01|02> <hostnqn> <subnqn> [digest])")]
    BadIdentity(String),
}

fn check_nqn(which: &'static str, nqn: &str) -> Result<(), DeriveError> {
    if nqn.is_empty() {
        return Err(DeriveError::EmptyNqn { which });
    }
    if nqn.len() > MAX_NQN_LEN {
        return Err(DeriveError::NqnTooLong { which, len: nqn.len() });
    }
    if nqn.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(DeriveError::NqnBadChar { which });
    }
    Ok(())
}

pub(crate) fn hmac(hash: TlsHash, key: &[u8], parts: &[&[u8]]) -> Secret {
    match hash {
        TlsHash::Sha256 => {
            let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
            for p in parts {
                m.update(p);
            }
            Secret::new(m.finalize().into_bytes().to_vec())
        }
        TlsHash::Sha384 => {
            let mut m = <Hmac<Sha384> as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
            for p in parts {
                m.update(p);
            }
            Secret::new(m.finalize().into_bytes().to_vec())
        }
    }
}

/// HKDF-Extract (RFC 5869) with no salt, i.e. a salt of hash-length zeros.
pub(crate) fn hkdf_extract(hash: TlsHash, ikm: &[u8]) -> Secret {
    let zeros = [0u8; 48];
    hmac(hash, &zeros[..hash.digest_len()], &[ikm])
}

/// HKDF-Expand (RFC 5869). `len` is at most 48 here, far below 255 blocks.
pub(crate) fn hkdf_expand(hash: TlsHash, prk: &[u8], info: &[u8], len: usize) -> Secret {
    let mut out = Vec::with_capacity(len + hash.digest_len());
    let mut prev = Secret::new(Vec::new());
    let mut counter = 1u8;
    while out.len() < len {
        let block = hmac(hash, prk, &[prev.as_bytes(), info, &[counter]]);
        out.extend_from_slice(block.as_bytes());
        prev = block;
        counter += 1;
    }
    out.truncate(len);
    Secret::new(out)
}

/// The HkdfLabel of RFC 8446 section 7.1 (`compat`: libnvme's older layout, see the module doc).
pub(crate) fn hkdf_label(len: usize, label: &str, context: &[u8], compat: bool) -> Result<Vec<u8>, DeriveError> {
    let full_label = format!("tls13 {label}");
    if context.len() > 255 {
        return Err(DeriveError::ContextTooLong { len: context.len() });
    }
    let mut info = Vec::with_capacity(4 + full_label.len() + context.len());
    if compat {
        info.extend_from_slice(&(len as u16).to_le_bytes());
        info.extend_from_slice(full_label.as_bytes());
        info.extend_from_slice(context);
    } else {
        info.extend_from_slice(&(len as u16).to_be_bytes());
        info.push(full_label.len() as u8);
        info.extend_from_slice(full_label.as_bytes());
        info.push(context.len() as u8);
        info.extend_from_slice(context);
    }
    Ok(info)
}

fn expand_label(hash: TlsHash, ikm: &[u8], label: &str, context: &[u8], len: usize, compat: bool) -> Result<Secret, DeriveError> {
    let info = hkdf_label(len, label, context, compat)?;
    let prk = hkdf_extract(hash, ikm);
    Ok(hkdf_expand(hash, prk.as_bytes(), &info, len))
}

/// Step 1: the retained PSK from the configured PSK and the host NQN.
pub fn retained_psk(configured: &ConfiguredPsk, hostnqn: &str, compat: bool) -> Result<Secret, DeriveError> {
    check_nqn("host", hostnqn)?;
    let key = configured.key();
    match configured.transform().hash() {
        None => Ok(Secret::from_slice(key)),
        Some(h) => expand_label(h, key, "HostNQN", hostnqn.as_bytes(), key.len(), compat),
    }
}

/// Step 2: the PSK digest (base64) that the version 1 identity carries.
pub fn psk_digest(hash: TlsHash, retained: &[u8], hostnqn: &str, subnqn: &str) -> Result<String, DeriveError> {
    use base64::Engine;
    check_nqn("host", hostnqn)?;
    check_nqn("subsystem", subnqn)?;
    let mac = hmac(
        hash,
        retained,
        &[hostnqn.as_bytes(), b" ", subnqn.as_bytes(), b" ", b"NVMe-over-Fabrics"],
    );
    Ok(base64::engine::general_purpose::STANDARD.encode(mac.as_bytes()))
}

/// The TLS PSK with the identity that names it, ready for a TLS 1.3 handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsPsk {
    identity: String,
    hash: TlsHash,
    key: Secret,
}

impl TlsPsk {
    /// A TLS PSK taken as it is (e.g. one read from a keyring): `key` must be the hash's length.
    pub fn from_raw(identity: &str, hash: TlsHash, key: &[u8]) -> Result<Self, DeriveError> {
        if key.len() != hash.digest_len() {
            return Err(DeriveError::BadPskLength { hash, len: key.len(), expected: hash.digest_len() });
        }
        Ok(TlsPsk { identity: identity.to_string(), hash, key: Secret::from_slice(key) })
    }

    /// Steps 1 to 4: the TLS PSK and identity a host `hostnqn` uses towards subsystem `subnqn`.
    pub fn derive(configured: &ConfiguredPsk, hostnqn: &str, subnqn: &str, how: Derivation) -> Result<Self, DeriveError> {
        check_nqn("host", hostnqn)?;
        check_nqn("subsystem", subnqn)?;
        let retained = retained_psk(configured, hostnqn, how.compat)?;
        let hash = configured.cipher_hash();
        let len = retained.len();
        let (identity, context) = match how.version {
            IdentityVersion::V0 => {
                let id = format!("NVMe0R{:02} {hostnqn} {subnqn}", hash.id());
                (id.clone(), id)
            }
            IdentityVersion::V1 => {
                let digest = psk_digest(hash, retained.as_bytes(), hostnqn, subnqn)?;
                (
                    format!("NVMe1R{:02} {hostnqn} {subnqn} {digest}", hash.id()),
                    format!("{:02} {digest}", hash.id()),
                )
            }
        };
        let key = expand_label(hash, retained.as_bytes(), "nvme-tls-psk", context.as_bytes(), len, how.compat)?;
        Ok(TlsPsk { identity, hash, key })
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn hash(&self) -> TlsHash {
        self.hash
    }

    pub fn key(&self) -> &[u8] {
        self.key.as_bytes()
    }
}

/// A PSK identity taken apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PskIdentity {
    pub version: IdentityVersion,
    pub hash: TlsHash,
    pub hostnqn: String,
    pub subnqn: String,
    pub digest: Option<String>,
}

impl PskIdentity {
    /// Parses `NVMe0R<hh> <hostnqn> <subnqn>` or `NVMe1R<hh> <hostnqn> <subnqn> <digest>`.
    pub fn parse(identity: &str) -> Result<Self, DeriveError> {
        let bad = || DeriveError::BadIdentity(identity.chars().take(64).flat_map(char::escape_default).collect());
        if identity.len() > 4 + 2 * MAX_NQN_LEN + 16 + 64 {
            return Err(bad());
        }
        let mut parts = identity.split(' ');
        let head = parts.next().ok_or_else(bad)?;
        let (version, hh) = match (head.get(..6), head.get(6..)) {
            (Some("NVMe0R"), Some(hh)) => (IdentityVersion::V0, hh),
            (Some("NVMe1R"), Some(hh)) => (IdentityVersion::V1, hh),
            _ => return Err(bad()),
        };
        let hash = match hh {
            "01" => TlsHash::Sha256,
            "02" => TlsHash::Sha384,
            _ => return Err(bad()),
        };
        let hostnqn = parts.next().ok_or_else(bad)?.to_string();
        let subnqn = parts.next().ok_or_else(bad)?.to_string();
        check_nqn("host", &hostnqn).map_err(|_| bad())?;
        check_nqn("subsystem", &subnqn).map_err(|_| bad())?;
        let digest = match version {
            IdentityVersion::V0 => None,
            IdentityVersion::V1 => {
                let d = parts.next().ok_or_else(bad)?;
                if d.len() != 4 * hash.digest_len().div_ceil(3) {
                    return Err(bad());
                }
                Some(d.to_string())
            }
        };
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(PskIdentity { version, hash, hostnqn, subnqn, digest })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::PskTransform;

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    // Key bytes of libnvme's test/psk.c.
    const K32: &str = "5512dbb6737d0106f65975b773dfb011ffc344bcf442e2dd6d8bc4870b5d5b03";
    const K48: &str = "5512dbb6737d0106f65975b773dfb011ffc344bcf442e2dd6d8bc4870b5d5b03ffc344bcf442e2dd6d8bc4870b5d5b03";
    const HOST: &str = "nqn.psk-test-host";
    const SUB: &str = "nqn.psk-test-subsys";

    /// One vector: the inputs, then (retained, identity v0, TLS PSK v0, identity v1, TLS PSK v1),
    /// normal and compat.
    struct Vector {
        transform: PskTransform,
        key: &'static str,
        host: &'static str,
        sub: &'static str,
        normal: [&'static str; 5],
        compat: [&'static str; 5],
    }

    // libnvme test/psk.c publishes the identities (with their digests) of the first two rows, normal
    // and compat; every other value was computed by a C program that makes libnvme's exact OpenSSL
    // calls (src/nvme/linux.c: EVP_PKEY HKDF with the HkdfLabel built as derive_retained_key /
    // derive_tls_key / their _compat versions build it, EVP_MAC HMAC for the digest) against
    // Debian's OpenSSL 3.0.19, and which also checked the kernel's construction
    // (drivers/nvme/common/auth.c: hkdf_extract with a zero salt, hkdf_expand_label,
    // nvme_auth_generate_digest, nvme_auth_derive_tls_psk) gives the same retained and v1 TLS PSK.
    const VECTORS: &[Vector] = &[
        Vector {
            transform: PskTransform::Sha256,
            key: K32,
            host: HOST,
            sub: SUB,
            normal: [
                "073311dec37e219ff3acd43f130130c5bdd443c066e1cc3424e49030234ff7d5",
                "NVMe0R01 nqn.psk-test-host nqn.psk-test-subsys",
                "05c6503551ad136e6ee32e6eeb3f6d500b69701d84ec71e328f65c7f51566f68",
                "NVMe1R01 nqn.psk-test-host nqn.psk-test-subsys iSbjiStwJ/1TrTvDlt2fjFmzvsytOJelidNnA+X5lEU=",
                "8fc3c0badfd4c0c66fa3ca33aadd0314f85536cc9bc47338b60f3e6e563786ca",
            ],
            compat: [
                "ad4cdadfcbaf4e353fcbd09aac891c4d75c5300fe5ee7bb04ae87726a312eddc",
                "NVMe0R01 nqn.psk-test-host nqn.psk-test-subsys",
                "09fb1983ac6d6d0353e7cae4f23daddd651c367fa347c59d9cf6936f5a83eafb",
                "NVMe1R01 nqn.psk-test-host nqn.psk-test-subsys 66GuqV08TsAGII39teWUfwQwizjv06Jy8jOcX3NAAzM=",
                "b9f5ab2a41ba6e72a23a12066302a2f775fa6c0942c8e0b18ca8ac07edf305e2",
            ],
        },
        Vector {
            transform: PskTransform::Sha384,
            key: K48,
            host: HOST,
            sub: SUB,
            normal: [
                "73973a1b51a9acdde29a0610ac6a3ef852cf45936cca6830a661d18f68502f1a4c7a8ecb37524e0b1f7087cb4d680ad9",
                "NVMe0R02 nqn.psk-test-host nqn.psk-test-subsys",
                "f42ba63824cdfe421914c582921f85b5b5b7e2d4df084caeedc9be20b212e8bb0fe8a23e9d59a1c8fc6449da4970a78d",
                "NVMe1R02 nqn.psk-test-host nqn.psk-test-subsys QhW2+Rp6RzHlNtCslyRxMnwJ11tKKhz8JCAQpQ+XUD8f9td1VeH5h53yz2wKJG1a",
                "a2b2f943f479fc682555cec89857c80ed004ce92f32a973d5764155bb7e36b17a85368a0666d250afac9282dda2e62ca",
            ],
            compat: [
                "12d2452bc4783f50286bf940ad1caa05a304065e379024d9278ca7c9d8a42400c47029f198bfcdf5f14c07cb04eb7306",
                "NVMe0R02 nqn.psk-test-host nqn.psk-test-subsys",
                "2ee4754186a625b28a3936ef4a40d839c3ad958b2e017562ee07e2501f172ce999dc9c29033ea7ee33f814f192c13f47",
                "NVMe1R02 nqn.psk-test-host nqn.psk-test-subsys RsKmYJ3nAn1ApjjMloJFbAkLPivONDAX/xW327YBUsn2eGShXSjCZvBaOxscLqmz",
                "fcefe2e2a2e682b1447dcabf1ec268f78f08c63cd075753abcc8bda2c5c34d48d3014aa8d76ad80107e4f5c9f27e2149",
            ],
        },
        Vector {
            transform: PskTransform::None,
            key: K32,
            host: HOST,
            sub: SUB,
            normal: [
                K32,
                "NVMe0R01 nqn.psk-test-host nqn.psk-test-subsys",
                "ec85300ba827726bd3bc4fc07f3a34aec5fe7c8ccac05fefc2f021c74e0df9ef",
                "NVMe1R01 nqn.psk-test-host nqn.psk-test-subsys quJVUJjp/BImWR0UQay/MjSfEgyAr6TyBOWybS/B404=",
                "a45d08ee4639c7570729bb3e57e905e466a49a15ece5401af906830c4d3bdb0b",
            ],
            compat: [
                K32,
                "NVMe0R01 nqn.psk-test-host nqn.psk-test-subsys",
                "e2b16189378b34adba9fec995ab479040cedec0bc7c6b47728ee4d8de6ff52ba",
                "NVMe1R01 nqn.psk-test-host nqn.psk-test-subsys quJVUJjp/BImWR0UQay/MjSfEgyAr6TyBOWybS/B404=",
                "d50f6d3dd79345b6e8217744524df5ac0dc66964ff70cc5fd18e1b9d57ce7fcf",
            ],
        },
        Vector {
            transform: PskTransform::None,
            key: K48,
            host: HOST,
            sub: SUB,
            normal: [
                K48,
                "NVMe0R02 nqn.psk-test-host nqn.psk-test-subsys",
                "b5dd464067a9378ba2226d71f005d7ac90ed8696e4b2142084384365597201d33ba26f8aeeb529574d4267bd294a828e",
                "NVMe1R02 nqn.psk-test-host nqn.psk-test-subsys dyoPfSR5TBRaPMI5/FXUlJv2XMDtmQ7Q9Xrj89aBKbyRYkQeT5V1wNvIpnMDRTQW",
                "1569317890995e207ab4cf148bc53470561e148030cb019b1d87fb4bc5794a791ed5ee68676c952ce5f11f3786e900d4",
            ],
            compat: [
                K48,
                "NVMe0R02 nqn.psk-test-host nqn.psk-test-subsys",
                "9cb989c1d40fdcdc1bb729d6691901bfcd0b310f060f558d4a63c7afc2a0923f2d0610073fded349d25d6b3f91980826",
                "NVMe1R02 nqn.psk-test-host nqn.psk-test-subsys dyoPfSR5TBRaPMI5/FXUlJv2XMDtmQ7Q9Xrj89aBKbyRYkQeT5V1wNvIpnMDRTQW",
                "f6259eaeaab509d2e42bc494098bd1ccc4334b2528a1a34ea95fbe27e3fa75e3422d260a299110afa42170521b02d689",
            ],
        },
        Vector {
            transform: PskTransform::Sha256,
            key: K32,
            host: "nqn.2014-08.org.nvmexpress:uuid:befdec4c-2234-11b2-a85c-ca77c773af36",
            sub: "nqn.2024-01.io.nvmflab:sub0",
            normal: [
                "eafefdc45d5a188cf7c1202aefa73b6ad34c49d3dd0ef383d79cf0ee307a4c86",
                "NVMe0R01 nqn.2014-08.org.nvmexpress:uuid:befdec4c-2234-11b2-a85c-ca77c773af36 nqn.2024-01.io.nvmflab:sub0",
                "f85a00bcf2e10da892936bad567960225148606f6fad73a01f3b5c182a033382",
                "NVMe1R01 nqn.2014-08.org.nvmexpress:uuid:befdec4c-2234-11b2-a85c-ca77c773af36 nqn.2024-01.io.nvmflab:sub0 X4KzyznO8YfD68gioWqKNr1VK4b1PUN87tu2gJ1VVVI=",
                "8471220dfb3db2476b035e9fe9968a40b023326da0594577eccb4f73b691a24e",
            ],
            compat: [
                "8965e9a62084404bfa5ca1e814aaaccbc2f812afa1909fee76ad7eb190446fb0",
                "NVMe0R01 nqn.2014-08.org.nvmexpress:uuid:befdec4c-2234-11b2-a85c-ca77c773af36 nqn.2024-01.io.nvmflab:sub0",
                "68d6f0a339ae635b7790bb333628406b5bd8500499b00e982c378a14aa372c4d",
                "NVMe1R01 nqn.2014-08.org.nvmexpress:uuid:befdec4c-2234-11b2-a85c-ca77c773af36 nqn.2024-01.io.nvmflab:sub0 DeycaNLBc80G1C3MZuBY+rqcbXdcnYTW25DPxiNilGE=",
                "e195464baa1eb623ffcd84330a9a8f5b29f1870a437669a235d4f12981c6cc2a",
            ],
        },
    ];

    #[test]
    fn vectors_byte_for_byte() {
        for v in VECTORS {
            let configured = ConfiguredPsk::new(v.transform, &unhex(v.key)).unwrap();
            for (compat, want) in [(false, &v.normal), (true, &v.compat)] {
                let what = format!("{:?} {} compat={compat}", v.transform, v.host);
                let retained = retained_psk(&configured, v.host, compat).unwrap();
                assert_eq!(retained.as_bytes(), &unhex(want[0])[..], "retained {what}");
                let p0 = TlsPsk::derive(&configured, v.host, v.sub, Derivation { version: IdentityVersion::V0, compat }).unwrap();
                assert_eq!(p0.identity(), want[1], "{what}");
                assert_eq!(p0.key(), &unhex(want[2])[..], "v0 TLS PSK {what}");
                let p1 = TlsPsk::derive(&configured, v.host, v.sub, Derivation { version: IdentityVersion::V1, compat }).unwrap();
                assert_eq!(p1.identity(), want[3], "{what}");
                assert_eq!(p1.key(), &unhex(want[4])[..], "v1 TLS PSK {what}");
                assert_eq!(p1.hash(), configured.cipher_hash());
                let parsed = PskIdentity::parse(p1.identity()).unwrap();
                assert_eq!((parsed.hostnqn.as_str(), parsed.subnqn.as_str()), (v.host, v.sub));
                assert_eq!(parsed.version, IdentityVersion::V1);
                let parsed0 = PskIdentity::parse(p0.identity()).unwrap();
                assert_eq!((parsed0.version, parsed0.digest), (IdentityVersion::V0, None));
            }
        }
    }

    #[test]
    fn rfc5869_sha256_case_1() {
        // RFC 5869 appendix A.1 checks the HKDF primitive itself (with its salt given explicitly).
        let ikm = [0x0bu8; 22];
        let salt = unhex("000102030405060708090a0b0c");
        let info = unhex("f0f1f2f3f4f5f6f7f8f9");
        let prk = hmac(TlsHash::Sha256, &salt, &[&ikm]);
        assert_eq!(prk.as_bytes(), &unhex("077709362c2e32df0ddc3f0dc47bba6390b6c73bb50f9c3122ec844ad7c2b3e5")[..]);
        let okm = hkdf_expand(TlsHash::Sha256, prk.as_bytes(), &info, 42);
        assert_eq!(
            okm.as_bytes(),
            &unhex("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865")[..]
        );
    }

    #[test]
    fn bad_inputs() {
        let k = ConfiguredPsk::new(PskTransform::Sha256, &unhex(K32)).unwrap();
        let d = Derivation::default();
        assert!(matches!(TlsPsk::derive(&k, "", SUB, d), Err(DeriveError::EmptyNqn { which: "host" })));
        assert!(matches!(TlsPsk::derive(&k, HOST, &"n".repeat(224), d), Err(DeriveError::NqnTooLong { .. })));
        assert!(matches!(TlsPsk::derive(&k, "nqn.a b", SUB, d), Err(DeriveError::NqnBadChar { .. })));
        let long = format!("nqn.{}", "x".repeat(200));
        let v0 = Derivation { version: IdentityVersion::V0, compat: false };
        assert!(matches!(TlsPsk::derive(&k, &long, &long, v0), Err(DeriveError::ContextTooLong { .. })));
        assert!(TlsPsk::derive(&k, &long, &long, d).is_ok());
        assert!(TlsPsk::from_raw("x", TlsHash::Sha384, &[0; 32]).is_err());
        for bad in ["", "NVMe2R01 a b", "NVMe0R03 a b", "NVMe0R01 a", "NVMe0R01 a b c", "NVMe1R01 a b", "NVMe1R01 a b short", "NVMe0R01  b"] {
            assert!(PskIdentity::parse(bad).is_err(), "{bad}");
        }
    }
}
