//! One NVMe/TCP connection (one queue) as a sans-I/O state machine: bytes in, bytes out,
//! backend requests out, completions in, time in. No sockets or threads here, so tests and
//! fuzzers drive the real protocol logic directly.
//!
//! Only NVMe/TCP lives here: framing, ICReq, R2T/H2CData, C2HData, digests, TermReq, and the
//! buffers that hold command data. What a command means is the command layer's
//! ([`crate::command`]): each capsule goes there and comes back as an [`Action`] to carry out.
//!
//! Flow: ICReq → ICResp; CapsuleCmd → command layer; writes (and Connect) get their data in
//! the capsule or through R2T/H2CData; reads answer with C2HData then CapsuleResp. Commands
//! whose buffer does not fit the connection's budget wait in a FIFO (see `slots`). Fatal
//! protocol errors queue a C2HTermReq and the connection closes once it is written.
//!
//! Beside it: `landing` (payloads received straight into command buffers) and `output` (the
//! output queue, with read data spliced in from command buffers). Still over 600 lines: the PDU
//! handling and the per-command lifecycle stay together until the lifecycle moves to `slots`
//! (issue 38 item 2).

mod landing;
mod output;

use super::slots::{SlotState, Slots, BUFFER_BUDGET};
use super::{Transport, TransportKind};
use landing::{Arrival, Landing, Sink};
use super::stall::StallWatch;
use crate::backend::IoCompletion;
use crate::command::{Action, BackendRequest, Commands, Work};
use crate::core::{Port, Target, ADMIN_IN_CAPSULE};
use crate::stats::ReactorStats;
use crate::config::MAX_IN_CAPSULE_DATA_SIZE;
use nvmf_proto::pdu::{
    encode_pdu, fes, CapsuleResp, H2CData, IcReq, IcResp, TermReq, R2T,
    TERM_REQ_MAX_HEADER,
};
use nvmf_proto::spliced::SplicedOutput;
use nvmf_proto::{Cqe, Digests, FatalError, Framer, PduHeader, Role, Sqe, Status};
use std::io::IoSliceMut;
use std::sync::{Arc, LazyLock};
use std::time::Instant;

/// Stop reading PDUs while this much output waits for the socket (backpressure).
const OUT_HIGH_WATER: usize = 8 << 20;
/// Read buffer growth step.
const RECV_CHUNK: usize = 256 << 10;
/// Output buffer capacity kept between bursts; more is given back after a tick without need.
/// Capacity above it counts against the process's buffer cap, and a connection may always
/// queue this much output, so none starves while others hold the memory.
const OUT_KEEP: usize = 64 << 10;
/// Largest C2HData PDU we send.
const C2H_CHUNK: usize = 128 << 10;
/// Reads at least this large are written from their command buffer (vectored write); smaller
/// ones are copied into the output buffer, which was cheaper for 4 KiB (one contiguous write:
/// 753 K against 698 K IOPS at QD32), while 128 KiB gained 20-29 % from not copying.
const SEND_FROM_SLOT_MIN: usize = 16 << 10;
/// H2CData and in-capsule payloads at least this large are received straight into their
/// command buffer once their header is in (see `landing`); smaller ones are copied from the
/// receive buffer, which takes them in bulk with the PDUs around them. Landing costs a read per
/// PDU (the read after a payload stops at the next header, [`LANDING_TAIL`]), copying a memcpy.
/// Randwrite QD32 with every payload landing against none (interleaved A/B, 16-core Intel Xeon
/// VM, 2026-11-27): 0.73x at 4 KiB, 0.75x at 8 KiB, 0.84x at 16 KiB, 0.94x at 32 KiB and 0.91x
/// at 64 KiB polling (0.82x, 0.89x, 0.90x at 16, 32, 64 KiB in event mode). At 128 KiB (the
/// default MAXH2CDATA) bandwidth stayed within the runs' noise (0.91-1.04x) while the target's
/// CPU per GiB fell by 14 % in event mode (user time by 70 %).
const LAND_MIN: usize = 128 << 10;
/// While a payload lands, room for at most this many bytes after it: the next PDU's header
/// (and a little of its data, copied) without swallowing a large payload that could land too.
const LANDING_TAIL: usize = 8 << 10;
/// Stands in for in-capsule data that has not arrived when the command layer looks at the
/// capsule: for an I/O write it only slices it (the data lands in the slot's buffer later).
/// Allocated on first use and never written or read, so its pages are never touched.
static NOT_YET_ARRIVED: LazyLock<Vec<u8>> = LazyLock::new(|| vec![0; MAX_IN_CAPSULE_DATA_SIZE as usize]);
/// Cap on MAXR2T we honour per command, whatever the host offers.
const MAX_R2T_PER_CMD: u32 = 16;
/// Byte offsets reported as FEI.
const FEI_ICREQ_PFV: u32 = 8;
const FEI_ICREQ_HPDA: u32 = 10;
const FEI_H2C_CCCID: u32 = 8;
const FEI_H2C_TTAG: u32 = 10;
const FEI_H2C_DATAO: u32 = 12;
const FEI_H2C_DATAL: u32 = 16;
/// A command that cannot get buffer memory is failed with Internal Error, DNR clear: the
/// failure is the controller's, not the command's or the transport's, and a retry may succeed.
const NO_MEMORY: Status = Status::INTERNAL_ERROR;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    AwaitIcReq,
    Ready,
    /// A TermReq, or the response of a command that ended the queue, is queued; close once
    /// output drains.
    Closing,
    Closed,
}

