//! The DH-HMAC-CHAP messages carried by AUTH_Send and AUTH_Receive (NVMe Base 2.0 section
//! 8.13.5.x; layouts as Linux's `struct nvmf_auth_dhchap_*_data`). Every message starts with
//! AUTH_TYPE, AUTH_ID, two reserved bytes and the 16-bit transaction identifier T_ID.

use super::failure;
use crate::le::{put_u16, put_u32, u16_at, u32_at};

/// The largest message either side accepts or asks for (Linux's host buffer size; the biggest
/// real message, a Reply with SHA-512 and ffdhe8192, is 1168 bytes).
pub const MAX_MESSAGE_LEN: usize = 4096;
/// A Negotiate with one protocol descriptor, as Linux sends it.
pub const NEGOTIATE_LEN: usize = 8 + DESCRIPTOR_LEN;

const DESCRIPTOR_LEN: usize = 64;
const DHCHAP_AUTH_ID: u8 = 0x01;
/// Offsets in a descriptor's ID list: hash IDs first, DH group IDs from 30.
const IDLIST_DH: usize = 30;
const IDLIST_MAX: usize = 30;

mod kind {
    pub const COMMON: u8 = 0x00;
    pub const DHCHAP: u8 = 0x01;
}

mod id {
    pub const NEGOTIATE: u8 = 0x00;
    pub const CHALLENGE: u8 = 0x01;
    pub const REPLY: u8 = 0x02;
    pub const SUCCESS1: u8 = 0x03;
    pub const SUCCESS2: u8 = 0x04;
    pub const FAILURE2: u8 = 0xF0;
    pub const FAILURE1: u8 = 0xF1;
}

/// AUTH_Negotiate: the host's offer (security capabilities and the hash and DH group IDs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiate {
    pub t_id: u16,
    /// Secure channel concatenation (0: none).
    pub sc_c: u8,
    pub hashes: Vec<u8>,
    pub dhgroups: Vec<u8>,
}

/// DH-HMAC-CHAP_Challenge: C1 and, with a DH group, the controller's public value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    pub t_id: u16,
    pub hash_id: u8,
    pub dhgroup_id: u8,
    pub seqnum: u32,
    pub challenge: Vec<u8>,
    pub dh_value: Vec<u8>,
}

/// DH-HMAC-CHAP_Reply: the host's response R1, its challenge C2 for bidirectional
/// authentication (`seqnum` S2 non-zero), and its public value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub t_id: u16,
    pub response: Vec<u8>,
    /// Some(C2) when the host wants the controller to authenticate itself.
    pub challenge: Option<Vec<u8>>,
    pub seqnum: u32,
    pub dh_value: Vec<u8>,
}

/// DH-HMAC-CHAP_Success1: the host is authenticated; with R2 when the host sent C2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Success1 {
    pub t_id: u16,
    pub hash_len: u8,
    pub response: Option<Vec<u8>>,
}

/// DH-HMAC-CHAP_Success2: the host accepted the controller's response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Success2 {
    pub t_id: u16,
}

/// AUTH_Failure1 (controller to host) or AUTH_Failure2 (host to controller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub t_id: u16,
    /// AUTH_Failure1 when true, AUTH_Failure2 otherwise.
    pub from_controller: bool,
    pub reason: u8,
    pub explanation: u8,
}

impl Failure {
    pub fn new(t_id: u16, from_controller: bool, explanation: u8) -> Failure {
        Failure { t_id, from_controller, reason: failure::REASON_FAILED, explanation }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Negotiate(Negotiate),
    Challenge(Challenge),
    Reply(Reply),
    Success1(Success1),
    Success2(Success2),
    Failure(Failure),
}

/// Why a message could not be decoded, with the Failure reason code explanation it warrants.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{detail}")]
pub struct MessageError {
    pub explanation: u8,
    pub detail: String,
}

fn payload(detail: impl Into<String>) -> MessageError {
    MessageError { explanation: failure::INCORRECT_PAYLOAD, detail: detail.into() }
}

fn need(b: &[u8], n: usize, what: &str) -> Result<(), MessageError> {
    if b.len() < n {
        return Err(payload(format!("{what}: {} bytes, need {n}", b.len())));
    }
    Ok(())
}

fn header(out: &mut Vec<u8>, len: usize, kind: u8, id: u8, t_id: u16) {
    out.clear();
    out.resize(len, 0);
    out[0] = kind;
    out[1] = id;
    put_u16(out, 4, t_id);
}

impl Message {
    /// The transaction identifier every message carries.
    pub fn t_id(&self) -> u16 {
        match self {
            Message::Negotiate(m) => m.t_id,
            Message::Challenge(m) => m.t_id,
            Message::Reply(m) => m.t_id,
            Message::Success1(m) => m.t_id,
            Message::Success2(m) => m.t_id,
            Message::Failure(m) => m.t_id,
        }
    }

