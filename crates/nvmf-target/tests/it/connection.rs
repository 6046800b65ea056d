//! Drives the sans-I/O connection with hand-built PDUs (nvmf-proto encoders) and checks the
//! PDUs it answers with.

use nvmf_proto::fabrics::{
    fctype, reg, ConnectCmd, ConnectData, PropertyGet, PropertySet, CATTR_DISABLE_SQFLOW, CNTLID_DYNAMIC, DISCOVERY_NQN,
};
use nvmf_proto::identify::{IdentifyController, IdentifyNamespace};
use nvmf_proto::nvme::{admin_opcode, io_opcode, SglDescriptor};
use nvmf_proto::pdu::{encode_pdu, fes, CapsuleCmd, H2CData, IcReq};
use nvmf_proto::{Cqe, Digests, Framer, PduHeader, Role, Sqe, Status};
use nvmf_target::backend::IoEngine;
use nvmf_target::config::{BackendConfig, NamespaceConfig, PortConfig, SubsystemConfig, TargetConfig};
use nvmf_target::core::Target;
use nvmf_target::reactor::{drive, drive_and_take_output};
use nvmf_target::transport::tcp::{Connection, RESPONSE_GROUP};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SUB_A: &str = "nqn.2024-01.io.nvmflab:a";
const SUB_B: &str = "nqn.2024-01.io.nvmflab:b";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:host1";

/// Subsystem A (ram nsid 1, null nsid 2) open to any host, subsystem B for another host only.
fn target() -> Arc<Target> {
    target_with(|_| {})
}

/// `target()` with other settings (in-capsule size, MAXH2CDATA), validated like a config file.
fn target_with(settings: impl FnOnce(&mut nvmf_target::config::TargetSettings)) -> Arc<Target> {
    let mut c = TargetConfig::empty();
    c.ports.push(PortConfig { addr: "127.0.0.1:4420".parse().unwrap(), portid: None, subsystems: None, tls: Default::default() });
    let mut a = SubsystemConfig::new(SUB_A);
    a.namespaces.push(NamespaceConfig {
        nsid: 1,
        backend: BackendConfig::Ram { size: 8 << 20 },
        block_size: 512,
        nguid: None,
        uuid: None,
    });
    a.namespaces.push(NamespaceConfig {
        nsid: 2,
        backend: BackendConfig::Null { size: 1 << 30 },
        block_size: 4096,
        nguid: None,
        uuid: None,
    });
    let mut b = SubsystemConfig::new(SUB_B);
    b.allow_any_host = false;
    b.hosts = vec!["nqn.other-host".into()];
    c.subsystems = vec![a, b];
    settings(&mut c.target);
    c.validate("test").unwrap();
    let ports: Vec<_> = c.ports.clone();
    Arc::new(Target::new(c.target.clone(), &c.subsystems, &ports).unwrap())
}

/// One host-side connection with a fake clock.
struct Host {
    conn: Connection,
    engine: IoEngine,
    framer: Framer,
    dg: Digests,
    now: Instant,
    rx: Vec<u8>,
    cid: u16,
}

impl Host {
    fn new(target: Arc<Target>) -> Host {
        let now = Instant::now();
        let port = target.ports.first().cloned();
        let conn = Connection::new(target, port, now);
        let mut framer = Framer::new(Role::Host, 16 << 20);
        framer.max_data_len = 16 << 20;
        Host { conn, engine: IoEngine::new(8), framer, dg: Digests::default(), now, rx: Vec::new(), cid: 0 }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.conn.feed(bytes);
        self.rx.extend_from_slice(&drive_and_take_output(&mut self.conn, self.now, &mut self.engine));
    }

    fn send_pdu(&mut self, hdr: PduHeader, data: &[u8]) {
        let mut b = Vec::new();
        encode_pdu(&mut b, &hdr, data, self.dg);
        self.send(&b);
    }

    /// Next PDU the target sent, with its data.
    fn recv(&mut self) -> Option<(PduHeader, Vec<u8>)> {
        let f = self.framer.next(&self.rx).expect("target sent a valid PDU")?;
        let data = self.rx[f.data.clone()].to_vec();
        assert!(f.data_digest_ok);
        self.rx.drain(..f.len);
        Some((f.header, data))
    }

    fn icreq(&mut self, hdgst: bool, ddgst: bool) -> nvmf_proto::pdu::IcResp {
        self.send_pdu(PduHeader::IcReq(IcReq { pfv: 0, hpda: 0, hdgst, ddgst, maxr2t: 0 }), &[]);
        match self.recv() {
            Some((PduHeader::IcResp(r), _)) => {
                self.dg = Digests { header: r.hdgst, data: r.ddgst };
                self.framer.digests = self.dg;
                r
            }
            other => panic!("expected ICResp, got {other:?}"),
        }
    }

