//! A connection's output: PDUs encoded into `out` (nvmf-proto's
//! [`SplicedOutput`](nvmf_proto::spliced::SplicedOutput), the queue the host sends from too),
//! with read data written straight from the command buffers spliced in between (one vectored
//! write, no copy of large reads).

use super::{Connection, C2H_CHUNK};
use crate::transport::slots::SlotState;
use nvmf_proto::pdu::{encode_pdu_header, C2HData};
use nvmf_proto::{digest, Digests, PduHeader};

impl Connection {
    /// Bytes queued for the host and not yet written.
    pub fn output_len(&self) -> usize {
        self.out.len()
    }

    /// The queued output as slices in order, for one vectored write: fills `iov` from the start
    /// and returns how many it filled (fewer than the output holds when `iov` is short).
    pub fn output_slices<'a>(&'a self, iov: &mut [std::io::IoSlice<'a>]) -> usize {
        self.out.slices(iov, |slot| self.slots[slot].buf.as_slice())
    }

    /// `n` bytes of the output were written. A slot whose data has all been written is free.
    pub fn consume_output(&mut self, n: usize) {
        if n > 0 {
            self.stall.progressed();
        }
        // A slot's sends are queued back to back: it is written once the next is another's.
        self.out.consume(n, |slot| self.slots.free(slot));
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

    /// C2HData PDUs carrying a copy of `data` (admin and authentication replies, reads under 16
    /// KiB). `zeros` says `data` is known to be all zeros (a null read): the output is then
    /// filled, not copied into. With `success` the last PDU also completes the command;
    /// otherwise the caller sends the response.
    pub(super) fn send_copied(out: &mut Vec<u8>, digests: Digests, cid: u16, data: &[u8], zeros: bool, success: bool) {
        let mut datao = 0;
        for chunk in data.chunks(C2H_CHUNK) {
            let last = datao + chunk.len() == data.len();
            let hdr = PduHeader::C2HData(C2HData {
                cccid: cid,
                datao: datao as u32,
                datal: chunk.len() as u32,
                last,
                success: success && last,
            });
            encode_pdu_header(out, &hdr, chunk.len(), digests);
            if zeros {
                out.resize(out.len() + chunk.len(), 0); // a write-only fill, no source to read
            } else {
                out.extend_from_slice(chunk);
            }
            if digests.data {
                out.extend_from_slice(&digest::data_digest(chunk).to_le_bytes());
            }
            datao += chunk.len();
        }
    }

    /// C2HData PDUs carrying slot `idx`'s buffer, sent from the buffer itself (the slot stays
    /// Sending until it is written). With `success` the last one also completes the command;
    /// otherwise the caller sends the response.
    pub(super) fn send_slot_data(&mut self, idx: u16, success: bool) {
        let slot = &mut self.slots[idx];
        slot.state = SlotState::Sending;
        let (cid, len) = (slot.cid, slot.buf.as_slice().len());
        let mut datao = 0;
        while datao < len {
            let chunk = C2H_CHUNK.min(len - datao);
            let last = datao + chunk == len;
            let hdr = PduHeader::C2HData(C2HData {
                cccid: cid,
                datao: datao as u32,
                datal: chunk as u32,
                last,
                success: success && last,
            });
            encode_pdu_header(self.out.bytes_mut(), &hdr, chunk, self.digests);
            self.out.splice(idx, datao..datao + chunk);
            if self.digests.data {
                let digest = digest::data_digest(&self.slots[idx].buf.as_slice()[datao..datao + chunk]);
                self.out.bytes_mut().extend_from_slice(&digest.to_le_bytes());
            }
            datao += chunk;
        }
    }
}
