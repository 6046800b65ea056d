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
//! The per-command lifecycle (buffers, waiting for memory, execution, completion) is the
//! shared [`Lifecycle`]; this connection supplies its hooks (`data_path`: R2T, C2HData,
//! CapsuleResp). Beside it: `input` (the receive buffer, and the slices a socket read fills),
//! `landing` (payloads received straight into command buffers) and `output` (the output queue,
//! with read data spliced in from command buffers).

mod data_path;
mod depth;
mod input;
mod landing;
mod output;

use super::slots::{SlotState, Slots, BUFFER_BUDGET};
use super::{At, Lifecycle, Transport, TransportKind};
use data_path::{Phase, Wire, OUT_KEEP};
pub use data_path::RESPONSE_GROUP;
use landing::{Arrival, Landing, Sink};
use super::stall::StallWatch;
use crate::backend::IoCompletion;
use crate::command::{Action, BackendRequest, Commands};
use crate::core::{Port, Target, ADMIN_IN_CAPSULE};
use crate::stats::ReactorStats;
use crate::config::MAX_IN_CAPSULE_DATA_SIZE;
use nvmf_proto::pdu::{encode_pdu, fes, H2CData, IcReq, IcResp, TERM_REQ_MAX_HEADER};
use nvmf_proto::{Digests, FatalError, Framer, PduHeader, Role, Sqe, Status};
use std::sync::{Arc, LazyLock};
use std::time::Instant;

