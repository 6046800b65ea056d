//! Namespace Attribute Changed (NVMe Base: Asynchronous Event Request, notice 00h, log page 04h
//! Changed Namespace List) when the control surface adds, removes, enables or disables a
//! namespace: a connected host with an AER outstanding and the event enabled (Set Features 0Bh
//! bit 8) gets the completion, the log page lists the nsid and clears, and the queues already
//! connected serve the new namespace (the host's rescan finds it).

use crate::common;

use common::{Queue, HOST, SUB};
use nvmf_proto::fabrics::{reg, ConnectCmd, ConnectData, PropertySet, CNTLID_DYNAMIC};
use nvmf_proto::nvme::{admin_opcode, cns, feature, io_opcode, log_page, SglDescriptor};
use nvmf_proto::pdu::{encode_pdu, CapsuleCmd, IcReq};
use nvmf_proto::{Cqe, Digests, Framer, PduHeader, Role, Sqe, Status};
use nvmf_target::config::TargetConfig;
use nvmf_target::control::Control;
use nvmf_target::core::Target;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

/// Completion DW0 of the event: Notice (2), Namespace Attribute Changed (00h), log page 04h.
const NS_CHANGED: u64 = 0x0004_0002;
/// Set Features 0Bh bit 8: Namespace Attribute Notices.
const NS_ATTR: u32 = 1 << 8;

fn config() -> TargetConfig {
    common::loopback_config(SUB)
}

/// A target with namespace 1 and its control surface, no listener (in-process queues).
fn controlled() -> (Arc<Target>, Control) {
    let c = config();
    let t = Arc::new(Target::new(c.target.clone(), &c.subsystems, &c.ports).unwrap());
    (t.clone(), Control::new(t, c))
}

fn ok(c: &Control, json: String) {
    let r = c.handle_json(&json);
    assert_eq!(r["ok"], true, "{json} -> {r}");
}