/// What the connection needs from its reactor now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wants {
    /// Read the socket: the output queued is under the high-water mark. When false, input waits
    /// in the kernel (TCP backpressure on the host) until the output drains.
    pub read: bool,
    /// Output is queued for the socket.
    pub write: bool,
    /// Commands or input wait for buffer memory: process again on the next tick, even without
    /// new input, since another connection may have freed it.
    pub hold: bool,
}

pub struct Connection {
    target: Arc<Target>,
    cmd: Commands,
    framer: Framer,
    digests: Digests,
    phase: Phase,
    inbuf: Vec<u8>,
    in_pos: usize,
    in_len: usize,
    /// Output, in order: encoded PDUs, with read data segments (still in their slots' buffers,
    /// written from there: no copy) spliced in. The most bytes it held since the last tick
    /// (`take_high`) tells whether a buffer grown by a burst is still needed.
    out: SplicedOutput,
    /// Bytes of `out`'s capacity above [`OUT_KEEP`] taken from the process's buffer cap: a host
    /// that does not read its responses makes us hold them, with many connections together
    /// more than the machine has.
    out_charged: usize,
    /// Whole or partial PDUs wait in `inbuf` because [`Connection::reads_input`] said no.
    input_held: bool,
    /// The payload now being received into its command buffer; the bytes in `inbuf` follow it.
    landing: Option<Landing>,
    /// Payloads from this size on land in their buffer ([`LAND_MIN`] unless a test lowers it).
    land_min: usize,
    /// Payload bytes that landed in their buffer (the rest of a PDU's were copied).
    landed_bytes: u64,
    attached: bool,
    token: u32,
    slots: Slots,
    maxr2t: u32,
    stall: StallWatch,
}

fn max_data_len(target: &Target) -> u32 {
    let s = &target.settings;
    s.maxh2cdata.max(s.in_capsule_data_size).max(ADMIN_IN_CAPSULE)
}

impl Transport for Connection {
    const KIND: TransportKind = TransportKind::Tcp;
}

impl Connection {
    /// A fresh connection accepted on `port` (None in tests that need no discovery filtering).
    pub fn new(target: Arc<Target>, port: Option<Port>, now: Instant) -> Connection {
        let framer = Framer::new(Role::Target, max_data_len(&target));
        let slots = Slots::new(BUFFER_BUDGET, target.buffers.clone(), target.buffer_align);
        let stall = StallWatch::new(target.settings.stall_timeout_ms, now);
        Connection {
            cmd: Commands::new(target.clone(), port, Self::capabilities(&target.settings), now),
            target,
            framer,
            digests: Digests::default(),
            phase: Phase::AwaitIcReq,
            inbuf: vec![0; RECV_CHUNK],
            in_pos: 0,
            in_len: 0,
            out: SplicedOutput::with_capacity(OUT_KEEP, 0),
            out_charged: 0,
            input_held: false,
            landing: None,
            land_min: LAND_MIN,
            landed_bytes: 0,
            attached: false,
            token: 0,
            slots,
            maxr2t: 1,
            stall,
        }
    }

