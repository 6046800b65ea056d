//! NVMe/TCP's hooks under the shared per-command lifecycle ([`DataPath`]): the host's data is
//! asked for by R2T, read data goes out as C2HData (copied, or spliced from the command buffer),
//! and a command is answered by a CapsuleResp PDU. All of it is encoded into the connection's
//! output queue, which the reactor writes to the socket.

use crate::command::{Commands, Work};
use crate::core::MQES;
use super::depth::DepthGauge;
use crate::transport::{At, DataPath, SlotState, Slots};
use nvmf_proto::pdu::{encode_pdu, encode_pdu_header, fes, C2HData, CapsuleResp, TermReq, R2T};
use nvmf_proto::spliced::SplicedOutput;
use nvmf_proto::{digest, Cqe, Digests, PduHeader, Status};

/// Output buffer capacity kept between bursts; more is given back after a tick without need.
/// Capacity above it counts against the process's buffer cap, and a connection may always
/// queue this much output, so none starves while others hold the memory.
pub(super) const OUT_KEEP: usize = 64 << 10;
/// Largest C2HData PDU we send.
const C2H_CHUNK: usize = 128 << 10;
/// Reads at least this large are written from their command buffer (vectored write); smaller
/// ones are copied into the output buffer, which was cheaper for 4 KiB (one contiguous write:
/// 753 K against 698 K IOPS at QD32), while 128 KiB gained 20-29 % from not copying.
const SEND_FROM_SLOT_MIN: u32 = 16 << 10;
/// The output queue's name for [`ZEROS`]: no command slot has this index (Connect refuses an
/// SQSIZE above MQES, and a queue has at most SQSIZE + 1 slots).
pub(super) const ZEROS_SLOT: u16 = u16::MAX;
const _: () = assert!((MQES as u32) + 1 < ZEROS_SLOT as u32, "a slot index could be ZEROS_SLOT");
/// The data of every null read under [`SEND_FROM_SLOT_MIN`], spliced into the output by
/// [`ZEROS_SLOT`] rather than written into it once per read.
pub(super) static ZEROS: [u8; SEND_FROM_SLOT_MIN as usize] = [0; SEND_FROM_SLOT_MIN as usize];
/// CapsuleResps held back behind the data queued with them ([`Wire::responses`]), at most half
/// the host's queue depth at a time ([`DepthGauge`]), within these bounds; this many before the
/// depth is known. SPDK's host reads its socket through a 32 KiB buffer and ends a poll at a PDU
/// that runs past its end: with each read's CapsuleResp right after its 4 KiB of data it
/// completed about 8 reads per poll, and sent the next 8 commands in one segment. With the
/// responses of a burst together after its data it completes them in one poll. Half the depth
/// keeps two groups in flight, so that host and target still work at the same time. At most 32:
/// groups of 64 at QD128 cost nvmf-perf, which takes everything the socket holds, a fifth of its
/// IOPS (bench/README.md, "Groups of at most 32").
pub const RESPONSE_GROUP: u32 = 16;
const RESPONSE_GROUP_BOUNDS: (u32, u32) = (8, 32);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    AwaitIcReq,
    Ready,
    /// A TermReq, or the response of a command that ended the queue, is queued; close once
    /// output drains.
    Closing,
    Closed,
}

/// The connection's wire state the hooks write to.
pub(super) struct Wire {
    pub phase: Phase,
    pub digests: Digests,
    /// Output, in order: encoded PDUs, with read data segments (still in their slots' buffers,
    /// written from there: no copy; a small null read's zeros from [`ZEROS`]) spliced in. The
    /// most bytes it held since the last tick (`take_high`) tells whether a buffer grown by a
    /// burst is still needed.
    pub out: SplicedOutput,
    /// R2Ts outstanding per command: what the host's ICReq allows, capped.
    pub maxr2t: u32,
    /// Bytes one R2T asks for: the MAXH2CDATA we advertise.
    pub maxh2cdata: u32,
    /// CapsuleResps encoded since the last write, written after everything in `out` (so after
    /// the data of the reads they complete, with which they were queued): each write is `out`
    /// followed by these. They join `out` once a group of them is held (`group`), or
    /// after a write the socket did not take whole, so that none waits behind data queued later.
    pub responses: Vec<u8>,
    /// How many CapsuleResps `responses` holds.
    held: u32,
    /// Read data was queued since the held responses were last released: a response only waits
    /// when data may follow it in the same write (a write's response goes straight to `out`).
    data_queued: bool,
    /// The host's queue depth, from the CIDs it uses.
    depth: DepthGauge,
    /// How many CapsuleResps are held back together: half the depth, within the bounds; set at
    /// each tick, when the depth may change.
    group: u32,
}

