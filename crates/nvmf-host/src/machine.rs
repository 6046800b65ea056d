//! The NVMe/TCP protocol machine of one host queue pair, sans-I/O: bytes in, bytes out, no
//! socket. [`crate::QueuePair`] moves its bytes over a [`crate::Link`]; tests and the fuzzer
//! feed it directly.
//!
//! It holds the command slots (indexed by CID) and their data buffers, and speaks the wire:
//! ICReq/ICResp, capsules, CapsuleResp, C2HData (with the SUCCESS optimisation), R2T answered
//! with H2CData, TermReq. The layer that moves bytes asks it two things:
//! - where the next received bytes go ([`QueueMachine::input_slices`]): the receive buffer, or,
//!   once a large C2HData header is parsed, the rest of its payload in the slot's buffer, so
//!   the payload lands where the command wants it without a staging copy (its data digest is
//!   then computed over the slot's buffer);
//! - which buffers make up the next send ([`QueueMachine::output_slices`]): PDU headers and
//!   digests from the send buffer, large write payloads (H2CData, in-capsule data) straight
//!   from the slot's buffer.
//!
//! On the data path nothing allocates: slots and buffers are made once, PDU headers go into a
//! reused send buffer, completions into the caller's vector.
//!
//! Over 600 lines with its tests, and one module on purpose: about 550 lines of code, one state
//! machine whose receive half (landing, C2HData, R2T) and send half (capsules, H2CData) share
//! the slots and the framing; the rest is its property tests, which drive both halves at once.

use std::io::IoSlice;

use nvmf_proto::pdu::{encode_pdu, encode_pdu_header, C2HData, CapsuleCmd, H2CData, IcReq, TermReq, PFV_1_0, R2T};
use nvmf_proto::spliced::SplicedOutput;
use nvmf_proto::{digest, Cqe, Digests, FrameHeader, Framer, PduHeader, Role, SglDescriptor, Sqe, Status};

use crate::command::{command_name, Completion, Xfer};
use crate::error::{fes_name, Error, Result};
use crate::queue_transport::ProtocolMachine;

/// C2HData payloads of at least this many bytes are received straight into the slot's buffer;
/// smaller ones are copied from the receive buffer, where one large read(2) carries many PDUs.
/// Landing a payload directly needs the receive buffer's reads kept short while such reads are
/// in flight, which costs system calls: measured on loopback (nvmf-perf against nvmf-target,
/// ram backend, event mode, QD32, 2-core VM, 5 interleaved rounds; host CPU per I/O, copying
/// against landing every payload), landing cost 2.8x at 4 KiB and 1.29x at 16 KiB, broke even
/// at 64 KiB (1.00x) and saved 6 % at 128 KiB.
pub const DIRECT_RECV_MIN: usize = 64 << 10;
/// H2CData and in-capsule payloads of at least this many bytes are sent from the slot's buffer
/// (one writev(2) with the headers around them); smaller ones are copied into the send buffer.
/// Measured as above, sending from the slot saved host CPU at every size tried: 11 % at 4 KiB,
/// 5 % at 16 KiB, 23 % at 64 KiB.
pub const DIRECT_SEND_MIN: usize = 4 << 10;
/// While a large read is in flight, the receive buffer takes at most this much per read, so
/// that the payloads behind the next header are left in the socket for their own slots.
const RX_READ_WHILE_LANDING: usize = 4096;
/// Smallest receive buffer (it must hold any PDU that is not landed directly).
const RX_MIN: usize = 256 << 10;

#[derive(Debug)]
struct Slot {
    buf: Vec<u8>,
    active: bool,
    /// The command as submitted, kept to resubmit it on a new connection after a reconnect.
    sqe: Sqe,
    xfer: Xfer,
    /// C2HData bytes received so far.
    received: usize,
    /// Set when a received C2HData failed its data digest.
    digest_error: bool,
}

/// A C2HData payload being received into its slot's buffer.
#[derive(Debug, Clone, Copy)]
struct Landing {
    hdr: C2HData,
    /// The payload's range in the slot's buffer; bytes before `at` have arrived.
    start: usize,
    at: usize,
    end: usize,
    /// A data digest follows the payload (it arrives in the receive buffer).
    digest: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// ICReq queued, ICResp not yet received.
    Initializing,
    Ready,
}

