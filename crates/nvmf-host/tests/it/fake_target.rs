//! The queue pair against a scripted fake target on a loopback listener: ICReq/ICResp, Connect,
//! an R2T answered in MAXH2CDATA-sized H2CData chunks, C2HData with the SUCCESS flag (no
//! CapsuleResp follows), an error status decoded to its name, and a C2HTermReq that must come
//! back as an error, not a panic or a hang; with `disable_sqflow`, Connect asks for SQ flow
//! control to be disabled (CATTR bit 2), which is what entitles a target to the SUCCESS flag.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

use nvmf_host::{Completion, ConnectOptions, Error, IoQueue, IoQueueParams};
use nvmf_proto::fabrics::{ConnectCmd, CATTR_DISABLE_SQFLOW};
use nvmf_proto::pdu::{encode_pdu, fes, C2HData, CapsuleResp, IcResp, TermReq, R2T};
use nvmf_proto::{Cqe, Digests, Framer, PduHeader, Role, Status};

const MAXH2CDATA: u32 = 4096;

/// The target's end of the connection, driven by the test script.
struct Peer {
    s: TcpStream,
    buf: Vec<u8>,
    framer: Framer,
    dg: Digests,
}

impl Peer {
    fn recv(&mut self) -> (PduHeader, Vec<u8>) {
        loop {
            if let Some(f) = self.framer.next(&self.buf).expect("host sent a valid PDU") {
                assert!(f.data_digest_ok, "host data digest");
                let data = self.buf[f.data.clone()].to_vec();
                self.buf.drain(..f.len);
                return (f.header, data);
            }
            let mut chunk = [0u8; 65536];
            let n = self.s.read(&mut chunk).expect("read");
            assert!(n > 0, "host closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn send(&mut self, hdr: PduHeader, data: &[u8]) {
        let mut out = Vec::new();
        encode_pdu(&mut out, &hdr, data, self.dg);
        self.s.write_all(&out).expect("write");
    }

    fn respond(&mut self, cid: u16, status: Status, result: u64) {
        let cqe = Cqe { result, cid, status, ..Default::default() };
        self.send(PduHeader::CapsuleResp(CapsuleResp { cqe }), &[]);
    }

    /// ICReq/ICResp then the I/O queue Connect, whose CATTR must be `cattr`.
    fn accept(listener: &TcpListener, cattr: u8) -> Peer {
        let (s, _) = listener.accept().unwrap();
        let mut p = Peer { s, buf: Vec::new(), framer: Framer::new(Role::Target, 1 << 20), dg: Digests::default() };
        let (PduHeader::IcReq(req), _) = p.recv() else { panic!("expected ICReq") };
        assert_eq!((req.hpda, req.maxr2t), (0, 0), "Linux-compatible ICReq");
        let resp = IcResp { pfv: 0, cpda: 0, hdgst: req.hdgst, ddgst: req.ddgst, maxh2cdata: MAXH2CDATA };
        p.send(PduHeader::IcResp(resp), &[]);
        p.dg = Digests { header: req.hdgst, data: req.ddgst };
        p.framer.digests = p.dg;
        let (PduHeader::CapsuleCmd(c), data) = p.recv() else { panic!("expected Connect") };
        assert_eq!(data.len(), 1024, "Connect data travels in the capsule");
        assert_eq!(c.sqe.sgl().sgl_type, 0x01);
        assert_eq!(u16::from_le_bytes([data[16], data[17]]), 7, "Connect names the controller's cntlid");
        assert_eq!(ConnectCmd::from_sqe(&c.sqe).cattr, cattr, "Connect's queue attributes");
        p.respond(c.sqe.cid(), Status::SUCCESS, 7);
        p
    }
}

fn params(addr: std::net::SocketAddr, digests: bool, disable_sqflow: bool) -> IoQueueParams {
    let mut opts = ConnectOptions::new(addr.to_string(), "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-4333-8444-555555555555");
    opts.hdr_digest = digests;
    opts.data_digest = digests;
    opts.disable_sqflow = disable_sqflow;
    opts.kato_ms = 0;
    opts.timeout = Duration::from_secs(5);
    // In-capsule size 0: every write goes through R2T.
    IoQueueParams { opts, subnqn: "nqn.test".into(), cntlid: 7, in_capsule: 0 }
}

fn wait_one(q: &mut IoQueue) -> Result<Completion, Error> {
    let mut done = Vec::new();
    for _ in 0..100 {
        q.poll(Duration::from_millis(50), &mut done)?;
        if let Some(c) = done.pop() {
            return Ok(c);
        }
    }
    panic!("no completion");
}

fn script(digests: bool, disable_sqflow: bool) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let target = thread::spawn(move || {
        let mut p = Peer::accept(&listener, if disable_sqflow { CATTR_DISABLE_SQFLOW } else { 0 });

        // Write of 12 KiB: one R2T for everything, as Linux nvmet does; the host must answer
        // with three 4 KiB H2CData PDUs, the last flagged LAST_PDU.
        let (PduHeader::CapsuleCmd(c), data) = p.recv() else { panic!("expected write") };
        assert!(data.is_empty(), "no in-capsule data when the capsule holds none");
        assert_eq!(c.sqe.sgl().sgl_type, 0x5A);
        assert_eq!(c.sqe.sgl().length, 12288);
        let cid = c.sqe.cid();
        p.send(PduHeader::R2T(R2T { cccid: cid, ttag: 0x33, r2to: 0, r2tl: 12288 }), &[]);
        let mut got = Vec::new();
        for i in 0..3u32 {
            let (PduHeader::H2CData(h), d) = p.recv() else { panic!("expected H2CData") };
            assert_eq!((h.cccid, h.ttag, h.datao, h.datal), (cid, 0x33, i * 4096, 4096));
            assert_eq!(h.last, i == 2);
            got.extend_from_slice(&d);
        }
        assert!(got.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8), "written bytes arrive intact");
        p.respond(cid, Status::SUCCESS, 0);

        // Read of 8 KiB: two C2HData, the second with LAST_PDU and SUCCESS: no CapsuleResp.
        let (PduHeader::CapsuleCmd(c), _) = p.recv() else { panic!("expected read") };
        let cid = c.sqe.cid();
        let payload: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
        p.send(PduHeader::C2HData(C2HData { cccid: cid, datao: 0, datal: 4096, last: false, success: false }), &payload[..4096]);
        p.send(PduHeader::C2HData(C2HData { cccid: cid, datao: 4096, datal: 4096, last: true, success: true }), &payload[4096..]);

        // A read of an LBA out of range.
        let (PduHeader::CapsuleCmd(c), _) = p.recv() else { panic!("expected read") };
        p.respond(c.sqe.cid(), Status::LBA_OUT_OF_RANGE.with_dnr(), 0);

        // Then the target gives up on the connection.
        let (PduHeader::CapsuleCmd(_), _) = p.recv() else { panic!("expected read") };
        let t = TermReq { fes: fes::DATA_OUT_OF_RANGE, fei: 0, header: vec![0; 24] };
        p.send(PduHeader::C2HTermReq(t), &[]);
    });

