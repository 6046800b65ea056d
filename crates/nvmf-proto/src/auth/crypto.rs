//! The HMAC computations of DH-HMAC-CHAP (NVMe Base 2.0 section 8.13.5.4): the responses both
//! sides compute and compare, and the challenge augmented with the Diffie-Hellman session key.

use super::HashId;
use hmac::digest::KeyInit;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha384, Sha512};

/// HMAC with `hash` over the concatenation of `parts`.
pub(crate) fn hmac(hash: HashId, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    fn run<M: Mac + KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
        // HMAC takes keys of any length, so this cannot fail.
        let mut mac = <M as Mac>::new_from_slice(key).expect("HMAC accepts any key length");
        for p in parts {
            mac.update(p);
        }
        mac.finalize().into_bytes().to_vec()
    }
    match hash {
        HashId::Sha256 => run::<Hmac<Sha256>>(key, parts),
        HashId::Sha384 => run::<Hmac<Sha384>>(key, parts),
        HashId::Sha512 => run::<Hmac<Sha512>>(key, parts),
    }
}

fn digest(hash: HashId, data: &[u8]) -> Vec<u8> {
    match hash {
        HashId::Sha256 => Sha256::digest(data).to_vec(),
        HashId::Sha384 => Sha384::digest(data).to_vec(),
        HashId::Sha512 => Sha512::digest(data).to_vec(),
    }
}

/// With a DH group, each side answers the challenge augmented by the session key Ks:
/// C' = HMAC(H(Ks), C), so that only a party to the key exchange can compute the response.
pub fn augmented_challenge(hash: HashId, session_key: &[u8], challenge: &[u8]) -> Vec<u8> {
    hmac(hash, &digest(hash, session_key), &[challenge])
}

/// What goes into a response besides the role.
#[derive(Debug, Clone, Copy)]
pub struct ResponseInput<'a> {
    pub hash: HashId,
    /// The responder's secret, transformed (see [`super::Secret::transformed`]).
    pub key: &'a [u8],
    /// The challenge, augmented when a DH group is in use.
    pub challenge: &'a [u8],
    pub seqnum: u32,
    pub transaction: u16,
    pub hostnqn: &'a str,
    pub subnqn: &'a str,
}

/// The host's response R1 = HMAC(Kh, C1 || S1 || T_ID || 00h || "HostHost" || NQNh || 00h || NQNc).
pub fn host_response(i: &ResponseInput) -> Vec<u8> {
    response(i, b"HostHost", i.hostnqn, i.subnqn)
}

/// The controller's response R2 = HMAC(Kc, C2 || S2 || T_ID || 00h || "Controller" || NQNc || 00h
/// || NQNh), which the host checks in bidirectional authentication.
pub fn ctrl_response(i: &ResponseInput) -> Vec<u8> {
    response(i, b"Controller", i.subnqn, i.hostnqn)
}

fn response(i: &ResponseInput, role: &[u8], first_nqn: &str, second_nqn: &str) -> Vec<u8> {
    let seq = i.seqnum.to_le_bytes();
    let tid = i.transaction.to_le_bytes();
    hmac(i.hash, i.key, &[i.challenge, &seq, &tid, &[0], role, first_nqn.as_bytes(), &[0], second_nqn.as_bytes()])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231_test_case_2() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        let parts: [&[u8]; 2] = [b"what do ya want ", b"for nothing?"];
        let mac = hmac(HashId::Sha256, b"Jefe", &parts);
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
        assert_eq!(hmac(HashId::Sha384, b"Jefe", &parts).len(), 48);
        assert_eq!(hmac(HashId::Sha512, b"Jefe", &parts).len(), 64);
    }

    fn input<'a>(key: &'a [u8], challenge: &'a [u8]) -> ResponseInput<'a> {
        ResponseInput {
            hash: HashId::Sha256,
            key,
            challenge,
            seqnum: 0x0102_0304,
            transaction: 7,
            hostnqn: "nqn.host",
            subnqn: "nqn.subsys",
        }
    }

    #[test]
    fn responses_are_the_hmac_of_the_fields_in_order() {
        let key = [1u8; 32];
        let c = [2u8; 32];
        let i = input(&key, &c);
        let mut msg = c.to_vec();
        msg.extend_from_slice(&[4, 3, 2, 1, 7, 0, 0]);
        msg.extend_from_slice(b"HostHostnqn.host\0nqn.subsys");
        assert_eq!(host_response(&i), hmac(HashId::Sha256, &key, &[&msg]));
        // The controller's response names the roles the other way round, so it differs.
        assert_ne!(ctrl_response(&i), host_response(&i));
        // Every field counts.
        let mut j = i;
        j.transaction = 8;
        assert_ne!(host_response(&j), host_response(&i));
        let mut j = i;
        j.seqnum = 0;
        assert_ne!(host_response(&j), host_response(&i));
    }

    #[test]
    fn augmentation_keys_the_challenge_with_the_hashed_session_key() {
        let c = [9u8; 48];
        let aug = augmented_challenge(HashId::Sha384, b"session", &c);
        assert_eq!(aug, hmac(HashId::Sha384, &digest(HashId::Sha384, b"session"), &[&c]));
        assert_ne!(aug, augmented_challenge(HashId::Sha384, b"other", &c));
    }
}
