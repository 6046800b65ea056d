//! The target's sans-I/O connection (`nvmf_target::transport::tcp::Connection`) fed a hostile
//! host's byte stream.
//!
//! The input is a script. Its first byte picks the digests and how far a well-formed prefix
//! goes (nothing, ICReq, ICReq + admin Connect + CC.EN, or ICReq + I/O Connect to a controller
//! that a second, well-behaved connection set up), so most inputs reach command handling.
//! Then each step sends one PDU built from the input (capsules of every command kind with
//! in-capsule or R2T data, H2CData answering the last R2T exactly or wrongly, TermReq, ICReq
//! again, raw bytes), optionally with one byte flipped and split across two reads, or lets
//! time pass.
//!
//! What must hold whatever the input: no panic; everything the target sends frames cleanly
//! for a host with the negotiated digests, with correct data digests; nothing follows a
//! C2HTermReq and the connection closes once it is written; buffers stay within the budget and
//! all go back to the process when the connections drop; no backend request is left in
//! flight; and the other connection still answers afterwards.

use crate::script::Script;
use crate::target_fixture::{self as fixture, capsule, connect_capsule, enable_sqe, payload, with_engine, MAX_STEPS};
use nvmf_proto::fabrics::CNTLID_DYNAMIC;
use nvmf_proto::nvme::admin_opcode;
use nvmf_proto::pdu::{encode_pdu, fes, CapsuleCmd, H2CData, IcReq, TermReq, R2T};
use nvmf_proto::{Cqe, Digests, Framer, PduHeader, Role, Sqe};
use nvmf_target::backend::IoEngine;
use nvmf_target::config::ReactorMode;
use nvmf_target::core::Target;
use nvmf_target::stats::ReactorStats;
use nvmf_target::reactor::{drive, drive_and_take_output};
use nvmf_target::transport::tcp::Connection;
use nvmf_target::transport::BUFFER_BUDGET;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Small limits, so R2T sequences and limit checks are reached with small inputs.
const IN_CAPSULE: u32 = 4096;
const MAXH2CDATA: u32 = 4096;
/// Payloads from this size on are received straight into their command buffer (the target's
/// default is larger than this fuzzer's PDUs): both ways of receiving data are reached.
const LAND_MIN: usize = 256;

pub fn run(input: &[u8]) {
    with_engine(|e| Session::new(e).play(&mut Script::new(input)));
}

/// The shared fixture's target with this driver's small limits.
fn target() -> Arc<Target> {
    fixture::target(|c| {
        c.target.in_capsule_data_size = IN_CAPSULE;
        c.target.maxh2cdata = MAXH2CDATA;
    })
}

/// The host's end of one target connection: what we sent and what came back.
struct Peer {
    /// Routes backend completions to this connection (as a reactor's connection token does).
    token: u32,
    conn: Connection,
    /// Framer for what the target sends; digests follow its ICResp.
    rx_framer: Framer,
    rx: Vec<u8>,
    /// Digests our PDUs carry (what we asked for in ICReq).
    dg: Digests,
    last_r2t: Option<R2T>,
    responses: Vec<Cqe>,
    terminated: bool,
}

impl Peer {
    fn new(target: &Arc<Target>, token: u32, now: Instant) -> Peer {
        let port = target.ports.first().cloned();
        let mut conn = Connection::new(target.clone(), port, now);
        conn.land_payloads_from(LAND_MIN);
        Peer {
            token,
            conn,
            rx_framer: Framer::new(Role::Host, 1 << 24),
            rx: Vec::new(),
            dg: Digests::default(),
            last_r2t: None,
            responses: Vec::new(),
            terminated: false,
        }
    }

    /// Delivers bytes (in two parts when `split` is inside them, each in as many reads as the
    /// connection's receive slices take, as a reactor reads), lets the connection work, then
    /// checks everything it sent.
    fn deliver(&mut self, bytes: &[u8], split: usize, now: Instant, engine: &mut IoEngine) {
        let (a, b) = bytes.split_at(split.min(bytes.len()));
        for part in [a, b] {
            if part.is_empty() || self.conn.should_close() {
                continue;
            }
            let mut rest = part;
            while !rest.is_empty() && !self.conn.should_close() {
                let took = self.conn.receive(rest);
                rest = &rest[took..];
                drive(&mut self.conn, now, engine);
                if took == 0 {
                    break; // no room (input held): the rest is lost, as a closing socket's
                }
            }
            if self.conn.placement().is_some() && !self.conn.is_attached() {
                // Connected: the acceptor hands the connection to a reactor, which resumes it.
                self.conn.attach(self.token, &ReactorStats::new(0, 0, ReactorMode::Event, 0));
            }
            let out = drive_and_take_output(&mut self.conn, now, engine);
            self.collect_output(&out);
        }
        assert_eq!(self.conn.in_flight(), 0, "backend requests left in flight after drive");
        assert!(self.conn.buffer_bytes() <= BUFFER_BUDGET + 1024 * IN_CAPSULE as usize, "buffers beyond budget");
    }