fn add_ns(nsid: u32, size: u64) -> String {
    format!(r#"{{"op":"add_namespace","subsystem":"{SUB}","nsid":{nsid},"backend":"ram","size":{size}}}"#)
}

fn ns_op(op: &str, nsid: u32) -> String {
    format!(r#"{{"op":"{op}","subsystem":"{SUB}","nsid":{nsid}}}"#)
}

fn set_aec(value: u32) -> Sqe {
    let mut s = Sqe::new(admin_opcode::SET_FEATURES, 0);
    s.set_cdw(10, feature::ASYNC_EVENT_CONFIG as u32);
    s.set_cdw(11, value);
    s
}

/// Get Log Page 04h, all 4096 bytes; `rae` sets Retain Asynchronous Event.
fn changed_ns_log(rae: bool) -> Sqe {
    let mut s = Sqe::new(admin_opcode::GET_LOG_PAGE, 0);
    s.set_cdw(10, (1023 << 16) | (rae as u32) << 15 | log_page::CHANGED_NS_LIST as u32);
    s.set_sgl(SglDescriptor::transport(4096));
    s
}

fn active_ns_list() -> Sqe {
    let mut s = Sqe::new(admin_opcode::IDENTIFY, 0);
    s.set_cdw(10, cns::ACTIVE_NS_LIST as u32);
    s.set_sgl(SglDescriptor::transport(4096));
    s
}

/// The nonzero dwords of a list page (a Changed Namespace List or an active namespace list).
fn nsids(page: &[u8]) -> Vec<u32> {
    assert_eq!(page.len(), 4096);
    page.chunks_exact(4).map(|d| u32::from_le_bytes(d.try_into().unwrap())).take_while(|n| *n != 0).collect()
}

fn io_sqe(opcode: u8, nsid: u32, blocks: u16) -> Sqe {
    let mut s = Sqe::new(opcode, 0);
    s.set_nsid(nsid);
    s.set_nlb(blocks - 1);
    s
}

/// In-process queues: the admin queue's next response after the reactor's tick, if any.
fn response_after_tick(admin: &mut Queue) -> Option<Cqe> {
    admin.advance(Duration::from_millis(20));
    match admin.recv()? {
        PduHeader::CapsuleResp(r) => Some(r.cqe),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn an_added_namespace_completes_the_outstanding_aer_and_is_served_on_the_live_queues() {
    let (t, c) = controlled();
    let (mut admin, mut io) = Queue::admin_and_io(&t);
    assert_eq!(admin.command(set_aec(NS_ATTR), &[]).status, Status::SUCCESS);
    let aer = admin.submit(Sqe::new(admin_opcode::ASYNC_EVENT_REQUEST, 0), &[]);
    assert!(response_after_tick(&mut admin).is_none(), "no event yet: the AER stays outstanding");

    ok(&c, add_ns(2, 1 << 20));
    let cqe = response_after_tick(&mut admin).expect("the AER completes on the next tick");
    assert_eq!((cqe.cid, cqe.status, cqe.result), (aer, Status::SUCCESS, NS_CHANGED));

    let (page, cqe) = admin.command_with_data(changed_ns_log(false), &[]);
    assert_eq!((cqe.status, nsids(&page)), (Status::SUCCESS, vec![2]));
    let (page, _) = admin.command_with_data(changed_ns_log(false), &[]);
    assert_eq!(nsids(&page), Vec::<u32>::new(), "reading the log page clears it");
    let (page, _) = admin.command_with_data(active_ns_list(), &[]);
    assert_eq!(nsids(&page), vec![1, 2], "the rescan finds the new namespace");

    // The I/O queue connected before the change writes and reads the new namespace.
    let data: Vec<u8> = (0..1024u32).map(|i| (i * 7) as u8).collect();
    let mut w = io_sqe(io_opcode::WRITE, 2, 2);
    w.set_sgl(SglDescriptor::in_capsule(0, 1024));
    assert_eq!(io.command(w, &data).status, Status::SUCCESS);
    let mut r = io_sqe(io_opcode::READ, 2, 2);
    r.set_sgl(SglDescriptor::transport(1024));
    let (read, cqe) = io.command_with_data(r, &[]);
    assert_eq!((cqe.status, read), (Status::SUCCESS, data));

    // Removed: the live I/O queue gets Invalid Namespace, the active list drops it.
    ok(&c, ns_op("remove_namespace", 2));
    let mut r = io_sqe(io_opcode::READ, 2, 1);
    r.set_sgl(SglDescriptor::transport(512));
    assert_eq!(io.command(r, &[]).status, Status::INVALID_NS.with_dnr());
    let (page, _) = admin.command_with_data(active_ns_list(), &[]);
    assert_eq!(nsids(&page), vec![1]);
}

#[test]
fn the_event_is_masked_until_the_log_page_is_read_without_rae() {
    let (t, c) = controlled();
    let (mut admin, _io) = Queue::admin_and_io(&t);
    assert_eq!(admin.command(set_aec(NS_ATTR), &[]).status, Status::SUCCESS);
    ok(&c, add_ns(2, 1 << 20));
    // The event waited for an AER: the next one completes at once.
    let cqe = admin.command(Sqe::new(admin_opcode::ASYNC_EVENT_REQUEST, 0), &[]);
    assert_eq!((cqe.status, cqe.result), (Status::SUCCESS, NS_CHANGED));

    admin.submit(Sqe::new(admin_opcode::ASYNC_EVENT_REQUEST, 0), &[]);
    ok(&c, ns_op("disable_namespace", 1));
    ok(&c, ns_op("disable_namespace", 1)); // no change: no entry, no event
    assert!(response_after_tick(&mut admin).is_none(), "masked: the host has not read log page 04h");

    let (page, _) = admin.command_with_data(changed_ns_log(true), &[]);
    assert_eq!(nsids(&page), vec![2, 1], "every change since, once each");
    ok(&c, ns_op("enable_namespace", 1));
    assert!(response_after_tick(&mut admin).is_none(), "read with RAE: still masked");

    let (page, _) = admin.command_with_data(changed_ns_log(false), &[]);
    assert_eq!(nsids(&page), vec![1]);
    ok(&c, ns_op("disable_namespace", 2));
    let cqe = response_after_tick(&mut admin).expect("unmasked by the read without RAE");
    assert_eq!(cqe.result, NS_CHANGED);
}

#[test]
fn without_the_event_enabled_no_aer_completes_but_the_log_still_lists_the_change() {
    let (t, c) = controlled();
    let (mut admin, _io) = Queue::admin_and_io(&t);
    admin.submit(Sqe::new(admin_opcode::ASYNC_EVENT_REQUEST, 0), &[]);
    ok(&c, add_ns(7, 4096));
    assert!(response_after_tick(&mut admin).is_none(), "Set Features 0Bh bit 8 was never set");
    let (page, _) = admin.command_with_data(changed_ns_log(false), &[]);
    assert_eq!(nsids(&page), vec![7]);
}

#[test]
fn over_1024_changed_namespaces_read_as_ffffffff_alone() {
    let (t, _c) = controlled();
    let (mut admin, _io) = Queue::admin_and_io(&t);
    for nsid in 1..=1025 {
        t.namespace_changed(SUB, nsid);
    }
    t.namespace_changed(SUB, 1); // a repeat changes nothing
    let (page, _) = admin.command_with_data(changed_ns_log(false), &[]);
    assert_eq!(nsids(&page), vec![u32::MAX]);
    t.namespace_changed("nqn.other", 3); // another subsystem's change is not ours
    t.namespace_changed(SUB, 4);
    let (page, _) = admin.command_with_data(changed_ns_log(false), &[]);
    assert_eq!(nsids(&page), vec![4], "cleared by the read, then listed normally again");
}

#[test]
fn identify_controller_announces_namespace_attribute_notices() {
    let (t, _c) = controlled();
    let (mut admin, _io) = Queue::admin_and_io(&t);
    let mut id = Sqe::new(admin_opcode::IDENTIFY, 0);
    id.set_cdw(10, cns::CONTROLLER as u32);
    id.set_sgl(SglDescriptor::transport(4096));
    let (page, _) = admin.command_with_data(id, &[]);
    let oaes = u32::from_le_bytes(page[92..96].try_into().unwrap());
    assert_eq!(oaes & NS_ATTR, NS_ATTR, "OAES bit 8: Linux enables only the events announced here");
}

// ---- end to end: a real socket, the control socket and nvmf-target-ctl ----

struct Client {
    s: TcpStream,
    framer: Framer,
    rx: Vec<u8>,
    cid: u16,
}

impl Client {
    fn connect(addr: SocketAddr, qid: u16, cntlid: u16) -> (Client, Cqe) {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut c = Client { s, framer: Framer::new(Role::Host, 1 << 20), rx: Vec::new(), cid: 0 };
        c.send(PduHeader::IcReq(IcReq { pfv: 0, hpda: 0, hdgst: false, ddgst: false, maxr2t: 0 }), &[]);
        assert!(matches!(c.recv(), Some((PduHeader::IcResp(_), _))));
        let mut sqe = ConnectCmd { recfmt: 0, qid, sqsize: 31, cattr: 0, kato: 0 }.to_sqe(0);
        sqe.set_sgl(SglDescriptor::in_capsule(0, 1024));
        let d = ConnectData { hostid: [1; 16], cntlid, subnqn: SUB.into(), hostnqn: HOST.into() };
        let cqe = c.command(sqe, &d.encode()).1;
        (c, cqe)
    }

    fn send(&mut self, hdr: PduHeader, data: &[u8]) {
        let mut b = Vec::new();
        encode_pdu(&mut b, &hdr, data, Digests::default());
        self.s.write_all(&b).unwrap();
    }

    /// Next PDU (None: closed); a read timeout (5 s) fails the test.
    fn recv(&mut self) -> Option<(PduHeader, Vec<u8>)> {
        loop {
            if let Some(f) = self.framer.next(&self.rx).unwrap() {
                let data = self.rx[f.data.clone()].to_vec();
                self.rx.drain(..f.len);
                return Some((f.header, data));
            }
            let mut buf = [0u8; 65536];
            match self.s.read(&mut buf) {
                Ok(0) => return None,
                Ok(n) => self.rx.extend_from_slice(&buf[..n]),
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    fn submit(&mut self, mut sqe: Sqe, data: &[u8]) -> u16 {
        self.cid += 1;
        sqe.set_cid(self.cid);
        self.send(PduHeader::CapsuleCmd(CapsuleCmd { sqe }), data);
        self.cid
    }

    fn command(&mut self, sqe: Sqe, data: &[u8]) -> (Vec<u8>, Cqe) {
        self.submit(sqe, data);
        let mut read = Vec::new();
        loop {
            match self.recv().expect("response") {
                (PduHeader::C2HData(_), d) => read.extend_from_slice(&d),
                (PduHeader::CapsuleResp(r), _) => return (read, r.cqe),
                other => panic!("unexpected {other:?}"),
            }
        }
    }
}

#[test]
fn nvmf_target_ctl_adding_a_namespace_completes_a_connected_hosts_aer() {
    let dir = std::env::temp_dir().join(format!("nvmflab-nsevents-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("c.sock");
    let mut c = config();
    c.target.control = Some(sock.clone());
    let t = nvmf_target::start(c).expect("start");
    let addr = t.listen_addrs()[0];

    let (mut admin, cqe) = Client::connect(addr, 0, CNTLID_DYNAMIC);
    assert_eq!(cqe.status, Status::SUCCESS);
    let cntlid = cqe.result as u16;
    let enable = PropertySet { size8: false, offset: reg::CC, value: 0x46_0001 }.to_sqe(0);
    assert_eq!(admin.command(enable, &[]).1.status, Status::SUCCESS);
    let (mut io, cqe) = Client::connect(addr, 1, cntlid);
    assert_eq!(cqe.status, Status::SUCCESS);
    assert_eq!(admin.command(set_aec(NS_ATTR), &[]).1.status, Status::SUCCESS);
    let aer = admin.submit(Sqe::new(admin_opcode::ASYNC_EVENT_REQUEST, 0), &[]);

    let out = Command::new(env!("CARGO_BIN_EXE_nvmf-target-ctl"))
        .arg("--socket")
        .arg(&sock)
        .arg(add_ns(2, 1 << 20))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));

    match admin.recv() {
        Some((PduHeader::CapsuleResp(r), _)) => {
            assert_eq!((r.cqe.cid, r.cqe.status, r.cqe.result), (aer, Status::SUCCESS, NS_CHANGED))
        }
        other => panic!("expected the AER's completion, got {other:?}"),
    }
    let (page, _) = admin.command(changed_ns_log(false), &[]);
    assert_eq!(nsids(&page), vec![2]);
    let (page, _) = admin.command(active_ns_list(), &[]);
    assert_eq!(nsids(&page), vec![1, 2]);
    let mut w = io_sqe(io_opcode::WRITE_ZEROES, 2, 8);
    w.set_sgl(SglDescriptor::transport(0));
    assert_eq!(io.command(w, &[]).1.status, Status::SUCCESS, "the live I/O queue serves namespace 2");
    drop(t);
    let _ = std::fs::remove_dir_all(&dir);
}
