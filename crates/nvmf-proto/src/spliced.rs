//! The output queue of one NVMe/TCP connection, target or host: PDU bytes (headers, digests,
//! small payloads) encoded into the queue's own buffer, with large payloads spliced in between
//! from the command buffers that hold them, so that one vectored write sends both and no payload
//! is copied. It names a payload by its slot and range and asks the caller for the slot's buffer
//! when it builds the slices, so it holds no borrow of the caller's buffers.
//!
//! On the data path nothing allocates: the byte buffer and the splice queue keep their capacity
//! when they drain.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::ops::Range;

/// Slot `slot`'s bytes `start..end`, written once `bytes` has gone out up to `at`.
#[derive(Debug, Clone, Copy)]
struct Splice {
    at: usize,
    slot: u16,
    start: usize,
    end: usize,
}

/// Bytes waiting for the socket, in order: `bytes` from `pos`, with `splices` in between.
#[derive(Debug, Default)]
pub struct SplicedOutput {
    bytes: Vec<u8>,
    /// Bytes of `bytes` written.
    pos: usize,
    splices: VecDeque<Splice>,
    /// Bytes of the first splice written.
    splice_pos: usize,
    /// Bytes of all queued splices, the first one's written part included.
    splice_bytes: usize,
    /// The most `bytes` held when the queue drained, since the last [`SplicedOutput::take_high`].
    high: usize,
}

impl SplicedOutput {
    /// An empty queue whose buffer holds `bytes` and whose splice queue holds `splices` before
    /// either grows.
    pub fn with_capacity(bytes: usize, splices: usize) -> SplicedOutput {
        SplicedOutput { bytes: Vec::with_capacity(bytes), splices: VecDeque::with_capacity(splices), ..SplicedOutput::default() }
    }

    /// The buffer PDUs are encoded into: append only, since what it holds is queued.
    #[inline]
    pub fn bytes_mut(&mut self) -> &mut Vec<u8> {
        &mut self.bytes
    }

    /// Queues `slot`'s bytes `range` after everything queued so far. A slot's consecutive
    /// splices are one payload for [`SplicedOutput::consume`]'s `written`.
    #[inline]
    pub fn splice(&mut self, slot: u16, range: Range<usize>) {
        debug_assert!(!range.is_empty(), "an empty splice would never be consumed");
        self.splice_bytes += range.len();
        self.splices.push_back(Splice { at: self.bytes.len(), slot, start: range.start, end: range.end });
    }

    /// Bytes queued and not yet written.
    #[inline]
    pub fn len(&self) -> usize {
        self.buffered() + self.splice_bytes - self.splice_pos
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.pos == self.bytes.len() && self.splices.is_empty()
    }

    /// Bytes of the queue's own buffer not yet written (spliced payloads not counted).
    #[inline]
    pub fn buffered(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// The capacity of the queue's own buffer.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.bytes.capacity()
    }

    /// The most bytes the queue's buffer held when it drained since the last call (the first
    /// call: since it was made); the caller decides from it whether a burst's growth is still
    /// needed.
    #[inline]
    pub fn take_high(&mut self) -> usize {
        std::mem::take(&mut self.high)
    }

    /// Gives the buffer's growth back: a drained queue gets a fresh buffer of `capacity` bytes.
    /// A queue still holding output keeps its buffer.
    pub fn shrink(&mut self, capacity: usize) {
        if self.is_empty() {
            self.bytes = Vec::with_capacity(capacity);
        }
    }

