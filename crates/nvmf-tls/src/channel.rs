//! The established channel of a [`crate::TlsSession`]: application records sealed and opened by
//! [`crate::record`] with the traffic keys, once OpenSSL's handshake is done. What is not
//! application data is handled as on a kTLS socket ([`crate::ktls::classify_non_data`]):
//! NewSessionTickets are skipped, close_notify ends the stream, another alert fails the session.
//! A KeyUpdate is followed (RFC 8446 4.6.3), which kTLS here cannot: the peer's next records
//! are opened with its next traffic secret, and when it asks for an update ours goes out,
//! sealed with the old key, before our next application data.

use std::io::IoSlice;

use crate::error::TlsError;
use crate::ktls::{classify_non_data, KernelKeys, NonData, TrafficKeys};
use crate::record::{Opener, RecordError, RecvBuf, Sealer, ALERT, APPLICATION_DATA, HANDSHAKE};

/// Both directions' record state, and the keys in use (the next generation derives from them).
pub(crate) struct AppRecords {
    sealer: Sealer,
    opener: Opener,
    tx: TrafficKeys,
    rx: TrafficKeys,
}

const HANDSHAKE_NEW_SESSION_TICKET: u8 = 4;
const HANDSHAKE_KEY_UPDATE: u8 = 24;
/// KeyUpdateRequest values.
const UPDATE_NOT_REQUESTED: u8 = 0;
const UPDATE_REQUESTED: u8 = 1;
/// Alert descriptions for a malformed post-handshake message.
const UNEXPECTED_MESSAGE: u8 = 10;
const ILLEGAL_PARAMETER: u8 = 47;
const DECODE_ERROR: u8 = 50;

/// What a handshake record after the handshake held.
#[derive(Debug, PartialEq, Eq)]
enum PostHandshake {
    /// NewSessionTickets only.
    Tickets,
    /// A KeyUpdate (after any tickets); `requested`: the peer wants ours.
    KeyUpdate { requested: bool },
}

/// Reads the handshake messages of one record (bounded parsing of what the peer sent): tickets,
/// then at most one KeyUpdate, which must end the record, as the keys change after it
/// (RFC 8446 5.1). The failure is an error and its alert.
fn post_handshake(body: &[u8]) -> Result<PostHandshake, Failure> {
    let fail = |why: String, alert| Err((TlsError::Protocol(format!("the peer sent {why}")), Some(alert)));
    let mut rest = body;
    while let [kind, a, b, c, tail @ ..] = rest {
        let len = u32::from_be_bytes([0, *a, *b, *c]) as usize;
        let Some(msg) = tail.get(..len) else { return fail("a TLS handshake message split across records after the handshake".into(), UNEXPECTED_MESSAGE) };
        match *kind {
            HANDSHAKE_NEW_SESSION_TICKET => rest = &tail[len..],
            HANDSHAKE_KEY_UPDATE if len != 1 => return fail(format!("a KeyUpdate of {len} bytes"), DECODE_ERROR),
            HANDSHAKE_KEY_UPDATE if tail.len() > 1 => return fail("a KeyUpdate followed by more in its record".into(), UNEXPECTED_MESSAGE),
            HANDSHAKE_KEY_UPDATE => {
                return match msg[0] {
                    UPDATE_NOT_REQUESTED => Ok(PostHandshake::KeyUpdate { requested: false }),
                    UPDATE_REQUESTED => Ok(PostHandshake::KeyUpdate { requested: true }),
                    v => fail(format!("a KeyUpdate with request_update {v}"), ILLEGAL_PARAMETER),
                };
            }
            other => return fail(format!("TLS handshake message {other} after the handshake"), UNEXPECTED_MESSAGE),
        }
    }
    if rest.is_empty() && !body.is_empty() {
        Ok(PostHandshake::Tickets)
    } else {
        fail("a truncated TLS handshake record after the handshake".into(), UNEXPECTED_MESSAGE)
    }
}

/// What [`AppRecords::ready`] found at the head of the receive buffer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Ready {
    /// Plaintext is in [`RecvBuf::plaintext`].
    Data,
    /// No whole record yet.
    Empty,
    /// The peer sent close_notify.
    PeerClosed,
}

/// A failure and the alert description to tell the peer, if one is owed.
pub(crate) type Failure = (TlsError, Option<u8>);

impl AppRecords {
    pub(crate) fn new(keys: &KernelKeys) -> Result<AppRecords, TlsError> {
        Ok(AppRecords { sealer: Sealer::new(&keys.tx)?, opener: Opener::new(&keys.rx)?, tx: keys.tx.clone(), rx: keys.rx.clone() })
    }