impl Wire {
    pub fn new(maxh2cdata: u32) -> Wire {
        Wire {
            phase: Phase::AwaitIcReq,
            digests: Digests::default(),
            out: SplicedOutput::with_capacity(OUT_KEEP, 0),
            maxr2t: 1,
            maxh2cdata,
            responses: Vec::with_capacity(RESPONSE_GROUP as usize * 32),
            held: 0,
            data_queued: false,
            depth: DepthGauge::new(),
            group: RESPONSE_GROUP,
        }
    }

    /// `n` bytes of the held responses were written. The rest (all of them, or what is left of
    /// a cut one) keeps its place: output queued from now on goes after it.
    pub fn responses_written(&mut self, n: usize) {
        self.responses.drain(..n);
        self.release_responses();
    }

    /// A capsule for command `cid` arrived (the depth gauge counts its CID).
    #[inline]
    pub fn saw_command(&mut self, cid: u16) {
        self.depth.saw(cid);
    }

    /// A tick ends the depth gauge's window; the group follows the depth it read.
    pub fn tick(&mut self) {
        self.depth.tick();
        self.group = match self.depth.depth() {
            0 => RESPONSE_GROUP,
            depth => (depth / 2).clamp(RESPONSE_GROUP_BOUNDS.0, RESPONSE_GROUP_BOUNDS.1),
        };
    }

    /// Moves the held CapsuleResps to the end of `out`: from now on they keep their place
    /// before anything queued later.
    pub fn release_responses(&mut self) {
        self.out.bytes_mut().extend_from_slice(&self.responses);
        self.responses.clear();
        self.held = 0;
        self.data_queued = false;
    }

    /// Queues a C2HTermReq; the connection closes once it is written.
    pub fn term_req(&mut self, cmd: &mut Commands, fes: u16, fei: u32, header: Vec<u8>) {
        self.release_responses();
        let hdr = PduHeader::C2HTermReq(TermReq { fes, fei, header });
        encode_pdu(self.out.bytes_mut(), &hdr, &[], self.digests);
        self.phase = Phase::Closing;
        cmd.release();
    }

    /// A CapsuleResp PDU completing command `cid`: held back behind the data queued since the
    /// last release, or straight into `out` when there is none.
    #[inline]
    pub fn respond_to(&mut self, cmd: &Commands, cid: u16, status: Status, result: u64) {
        let (sqid, sqhd) = cmd.sq_ids();
        let cqe = Cqe { result, sqhd, sqid, cid, status };
        let pdu = PduHeader::CapsuleResp(CapsuleResp { cqe });
        if !self.data_queued {
            // Nothing held (data_queued is set whenever something is) and no data to wait behind.
            encode_pdu(self.out.bytes_mut(), &pdu, &[], self.digests);
            return;
        }
        encode_pdu(&mut self.responses, &pdu, &[], self.digests);
        self.held += 1;
        if self.held >= self.group {
            self.release_responses();
        }
    }

    /// Issues R2Ts, one per MAXH2CDATA-sized chunk, keeping at most MAXR2T outstanding.
    pub fn send_r2ts(&mut self, slots: &mut Slots, idx: u16) {
        let chunk = self.maxh2cdata;
        let slot = &mut slots[idx];
        let done_chunks = slot.received - slot.received % chunk;
        while slot.r2t_upto < slot.len && (slot.r2t_upto - done_chunks) / chunk < self.maxr2t {
            let r2tl = chunk.min(slot.len - slot.r2t_upto);
            let r2t = R2T { cccid: slot.cid, ttag: idx, r2to: slot.r2t_upto, r2tl };
            encode_pdu(self.out.bytes_mut(), &PduHeader::R2T(r2t), &[], self.digests);
            slot.r2t_upto += r2tl;
        }
    }

    /// C2HData PDUs carrying a copy of `data` (admin and authentication replies, reads under 16
    /// KiB). `zeros` says `data` is known to be all zeros (a null read): [`ZEROS`] is then
    /// spliced in, and nothing is copied. With `success` the last PDU also completes the
    /// command; otherwise the caller sends the response.
    fn send_copied(&mut self, cid: u16, data: &[u8], zeros: bool, success: bool) {
        self.data_queued = true;
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
            encode_pdu_header(self.out.bytes_mut(), &hdr, chunk.len(), self.digests);
            if zeros && chunk.len() <= ZEROS.len() {
                self.out.splice(ZEROS_SLOT, 0..chunk.len());
            } else {
                self.out.bytes_mut().extend_from_slice(chunk);
            }
            if self.digests.data {
                self.out.bytes_mut().extend_from_slice(&digest::data_digest(chunk).to_le_bytes());
            }
            datao += chunk.len();
        }
    }

    /// C2HData PDUs carrying slot `idx`'s buffer, sent from the buffer itself (the slot stays
    /// Sending until it is written: the connection frees it then). With `success` the last one
    /// also completes the command; otherwise the caller sends the response.
    fn send_slot_data(&mut self, slots: &mut Slots, idx: u16, success: bool) {
        self.data_queued = true;
        let slot = &mut slots[idx];
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
                let digest = digest::data_digest(&slots[idx].buf.as_slice()[datao..datao + chunk]);
                self.out.bytes_mut().extend_from_slice(&digest.to_le_bytes());
            }
            datao += chunk;
        }
    }
}

