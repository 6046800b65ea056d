//! DH-HMAC-CHAP in-band authentication (NVMe Base 2.0 section 8.13, TP 8006), the parts both
//! sides share: the AUTH_Send / AUTH_Receive command fields, the protocol messages, `DHHC-1:`
//! secrets, and the hash and Diffie-Hellman computations. The conversations themselves (who sends
//! what when) live in the target and host crates.
//!
//! Encodings follow Linux 6.1 (`include/linux/nvme.h`, `drivers/nvme/common/auth.c`), which is
//! what the peers we test against implement. Nothing here draws random numbers: challenges and
//! private exponents come from the caller, so every function is deterministic and testable.

mod crypto;
mod dh;
mod ffdhe;
mod messages;
mod secret;

pub use crypto::{augmented_challenge, ctrl_response, host_response, ResponseInput};
pub use dh::{DhError, DhGroup, DhKeyPair};
pub use messages::{
    Challenge, Failure, Message, MessageError, Negotiate, Reply, Success1, Success2, MAX_MESSAGE_LEN, NEGOTIATE_LEN,
};
pub use secret::{Secret, SecretError};

use crate::le::{put_u32, u32_at};
use crate::nvme::{admin_opcode, Sqe};

/// SECP of DH-HMAC-CHAP in AUTH_Send / AUTH_Receive (CDW10 bits 31:24).
pub const SECP_DHCHAP: u8 = 0xE9;
/// SPSP0 and SPSP1 of DH-HMAC-CHAP (CDW10 bits 15:8 and 23:16).
pub const SPSP_DHCHAP: u8 = 0x01;

/// Bit of the Connect response DW0 that asks the host to authenticate the queue (AUTHREQ.ATR,
/// DW0 bits 23:16 hold AUTHREQ).
pub const CONNECT_AUTHREQ_ATR: u64 = 1 << 17;
/// AUTHREQ.ASCR: secure channel concatenation required (we never ask for it).
pub const CONNECT_AUTHREQ_ASCR: u64 = 1 << 18;

/// Hash functions of DH-HMAC-CHAP (HashID) and of `DHHC-1:` key transformation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HashId {
    Sha256 = 1,
    Sha384 = 2,
    Sha512 = 3,
}

impl HashId {
    pub const ALL: [HashId; 3] = [HashId::Sha256, HashId::Sha384, HashId::Sha512];

    pub fn from_id(id: u8) -> Option<HashId> {
        HashId::ALL.into_iter().find(|h| *h as u8 == id)
    }

    pub fn id(self) -> u8 {
        self as u8
    }

    /// Digest length in bytes (the messages' HL).
    pub fn digest_len(self) -> usize {
        match self {
            HashId::Sha256 => 32,
            HashId::Sha384 => 48,
            HashId::Sha512 => 64,
        }
    }

    /// `sha256`, `sha384`, `sha512`.
    pub fn name(self) -> &'static str {
        match self {
            HashId::Sha256 => "sha256",
            HashId::Sha384 => "sha384",
            HashId::Sha512 => "sha512",
        }
    }

    /// Accepts the names people write: `sha256`, `SHA-256`, `hmac(sha256)` (nvmet's configfs).
    pub fn parse(s: &str) -> Option<HashId> {
        let norm: String = s.trim().to_ascii_lowercase().chars().filter(|c| *c != '-').collect();
        let norm = norm.strip_prefix("hmac(").and_then(|r| r.strip_suffix(')')).unwrap_or(&norm).to_string();
        HashId::ALL.into_iter().find(|h| h.name() == norm)
    }
}

/// The DH-HMAC-CHAP part of an AUTH_Send (fctype 05h) or AUTH_Receive (06h) command: SECP,
/// SPSP0/1 in CDW10 and the transfer length (TL for Send, AL for Receive) in CDW11.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthCmd {
    pub secp: u8,
    pub spsp0: u8,
    pub spsp1: u8,
    pub len: u32,
}

