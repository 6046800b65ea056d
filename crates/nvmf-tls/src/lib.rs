//! NVMe/TCP over TLS 1.3 (NVMe/TCP transport specification, TP 8011): the pieces that the target
//! and the host plug in.
//!
//! - [`key`]: the PSK interchange format `NVMeTLSkey-1:HH:<base64>:` (parse, format, generate).
//! - [`derive`]: configured PSK → retained PSK → TLS PSK, and the PSK identities `NVMe0R<hh> ...`
//!   and `NVMe1R<hh> ... <digest>`, checked byte for byte against libnvme's and the kernel's.
//! - [`session`]: a TLS 1.3 PSK session (OpenSSL) as a sans-I/O byte transform:
//!   [`session::TlsSession::feed`] takes ciphertext and gives plaintext,
//!   [`session::TlsSession::send`] takes plaintext and gives ciphertext. OpenSSL runs the
//!   handshake; the application records are [`record`]'s, sealed and opened in place, and
//!   [`landing`]'s when a large payload's records are received straight into its buffer.
//!
//! - [`hostile`]: drivers that feed hostile bytes to the server side, for property tests and fuzzing.
//! - [`ktls`]: hands an established session's records to the kernel (kTLS), and
//!   [`boundary`]: reads that stop at a record's end, so the kernel misses nothing.
//!
//! Nothing here does I/O but [`ktls`]'s socket options; docs/tls.md says what is wired and what
//! is left.

pub mod binder;
pub mod boundary;
mod channel;
pub mod derive;
mod error;
pub mod hostile;
pub mod key;
pub mod ktls;
pub mod landing;
pub mod record;
mod secret;
pub mod session;

pub use derive::{Derivation, DeriveError, IdentityVersion, PskIdentity, TlsPsk};
pub use key::{ConfiguredPsk, KeyError, PskTransform};
pub use ktls::KtlsMode;
pub use secret::Secret;
pub use session::{ClientConfig, ServerConfig, SessionInfo, TlsError, TlsSession};


use std::fmt;

/// The hash of a TLS PSK and of its cipher suite: the `hh` of a PSK identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TlsHash {
    /// `01`: TLS_AES_128_GCM_SHA256.
    Sha256,
    /// `02`: TLS_AES_256_GCM_SHA384.
    Sha384,
}

impl TlsHash {
    /// The identity's `hh` value.
    pub fn id(self) -> u8 {
        match self {
            TlsHash::Sha256 => 1,
            TlsHash::Sha384 => 2,
        }
    }

    /// Output length in bytes, which is also the TLS PSK's length.
    pub fn digest_len(self) -> usize {
        match self {
            TlsHash::Sha256 => 32,
            TlsHash::Sha384 => 48,
        }
    }

    /// The TLS 1.3 cipher suite that goes with this hash.
    pub fn suite(self) -> &'static str {
        match self {
            TlsHash::Sha256 => "TLS_AES_128_GCM_SHA256",
            TlsHash::Sha384 => "TLS_AES_256_GCM_SHA384",
        }
    }

    /// The suite's two-byte code (RFC 8446 appendix B.4).
    pub fn suite_code(self) -> [u8; 2] {
        match self {
            TlsHash::Sha256 => [0x13, 0x01],
            TlsHash::Sha384 => [0x13, 0x02],
        }
    }
}

impl fmt::Display for TlsHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TlsHash::Sha256 => "SHA-256",
            TlsHash::Sha384 => "SHA-384",
        })
    }
}
