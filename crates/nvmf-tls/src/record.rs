//! TLS 1.3 application records made here, after OpenSSL's handshake (RFC 8446 section 5), so that
//! no byte is copied to make or open one beyond what the cipher needs (issue 40 item 2):
//!
//! - [`Sealer`] writes a record into the send buffer: the 5-byte header, the caller's slices
//!   gathered after it, the content type, then encrypts that in place and appends the 16-byte tag.
//! - [`RecvBuf`] is the receive buffer the socket reads into; [`Opener`] decrypts each record in
//!   place there, and the plaintext is handed out from where it lies.
//!
//! OpenSSL's record layer (SSL_write/SSL_read over a memory BIO) copied each byte three times
//! sending and five times receiving (docs/tls.md, "Where the time goes"). The keys are the ones
//! kTLS gets ([`crate::ktls::TrafficKeys`]). The AEAD is ring's AES-GCM: on cores with VAES it
//! runs 256-bit AES and carry-less multiplies (OpenSSL 3.0's EVP has no such path without
//! AVX-512), and it costs about 0.15 us per record where OpenSSL's EVP init, additional data,
//! final and tag calls cost 0.5-0.7 us (docs/tls.md, "ring's AES-GCM for the records").

use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_128_GCM, AES_256_GCM};
use std::io::IoSlice;

use crate::ktls::TrafficKeys;
use crate::TlsHash;

/// Largest plaintext of a record (2^14).
pub const MAX_PLAINTEXT: usize = 1 << 14;
/// Largest body a peer may send (RFC 8446 5.2: 2^14 + 256).
pub const MAX_BODY: usize = MAX_PLAINTEXT + 256;
pub const HEADER: usize = 5;
pub const TAG: usize = 16;
/// What a record adds around its plaintext: header, content type, tag.
pub const OVERHEAD: usize = HEADER + 1 + TAG;

pub const CHANGE_CIPHER_SPEC: u8 = 20;
pub const ALERT: u8 = 21;
pub const HANDSHAKE: u8 = 22;
pub const APPLICATION_DATA: u8 = 23;

/// Why a record could not be opened; each maps to the fatal alert RFC 8446 names for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordError {
    /// The outer type is not application_data, or the inner plaintext is all padding.
    UnexpectedMessage,
    /// Longer than 2^14 + 256, or shorter than a tag and a content type.
    Overflow,
    /// The tag did not verify.
    BadMac,
}

impl RecordError {
    /// The alert description to send.
    pub fn alert(self) -> u8 {
        match self {
            RecordError::UnexpectedMessage => 10,
            RecordError::Overflow => 22,
            RecordError::BadMac => 20,
        }
    }
}

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RecordError::UnexpectedMessage => "a record of an unexpected type after the handshake",
            RecordError::Overflow => "a record longer than TLS allows (or too short to hold a tag)",
            RecordError::BadMac => "a record failed authentication (bad record MAC)",
        })
    }
}

/// The AEAD refused the keys or a record's length (ring reports no more than that).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CipherError;

impl std::fmt::Display for CipherError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AES-GCM refused the traffic key or the record")
    }
}

impl std::error::Error for CipherError {}

impl From<ring::error::Unspecified> for CipherError {
    fn from(_: ring::error::Unspecified) -> Self {
        CipherError
    }
}

/// One direction's AEAD state: key, static IV, record sequence number.
struct Direction {
    key: LessSafeKey,
    iv: [u8; 12],
    seq: u64,
}

impl Direction {
    fn new(keys: &TrafficKeys) -> Result<Direction, CipherError> {
        let algorithm = match keys.hash() {
            TlsHash::Sha256 => &AES_128_GCM,
            TlsHash::Sha384 => &AES_256_GCM,
        };
        let key = LessSafeKey::new(UnboundKey::new(algorithm, keys.key())?);
        let mut iv = [0u8; 12];
        iv.copy_from_slice(keys.iv());
        Ok(Direction { key, iv, seq: 0 })
    }

