//! Which of several candidate TLS PSKs a ClientHello's first PSK binder was made with.
//!
//! A version 0 identity (`NVMe0R<hh> <hostnqn> <subnqn>`) carries no digest, so the server cannot
//! tell from it whether the host derived its TLS PSK the specification's way or the way libnvme
//! did before 1.16 (what Debian trixie's nvme-cli 2.13 inserts into the kernel keyring). The
//! binder tells: it is an HMAC under a key derived from the PSK (RFC 8446 section 4.2.11.2), so
//! the server computes it for each candidate and hands OpenSSL the one that matches. OpenSSL then
//! checks the binder itself as always; this only chooses the key.
//!
//! Everything here reads hostile bytes: bounded, no panics, `None` for anything malformed.

use sha2::{Digest, Sha256, Sha384};

use crate::derive::{hkdf_expand, hkdf_extract, hkdf_label, hmac, TlsPsk};
use crate::TlsHash;

/// The largest ClientHello kept (a real one is a few hundred bytes).
pub const MAX_CLIENT_HELLO: usize = 16 << 10;
const RECORD_HANDSHAKE: u8 = 22;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXT_PRE_SHARED_KEY: u16 = 41;

/// Collects the first handshake message (the ClientHello, header included) from the plaintext
/// records at the start of a connection, as bytes arrive.
#[derive(Debug, Default)]
pub struct ClientHelloCapture {
    /// Bytes of the stream not yet split into records (at most one record header and body).
    pending: Vec<u8>,
    message: Vec<u8>,
    done: bool,
}

impl ClientHelloCapture {
    /// Takes the next bytes from the peer. Stops collecting (for good) once the message is
    /// complete, too long, or anything but handshake records came first.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.done {
            return;
        }
        self.pending.extend_from_slice(bytes);
        while !self.done && self.pending.len() >= 5 {
            let body_len = u16::from_be_bytes([self.pending[3], self.pending[4]]) as usize;
            if self.pending[0] != RECORD_HANDSHAKE || body_len > MAX_CLIENT_HELLO {
                self.give_up();
                return;
            }
            if self.pending.len() < 5 + body_len {
                break;
            }
            self.message.extend_from_slice(&self.pending[5..5 + body_len]);
            self.pending.drain(..5 + body_len);
            if let Some(want) = self.wanted_len() {
                if want > MAX_CLIENT_HELLO {
                    self.give_up();
                } else if self.message.len() >= want {
                    self.message.truncate(want);
                    self.done = true;
                    self.pending = Vec::new();
                }
            }
        }
        if self.pending.len() > 5 + MAX_CLIENT_HELLO {
            self.give_up();
        }
    }

    fn wanted_len(&self) -> Option<usize> {
        let h = self.message.get(..4)?;
        Some(4 + u32::from_be_bytes([0, h[1], h[2], h[3]]) as usize)
    }

    fn give_up(&mut self) {
        self.done = true;
        self.message = Vec::new();
        self.pending = Vec::new();
    }

    /// The complete ClientHello message (4-byte header included), once it is in.
    pub fn client_hello(&self) -> Option<&[u8]> {
        (self.done && self.message.first() == Some(&HANDSHAKE_CLIENT_HELLO)).then_some(&self.message[..])
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.buf.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }
    fn u8(&mut self) -> Option<usize> {
        Some(self.take(1)?[0] as usize)
    }
    fn u16(&mut self) -> Option<usize> {
        let b = self.take(2)?;
        Some(u16::from_be_bytes([b[0], b[1]]) as usize)
    }
}

