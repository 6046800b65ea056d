//! A connection's output: PDUs encoded into `out` (nvmf-proto's
//! [`SplicedOutput`](nvmf_proto::spliced::SplicedOutput), the queue the host sends from too),
//! with read data written straight from the command buffers spliced in between (one vectored
//! write, no copy of large reads), then the CapsuleResps held back behind it
//! ([`Wire::responses`](super::data_path::Wire::responses)).

use super::data_path::{ZEROS, ZEROS_SLOT};
use super::Connection;

impl Connection {
    /// Bytes queued for the host and not yet written.
    pub fn output_len(&self) -> usize {
        self.wire.out.len() + self.wire.responses.len()
    }

    /// The queued output as slices in order, for one vectored write: fills `iov` from the start
    /// and returns how many it filled (fewer than the output holds when `iov` is short).
    pub fn output_slices<'a>(&'a self, iov: &mut [std::io::IoSlice<'a>]) -> usize {
        let n = self.wire.out.slices(iov, |slot| match slot {
            ZEROS_SLOT => &ZEROS[..],
            slot => self.life.slots[slot].buf.as_slice(),
        });
        // Fewer slices than room: all of `out` is in, and the held responses follow it.
        if n < iov.len() && !self.wire.responses.is_empty() {
            iov[n] = std::io::IoSlice::new(&self.wire.responses);
            return n + 1;
        }
        n
    }

    /// `n` bytes of the output were written. A slot whose data has all been written is free.
    pub fn consume_output(&mut self, n: usize) {
        if n > 0 {
            self.stall.progressed();
        }
        let from_out = n.min(self.wire.out.len());
        // A slot's sends are queued back to back: it is written once the next is another's.
        self.wire.out.consume(from_out, |slot| {
            if slot != ZEROS_SLOT {
                self.life.slots.free(slot)
            }
        });
        self.wire.responses_written(n - from_out);
    }

    /// Takes everything queued for the host (tests).
    pub fn take_output(&mut self) -> Vec<u8> {
        let mut v = Vec::new();
        while self.output_len() > 0 {
            let mut iov = [std::io::IoSlice::new(&[]); 64];
            let n = self.output_slices(&mut iov);
            let before = v.len();
            v.extend(iov[..n].iter().flat_map(|s| s.iter().copied()));
            self.consume_output(v.len() - before);
        }
        v
    }
}
