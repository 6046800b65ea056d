//! A connection's output: PDUs encoded into `out`, with read data written straight from the
//! command buffers spliced in between (one vectored write, no copy of large reads).

use super::{Connection, C2H_CHUNK};
use crate::transport::slots::SlotState;
use nvmf_proto::pdu::{encode_pdu_header, C2HData};
use nvmf_proto::{digest, Digests, PduHeader};

/// Read data sent from a slot's buffer, `start..end`, once `out` has been written up to `at`.
#[derive(Debug, Clone, Copy)]
pub(super) struct DataSend {
    at: usize,
    slot: u16,
    start: usize,
    end: usize,
}

impl Connection {
    /// Bytes queued for the host and not yet written.
    pub fn output_len(&self) -> usize {
        self.out.len() - self.out_pos + self.send_bytes - self.send_pos
    }

    /// The queued output as slices in order, for one vectored write: fills `iov` from the start
    /// and returns how many it filled (fewer than the output holds when `iov` is short).
    pub fn output_slices<'a>(&'a self, iov: &mut [std::io::IoSlice<'a>]) -> usize {
        let mut n = 0;
        let mut pos = self.out_pos;
        let mut skip = self.send_pos;
        for d in &self.sends {
            let data = &self.slots[d.slot].buf.as_slice()[d.start + skip..d.end];
            for bytes in [&self.out[pos..d.at], data] {
                if n == iov.len() {
                    return n;
                }
                if !bytes.is_empty() {
                    iov[n] = std::io::IoSlice::new(bytes);
                    n += 1;
                }
            }
            pos = d.at;
            skip = 0;
        }
        if n < iov.len() && pos < self.out.len() {
            iov[n] = std::io::IoSlice::new(&self.out[pos..]);
            n += 1;
        }
        n
    }

    /// `n` bytes of the output were written. A slot whose data has all been written is free.
    pub fn consume_output(&mut self, mut n: usize) {
        if n > 0 {
            self.stall.progressed();
        }
        while n > 0 {
            let next_at = self.sends.front().map_or(self.out.len(), |d| d.at);
            if self.out_pos < next_at {
                let k = n.min(next_at - self.out_pos);
                self.out_pos += k;
                n -= k;
                continue;
            }
            let Some(d) = self.sends.front().copied() else { break };
            let k = n.min(d.end - d.start - self.send_pos);
            self.send_pos += k;
            n -= k;
            if self.send_pos == d.end - d.start {
                self.sends.pop_front();
                self.send_pos = 0;
                self.send_bytes -= d.end - d.start;
                // A slot's sends are queued back to back: it is written once the next is another's.
                if self.sends.front().is_none_or(|next| next.slot != d.slot) {
                    self.slots.free(d.slot);
                }
            }
        }
        if self.out_pos == self.out.len() && self.sends.is_empty() {
            self.out_high = self.out_high.max(self.out.len());
            self.out.clear();
            self.out_pos = 0;
        }
    }

    /// Takes everything queued for the host (tests).
    pub fn take_output(&mut self) -> Vec<u8> {
        let mut iov = vec![std::io::IoSlice::new(&[]); self.sends.len() * 2 + 1];
        let n = self.output_slices(&mut iov);
        let v: Vec<u8> = iov[..n].iter().flat_map(|s| s.iter().copied()).collect();
        self.consume_output(v.len());
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
            encode_pdu_header(&mut self.out, &hdr, chunk, self.digests);
            self.sends.push_back(DataSend { at: self.out.len(), slot: idx, start: datao, end: datao + chunk });
            self.send_bytes += chunk;
            if self.digests.data {
                let digest = digest::data_digest(&self.slots[idx].buf.as_slice()[datao..datao + chunk]);
                self.out.extend_from_slice(&digest.to_le_bytes());
            }
            datao += chunk;
        }
    }
}
