//! Our host (nvmf-host) against a hostile target, with no socket: the host's queue pairs run
//! over a [`Link`] that holds the target's bytes in memory.
//!
//! The input is a script for the target's side of one connection: an ICResp, then responses,
//! C2HData, R2Ts, TermReqs and raw bytes, mostly for the commands the host really has in
//! flight, with fields right or wrong, optionally one byte flipped. The link gives the host
//! those bytes, then the end of the stream, and drops what the host sends. The host runs one
//! of three sessions: an I/O queue (Connect, two reads, a write through R2T, a flush), an admin
//! controller (Connect, properties, CC.EN, Identify, log page, shutdown), or discovery.
//!
//! What must hold: no panic; every call returns (the stream ends, so a host that keeps
//! waiting is hung); the host drops its link; and a read the host reports successful holds
//! exactly the bytes the target sent for it (no stale or missing data passes as read).

use crate::script::{pattern, Script};
use nvmf_host::{discover_over, Completion, ConnectOptions, Controller, Error, IoQueue, IoQueueParams, Link};
use nvmf_proto::nvme::Status;
use nvmf_proto::pdu::{encode_pdu, fes, C2HData, CapsuleResp, IcResp, TermReq, R2T};
use nvmf_proto::{Cqe, Digests, PduHeader};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

const SUBNQN: &str = "nqn.2024-01.io.nvmflab:fuzz";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-4000-8000-000000000002";
/// PDUs per script: bounds the work one input can ask for.
const MAX_PDUS: usize = 128;
/// The I/O session's commands, by tag: read 64 KiB (large enough that its C2HData payloads
/// land straight in the buffer), write 8 KiB (through R2T), read 512 B, flush.
const IO_READ_LENS: [usize; 4] = [65536, 0, 512, 0];
const IO_WRITE_LEN: usize = 8192;
/// Largest I/O of the session's queue (its buffers' size).
const IO_MAX: usize = 65536;
/// Admin reads (Identify, log pages) are on tag 0.
const ADMIN_READ_LENS: [usize; 4] = [4096, 0, 0, 0];
/// Longest the host may legitimately wait for anything here (the stream always ends).
const HOST_TIMEOUT: Duration = Duration::from_secs(5);

pub fn run(input: &[u8]) {
    let mut s = Script::new(input);
    let setup = s.u8();
    let (hdgst, ddgst) = (setup & 1 != 0, setup & 2 != 0);
    let session = (setup >> 2) & 3;
    let read_lens = if session < 2 { IO_READ_LENS } else { ADMIN_READ_LENS };
    let stream = TargetScript::new(&mut s, hdgst, ddgst, read_lens).generate();

    let dropped = Arc::new(AtomicBool::new(false));
    let link = Box::new(ScriptLink { bytes: stream.bytes, pos: 0, dropped: dropped.clone() });
    let mut opts = ConnectOptions::new("memory", HOSTNQN);
    opts.hdr_digest = hdgst;
    opts.data_digest = ddgst;
    opts.kato_ms = 0;
    opts.timeout = HOST_TIMEOUT;
    match session {
        0 | 1 => io_session(link, &opts, stream.tainted),
        2 => {
            if let Ok(ctrl) = Controller::connect_over(link, &opts, SUBNQN) {
                let _ = ctrl.identify_namespace(1);
                let _ = ctrl.active_namespaces();
                let _ = ctrl.get_log_page(0x02, 0, 512);
                let _ = ctrl.shutdown();
            }
        }
        _ => {
            let _ = discover_over(link, &opts);
        }
    }
    // Everything of the host is dropped, its link included.
    assert!(dropped.load(Relaxed), "the host did not close its connection after the session");
}