    /// The next record's nonce: IV xor the big-endian sequence number (RFC 8446 5.3).
    fn next_nonce(&mut self) -> Nonce {
        let mut nonce = self.iv;
        for (n, s) in nonce[4..].iter_mut().zip(self.seq.to_be_bytes()) {
            *n ^= s;
        }
        self.seq += 1;
        Nonce::assume_unique_for_key(nonce)
    }
}

/// Largest single copy into the send buffer. glibc 2.36 copies 4 KiB and more with `rep movsb`,
/// which on the AMD EPYC VMs measured here ran the 4 KiB gather at 1.3-1.8 GB/s, slower than
/// the AES-GCM after it (28 % of the target's time against 18 % at 4 KiB randread QD32 TLS);
/// its vector loop, used below the threshold, does not have that cost. `rep movsb` is slow there
/// when the destination lies 1-63 bytes past the source modulo 4 KiB (15x for a 4 KiB copy), which
/// page-aligned buffers and 5-byte record headers make common (docs/tls.md, "ring's AES-GCM for
/// the records").
const COPY_CHUNK: usize = 2048;

/// Copies `src` into the front of `dst` (which must be as long) in [`COPY_CHUNK`] pieces.
pub(crate) fn copy_chunked(dst: &mut [u8], src: &[u8]) {
    for (d, s) in dst.chunks_mut(COPY_CHUNK).zip(src.chunks(COPY_CHUNK)) {
        d.copy_from_slice(s);
    }
}

fn header(content_len: usize) -> [u8; HEADER] {
    let len = (content_len + 1 + TAG) as u16;
    let [hi, lo] = len.to_be_bytes();
    [APPLICATION_DATA, 3, 3, hi, lo]
}

/// Seals outgoing records.
pub struct Sealer(Direction);

impl Sealer {
    pub fn new(keys: &TrafficKeys) -> Result<Sealer, CipherError> {
        Direction::new(keys).map(Sealer)
    }

    /// Seals the next records with `keys`, from sequence 0 (after a KeyUpdate).
    pub fn rekey(&mut self, keys: &TrafficKeys) -> Result<(), CipherError> {
        self.0 = Direction::new(keys)?;
        Ok(())
    }

    /// Seals up to `limit` bytes of `bufs`, in order, as application data records of at most
    /// 2^14 bytes each, appended to `out`; returns how many plaintext bytes were taken.
    pub fn seal_vectored(&mut self, bufs: &[IoSlice<'_>], limit: usize, out: &mut Vec<u8>) -> Result<usize, CipherError> {
        let total = bufs.iter().map(|b| b.len()).sum::<usize>().min(limit);
        let (mut slice, mut offset, mut done) = (0, 0, 0);
        while done < total {
            let len = (total - done).min(MAX_PLAINTEXT);
            let mut pieces = Vec::with_capacity(4);
            let mut need = len;
            while need > 0 {
                let b = &bufs[slice][offset..];
                let take = b.len().min(need);
                if take > 0 {
                    pieces.push(&b[..take]);
                }
                need -= take;
                offset += take;
                if offset == bufs[slice].len() {
                    slice += 1;
                    offset = 0;
                }
            }
            self.seal_record(APPLICATION_DATA, &pieces, out)?;
            done += len;
        }
        Ok(done)
    }

    /// Seals one record of `content_type` whose plaintext is `pieces` in order (at most 2^14
    /// bytes in all), appended to `out`.
    pub fn seal_record(&mut self, content_type: u8, pieces: &[&[u8]], out: &mut Vec<u8>) -> Result<(), CipherError> {
        let len: usize = pieces.iter().map(|p| p.len()).sum();
        assert!(len <= MAX_PLAINTEXT, "a record holds at most 2^14 bytes");
        let hdr = header(len);
        let nonce = self.0.next_nonce();
        let base = out.len();
        out.reserve(HEADER + len + 1 + TAG);
        out.extend_from_slice(&hdr);
        // ring encrypts one contiguous buffer in place: the pieces are gathered into the send
        // buffer first, in copies below glibc's `rep movsb` threshold (see COPY_CHUNK).
        for p in pieces {
            for chunk in p.chunks(COPY_CHUNK) {
                out.extend_from_slice(chunk);
            }
        }
        out.push(content_type);
        let tag = self.0.key.seal_in_place_separate_tag(nonce, Aad::from(hdr), &mut out[base + HEADER..])?;
        out.extend_from_slice(tag.as_ref());
        Ok(())
    }
}

/// Opens incoming records in place.
pub struct Opener(Direction);

impl Opener {
    pub fn new(keys: &TrafficKeys) -> Result<Opener, CipherError> {
        Direction::new(keys).map(Opener)
    }

