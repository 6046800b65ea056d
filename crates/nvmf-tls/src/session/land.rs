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

#[cfg(test)]
mod tests {
    use crate::session::{ClientConfig, ServerConfig, TlsSession};
    use crate::{TlsError, TlsHash, TlsPsk};
    use std::io::IoSlice;

    /// An established pair, in memory.
    fn pair() -> (TlsSession, TlsSession) {
        let psk = TlsPsk::from_raw("NVMe0R01 nqn.2024-01.io.h nqn.2024-01.io.s", TlsHash::Sha256, &[5; 32]).unwrap();
        let mut c = TlsSession::client(&ClientConfig::new(psk.clone()).unwrap()).unwrap();
        let mut s = TlsSession::server(&ServerConfig::with_keys(vec![psk]).unwrap()).unwrap();
        for _ in 0..3 {
            s.feed(&c.take_ciphertext()).unwrap();
            c.feed(&s.take_ciphertext()).unwrap();
        }
        assert!(c.is_established() && s.is_established());
        (c, s)
    }

    /// Reads `bytes` into the session's receive buffer, as a socket read does.
    fn deliver(s: &mut TlsSession, bytes: &[u8]) -> Result<(), TlsError> {
        s.recv_space()[..bytes.len()].copy_from_slice(bytes);
        s.received(bytes.len())
    }

    #[test]
    fn records_land_and_nothing_else_is_read_while_they_do() {
        let (mut c, mut s) = pair();
        let data: Vec<u8> = (0..64 << 10).map(|i: u32| (i % 251) as u8).collect();
        let mut wire = Vec::new();
        c.seal_vectored(&[IoSlice::new(&data)], usize::MAX, &mut wire).unwrap();
        // The first header alone, then the rest of the records land.
        deliver(&mut s, &wire[..5]).unwrap();
        let mut dst = vec![0; data.len()];
        assert!(s.land_start(&mut dst).unwrap());
        let mut iov = s.land_slices(&mut dst);
        let mut n = 0;
        for slice in iov.iter_mut() {
            let k = slice.len().min(wire.len() - 5 - n);
            slice[..k].copy_from_slice(&wire[5 + n..5 + n + k]);
            n += k;
        }
        drop(iov);
        // Three records: a fourth's content type byte would not fit the buffer. Its header came
        // with them, and it is read and opened in the receive buffer.
        const PLAIN: usize = crate::record::MAX_PLAINTEXT;
        assert_eq!(n, 3 * (PLAIN + 22), "three records less the header delivered, and the next header");
        assert_eq!(s.land_received(n, &mut dst).unwrap(), Some(3 * PLAIN));
        deliver(&mut s, &wire[5 + n..]).unwrap();
        assert_eq!(s.read_plaintext(&mut dst[3 * PLAIN..]).unwrap(), PLAIN);
        assert!(dst == data);

        // Half a run in: the receive buffer takes nothing and gives nothing meanwhile.
        let mut wire = Vec::new();
        c.seal_vectored(&[IoSlice::new(&data)], usize::MAX, &mut wire).unwrap();
        deliver(&mut s, &wire[..5]).unwrap();
        assert!(s.land_start(&mut dst).unwrap());
        let mut iov = s.land_slices(&mut dst);
        iov[0][..100].copy_from_slice(&wire[5..105]);
        drop(iov);
        assert_eq!(s.land_received(100, &mut dst).unwrap(), None);
        assert_eq!(s.read_plaintext(&mut [0; 10]).unwrap(), 0);
        assert!(s.land_start(&mut dst[1..]).is_err(), "another buffer fails the session");
        assert!(s.read_plaintext(&mut [0; 10]).is_err(), "and it stays failed");

        // Bytes read into the receive buffer while records land elsewhere fail it too.
        let (mut c, mut s) = pair();
        let mut wire = Vec::new();
        c.seal_vectored(&[IoSlice::new(&data)], usize::MAX, &mut wire).unwrap();
        deliver(&mut s, &wire[..5]).unwrap();
        assert!(s.land_start(&mut dst).unwrap());
        assert!(deliver(&mut s, &wire[5..105]).is_err());
        assert!(s.error().is_some());
    }
}