    /// Sends a command and collects (C2H data, response).
    fn command(&mut self, mut sqe: Sqe, data: &[u8]) -> (Vec<u8>, Cqe) {
        self.cid += 1;
        sqe.set_cid(self.cid);
        self.send_pdu(PduHeader::CapsuleCmd(CapsuleCmd { sqe }), data);
        let mut read = Vec::new();
        loop {
            match self.recv().expect("a response") {
                (PduHeader::C2HData(d), bytes) => {
                    assert_eq!(d.cccid, self.cid);
                    assert_eq!(d.datao as usize, read.len());
                    read.extend_from_slice(&bytes);
                }
                (PduHeader::CapsuleResp(r), _) => {
                    assert_eq!(r.cqe.cid, self.cid);
                    return (read, r.cqe);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    fn connect(&mut self, subnqn: &str, hostnqn: &str, qid: u16, cntlid: u16) -> Cqe {
        let mut sqe = ConnectCmd { recfmt: 0, qid, sqsize: 31, cattr: 0, kato: 5000 }.to_sqe(0);
        sqe.set_sgl(SglDescriptor::in_capsule(0, 1024));
        let data = ConnectData { hostid: [7; 16], cntlid, subnqn: subnqn.into(), hostnqn: hostnqn.into() }.encode();
        self.command(sqe, &data).1
    }

    fn prop_set(&mut self, offset: u32, value: u64) -> Cqe {
        self.command(PropertySet { size8: false, offset, value }.to_sqe(0), &[]).1
    }

    fn prop_get(&mut self, offset: u32, size8: bool) -> u64 {
        let cqe = self.command(PropertyGet { size8, offset }.to_sqe(0), &[]).1;
        assert_eq!(cqe.status, Status::SUCCESS);
        cqe.result
    }

    /// ICReq, admin Connect, attach, CC.EN = 1; returns the cntlid.
    fn admin_ready(&mut self, subnqn: &str) -> u16 {
        self.icreq(false, false);
        let cqe = self.connect(subnqn, HOST, 0, CNTLID_DYNAMIC);
        assert_eq!(cqe.status, Status::SUCCESS);
        // Processing pauses after Connect until a reactor takes the connection.
        self.attach();
        assert_eq!(self.prop_set(reg::CC, 0x46_0001).status, Status::SUCCESS);
        assert_eq!(self.prop_get(reg::CSTS, false) & 1, 1);
        cqe.result as u16
    }

    fn attach(&mut self) {
        self.conn.attach(0, &nvmf_target::stats::ReactorStats::new(0, 0, nvmf_target::config::ReactorMode::Event, 0));
        drive(&mut self.conn, self.now, &mut self.engine);
    }
}

fn admin_sqe(opcode: u8, nsid: u32, cdw10: u32, len: u32) -> Sqe {
    let mut s = Sqe::new(opcode, 0);
    s.set_nsid(nsid);
    s.set_cdw(10, cdw10);
    s.set_sgl(SglDescriptor::transport(len));
    s
}

fn rw_sqe(opcode: u8, slba: u64, nlb: u16, sgl: SglDescriptor) -> Sqe {
    let mut s = Sqe::new(opcode, 0);
    s.set_nsid(1);
    s.set_slba(slba);
    s.set_nlb(nlb - 1);
    s.set_sgl(sgl);
    s
}

/// `rw_sqe` on the null namespace (nsid 2, 4 KiB blocks) of `target()`'s subsystem A.
fn null_sqe(opcode: u8, slba: u64, nlb: u16, sgl: SglDescriptor) -> Sqe {
    let mut s = rw_sqe(opcode, slba, nlb, sgl);
    s.set_nsid(2);
    s
}

#[test]
fn icresp_fields_and_digest_negotiation() {
    let mut h = Host::new(target());
    let r = h.icreq(true, true);
    assert_eq!(r.pfv, 0);
    assert_eq!(r.cpda, 0);
    assert!(r.hdgst && r.ddgst);
    assert!(r.maxh2cdata >= 4096 && r.maxh2cdata % 4 == 0);
    // With both digests on, a full admin connect still works (digests checked by our framer).
    assert_eq!(h.connect(SUB_A, HOST, 0, CNTLID_DYNAMIC).status, Status::SUCCESS);
}

#[test]
fn admin_connect_property_handshake_and_identify() {
    let mut h = Host::new(target());
    let cntlid = h.admin_ready(SUB_A);
    assert!(cntlid >= 1);
    let cap = h.prop_get(reg::CAP, true);
    assert_eq!(cap & 0xFFFF, 1023, "MQES");
    assert!(h.prop_get(reg::VS, false) >= 0x0001_0300);
    assert_eq!(h.prop_get(reg::CC, false) & 1, 1);

    let (data, cqe) = h.command(admin_sqe(admin_opcode::IDENTIFY, 0, 1, 4096), &[]);
    assert_eq!(cqe.status, Status::SUCCESS);
    let id = IdentifyController::decode(&data).unwrap();
    assert_eq!(id.cntlid, cntlid);
    assert_eq!(id.cntrltype, 1);
    assert_eq!(id.subnqn, SUB_A);
    assert_eq!(id.ioccsz, (64 + 8192) / 16);
    assert_eq!(id.iorcsz, 1);
    assert!(id.sgls & 1 != 0 && id.sgls & (1 << 20) != 0);
    assert!(id.maxcmd > 0);
    assert_eq!(id.nn, 2);
    assert_eq!(id.oncs & 0b1100, 0b1100);

    let (data, _) = h.command(admin_sqe(admin_opcode::IDENTIFY, 2, 0, 4096), &[]);
    let ns = IdentifyNamespace::decode(&data).unwrap();
    assert_eq!(ns.lbads, 12);
    assert_eq!(ns.nsze, (1 << 30) / 4096);
    let (data1, _) = h.command(admin_sqe(admin_opcode::IDENTIFY, 1, 0, 4096), &[]);
    assert_ne!(IdentifyNamespace::decode(&data1).unwrap().nguid, ns.nguid, "NGUID unique per namespace");

    let (list, _) = h.command(admin_sqe(admin_opcode::IDENTIFY, 0, 2, 4096), &[]);
    assert_eq!(nvmf_proto::identify::decode_ns_list(&list), vec![1, 2]);
    let (descs, cqe) = h.command(admin_sqe(admin_opcode::IDENTIFY, 1, 3, 4096), &[]);
    assert_eq!(cqe.status, Status::SUCCESS);
    let d = nvmf_proto::identify::decode_ns_descriptors(&descs).unwrap();
    assert!(d.iter().any(|d| d.nidt == nvmf_proto::identify::nidt::NGUID));
    assert!(d.iter().any(|d| d.nidt == nvmf_proto::identify::nidt::CSI));
    let (_, cqe) = h.command(admin_sqe(admin_opcode::IDENTIFY, 0, 0x55, 4096), &[]);
    assert_eq!((cqe.status.sct, cqe.status.sc), (0, 2), "invalid CNS is Invalid Field");

    // Shutdown handshake.
    h.prop_set(reg::CC, 0x46_0001 | (1 << 14));
    assert_eq!(h.prop_get(reg::CSTS, false) & 0xC, 0x8, "SHST complete");
}

#[test]
fn discovery_log_lists_subsystems_the_host_may_use() {
    let mut h = Host::new(target());
    h.admin_ready(DISCOVERY_NQN);
    let (data, cqe) = h.command(admin_sqe(admin_opcode::GET_LOG_PAGE, 0, 0x70 | ((4096 / 4 - 1) << 16), 4096), &[]);
    assert_eq!(cqe.status, Status::SUCCESS);
    let page = nvmf_proto::discovery::DiscoveryLogPage::decode(&data).unwrap();
    let nqns: Vec<_> = page.entries.iter().map(|e| e.subnqn.as_str()).collect();
    assert_eq!(nqns, vec![SUB_A], "SUB_B does not allow this host");
    assert_eq!(page.entries[0].trsvcid, "4420");
    assert_eq!(page.entries[0].traddr, "127.0.0.1");
    // Offset into the page: the first record starts at 1024.
    let mut sqe = admin_sqe(admin_opcode::GET_LOG_PAGE, 0, 0x70 | ((1024 / 4 - 1) << 16), 1024);
    sqe.set_cdw(12, 1024);
    let (rec, _) = h.command(sqe, &[]);
    assert_eq!(&rec[256..256 + SUB_A.len()], SUB_A.as_bytes());
    let (_, cqe) = h.command(admin_sqe(admin_opcode::GET_LOG_PAGE, 0, 0x02 | (127 << 16), 512), &[]);
    assert_eq!(cqe.status, Status::INVALID_LOG_PAGE.with_dnr(), "no SMART log on discovery");
}

#[test]
fn discovery_log_has_one_entry_per_subsystem_and_port() {
    let mut c = TargetConfig::empty();
    c.ports.push(PortConfig { addr: "127.0.0.1:4420".parse().unwrap(), portid: None, subsystems: None, tls: Default::default() });
    c.ports.push(PortConfig { addr: "127.0.0.1:8009".parse().unwrap(), portid: None, subsystems: None, tls: Default::default() });
    c.subsystems = vec![SubsystemConfig::new(SUB_A), SubsystemConfig::new(SUB_B)];
    let t = Arc::new(Target::new(c.target.clone(), &c.subsystems, &c.ports).unwrap());
    let page = nvmf_target::discovery::log_page(&t, HOST);
    let page = nvmf_proto::discovery::DiscoveryLogPage::decode(&page).unwrap();
    assert_eq!(page.entries.len(), 4);
}

#[test]
fn connect_refusals() {
    let t = target();
    let mut h = Host::new(t.clone());
    h.icreq(false, false);
    let cqe = h.connect(SUB_B, HOST, 0, CNTLID_DYNAMIC);
    assert_eq!((cqe.status.sct, cqe.status.sc), (1, 0x84), "host not on the allow list");
    let cqe = h.connect("nqn.unknown", HOST, 0, CNTLID_DYNAMIC);
    assert_eq!((cqe.status.sct, cqe.status.sc), (1, 0x82));
    assert_eq!(cqe.result, (1 << 16) | 256, "IATTR data, IPO subnqn");
    let cqe = h.connect(SUB_A, HOST, 1, 999);
    assert_eq!((cqe.status.sct, cqe.status.sc), (1, 0x82), "I/O queue for a cntlid that does not exist");
    assert_eq!(t.controller_count(), 0);
}

#[test]
fn in_capsule_write_then_read() {
    let t = target();
    let mut a = Host::new(t.clone());
    let cntlid = a.admin_ready(SUB_A);
    let mut h = Host::new(t.clone());
    h.icreq(false, true);
    assert_eq!(h.connect(SUB_A, HOST, 1, cntlid).status, Status::SUCCESS);
    h.attach();
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    let (_, cqe) = h.command(rw_sqe(io_opcode::WRITE, 8, 8, SglDescriptor::in_capsule(0, 4096)), &data);
    assert_eq!(cqe.status, Status::SUCCESS);
    let (read, cqe) = h.command(rw_sqe(io_opcode::READ, 8, 8, SglDescriptor::transport(4096)), &[]);
    assert_eq!(cqe.status, Status::SUCCESS);
    assert_eq!(read, data);
    // Errors: LBA out of range, bad namespace, bad opcode, SGL length mismatch.
    let nlb = (8 << 20) / 512;
    let (_, cqe) = h.command(rw_sqe(io_opcode::READ, nlb - 1, 2, SglDescriptor::transport(1024)), &[]);
    assert_eq!(cqe.status, Status::LBA_OUT_OF_RANGE.with_dnr());
    let mut s = rw_sqe(io_opcode::READ, 0, 1, SglDescriptor::transport(512));
    s.set_nsid(9);
    assert_eq!(h.command(s, &[]).1.status, Status::INVALID_NS.with_dnr());
    assert_eq!(h.command(rw_sqe(0x77, 0, 1, SglDescriptor::transport(512)), &[]).1.status, Status::INVALID_OPCODE.with_dnr());
    let (_, cqe) = h.command(rw_sqe(io_opcode::READ, 0, 2, SglDescriptor::transport(512)), &[]);
    assert_eq!(cqe.status, Status::SGL_INVALID_DATA_LEN.with_dnr());
    // Write Zeroes then read back zeroes.
    let (_, cqe) = h.command(rw_sqe(io_opcode::WRITE_ZEROES, 8, 4, SglDescriptor::default()), &[]);
    assert_eq!(cqe.status, Status::SUCCESS);
    let (read, _) = h.command(rw_sqe(io_opcode::READ, 8, 8, SglDescriptor::transport(4096)), &[]);
    assert!(read[..2048].iter().all(|b| *b == 0));
    assert_eq!(read[2048..], data[2048..]);
}

#[test]
fn null_reads_are_zero_after_writes_through_the_same_buffers() {
    // A null read skips zeroing a buffer nothing wrote since it was last zeroed: a write's data
    // must never show through.
    let t = target();
    let mut a = Host::new(t.clone());
    let cntlid = a.admin_ready(SUB_A);
    let mut h = io_queue(&t, cntlid, 31, 1);
    for round in 0..4u8 {
        let (read, cqe) = h.command(null_sqe(io_opcode::READ, 3, 1, SglDescriptor::transport(4096)), &[]);
        assert_eq!(cqe.status, Status::SUCCESS);
        assert!(read.len() == 4096 && read.iter().all(|b| *b == 0), "round {round}: read before the write");
        let (_, cqe) = h.command(null_sqe(io_opcode::WRITE, 3, 1, SglDescriptor::in_capsule(0, 4096)), &[0xA5 ^ round; 4096]);
        assert_eq!(cqe.status, Status::SUCCESS);
        let (read, _) = h.command(null_sqe(io_opcode::READ, 3, 1, SglDescriptor::transport(4096)), &[]);
        assert!(read.iter().all(|b| *b == 0), "round {round}: the written data showed through");
    }
}

#[test]
fn in_capsule_writes_to_null_take_no_command_buffer() {
    // A null namespace keeps nothing: its in-capsule write data is not copied into a command
    // buffer. A ram namespace's is, and reads back.
    let t = target();
    let mut a = Host::new(t.clone());
    let cntlid = a.admin_ready(SUB_A);
    let mut h = io_queue(&t, cntlid, 31, 1);
    let after_connect = h.conn.buffer_bytes();
    for round in 0..3u64 {
        let s = null_sqe(io_opcode::WRITE, round, 2, SglDescriptor::in_capsule(0, 8192));
        assert_eq!(h.command(s, &[0x5A; 8192]).1.status, Status::SUCCESS);
    }
    assert_eq!(h.conn.buffer_bytes(), after_connect, "a null write sized a command buffer");
    let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(h.command(rw_sqe(io_opcode::WRITE, 0, 16, SglDescriptor::in_capsule(0, 8192)), &data).1.status, Status::SUCCESS);
    assert!(h.conn.buffer_bytes() > after_connect, "the ram write's data went through no command buffer");
    let (read, cqe) = h.command(rw_sqe(io_opcode::READ, 0, 16, SglDescriptor::transport(8192)), &[]);
    assert_eq!(cqe.status, Status::SUCCESS);
    assert_eq!(read, data);
}

#[test]
fn the_output_buffer_a_burst_grew_is_given_back_after_a_quiet_tick() {
    let t = target();
    let mut a = Host::new(t.clone());
    let cntlid = a.admin_ready(SUB_A);
    let mut h = io_queue(&t, cntlid, 31, 1);
    let burst = |h: &mut Host| {
        let mut batch = Vec::new();
        for cid in 1..=30u16 {
            let mut sqe = rw_sqe(io_opcode::READ, 8 * cid as u64, 8, SglDescriptor::transport(4096));
            sqe.set_cid(cid);
            encode_pdu(&mut batch, &PduHeader::CapsuleCmd(CapsuleCmd { sqe }), &[], h.dg);
        }
        h.conn.feed(&batch);
        drive(&mut h.conn, h.now, &mut h.engine);
        assert!(h.conn.output_len() > 30 * 4096, "30 reads' data queued at once");
        let out = h.conn.take_output();
        h.rx.extend_from_slice(&out);
        let seen = answers(h);
        for cid in 1..=30u16 {
            let data = seen.iter().position(|a| *a == ('D', cid)).expect("data");
            assert!(seen[data..].contains(&('R', cid)), "cid {cid}: no response after its data");
        }
        assert_eq!(seen.len(), 60);
    };
    burst(&mut h);
    assert!(h.conn.output_buffer_bytes() > 64 << 10, "the burst grew the output buffer");
    h.conn.tick(h.now);
    assert!(h.conn.output_buffer_bytes() > 64 << 10, "kept through the tick that saw the burst");
    h.conn.tick(h.now);
    assert_eq!(h.conn.output_buffer_bytes(), 64 << 10, "given back after a tick without need");
    // Under steady load the buffer stays: every tick sees a burst.
    burst(&mut h);
    h.conn.tick(h.now);
    burst(&mut h);
    h.conn.tick(h.now);
    assert!(h.conn.output_buffer_bytes() > 64 << 10);
}

/// What the host received, in order: ('D', cid) for a C2HData, ('R', cid) for a successful
/// CapsuleResp.
fn answers(h: &mut Host) -> Vec<(char, u16)> {
    let mut seen = Vec::new();
    while let Some(pdu) = h.recv() {
        match pdu {
            (PduHeader::C2HData(d), _) => seen.push(('D', d.cccid)),
            (PduHeader::CapsuleResp(c), _) if c.cqe.status.is_success() => seen.push(('R', c.cqe.cid)),
            other => panic!("unexpected {other:?}"),
        }
    }
    seen
}

/// Reads `cids` answered in one burst: each `group` reads' data, then their CapsuleResps
/// together.
fn grouped_answers(cids: std::ops::RangeInclusive<u16>, group: usize) -> Vec<(char, u16)> {
    let cids: Vec<u16> = cids.collect();
    cids.chunks(group)
        .flat_map(|g| g.iter().map(|c| ('D', *c)).chain(g.iter().map(|c| ('R', *c))))
        .collect()
}

/// `n` 4 KiB null reads with cids `first..`, in one batch of input.
fn read_batch(h: &Host, first: u16, n: u16) -> Vec<u8> {
    let mut batch = Vec::new();
    for cid in first..first + n {
        let mut sqe = null_sqe(io_opcode::READ, cid as u64, 1, SglDescriptor::transport(4096));
        sqe.set_cid(cid);
        encode_pdu(&mut batch, &PduHeader::CapsuleCmd(CapsuleCmd { sqe }), &[], h.dg);
    }
    batch
}

#[test]
fn a_bursts_responses_follow_its_data_together() {
    // SPDK's host completes the CapsuleResps it finds in one 32 KiB read of its socket: grouped
    // after the burst's data, a poll completes the burst (RESPONSE_GROUP at a time) instead of
    // the ~8 reads whose data and response fit in 32 KiB.
    let t = target();
    let mut a = Host::new(t.clone());
    let cntlid = a.admin_ready(SUB_A);
    let mut h = io_queue(&t, cntlid, 127, 1);
    // Before the host's depth is known: RESPONSE_GROUP at a time.
    let n = 2 * RESPONSE_GROUP as u16 + 5;
    let batch = read_batch(&h, 1, n);
    h.send(&batch);
    assert_eq!(answers(&mut h), grouped_answers(1..=n, RESPONSE_GROUP as usize));
    // A lone read is answered as before: its data, then its response, in the same write.
    let batch = read_batch(&h, 200, 1);
    h.send(&batch);
    assert_eq!(answers(&mut h), vec![('D', 200), ('R', 200)]);
    // A tick that saw 120 distinct CIDs: half that is 60, past the bound: groups of 32.
    h.conn.tick(h.now);
    for round in 0..3 {
        let batch = read_batch(&h, 300 + round * 40, 40);
        h.send(&batch);
        answers(&mut h);
    }
    h.conn.tick(h.now);
    let batch = read_batch(&h, 1, 100);
    h.send(&batch);
    assert_eq!(answers(&mut h), grouped_answers(1..=100, 32));
    // 40 CIDs over a tick: groups of 20.
    h.conn.tick(h.now);
    let batch = read_batch(&h, 1, 40);
    h.send(&batch);
    answers(&mut h);
    h.conn.tick(h.now);
    let batch = read_batch(&h, 1, 50);
    h.send(&batch);
    assert_eq!(answers(&mut h), grouped_answers(1..=50, 20));
    // A shallow host (4 CIDs over the tick): groups of 8, the least.
    h.conn.tick(h.now);
    for _ in 0..3 {
        let batch = read_batch(&h, 1, 4);
        h.send(&batch);
        answers(&mut h);
    }
    h.conn.tick(h.now);
    let batch = read_batch(&h, 1, 20);
    h.send(&batch);
    assert_eq!(answers(&mut h), grouped_answers(1..=20, 8));
}

#[test]
fn held_responses_cut_by_a_short_write_go_out_before_later_output() {
    let t = target();
    let mut a = Host::new(t.clone());
    let cntlid = a.admin_ready(SUB_A);
    let mut h = io_queue(&t, cntlid, 127, 1);
    for (cut_in_responses, first) in [(false, 1u16), (true, 20)] {
        let batch = read_batch(&h, first, 3);
        h.conn.feed(&batch);
        drive(&mut h.conn, h.now, &mut h.engine);
        let queued = h.conn.output_len();
        // The socket takes part of it: ending in the second read's C2HData header, or inside the
        // responses.
        let taken = if cut_in_responses { queued - 30 } else { 4096 + 40 };
        let mut iov = [std::io::IoSlice::new(&[]); 16];
        let k = h.conn.output_slices(&mut iov);
        let mut written: Vec<u8> = iov[..k].iter().flat_map(|s| s.iter().copied()).collect();
        written.truncate(taken);
        h.conn.consume_output(taken);
        // More reads are answered before the rest is written: the rest of the first three (and
        // their responses) still comes first, and the stream stays whole.
        let later = read_batch(&h, first + 3, 2);
        h.conn.feed(&later);
        drive(&mut h.conn, h.now, &mut h.engine);
        h.rx.extend_from_slice(&written);
        h.rx.extend_from_slice(&h.conn.take_output());
        let seen = answers(&mut h);
        let (f, l) = (first, first + 3);
        let expected = [('D', f), ('D', f + 1), ('D', f + 2), ('R', f), ('R', f + 1), ('R', f + 2), ('D', l), ('D', l + 1), ('R', l), ('R', l + 1)];
        assert_eq!(seen, expected, "cut in the responses: {cut_in_responses}");
    }
}

#[test]
fn a_response_with_no_data_queued_before_it_is_not_held() {
    // A write's response has no data of its own to wait behind: queued before any read data,
    // it goes out first; after read data, it joins the held group (and keeps its order).
    let t = target();
    let mut a = Host::new(t.clone());
    let cntlid = a.admin_ready(SUB_A);
    let mut h = io_queue(&t, cntlid, 127, 1);
    let mut batch = Vec::new();
    for (cid, write) in [(1u16, true), (2, false), (3, true), (4, false)] {
        let mut sqe = if write {
            null_sqe(io_opcode::WRITE, cid as u64, 1, SglDescriptor::in_capsule(0, 4096))
        } else {
            null_sqe(io_opcode::READ, cid as u64, 1, SglDescriptor::transport(4096))
        };
        sqe.set_cid(cid);
        let data = if write { vec![0x3C; 4096] } else { Vec::new() };
        encode_pdu(&mut batch, &PduHeader::CapsuleCmd(CapsuleCmd { sqe }), &data, h.dg);
    }
    h.send(&batch);
    assert_eq!(answers(&mut h), [('R', 1), ('D', 2), ('D', 4), ('R', 2), ('R', 3), ('R', 4)]);
    // Once the held group went out, a lone write's response is written at once again.
    let mut sqe = null_sqe(io_opcode::WRITE, 9, 1, SglDescriptor::in_capsule(0, 4096));
    sqe.set_cid(9);
    h.send_pdu(PduHeader::CapsuleCmd(CapsuleCmd { sqe }), &[0x3C; 4096]);
    assert_eq!(answers(&mut h), [('R', 9)]);
}

#[test]
fn r2t_flow_for_a_1mib_write() {
    let t = target(); // maxh2cdata 128 KiB by default
    let mut a = Host::new(t.clone());
    let cntlid = a.admin_ready(SUB_A);
    let mut h = Host::new(t.clone());
    h.icreq(false, false);
    assert_eq!(h.connect(SUB_A, HOST, 1, cntlid).status, Status::SUCCESS);
    h.attach();
    let len = 1 << 20;
    let data: Vec<u8> = (0..len as u32).map(|i| (i % 253) as u8).collect();
    h.cid += 1;
    let cid = h.cid;
    let mut sqe = rw_sqe(io_opcode::WRITE, 0, (len / 512) as u16, SglDescriptor::transport(len as u32));
    sqe.set_cid(cid);
    h.send_pdu(PduHeader::CapsuleCmd(CapsuleCmd { sqe }), &[]);
    let mut r2ts = 0;
    let cqe = loop {
        match h.recv().expect("R2T or response") {
            (PduHeader::R2T(r), _) => {
                r2ts += 1;
                assert_eq!(r.cccid, cid);
                assert!(r.r2tl <= 128 << 10, "one R2T per MAXH2CDATA chunk");
                // Send the chunk as two H2CData PDUs.
                let half = r.r2tl / 2;
                for (o, l, last) in [(r.r2to, half, false), (r.r2to + half, r.r2tl - half, true)] {
                    let h2c = H2CData { cccid: cid, ttag: r.ttag, datao: o, datal: l, last };
                    h.send_pdu(PduHeader::H2CData(h2c), &data[o as usize..(o + l) as usize]);
                }
            }
            (PduHeader::CapsuleResp(r), _) => break r.cqe,
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(cqe.status, Status::SUCCESS);
    assert_eq!(r2ts, 8);
    let (read, _) = h.command(rw_sqe(io_opcode::READ, 0, (len / 512) as u16, SglDescriptor::transport(len as u32)), &[]);
    assert!(read == data, "read back what was written");
}

fn assert_term_req(h: &mut Host, want_fes: u16, want_fei: Option<u32>) {
    match h.recv() {
        Some((PduHeader::C2HTermReq(t), _)) => {
            assert_eq!(t.fes, want_fes);
            if let Some(fei) = want_fei {
                assert_eq!(t.fei, fei);
            }
        }
        other => panic!("expected C2HTermReq, got {other:?}"),
    }
    assert!(h.conn.should_close(), "connection closes after TermReq");
}

#[test]
fn malformed_pdus_get_term_req_and_close() {
    // Bad HLEN on a capsule.
    let mut h = Host::new(target());
    h.icreq(false, false);
    let mut b = Vec::new();
    encode_pdu(&mut b, &PduHeader::CapsuleCmd(CapsuleCmd { sqe: Sqe::new(0x06, 1) }), &[], Digests::default());
    b[2] = 60;
    h.send(&b);
    assert_term_req(&mut h, fes::INVALID_PDU_HDR, Some(2));

    // Unknown PDU type.
    let mut h = Host::new(target());
    h.icreq(false, false);
    h.send(&[0x0B, 0, 8, 0, 8, 0, 0, 0]);
    assert_term_req(&mut h, fes::INVALID_PDU_HDR, Some(0));

    // PLEN < HLEN.
    let mut h = Host::new(target());
    h.icreq(false, false);
    let mut b = Vec::new();
    encode_pdu(&mut b, &PduHeader::CapsuleCmd(CapsuleCmd { sqe: Sqe::new(0x06, 1) }), &[], Digests::default());
    b[4] = 20;
    h.send(&b);
    assert_term_req(&mut h, fes::INVALID_PDU_HDR, Some(4));

    // Header digest mismatch.
    let mut h = Host::new(target());
    h.icreq(true, false);
    let mut b = Vec::new();
    encode_pdu(&mut b, &PduHeader::CapsuleCmd(CapsuleCmd { sqe: Sqe::new(0x06, 1) }), &[], h.dg);
    b[72] ^= 0xFF;
    h.send(&b);
    assert_term_req(&mut h, fes::HDR_DIGEST_ERR, None);

    // Capsule before ICReq.
    let mut h = Host::new(target());
    let mut b = Vec::new();
    encode_pdu(&mut b, &PduHeader::CapsuleCmd(CapsuleCmd { sqe: Sqe::new(0x06, 1) }), &[], Digests::default());
    h.send(&b);
    assert_term_req(&mut h, fes::PDU_SEQ_ERR, None);
}

#[test]
fn h2c_data_out_of_range_and_data_digest_error() {
    let t = target();
    let mut a = Host::new(t.clone());
    let cntlid = a.admin_ready(SUB_A);
    let mut h = Host::new(t.clone());
    h.icreq(false, true);
    assert_eq!(h.connect(SUB_A, HOST, 1, cntlid).status, Status::SUCCESS);
    h.attach();
    // Data digest mismatch on in-capsule data: Transient Transport Error, connection stays.
    let mut sqe = rw_sqe(io_opcode::WRITE, 0, 1, SglDescriptor::in_capsule(0, 512));
    sqe.set_cid(50);
    let mut b = Vec::new();
    encode_pdu(&mut b, &PduHeader::CapsuleCmd(CapsuleCmd { sqe }), &[1u8; 512], h.dg);
    let n = b.len();
    b[n - 1] ^= 1;
    h.send(&b);
    match h.recv() {
        Some((PduHeader::CapsuleResp(r), _)) => assert_eq!(r.cqe.status, Status::TRANSIENT_TRANSPORT_ERROR),
        other => panic!("{other:?}"),
    }
    // H2CData beyond what the R2T asked for: fatal, Data Offset out of range.
    let mut sqe = rw_sqe(io_opcode::WRITE, 0, 16, SglDescriptor::transport(8192));
    sqe.set_cid(51);
    h.send_pdu(PduHeader::CapsuleCmd(CapsuleCmd { sqe }), &[]);
    let Some((PduHeader::R2T(r), _)) = h.recv() else { panic!("R2T expected") };
    let h2c = H2CData { cccid: 51, ttag: r.ttag, datao: 4096, datal: 512, last: true };
    h.send_pdu(PduHeader::H2CData(h2c), &[0u8; 512]);
    assert_term_req(&mut h, fes::DATA_OUT_OF_RANGE, None);
}

#[test]
fn keep_alive_timeout_tears_down_controller_with_fake_clock() {
    let t = target();
    let mut a = Host::new(t.clone());
    let cntlid = a.admin_ready(SUB_A);
    let mut h = Host::new(t.clone());
    h.icreq(false, false);
    assert_eq!(h.connect(SUB_A, HOST, 1, cntlid).status, Status::SUCCESS);
    assert_eq!(t.controller_count(), 1);
    // KATO is 5000 ms: 4 s of silence is fine, a keep-alive resets the timer.
    a.now += Duration::from_secs(4);
    a.conn.tick(a.now);
    assert!(!a.conn.should_close());
    let (_, cqe) = a.command(admin_sqe(admin_opcode::KEEP_ALIVE, 0, 0, 0), &[]);
    assert_eq!(cqe.status, Status::SUCCESS);
    a.now += Duration::from_secs(4);
    a.conn.tick(a.now);
    assert!(!a.conn.should_close());
    a.now += Duration::from_millis(5100);
    a.conn.tick(a.now);
    assert!(a.conn.should_close(), "admin queue closed after KATO of silence");
    assert_eq!(t.controller_count(), 0);
    h.conn.tick(a.now);
    assert!(h.conn.should_close(), "I/O queues of the controller close too");
}

#[test]
fn features_and_aer_limit() {
    let mut h = Host::new(target());
    h.admin_ready(SUB_A);
    let (_, cqe) = h.command(admin_sqe(admin_opcode::SET_FEATURES, 0, 0x07, 0).with_cdw11(0x0003_0003), &[]);
    assert_eq!(cqe.status, Status::SUCCESS);
    assert_eq!(cqe.result, 0x0003_0003);
    let (_, cqe) = h.command(admin_sqe(admin_opcode::GET_FEATURES, 0, 0x0F, 0), &[]);
    assert_eq!(cqe.result, 5000, "KATO from Connect");
    let (_, cqe) = h.command(admin_sqe(admin_opcode::SET_FEATURES, 0, 0x02, 0), &[]);
    assert_eq!(cqe.status, Status::INVALID_FIELD.with_dnr());
    // Four AERs are held (no response), the fifth fails.
    for _ in 0..4 {
        h.cid += 1;
        let mut s = admin_sqe(admin_opcode::ASYNC_EVENT_REQUEST, 0, 0, 0);
        s.set_cid(h.cid);
        h.send_pdu(PduHeader::CapsuleCmd(CapsuleCmd { sqe: s }), &[]);
        assert!(h.recv().is_none(), "AER held");
    }
    let (_, cqe) = h.command(admin_sqe(admin_opcode::ASYNC_EVENT_REQUEST, 0, 0, 0), &[]);
    assert_eq!(cqe.status, Status::AER_LIMIT_EXCEEDED);
    let _ = fctype::CONNECT;
}

trait WithCdw11 {
    fn with_cdw11(self, v: u32) -> Self;
}

impl WithCdw11 for Sqe {
    fn with_cdw11(mut self, v: u32) -> Self {
        self.set_cdw(11, v);
        self
    }
}

#[test]
fn identify_says_subsystem_and_namespaces_are_shared() {
    // Linux refuses a second controller to one subsystem ("duplicate ... unshared namespace")
    // unless CMIC bit 1 and NMIC bit 0 are set.
    let t = target();
    for _ in 0..2 {
        let mut h = Host::new(t.clone());
        h.admin_ready(SUB_A);
        let (data, _) = h.command(admin_sqe(admin_opcode::IDENTIFY, 0, 1, 4096), &[]);
        assert_eq!(IdentifyController::decode(&data).unwrap().cmic & 0b10, 0b10, "CMIC: multiple controllers");
        let (data, _) = h.command(admin_sqe(admin_opcode::IDENTIFY, 1, 0, 4096), &[]);
        assert_eq!(IdentifyNamespace::decode(&data).unwrap().nmic & 1, 1, "NMIC: shared namespace");
    }
    let mut d = Host::new(t);
    d.admin_ready(DISCOVERY_NQN);
    let (data, _) = d.command(admin_sqe(admin_opcode::IDENTIFY, 0, 1, 4096), &[]);
    assert_eq!(IdentifyController::decode(&data).unwrap().cmic, 0, "discovery controller");
}

#[test]
fn shutdown_flushes_file_namespaces_before_reporting_complete() {
    let dir = std::env::temp_dir().join(format!("nvmf-target-shn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ns.img");
    std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
    let mut c = TargetConfig::empty();
    c.ports.push(PortConfig { addr: "127.0.0.1:4420".parse().unwrap(), portid: None, subsystems: None, tls: Default::default() });
    let mut a = SubsystemConfig::new(SUB_A);
    a.namespaces.push(NamespaceConfig { nsid: 1, backend: BackendConfig::File { path }, block_size: 512, nguid: None, uuid: None });
    c.subsystems = vec![a];
    let t = Arc::new(Target::new(c.target.clone(), &c.subsystems, &c.ports).unwrap());
    let syncs = || match &t.subsystems()[0].namespaces[0].backend {
        nvmf_target::backend::Backend::File(f) => f.sync_count(),
        _ => unreachable!(),
    };
    let mut h = Host::new(t.clone());
    h.admin_ready(SUB_A);
    assert_eq!(syncs(), 0);
    h.prop_set(reg::CC, 0x46_0001 | (1 << 14));
    assert_eq!(h.prop_get(reg::CSTS, false) & 0xC, 0x8, "SHST complete");
    assert_eq!(syncs(), 1, "fdatasync before SHST complete");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An I/O queue of `sqsize + 1` entries for controller `cntlid`, connected with in-capsule data.
fn io_queue(t: &Arc<Target>, cntlid: u16, sqsize: u16, maxr2t: u32) -> Host {
    io_queue_with(t, cntlid, sqsize, maxr2t, 0)
}

fn io_queue_with(t: &Arc<Target>, cntlid: u16, sqsize: u16, maxr2t: u32, cattr: u8) -> Host {
    let mut h = Host::new(t.clone());
    h.send_pdu(PduHeader::IcReq(IcReq { pfv: 0, hpda: 0, hdgst: false, ddgst: false, maxr2t }), &[]);
    assert!(matches!(h.recv(), Some((PduHeader::IcResp(_), _))));
    let mut sqe = ConnectCmd { recfmt: 0, qid: 1, sqsize, cattr, kato: 0 }.to_sqe(0);
    sqe.set_sgl(SglDescriptor::in_capsule(0, 1024));
    let data = ConnectData { hostid: [7; 16], cntlid, subnqn: SUB_A.into(), hostnqn: HOST.into() }.encode();
    assert_eq!(h.command(sqe, &data).1.status, Status::SUCCESS);
    h.attach();
    h
}

#[test]
fn connect_data_through_r2t_when_in_capsule_size_is_zero() {
    // Linux inline_data_size = 0: IOCCSZ 4 (the SQE alone), and the I/O queue Connect's 1024
    // bytes come through SGL 0x5A + R2T + H2CData.
    let t = target_with(|s| s.in_capsule_data_size = 0);
    let mut a = Host::new(t.clone());
    let cntlid = a.admin_ready(SUB_A);
    let (data, _) = a.command(admin_sqe(admin_opcode::IDENTIFY, 0, 1, 4096), &[]);
    assert_eq!(IdentifyController::decode(&data).unwrap().ioccsz, 4);

    let mut h = Host::new(t.clone());
    h.icreq(false, true);
    let mut sqe = ConnectCmd { recfmt: 0, qid: 1, sqsize: 31, cattr: 0, kato: 0 }.to_sqe(9);
    sqe.set_sgl(SglDescriptor::transport(1024));
    h.send_pdu(PduHeader::CapsuleCmd(CapsuleCmd { sqe }), &[]);
    let Some((PduHeader::R2T(r), _)) = h.recv() else { panic!("R2T for the Connect data") };
    assert_eq!((r.cccid, r.r2to, r.r2tl), (9, 0, 1024));
    let data = ConnectData { hostid: [7; 16], cntlid, subnqn: SUB_A.into(), hostnqn: HOST.into() }.encode();
    let h2c = H2CData { cccid: 9, ttag: r.ttag, datao: 0, datal: 1024, last: true };
    h.send_pdu(PduHeader::H2CData(h2c), &data);
    match h.recv() {
        Some((PduHeader::CapsuleResp(r), _)) => assert_eq!((r.cqe.cid, r.cqe.status), (9, Status::SUCCESS)),
        other => panic!("expected the Connect response, got {other:?}"),
    }
    h.attach();

    // Writes on that queue go through R2T too, and read back.
    h.cid = 20;
    let sqe = rw_sqe(io_opcode::WRITE, 0, 1, SglDescriptor::transport(512));
    h.send_pdu(PduHeader::CapsuleCmd(CapsuleCmd { sqe: { let mut s = sqe; s.set_cid(21); s } }), &[]);
    let Some((PduHeader::R2T(r), _)) = h.recv() else { panic!("R2T for the write") };
    h.send_pdu(PduHeader::H2CData(H2CData { cccid: 21, ttag: r.ttag, datao: 0, datal: 512, last: true }), &[5; 512]);
    assert!(matches!(h.recv(), Some((PduHeader::CapsuleResp(r), _)) if r.cqe.status == Status::SUCCESS));
    h.cid = 21;
    let (read, _) = h.command(rw_sqe(io_opcode::READ, 0, 1, SglDescriptor::transport(512)), &[]);
    assert_eq!(read, vec![5; 512]);
}

#[test]
fn in_capsule_data_beyond_ioccsz_is_fatal() {
    let t = target_with(|s| s.in_capsule_data_size = 4096);
    let mut a = Host::new(t.clone());
    let cntlid = a.admin_ready(SUB_A);
    let mut h = io_queue(&t, cntlid, 31, 0);
    let (_, cqe) = h.command(rw_sqe(io_opcode::WRITE, 0, 8, SglDescriptor::in_capsule(0, 4096)), &[1; 4096]);
    assert_eq!(cqe.status, Status::SUCCESS, "up to IOCCSZ is fine");
    let mut sqe = rw_sqe(io_opcode::WRITE, 0, 16, SglDescriptor::in_capsule(0, 8192));
    sqe.set_cid(77);
    h.send_pdu(PduHeader::CapsuleCmd(CapsuleCmd { sqe }), &[2; 8192]);
    assert_term_req(&mut h, fes::DATA_LIMIT_EXCEEDED, None);
    // Only that connection ends.
    assert_eq!(a.command(admin_sqe(admin_opcode::KEEP_ALIVE, 0, 0, 0), &[]).1.status, Status::SUCCESS);
}

#[test]
fn h2c_data_beyond_maxh2cdata_is_fatal() {
    // MAXH2CDATA 4 KiB; the host allows two R2Ts, so 8 KiB are asked for, but one H2CData PDU
    // may still carry at most 4 KiB.
    let t = target_with(|s| s.maxh2cdata = 4096);
    let mut a = Host::new(t.clone());
    let cntlid = a.admin_ready(SUB_A);
    let mut h = io_queue(&t, cntlid, 31, 1);
    let mut sqe = rw_sqe(io_opcode::WRITE, 0, 16, SglDescriptor::transport(8192));
    sqe.set_cid(5);
    h.send_pdu(PduHeader::CapsuleCmd(CapsuleCmd { sqe }), &[]);
    let Some((PduHeader::R2T(r1), _)) = h.recv() else { panic!("R2T") };
    let Some((PduHeader::R2T(r2), _)) = h.recv() else { panic!("second R2T") };
    assert_eq!((r1.r2tl, r2.r2to), (4096, 4096));
    h.send_pdu(PduHeader::H2CData(H2CData { cccid: 5, ttag: r1.ttag, datao: 0, datal: 8192, last: true }), &[0; 8192]);
    assert_term_req(&mut h, fes::DATA_LIMIT_EXCEEDED, None);
    assert_eq!(a.command(admin_sqe(admin_opcode::KEEP_ALIVE, 0, 0, 0), &[]).1.status, Status::SUCCESS);
}

#[test]
fn buffer_budget_holds_commands_until_memory_frees() {
    const MIB2: u32 = 2 << 20;
    let per_budget = nvmf_target::transport::BUFFER_BUDGET / MIB2 as usize;
    let t = target();
    let mut a = Host::new(t.clone());
    let cntlid = a.admin_ready(SUB_A);
    let mut h = io_queue(&t, cntlid, 63, 0);
    let n = per_budget + 8;

    // Reads of MDTS: those beyond the budget wait for the first ones to complete.
    let mut batch = Vec::new();
    for cid in 0..n as u16 {
        let mut sqe = rw_sqe(io_opcode::READ, 0, (MIB2 / 512) as u16, SglDescriptor::transport(MIB2));
        sqe.set_cid(cid);
        encode_pdu(&mut batch, &PduHeader::CapsuleCmd(CapsuleCmd { sqe }), &[], h.dg);
    }
    h.send(&batch);
    let mut responses = 0;
    while let Some((pdu, _)) = h.recv() {
        if let PduHeader::CapsuleResp(r) = pdu {
            assert_eq!(r.cqe.status, Status::SUCCESS);
            responses += 1;
        }
    }
    assert_eq!(responses, n);
    assert!(h.conn.buffer_bytes() <= nvmf_target::transport::BUFFER_BUDGET);

    // R2T writes hold their buffer until the host sends the data: only a budget's worth get R2T.
    let mut batch = Vec::new();
    for cid in 100..100 + n as u16 {
        let mut sqe = rw_sqe(io_opcode::WRITE, 0, (MIB2 / 512) as u16, SglDescriptor::transport(MIB2));
        sqe.set_cid(cid);
        encode_pdu(&mut batch, &PduHeader::CapsuleCmd(CapsuleCmd { sqe }), &[], h.dg);
    }
    h.send(&batch);
    let mut r2ts = Vec::new();
    while let Some((PduHeader::R2T(r), _)) = h.recv() {
        r2ts.push(r);
    }
    assert_eq!(r2ts.len(), per_budget, "one R2T per command that got memory");
    assert!(h.conn.buffer_bytes() <= nvmf_target::transport::BUFFER_BUDGET);
    // Feed every R2T (new ones included) until all writes completed.
    let mut done = 0;
    while let Some(r) = r2ts.pop() {
        let h2c = H2CData { cccid: r.cccid, ttag: r.ttag, datao: r.r2to, datal: r.r2tl, last: r.r2to + r.r2tl == MIB2 };
        h.send_pdu(PduHeader::H2CData(h2c), &vec![3; r.r2tl as usize]);
        while let Some((pdu, _)) = h.recv() {
            match pdu {
                PduHeader::R2T(r) => r2ts.push(r),
                PduHeader::CapsuleResp(r) => {
                    assert_eq!(r.cqe.status, Status::SUCCESS);
                    done += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(h.conn.buffer_bytes() <= nvmf_target::transport::BUFFER_BUDGET);
    }
    assert_eq!(done, n, "held writes got their R2T once memory freed");
}

#[test]
fn reads_end_with_c2hdata_success_once_the_host_disables_sq_flow_control() {
    let t = target();
    let mut a = Host::new(t.clone());
    let cntlid = a.admin_ready(SUB_A);
    for cattr in [0, CATTR_DISABLE_SQFLOW] {
        let mut h = io_queue_with(&t, cntlid, 31, 0, cattr);
        let data = vec![0x5Au8; 256 << 10];
        let mut w = rw_sqe(io_opcode::WRITE, 0, 512, SglDescriptor::transport(256 << 10));
        w.set_cid(1);
        h.send_pdu(PduHeader::CapsuleCmd(CapsuleCmd { sqe: w }), &[]);
        loop {
            match h.recv() {
                Some((PduHeader::R2T(r2t), _)) => {
                    let (at, len) = (r2t.r2to as usize, r2t.r2tl as usize);
                    let hdr = H2CData { cccid: 1, ttag: r2t.ttag, datao: r2t.r2to, datal: r2t.r2tl, last: true };
                    h.send_pdu(PduHeader::H2CData(hdr), &data[at..at + len]);
                }
                Some((PduHeader::CapsuleResp(c), _)) => break assert_eq!(c.cqe.status, Status::SUCCESS),
                other => panic!("writes always end with a CapsuleResp, got {other:?}"),
            }
        }

        // 256 KiB come back in two C2HData PDUs; only the last may carry SUCCESS.
        let mut r = rw_sqe(io_opcode::READ, 0, 512, SglDescriptor::transport(256 << 10));
        r.set_cid(2);
        h.send_pdu(PduHeader::CapsuleCmd(CapsuleCmd { sqe: r }), &[]);
        let mut flags = Vec::new();
        let mut read = Vec::new();
        while let Some((pdu, bytes)) = h.recv() {
            match pdu {
                PduHeader::C2HData(d) => {
                    flags.push((d.last, d.success));
                    read.extend_from_slice(&bytes);
                }
                PduHeader::CapsuleResp(c) => {
                    assert_eq!((c.cqe.cid, c.cqe.status), (2, Status::SUCCESS));
                    flags.push((true, false));
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(read, data);
        if cattr == 0 {
            assert_eq!(flags, vec![(false, false), (true, false), (true, false)], "C2HData then CapsuleResp");
        } else {
            assert_eq!(flags, vec![(false, false), (true, true)], "SUCCESS on the last C2HData, no CapsuleResp");
        }
    }
}

/// The command dispatcher under hostile input: random capsules (any opcode, namespace, LBA range,
/// SGL and in-capsule data), stray H2CData and garbage on an admin and an I/O queue. Nothing may
/// panic, everything the target sends must be a well-formed PDU a host expects, and a new
/// controller must still be served afterwards.
mod dispatcher_fuzz {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Action {
        Capsule { admin: bool, sqe: [u8; 64], data_len: usize },
        H2CData { ttag: u16, cccid: u16, datao: u32, len: usize },
        Garbage(Vec<u8>),
    }

    fn any_sqe(admin: bool) -> impl Strategy<Value = [u8; 64]> {
        let opcodes: Vec<u8> = if admin {
            vec![admin_opcode::IDENTIFY, admin_opcode::GET_LOG_PAGE, admin_opcode::SET_FEATURES,
                 admin_opcode::GET_FEATURES, admin_opcode::KEEP_ALIVE, admin_opcode::ASYNC_EVENT_REQUEST,
                 admin_opcode::FABRICS, 0x55]
        } else {
            vec![io_opcode::READ, io_opcode::WRITE, io_opcode::FLUSH, io_opcode::WRITE_ZEROES,
                 io_opcode::DATASET_MANAGEMENT, admin_opcode::FABRICS, 0x7E]
        };
        (
            proptest::sample::select(opcodes),
            proptest::sample::select(vec![0u32, 1, 2, 3, 0xFFFF_FFFF]),
            prop_oneof![0u64..64, any::<u64>()],
            any::<[u32; 6]>(),
            proptest::sample::select(vec![0x01u8, 0x5A, 0x00, 0xFF]),
            prop_oneof![0u32..9000, 0u32..(3 << 20), any::<u32>()],
            prop_oneof![Just(0u64), any::<u64>()],
        )
            .prop_map(move |(opcode, nsid, slba, cdws, sgl_type, sgl_len, sgl_addr)| {
                let mut s = Sqe::new(opcode, 0);
                s.set_nsid(nsid);
                for (i, v) in cdws.iter().enumerate() {
                    s.set_cdw(10 + i, *v);
                }
                if !admin && opcode != admin_opcode::FABRICS {
                    s.set_slba(slba);
                }
                s.set_sgl(SglDescriptor { addr: sgl_addr, length: sgl_len, sgl_type });
                s.0
            })
    }

    fn any_action() -> impl Strategy<Value = Action> {
        prop_oneof![
            4 => (any::<bool>()).prop_flat_map(|admin| (Just(admin), any_sqe(admin), prop_oneof![Just(0usize), 0usize..9000]))
                .prop_map(|(admin, sqe, data_len)| Action::Capsule { admin, sqe, data_len }),
            2 => (0u16..4, any::<u16>(), prop_oneof![Just(0u32), 0u32..70000], 0usize..40000)
                .prop_map(|(ttag, cccid, datao, len)| Action::H2CData { ttag, cccid, datao, len }),
            1 => proptest::collection::vec(any::<u8>(), 0..200).prop_map(Action::Garbage),
        ]
    }

    /// Feeds bytes and checks every PDU the target sent back.
    fn feed_and_check(h: &mut Host, bytes: &[u8]) -> Result<(), TestCaseError> {
        h.send(bytes);
        while !h.rx.is_empty() {
            let frame = match h.framer.next(&h.rx) {
                Ok(Some(f)) => f,
                Ok(None) => return Err(TestCaseError::fail("target sent a truncated PDU")),
                Err(e) => return Err(TestCaseError::fail(format!("target sent a malformed PDU: {e:?}"))),
            };
            prop_assert!(
                matches!(frame.header, PduHeader::CapsuleResp(_) | PduHeader::C2HData(_) | PduHeader::R2T(_) | PduHeader::C2HTermReq(_)),
                "a target never sends {:?}", frame.header.pdu_type()
            );
            h.rx.drain(..frame.len);
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn hostile_command_streams_never_panic_and_never_stop_the_target(actions in proptest::collection::vec(any_action(), 1..16)) {
            let t = target();
            let mut a = Host::new(t.clone());
            let cntlid = a.admin_ready(SUB_A);
            let mut h = io_queue(&t, cntlid, 31, 0);
            for (i, action) in actions.iter().enumerate() {
                let mut bytes = Vec::new();
                let target_host = match action {
                    Action::Capsule { admin, sqe, data_len } => {
                        let mut sqe = Sqe(*sqe);
                        sqe.set_cid(i as u16);
                        let data: Vec<u8> = (0..*data_len).map(|b| b as u8).collect();
                        encode_pdu(&mut bytes, &PduHeader::CapsuleCmd(CapsuleCmd { sqe }), &data, Digests::default());
                        if *admin { &mut a } else { &mut h }
                    }
                    Action::H2CData { ttag, cccid, datao, len } => {
                        let hdr = H2CData { cccid: *cccid, ttag: *ttag, datao: *datao, datal: *len as u32, last: true };
                        encode_pdu(&mut bytes, &PduHeader::H2CData(hdr), &vec![0xA5; *len], Digests::default());
                        &mut h
                    }
                    Action::Garbage(g) => {
                        bytes.extend_from_slice(g);
                        &mut h
                    }
                };
                feed_and_check(target_host, &bytes)?;
            }
            // Whatever happened to those two queues, a new controller is served.
            let mut a2 = Host::new(t.clone());
            let cntlid2 = a2.admin_ready(SUB_A);
            let mut h2 = io_queue(&t, cntlid2, 31, 0);
            let data = vec![0x3Cu8; 4096];
            let (_, cqe) = h2.command(rw_sqe(io_opcode::WRITE, 16, 8, SglDescriptor::in_capsule(0, 4096)), &data);
            prop_assert_eq!(cqe.status, Status::SUCCESS);
            let (read, cqe) = h2.command(rw_sqe(io_opcode::READ, 16, 8, SglDescriptor::transport(4096)), &[]);
            prop_assert_eq!(cqe.status, Status::SUCCESS);
            prop_assert_eq!(read, data);
        }
    }
}

#[test]
fn large_read_data_is_written_from_its_buffer_in_pieces_and_the_slot_freed_after() {
    // 64 KiB reads go out from the command's buffer (vectored), not copied: write them in
    // 1000-byte pieces, as a slow socket takes them, and check the bytes and the slot's life.
    let t = target();
    let mut a = Host::new(t.clone());
    let cntlid = a.admin_ready(SUB_A);
    // SQSIZE 1: two command slots, both taken by the reads below until their data is written.
    let mut h = io_queue(&t, cntlid, 1, 1);
    let pattern: Vec<u8> = (0..65536u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut w = rw_sqe(io_opcode::WRITE, 0, 128, SglDescriptor::transport(65536));
    w.set_cid(1);
    h.send_pdu(PduHeader::CapsuleCmd(CapsuleCmd { sqe: w }), &[]);
    let Some((PduHeader::R2T(r), _)) = h.recv() else { panic!("R2T") };
    h.send_pdu(PduHeader::H2CData(H2CData { cccid: 1, ttag: r.ttag, datao: 0, datal: 65536, last: true }), &pattern);
    assert!(matches!(h.recv(), Some((PduHeader::CapsuleResp(c), _)) if c.cqe.status.is_success()));

    // Two reads at once: both of their buffers wait in the output.
    let mut batch = Vec::new();
    for cid in [2u16, 3] {
        let mut sqe = rw_sqe(io_opcode::READ, 0, 128, SglDescriptor::transport(65536));
        sqe.set_cid(cid);
        encode_pdu(&mut batch, &PduHeader::CapsuleCmd(CapsuleCmd { sqe }), &[], h.dg);
    }
    h.conn.feed(&batch);
    drive(&mut h.conn, h.now, &mut h.engine);
    let held = h.conn.buffer_bytes();
    assert!(held >= 2 * 65536, "both read buffers are held while their data waits: {held}");
    let mut wire = Vec::new();
    while h.conn.output_len() > 0 {
        let mut iov = [std::io::IoSlice::new(&[]); 4];
        let n = h.conn.output_slices(&mut iov);
        let bytes: Vec<u8> = iov[..n].iter().flat_map(|s| s.iter().copied()).take(1000).collect();
        h.conn.consume_output(bytes.len());
        wire.extend_from_slice(&bytes);
    }
    h.rx.extend_from_slice(&wire);
    // Both reads' data, then their responses together (RESPONSE_GROUP).
    for cid in [2u16, 3] {
        let Some((PduHeader::C2HData(d), data)) = h.recv() else { panic!("C2HData for {cid}") };
        assert_eq!((d.cccid, d.datal), (cid, 65536));
        assert!(data == pattern, "read {cid} returned other bytes than were written");
    }
    for cid in [2u16, 3] {
        assert!(matches!(h.recv(), Some((PduHeader::CapsuleResp(c), _)) if c.cqe.cid == cid && c.cqe.status.is_success()));
    }
    // Written: the slots are free again (a third command while they were taken would have
    // broken SQSIZE and ended the connection).
    let (data, cqe) = h.command(rw_sqe(io_opcode::READ, 0, 128, SglDescriptor::transport(65536)), &[]);
    assert!(cqe.status.is_success() && data == pattern);
}