    // ---- bytes in ----

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
        let Connection { landing, slots, inbuf, in_len, .. } = self;
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
            n -= l.commit(n, &mut self.slots);
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

    // ---- lifecycle ----

    /// True when the socket should be closed now.
    pub fn should_close(&self) -> bool {
        self.phase == Phase::Closed || (self.phase == Phase::Closing && self.output_len() == 0)
    }

    /// Backend requests submitted and not yet completed: the connection (and its buffers) must
    /// live until this is 0, even after its socket closed.
    pub fn in_flight(&self) -> usize {
        self.cmd.in_flight()
    }

    /// Bytes the output buffer has allocated: it grows with a burst of responses and goes back
    /// to 64 KiB once a tick passes without one.
    pub fn output_buffer_bytes(&self) -> usize {
        self.out.capacity()
    }

    /// Bytes of command data buffers this connection holds (bounded by [`BUFFER_BUDGET`]).
    pub fn buffer_bytes(&self) -> usize {
        self.slots.bytes()
    }

    /// The peer went away or the reactor closes us: release the queue and controller.
    pub fn close(&mut self) {
        self.phase = Phase::Closed;
        self.cmd.release();
    }

    /// Once Connect succeeded and before [`attach`](Self::attach): (subsystem NQN or the
    /// discovery NQN, host NQN) for the placement policy.
    pub fn placement(&self) -> Option<(&str, &str)> {
        self.cmd.placement()
    }

    pub fn is_attached(&self) -> bool {
        self.attached
    }

    /// Hands the connection to a reactor: `token` routes backend completions back to it.
    pub fn attach(&mut self, token: u32, reactor: &ReactorStats) {
        self.attached = true;
        self.token = token;
        self.cmd.attach(reactor);
    }

    /// What the reactor should do for this connection now.
    pub fn wants(&self) -> Wants {
        let out = self.output_len();
        Wants { read: out < OUT_HIGH_WATER, write: out > 0, hold: self.slots.is_holding() || self.input_held }
    }

    /// New PDUs may be read and handled: the output queued is under the high-water mark and,
    /// while the process is at its buffer cap, what waits in the output buffer is under
    /// [`OUT_KEEP`] (read data sent from slot buffers is not: those are charged already).
    /// Otherwise input waits, and the host meets TCP backpressure, until it takes its output or
    /// memory is freed.
    pub fn reads_input(&self) -> bool {
        self.output_len() < OUT_HIGH_WATER
            && (self.out.buffered() < OUT_KEEP || !self.target.buffers.full())
    }

    /// Charges the output buffer's growth to the process's buffer cap, or gives back what it
    /// shrank by. Growth is charged even over the cap: those bytes are already queued.
    fn charge_output(&mut self) {
        let now = self.out.capacity().saturating_sub(OUT_KEEP);
        if now > self.out_charged {
            self.target.buffers.try_take(now - self.out_charged, true);
        } else if now < self.out_charged {
            self.target.buffers.give_back(self.out_charged - now);
        }
        self.out_charged = now;
    }

    /// The host owes us the rest of a PDU or the data of an R2T, or has not taken our output.
    /// A partial PDU that waits because we stopped reading (output backpressure, not yet handed
    /// to a reactor) is ours to finish, not the host's.
    fn waiting_on_host(&self) -> bool {
        let reading = self.reads_input() && (self.attached || self.cmd.queue().is_none());
        let landing = self.landing.as_ref().is_some_and(|l| !l.landed());
        (reading && self.in_pos < self.in_len) || landing || self.slots.awaits_data() || self.output_len() > 0
    }

    /// Time passes: enforces the stall, connect and keep-alive timeouts; gives idle buffers
    /// back when the process is short of buffer memory.
    pub fn tick(&mut self, now: Instant) {
        if self.phase == Phase::Closed {
            return;
        }
        let pressure = self.target.buffers.under_pressure();
        if pressure {
            self.slots.trim();
        }
        let high = self.out.take_high();
        if self.output_len() == 0 && (high <= OUT_KEEP || pressure) && self.out.capacity() > OUT_KEEP {
            self.out.shrink(OUT_KEEP);
            self.charge_output();
        }
        if self.stall.expired(self.waiting_on_host(), now) {
            let ms = self.target.settings.stall_timeout_ms;
            tracing::warn!(stall_timeout_ms = ms, "dropping connection stalled mid-PDU, on an R2T or on its output");
            self.close();
            return;
        }
        if self.phase != Phase::Closing && self.cmd.expired(now) {
            self.close();
            return;
        }
        // Asynchronous events (a namespace changed) complete the AERs this queue holds.
        if self.phase == Phase::Ready {
            while let Some((cid, dw0)) = self.cmd.next_event() {
                self.respond(cid, Status::SUCCESS, dw0);
            }
        }
    }

