//! H2CData and in-capsule write payloads received straight into their command buffer (the
//! connection's `recv_slices`): fed in arbitrary fragments, with header and data digests on or
//! off, every byte must reach the namespace, every digest the target sends must hold, and a
//! damaged data digest must fail its command with Transient Transport Error (NVMe/TCP 7.4.6.x)
//! while the connection goes on.

use crate::common;

use common::{Queue, HOST, SUB};
use nvmf_proto::fabrics::ConnectCmd;
use nvmf_proto::nvme::{io_opcode, SglDescriptor};
use nvmf_proto::pdu::{encode_pdu, CapsuleCmd, H2CData, IcReq};
use nvmf_proto::{Cqe, Digests, Framer, PduHeader, Role, Sqe, Status};
use nvmf_target::backend::IoEngine;
use nvmf_target::config::{BackendConfig, ReactorMode};
use nvmf_target::core::Target;
use nvmf_target::reactor::{drive, drive_and_take_output};
use nvmf_target::stats::ReactorStats;
use nvmf_target::transport::tcp::Connection;
use proptest::prelude::*;
use std::sync::Arc;
use std::time::Instant;

const BLOCK: usize = 512;
const DISK: usize = 1 << 20;
const IN_CAPSULE: u32 = 32 << 10;
const MAXH2CDATA: u32 = 8 << 10;

/// I/O queue `qid` with the digests asked for, fed through `recv_slices` in the fragment sizes
/// given, with the connection processing between fragments as a reactor does between reads.
struct Io {
    conn: Connection,
    engine: IoEngine,
    dg: Digests,
    framer: Framer,
    rx: Vec<u8>,
    now: Instant,
    cuts: Vec<usize>,
    next_cut: usize,
}

impl Io {
    fn open(target: &Arc<Target>, cntlid: u16, qid: u16, dg: Digests, land_min: usize, cuts: Vec<usize>) -> Io {
        let now = Instant::now();
        let mut conn = Connection::new(target.clone(), None, now);
        conn.land_payloads_from(land_min);
        let framer = Framer::new(Role::Host, 4 << 20);
        let mut io = Io { conn, engine: IoEngine::new(16), dg: Digests::default(), framer, rx: Vec::new(), now, cuts, next_cut: 0 };
        io.send(PduHeader::IcReq(IcReq { pfv: 0, hpda: 0, hdgst: dg.header, ddgst: dg.data, maxr2t: 15 }), &[]);
        assert!(matches!(io.recv(), Some((PduHeader::IcResp(_), _))));
        io.dg = dg;
        io.framer.digests = dg;
        let mut sqe = ConnectCmd { recfmt: 0, qid, sqsize: 31, cattr: 0, kato: 0 }.to_sqe(1);
        sqe.set_sgl(SglDescriptor::in_capsule(0, 1024));
        let data = nvmf_proto::fabrics::ConnectData { hostid: [3; 16], cntlid, subnqn: SUB.into(), hostnqn: HOST.into() }.encode();
        io.send(PduHeader::CapsuleCmd(CapsuleCmd { sqe }), &data);
        let cqe = io.response();
        assert_eq!(cqe.status, Status::SUCCESS, "I/O Connect");
        io.conn.attach(0, &ReactorStats::new(0, 0, ReactorMode::Event, 0));
        io
    }

    /// Delivers `bytes` in fragments of the drawn sizes (from the first), processing after each.
    fn deliver(&mut self, mut bytes: &[u8]) {
        self.next_cut = 0;
        while !bytes.is_empty() {
            let cut = self.cuts[self.next_cut % self.cuts.len()].min(bytes.len());
            self.next_cut += 1;
            let took = self.conn.receive(&bytes[..cut]);
            assert!(took > 0, "no room for input after processing");
            bytes = &bytes[took..];
            drive(&mut self.conn, self.now, &mut self.engine);
        }
        self.rx.extend_from_slice(&drive_and_take_output(&mut self.conn, self.now, &mut self.engine));
    }

    fn pdu(&self, hdr: PduHeader, data: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        encode_pdu(&mut b, &hdr, data, self.dg);
        b
    }

    fn send(&mut self, hdr: PduHeader, data: &[u8]) {
        let b = self.pdu(hdr, data);
        self.deliver(&b);
    }