    /// Opens the next records with `keys`, from sequence 0 (after the peer's KeyUpdate).
    pub fn rekey(&mut self, keys: &TrafficKeys) -> Result<(), CipherError> {
        self.0 = Direction::new(keys)?;
        Ok(())
    }

    /// Opens `record` (header and whole body) in place: returns its inner content type and the
    /// plaintext length; the plaintext is then `record[HEADER..HEADER + len]`.
    pub fn open_in_place(&mut self, record: &mut [u8]) -> Result<(u8, usize), RecordError> {
        if record[0] != APPLICATION_DATA {
            return Err(RecordError::UnexpectedMessage);
        }
        let body_len = record.len() - HEADER;
        if !(TAG + 1..=MAX_BODY).contains(&body_len) {
            return Err(RecordError::Overflow);
        }
        let (hdr, body) = record.split_at_mut(HEADER);
        let (data, tag) = body.split_at_mut(body_len - TAG);
        self.open_parts(hdr, data, tag)
    }

    /// Opens a record whose parts lie apart: `hdr` (the additional data), `data` (the encrypted
    /// inner plaintext, opened in place) and `tag`. Returns what [`Opener::open_in_place`] does;
    /// the plaintext is then `data[..len]`.
    pub fn open_parts(&mut self, hdr: &[u8], data: &mut [u8], tag: &[u8]) -> Result<(u8, usize), RecordError> {
        let tag = Tag::try_from(tag).map_err(|_| RecordError::Overflow)?;
        let nonce = self.0.next_nonce();
        if self.0.key.open_in_place_separate_tag(nonce, Aad::from(hdr), tag, data, 0..).is_err() {
            return Err(RecordError::BadMac);
        }
        // TLSInnerPlaintext: content, the type, then zero padding.
        let Some(last) = data.iter().rposition(|&b| b != 0) else { return Err(RecordError::UnexpectedMessage) };
        if last > MAX_PLAINTEXT {
            return Err(RecordError::Overflow);
        }
        Ok((data[last], last))
    }
}

/// Room kept free for a socket read: more than one whole record.
const MIN_ROOM: usize = 32 << 10;
/// The receive buffer's size: reads of up to this much at a time.
pub const RECV_BUF: usize = 256 << 10;

/// The receive buffer: the socket reads into [`RecvBuf::space`], records are opened where they
/// lie and their plaintext is taken from there. Holds, in order: plaintext of the record being
/// read (`plain`), then records not opened yet from `start`, up to `end`.
#[derive(Default)]
pub struct RecvBuf {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    plain: std::ops::Range<usize>,
}

impl RecvBuf {
    /// Where to read the next bytes into: never empty. Moves what is kept (plaintext not taken,
    /// a partial record) to the front only when the room left is less than a record.
    pub fn space(&mut self) -> &mut [u8] {
        if self.buf.is_empty() {
            self.buf = vec![0; RECV_BUF];
        }
        if self.plain.is_empty() && self.start == self.end {
            (self.start, self.end, self.plain) = (0, 0, 0..0);
        }
        if self.buf.len() - self.end < MIN_ROOM {
            let keep = if self.plain.is_empty() { self.start } else { self.plain.start };
            self.buf.copy_within(keep..self.end, 0);
            self.start -= keep;
            self.end -= keep;
            self.plain = if self.plain.is_empty() { 0..0 } else { self.plain.start - keep..self.plain.end - keep };
            if self.buf.len() - self.end < MIN_ROOM {
                self.buf.resize(self.end + MIN_ROOM, 0);
            }
        }
        &mut self.buf[self.end..]
    }