/// The protocol machine of one queue pair.
pub struct QueueMachine {
    qid: u16,
    phase: Phase,
    slots: Vec<Slot>,
    /// Largest write carried in the capsule (admin: 8 KiB as Linux sends; I/O: from IOCCSZ).
    in_capsule_max: usize,
    /// Digests asked for in ICReq; `framer.digests` holds the negotiated ones.
    wanted: Digests,
    framer: Framer,
    /// Largest H2CData payload the controller accepts (from ICResp).
    maxh2cdata: u32,
    rx: Vec<u8>,
    rx_start: usize,
    rx_end: usize,
    landing: Option<Landing>,
    /// Reads of at least [`DIRECT_RECV_MIN`] bytes in flight: while any is, receive reads are short.
    large_reads: usize,
    /// PDU bytes to send (headers, digests, small payloads), with large payloads spliced in
    /// from their slots' buffers (by tag).
    out: SplicedOutput,
}

impl QueueMachine {
    /// A queue pair `qid` with `depth` slots of `buf_len`-byte buffers, its ICReq (asking for
    /// `digests`) queued for sending.
    pub fn new(qid: u16, depth: usize, buf_len: usize, in_capsule_max: usize, digests: Digests) -> QueueMachine {
        let slots = (0..depth)
            .map(|_| Slot { buf: vec![0; buf_len], active: false, sqe: Sqe::new(0, 0), xfer: Xfer::None, received: 0, digest_error: false })
            .collect();
        let framer = Framer::new(Role::Host, buf_len.max(4096) as u32);
        let mut m = QueueMachine {
            qid,
            phase: Phase::Initializing,
            slots,
            in_capsule_max,
            wanted: digests,
            framer,
            maxh2cdata: 0,
            rx: vec![0; (2 * framer.max_pdu_len()).max(RX_MIN)],
            rx_start: 0,
            rx_end: 0,
            landing: None,
            large_reads: 0,
            out: SplicedOutput::with_capacity(64 << 10, 2 * depth),
        };
        let req = IcReq { pfv: PFV_1_0, hpda: 0, hdgst: digests.header, ddgst: digests.data, maxr2t: 0 };
        encode_pdu(m.out.bytes_mut(), &PduHeader::IcReq(req), &[], Digests::default());
        m
    }

    /// ICResp arrived and was accepted: commands may be submitted.
    pub fn is_ready(&self) -> bool {
        self.phase == Phase::Ready
    }

    pub fn digests(&self) -> Digests {
        self.framer.digests
    }

    pub fn maxh2cdata(&self) -> u32 {
        self.maxh2cdata
    }

    /// The data buffer of `tag`: fill it before a write, read it after a read completes.
    pub fn buffer(&mut self, tag: u16) -> &mut [u8] {
        &mut self.slots[tag as usize].buf
    }

    /// Grows `tag`'s buffer (admin commands with large data; never on the data path). Buffers
    /// only grow, so a pending send from one stays within it.
    pub fn ensure_buffer(&mut self, tag: u16, len: usize) {
        let b = &mut self.slots[tag as usize].buf;
        if b.len() < len {
            b.resize(len, 0);
        }
    }

    // ---- commands ----

    /// Queues a command with CID `tag` for sending.
    pub fn submit(&mut self, tag: u16, mut sqe: Sqe, xfer: Xfer) -> Result<()> {
        if self.phase != Phase::Ready {
            return Err(Error::Unsupported("a command before the connection was initialized".into()));
        }
        let slot = self.slots.get_mut(tag as usize).ok_or_else(|| Error::Unsupported(format!("tag {tag} beyond queue depth")))?;
        if slot.active {
            return Err(Error::Unsupported(format!("tag {tag} is already in flight")));
        }
        let len = match xfer {
            Xfer::None => 0,
            Xfer::Read(n) | Xfer::Write(n) | Xfer::WriteInCapsule(n) => n,
        };
        if len > slot.buf.len() {
            return Err(Error::Unsupported(format!("{len}-byte transfer exceeds the {}-byte buffer", slot.buf.len())));
        }
        let in_capsule = match xfer {
            Xfer::WriteInCapsule(_) => true,
            Xfer::Write(n) => n <= self.in_capsule_max,
            _ => false,
        };
        sqe.set_cid(tag);
        sqe.set_sgl(if in_capsule { SglDescriptor::in_capsule(0, len as u32) } else { SglDescriptor::transport(len as u32) });
        *slot = Slot { buf: std::mem::take(&mut slot.buf), active: true, sqe, xfer, received: 0, digest_error: false };
        if matches!(xfer, Xfer::Read(n) if n >= DIRECT_RECV_MIN) {
            self.large_reads += 1;
        }
        let data_len = if in_capsule { len } else { 0 };
        encode_pdu_header(self.out.bytes_mut(), &PduHeader::CapsuleCmd(CapsuleCmd { sqe }), data_len, self.framer.digests);
        self.queue_payload(tag, 0, data_len);
        Ok(())
    }

