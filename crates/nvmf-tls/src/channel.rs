//! The established channel of a [`crate::TlsSession`]: application records sealed and opened by
//! [`crate::record`] with the traffic keys, once OpenSSL's handshake is done. What is not
//! application data is handled as on a kTLS socket ([`crate::ktls::classify_non_data`]):
//! NewSessionTickets are skipped, close_notify ends the stream, another alert or a KeyUpdate
//! fails the session.

use std::io::IoSlice;

use crate::ktls::{classify_non_data, KernelKeys, NonData};
use crate::record::{Opener, RecordError, RecvBuf, Sealer, ALERT, APPLICATION_DATA};
use crate::error::TlsError;

/// Both directions' record state.
pub(crate) struct AppRecords {
    sealer: Sealer,
    opener: Opener,
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
        Ok(AppRecords { sealer: Sealer::new(&keys.tx)?, opener: Opener::new(&keys.rx)? })
    }

    /// Makes plaintext ready in `rx` if a whole record holds some, opening records in place
    /// and skipping tickets and empty records.
    pub(crate) fn ready(&mut self, rx: &mut RecvBuf) -> Result<Ready, Failure> {
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
            match classify_non_data(Some(ty), &body) {
                NonData::Tickets => continue,
                r if r.is_close_notify() => return Ok(Ready::PeerClosed),
                r @ NonData::Alert { .. } => return Err((TlsError::Protocol(format!("the peer sent {}", r.describe())), None)),
                NonData::Other(what) => return Err((TlsError::Protocol(format!("the peer sent {what}")), Some(10))),
            }
        }
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

fn record_failure(e: RecordError) -> Failure {
    (TlsError::Protocol(e.to_string()), Some(e.alert()))
}