    // ---- processing ----

    /// Handles every whole PDU received so far. Before [`attach`](Self::attach), stops after a
    /// successful Connect so the connection can move to its reactor.
    pub fn process(&mut self, now: Instant) {
        let inbuf = std::mem::take(&mut self.inbuf);
        while matches!(self.phase, Phase::AwaitIcReq | Phase::Ready)
            && self.reads_input()
            && (self.attached || self.cmd.queue().is_none())
        {
            if let Some(l) = self.landing.take_if(|l| l.landed()) {
                self.landed(l, now);
                continue;
            }
            if self.landing.is_some() {
                break; // the bytes in `inbuf` come after the payload still arriving
            }
            let buf = &inbuf[self.in_pos..self.in_len];
            match self.framer.next(buf) {
                Ok(None) => {
                    match self.start_landing(buf, now) {
                        Ok(0) => break,
                        Ok(used) => self.in_pos += used,
                        Err(e) => {
                            self.fatal_error(e, buf);
                            break;
                        }
                    }
                    self.stall.progressed();
                    self.charge_output();
                }
                Err(e) => {
                    self.fatal_error(e, buf);
                    break;
                }
                Ok(Some(frame)) => {
                    let data = &buf[frame.data.clone()];
                    self.handle_pdu(frame.header, data, frame.data_digest_ok, buf, now);
                    self.in_pos += frame.len;
                    self.stall.progressed();
                    self.charge_output();
                }
            }
        }
        self.inbuf = inbuf;
        self.admit_held();
        self.charge_output();
        self.input_held = self.in_pos < self.in_len && !self.reads_input();
    }

    /// A PDU whose header is in but not all its data: when its payload is large enough and has
    /// a place, starts receiving it there. Returns how many bytes of `buf` it took (0: none; the
    /// PDU waits in the receive buffer to be handled whole, errors included).
    fn start_landing(&mut self, buf: &[u8], now: Instant) -> Result<usize, FatalError> {
        if self.phase != Phase::Ready {
            return Ok(0);
        }
        let Some(h) = self.framer.next_header(buf)? else { return Ok(0) };
        let len = h.data.len();
        if len < self.land_min {
            return Ok(0);
        }
        let (sink, arrival) = match h.header {
            PduHeader::H2CData(d) if self.h2c_check(&d, len).is_ok() => {
                (Sink::Slot { slot: d.ttag, at: d.datao as usize }, Arrival::H2C(d))
            }
            PduHeader::CapsuleCmd(c) => match self.capsule_landing(&c.sqe, len, now) {
                Some(place) => place,
                None => return Ok(0),
            },
            _ => return Ok(0),
        };
        let mut landing = Landing::new(sink, arrival, len, h.data_digest);
        let used = h.data.start + landing.absorb(&buf[h.data.start..], &mut self.slots);
        self.landing = Some(landing);
        Ok(used)
    }

    /// Where a capsule's in-capsule data goes before it arrives, for an I/O write whose data is
    /// the whole payload; None for any other capsule (handled whole). The command layer sees the
    /// capsule now; what it answers other than a buffer waits for the data and its digest.
    fn capsule_landing(&mut self, sqe: &Sqe, len: usize, now: Instant) -> Option<(Sink, Arrival)> {
        if !self.cmd.in_capsule_is_io_data(sqe, len) {
            return None;
        }
        let cid = sqe.cid();
        match self.cmd.command(sqe, NOT_YET_ARRIVED.get(..len)?, true, now) {
            Action::Buffer { work, len, in_capsule: Some(_) } => match self.claim_in_capsule(cid, work, len) {
                Some(idx) => {
                    self.slots[idx].state = SlotState::AwaitData;
                    Some((Sink::Slot { slot: idx, at: 0 }, Arrival::Capsule { cid, then: None }))
                }
                None => Some((Sink::Discard(Vec::new()), Arrival::Capsule { cid, then: None })),
            },
            then => Some((Sink::Discard(Vec::new()), Arrival::Capsule { cid, then: Some(then) })),
        }
    }

