//! Records received straight into the reader's buffer, as plain NVMe/TCP lands a large payload
//! in its command buffer (issue 40 item 2). Through the receive buffer every byte of a 128 KiB
//! H2CData payload was copied once more after decryption, from the (cached) receive buffer
//! into the (cold) command buffer, and that copy cost more than the cipher (docs/tls.md, "Where
//! 128 KiB loses it").
//!
//! When the next record's header is in and its body fits the buffer the caller reads into, the
//! body is read there, and so are the records after it (a *run*), in one vectored read: each
//! record's encrypted inner plaintext where its plaintext belongs, its tag beside it, the next
//! record's header beside that, and the header after the run into the receive buffer. Records
//! are then opened in place where they lie. A record's encrypted content type byte lies where
//! the next record's plaintext starts, so each later record's first byte is read aside and put
//! back once the record before it is open.
//!
//! The records after the first are assumed to be as long as the first (a peer streaming a large
//! payload sends full 16 KiB records); when one is not, or a record is not application data or
//! carries padding, what was read past it goes back to the receive buffer (copied) and is read
//! from there. A record that would not fit the buffer (the one a payload ends in, which holds
//! what follows the payload too) goes through the receive buffer as before.

use std::io::IoSliceMut;

use crate::record::{Opener, RecordError, RecvBuf, APPLICATION_DATA, HEADER, MAX_BODY, TAG};

/// Smallest record plaintext worth landing: below it the copy costs less than the bookkeeping.
pub const MIN_LANDING: usize = 8 << 10;
/// Most records read in one run (256 KiB of full records).
pub const MAX_RUN: usize = 16;

/// One record of a run: its header (the first record's came through the receive buffer), the
/// first byte of its encrypted inner plaintext (read aside for every record but the first) and
/// its tag.
#[derive(Debug, Clone, Copy)]
struct Slot {
    header: [u8; HEADER],
    first: [u8; 1],
    tag: [u8; TAG],
}

/// Records being received into the caller's buffer.
#[derive(Debug)]
pub(crate) struct RecordLanding {
    slots: Vec<Slot>,
    /// Body length of every record of the run (the first's, assumed for the rest).
    body: usize,
    /// Bytes of the run received so far, counted from the first record's body.
    got: usize,
    /// Where the caller's buffer starts: it must come back with the same one until the run is
    /// done, since the bytes received so far lie there.
    at: usize,
}

/// What a run gave once read: plaintext at the buffer's front, and the record that ended it if
/// that was not application data (its content type and the range of its plaintext in the buffer).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Opened {
    pub plaintext: usize,
    pub non_data: Option<(u8, std::ops::Range<usize>)>,
}

/// One piece of a run on the wire, in order.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Piece {
    /// Record k's header (k >= 1).
    Header(usize),
    /// Record k's first encrypted byte, read aside (k >= 1).
    First(usize),
    /// Record k's encrypted inner plaintext in the buffer: `dst[from..to]`.
    Data { from: usize, to: usize },
    /// Record k's tag.
    Tag(usize),
    /// The header after the run, into the receive buffer.
    Next,
}

impl Piece {
    fn len(self) -> usize {
        match self {
            Piece::Header(_) | Piece::Next => HEADER,
            Piece::First(_) => 1,
            Piece::Data { from, to } => to - from,
            Piece::Tag(_) => TAG,
        }
    }
}

impl RecordLanding {
    /// Starts landing the partial record at the head of `rx` (and the records after it) in
    /// `dst` when its body fits there, moving the body bytes already received; None when it
    /// does not or is not worth it.
    pub(crate) fn start(rx: &mut RecvBuf, dst: &mut [u8]) -> Option<RecordLanding> {
        let (header, body, _) = rx.partial_record()?;
        if header[0] != APPLICATION_DATA || !(TAG + 1 + MIN_LANDING..=MAX_BODY).contains(&body) || body - TAG > dst.len() {
            return None;
        }
        let first = Slot { header, first: [0], tag: [0; TAG] };
        let mut landing = RecordLanding::run(first, body, 0, dst);
        let held = rx.partial_body().to_vec();
        landing.fill(dst, &held);
        rx.drop_partial();
        Some(landing)
    }