    /// The next PDU the target sent; its data digest must hold.
    fn recv(&mut self) -> Option<(PduHeader, Vec<u8>)> {
        let f = self.framer.next(&self.rx).expect("the target sent a valid PDU")?;
        assert!(f.data_digest_ok, "the target sent a wrong data digest");
        let data = self.rx[f.data.clone()].to_vec();
        self.rx.drain(..f.len);
        Some((f.header, data))
    }

    fn response(&mut self) -> Cqe {
        match self.recv() {
            Some((PduHeader::CapsuleResp(r), _)) => r.cqe,
            other => panic!("a response expected, got {other:?}"),
        }
    }

    /// Writes `data` at block `slba`, in the capsule or through R2T/H2CData; `damage` flips a
    /// bit of the data digest of the capsule or of that H2CData PDU.
    fn write(&mut self, cid: u16, slba: u64, data: &[u8], in_capsule: bool, damage: Option<usize>) -> Cqe {
        let nlb = (data.len() / BLOCK) as u16;
        let sgl = if in_capsule {
            SglDescriptor::in_capsule(0, data.len() as u32)
        } else {
            SglDescriptor::transport(data.len() as u32)
        };
        let sqe = rw_sqe(io_opcode::WRITE, cid, slba, nlb, sgl);
        if in_capsule {
            let mut b = self.pdu(PduHeader::CapsuleCmd(CapsuleCmd { sqe }), data);
            if damage.is_some() {
                let n = b.len();
                b[n - 1] ^= 0x20;
            }
            self.deliver(&b);
            return self.response();
        }
        self.send(PduHeader::CapsuleCmd(CapsuleCmd { sqe }), &[]);
        // MAXR2T 16 and at most 16 chunks: every R2T comes at once.
        let mut stream = Vec::new();
        let mut pdus = 0;
        while let Some((PduHeader::R2T(r), _)) = self.recv() {
            let (at, len) = (r.r2to as usize, r.r2tl as usize);
            let h2c = H2CData { cccid: cid, ttag: r.ttag, datao: r.r2to, datal: r.r2tl, last: at + len == data.len() };
            let mut b = self.pdu(PduHeader::H2CData(h2c), &data[at..at + len]);
            if damage == Some(pdus) {
                let n = b.len();
                b[n - 1] ^= 0x20;
            }
            stream.extend_from_slice(&b);
            pdus += 1;
            if at + len == data.len() {
                break;
            }
        }
        self.deliver(&stream);
        self.response()
    }

    fn read(&mut self, cid: u16, slba: u64, len: usize) -> Vec<u8> {
        let sqe = rw_sqe(io_opcode::READ, cid, slba, (len / BLOCK) as u16, SglDescriptor::transport(len as u32));
        self.send(PduHeader::CapsuleCmd(CapsuleCmd { sqe }), &[]);
        let mut got = Vec::new();
        loop {
            match self.recv() {
                Some((PduHeader::C2HData(d), bytes)) => {
                    assert_eq!(d.datao as usize, got.len());
                    got.extend_from_slice(&bytes);
                }
                Some((PduHeader::CapsuleResp(r), _)) => {
                    assert_eq!(r.cqe.status, Status::SUCCESS, "read");
                    return got;
                }
                other => panic!("read data expected, got {other:?}"),
            }
        }
    }
}

fn rw_sqe(opcode: u8, cid: u16, slba: u64, nlb: u16, sgl: SglDescriptor) -> Sqe {
    let mut s = Sqe::new(opcode, cid);
    s.set_nsid(1);
    s.set_slba(slba);
    s.set_nlb(nlb - 1);
    s.set_sgl(sgl);
    s
}

fn target() -> Arc<Target> {
    common::target(BackendConfig::Ram { size: DISK as u64 }, |s| {
        s.in_capsule_data_size = IN_CAPSULE;
        s.maxh2cdata = MAXH2CDATA;
    })
}

/// One write of the sequence: where, how long, how it travels, whether a digest is damaged.
#[derive(Debug, Clone)]
struct Write {
    slba: u64,
    blocks: usize,
    in_capsule: bool,
    seed: u8,
    damage: Option<usize>,
}

