//! Where the TLS record being read ends, so that a handshake read for kTLS never takes a byte
//! past the last handshake record: whatever follows it (the peer's first application record)
//! must stay in the socket for the kernel, which starts decrypting at record sequence 0.

/// TLS record header: type (1), legacy version (2), length (2).
pub const RECORD_HEADER_LEN: usize = 5;

/// Tracks the record boundary of a byte stream read in pieces.
#[derive(Clone, Debug, Default)]
pub struct RecordBoundary {
    header: [u8; RECORD_HEADER_LEN],
    /// Header bytes seen of the current record (5 once the header is complete).
    have: usize,
    /// Body bytes of the current record not read yet.
    body_left: usize,
}

impl RecordBoundary {
    pub fn new() -> Self {
        RecordBoundary::default()
    }

    /// How many bytes to read next so that the read ends at or before the current record's
    /// end; never 0.
    pub fn want(&self) -> usize {
        if self.have < RECORD_HEADER_LEN {
            RECORD_HEADER_LEN - self.have
        } else {
            self.body_left
        }
    }

    /// The bytes read so far end exactly at a record boundary.
    pub fn at_boundary(&self) -> bool {
        self.have == 0
    }

    /// Takes bytes as they were read (any split).
    pub fn advance(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.have < RECORD_HEADER_LEN {
                let n = (RECORD_HEADER_LEN - self.have).min(bytes.len());
                self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
                self.have += n;
                bytes = &bytes[n..];
                if self.have == RECORD_HEADER_LEN {
                    self.body_left = u16::from_be_bytes([self.header[3], self.header[4]]) as usize;
                    if self.body_left == 0 {
                        self.have = 0;
                    }
                }
            } else {
                let n = self.body_left.min(bytes.len());
                self.body_left -= n;
                bytes = &bytes[n..];
                if self.body_left == 0 {
                    self.have = 0;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_stop_at_each_record_end_whatever_the_split() {
        let stream = [&[22u8, 3, 3, 0, 3][..], &[1, 2, 3], &[23, 3, 3, 0, 0], &[23, 3, 3, 1, 0], &[0u8; 256]].concat();
        for step in [1usize, 2, 3, 7, 1000] {
            let mut b = RecordBoundary::new();
            let mut pos = 0;
            let mut ends = Vec::new();
            while pos < stream.len() {
                let n = b.want().min(step).min(stream.len() - pos);
                assert!(n > 0);
                b.advance(&stream[pos..pos + n]);
                pos += n;
                if b.at_boundary() {
                    ends.push(pos);
                }
            }
            assert_eq!(ends, [8, 13, 274], "step {step}");
        }
    }

    proptest::proptest! {
        /// Hostile headers and any split: reads of `want()` bytes end exactly at the record ends
        /// the headers state, and `want()` is never 0.
        #[test]
        fn any_records_any_split(lens in proptest::collection::vec(0usize..40, 1..8), step in 1usize..50) {
            let mut stream = Vec::new();
            let mut ends = Vec::new();
            for len in lens {
                stream.extend_from_slice(&[23, 3, 3, (len >> 8) as u8, len as u8]);
                stream.extend_from_slice(&vec![0xa5; len]);
                ends.push(stream.len());
            }
            let mut b = RecordBoundary::new();
            let (mut pos, mut seen) = (0, Vec::new());
            while pos < stream.len() {
                proptest::prop_assert!(b.want() > 0);
                let n = b.want().min(step).min(stream.len() - pos);
                b.advance(&stream[pos..pos + n]);
                pos += n;
                if b.at_boundary() {
                    seen.push(pos);
                }
            }
            proptest::prop_assert_eq!(seen, ends);
        }
    }

    #[test]
    fn want_covers_the_largest_length_a_header_can_state() {
        let mut b = RecordBoundary::new();
        b.advance(&[23, 3, 3, 0xff, 0xff]);
        assert_eq!(b.want(), 65535);
        assert!(!b.at_boundary());
    }
}
