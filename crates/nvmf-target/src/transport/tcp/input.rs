//! A connection's input: socket bytes go into the receive buffer, or straight into the command
//! buffer of the payload now landing (see `landing`), through the slices one vectored read fills.

use super::{Connection, LANDING_TAIL, RECV_CHUNK};
use std::io::IoSliceMut;

impl Connection {
    /// Payloads of at least `min` bytes land in their command buffer instead of being copied:
    /// tests and fuzzers lower it to reach that path with small PDUs.
    pub fn land_payloads_from(&mut self, min: usize) {
        self.land_min = min.max(1);
    }

    /// Payload bytes received straight into command buffers so far (with the few that came
    /// with their header, copied there).
    pub fn landed_bytes(&self) -> u64 {
        self.landed_bytes
    }

    /// Where the next socket bytes go, for one vectored read: the payload now landing (and its
    /// digest), then room in the receive buffer. Fills `iov` from the start and returns how many
    /// it filled (0: no room until [`process`](Self::process) runs); call
    /// [`recv_commit`](Self::recv_commit) with the bytes read.
    pub fn recv_slices<'a>(&'a mut self, iov: &mut [IoSliceMut<'a>]) -> usize {
        self.make_room();
        let Connection { landing, life, inbuf, in_len, .. } = self;
        let slots = &mut life.slots;
        let (mut n, mut tail) = (0, usize::MAX);
        if let Some(l) = landing.as_mut().filter(|l| !l.landed()) {
            let (filled, whole) = l.slices(slots, iov);
            n = filled;
            tail = if whole { LANDING_TAIL } else { 0 };
        }
        let space = &mut inbuf[*in_len..];
        let room = space.len().min(tail);
        if room > 0 && n < iov.len() {
            iov[n] = IoSliceMut::new(&mut space[..room]);
            n += 1;
        }
        n
    }

    /// Compacts and grows the receive buffer so that a whole PDU always fits.
    fn make_room(&mut self) {
        if self.in_pos > 0 && (self.in_pos == self.in_len || self.inbuf.len() - self.in_len < RECV_CHUNK / 4) {
            self.inbuf.copy_within(self.in_pos..self.in_len, 0);
            self.in_len -= self.in_pos;
            self.in_pos = 0;
        }
        // Room for one maximal PDU, so a PDU never waits for space.
        let want = (self.in_len + RECV_CHUNK).min(self.in_pos + self.framer.max_pdu_len() + RECV_CHUNK);
        if self.inbuf.len() < want {
            self.inbuf.resize(want, 0);
        }
    }

    /// `n` bytes were read into the slices [`recv_slices`](Self::recv_slices) gave.
    pub fn recv_commit(&mut self, mut n: usize) {
        if let Some(l) = self.landing.as_mut().filter(|l| !l.landed()) {
            n -= l.commit(n, &mut self.life.slots);
        }
        self.in_len = (self.in_len + n).min(self.inbuf.len());
    }

    /// Test and fuzzing convenience: receives `bytes` as one socket read would, into the
    /// slices [`recv_slices`](Self::recv_slices) gives (a landing payload first); returns how
    /// many it took. [`process`](Self::process) between calls says where the next payload goes.
    pub fn receive(&mut self, bytes: &[u8]) -> usize {
        let mut iov: [IoSliceMut; 4] = std::array::from_fn(|_| IoSliceMut::new(&mut []));
        let filled = self.recv_slices(&mut iov);
        let mut n = 0;
        for s in &mut iov[..filled] {
            let k = s.len().min(bytes.len() - n);
            s[..k].copy_from_slice(&bytes[n..n + k]);
            n += k;
        }
        self.recv_commit(n);
        n
    }

    /// Test and hand-off convenience: receives all of `bytes` without processing (so no new
    /// payload starts landing), as far as there is room.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let n = self.receive(bytes);
            if n == 0 {
                return;
            }
            bytes = &bytes[n..];
        }
    }
}