/// (offset where the binders list starts, the first binder) of a ClientHello message whose last
/// extension is pre_shared_key.
fn first_binder(hello: &[u8]) -> Option<(usize, &[u8])> {
    let mut r = Reader { buf: hello, pos: 0 };
    if r.u8()? != HANDSHAKE_CLIENT_HELLO as usize {
        return None;
    }
    r.take(3)?; // message length: the capture already cut the message to it
    r.take(2 + 32)?; // legacy_version, random
    let n = r.u8()?;
    r.take(n)?; // legacy_session_id
    let n = r.u16()?;
    r.take(n)?; // cipher_suites
    let n = r.u8()?;
    r.take(n)?; // legacy_compression_methods
    let ext_len = r.u16()?;
    let ext_end = r.pos.checked_add(ext_len)?;
    while r.pos < ext_end {
        let ext_type = r.u16()? as u16;
        let len = r.u16()?;
        if ext_type != EXT_PRE_SHARED_KEY {
            r.take(len)?;
            continue;
        }
        let ids_len = r.u16()?;
        r.take(ids_len)?;
        let binders_at = r.pos;
        r.u16()?; // binders list length
        let first = r.u8()?;
        return Some((binders_at, r.take(first)?));
    }
    None
}

fn transcript_hash(hash: TlsHash, bytes: &[u8]) -> Vec<u8> {
    match hash {
        TlsHash::Sha256 => Sha256::digest(bytes).to_vec(),
        TlsHash::Sha384 => Sha384::digest(bytes).to_vec(),
    }
}

/// Whether `hello`'s first PSK binder was computed with `psk` as an external PSK.
pub fn binder_matches(hello: &[u8], psk: &TlsPsk) -> bool {
    let Some((binders_at, binder)) = first_binder(hello) else { return false };
    let hash = psk.hash();
    let len = hash.digest_len();
    if binder.len() != len {
        return false;
    }
    // RFC 8446 7.1: early secret, "ext binder" key, its finished key; the binder is the HMAC of
    // the transcript hash of the ClientHello cut before the binders list.
    let early = hkdf_extract(hash, psk.key());
    let expand = |secret: &[u8], label: &str, context: &[u8]| {
        hkdf_label(len, label, context, false).map(|info| hkdf_expand(hash, secret, &info, len))
    };
    let Ok(binder_key) = expand(early.as_bytes(), "ext binder", &transcript_hash(hash, b"")) else { return false };
    let Ok(finished_key) = expand(binder_key.as_bytes(), "finished", b"") else { return false };
    let expected = hmac(hash, finished_key.as_bytes(), &[&transcript_hash(hash, &hello[..binders_at])]);
    // Without early exit, though this only picks which key OpenSSL checks next.
    expected.as_bytes().iter().zip(binder).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(msg: &[u8], chunk: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for part in msg.chunks(chunk) {
            out.extend_from_slice(&[RECORD_HANDSHAKE, 3, 1]);
            out.extend_from_slice(&(part.len() as u16).to_be_bytes());
            out.extend_from_slice(part);
        }
        out
    }

    #[test]
    fn capture_reassembles_a_message_split_over_records_and_pushes() {
        let mut msg = vec![HANDSHAKE_CLIENT_HELLO, 0, 1, 0];
        msg.extend((0..256).map(|i| i as u8));
        let wire = records(&msg, 100);
        let mut c = ClientHelloCapture::default();
        for b in wire.chunks(7) {
            c.push(b);
        }
        assert_eq!(c.client_hello(), Some(&msg[..]));
        c.push(&[0xff; 10]); // later bytes change nothing
        assert_eq!(c.client_hello(), Some(&msg[..]));
    }

    #[test]
    fn capture_gives_up_on_other_records_and_oversize() {
        let mut c = ClientHelloCapture::default();
        c.push(&[23, 3, 3, 0, 1, 0]);
        assert_eq!(c.client_hello(), None);
        let mut c = ClientHelloCapture::default();
        c.push(&records(&[HANDSHAKE_CLIENT_HELLO, 0xff, 0xff, 0xff], 4));
        assert_eq!(c.client_hello(), None);
        let mut c = ClientHelloCapture::default();
        c.push(&[RECORD_HANDSHAKE, 3, 1, 0xff, 0xff]);
        assert_eq!(c.client_hello(), None);
    }

    #[test]
    fn malformed_hellos_match_nothing() {
        let psk = TlsPsk::from_raw("x", TlsHash::Sha256, &[7; 32]).unwrap();
        for hello in [&[][..], &[1], &[1, 0, 0, 0], &[1, 0, 0, 40, 3, 3], &[2; 64]] {
            assert!(!binder_matches(hello, &psk));
        }
    }
}