    /// The message's name in the specification, for logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Message::Negotiate(_) => "AUTH_Negotiate",
            Message::Challenge(_) => "DH-HMAC-CHAP_Challenge",
            Message::Reply(_) => "DH-HMAC-CHAP_Reply",
            Message::Success1(_) => "DH-HMAC-CHAP_Success1",
            Message::Success2(_) => "DH-HMAC-CHAP_Success2",
            Message::Failure(f) if f.from_controller => "AUTH_Failure1",
            Message::Failure(_) => "AUTH_Failure2",
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Message::Negotiate(m) => {
                header(&mut out, NEGOTIATE_LEN, kind::COMMON, id::NEGOTIATE, m.t_id);
                out[6] = m.sc_c;
                out[7] = 1;
                let hashes = &m.hashes[..m.hashes.len().min(IDLIST_MAX)];
                let groups = &m.dhgroups[..m.dhgroups.len().min(IDLIST_MAX)];
                out[8] = DHCHAP_AUTH_ID;
                out[10] = hashes.len() as u8;
                out[11] = groups.len() as u8;
                out[12..12 + hashes.len()].copy_from_slice(hashes);
                out[12 + IDLIST_DH..12 + IDLIST_DH + groups.len()].copy_from_slice(groups);
            }
            Message::Challenge(m) => {
                let hl = m.challenge.len().min(255);
                header(&mut out, 16 + hl + m.dh_value.len(), kind::DHCHAP, id::CHALLENGE, m.t_id);
                out[6] = hl as u8;
                out[8] = m.hash_id;
                out[9] = m.dhgroup_id;
                put_u16(&mut out, 10, m.dh_value.len() as u16);
                put_u32(&mut out, 12, m.seqnum);
                out[16..16 + hl].copy_from_slice(&m.challenge[..hl]);
                out[16 + hl..].copy_from_slice(&m.dh_value);
            }
            Message::Reply(m) => {
                // Linux always leaves room for C2 (zeros when absent); so do we.
                let hl = m.response.len().min(255);
                header(&mut out, 16 + 2 * hl + m.dh_value.len(), kind::DHCHAP, id::REPLY, m.t_id);
                out[6] = hl as u8;
                out[8] = m.challenge.is_some() as u8;
                put_u16(&mut out, 10, m.dh_value.len() as u16);
                put_u32(&mut out, 12, m.seqnum);
                out[16..16 + hl].copy_from_slice(&m.response[..hl]);
                if let Some(c2) = &m.challenge {
                    let n = c2.len().min(hl);
                    out[16 + hl..16 + hl + n].copy_from_slice(&c2[..n]);
                }
                out[16 + 2 * hl..].copy_from_slice(&m.dh_value);
            }
            Message::Success1(m) => {
                let rlen = m.response.as_ref().map_or(0, |r| r.len());
                header(&mut out, 16 + rlen, kind::DHCHAP, id::SUCCESS1, m.t_id);
                out[6] = m.hash_len;
                if let Some(r) = &m.response {
                    out[8] = 1;
                    out[16..].copy_from_slice(r);
                }
            }
            Message::Success2(m) => header(&mut out, 16, kind::DHCHAP, id::SUCCESS2, m.t_id),
            Message::Failure(m) => {
                let which = if m.from_controller { id::FAILURE1 } else { id::FAILURE2 };
                header(&mut out, 8, kind::COMMON, which, m.t_id);
                out[6] = m.reason;
                out[7] = m.explanation;
            }
        }
        out
    }

    /// Decodes a message; bytes past its end (Linux pads to the transfer length) are ignored.
    pub fn decode(b: &[u8]) -> Result<Message, MessageError> {
        need(b, 8, "authentication message")?;
        let t_id = u16_at(b, 4);
        let unknown = || MessageError {
            explanation: failure::INCORRECT_MESSAGE,
            detail: format!("unknown message type {:#04x} id {:#04x}", b[0], b[1]),
        };
        match (b[0], b[1]) {
            (kind::COMMON, id::NEGOTIATE) => Self::decode_negotiate(b, t_id),
            (kind::COMMON, which @ (id::FAILURE1 | id::FAILURE2)) => Ok(Message::Failure(Failure {
                t_id,
                from_controller: which == id::FAILURE1,
                reason: b[6],
                explanation: b[7],
            })),
            (kind::DHCHAP, id::CHALLENGE) => {
                need(b, 16, "challenge")?;
                let (hl, dhvlen) = (b[6] as usize, u16_at(b, 10) as usize);
                need(b, 16 + hl + dhvlen, "challenge")?;
                Ok(Message::Challenge(Challenge {
                    t_id,
                    hash_id: b[8],
                    dhgroup_id: b[9],
                    seqnum: u32_at(b, 12),
                    challenge: b[16..16 + hl].to_vec(),
                    dh_value: b[16 + hl..16 + hl + dhvlen].to_vec(),
                }))
            }
            (kind::DHCHAP, id::REPLY) => {
                need(b, 16, "reply")?;
                let (hl, dhvlen) = (b[6] as usize, u16_at(b, 10) as usize);
                need(b, 16 + 2 * hl + dhvlen, "reply")?;
                let cvalid = b[8] & 1 != 0;
                Ok(Message::Reply(Reply {
                    t_id,
                    response: b[16..16 + hl].to_vec(),
                    challenge: cvalid.then(|| b[16 + hl..16 + 2 * hl].to_vec()),
                    seqnum: u32_at(b, 12),
                    dh_value: b[16 + 2 * hl..16 + 2 * hl + dhvlen].to_vec(),
                }))
            }
            (kind::DHCHAP, id::SUCCESS1) => {
                need(b, 16, "success1")?;
                let hl = b[6] as usize;
                let response = if b[8] & 1 != 0 {
                    need(b, 16 + hl, "success1")?;
                    Some(b[16..16 + hl].to_vec())
                } else {
                    None
                };
                Ok(Message::Success1(Success1 { t_id, hash_len: b[6], response }))
            }
            (kind::DHCHAP, id::SUCCESS2) => {
                need(b, 16, "success2")?;
                Ok(Message::Success2(Success2 { t_id }))
            }
            _ => Err(unknown()),
        }
    }

    fn decode_negotiate(b: &[u8], t_id: u16) -> Result<Message, MessageError> {
        need(b, NEGOTIATE_LEN, "negotiate")?;
        let napd = b[7] as usize;
        if napd == 0 {
            return Err(payload("negotiate names no authentication protocol"));
        }
        // The first DH-HMAC-CHAP descriptor among those present (only one protocol exists).
        let descriptor = (0..napd)
            .map(|i| 8 + i * DESCRIPTOR_LEN)
            .take_while(|off| off + DESCRIPTOR_LEN <= b.len())
            .map(|off| &b[off..off + DESCRIPTOR_LEN])
            .find(|d| d[0] == DHCHAP_AUTH_ID)
            .ok_or(MessageError {
                explanation: failure::NOT_USABLE,
                detail: "negotiate offers no DH-HMAC-CHAP protocol descriptor".into(),
            })?;
        let (halen, dhlen) = (descriptor[2] as usize, descriptor[3] as usize);
        if halen > IDLIST_MAX || dhlen > IDLIST_MAX {
            return Err(payload(format!("negotiate lists {halen} hashes and {dhlen} DH groups, at most 30 each")));
        }
        Ok(Message::Negotiate(Negotiate {
            t_id,
            sc_c: b[6],
            hashes: descriptor[4..4 + halen].to_vec(),
            dhgroups: descriptor[4 + IDLIST_DH..4 + IDLIST_DH + dhlen].to_vec(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Message> {
        vec![
            Message::Negotiate(Negotiate { t_id: 3, sc_c: 0, hashes: vec![1, 2, 3], dhgroups: vec![0, 1, 2, 3, 4, 5] }),
            Message::Challenge(Challenge {
                t_id: 3,
                hash_id: 1,
                dhgroup_id: 1,
                seqnum: 77,
                challenge: vec![9; 32],
                dh_value: vec![8; 256],
            }),
            Message::Challenge(Challenge {
                t_id: 1,
                hash_id: 3,
                dhgroup_id: 0,
                seqnum: 1,
                challenge: vec![9; 64],
                dh_value: vec![],
            }),
            Message::Reply(Reply {
                t_id: 3,
                response: vec![1; 48],
                challenge: Some(vec![2; 48]),
                seqnum: 5,
                dh_value: vec![3; 384],
            }),
            Message::Reply(Reply { t_id: 3, response: vec![1; 32], challenge: None, seqnum: 0, dh_value: vec![] }),
            Message::Success1(Success1 { t_id: 3, hash_len: 32, response: Some(vec![4; 32]) }),
            Message::Success1(Success1 { t_id: 3, hash_len: 64, response: None }),
            Message::Success2(Success2 { t_id: 3 }),
            Message::Failure(Failure::new(3, true, failure::FAILED)),
            Message::Failure(Failure::new(3, false, failure::HASH_UNUSABLE)),
        ]
    }

    #[test]
    fn every_message_round_trips_even_when_padded() {
        for m in samples() {
            let mut bytes = m.encode();
            assert_eq!(Message::decode(&bytes).as_ref(), Ok(&m), "{}", m.name());
            bytes.resize(MAX_MESSAGE_LEN, 0);
            assert_eq!(Message::decode(&bytes).as_ref(), Ok(&m), "{} padded", m.name());
        }
    }

    #[test]
    fn layouts_match_linux() {
        let neg = samples()[0].encode();
        assert_eq!(neg.len(), 72);
        assert_eq!(&neg[..12], &[0, 0, 0, 0, 3, 0, 0, 1, 1, 0, 3, 6]);
        assert_eq!(&neg[12..15], &[1, 2, 3]);
        assert_eq!(&neg[42..48], &[0, 1, 2, 3, 4, 5]);
        let ch = samples()[1].encode();
        assert_eq!(&ch[..16], &[1, 1, 0, 0, 3, 0, 32, 0, 1, 1, 0, 1, 77, 0, 0, 0]);
        assert_eq!(ch.len(), 16 + 32 + 256);
        let fail = samples()[8].encode();
        assert_eq!(fail, vec![0, 0xF1, 0, 0, 3, 0, 1, 1]);
        let reply = samples()[4].encode();
        assert_eq!(reply.len(), 16 + 64, "room for C2 even without one");
    }

    proptest::proptest! {
        /// Hostile bytes never panic, and whatever decodes re-encodes to a message that decodes
        /// the same (nothing is invented or lost between the two).
        #[test]
        fn any_bytes_decode_safely(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..1500)) {
            if let Ok(m) = Message::decode(&bytes) {
                proptest::prop_assert_eq!(Message::decode(&m.encode()), Ok(m));
            }
        }
    }

    #[test]
    fn truncated_and_unknown_messages_are_refused_with_a_reason() {
        for m in samples() {
            let bytes = m.encode();
            for cut in [0, 7, bytes.len() - 1] {
                if let Ok(d) = Message::decode(&bytes[..cut]) {
                    // A Success1 without a response, or a failure, can be shorter; never bigger.
                    assert!(d.encode().len() <= cut, "{} cut at {cut}", m.name());
                }
            }
        }
        let e = Message::decode(&[1, 9, 0, 0, 0, 0, 0, 0]).unwrap_err();
        assert_eq!(e.explanation, failure::INCORRECT_MESSAGE);
        let mut neg = samples()[0].encode();
        neg[7] = 0;
        assert_eq!(Message::decode(&neg).unwrap_err().explanation, failure::INCORRECT_PAYLOAD);
        neg[7] = 1;
        neg[8] = 2;
        assert_eq!(Message::decode(&neg).unwrap_err().explanation, failure::NOT_USABLE);
        neg[8] = 1;
        neg[10] = 31;
        assert_eq!(Message::decode(&neg).unwrap_err().explanation, failure::INCORRECT_PAYLOAD);
    }
}
