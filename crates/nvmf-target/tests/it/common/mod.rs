//! In-process host side of one connection, for the durability and limits tests: PDUs in,
//! PDUs out, a clock the test moves.

#![allow(dead_code)] // each test file uses a different part

use nvmf_proto::fabrics::{reg, ConnectCmd, ConnectData, PropertySet, CNTLID_DYNAMIC};
use nvmf_proto::nvme::SglDescriptor;
use nvmf_proto::pdu::{encode_pdu, CapsuleCmd, IcReq};
use nvmf_proto::{Cqe, Digests, Framer, PduHeader, Role, Sqe, Status};
use nvmf_target::backend::IoEngine;
use nvmf_target::config::{BackendConfig, NamespaceConfig, PortConfig, ReactorMode, SubsystemConfig, TargetConfig, TargetSettings};
use nvmf_target::core::Target;
use nvmf_target::stats::ReactorStats;
use nvmf_target::reactor::drive_and_take_output;
use nvmf_target::transport::tcp::Connection;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const SUB: &str = "nqn.2024-01.io.nvmflab:inproc";
pub const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:inproc-host";

/// A target listening on 127.0.0.1 (any port) with subsystem `nqn`: one 1 MiB RAM namespace of
/// 512-byte blocks, any host allowed.
pub fn loopback_config(nqn: &str) -> TargetConfig {
    let mut c = TargetConfig::empty();
    c.ports.push(PortConfig { addr: "127.0.0.1:0".parse().unwrap(), portid: None, subsystems: None, tls: Default::default() });
    let mut s = SubsystemConfig::new(nqn);
    s.namespaces.push(NamespaceConfig { nsid: 1, backend: BackendConfig::Ram { size: 1 << 20 }, block_size: 512, nguid: None, uuid: None });
    c.subsystems.push(s);
    c
}

/// A target with one namespace on `backend` (512-byte blocks) and `settings` changed.
pub fn target(backend: BackendConfig, settings: impl FnOnce(&mut TargetSettings)) -> Arc<Target> {
    let mut c = TargetConfig::empty();
    c.ports.push(PortConfig { addr: "127.0.0.1:4420".parse().unwrap(), portid: None, subsystems: None, tls: Default::default() });
    let mut s = SubsystemConfig::new(SUB);
    s.namespaces.push(NamespaceConfig { nsid: 1, backend, block_size: 512, nguid: None, uuid: None });
    c.subsystems.push(s);
    settings(&mut c.target);
    c.validate("test").unwrap();
    Arc::new(Target::new(c.target.clone(), &c.subsystems, &c.ports).unwrap())
}