fn io_session(link: Box<dyn Link>, opts: &ConnectOptions, tainted: bool) {
    let params = IoQueueParams { opts: opts.clone(), subnqn: SUBNQN.into(), cntlid: 1, in_capsule: 0 };
    let Ok(mut q) = IoQueue::connect_over(link, &params, 1, 4, IO_MAX) else { return };
    for (tag, &len) in IO_READ_LENS.iter().enumerate() {
        // Bytes the target never sent: a read that "succeeds" with them is a mis-verification.
        for (i, b) in q.buffer(tag as u16)[..len].iter_mut().enumerate() {
            *b = !pattern(tag as u16, i);
        }
    }
    let submitted = q.submit_read(0, 0, 128).and_then(|_| {
        q.submit_write(1, 0, 16)?;
        q.submit_read(2, 8, 1)?;
        q.submit_flush(3)?;
        q.commit()
    });
    if submitted.is_err() {
        return;
    }
    let mut outstanding = 4;
    let mut done: Vec<Completion> = Vec::new();
    while outstanding > 0 {
        match q.poll(HOST_TIMEOUT, &mut done) {
            Err(e) => {
                assert!(!e.to_string().is_empty());
                return;
            }
            Ok(()) => assert!(!done.is_empty(), "the host kept waiting on a connection the target had closed"),
        }
        for c in done.drain(..) {
            outstanding -= 1;
            let len = IO_READ_LENS[c.tag as usize];
            if c.result.is_ok() && len > 0 && !tainted {
                let buf = &q.buffer(c.tag)[..len];
                let bad = (0..len).find(|&i| buf[i] != pattern(c.tag, i));
                assert_eq!(bad, None, "read on tag {} reported success with bytes the target never sent", c.tag);
            }
        }
    }
}

/// The target's byte stream, and whether it may carry read data other than the pattern
/// (raw bytes, a flipped byte), which turns the read-data check off.
struct Stream {
    bytes: Vec<u8>,
    tainted: bool,
}

struct TargetScript<'s, 'a> {
    s: &'s mut Script<'a>,
    dg: Digests,
    read_lens: [usize; 4],
    /// Next C2HData offset per tag, as a well-behaved target would send it.
    next: [usize; 5],
    out: Stream,
}

impl<'s, 'a> TargetScript<'s, 'a> {
    fn new(s: &'s mut Script<'a>, hdgst: bool, ddgst: bool, read_lens: [usize; 4]) -> Self {
        TargetScript { s, dg: Digests { header: hdgst, data: ddgst }, read_lens, next: [0; 5], out: Stream { bytes: Vec::new(), tainted: false } }
    }

    fn generate(mut self) -> Stream {
        self.icresp();
        // The Connect response (tag 0), usually right.
        let status = if self.s.u8() < 0xF0 { Status::SUCCESS } else { Status::from_u16(self.s.u16()) };
        let cqe = Cqe { result: self.s.u16() as u64, cid: 0, status, ..Default::default() };
        self.pdu(PduHeader::CapsuleResp(CapsuleResp { cqe }), &[]);
        for _ in 0..MAX_PDUS {
            if self.s.is_empty() {
                break;
            }
            self.step();
        }
        self.out
    }

    fn icresp(&mut self) {
        let v = self.s.u8();
        let maxh2cdata = match v & 7 {
            0..=3 => 4096,
            4 => 65536,
            5 => 4095,
            6 => 0,
            _ => self.s.u32(),
        };
        let (mut hdgst, mut ddgst) = (self.dg.header, self.dg.data);
        if v & 0x08 != 0 {
            hdgst = !hdgst;
        }
        if v & 0x10 != 0 {
            ddgst = !ddgst;
        }
        let pfv = if v & 0x20 != 0 { 1 } else { 0 };
        let resp = IcResp { pfv, cpda: 0, hdgst, ddgst, maxh2cdata };
        encode_pdu(&mut self.out.bytes, &PduHeader::IcResp(resp), &[], Digests::default());
    }

    fn pdu(&mut self, hdr: PduHeader, data: &[u8]) {
        encode_pdu(&mut self.out.bytes, &hdr, data, self.dg);
    }

    fn tag(&mut self) -> u16 {
        // Mostly tags in flight; 4 and 0xFFFF are not.
        match self.s.pick(8) {
            0..=3 => self.s.pick(4) as u16,
            4..=5 => 0,
            6 => 4,
            _ => 0xFFFF,
        }
    }