    /// Queues `tag`'s bytes `start..start + len` as a PDU's payload (after the header just
    /// encoded), then its data digest: from the slot when large, else copied.
    fn queue_payload(&mut self, tag: u16, start: usize, len: usize) {
        if len == 0 {
            return;
        }
        let data = &self.slots[tag as usize].buf[start..start + len];
        if len >= DIRECT_SEND_MIN {
            self.out.splice(tag, start..start + len);
        } else {
            self.out.bytes_mut().extend_from_slice(data);
        }
        if self.framer.digests.data {
            self.out.bytes_mut().extend_from_slice(&digest::data_digest(data).to_le_bytes());
        }
    }

    /// Takes over `fresh`'s connection (a new one, initialized and joined to the controller)
    /// and queues again every command that was in flight here, from its kept SQE and buffer: a
    /// write may then run twice, which rewrites the same data. Returns how many.
    pub fn resubmit_on(&mut self, fresh: QueueMachine, in_capsule_max: usize) -> Result<usize> {
        let QueueMachine { phase, framer, maxh2cdata, rx, rx_start, rx_end, landing, out, .. } = fresh;
        if landing.is_some() || !out.is_empty() {
            return Err(Error::Unsupported("resubmitting onto a connection that is still busy".into()));
        }
        (self.phase, self.framer, self.maxh2cdata) = (phase, framer, maxh2cdata);
        (self.rx, self.rx_start, self.rx_end) = (rx, rx_start, rx_end);
        self.landing = None;
        self.large_reads = 0;
        self.out.clear();
        self.in_capsule_max = in_capsule_max;
        let mut n = 0;
        for tag in 0..self.slots.len() {
            let slot = &mut self.slots[tag];
            if slot.active {
                slot.active = false;
                let (sqe, xfer) = (slot.sqe, slot.xfer);
                self.submit(tag as u16, sqe, xfer)?;
                n += 1;
            }
        }
        Ok(n)
    }

    fn complete(&mut self, tag: u16, result: Result<u64>, done: &mut Vec<Completion>) {
        let slot = &mut self.slots[tag as usize];
        slot.active = false;
        if matches!(slot.xfer, Xfer::Read(n) if n >= DIRECT_RECV_MIN) {
            self.large_reads -= 1;
        }
        done.push(Completion { tag, result });
    }

    // ---- output ----

    /// Bytes are waiting to be sent.
    pub fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    /// Fills `iov` with the next bytes to send, in order; returns how many slices it used.
    pub fn output_slices<'a>(&'a self, iov: &mut [IoSlice<'a>]) -> usize {
        self.out.slices(iov, |tag| &self.slots[tag as usize].buf)
    }

    /// `n` bytes of the output were sent.
    pub fn consume_output(&mut self, n: usize) {
        // A slot's buffer is reused only by a later command, after its response: nothing to free.
        self.out.consume(n, |_| {});
    }

    /// Replaces whatever was to be sent with an H2CTermReq (the connection then ends).
    fn terminate(&mut self, fes: u16, fei: u32, header: Vec<u8>) {
        self.out.clear();
        let t = TermReq { fes, fei, header };
        encode_pdu(self.out.bytes_mut(), &PduHeader::H2CTermReq(t), &[], Digests::default());
    }

    // ---- input ----

    /// Where the next received bytes go, in order: the rest of the payload being landed in a
    /// slot (empty when none), then the receive buffer's free space.
    pub fn input_slices(&mut self) -> [&mut [u8]; 2] {
        if self.rx_start == self.rx_end {
            self.rx_start = 0;
            self.rx_end = 0;
        } else if self.rx.len() - self.rx_end < RX_READ_WHILE_LANDING {
            self.rx.copy_within(self.rx_start..self.rx_end, 0);
            self.rx_end -= self.rx_start;
            self.rx_start = 0;
        }
        let free = if self.large_reads > 0 { RX_READ_WHILE_LANDING } else { self.rx.len() };
        let rx_end = (self.rx_end + free).min(self.rx.len());
        let rx = &mut self.rx[self.rx_end..rx_end];
        match self.landing {
            Some(l) => [&mut self.slots[l.hdr.cccid as usize].buf[l.at..l.end], rx],
            None => [&mut [][..], rx],
        }
    }

    /// `n` bytes were received into the slices [`QueueMachine::input_slices`] gave.
    pub fn received(&mut self, mut n: usize) {
        if let Some(l) = &mut self.landing {
            let k = n.min(l.end - l.at);
            l.at += k;
            n -= k;
        }
        self.rx_end += n;
    }