/// Stop reading PDUs while this much output waits for the socket (backpressure).
const OUT_HIGH_WATER: usize = 8 << 20;
/// Read buffer growth step.
const RECV_CHUNK: usize = 256 << 10;
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
    /// The command layer and the command slots, with the lifecycle they share with every
    /// transport; `wire` is what it calls back (R2T, C2HData, CapsuleResp).
    life: Lifecycle,
    wire: Wire,
    framer: Framer,
    inbuf: Vec<u8>,
    in_pos: usize,
    in_len: usize,
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
        let cmd = Commands::new(target.clone(), port, Self::capabilities(&target.settings), now);
        Connection {
            life: Lifecycle::new(cmd, slots),
            wire: Wire::new(target.settings.maxh2cdata),
            target,
            framer,
            inbuf: vec![0; RECV_CHUNK],
            in_pos: 0,
            in_len: 0,
            out_charged: 0,
            input_held: false,
            landing: None,
            land_min: LAND_MIN,
            landed_bytes: 0,
            attached: false,
            stall,
        }
    }

    // ---- lifecycle ----

    /// True when the socket should be closed now.
    pub fn should_close(&self) -> bool {
        self.wire.phase == Phase::Closed || (self.wire.phase == Phase::Closing && self.output_len() == 0)
    }

    /// Backend requests submitted and not yet completed: the connection (and its buffers) must
    /// live until this is 0, even after its socket closed.
    pub fn in_flight(&self) -> usize {
        self.life.cmd.in_flight()
    }

    /// Bytes the output buffer has allocated: it grows with a burst of responses and goes back
    /// to 64 KiB once a tick passes without one.
    pub fn output_buffer_bytes(&self) -> usize {
        self.wire.out.capacity()
    }

    /// Bytes of command data buffers this connection holds (bounded by [`BUFFER_BUDGET`]).
    pub fn buffer_bytes(&self) -> usize {
        self.life.slots.bytes()
    }

    /// The peer went away or the reactor closes us: release the queue and controller.
    pub fn close(&mut self) {
        self.wire.phase = Phase::Closed;
        self.life.cmd.release();
    }

    /// Once Connect succeeded and before [`attach`](Self::attach): (subsystem NQN or the
    /// discovery NQN, host NQN) for the placement policy.
    pub fn placement(&self) -> Option<(&str, &str)> {
        self.life.cmd.placement()
    }

    pub fn is_attached(&self) -> bool {
        self.attached
    }

    /// Hands the connection to a reactor: `token` routes backend completions back to it.
    pub fn attach(&mut self, token: u32, reactor: &ReactorStats) {
        self.attached = true;
        self.life.token = token;
        self.life.cmd.attach(reactor);
    }

    /// What the reactor should do for this connection now.
    pub fn wants(&self) -> Wants {
        let out = self.output_len();
        Wants { read: out < OUT_HIGH_WATER, write: out > 0, hold: self.life.slots.is_holding() || self.input_held }
    }

    /// New PDUs may be read and handled: the output queued is under the high-water mark and,
    /// while the process is at its buffer cap, what waits in the output buffer is under
    /// [`OUT_KEEP`] (read data sent from slot buffers is not: those are charged already).
    /// Otherwise input waits, and the host meets TCP backpressure, until it takes its output or
    /// memory is freed.
    pub fn reads_input(&self) -> bool {
        self.output_len() < OUT_HIGH_WATER
            && (self.wire.out.buffered() < OUT_KEEP || !self.target.buffers.full())
    }

    /// Charges the output buffer's growth to the process's buffer cap, or gives back what it
    /// shrank by. Growth is charged even over the cap: those bytes are already queued.
    fn charge_output(&mut self) {
        let now = self.wire.out.capacity().saturating_sub(OUT_KEEP);
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
        let reading = self.reads_input() && (self.attached || self.life.cmd.queue().is_none());
        let landing = self.landing.as_ref().is_some_and(|l| !l.landed());
        (reading && self.in_pos < self.in_len) || landing || self.life.slots.awaits_data() || self.output_len() > 0
    }

    /// Time passes: enforces the stall, connect and keep-alive timeouts; gives idle buffers
    /// back when the process is short of buffer memory.
    pub fn tick(&mut self, now: Instant) {
        if self.wire.phase == Phase::Closed {
            return;
        }
        self.wire.tick();
        let pressure = self.target.buffers.under_pressure();
        if pressure {
            self.life.slots.trim();
        }
        let high = self.wire.out.take_high();
        if self.output_len() == 0 && (high <= OUT_KEEP || pressure) && self.wire.out.capacity() > OUT_KEEP {
            self.wire.out.shrink(OUT_KEEP);
            self.charge_output();
        }
        if self.stall.expired(self.waiting_on_host(), now) {
            let ms = self.target.settings.stall_timeout_ms;
            tracing::warn!(stall_timeout_ms = ms, "dropping connection stalled mid-PDU, on an R2T or on its output");
            self.close();
            return;
        }
        if self.wire.phase != Phase::Closing && self.life.cmd.expired(now) {
            self.close();
            return;
        }
        // Asynchronous events (a namespace changed) complete the AERs this queue holds.
        if self.wire.phase == Phase::Ready {
            self.life.complete_events(&mut self.wire);
        }
    }

    // ---- processing ----

    /// Handles every whole PDU received so far. Before [`attach`](Self::attach), stops after a
    /// successful Connect so the connection can move to its reactor.
    pub fn process(&mut self, now: Instant) {
        let inbuf = std::mem::take(&mut self.inbuf);
        while matches!(self.wire.phase, Phase::AwaitIcReq | Phase::Ready)
            && self.reads_input()
            && (self.attached || self.life.cmd.queue().is_none())
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
        if self.wire.phase != Phase::Ready {
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
        let used = h.data.start + landing.absorb(&buf[h.data.start..], &mut self.life.slots);
        self.landing = Some(landing);
        Ok(used)
    }

    /// Where a capsule's in-capsule data goes before it arrives, for an I/O write whose data is
    /// the whole payload; None for any other capsule (handled whole). The command layer sees the
    /// capsule now; what it answers other than a buffer waits for the data and its digest.
    fn capsule_landing(&mut self, sqe: &Sqe, len: usize, now: Instant) -> Option<(Sink, Arrival)> {
        if !self.life.cmd.in_capsule_is_io_data(sqe, len) {
            return None;
        }
        let cid = sqe.cid();
        self.wire.saw_command(cid);
        match self.life.cmd.command(sqe, NOT_YET_ARRIVED.get(..len)?, true, now) {
            Action::Buffer { work, len, in_capsule: Some(_) } => match self.life.claim_in_capsule(&mut self.wire, cid, work, len) {
                Some(idx) => {
                    self.life.slots[idx].state = SlotState::AwaitData;
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
                let s = &mut self.life.slots[slot];
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
        self.wire.term_req(&mut self.life.cmd, fes, fei, header);
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
        match (self.wire.phase, header) {
            (Phase::AwaitIcReq, PduHeader::IcReq(req)) => self.icreq(req, &raw[..hlen]),
            (_, PduHeader::H2CTermReq(t)) => {
                tracing::info!(fes = t.fes, fei = t.fei, "host sent H2CTermReq; closing");
                self.close();
            }
            (Phase::Ready, PduHeader::CapsuleCmd(c)) if data.len() > self.life.cmd.in_capsule_limit(&c.sqe) as usize => {
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
        self.wire.maxr2t = req.maxr2t.saturating_add(1).min(MAX_R2T_PER_CMD);
        let resp = IcResp {
            pfv: 0,
            cpda: 0,
            hdgst: req.hdgst,
            ddgst: req.ddgst,
            maxh2cdata: self.target.settings.maxh2cdata,
        };
        encode_pdu(self.wire.out.bytes_mut(), &PduHeader::IcResp(resp), &[], Digests::default());
        self.wire.digests = Digests { header: req.hdgst, data: req.ddgst };
        self.framer.digests = self.wire.digests;
        self.wire.phase = Phase::Ready;
    }

    fn respond(&mut self, cid: u16, status: Status, result: u64) {
        self.wire.respond_to(&self.life.cmd, cid, status, result);
    }

    fn capsule(&mut self, sqe: Sqe, data: &[u8], data_ok: bool, now: Instant) {
        self.wire.saw_command(sqe.cid());
        self.life.command(&mut self.wire, &sqe, None, data, data_ok, now);
    }

    fn act(&mut self, cid: u16, action: Action) {
        self.life.act(&mut self.wire, At { cid, slot: None }, action);
    }

    fn execute(&mut self, idx: u16) {
        self.life.execute(&mut self.wire, idx);
    }

    fn finish(&mut self, idx: u16, status: Status) {
        self.life.finish(&mut self.wire, idx, status);
    }

    /// Starts the commands waiting for buffer memory, in arrival order, while the budget has room.
    fn admit_held(&mut self) {
        self.life.admit_waiting(&mut self.wire);
    }

    /// Whether an H2CData header fits the transfer it names: the FES and FEI of the TermReq
    /// otherwise.
    fn h2c_check(&self, h: &H2CData, data_len: usize) -> Result<(), (u16, u32)> {
        match self.life.slots.get(h.ttag) {
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
        self.life.slots[h.ttag].buf.as_mut_slice()[at..at + data.len()].copy_from_slice(data);
        self.h2c_arrived(h, data_ok, now);
    }

    /// The data of a checked H2CData PDU is in its slot's buffer.
    fn h2c_arrived(&mut self, h: H2CData, data_ok: bool, now: Instant) {
        let slot = &mut self.life.slots[h.ttag];
        slot.received += h.datal;
        if !data_ok {
            slot.failed = Some(Status::TRANSIENT_TRANSPORT_ERROR);
        }
        if slot.received < slot.len {
            return self.wire.send_r2ts(&mut self.life.slots, h.ttag);
        }
        self.life.data_arrived(&mut self.wire, h.ttag, now);
    }

    /// Backend requests for the reactor to submit (see [`Commands::backend_requests`]).
    pub fn backend_requests(&mut self) -> impl Iterator<Item = BackendRequest<'_>> {
        self.life.cmd.backend_requests()
    }

    /// A backend request finished. `tag` is the one given at submission.
    pub fn complete_io(&mut self, c: IoCompletion) {
        if self.life.complete_io(&mut self.wire, c) {
            self.admit_held();
            self.charge_output();
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.life.cmd.release();
        self.target.buffers.give_back(self.out_charged);
    }
}