impl AuthCmd {
    /// The fields a DH-HMAC-CHAP command carries.
    pub fn dhchap(len: u32) -> AuthCmd {
        AuthCmd { secp: SECP_DHCHAP, spsp0: SPSP_DHCHAP, spsp1: SPSP_DHCHAP, len }
    }

    pub fn from_sqe(sqe: &Sqe) -> AuthCmd {
        let b = &sqe.0;
        AuthCmd { spsp0: b[41], spsp1: b[42], secp: b[43], len: u32_at(b, 44) }
    }

    /// A Fabrics command of type `fctype` (AUTH_SEND or AUTH_RECV) with these fields.
    pub fn to_sqe(&self, fctype: u8, cid: u16) -> Sqe {
        let mut sqe = Sqe::new(admin_opcode::FABRICS, cid);
        sqe.set_fctype(fctype);
        sqe.0[41] = self.spsp0;
        sqe.0[42] = self.spsp1;
        sqe.0[43] = self.secp;
        put_u32(&mut sqe.0, 44, self.len);
        sqe
    }

    /// True when SECP/SPSP name DH-HMAC-CHAP, the only protocol there is.
    pub fn is_dhchap(&self) -> bool {
        self.secp == SECP_DHCHAP && self.spsp0 == SPSP_DHCHAP && self.spsp1 == SPSP_DHCHAP
    }
}

/// Reason code explanations of Failure1/Failure2 messages (RESCODE_EXP, with RESCODE 01h).
pub mod failure {
    pub const REASON_FAILED: u8 = 0x01;

    pub const FAILED: u8 = 0x01;
    pub const NOT_USABLE: u8 = 0x02;
    pub const CONCAT_MISMATCH: u8 = 0x03;
    pub const HASH_UNUSABLE: u8 = 0x04;
    pub const DHGROUP_UNUSABLE: u8 = 0x05;
    pub const INCORRECT_PAYLOAD: u8 = 0x06;
    pub const INCORRECT_MESSAGE: u8 = 0x07;

    /// Words for a reason code explanation, for logs and errors.
    pub fn describe(code: u8) -> &'static str {
        match code {
            FAILED => "authentication failed",
            NOT_USABLE => "authentication protocol not usable",
            CONCAT_MISMATCH => "secure channel concatenation mismatch",
            HASH_UNUSABLE => "hash function not usable",
            DHGROUP_UNUSABLE => "DH group not usable",
            INCORRECT_PAYLOAD => "incorrect payload",
            INCORRECT_MESSAGE => "incorrect protocol message",
            _ => "unknown reason",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabrics::fctype;

    #[test]
    fn hash_names_parse_in_every_spelling() {
        assert_eq!(HashId::parse("sha256"), Some(HashId::Sha256));
        assert_eq!(HashId::parse("SHA-384"), Some(HashId::Sha384));
        assert_eq!(HashId::parse("hmac(sha512)"), Some(HashId::Sha512));
        assert_eq!(HashId::parse("md5"), None);
        assert_eq!(HashId::from_id(0), None);
        assert_eq!(HashId::from_id(3).map(HashId::digest_len), Some(64));
    }

    #[test]
    fn auth_command_fields_sit_where_linux_puts_them() {
        let sqe = AuthCmd::dhchap(72).to_sqe(fctype::AUTH_SEND, 9);
        // CDW10 = resv | spsp0 << 8 | spsp1 << 16 | secp << 24; CDW11 = TL.
        assert_eq!(u32_at(&sqe.0, 40), 0xE901_0100);
        assert_eq!(u32_at(&sqe.0, 44), 72);
        assert_eq!(sqe.fctype(), fctype::AUTH_SEND);
        let back = AuthCmd::from_sqe(&sqe);
        assert!(back.is_dhchap());
        assert_eq!(back.len, 72);
        let mut other = back;
        other.secp = 0xEA;
        assert!(!other.is_dhchap());
    }
}