    /// Whether a read of at least [`DIRECT_RECV_MIN`] bytes is in flight: its payload streams in.
    pub fn expects_large_input(&self) -> bool {
        self.large_reads > 0
    }

    /// Test and fuzzing convenience: receives `bytes` as the link would, in the slices asked for.
    /// Returns how many were taken (less when the receive buffer is full).
    pub fn feed(&mut self, bytes: &[u8]) -> usize {
        let mut taken = 0;
        while taken < bytes.len() {
            let [a, b] = self.input_slices();
            let k = if !a.is_empty() { a.len() } else { b.len() }.min(bytes.len() - taken);
            if k == 0 {
                break;
            }
            let dst = if !a.is_empty() { a } else { b };
            dst[..k].copy_from_slice(&bytes[taken..taken + k]);
            self.received(k);
            taken += k;
        }
        taken
    }

    /// Handles every PDU that has arrived whole (or, for a large C2HData, whose header has),
    /// pushing finished commands into `done`. A protocol error ends the connection: an
    /// H2CTermReq is queued when the target broke the framing, and the error is returned.
    pub fn process(&mut self, done: &mut Vec<Completion>) -> Result<()> {
        loop {
            if let Some(l) = self.landing {
                if !self.finish_landing(l, done)? {
                    return Ok(());
                }
                continue;
            }
            let buf = &self.rx[self.rx_start..self.rx_end];
            let h = match self.framer.next_header(buf) {
                Ok(None) => return Ok(()),
                Ok(Some(h)) => h,
                Err(fatal) => {
                    let header = buf[..fatal.hlen.min(buf.len())].to_vec();
                    self.terminate(fatal.fes, fatal.fei, header);
                    return Err(Error::Protocol(format!("{} in a PDU from the target (FEI {})", fes_name(fatal.fes), fatal.fei)));
                }
            };
            if let PduHeader::C2HData(d) = h.header {
                if h.data.len() >= DIRECT_RECV_MIN {
                    self.start_landing(d, &h)?;
                    continue;
                }
            }
            if buf.len() < h.len {
                return Ok(());
            }
            let digest_ok = data_digest_ok(&buf[..h.len], &h);
            self.handle(&h, digest_ok, done)?;
            self.rx_start += h.len;
        }
    }

    /// A whole PDU at `rx_start` (C2HData payload at `h.data` from there).
    fn handle(&mut self, h: &FrameHeader, digest_ok: bool, done: &mut Vec<Completion>) -> Result<()> {
        match &h.header {
            PduHeader::IcResp(resp) if self.phase == Phase::Initializing => {
                if resp.pfv != PFV_1_0 {
                    return Err(Error::Protocol(format!("ICResp PFV {} is not 0 (NVMe/TCP 1.0)", resp.pfv)));
                }
                if resp.maxh2cdata < 4096 || resp.maxh2cdata % 4 != 0 {
                    return Err(Error::Protocol(format!("ICResp MAXH2CDATA {} is under 4096 or not a multiple of 4", resp.maxh2cdata)));
                }
                if resp.hdgst != self.wanted.header || resp.ddgst != self.wanted.data {
                    return Err(Error::Protocol(format!(
                        "digests asked header={} data={}, target answered header={} data={}",
                        self.wanted.header, self.wanted.data, resp.hdgst, resp.ddgst
                    )));
                }
                self.framer.digests = self.wanted;
                self.maxh2cdata = resp.maxh2cdata;
                self.phase = Phase::Ready;
            }
            PduHeader::C2HTermReq(t) => return Err(Error::TermReq { fes: t.fes, fei: t.fei, reason: fes_name(t.fes) }),
            other if self.phase == Phase::Initializing => {
                return Err(Error::Protocol(format!("expected ICResp, got {:?}", other.pdu_type())));
            }
            PduHeader::CapsuleResp(r) => {
                let slot = active_slot(&mut self.slots, r.cqe.cid, "CapsuleResp")?;
                let result = slot_result(slot, &r.cqe, self.qid);
                self.complete(r.cqe.cid, result, done);
            }
            PduHeader::C2HData(d) => {
                let start = self.c2h_range(d, h.data.len())?;
                let at = self.rx_start + h.data.start;
                let slot = &mut self.slots[d.cccid as usize];
                slot.buf[start..start + h.data.len()].copy_from_slice(&self.rx[at..at + h.data.len()]);
                self.c2h_landed(d, digest_ok, done)?;
            }
            PduHeader::R2T(r) => self.answer_r2t(r)?,
            other => return Err(Error::Protocol(format!("unexpected {:?} PDU on an established queue", other.pdu_type()))),
        }
        Ok(())
    }