    let mut q = IoQueue::connect(&params(addr, digests, disable_sqflow), 1, 4, 16384).expect("connect");
    assert_eq!(q.qid(), 1);
    q.set_namespace(1, 512);
    for (i, b) in q.buffer(2)[..12288].iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    q.submit_write(2, 100, 24).unwrap();
    q.commit().unwrap();
    let c = wait_one(&mut q).unwrap();
    assert_eq!(c.tag, 2);
    c.result.expect("write succeeds");

    q.submit_read(3, 0, 16).unwrap();
    q.commit().unwrap();
    let c = wait_one(&mut q).unwrap();
    assert_eq!(c.tag, 3);
    c.result.expect("SUCCESS flag completes the read");
    assert!(q.buffer(3)[..8192].iter().enumerate().all(|(i, &b)| b == (i as u32 * 7) as u8));

    q.submit_read(0, 1 << 40, 1).unwrap();
    q.commit().unwrap();
    let err = wait_one(&mut q).unwrap().result.unwrap_err();
    assert!(err.to_string().contains("Read failed: the target answered LBA Out of Range"), "{err}");

    q.submit_read(1, 0, 1).unwrap();
    q.commit().unwrap();
    let err = wait_one(&mut q).unwrap_err();
    assert!(matches!(err, Error::TermReq { fes: fes::DATA_OUT_OF_RANGE, .. }), "{err}");
    assert!(err.to_string().contains("Data Transfer Out of Range"), "{err}");
    target.join().unwrap();
}

#[test]
fn r2t_success_flag_status_and_termreq_without_digests() {
    script(false, false);
}

#[test]
fn r2t_success_flag_status_and_termreq_with_both_digests() {
    script(true, false);
}

#[test]
fn connect_asks_to_disable_sq_flow_control_when_told() {
    script(false, true);
}

#[test]
fn hostile_icresp_is_an_error_not_a_panic() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let target = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut icreq = [0u8; 128];
        s.read_exact(&mut icreq).unwrap();
        // MAXH2CDATA 100 is below the 4096 minimum.
        let mut out = Vec::new();
        let resp = IcResp { pfv: 0, cpda: 0, hdgst: false, ddgst: false, maxh2cdata: 100 };
        encode_pdu(&mut out, &PduHeader::IcResp(resp), &[], Digests::default());
        s.write_all(&out).unwrap();
        let (mut s, _) = listener.accept().unwrap();
        s.read_exact(&mut icreq).unwrap();
        // Garbage instead of an ICResp.
        s.write_all(&[0xFF; 128]).unwrap();
        let _ = s.read(&mut icreq);
    });
    let err = IoQueue::connect(&params(addr, false, false), 1, 1, 4096).err().expect("refused");
    assert!(err.to_string().contains("MAXH2CDATA"), "{err}");
    let err = IoQueue::connect(&params(addr, false, false), 1, 1, 4096).err().expect("refused");
    assert!(matches!(err, Error::Protocol(_)), "{err}");
    target.join().unwrap();
}