    /// `n` bytes were read into [`RecvBuf::space`].
    pub fn commit(&mut self, n: usize) {
        self.end += n;
        debug_assert!(self.end <= self.buf.len());
    }

    /// The `n` bytes read into [`RecvBuf::space`] and not committed yet.
    pub fn uncommitted(&self, n: usize) -> &[u8] {
        &self.buf[self.end..self.end + n]
    }

    /// Appends `bytes` (copied): for callers that have their bytes elsewhere.
    pub fn push(&mut self, bytes: &[u8]) {
        let space = self.space();
        if space.len() < bytes.len() {
            let need = self.end + bytes.len();
            self.buf.resize(need, 0);
        }
        self.buf[self.end..self.end + bytes.len()].copy_from_slice(bytes);
        self.end += bytes.len();
    }

    /// Puts `bytes` (received, not opened) before what is held: for bytes read ahead elsewhere
    /// that turned out to belong here. Only when no plaintext waits.
    pub fn push_front(&mut self, bytes: &[u8]) {
        debug_assert!(self.plain.is_empty());
        if bytes.is_empty() {
            return;
        }
        if self.start >= bytes.len() {
            self.start -= bytes.len();
        } else {
            let held = self.end - self.start;
            if self.buf.len() < bytes.len() + held {
                self.buf.resize(bytes.len() + held, 0);
            }
            self.buf.copy_within(self.start..self.end, bytes.len());
            (self.start, self.end) = (0, bytes.len() + held);
        }
        self.buf[self.start..self.start + bytes.len()].copy_from_slice(bytes);
    }

    /// Received bytes not yet opened.
    pub fn unopened(&self) -> usize {
        self.end - self.start
    }

    /// The plaintext of the record being read, not yet taken.
    pub fn plaintext(&self) -> &[u8] {
        &self.buf[self.plain.clone()]
    }

    /// `n` bytes of [`RecvBuf::plaintext`] were used.
    pub fn consume(&mut self, n: usize) {
        assert!(n <= self.plain.len());
        self.plain.start += n;
    }

    /// Length of the whole record at `start`, if it has all arrived. A header claiming more
    /// than TLS allows is an error at once, before its body.
    pub fn complete_record(&self) -> Result<Option<usize>, RecordError> {
        let have = &self.buf[self.start..self.end];
        if have.len() < HEADER {
            return Ok(None);
        }
        let body = u16::from_be_bytes([have[3], have[4]]) as usize;
        if body > MAX_BODY {
            return Err(RecordError::Overflow);
        }
        Ok((have.len() >= HEADER + body).then_some(HEADER + body))
    }

    /// The record at `start` when only part of it has arrived and no plaintext waits before it:
    /// its header, its body's length and how many bytes of the body are here. None also for a
    /// header that [`RecvBuf::complete_record`] would refuse (that path reports it).
    pub fn partial_record(&self) -> Option<([u8; HEADER], usize, usize)> {
        if !self.plain.is_empty() || !matches!(self.complete_record(), Ok(None)) {
            return None;
        }
        let have = &self.buf[self.start..self.end];
        let header: [u8; HEADER] = have.get(..HEADER)?.try_into().ok()?;
        let body = u16::from_be_bytes([header[3], header[4]]) as usize;
        Some((header, body, have.len() - HEADER))
    }

    /// The body bytes of [`RecvBuf::partial_record`] that are here.
    pub fn partial_body(&self) -> &[u8] {
        &self.buf[(self.start + HEADER).min(self.end)..self.end]
    }

    /// Drops the partial record (its bytes were taken elsewhere): the buffer is then empty.
    pub fn drop_partial(&mut self) {
        debug_assert!(self.plain.is_empty());
        self.start = self.end;
    }