    /// Checks a C2HData header against its command; returns where its payload goes.
    fn c2h_range(&mut self, d: &C2HData, data_len: usize) -> Result<usize> {
        if self.phase != Phase::Ready {
            return Err(Error::Protocol("expected ICResp, got C2HData".into()));
        }
        let slot = active_slot(&mut self.slots, d.cccid, "C2HData")?;
        let Xfer::Read(len) = slot.xfer else {
            return Err(Error::Protocol(format!("C2HData for CID {} which reads nothing", d.cccid)));
        };
        let (off, dl) = (d.datao as usize, d.datal as usize);
        if off != slot.received || off + dl > len || dl != data_len {
            return Err(Error::Protocol(format!(
                "C2HData for CID {}: DATAO {off} DATAL {dl}, expected offset {} within {len} bytes",
                d.cccid, slot.received
            )));
        }
        Ok(off)
    }

    /// A C2HData payload is in its slot: account for it; SUCCESS completes the command.
    fn c2h_landed(&mut self, d: &C2HData, digest_ok: bool, done: &mut Vec<Completion>) -> Result<()> {
        let slot = &mut self.slots[d.cccid as usize];
        let Xfer::Read(len) = slot.xfer else { unreachable!("c2h_range checked the slot reads") };
        slot.received += d.datal as usize;
        slot.digest_error |= !digest_ok;
        if d.success {
            if !d.last || slot.received != len {
                return Err(Error::Protocol(format!(
                    "C2HData SUCCESS for CID {} before all {len} bytes arrived (LAST_PDU {})",
                    d.cccid, d.last
                )));
            }
            // SUCCESS: the command completed and no CapsuleResp follows.
            let result = if slot.digest_error { Err(digest_error(d.cccid)) } else { Ok(0) };
            self.complete(d.cccid, result, done);
        }
        Ok(())
    }

    /// A large C2HData's header is at `rx_start`: copy what of its payload already arrived and
    /// let the rest land in the slot.
    fn start_landing(&mut self, d: C2HData, h: &FrameHeader) -> Result<()> {
        let start = self.c2h_range(&d, h.data.len())?;
        let end = start + h.data.len();
        let here = self.rx_start + h.data.start;
        let have = (self.rx_end - here).min(h.data.len());
        self.slots[d.cccid as usize].buf[start..start + have].copy_from_slice(&self.rx[here..here + have]);
        self.rx_start = here + have;
        self.landing = Some(Landing { hdr: d, start, at: start + have, end, digest: h.data_digest });
        Ok(())
    }

    /// The landing payload is complete (and its digest here, if any): check and account for
    /// it. False while bytes are still missing.
    fn finish_landing(&mut self, l: Landing, done: &mut Vec<Completion>) -> Result<bool> {
        if l.at < l.end {
            return Ok(false);
        }
        let mut digest_ok = true;
        if l.digest {
            let Some(got) = self.rx.get(self.rx_start..self.rx_end).and_then(|b| b.first_chunk::<4>()) else { return Ok(false) };
            let got = u32::from_le_bytes(*got);
            self.rx_start += 4;
            digest_ok = digest::data_digest(&self.slots[l.hdr.cccid as usize].buf[l.start..l.end]) == got;
        }
        self.landing = None;
        self.c2h_landed(&l.hdr, digest_ok, done)?;
        Ok(true)
    }

    /// Answers an R2T with H2CData PDUs of at most MAXH2CDATA bytes each.
    fn answer_r2t(&mut self, r: &R2T) -> Result<()> {
        let slot = active_slot(&mut self.slots, r.cccid, "R2T")?;
        let len = match slot.xfer {
            Xfer::Write(n) => n,
            _ => return Err(Error::Protocol(format!("R2T for CID {} which writes nothing", r.cccid))),
        };
        let (off, rl) = (r.r2to as usize, r.r2tl as usize);
        if rl == 0 || off.checked_add(rl).is_none_or(|end| end > len) {
            return Err(Error::Protocol(format!("R2T for CID {}: R2TO {off} R2TL {rl} outside the {len}-byte write", r.cccid)));
        }
        let chunk_max = self.maxh2cdata as usize;
        let mut pos = off;
        while pos < off + rl {
            let n = chunk_max.min(off + rl - pos);
            let hdr = H2CData { cccid: r.cccid, ttag: r.ttag, datao: pos as u32, datal: n as u32, last: pos + n == off + rl };
            encode_pdu_header(self.out.bytes_mut(), &PduHeader::H2CData(hdr), n, self.framer.digests);
            self.queue_payload(r.cccid, pos, n);
            pos += n;
        }
        Ok(())
    }
}

impl ProtocolMachine for QueueMachine {
    fn qid(&self) -> u16 {
        self.qid
    }