    /// A run in `dst` whose first record is `first` (body length `body`, `got` bytes of it in),
    /// with as many records after it as `dst` holds.
    fn run(first: Slot, body: usize, got: usize, dst: &[u8]) -> RecordLanding {
        // Records k = 0..n need dst[..n * plain + 1]: the last one's content type byte too.
        let records = ((dst.len() - 1) / (body - TAG - 1)).clamp(1, MAX_RUN);
        let mut slots = vec![Slot { header: [0; HEADER], first: [0], tag: [0; TAG] }; records];
        slots[0] = first;
        RecordLanding { slots, body, got, at: dst.as_ptr() as usize }
    }

    /// Plaintext length of a full record of the run.
    fn plain(&self) -> usize {
        self.body - TAG - 1
    }

    /// The run's pieces in wire order.
    fn pieces(&self) -> impl Iterator<Item = Piece> + '_ {
        let p = self.plain();
        (0..self.slots.len())
            .flat_map(move |k| {
                let data = if k == 0 { Piece::Data { from: 0, to: p + 1 } } else { Piece::Data { from: k * p + 1, to: (k + 1) * p + 1 } };
                let head = if k == 0 { [None, None] } else { [Some(Piece::Header(k)), Some(Piece::First(k))] };
                head.into_iter().flatten().chain([data, Piece::Tag(k)])
            })
            .chain([Piece::Next])
    }

    /// Wire offset (from the first body byte) where record k's header starts (k >= 1), and
    /// where record k ends.
    fn header_at(&self, k: usize) -> usize {
        self.body + (k - 1) * (HEADER + self.body)
    }
    fn end_of(&self, k: usize) -> usize {
        if k == 0 {
            self.body
        } else {
            self.header_at(k) + HEADER + self.body
        }
    }

    /// Copies `bytes` (the run's next bytes, from the receive buffer) to where they belong.
    fn fill(&mut self, dst: &mut [u8], bytes: &[u8]) {
        let mut at = 0;
        self.each_piece(dst, self.got..self.got + bytes.len(), |mem| {
            crate::record::copy_chunked(mem, &bytes[at..at + mem.len()]);
            at += mem.len();
        });
        debug_assert_eq!(at, bytes.len(), "the receive buffer held no more than one partial record");
        self.got += at;
    }

    /// Calls `f` with the memory of each piece of the run, in wire order, cut to the run's
    /// bytes `wire` (offsets from the first record's body); the header after the run, which is
    /// the receive buffer's, is left out.
    fn each_piece(&mut self, dst: &mut [u8], wire: std::ops::Range<usize>, mut f: impl FnMut(&mut [u8])) {
        let mut offset = 0;
        for piece in self.pieces().collect::<Vec<_>>() {
            let (from, to) = (wire.start.max(offset), wire.end.min(offset + piece.len()));
            if from < to {
                let mem: &mut [u8] = match piece {
                    Piece::Header(k) => &mut self.slots[k].header,
                    Piece::First(k) => &mut self.slots[k].first,
                    Piece::Data { from, to } => &mut dst[from..to],
                    Piece::Tag(k) => &mut self.slots[k].tag,
                    Piece::Next => break,
                };
                f(&mut mem[from - offset..to - offset]);
            }
            offset += piece.len();
        }
    }

    /// `dst` is the buffer the landing started in.
    pub(crate) fn same_buffer(&self, dst: &[u8]) -> bool {
        dst.as_ptr() as usize == self.at && dst.len() > self.slots.len() * self.plain()
    }

    /// Where the next bytes go, in order: what is left of the run's pieces, then room in `rx`
    /// for the header after it (so that the read stops where the next landing can start).
    pub(crate) fn slices<'a>(&'a mut self, dst: &'a mut [u8], rx: &'a mut RecvBuf) -> Vec<IoSliceMut<'a>> {
        let p = self.plain();
        let mut mems: Vec<&'a mut [u8]> = Vec::with_capacity(4 * self.slots.len() + 1);
        let mut rest = dst;
        for (k, Slot { header, first, tag }) in self.slots.iter_mut().enumerate() {
            // Record k's data follows record k-1's (whose content type byte ends at k * p + 1).
            let len = if k == 0 { p + 1 } else { p };
            let (data, tail) = std::mem::take(&mut rest).split_at_mut(len);
            rest = tail;
            if k > 0 {
                mems.extend([&mut header[..], &mut first[..]]);
            }
            mems.extend([data, &mut tag[..]]);
        }
        mems.push(&mut rx.space()[..HEADER]);
        let mut skip = self.got;
        mems.into_iter()
            .filter_map(|m| {
                let k = skip.min(m.len());
                skip -= k;
                (k < m.len()).then(|| IoSliceMut::new(&mut m[k..]))
            })
            .collect()
    }

    /// The first record of the run is all in (so [`RecordLanding::open`] has work).
    pub(crate) fn first_whole(&self) -> bool {
        self.got >= self.end_of(0)
    }

    /// `n` bytes arrived in [`RecordLanding::slices`]; the ones past the run went to `rx`.
    pub(crate) fn commit(&mut self, n: usize, rx: &mut RecvBuf) {
        let run = self.end_of(self.slots.len() - 1);
        let k = n.min(run - self.got);
        self.got += k;
        rx.commit(n - k);
    }

    /// Opens the records that are all in, in place in `dst`, in order. Returns what they gave,
    /// and the landing to go on with (the record after them, partly in, still landing), or None
    /// when the run is over: what arrived past its records is then back in `rx`.
    pub(crate) fn open(mut self, opener: &mut Opener, dst: &mut [u8], rx: &mut RecvBuf) -> Result<(Opened, Option<RecordLanding>), RecordError> {
        let p = self.plain();
        let mut opened = Opened::default();
        for k in 0..self.slots.len() {
            let whole = self.got >= self.end_of(k);
            let header_in = k == 0 || self.got >= self.header_at(k) + HEADER;
            let expected = k == 0 || self.slots[k].header == self.slots[0].header;
            if k > 0 && (!header_in || !expected) {
                // Not the record assumed, or not its whole header: from its header on, the bytes
                // go back to the receive buffer.
                self.spill(k, dst, rx);
                return Ok((opened, None));
            }
            if !whole {
                // Record k lands on: it starts where the plaintext so far ends.
                if k > 0 {
                    dst[k * p] = self.slots[k].first[0];
                }
                let got = self.got - if k == 0 { 0 } else { self.header_at(k) + HEADER };
                return Ok((opened, Some(RecordLanding::run(self.slots[k], self.body, got, &dst[k * p..]))));
            }
            if k > 0 {
                dst[k * p] = self.slots[k].first[0];
            }
            let slot = self.slots[k];
            let (ty, len) = opener.open_parts(&slot.header, &mut dst[k * p..(k + 1) * p + 1], &slot.tag)?;
            let ends_run = ty != APPLICATION_DATA || len != p || k + 1 == self.slots.len();
            if ty == APPLICATION_DATA {
                opened.plaintext += len;
            } else {
                opened.non_data = Some((ty, k * p..k * p + len));
            }
            if ends_run {
                if k + 1 < self.slots.len() {
                    self.spill(k + 1, dst, rx);
                }
                return Ok((opened, None));
            }
        }
        unreachable!("the last record ends the run")
    }

    /// The bytes received from record k's header on go back to `rx`, in wire order.
    fn spill(&mut self, k: usize, dst: &mut [u8], rx: &mut RecvBuf) {
        let mut bytes = Vec::new();
        let received = self.header_at(k)..self.got.min(self.end_of(self.slots.len() - 1));
        self.each_piece(dst, received, |mem| bytes.extend_from_slice(mem));
        // What came after the run (the next header) is in rx already, behind these bytes.
        rx.push_front(&bytes);
    }

    /// Bytes received and not opened yet.
    pub(crate) fn held(&self) -> usize {
        HEADER + self.got
    }
}

