//! Records received straight into the reader's buffer ([`crate::landing`]): the session's side.
//! The socket layer, for a buffer a large payload goes to:
//! 1. takes plaintext already open with [`TlsSession::read_plaintext`];
//! 2. asks [`TlsSession::land_start`]; if true, reads into [`TlsSession::land_slices`] with one
//!    vectored read and reports it to [`TlsSession::land_received`], which opens the records in
//!    the buffer that are all in;
//! 3. else reads into [`TlsSession::recv_space`] as usual, no more than
//!    [`TlsSession::landing_read_limit`], so that the record after can land.

use std::io::IoSliceMut;

use super::TlsSession;
use crate::error::TlsError;
use crate::landing::{read_limit, RecordLanding};
use crate::channel::record_failure;

impl TlsSession {
    /// Whether the next records can be received into `dst` now (they are already under way
    /// there, or the next one's header is in, no plaintext waits and its body fits `dst`). Until
    /// they are in, `dst` must start at the same place on every call: the bytes received so far
    /// are there.
    pub fn land_start(&mut self, dst: &mut [u8]) -> Result<bool, TlsError> {
        self.require_established()?;
        if let Some(landing) = &self.landing {
            if !landing.same_buffer(dst) {
                let e = TlsError::Setup("a record's landing buffer changed before the record was in".into());
                return Err(self.record_failed((e, Some(80))));
            }
            return Ok(true);
        }
        if self.peer_closed {
            return Ok(false);
        }
        self.landing = RecordLanding::start(&mut self.rx, dst);
        Ok(self.landing.is_some())
    }

    /// Where to read the landing records' next bytes (after [`TlsSession::land_start`] said
    /// true), for one vectored read: the rest of them in `dst` and beside it, then room for the
    /// header after them.
    pub fn land_slices<'a>(&'a mut self, dst: &'a mut [u8]) -> Vec<IoSliceMut<'a>> {
        match self.landing.as_mut() {
            Some(landing) => landing.slices(dst, &mut self.rx),
            None => Vec::new(),
        }
    }

    /// `n` bytes were read into [`TlsSession::land_slices`]. The records all in are opened in
    /// `dst`: returns how many plaintext bytes they put at `dst`'s front (0 for a record that
    /// was not application data: a KeyUpdate is followed, close_notify ends the stream as in
    /// [`TlsSession::read_plaintext`]); None while not even the first is all in.
    pub fn land_received(&mut self, n: usize, dst: &mut [u8]) -> Result<Option<usize>, TlsError> {
        self.require_established()?;
        let Some(landing) = self.landing.as_mut() else { return Err(TlsError::Setup("no record is landing".into())) };
        landing.commit(n, &mut self.rx);
        if !landing.first_whole() {
            return Ok(None);
        }
        let landing = self.landing.take().expect("checked above");
        let Some(app) = self.app.as_mut() else { return Err(TlsError::Setup("no record layer".into())) };
        let (opened, next) = match landing.open(app.opener(), dst, &mut self.rx) {
            Ok(opened) => opened,
            Err(e) => return Err(self.record_failed(record_failure(e))),
        };
        self.landing = next;
        self.app_data_seen |= opened.plaintext > 0;
        if let Some((ty, range)) = opened.non_data {
            let body = dst[range].to_vec();
            match app.non_data(ty, &body, &mut self.stream.get_mut().output) {
                Ok(closed) => self.peer_closed |= closed,
                Err(failure) => return Err(self.record_failed(failure)),
            }
        }
        Ok(Some(opened.plaintext))
    }

    /// How many bytes the next read into [`TlsSession::recv_space`] may take so that it ends
    /// with the header of the record after the one at hand, which may then land; `usize::MAX`
    /// when nothing needs reading for that.
    pub fn landing_read_limit(&self) -> usize {
        read_limit(&self.rx).unwrap_or(usize::MAX)
    }
}