    /// Drops everything queued (the connection is replaced or about to end).
    #[inline]
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.pos = 0;
        self.splices.clear();
        self.splice_pos = 0;
        self.splice_bytes = 0;
    }

    /// Fills `iov` from the start with the queued output in order, for one vectored write; the
    /// number of slices filled (fewer than the output holds when `iov` is short). `slot` gives
    /// a slot's buffer.
    pub fn slices<'a>(&'a self, iov: &mut [IoSlice<'a>], slot: impl Fn(u16) -> &'a [u8]) -> usize {
        let mut n = 0;
        let mut pos = self.pos;
        let mut skip = self.splice_pos;
        for s in &self.splices {
            let data = &slot(s.slot)[s.start + skip..s.end];
            for bytes in [&self.bytes[pos..s.at], data] {
                if n == iov.len() {
                    return n;
                }
                if !bytes.is_empty() {
                    iov[n] = IoSlice::new(bytes);
                    n += 1;
                }
            }
            pos = s.at;
            skip = 0;
        }
        if n < iov.len() && pos < self.bytes.len() {
            iov[n] = IoSlice::new(&self.bytes[pos..]);
            n += 1;
        }
        n
    }

    /// `n` bytes of the output were written. `written(slot)` is called as each slot's payload
    /// (its consecutive splices) has all gone out, so the caller may reuse the slot's buffer.
    pub fn consume(&mut self, mut n: usize, mut written: impl FnMut(u16)) {
        while n > 0 {
            let next_at = self.splices.front().map_or(self.bytes.len(), |s| s.at);
            if self.pos < next_at {
                let k = n.min(next_at - self.pos);
                self.pos += k;
                n -= k;
                continue;
            }
            let Some(s) = self.splices.front().copied() else { break };
            let k = n.min(s.end - s.start - self.splice_pos);
            self.splice_pos += k;
            n -= k;
            if self.splice_pos == s.end - s.start {
                self.splices.pop_front();
                self.splice_pos = 0;
                self.splice_bytes -= s.end - s.start;
                if self.splices.front().is_none_or(|next| next.slot != s.slot) {
                    written(s.slot);
                }
            }
        }
        if self.is_empty() {
            self.high = self.high.max(self.bytes.len());
            self.bytes.clear();
            self.pos = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SLOTS: usize = 4;
    const SLOT_LEN: usize = 300;

    fn slot_buffers() -> Vec<Vec<u8>> {
        (0..SLOTS).map(|s| (0..SLOT_LEN).map(|i| (i as u8).wrapping_mul(7) ^ (s as u8 * 50)).collect()).collect()
    }

    /// One queued piece: own bytes (a PDU header), or a slot's range.
    #[derive(Debug, Clone)]
    enum Piece {
        Bytes(Vec<u8>),
        Slot(u16, Range<usize>),
    }

    fn piece() -> impl Strategy<Value = Piece> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 1..40).prop_map(Piece::Bytes),
            (0..SLOTS as u16, 0..SLOT_LEN - 1, 1..SLOT_LEN).prop_map(|(s, a, l)| Piece::Slot(s, a..(a + l).min(SLOT_LEN))),
        ]
    }

    /// Writes the queue out in writes of the given sizes (cycled) through an `iov` of `iov_len`
    /// slices, as a socket taking part of each write would; the bytes, and the slots reported
    /// written with the stream range of the write that reported each.
    fn drain(q: &mut SplicedOutput, buffers: &[Vec<u8>], writes: &[usize], iov_len: usize) -> (Vec<u8>, Vec<(u16, Range<usize>)>) {
        let mut out = Vec::new();
        let mut reported = Vec::new();
        for &size in writes.iter().cycle().take(100_000) {
            if q.is_empty() {
                break;
            }
            let mut iov = vec![IoSlice::new(&[]); iov_len];
            let n = q.slices(&mut iov, |s| &buffers[s as usize]);
            let chunk: Vec<u8> = iov[..n].iter().flat_map(|s| s.iter().copied()).take(size).collect();
            let before = q.len();
            let write = out.len()..out.len() + chunk.len();
            q.consume(chunk.len(), |s| reported.push((s, write.clone())));
            assert_eq!(q.len(), before - chunk.len());
            out.extend_from_slice(&chunk);
        }
        (out, reported)
    }

    proptest! {
        #[test]
        fn output_goes_out_in_order_and_each_payload_is_reported_once_written(
            pieces in proptest::collection::vec(piece(), 0..24),
            writes in proptest::collection::vec(1usize..200, 1..6),
            iov_len in 1usize..6,
        ) {
            let buffers = slot_buffers();
            let mut q = SplicedOutput::with_capacity(16, 2);
            let mut want = Vec::new();
            // Where each payload (a slot's splices, one after another in the splice queue
            // whatever bytes lie between them) ends in the stream.
            let mut payload_ends: Vec<(u16, usize)> = Vec::new();
            for p in &pieces {
                match p {
                    Piece::Bytes(b) => {
                        q.bytes_mut().extend_from_slice(b);
                        want.extend_from_slice(b);
                    }
                    Piece::Slot(s, r) => {
                        q.splice(*s, r.clone());
                        want.extend_from_slice(&buffers[*s as usize][r.clone()]);
                        match payload_ends.last_mut() {
                            Some((last, end)) if last == s => *end = want.len(),
                            _ => payload_ends.push((*s, want.len())),
                        }
                    }
                }
            }
            prop_assert_eq!(q.len(), want.len());
            let (got, reported) = drain(&mut q, &buffers, &writes, iov_len);
            prop_assert!(got == want, "the bytes went out in another order");
            prop_assert!(q.is_empty());
            prop_assert_eq!(q.len(), 0);
            // Each payload is reported once, by the write that took its last byte.
            prop_assert_eq!(reported.len(), payload_ends.len());
            for ((slot, write), (want_slot, end)) in reported.iter().zip(&payload_ends) {
                prop_assert_eq!(slot, want_slot);
                prop_assert!(write.start < *end && *end <= write.end, "slot {} ending at {} reported by write {:?}", slot, end, write);
            }
        }
    }

    #[test]
    fn a_drained_queue_keeps_its_buffer_and_remembers_how_full_it_was() {
        let buffers = slot_buffers();
        let mut q = SplicedOutput::with_capacity(8, 1);
        q.bytes_mut().extend_from_slice(&[1; 100]);
        q.splice(2, 10..20);
        q.bytes_mut().extend_from_slice(&[2; 5]);
        assert_eq!((q.len(), q.buffered()), (115, 105));
        let cap = q.capacity();
        let (got, reported) = drain(&mut q, &buffers, &[7], 3);
        assert_eq!(got.len(), 115);
        assert_eq!(reported, vec![(2, 105..112)], "the slot's last byte is the stream's 110th");
        assert_eq!((q.buffered(), q.capacity()), (0, cap), "drained, the buffer is kept for the next PDUs");
        assert_eq!(q.take_high(), 105);
        assert_eq!(q.take_high(), 0, "taken");
        q.shrink(8);
        assert!(q.capacity() < cap);
    }

    #[test]
    fn a_queue_with_output_keeps_its_buffer_when_asked_to_shrink_and_clear_drops_it_all() {
        let mut q = SplicedOutput::default();
        q.bytes_mut().extend_from_slice(&[1; 1000]);
        q.splice(0, 0..50);
        let cap = q.capacity();
        q.shrink(0);
        assert_eq!((q.capacity(), q.len()), (cap, 1050));
        q.clear();
        assert!(q.is_empty());
        assert_eq!(q.len(), 0);
        let mut iov = [IoSlice::new(&[]); 2];
        assert_eq!(q.slices(&mut iov, |_| &[]), 0);
    }
}