    /// A landing payload (and its digest) is all in: the PDU is handled as if it came whole.
    fn landed(&mut self, landing: Landing, now: Instant) {
        let ok = landing.digest_ok();
        if matches!(landing.sink, Sink::Slot { .. }) {
            self.landed_bytes += landing.len() as u64;
        }
        match (landing.sink, landing.arrival) {
            (Sink::Slot { .. }, Arrival::H2C(h)) => self.h2c_arrived(h, ok, now),
            // The slot lost its buffer (it cannot): the command fails as for a damaged PDU.
            (Sink::Discard(_), Arrival::H2C(h)) => self.h2c_arrived(h, false, now),
            (Sink::Slot { slot, .. }, Arrival::Capsule { .. }) => {
                let s = &mut self.slots[slot];
                s.received = s.len;
                if ok {
                    self.execute(slot);
                } else {
                    self.finish(slot, Status::TRANSIENT_TRANSPORT_ERROR);
                }
            }
            (Sink::Discard(_), Arrival::Capsule { cid, then: Some(_) }) if !ok => {
                self.respond(cid, Status::TRANSIENT_TRANSPORT_ERROR, 0)
            }
            (Sink::Discard(_), Arrival::Capsule { cid, then: Some(action) }) => self.act(cid, action),
            (Sink::Discard(_), Arrival::Capsule { then: None, .. }) => {} // answered already
        }
    }

    fn fatal_error(&mut self, e: FatalError, buf: &[u8]) {
        let header = buf[..e.hlen.min(buf.len()).min(TERM_REQ_MAX_HEADER)].to_vec();
        tracing::warn!(fes = e.fes, fei = e.fei, "fatal NVMe/TCP error; sending C2HTermReq and closing");
        self.term_req(e.fes, e.fei, header);
    }

    fn term_req(&mut self, fes: u16, fei: u32, header: Vec<u8>) {
        let hdr = PduHeader::C2HTermReq(TermReq { fes, fei, header });
        encode_pdu(self.out.bytes_mut(), &hdr, &[], self.digests);
        self.phase = Phase::Closing;
        self.cmd.release();
    }

    fn handle_pdu(
        &mut self,
        header: PduHeader,
        data: &[u8],
        data_ok: bool,
        raw: &[u8],
        now: Instant,
    ) {
        let hlen = raw.len().min(TERM_REQ_MAX_HEADER).min(header.pdu_type().hlen() as usize);
        match (self.phase, header) {
            (Phase::AwaitIcReq, PduHeader::IcReq(req)) => self.icreq(req, &raw[..hlen]),
            (_, PduHeader::H2CTermReq(t)) => {
                tracing::info!(fes = t.fes, fei = t.fei, "host sent H2CTermReq; closing");
                self.close();
            }
            (Phase::Ready, PduHeader::CapsuleCmd(c)) if data.len() > self.cmd.in_capsule_limit(&c.sqe) as usize => {
                // A PDU larger than negotiated (IOCCSZ): fatal, FES Data Transfer Limit Exceeded.
                // (Linux nvmet answers SGL Invalid Offset; it never accepts the bytes either.)
                tracing::warn!(len = data.len(), "in-capsule data beyond IOCCSZ; sending C2HTermReq");
                self.term_req(fes::DATA_LIMIT_EXCEEDED, 0, raw[..hlen].to_vec());
            }
            (Phase::Ready, PduHeader::CapsuleCmd(c)) => self.capsule(c.sqe, data, data_ok, now),
            (Phase::Ready, PduHeader::H2CData(h)) => self.h2c_data(h, data, data_ok, &raw[..hlen], now),
            _ => self.term_req(fes::PDU_SEQ_ERR, 0, raw[..hlen].to_vec()),
        }
    }