    /// Opens the record at `start` (which [`RecvBuf::complete_record`] said is `len` bytes) with
    /// `opener`; on success its plaintext becomes [`RecvBuf::plaintext`] and its content type
    /// is returned. Only when the plaintext before it was all taken.
    pub fn open_next(&mut self, opener: &mut Opener, len: usize) -> Result<u8, RecordError> {
        debug_assert!(self.plain.is_empty());
        let at = self.start;
        let (ty, n) = opener.open_in_place(&mut self.buf[at..at + len])?;
        self.start += len;
        self.plain = at + HEADER..at + HEADER + n;
        Ok(ty)
    }

    /// Drops everything received (a failed session).
    pub fn clear(&mut self) {
        (self.start, self.end, self.plain) = (0, 0, 0..0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(hash: TlsHash) -> (Sealer, Opener) {
        let keys = TrafficKeys::from_secret(hash, &[9; 48][..hash.digest_len()]);
        (Sealer::new(&keys).unwrap(), Opener::new(&keys).unwrap())
    }

    /// Opens every record of `wire` through a RecvBuf fed in `step`-byte reads; returns the
    /// plaintext of the application data records.
    fn open_all(opener: &mut Opener, wire: &[u8], step: usize) -> Result<Vec<u8>, RecordError> {
        let mut rb = RecvBuf::default();
        let mut out = Vec::new();
        for chunk in wire.chunks(step) {
            rb.push(chunk);
            while let Some(len) = rb.complete_record()? {
                assert_eq!(rb.open_next(opener, len)?, APPLICATION_DATA);
                out.extend_from_slice(rb.plaintext());
                let n = rb.plaintext().len();
                rb.consume(n);
            }
        }
        assert_eq!(rb.unopened(), 0, "no partial record left");
        Ok(out)
    }

    #[test]
    fn sealed_in_place_and_opened_in_place_round_trip() {
        for hash in [TlsHash::Sha256, TlsHash::Sha384] {
            let (mut sealer, mut opener) = pair(hash);
            let (a, b, c) = (vec![1u8; 72], (0..40_000u32).map(|i| i as u8).collect::<Vec<_>>(), vec![3u8; 5]);
            let mut wire = Vec::new();
            let bufs = [IoSlice::new(&a), IoSlice::new(&[]), IoSlice::new(&b), IoSlice::new(&c)];
            let n = sealer.seal_vectored(&bufs, usize::MAX, &mut wire).unwrap();
            assert_eq!(n, a.len() + b.len() + c.len());
            // Three records: 16 KiB, 16 KiB, the rest; each adds its overhead.
            assert_eq!(wire.len(), n + 3 * OVERHEAD);
            assert_eq!(wire[0], APPLICATION_DATA);
            assert!(wire.windows(b.len().min(64)).all(|w| w != &b[..64]), "no plaintext on the wire");
            let plain = open_all(&mut opener, &wire, 1000).unwrap();
            assert_eq!(plain, [&a[..], &b[..], &c[..]].concat());
        }
    }

    #[test]
    fn a_chunked_copy_copies_every_byte_across_chunk_boundaries() {
        let src: Vec<u8> = (0..3 * COPY_CHUNK as u32 + 77).map(|i| (i * 31 + 7) as u8).collect();
        for len in [0, 1, COPY_CHUNK - 1, COPY_CHUNK, COPY_CHUNK + 1, src.len()] {
            let mut dst = vec![0u8; len + 3];
            copy_chunked(&mut dst[..len], &src[..len]);
            assert_eq!(&dst[..len], &src[..len], "length {len}");
            assert_eq!(&dst[len..], &[0, 0, 0], "nothing past the end, length {len}");
        }
    }

    #[test]
    fn a_limit_stops_sealing_mid_slice() {
        let (mut sealer, mut opener) = pair(TlsHash::Sha256);
        let data = vec![7u8; 10_000];
        let mut wire = Vec::new();
        assert_eq!(sealer.seal_vectored(&[IoSlice::new(&data)], 4096, &mut wire).unwrap(), 4096);
        assert_eq!(wire.len(), 4096 + OVERHEAD);
        assert_eq!(open_all(&mut opener, &wire, 7).unwrap(), &data[..4096]);
    }

    #[test]
    fn a_record_split_across_reads_opens_once_whole() {
        let (mut sealer, mut opener) = pair(TlsHash::Sha256);
        let mut wire = Vec::new();
        sealer.seal_vectored(&[IoSlice::new(b"ICReq")], usize::MAX, &mut wire).unwrap();
        let mut rb = RecvBuf::default();
        for (i, byte) in wire.iter().enumerate() {
            assert_eq!(rb.complete_record().unwrap(), None, "whole only after the last byte");
            rb.push(std::slice::from_ref(byte));
            if i + 1 < wire.len() {
                assert!(rb.plaintext().is_empty());
            }
        }
        let len = rb.complete_record().unwrap().unwrap();
        rb.open_next(&mut opener, len).unwrap();
        assert_eq!(rb.plaintext(), b"ICReq");
    }

    #[test]
    fn a_tampered_record_is_refused() {
        let (mut sealer, _) = pair(TlsHash::Sha256);
        let mut wire = Vec::new();
        sealer.seal_vectored(&[IoSlice::new(&[5u8; 100])], usize::MAX, &mut wire).unwrap();
        // The type, the version (additional data), the body, the tag.
        for at in [0, 1, HEADER, HEADER + 50, wire.len() - 1] {
            let mut bad = wire.clone();
            bad[at] ^= 1;
            let want = if at == 0 { RecordError::UnexpectedMessage } else { RecordError::BadMac };
            assert_eq!(open_all(&mut pair(TlsHash::Sha256).1, &bad, bad.len()), Err(want), "byte {at} flipped");
        }
        // The right record out of order (sequence 1 where 0 is expected) fails too.
        let mut second = Vec::new();
        sealer.seal_vectored(&[IoSlice::new(b"x")], usize::MAX, &mut second).unwrap();
        assert_eq!(open_all(&mut pair(TlsHash::Sha256).1, &second, 64), Err(RecordError::BadMac));
        // A header claiming more than 2^14 + 256 is refused before its body arrives.
        let mut rb = RecvBuf::default();
        rb.push(&[APPLICATION_DATA, 3, 3, 0x41, 0x01]);
        assert_eq!(rb.complete_record(), Err(RecordError::Overflow));
    }

    #[test]
    fn the_buffer_keeps_a_partial_record_and_plaintext_when_it_makes_room() {
        let (mut sealer, mut opener) = pair(TlsHash::Sha256);
        let data: Vec<u8> = (0..(RECV_BUF * 3) as u32).map(|i| (i * 7) as u8).collect();
        let mut wire = Vec::new();
        sealer.seal_vectored(&[IoSlice::new(&data)], usize::MAX, &mut wire).unwrap();
        let mut rb = RecvBuf::default();
        let (mut got, mut sent) = (Vec::new(), 0);
        while got.len() < data.len() {
            // Reads of odd sizes into the space given; plaintext taken a little at a time.
            let space = rb.space();
            let n = space.len().min(wire.len() - sent).min(70_001);
            space[..n].copy_from_slice(&wire[sent..sent + n]);
            rb.commit(n);
            sent += n;
            loop {
                if rb.plaintext().is_empty() {
                    match rb.complete_record().unwrap() {
                        Some(len) => assert_eq!(rb.open_next(&mut opener, len).unwrap(), APPLICATION_DATA),
                        None => break,
                    }
                }
                let take = rb.plaintext().len().min(5000);
                // The last record's tail stays untaken over the next read (while more comes),
                // so that making room must keep plaintext as well as a partial record.
                if take < 5000 && rb.complete_record().unwrap().is_none() && sent < wire.len() {
                    break;
                }
                got.extend_from_slice(&rb.plaintext()[..take]);
                rb.consume(take);
            }
        }
        assert_eq!(got, data);
        assert!(rb.buf.len() <= RECV_BUF + MIN_ROOM, "the buffer stayed bounded: {}", rb.buf.len());
    }
}