    /// Makes plaintext ready in `rx` if a whole record holds some, opening records in place,
    /// skipping tickets and empty records and following KeyUpdates (our answer to one is
    /// appended to `out`, which goes out before our next records).
    pub(crate) fn ready(&mut self, rx: &mut RecvBuf, out: &mut Vec<u8>) -> Result<Ready, Failure> {
        loop {
            if !rx.plaintext().is_empty() {
                return Ok(Ready::Data);
            }
            let len = match rx.complete_record() {
                Ok(Some(len)) => len,
                Ok(None) => return Ok(Ready::Empty),
                Err(e) => return Err(record_failure(e)),
            };
            let ty = rx.open_next(&mut self.opener, len).map_err(record_failure)?;
            if ty == APPLICATION_DATA {
                continue;
            }
            let body = rx.plaintext().to_vec();
            rx.consume(body.len());
            if self.non_data(ty, &body, out)? {
                return Ok(Ready::PeerClosed);
            }
        }
    }

    /// A record that was not application data, opened: tickets are skipped, a KeyUpdate is
    /// followed, close_notify is reported (true), any other alert or type fails the session.
    pub(crate) fn non_data(&mut self, ty: u8, body: &[u8], out: &mut Vec<u8>) -> Result<bool, Failure> {
        if ty == HANDSHAKE {
            if let PostHandshake::KeyUpdate { requested } = post_handshake(body)? {
                self.follow_key_update(requested, out).map_err(|e| (e, Some(80)))?;
            }
            return Ok(false);
        }
        match classify_non_data(Some(ty), body) {
            NonData::Tickets => Ok(false),
            r if r.is_close_notify() => Ok(true),
            r @ NonData::Alert { .. } => Err((TlsError::Protocol(format!("the peer sent {}", r.describe())), None)),
            NonData::Other(what) => Err((TlsError::Protocol(format!("the peer sent {what}")), Some(10))),
        }
    }

    /// The peer's records' opener, for records landed outside the receive buffer.
    pub(crate) fn opener(&mut self) -> &mut Opener {
        &mut self.opener
    }

    /// The peer's KeyUpdate: its next records are opened with its next keys; when it asked,
    /// ours (update_not_requested, so that the peer does not answer again) is sealed with our
    /// old key and our later records with our next one.
    fn follow_key_update(&mut self, requested: bool, out: &mut Vec<u8>) -> Result<(), TlsError> {
        self.rx = self.rx.updated();
        self.opener.rekey(&self.rx)?;
        if requested {
            let key_update = [HANDSHAKE_KEY_UPDATE, 0, 0, 1, UPDATE_NOT_REQUESTED];
            self.sealer.seal_record(HANDSHAKE, &[&key_update], out)?;
            self.tx = self.tx.updated();
            self.sealer.rekey(&self.tx)?;
        }
        Ok(())
    }

    /// Seals up to `limit` bytes of `bufs` as records appended to `out`; how many were taken.
    pub(crate) fn seal_vectored(&mut self, bufs: &[IoSlice<'_>], limit: usize, out: &mut Vec<u8>) -> Result<usize, TlsError> {
        Ok(self.sealer.seal_vectored(bufs, limit, out)?)
    }

    /// An alert record (fatal unless close_notify) appended to `out`, best effort.
    pub(crate) fn alert(&mut self, description: u8, out: &mut Vec<u8>) {
        let level = if description == 0 { 1 } else { 2 };
        let _ = self.sealer.seal_record(ALERT, &[&[level, description]], out);
    }
}

pub(crate) fn record_failure(e: RecordError) -> Failure {
    (TlsError::Protocol(e.to_string()), Some(e.alert()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn post_handshake_messages_are_read_with_bounds() {
        let ticket = [HANDSHAKE_NEW_SESSION_TICKET, 0, 0, 2, 9, 9];
        let update = |v| [HANDSHAKE_KEY_UPDATE, 0, 0, 1, v];
        assert_eq!(post_handshake(&ticket), Ok(PostHandshake::Tickets));
        assert_eq!(post_handshake(&update(0)), Ok(PostHandshake::KeyUpdate { requested: false }));
        assert_eq!(post_handshake(&[&ticket[..], &update(1)].concat()), Ok(PostHandshake::KeyUpdate { requested: true }));
        let alert = |body: &[u8]| post_handshake(body).unwrap_err().1;
        assert_eq!(alert(&update(2)), Some(ILLEGAL_PARAMETER));
        assert_eq!(alert(&[HANDSHAKE_KEY_UPDATE, 0, 0, 2, 0, 0]), Some(DECODE_ERROR));
        assert_eq!(alert(&[&update(0)[..], &ticket].concat()), Some(UNEXPECTED_MESSAGE), "keys change at the record's end");
        assert_eq!(alert(&[HANDSHAKE_KEY_UPDATE, 0, 0, 1]), Some(UNEXPECTED_MESSAGE), "split across records");
        assert_eq!(alert(&[20, 0, 0, 0]), Some(UNEXPECTED_MESSAGE), "a Finished after the handshake");
        assert_eq!(alert(&[]), Some(UNEXPECTED_MESSAGE));
    }
}