/// How many bytes a read into the receive buffer may take so that it stops at the end of the
/// next record's header (the record at `rx`'s head, and the header after it): the following
/// record can then land. None when `rx` holds a whole record or plaintext (nothing to read).
pub(crate) fn read_limit(rx: &RecvBuf) -> Option<usize> {
    if !rx.plaintext().is_empty() {
        return None;
    }
    match rx.partial_record() {
        Some((_, body, held)) => Some(body - held + HEADER),
        None if matches!(rx.complete_record(), Ok(None)) => Some(HEADER - rx.unopened()),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ktls::TrafficKeys;
    use crate::record::{Sealer, HANDSHAKE, MAX_PLAINTEXT};
    use crate::TlsHash;
    use std::io::IoSlice;

    fn pair() -> (Sealer, Opener) {
        let keys = TrafficKeys::from_secret(TlsHash::Sha256, &[7; 32]);
        (Sealer::new(&keys).unwrap(), Opener::new(&keys).unwrap())
    }

    /// A socket holding `wire`, each read giving at most the next of `steps` (cycled) bytes.
    struct Sock<'w> {
        wire: &'w [u8],
        pos: usize,
        steps: Vec<usize>,
        reads: usize,
    }

    impl Sock<'_> {
        fn readv(&mut self, iov: &mut [IoSliceMut<'_>]) -> usize {
            let mut left = self.steps[self.reads % self.steps.len()].min(self.wire.len() - self.pos);
            self.reads += 1;
            let mut n = 0;
            for s in iov.iter_mut() {
                let k = s.len().min(left);
                s[..k].copy_from_slice(&self.wire[self.pos..self.pos + k]);
                (self.pos, left, n) = (self.pos + k, left - k, n + k);
            }
            n
        }
    }

    /// What a reader got: the plaintext in order, and how much of it landed.
    #[derive(Default)]
    struct Reader {
        rx: RecvBuf,
        landing: Option<RecordLanding>,
        landed: usize,
        non_data: Vec<u8>,
    }

    impl Reader {
        /// Fills `dst` as the target's wire does: plaintext held first, then runs landed in
        /// `dst` where they can (`land`), else reads into the receive buffer that stop at the
        /// next record's header.
        fn fill(&mut self, sock: &mut Sock, opener: &mut Opener, dst: &mut [u8], land: bool) -> Result<(), RecordError> {
            let mut done = 0;
            while done < dst.len() {
                if !self.rx.plaintext().is_empty() {
                    let n = self.rx.plaintext().len().min(dst.len() - done);
                    dst[done..done + n].copy_from_slice(&self.rx.plaintext()[..n]);
                    self.rx.consume(n);
                    done += n;
                    continue;
                }
                if let Some(len) = self.rx.complete_record()? {
                    assert_eq!(self.rx.open_next(opener, len)?, APPLICATION_DATA);
                    continue;
                }
                if land && self.landing.is_none() {
                    self.landing = RecordLanding::start(&mut self.rx, &mut dst[done..]);
                }
                assert!(sock.pos < sock.wire.len(), "the reader wants more than was sent");
                if let Some(mut l) = self.landing.take() {
                    assert!(l.same_buffer(&dst[done..]));
                    let n = sock.readv(&mut l.slices(&mut dst[done..], &mut self.rx));
                    l.commit(n, &mut self.rx);
                    if !l.first_whole() {
                        self.landing = Some(l);
                        continue;
                    }
                    let (opened, next) = l.open(opener, &mut dst[done..], &mut self.rx)?;
                    if let Some((ty, range)) = &opened.non_data {
                        assert_eq!(*ty, HANDSHAKE);
                        self.non_data.extend_from_slice(&dst[done..][range.clone()]);
                    }
                    (done, self.landed, self.landing) = (done + opened.plaintext, self.landed + opened.plaintext, next);
                } else {
                    let limit = if land { read_limit(&self.rx).unwrap() } else { usize::MAX };
                    let space = self.rx.space();
                    let want = space.len().min(limit);
                    let n = sock.readv(&mut [IoSliceMut::new(&mut space[..want])]);
                    self.rx.commit(n);
                }
            }
            Ok(())
        }
    }

    fn pattern(len: usize, seed: u32) -> Vec<u8> {
        (0..len as u32).map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) >> 13) as u8).collect()
    }

    /// A 24-byte PDU header, a payload, then 100 bytes of what follows, sealed in sends of
    /// `send` plaintext bytes (as the host seals its queue), read back through a reader that
    /// lands the payload; returns the reader and how many socket reads it took.
    fn through(send: usize, steps: Vec<usize>, payload_len: usize) -> (Reader, usize) {
        let (mut sealer, mut opener) = pair();
        let (hdr, payload, after) = (pattern(24, 1), pattern(payload_len, 2), pattern(100, 3));
        let stream = [&hdr[..], &payload, &after].concat();
        let mut wire = Vec::new();
        for chunk in stream.chunks(send) {
            sealer.seal_vectored(&[IoSlice::new(chunk)], usize::MAX, &mut wire).unwrap();
        }
        let mut sock = Sock { wire: &wire, pos: 0, steps, reads: 0 };
        let mut reader = Reader::default();
        let (mut h, mut p, mut a) = (vec![0; 24], vec![0; payload_len], vec![0; 100]);
        reader.fill(&mut sock, &mut opener, &mut h, true).unwrap();
        reader.fill(&mut sock, &mut opener, &mut p, true).unwrap();
        reader.fill(&mut sock, &mut opener, &mut a, false).unwrap();
        assert_eq!((h, p == payload, a), (hdr, true, after), "send {send}");
        assert_eq!(sock.pos, wire.len(), "all read");
        (reader, sock.reads)
    }

    #[test]
    fn a_payload_of_full_records_lands_whole_in_any_reads() {
        for steps in [vec![usize::MAX], vec![4096], vec![16_401], vec![7, 30_000, 1, 70_000], vec![16_406 * 3 + 2]] {
            let (reader, _) = through(256 << 10, steps.clone(), 128 << 10);
            // All but the record the payload starts in and the one it ends in.
            assert!(reader.landed >= (128 << 10) - 2 * MAX_PLAINTEXT, "{steps:?}: {} landed", reader.landed);
        }
        // A socket that has it all: a run of 16 records per read, not a read per record.
        let (reader, reads) = through(256 << 10, vec![usize::MAX], 1 << 20);
        assert!(reader.landed >= (1 << 20) - 2 * MAX_PLAINTEXT, "{}", reader.landed);
        assert!(reads <= 8, "{reads} reads for 64 records");
    }

    #[test]
    fn shorter_records_in_a_run_go_back_through_the_receive_buffer() {
        // Sends of 40000 bytes end in a record shorter than the run's: the reads past it return.
        for steps in [vec![usize::MAX], vec![5000], vec![16_401 + 5 + 3]] {
            let (reader, _) = through(40_000, steps.clone(), 300_000);
            assert!(reader.landed > 0 && reader.landed < 300_000, "{steps:?}: {}", reader.landed);
        }
        // Small records never land.
        let (reader, _) = through(4096, vec![usize::MAX], 200_000);
        assert_eq!(reader.landed, 0);
    }

    #[test]
    fn a_record_of_another_type_ends_a_run_and_is_handed_back() {
        let (mut sealer, mut opener) = pair();
        let (a, ticket, b) = (pattern(3 * MAX_PLAINTEXT, 4), pattern(MAX_PLAINTEXT, 5), pattern(2 * MAX_PLAINTEXT + 1, 6));
        let mut wire = Vec::new();
        sealer.seal_vectored(&[IoSlice::new(&a)], usize::MAX, &mut wire).unwrap();
        sealer.seal_record(HANDSHAKE, &[&ticket], &mut wire).unwrap();
        sealer.seal_vectored(&[IoSlice::new(&b)], usize::MAX, &mut wire).unwrap();
        // The first record's header arrives alone, as after a PDU header.
        let mut rx = RecvBuf::default();
        rx.push(&wire[..HEADER]);
        let mut sock = Sock { wire: &wire[HEADER..], pos: 0, steps: vec![usize::MAX], reads: 0 };
        let mut reader = Reader { rx, ..Default::default() };
        let mut dst = vec![0; a.len() + b.len()];
        reader.fill(&mut sock, &mut opener, &mut dst, true).unwrap();
        assert_eq!(dst, [&a[..], &b].concat());
        assert_eq!(reader.non_data, ticket, "the handshake record's plaintext, not the data's");
        assert!(reader.landed >= a.len(), "{}", reader.landed);
    }

    #[test]
    fn a_damaged_landed_record_fails_authentication() {
        let (mut sealer, mut opener) = pair();
        let data = pattern(4 * MAX_PLAINTEXT, 7);
        let mut wire = Vec::new();
        sealer.seal_vectored(&[IoSlice::new(&data)], usize::MAX, &mut wire).unwrap();
        for at in [HEADER + 1, HEADER + MAX_PLAINTEXT, 2 * (HEADER + MAX_PLAINTEXT + 17) + 3] {
            let mut bad = wire.clone();
            bad[at] ^= 0x40;
            let mut rx = RecvBuf::default();
            rx.push(&bad[..HEADER]);
            let mut sock = Sock { wire: &bad[HEADER..], pos: 0, steps: vec![usize::MAX], reads: 0 };
            let mut reader = Reader { rx, ..Default::default() };
            let mut dst = vec![0; data.len()];
            assert_eq!(reader.fill(&mut sock, &mut pair().1, &mut dst, true), Err(RecordError::BadMac), "byte {at}");
        }
        let _ = &mut opener;
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(64))]
        /// Records of any sizes (full ones, short ones, runs broken anywhere), read in any
        /// pieces into buffers of any lengths: the plaintext comes out whole and in order.
        #[test]
        fn any_records_any_reads_any_buffers(
            sizes in proptest::collection::vec(proptest::prop_oneof![Just(MAX_PLAINTEXT), 1usize..=MAX_PLAINTEXT], 1..12),
            steps in proptest::collection::vec(1usize..70_000, 1..6),
            cuts in proptest::collection::vec(1usize..80_000, 1..8),
        ) {
            let (mut sealer, mut opener) = pair();
            let data = pattern(sizes.iter().sum(), 9);
            let mut wire = Vec::new();
            let mut at = 0;
            for &n in &sizes {
                sealer.seal_record(APPLICATION_DATA, &[&data[at..at + n]], &mut wire).unwrap();
                at += n;
            }
            let mut sock = Sock { wire: &wire, pos: 0, steps, reads: 0 };
            let mut reader = Reader::default();
            let mut got = Vec::new();
            for &cut in cuts.iter().cycle() {
                let n = cut.min(data.len() - got.len());
                if n == 0 {
                    break;
                }
                let mut buf = vec![0; n];
                reader.fill(&mut sock, &mut opener, &mut buf, true).unwrap();
                got.extend_from_slice(&buf);
            }
            proptest::prop_assert!(got == data);
        }
    }

    use proptest::prelude::Just;

    #[test]
    fn a_landing_needs_room_for_the_whole_record_and_the_same_buffer() {
        let (mut sealer, _) = pair();
        let mut wire = Vec::new();
        sealer.seal_vectored(&[IoSlice::new(&pattern(MAX_PLAINTEXT, 8))], usize::MAX, &mut wire).unwrap();
        let mut rx = RecvBuf::default();
        rx.push(&wire[..100]);
        // The encrypted plaintext and its content type must fit.
        assert!(RecordLanding::start(&mut rx, &mut vec![0; MAX_PLAINTEXT]).is_none());
        assert_eq!(rx.unopened(), 100, "nothing taken");
        assert_eq!(read_limit(&rx), Some(wire.len() - 100 + HEADER));
        let mut dst = vec![0; MAX_PLAINTEXT + 1];
        let landing = RecordLanding::start(&mut rx, &mut dst).unwrap();
        assert_eq!(&dst[..95], &wire[HEADER..100], "the bytes held moved to the buffer");
        assert_eq!(rx.unopened(), 0);
        assert!(landing.same_buffer(&dst));
        assert!(!landing.same_buffer(&dst[1..]));
        // A partial header: read the rest of it first.
        let mut rx = RecvBuf::default();
        rx.push(&wire[..2]);
        assert_eq!(read_limit(&rx), Some(3));
        assert!(RecordLanding::start(&mut rx, &mut vec![0; 1 << 20]).is_none());
    }
}