    fn icreq(&mut self, req: IcReq, raw: &[u8]) {
        if req.pfv != 0 {
            return self.term_req(fes::UNSUPPORTED_PARAM, FEI_ICREQ_PFV, raw.to_vec());
        }
        // Data placement is always right after the header (CPDA/HPDA 0), as Linux does.
        if req.hpda != 0 {
            return self.term_req(fes::UNSUPPORTED_PARAM, FEI_ICREQ_HPDA, raw.to_vec());
        }
        self.maxr2t = req.maxr2t.saturating_add(1).min(MAX_R2T_PER_CMD);
        let resp = IcResp {
            pfv: 0,
            cpda: 0,
            hdgst: req.hdgst,
            ddgst: req.ddgst,
            maxh2cdata: self.target.settings.maxh2cdata,
        };
        encode_pdu(self.out.bytes_mut(), &PduHeader::IcResp(resp), &[], Digests::default());
        self.digests = Digests { header: req.hdgst, data: req.ddgst };
        self.framer.digests = self.digests;
        self.phase = Phase::Ready;
    }

    fn respond(&mut self, cid: u16, status: Status, result: u64) {
        let (sqid, sqhd) = self.cmd.sq_ids();
        let cqe = Cqe { result, sqhd, sqid, cid, status };
        encode_pdu(self.out.bytes_mut(), &PduHeader::CapsuleResp(CapsuleResp { cqe }), &[], self.digests);
    }

    fn capsule(&mut self, sqe: Sqe, data: &[u8], data_ok: bool, now: Instant) {
        let cid = sqe.cid();
        let connected = self.cmd.queue().is_some();
        let action = self.cmd.command(&sqe, data, data_ok, now);
        self.act(cid, action);
        if !connected {
            self.log_connected();
        }
    }

    /// Carries out what the command layer asked for command `cid`.
    fn act(&mut self, cid: u16, action: Action) {
        match action {
            Action::Respond(status, result) => self.respond(cid, status, result),
            Action::Send(data) => {
                Self::send_copied(self.out.bytes_mut(), self.digests, cid, &data, false, false);
                self.respond(cid, Status::SUCCESS, 0);
            }
            Action::Hold => {}
            Action::Buffer { work, len, in_capsule } => self.buffer(cid, work, len, in_capsule),
        }
        if self.cmd.take_ending() {
            self.phase = Phase::Closing;
        }
    }

    fn log_connected(&self) {
        if let Some(q) = self.cmd.queue() {
            let (cntlid, qid, sqsize, hdgst, ddgst) = (q.ctrl.cntlid, q.qid, q.sqsize, self.digests.header, self.digests.data);
            let (subnqn, hostnqn) = (&q.stats.subnqn, &q.stats.hostnqn);
            tracing::info!(cntlid, qid, sqsize, hdgst, ddgst, %subnqn, %hostnqn, "queue connected");
        }
    }

    /// A command that needs a buffer: from the capsule's data, through R2T, or for the backend
    /// to fill (reads). I/O commands wait for buffer memory when the budget is short; Connect
    /// and AUTH_Send take it over the budget (they are small and rare).
    fn buffer(&mut self, cid: u16, work: Work, buf_len: u32, in_capsule: Option<&[u8]>) {
        if let Some(d) = in_capsule {
            if let Some(idx) = self.claim_in_capsule(cid, work, buf_len) {
                let slot = &mut self.slots[idx];
                slot.buf.as_mut_slice().copy_from_slice(d);
                slot.received = buf_len;
                self.execute(idx);
            }
            return;
        }
        let Some(idx) = self.alloc_slot(cid, work, buf_len) else { return };
        if !matches!(work, Work::Io(_)) {
            if self.slots.reserve(idx, true).is_err() {
                self.slots.free(idx);
                return self.respond(cid, NO_MEMORY, 0);
            }
            self.slots[idx].state = SlotState::AwaitData;
            return self.send_r2ts(idx);
        }
        match () {
            _ if buf_len == 0 => self.execute(idx),
            // Behind commands already waiting for memory, so that none starves.
            _ if self.slots.is_holding() => self.slots.hold(idx),
            _ => match self.slots.reserve(idx, false) {
                Ok(true) => self.start_transfer(idx),
                Ok(false) => self.slots.hold(idx),
                Err(_) => {
                    tracing::warn!(cid, buf_len, "no memory for a command buffer");
                    self.finish(idx, NO_MEMORY);
                }
            },
        }
    }