    fn send(&mut self, hdr: PduHeader, data: &[u8], now: Instant, engine: &mut IoEngine) {
        let mut b = Vec::new();
        encode_pdu(&mut b, &hdr, data, self.dg);
        self.deliver(&b, 0, now, engine);
    }

    fn collect_output(&mut self, out: &[u8]) {
        self.rx.extend_from_slice(out);
        loop {
            let f = match self.rx_framer.next(&self.rx) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => panic!("the target sent a PDU its peer cannot frame: {e} (after terminated={})", self.terminated),
            };
            assert!(!self.terminated, "the target sent {:?} after a C2HTermReq", f.header.pdu_type());
            assert!(f.data_digest_ok, "the target sent a wrong data digest");
            match f.header {
                PduHeader::IcResp(r) => {
                    self.rx_framer.digests = Digests { header: r.hdgst, data: r.ddgst };
                }
                PduHeader::R2T(r) => {
                    assert!(r.r2tl > 0 && r.r2tl <= MAXH2CDATA, "R2T of {} bytes", r.r2tl);
                    self.last_r2t = Some(r);
                }
                PduHeader::CapsuleResp(r) => self.responses.push(r.cqe),
                PduHeader::C2HTermReq(_) => self.terminated = true,
                _ => {}
            }
            self.rx.drain(..f.len);
        }
        if self.terminated {
            assert!(self.rx.is_empty(), "bytes after a C2HTermReq");
            assert!(self.conn.should_close(), "a C2HTermReq was sent but the connection stays open");
        }
    }

    fn icreq(&mut self, hdgst: bool, ddgst: bool, maxr2t: u32, now: Instant, engine: &mut IoEngine) {
        self.send(PduHeader::IcReq(IcReq { pfv: 0, hpda: 0, hdgst, ddgst, maxr2t }), &[], now, engine);
        self.dg = Digests { header: hdgst, data: ddgst };
    }

    fn command(&mut self, sqe: Sqe, data: &[u8], now: Instant, engine: &mut IoEngine) -> Option<Cqe> {
        let before = self.responses.len();
        self.send(PduHeader::CapsuleCmd(CapsuleCmd { sqe }), data, now, engine);
        self.responses.get(before).copied()
    }

    fn connect(&mut self, qid: u16, cntlid: u16, sqsize: u16, now: Instant, engine: &mut IoEngine) -> Option<Cqe> {
        let (sqe, data) = connect_capsule(qid, cntlid, sqsize);
        self.command(sqe, &data, now, engine)
    }

    fn enable(&mut self, now: Instant, engine: &mut IoEngine) -> Option<Cqe> {
        self.command(enable_sqe(), &[], now, engine)
    }
}

struct Session<'e> {
    engine: &'e mut IoEngine,
    target: Arc<Target>,
    now: Instant,
}

impl<'e> Session<'e> {
    fn new(engine: &'e mut IoEngine) -> Self {
        Session { engine, target: target(), now: Instant::now() }
    }

    /// A well-behaved admin queue on the same target: the I/O queue joins its controller, and
    /// it must keep working whatever the fuzzed connection did.
    fn bystander(&mut self) -> (Peer, u16) {
        let mut p = Peer::new(&self.target, 1, self.now);
        p.icreq(false, false, 0, self.now, self.engine);
        let cqe = p.connect(0, CNTLID_DYNAMIC, 31, self.now, self.engine).expect("Connect answered");
        assert!(cqe.status.is_success(), "bystander Connect failed: {}", cqe.status);
        let cntlid = cqe.result as u16;
        let cqe = p.enable(self.now, self.engine);
        assert!(cqe.is_some_and(|c| c.status.is_success()), "bystander CC.EN = 1 failed: {cqe:?}");
        (p, cntlid)
    }