fn writes() -> impl Strategy<Value = Vec<Write>> {
    let one = (0u64..(DISK / BLOCK) as u64, 1usize..=256, any::<bool>(), any::<u8>(), prop::option::weighted(0.2, 0usize..16));
    prop::collection::vec(one, 1..6).prop_map(|v| {
        v.into_iter()
            .map(|(slba, blocks, in_capsule, seed, damage)| {
                // In-capsule writes up to IN_CAPSULE; the disk's end bounds every write.
                let max = if in_capsule { IN_CAPSULE as usize / BLOCK } else { 256 };
                let blocks = blocks.min(max).min(DISK / BLOCK - slba as usize);
                Write { slba, blocks, in_capsule, seed, damage }
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn payloads_in_any_fragments_land_whole_with_every_digest_checked(
        hdgst in any::<bool>(),
        ddgst in any::<bool>(),
        land_min in prop_oneof![Just(1usize), 1usize..16384, Just(16384)],
        cuts in prop::collection::vec(prop_oneof![1usize..64, 1usize..9000, 9000usize..70000], 1..24),
        writes in writes(),
    ) {
        let t = target();
        let (_admin, cntlid) = Queue::admin(&t);
        let dg = Digests { header: hdgst, data: ddgst };
        let mut io = Io::open(&t, cntlid, 1, dg, land_min, cuts);
        let mut disk = vec![0u8; DISK];
        for (i, w) in writes.iter().enumerate() {
            let cid = 10 + i as u16;
            let len = w.blocks * BLOCK;
            let data: Vec<u8> = (0..len).map(|k| (k as u8).wrapping_mul(31).wrapping_add(w.seed)).collect();
            let chunks = len.div_ceil(MAXH2CDATA as usize);
            let damage = w.damage.filter(|&d| ddgst && (w.in_capsule || d < chunks));
            let cqe = io.write(cid, w.slba, &data, w.in_capsule, damage);
            prop_assert_eq!(cqe.cid, cid);
            if damage.is_some() {
                prop_assert_eq!(cqe.status, Status::TRANSIENT_TRANSPORT_ERROR, "damaged data digest");
            } else {
                prop_assert_eq!(cqe.status, Status::SUCCESS, "write {:?}", w);
                let at = w.slba as usize * BLOCK;
                disk[at..at + len].copy_from_slice(&data);
            }
            prop_assert!(!io.conn.should_close(), "the connection goes on");
        }
        for (i, w) in writes.iter().enumerate() {
            let at = w.slba as usize * BLOCK;
            let len = w.blocks * BLOCK;
            let got = io.read(100 + i as u16, w.slba, len);
            prop_assert!(got == disk[at..at + len], "bytes of write {} at block {}", i, w.slba);
        }
    }
}

/// From the threshold on (16 KiB here; the target's default, 128 KiB, is beyond this test's
/// sizes) payloads land, none copied whole; smaller ones are copied.
#[test]
fn large_payloads_land_and_small_ones_are_copied() {
    let t = target();
    let (_admin, cntlid) = Queue::admin(&t);
    // Fragments as a socket gives them: a header comes with a little data, the rest later.
    let mut io = Io::open(&t, cntlid, 1, Digests { header: true, data: true }, 16 << 10, vec![100, 65536]);
    let data = vec![0xA5u8; 32 << 10];
    let before = io.conn.landed_bytes();
    assert_eq!(io.write(1, 0, &data, true, None).status, Status::SUCCESS);
    assert_eq!(io.conn.landed_bytes() - before, data.len() as u64, "a 32 KiB in-capsule payload lands");
    let small = vec![0x5Au8; 4096];
    let before = io.conn.landed_bytes();
    assert_eq!(io.write(2, 64, &small, true, None).status, Status::SUCCESS);
    assert_eq!(io.conn.landed_bytes(), before, "a 4 KiB payload is copied");
    assert_eq!(io.read(3, 0, data.len()), data);
    assert_eq!(io.read(4, 64, small.len()), small);

    // H2CData: every PDU of a 64 KiB write through R2T lands (8 KiB each here): each read takes
    // the rest of one payload and, in the room after it, the next header.
    let mut io = Io::open(&t, cntlid, 2, Digests::default(), 8 << 10, vec![100, 9000]);
    let data: Vec<u8> = (0..64 << 10).map(|k: usize| (k / 7) as u8).collect();
    assert_eq!(io.write(5, 256, &data, false, None).status, Status::SUCCESS);
    assert_eq!(io.conn.landed_bytes(), data.len() as u64, "every H2CData payload lands");
    assert_eq!(io.read(6, 256, data.len()), data);
}