    /// A slot for command `cid`; None when there is none left (the command or the connection
    /// was answered).
    fn alloc_slot(&mut self, cid: u16, work: Work, buf_len: u32) -> Option<u16> {
        let idx = self.slots.alloc(self.cmd.slot_limit(), cid, work, buf_len);
        if idx.is_none() {
            match work {
                // More commands outstanding than the queue has entries: the host broke SQSIZE.
                Work::Io(_) => self.term_req(fes::PDU_SEQ_ERR, 0, Vec::new()),
                // Before Connect there is one slot: a second Connect while the first awaits data.
                _ => self.respond(cid, Status::CMD_SEQ_ERROR.with_dnr(), 0),
            }
        }
        idx
    }

    /// A slot with its buffer for a command whose data comes in its capsule; None when the
    /// command was answered instead (no slot, or no memory). The data has arrived or is arriving,
    /// so waiting for the budget would save nothing.
    fn claim_in_capsule(&mut self, cid: u16, work: Work, buf_len: u32) -> Option<u16> {
        let idx = self.alloc_slot(cid, work, buf_len)?;
        if self.slots.reserve(idx, true).is_err() {
            tracing::warn!(cid, buf_len, "no memory for a command buffer");
            self.finish(idx, NO_MEMORY);
            return None;
        }
        Some(idx)
    }

    /// A command with its buffer: ask for the host's data, or run it (reads).
    fn start_transfer(&mut self, idx: u16) {
        let slot = &mut self.slots[idx];
        match slot.work {
            Work::Io(plan) if plan.host_data_len() > 0 => {
                slot.state = SlotState::AwaitData;
                self.send_r2ts(idx);
            }
            _ => self.execute(idx),
        }
    }

    /// Starts the commands waiting for buffer memory, in arrival order, while the budget has room.
    fn admit_held(&mut self) {
        while self.phase == Phase::Ready {
            let Some(idx) = self.slots.first_held() else { return };
            match self.slots.reserve(idx, false) {
                Ok(false) => return,
                Ok(true) => {
                    self.slots.pop_held();
                    self.start_transfer(idx);
                }
                Err(_) => {
                    self.slots.pop_held();
                    tracing::warn!(cid = self.slots[idx].cid, "no memory for a command buffer");
                    self.finish(idx, NO_MEMORY);
                }
            }
        }
    }

    /// Issues R2Ts, one per MAXH2CDATA-sized chunk, keeping at most MAXR2T outstanding.
    fn send_r2ts(&mut self, idx: u16) {
        let chunk = self.target.settings.maxh2cdata;
        let slot = &mut self.slots[idx];
        let done_chunks = slot.received - slot.received % chunk;
        while slot.r2t_upto < slot.len && (slot.r2t_upto - done_chunks) / chunk < self.maxr2t {
            let r2tl = chunk.min(slot.len - slot.r2t_upto);
            let r2t = R2T { cccid: slot.cid, ttag: idx, r2to: slot.r2t_upto, r2tl };
            encode_pdu(self.out.bytes_mut(), &PduHeader::R2T(r2t), &[], self.digests);
            slot.r2t_upto += r2tl;
        }
    }

    /// Whether an H2CData header fits the transfer it names: the FES and FEI of the TermReq
    /// otherwise.
    fn h2c_check(&self, h: &H2CData, data_len: usize) -> Result<(), (u16, u32)> {
        match self.slots.get(h.ttag) {
            // A PDU larger than the MAXH2CDATA we advertised.
            _ if h.datal > self.target.settings.maxh2cdata => Err((fes::DATA_LIMIT_EXCEEDED, 0)),
            None => Err((fes::INVALID_PDU_HDR, FEI_H2C_TTAG)),
            Some(s) if s.state != SlotState::AwaitData => Err((fes::INVALID_PDU_HDR, FEI_H2C_TTAG)),
            Some(s) if s.cid != h.cccid => Err((fes::INVALID_PDU_HDR, FEI_H2C_CCCID)),
            Some(_) if h.datal as usize != data_len => Err((fes::INVALID_PDU_HDR, FEI_H2C_DATAL)),
            Some(s) if h.datao != s.received => Err((fes::DATA_OUT_OF_RANGE, FEI_H2C_DATAO)),
            Some(s) if h.datao as u64 + h.datal as u64 > s.r2t_upto as u64 => {
                Err((fes::DATA_OUT_OF_RANGE, FEI_H2C_DATAL))
            }
            Some(_) => Ok(()),
        }
    }

