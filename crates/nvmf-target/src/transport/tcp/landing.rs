//! A data PDU's payload received straight into its command buffer. Once the header of an
//! H2CData PDU or of a capsule with in-capsule data is in, the connection says where the rest
//! goes: the reactor reads into the slot's buffer (and into the 4-byte data digest after it)
//! with one vectored read, and the digest is computed over the destination as bytes land.
//! Without it every payload byte was copied once more, from the receive buffer.

use super::super::slots::Slots;
use crate::command::Action;
use nvmf_proto::digest;
use nvmf_proto::pdu::H2CData;
use std::io::IoSliceMut;

/// Scratch bytes per read for a payload nobody wants (its command already failed).
const DISCARD_CHUNK: usize = 64 << 10;

/// Where the payload goes.
pub(super) enum Sink {
    /// Into slot `slot`'s buffer from byte `at`.
    Slot { slot: u16, at: usize },
    /// Nowhere: read and dropped (the digest is still checked).
    Discard(Vec<u8>),
}

/// What the PDU was, for what follows once its payload is in.
pub(super) enum Arrival {
    H2C(H2CData),
    /// In-capsule data of command `cid`. `then`: what the command layer answered when the
    /// capsule's header came, to be carried out once the data is in, when the data did not go
    /// to a slot.
    Capsule { cid: u16, then: Option<Action<'static>> },
}

pub(super) struct Landing {
    pub sink: Sink,
    pub arrival: Arrival,
    len: usize,
    got: usize,
    /// Running CRC32C over the landed bytes, when a data digest follows them.
    crc: Option<u32>,
    digest: [u8; 4],
    digest_got: usize,
}

impl Landing {
    pub fn new(sink: Sink, arrival: Arrival, len: usize, data_digest: bool) -> Landing {
        Landing { sink, arrival, len, got: 0, crc: data_digest.then_some(0), digest: [0; 4], digest_got: 0 }
    }

    fn digest_len(&self) -> usize {
        if self.crc.is_some() {
            4
        } else {
            0
        }
    }

    /// Payload bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Payload and digest are all in.
    pub fn landed(&self) -> bool {
        self.got == self.len && self.digest_got == self.digest_len()
    }

    /// The data digest held (true when none was negotiated). Only meaningful once landed.
    pub fn digest_ok(&self) -> bool {
        self.crc.is_none_or(|crc| crc == u32::from_le_bytes(self.digest))
    }

    /// The destination of payload bytes `from..to`; None if the slot lost its buffer (it cannot
    /// while the landing lives, but a slice is never taken on trust).
    fn dest<'a>(sink: &'a mut Sink, slots: &'a mut Slots, from: usize, to: usize) -> Option<&'a mut [u8]> {
        match sink {
            Sink::Slot { slot, at } => slots.get_mut(*slot)?.buf.as_mut_slice().get_mut(*at + from..*at + to),
            Sink::Discard(scratch) => {
                let n = (to - from).min(DISCARD_CHUNK);
                if scratch.len() < n {
                    scratch.resize(n, 0);
                }
                Some(&mut scratch[..n])
            }
        }
    }

    /// Fills `iov` with where the next bytes go: the rest of the payload, then the digest.
    /// Returns how many it filled and whether they cover all that is left of the PDU (only then
    /// may the caller append room for the bytes after it).
    pub fn slices<'a>(&'a mut self, slots: &'a mut Slots, iov: &mut [IoSliceMut<'a>]) -> (usize, bool) {
        if iov.len() < 2 {
            return (0, false);
        }
        let (from, to, dlen) = (self.got, self.len, self.digest_len());
        let mut n = 0;
        let mut whole = true;
        if from < to && Self::dest(&mut self.sink, slots, from, to).is_none() {
            self.sink = Sink::Discard(Vec::new());
        }
        if from < to {
            let Some(dest) = Self::dest(&mut self.sink, slots, from, to) else { return (0, false) };
            whole = dest.len() == to - from;
            iov[n] = IoSliceMut::new(dest);
            n += 1;
        }
        if whole && self.digest_got < dlen {
            iov[n] = IoSliceMut::new(&mut self.digest[self.digest_got..dlen]);
            n += 1;
        }
        (n, whole)
    }

    /// `n` bytes arrived in the slices last given; returns how many of them were the PDU's
    /// (the rest went to the room after it).
    pub fn commit(&mut self, n: usize, slots: &mut Slots) -> usize {
        let k = n.min(self.len - self.got);
        if k > 0 {
            if let (Some(crc), Some(dest)) = (self.crc, Self::dest(&mut self.sink, slots, self.got, self.got + k)) {
                self.crc = Some(digest::crc32c_append(crc, &dest[..k]));
            }
            self.got += k;
        }
        let d = (n - k).min(self.digest_len() - self.digest_got);
        self.digest_got += d;
        k + d
    }

    /// Takes the PDU's bytes that arrived with its header (copied: they are few); returns how
    /// many of `bytes` were the PDU's.
    pub fn absorb(&mut self, bytes: &[u8], slots: &mut Slots) -> usize {
        let mut used = 0;
        while used < bytes.len() && !self.landed() {
            let mut iov = [IoSliceMut::new(&mut []), IoSliceMut::new(&mut [])];
            let (filled, _) = self.slices(slots, &mut iov);
            let mut n = 0;
            for s in &mut iov[..filled] {
                let k = s.len().min(bytes.len() - used - n);
                s[..k].copy_from_slice(&bytes[used + n..used + n + k]);
                n += k;
            }
            used += self.commit(n, slots);
        }
        used
    }
}