impl DataPath for Wire {
    const SLOT_PER_COMMAND: bool = false;

    #[inline]
    fn serving(&self) -> bool {
        matches!(self.phase, Phase::AwaitIcReq | Phase::Ready)
    }

    #[inline]
    fn fetch_data(&mut self, slots: &mut Slots, idx: u16) -> Result<(), Status> {
        self.send_r2ts(slots, idx);
        Ok(())
    }

    /// Read data as C2HData; with SQ flow control disabled the last PDU completes the command.
    #[inline]
    fn send_data(&mut self, cmd: &Commands, slots: &mut Slots, idx: u16, len: u32) -> bool {
        let success = cmd.queue().is_some_and(|q| q.sqflow_disabled);
        if len >= SEND_FROM_SLOT_MIN {
            self.send_slot_data(slots, idx, success);
        } else {
            let buf = &slots[idx].buf;
            let zeros = buf.known_zero() == buf.len();
            self.send_copied(slots[idx].cid, buf.as_slice(), zeros, success);
        }
        success
    }

    fn send_copy(&mut self, _cmd: &Commands, cid: u16, data: &[u8]) {
        self.send_copied(cid, data, false, false);
    }

    #[inline]
    fn respond(&mut self, cmd: &Commands, _slots: &mut Slots, at: At, status: Status, result: u64) {
        self.respond_to(cmd, at.cid, status, result);
    }

    fn no_slot(&mut self, cmd: &mut Commands, cid: u16, work: Work) {
        match work {
            // More commands outstanding than the queue has entries: the host broke SQSIZE.
            Work::Io(_) => self.term_req(cmd, fes::PDU_SEQ_ERR, 0, Vec::new()),
            // Before Connect there is one slot: a second Connect while the first awaits data.
            _ => self.respond_to(cmd, cid, Status::CMD_SEQ_ERROR.with_dnr(), 0),
        }
    }

    fn connected(&mut self, cmd: &mut Commands) {
        if let Some(q) = cmd.queue() {
            let (cntlid, qid, sqsize, hdgst, ddgst) = (q.ctrl.cntlid, q.qid, q.sqsize, self.digests.header, self.digests.data);
            let (subnqn, hostnqn) = (&q.stats.subnqn, &q.stats.hostnqn);
            tracing::info!(cntlid, qid, sqsize, hdgst, ddgst, %subnqn, %hostnqn, "queue connected");
        }
    }

    fn ending(&mut self) {
        self.phase = Phase::Closing;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::IoSlice;

    /// What `wire` queued, with [`ZEROS_SLOT`] read from [`ZEROS`] (as the connection does); and
    /// how many of those bytes were written into the queue's own buffer.
    fn queued(wire: &Wire) -> (Vec<u8>, usize) {
        let mut iov = [IoSlice::new(&[]); 8];
        let n = wire.out.slices(&mut iov, |slot| {
            assert_eq!(slot, ZEROS_SLOT, "only the zeros are spliced here");
            &ZEROS[..]
        });
        (iov[..n].iter().flat_map(|s| s.iter().copied()).collect(), wire.out.buffered())
    }

    #[test]
    fn a_null_reads_zeros_are_spliced_not_written_and_keep_their_digest() {
        for data_digest in [false, true] {
            let mut wire = Wire::new(128 << 10);
            wire.digests = Digests { header: false, data: data_digest };
            let digest_len = if data_digest { 4 } else { 0 };
            wire.send_copied(7, &[0; 4096], true, false);
            let (zeros_sent, written) = queued(&wire);
            assert_eq!(written, 24 + digest_len, "only the header (and digest) written, not the data");
            assert_eq!(zeros_sent.len(), 24 + 4096 + digest_len);
            assert!(zeros_sent[24..24 + 4096].iter().all(|&b| b == 0));
            if data_digest {
                assert_eq!(zeros_sent[24 + 4096..], digest::data_digest(&[0; 4096]).to_le_bytes());
            }
            // The same read with its data copied puts the same bytes on the wire.
            let mut copied = Wire::new(128 << 10);
            copied.digests = wire.digests;
            copied.send_copied(7, &[0; 4096], false, false);
            let (copied_sent, written) = queued(&copied);
            assert_eq!(written, copied_sent.len());
            assert_eq!(copied_sent, zeros_sent);
        }
    }
}