    fn h2c_data(&mut self, h: H2CData, data: &[u8], data_ok: bool, raw: &[u8], now: Instant) {
        if let Err((fes, fei)) = self.h2c_check(&h, data.len()) {
            return self.term_req(fes, fei, raw.to_vec());
        }
        let at = h.datao as usize;
        self.slots[h.ttag].buf.as_mut_slice()[at..at + data.len()].copy_from_slice(data);
        self.h2c_arrived(h, data_ok, now);
    }

    /// The data of a checked H2CData PDU is in its slot's buffer.
    fn h2c_arrived(&mut self, h: H2CData, data_ok: bool, now: Instant) {
        let slot = &mut self.slots[h.ttag];
        slot.received += h.datal;
        if !data_ok {
            slot.failed = Some(Status::TRANSIENT_TRANSPORT_ERROR);
        }
        if slot.received < slot.len {
            return self.send_r2ts(h.ttag);
        }
        slot.state = SlotState::Executing;
        match (slot.work, slot.failed) {
            (Work::Io(_), Some(status)) => self.finish(h.ttag, status),
            (Work::Io(_), None) => self.execute(h.ttag),
            (work, failed) => {
                let (cid, data) = (slot.cid, slot.buf.as_slice()[..slot.len as usize].to_vec());
                self.slots.free(h.ttag);
                let action = self.cmd.data_in(work, &data, failed, now);
                self.act(cid, action);
                if matches!(work, Work::Connect(_)) {
                    self.log_connected();
                }
            }
        }
    }

    /// Hands a command whose data (if any) is in its buffer to the command layer, which queues
    /// its backend requests.
    fn execute(&mut self, idx: u16) {
        let tag = ((self.token as u64) << 32) | idx as u64;
        let slot = &mut self.slots[idx];
        slot.state = SlotState::Executing;
        let Work::Io(plan) = slot.work else { return self.finish(idx, Status::INTERNAL_ERROR) };
        match self.cmd.execute(plan, &mut slot.buf, tag) {
            Ok(0) => self.finish(idx, Status::SUCCESS),
            Ok(n) => slot.pending = n,
            Err(status) => self.finish(idx, status),
        }
    }

    /// Backend requests for the reactor to submit (see [`Commands::backend_requests`]).
    pub fn backend_requests(&mut self) -> impl Iterator<Item = BackendRequest<'_>> {
        self.cmd.backend_requests()
    }

    /// A backend request finished. `tag` is the one given at submission.
    pub fn complete_io(&mut self, c: IoCompletion) {
        let idx = (c.tag & 0xFFFF) as u16;
        let Some(slot) = self.slots.get_mut(idx) else { return };
        if slot.state != SlotState::Executing || slot.pending == 0 {
            return;
        }
        slot.pending -= 1;
        let status = self.cmd.request_done(c.result, slot.cid);
        if !status.is_success() {
            slot.status = status;
        }
        if slot.pending == 0 {
            let status = slot.status;
            self.finish(idx, status);
            self.admit_held();
            self.charge_output();
        }
    }

    /// Completes a slot's command: read data (on success), then the response.
    fn finish(&mut self, idx: u16, status: Status) {
        let slot = &self.slots[idx];
        let cid = slot.cid;
        if !matches!(self.phase, Phase::Closed | Phase::Closing) {
            let read = match slot.work {
                Work::Io(plan) => self.cmd.io_done(plan, status),
                _ => 0,
            };
            let success_flag = read > 0 && self.cmd.queue().is_some_and(|q| q.sqflow_disabled);
            let from_slot = read as usize >= SEND_FROM_SLOT_MIN;
            if from_slot {
                self.send_slot_data(idx, success_flag);
            } else if read > 0 {
                let zeros = slot.buf.known_zero() == slot.buf.len();
                Self::send_copied(self.out.bytes_mut(), self.digests, cid, slot.buf.as_slice(), zeros, success_flag);
            }
            if !success_flag {
                self.respond(cid, status, 0);
            }
            if from_slot {
                return; // the slot is freed once its data is written (consume_output)
            }
        }
        self.slots.free(idx);
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.cmd.release();
        self.target.buffers.give_back(self.out_charged);
    }
}