    fn play(&mut self, s: &mut Script) {
        let (mut bystander, cntlid) = self.bystander();
        let mut p = Peer::new(&self.target, 2, self.now);
        let setup = s.u8();
        let (hdgst, ddgst) = (setup & 1 != 0, setup & 2 != 0);
        let (now, engine) = (self.now, &mut *self.engine);
        match (setup >> 2) & 3 {
            0 => {}
            1 => p.icreq(hdgst, ddgst, s.u8() as u32 % 4, now, engine),
            2 => {
                p.icreq(hdgst, ddgst, s.u8() as u32 % 4, now, engine);
                p.connect(0, CNTLID_DYNAMIC, 31, now, engine);
                p.enable(now, engine);
            }
            _ => {
                p.icreq(hdgst, ddgst, s.u8() as u32 % 4, now, engine);
                let qid = 1 + s.pick(4) as u16;
                let sqsize = 1 + s.pick(32) as u16;
                p.connect(qid, cntlid, sqsize, now, engine);
            }
        }
        for _ in 0..MAX_STEPS {
            if s.is_empty() || p.conn.should_close() {
                break;
            }
            self.step(&mut p, s);
        }
        p.conn.close();
        drop(p);

        // The other connection is unaffected: its controller still answers.
        let keep_alive = Sqe::new(admin_opcode::KEEP_ALIVE, 9);
        let cqe = bystander.command(keep_alive, &[], self.now, self.engine);
        assert!(
            cqe.is_some_and(|c| c.status.is_success() && c.cid == 9),
            "the bystander connection stopped answering: {cqe:?}"
        );
        drop(bystander);
        // Every buffer, output buffers included, went back to the process's cap.
        assert_eq!(self.target.buffers.used(), 0, "buffer memory left charged after both connections dropped");
    }

    fn step(&mut self, p: &mut Peer, s: &mut Script) {
        let op = s.u8();
        let mut pdu = Vec::new();
        match op % 8 {
            0..=2 => {
                let (sqe, data) = capsule(s);
                encode_pdu(&mut pdu, &PduHeader::CapsuleCmd(CapsuleCmd { sqe }), &data, p.dg);
            }
            3 | 4 => h2c_data(s, p.last_r2t, p.dg, &mut pdu),
            5 => {
                let n = s.pick(256);
                pdu.extend_from_slice(s.bytes(n));
            }
            6 => match s.pick(3) {
                0 => {
                    let (fei, n) = (s.u32(), s.pick(160));
                    let t = TermReq { fes: fes::PDU_SEQ_ERR, fei, header: s.bytes(n).to_vec() };
                    encode_pdu(&mut pdu, &PduHeader::H2CTermReq(t), &[], p.dg);
                }
                1 => {
                    let req = IcReq { pfv: s.u16() & 1, hpda: s.u8() & 1, hdgst: s.bool(), ddgst: s.bool(), maxr2t: s.u32() };
                    encode_pdu(&mut pdu, &PduHeader::IcReq(req), &[], Digests::default());
                }
                _ => {
                    // Keep-alive and connect timeouts.
                    self.now += Duration::from_secs(s.u8() as u64);
                    p.conn.tick(self.now);
                    let out = p.conn.take_output();
                    p.collect_output(&out);
                    return;
                }
            },
            _ => {
                // A raw 64-byte SQE: every field the generator does not vary.
                let sqe = Sqe::from_bytes(&padded::<64>(s.bytes(64))).expect("64 bytes");
                let n = s.pick(4) * 512;
                encode_pdu(&mut pdu, &PduHeader::CapsuleCmd(CapsuleCmd { sqe }), &payload(n, 3), p.dg);
            }
        }
        // High bits: corrupt one byte, and/or deliver the PDU in two reads.
        if op & 0x80 != 0 && !pdu.is_empty() {
            let at = s.u16() as usize % pdu.len();
            pdu[at] ^= s.u8() | 1;
        }
        let split = if op & 0x40 != 0 { s.u16() as usize } else { 0 };
        p.deliver(&pdu, split, self.now, self.engine);
    }
}

fn padded<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out[..b.len().min(N)].copy_from_slice(&b[..b.len().min(N)]);
    out
}

/// H2CData for the last R2T the target sent: right, or wrong in one field.
fn h2c_data(s: &mut Script, r2t: Option<R2T>, dg: Digests, out: &mut Vec<u8>) {
    let r = r2t.unwrap_or(R2T { cccid: s.pick(8) as u16, ttag: s.pick(4) as u16, r2to: 0, r2tl: 512 });
    let mut h = H2CData { cccid: r.cccid, ttag: r.ttag, datao: r.r2to, datal: r.r2tl, last: true };
    match s.pick(8) {
        0..=2 => {}
        3 => h.ttag = h.ttag.wrapping_add(1 + s.pick(3) as u16),
        4 => h.cccid = h.cccid.wrapping_add(1),
        5 => h.datao = h.datao.wrapping_add(s.u16() as u32),
        6 => h.datal = if s.bool() { s.u32().max(1) } else { (s.u16() as u32 % 8192).max(1) },
        _ => {
            // Half of the R2T now; a later step may send the rest.
            h.datal = (h.datal / 2).max(1);
            h.last = false;
        }
    }
    // Beyond 16 KiB DATAL no longer matches the bytes sent: also a case to handle.
    let data = payload(h.datal.min(16384) as usize, r.cccid);
    encode_pdu(out, &PduHeader::H2CData(h), &data, dg);
}