/// A target with one file namespace on a fresh 1 MiB file in its own temporary directory
/// (named after `name` and the process); returns the directory for the test to remove.
pub fn file_target(name: &str) -> (Arc<Target>, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("nvmf-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("disk.img");
    std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
    (target(BackendConfig::File { path }, |_| {}), dir)
}

pub struct Queue {
    pub conn: Connection,
    pub engine: IoEngine,
    framer: Framer,
    rx: Vec<u8>,
    cid: u16,
    pub now: Instant,
}

impl Queue {
    /// A connection that has sent nothing yet.
    pub fn raw(target: &Arc<Target>) -> Queue {
        let now = Instant::now();
        let conn = Connection::new(target.clone(), None, now);
        Queue { conn, engine: IoEngine::new(8), framer: Framer::new(Role::Host, 4 << 20), rx: Vec::new(), cid: 0, now }
    }

    /// ICReq and Connect of queue `qid` (to controller `cntlid`), attached as a reactor does.
    pub fn open(target: &Arc<Target>, qid: u16, cntlid: u16) -> (Queue, Cqe) {
        let mut q = Queue::raw(target);
        q.send(PduHeader::IcReq(IcReq { pfv: 0, hpda: 0, hdgst: false, ddgst: false, maxr2t: 0 }), &[]);
        assert!(matches!(q.recv(), Some(PduHeader::IcResp(_))));
        let mut sqe = ConnectCmd { recfmt: 0, qid, sqsize: 31, cattr: 0, kato: 0 }.to_sqe(0);
        sqe.set_sgl(SglDescriptor::in_capsule(0, 1024));
        let data = ConnectData { hostid: [3; 16], cntlid, subnqn: SUB.into(), hostnqn: HOST.into() }.encode();
        let cqe = q.command(sqe, &data);
        // Commands flow only on an attached connection (the reactor attaches after Connect).
        q.conn.attach(0, &ReactorStats::new(0, 0, ReactorMode::Event, 0));
        (q, cqe)
    }

    /// The admin queue of a new, enabled controller, and its cntlid.
    pub fn admin(target: &Arc<Target>) -> (Queue, u16) {
        let (mut admin, cqe) = Queue::open(target, 0, CNTLID_DYNAMIC);
        assert_eq!(cqe.status, Status::SUCCESS);
        let cq = admin.command(PropertySet { size8: false, offset: reg::CC, value: 0x46_0001 }.to_sqe(0), &[]);
        assert_eq!(cq.status, Status::SUCCESS);
        (admin, cqe.result as u16)
    }

    /// An enabled controller's admin queue and I/O queue 1 on it.
    pub fn admin_and_io(target: &Arc<Target>) -> (Queue, Queue) {
        let (admin, cntlid) = Queue::admin(target);
        let (io, cqe) = Queue::open(target, 1, cntlid);
        assert_eq!(cqe.status, Status::SUCCESS);
        (admin, io)
    }

    pub fn send_bytes(&mut self, bytes: &[u8]) {
        self.conn.feed(bytes);
        self.rx.extend_from_slice(&drive_and_take_output(&mut self.conn, self.now, &mut self.engine));
    }

    pub fn send(&mut self, hdr: PduHeader, data: &[u8]) {
        let mut b = Vec::new();
        encode_pdu(&mut b, &hdr, data, Digests::default());
        self.send_bytes(&b);
    }

    /// Next PDU the target sent, if any.
    pub fn recv(&mut self) -> Option<PduHeader> {
        let f = self.framer.next(&self.rx).unwrap()?;
        self.rx.drain(..f.len);
        Some(f.header)
    }

    /// Sends a command (CID assigned here) without waiting.
    pub fn submit(&mut self, mut sqe: Sqe, data: &[u8]) -> u16 {
        self.cid += 1;
        sqe.set_cid(self.cid);
        self.send(PduHeader::CapsuleCmd(CapsuleCmd { sqe }), data);
        self.cid
    }

    /// Sends a command and collects its C2H data (in order) and its response.
    pub fn command_with_data(&mut self, sqe: Sqe, data: &[u8]) -> (Vec<u8>, Cqe) {
        let cid = self.submit(sqe, data);
        let mut read = Vec::new();
        loop {
            let f = self.framer.next(&self.rx).unwrap().expect("a response");
            let bytes = self.rx[f.data.clone()].to_vec();
            self.rx.drain(..f.len);
            match f.header {
                PduHeader::C2HData(d) => {
                    assert_eq!((d.cccid, d.datao as usize), (cid, read.len()));
                    read.extend_from_slice(&bytes);
                }
                PduHeader::CapsuleResp(r) => return (read, r.cqe),
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    pub fn command(&mut self, sqe: Sqe, data: &[u8]) -> Cqe {
        self.submit(sqe, data);
        loop {
            match self.recv().expect("a response") {
                PduHeader::CapsuleResp(r) => return r.cqe,
                _ => continue,
            }
        }
    }

    /// Moves the clock and lets the connection see it (as the reactor's tick does).
    pub fn advance(&mut self, by: Duration) {
        self.now += by;
        self.conn.tick(self.now);
        self.rx.extend_from_slice(&drive_and_take_output(&mut self.conn, self.now, &mut self.engine));
    }
}