    fn depth(&self) -> usize {
        self.slots.len()
    }

    fn in_capsule_max(&self) -> usize {
        self.in_capsule_max
    }
}

/// The data digest of a whole PDU in `pdu` is right (or absent).
fn data_digest_ok(pdu: &[u8], h: &FrameHeader) -> bool {
    if !h.data_digest {
        return true;
    }
    let got = u32::from_le_bytes(pdu[h.data.end..h.data.end + 4].try_into().expect("4 bytes"));
    digest::data_digest(&pdu[h.data.clone()]) == got
}

fn active_slot<'a>(slots: &'a mut [Slot], cid: u16, what: &str) -> Result<&'a mut Slot> {
    match slots.get_mut(cid as usize) {
        Some(s) if s.active => Ok(s),
        _ => Err(Error::Protocol(format!("{what} for CID {cid}, which has no command in flight"))),
    }
}

fn digest_error(cid: u16) -> Error {
    Error::Protocol(format!("data digest mismatch in C2HData for CID {cid}"))
}

fn slot_result(slot: &Slot, cqe: &Cqe, qid: u16) -> Result<u64> {
    let name = || command_name(slot.sqe.opcode(), slot.sqe.fctype(), qid);
    if !cqe.status.is_success() {
        return Err(Error::Status { command: name(), status: cqe.status });
    }
    if slot.digest_error {
        return Err(digest_error(cqe.cid));
    }
    if let Xfer::Read(len) = slot.xfer {
        if slot.received != len {
            // A successful CapsuleResp for a read that did not deliver all its data.
            return Err(Error::Status { command: name(), status: Status::DATA_TRANSFER_ERROR });
        }
    }
    Ok(cqe.result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvmf_proto::nvme::io_opcode;
    use nvmf_proto::nvme::Status;
    use nvmf_proto::pdu::{CapsuleResp, IcResp};
    use nvmf_proto::Frame;
    use proptest::prelude::*;

    const BUF: usize = 256 << 10;
    const WRITE_TAG: u16 = 5;
    const CAPSULE_TAG: u16 = 4;

    fn pattern(tag: u16, i: usize) -> u8 {
        (i as u8).wrapping_mul(31) ^ (i >> 8) as u8 ^ (tag as u8).wrapping_mul(101)
    }

    fn ready_machine(dg: Digests, in_capsule_max: usize, maxh2cdata: u32) -> QueueMachine {
        let mut m = QueueMachine::new(1, 6, BUF, in_capsule_max, dg);
        take_output(&mut m);
        let mut icresp = Vec::new();
        let resp = IcResp { pfv: 0, cpda: 0, hdgst: dg.header, ddgst: dg.data, maxh2cdata };
        encode_pdu(&mut icresp, &PduHeader::IcResp(resp), &[], Digests::default());
        assert_eq!(m.feed(&icresp), icresp.len());
        m.process(&mut Vec::new()).unwrap();
        assert!(m.is_ready());
        m
    }

    /// Everything the machine has to send, as the link would take it (in small writes).
    fn take_output(m: &mut QueueMachine) -> Vec<u8> {
        let mut out = Vec::new();
        while m.has_output() {
            let mut iov = [IoSlice::new(&[]); 3];
            let n = m.output_slices(&mut iov);
            let chunk: Vec<u8> = iov[..n].iter().flat_map(|s| s.iter().copied()).take(5000).collect();
            m.consume_output(chunk.len());
            out.extend_from_slice(&chunk);
        }
        out
    }

    /// The host's PDUs, as a target's framer reads them.
    fn frames(bytes: &[u8], dg: Digests) -> Vec<(Frame, Vec<u8>)> {
        let framer = Framer { role: Role::Target, digests: dg, max_data_len: BUF as u32 };
        let mut at = 0;
        let mut v = Vec::new();
        while at < bytes.len() {
            let f = framer.next(&bytes[at..]).unwrap().expect("whole PDUs only");
            let data = bytes[at + f.data.start..at + f.data.end].to_vec();
            at += f.len;
            v.push((f, data));
        }
        v
    }

    /// Feeds `stream` in fragments of the given sizes (cycled), processing after each.
    fn feed_fragments(m: &mut QueueMachine, stream: &[u8], sizes: &[usize], done: &mut Vec<Completion>) -> Result<()> {
        let mut pos = 0;
        let mut step = Vec::new();
        let mut stalled = 0;
        for &size in sizes.iter().cycle() {
            if pos == stream.len() {
                break;
            }
            let end = (pos + size).min(stream.len());
            let taken = m.feed(&stream[pos..end]);
            stalled = if taken == 0 { stalled + 1 } else { 0 };
            assert!(stalled < 3, "the machine takes no more input and processes none");
            pos += taken;
            m.process(&mut step)?;
            done.append(&mut step);
        }
        Ok(())
    }

    struct Read {
        tag: u16,
        len: usize,
        chunk: usize,
        success: bool,
    }

    /// The target's side: C2HData for each read (pattern data), an R2T for the write on
    /// WRITE_TAG, responses for everything else.
    fn target_stream(reads: &[Read], dg: Digests, write_len: usize) -> (Vec<u8>, Vec<std::ops::Range<usize>>) {
        let mut out = Vec::new();
        let mut payloads = Vec::new();
        let resp = |out: &mut Vec<u8>, cid| {
            let cqe = Cqe { cid, status: Status::SUCCESS, ..Default::default() };
            encode_pdu(out, &PduHeader::CapsuleResp(CapsuleResp { cqe }), &[], dg);
        };
        if write_len > 0 {
            let r2t = R2T { cccid: WRITE_TAG, ttag: 7, r2to: 0, r2tl: write_len as u32 };
            encode_pdu(&mut out, &PduHeader::R2T(r2t), &[], dg);
        }
        for r in reads {
            let mut off = 0;
            while off < r.len {
                let n = r.chunk.min(r.len - off);
                let last = off + n == r.len;
                let data: Vec<u8> = (off..off + n).map(|i| pattern(r.tag, i)).collect();
                let hdr = C2HData { cccid: r.tag, datao: off as u32, datal: n as u32, last, success: last && r.success };
                encode_pdu_header(&mut out, &PduHeader::C2HData(hdr), n, dg);
                payloads.push(out.len()..out.len() + n);
                out.extend_from_slice(&data);
                if dg.data {
                    out.extend_from_slice(&digest::data_digest(&data).to_le_bytes());
                }
                off += n;
            }
            if !r.success {
                resp(&mut out, r.tag);
            }
        }
        if write_len > 0 {
            resp(&mut out, WRITE_TAG);
            resp(&mut out, CAPSULE_TAG);
        }
        (out, payloads)
    }

    fn read_strategy() -> impl Strategy<Value = (usize, usize, bool)> {
        let len = prop_oneof![Just(512usize), Just(4096), Just(DIRECT_RECV_MIN), 1usize..=BUF / 512, Just(BUF)];
        (len, prop_oneof![Just(usize::MAX), 512usize..=140_000], any::<bool>()).prop_map(|(l, c, s)| {
            let len = if l <= BUF / 512 { l * 512 } else { l };
            (len, c.max(1), s)
        })
    }

    fn run_case(
        hdgst: bool,
        ddgst: bool,
        reads: Vec<(usize, usize, bool)>,
        sizes: Vec<usize>,
        corrupt: Option<(usize, usize)>,
    ) -> std::result::Result<(), TestCaseError> {
        let dg = Digests { header: hdgst, data: ddgst };
        let maxh2cdata = 32 << 10;
        let mut m = ready_machine(dg, 24 << 10, maxh2cdata);
        let reads: Vec<Read> = reads.iter().enumerate().map(|(i, &(len, chunk, success))| Read { tag: i as u16, len, chunk, success }).collect();
        for r in &reads {
            for (i, b) in m.buffer(r.tag)[..r.len].iter_mut().enumerate() {
                *b = !pattern(r.tag, i);
            }
            m.submit(r.tag, Sqe::new(io_opcode::READ, 0), Xfer::Read(r.len)).unwrap();
        }
        let (write_len, capsule_len) = (100_000, 20_000);
        for (tag, len) in [(WRITE_TAG, write_len), (CAPSULE_TAG, capsule_len)] {
            for (i, b) in m.buffer(tag)[..len].iter_mut().enumerate() {
                *b = pattern(tag, i);
            }
            m.submit(tag, Sqe::new(io_opcode::WRITE, 0), Xfer::Write(len)).unwrap();
        }
        let (mut stream, payloads) = target_stream(&reads, dg, write_len);
        // A flipped payload byte: the read it belongs to must fail (when digests are on).
        let mut corrupted = None;
        if let Some((pdu, byte)) = corrupt {
            let range = payloads[pdu % payloads.len()].clone();
            stream[range.start + byte % range.len()] ^= 0x10;
            // The read is the C2HData's CCCID, bytes 8..10 of its header (PDO bytes before the data).
            let header = range.start - 24 - if hdgst { 4 } else { 0 };
            corrupted = Some(u16::from_le_bytes([stream[header + 8], stream[header + 9]]));
        }
        let mut done = Vec::new();
        feed_fragments(&mut m, &stream, &sizes, &mut done).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(done.len(), reads.len() + 2, "every command completed once");
        for c in &done {
            if corrupted == Some(c.tag) && ddgst {
                prop_assert!(c.result.is_err(), "tag {} read a corrupted payload and succeeded", c.tag);
                continue;
            }
            prop_assert!(c.result.is_ok(), "tag {}: {:?}", c.tag, c.result);
            if let Some(r) = reads.iter().find(|r| r.tag == c.tag) {
                if corrupted != Some(c.tag) {
                    let bad = (0..r.len).find(|&i| m.buffer(r.tag)[i] != pattern(r.tag, i));
                    prop_assert_eq!(bad, None, "tag {} byte landed wrong", r.tag);
                }
            }
        }
        // What the host sent: every write byte once, in order, each data digest right.
        let mut written = vec![Vec::new(); 6];
        for (f, data) in frames(&take_output(&mut m), dg) {
            prop_assert!(f.data_digest_ok);
            match f.header {
                PduHeader::H2CData(h) => {
                    prop_assert_eq!(h.datao as usize, written[h.cccid as usize].len());
                    prop_assert!(h.datal <= maxh2cdata);
                    written[h.cccid as usize].extend_from_slice(&data);
                }
                PduHeader::CapsuleCmd(c) => written[c.sqe.cid() as usize].extend_from_slice(&data),
                _ => {}
            }
        }
        for (tag, len) in [(WRITE_TAG, write_len), (CAPSULE_TAG, capsule_len)] {
            let want: Vec<u8> = (0..len).map(|i| pattern(tag, i)).collect();
            prop_assert!(written[tag as usize] == want, "tag {tag}: the target got other bytes");
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        #[test]
        fn payloads_land_in_their_buffers_in_any_fragments(
            hdgst in any::<bool>(),
            ddgst in any::<bool>(),
            reads in proptest::collection::vec(read_strategy(), 1..4),
            sizes in proptest::collection::vec(prop_oneof![1usize..64, 1usize..9000, 1usize..300_000], 1..8),
        ) {
            run_case(hdgst, ddgst, reads, sizes, None)?;
        }

        #[test]
        fn a_corrupted_payload_fails_its_data_digest(
            hdgst in any::<bool>(),
            reads in proptest::collection::vec(read_strategy(), 1..4),
            sizes in proptest::collection::vec(prop_oneof![1usize..64, 1usize..300_000], 1..4),
            corrupt in (any::<usize>(), any::<usize>()),
        ) {
            run_case(hdgst, true, reads, sizes, Some(corrupt))?;
        }
    }

    #[test]
    fn large_input_is_expected_exactly_while_a_large_read_is_in_flight() {
        let dg = Digests::default();
        let mut m = ready_machine(dg, 0, 65536);
        m.submit(1, Sqe::new(io_opcode::READ, 0), Xfer::Read(DIRECT_RECV_MIN - 512)).unwrap();
        assert!(!m.expects_large_input(), "a small read streams nothing worth gating");
        m.submit(0, Sqe::new(io_opcode::READ, 0), Xfer::Read(BUF)).unwrap();
        assert!(m.expects_large_input());
        take_output(&mut m);
        let reads = [
            Read { tag: 0, len: BUF, chunk: 65536, success: true },
            Read { tag: 1, len: DIRECT_RECV_MIN - 512, chunk: 65536, success: true },
        ];
        let (stream, _) = target_stream(&reads, dg, 0);
        let mut done = Vec::new();
        feed_fragments(&mut m, &stream, &[4000], &mut done).unwrap();
        assert_eq!(done.len(), 2);
        assert!(!m.expects_large_input(), "every large read completed");
    }

    #[test]
    fn a_corrupted_header_ends_the_connection_with_a_termreq() {
        let dg = Digests { header: true, data: true };
        let mut m = ready_machine(dg, 0, 65536);
        m.submit(0, Sqe::new(io_opcode::READ, 0), Xfer::Read(BUF)).unwrap();
        take_output(&mut m);
        let (mut stream, payloads) = target_stream(&[Read { tag: 0, len: BUF, chunk: 65536, success: true }], dg, 0);
        stream[payloads[1].start - 20] ^= 1; // the second C2HData's header
        let err = feed_fragments(&mut m, &stream, &[4000], &mut Vec::new()).unwrap_err();
        assert!(err.to_string().contains("Header Digest Error"), "{err}");
        let sent = frames(&take_output(&mut m), Digests::default());
        assert!(matches!(sent.last().map(|f| &f.0.header), Some(PduHeader::H2CTermReq(_))));
    }
}