    fn step(&mut self) {
        let op = self.s.u8();
        let start = self.out.bytes.len();
        match op % 8 {
            0 | 1 => {
                let cid = self.tag();
                let status = match self.s.pick(4) {
                    0..=2 => Status::SUCCESS,
                    _ => Status::from_u16(self.s.u16()),
                };
                let cqe = Cqe { result: self.s.u64(), cid, status, sqhd: self.s.u16(), ..Default::default() };
                self.pdu(PduHeader::CapsuleResp(CapsuleResp { cqe }), &[]);
            }
            2..=4 => self.c2h_data(op & 0x40 != 0),
            5 => {
                let cid = self.tag();
                let (r2to, r2tl) = match self.s.pick(4) {
                    0 | 1 => (0, IO_WRITE_LEN as u32),
                    2 => (4096, 4096),
                    _ => (self.s.u32(), self.s.u32()),
                };
                let ttag = self.s.u16();
                self.pdu(PduHeader::R2T(R2T { cccid: cid, ttag, r2to, r2tl }), &[]);
            }
            6 => {
                let t = TermReq { fes: [fes::INVALID_PDU_HDR, fes::HDR_DIGEST_ERR, 0x77][self.s.pick(3)], fei: self.s.u32(), header: vec![0; self.s.pick(160)] };
                self.pdu(PduHeader::C2HTermReq(t), &[]);
            }
            _ => {
                let n = self.s.pick(128);
                let raw = self.s.bytes(n).to_vec();
                self.out.bytes.extend_from_slice(&raw);
                self.out.tainted = true;
            }
        }
        if op & 0x80 != 0 && self.out.bytes.len() > start {
            let at = start + self.s.u16() as usize % (self.out.bytes.len() - start);
            self.out.bytes[at] ^= self.s.u8() | 1;
            self.out.tainted = true;
        }
    }

    /// C2HData for a tag: the next chunk of its read (pattern data), or data from the input.
    fn c2h_data(&mut self, raw_data: bool) {
        let cid = self.tag();
        let slot = (cid as usize).min(4);
        let want = self.read_lens.get(cid as usize).copied().unwrap_or(0);
        let datao = if self.s.pick(4) > 0 { self.next[slot] } else { self.s.u16() as usize };
        let datal = match self.s.pick(5) {
            0 | 1 => want.saturating_sub(datao).max(1),
            2 => 512,
            3 => 1,
            _ => self.s.u16() as usize % 9000 + 1,
        };
        let flags = self.s.u8();
        let last = if flags & 1 == 0 { datao + datal >= want } else { flags & 2 != 0 };
        let success = last && flags & 4 != 0;
        let data: Vec<u8> = if raw_data {
            self.out.tainted = true;
            let mut d = self.s.bytes(datal).to_vec();
            d.resize(datal, 0);
            d
        } else {
            (0..datal).map(|i| pattern(cid, datao + i)).collect()
        };
        self.next[slot] = datao + datal;
        let hdr = C2HData { cccid: cid, datao: datao as u32, datal: datal as u32, last, success };
        self.pdu(PduHeader::C2HData(hdr), &data);
    }
}

/// The target's side of the connection: the script's bytes, in fragments of varying size (as
/// a socket hands them over), then the end of the stream (the host must not wait beyond it);
/// what the host sends is dropped. `dropped` is set when the host lets go of its connection.
struct ScriptLink {
    bytes: Vec<u8>,
    pos: usize,
    dropped: Arc<AtomicBool>,
}

impl Link for ScriptLink {
    fn recv(&mut self, buf: &mut [u8]) -> nvmf_host::Result<usize> {
        // Fragment sizes 1..=6000 from the position: deterministic, so replays repeat.
        let fragment = 1 + (self.pos.wrapping_mul(2_654_435_761) >> 7) % 6000;
        let n = buf.len().min(self.bytes.len() - self.pos).min(fragment);
        if n == 0 {
            return Err(Error::Closed); // as a socket's read of 0 bytes says
        }
        buf[..n].copy_from_slice(&self.bytes[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }

    fn send(&mut self, buf: &[u8]) -> nvmf_host::Result<usize> {
        Ok(buf.len())
    }

    fn wait(&self, _timeout: Duration, _writing: bool) -> nvmf_host::Result<()> {
        Ok(())
    }
}

impl Drop for ScriptLink {
    fn drop(&mut self) {
        self.dropped.store(true, Relaxed);
    }
}
