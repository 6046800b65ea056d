//! The command layer alone, with no transport: what a new transport (RDMA, loop) gets to build
//! on. Commands go in as SQEs with their data, come out as actions, and I/O leaves as backend
//! requests for the reactor to submit.

use crate::common;

use common::{target, HOST, SUB};
use nvmf_proto::fabrics::{fctype, reg, ConnectCmd, ConnectData, PropertySet, CNTLID_DYNAMIC};
use nvmf_proto::nvme::{admin_opcode, feature, io_opcode, log_page, SglDescriptor};
use nvmf_proto::{Sqe, Status};
use nvmf_target::backend::{AlignedBuf, IoOp};
use nvmf_target::command::{Action, BackendRequest, Commands, Work};
use nvmf_target::config::BackendConfig;
use nvmf_target::core::{Target, AEN_NS_ATTR, AEN_NS_CHANGED_DW0};
use nvmf_target::io::IoPlan;
use nvmf_target::transport::rdma::TRANSFER_SGL;
use nvmf_target::transport::TransportKind;
use std::sync::Arc;
use std::time::Instant;

fn respond(a: Action) -> (Status, u64) {
    match a {
        Action::Respond(status, result) => (status, result),
        other => panic!("expected a response, got {other:?}"),
    }
}

/// A queue connected (in-capsule Connect data) to controller `cntlid`.
fn connect(t: &Arc<Target>, qid: u16, cntlid: u16, now: Instant) -> (Commands, u16) {
    connect_with(t, qid, cntlid, TransportKind::Tcp, now)
}

/// The same, for a queue of transport `kind` (which names the SGL type of data it moves).
fn connect_with(t: &Arc<Target>, qid: u16, cntlid: u16, kind: TransportKind, now: Instant) -> (Commands, u16) {
    let mut c = Commands::new(t.clone(), None, kind.capabilities(&t.settings), now);
    let mut sqe = ConnectCmd { recfmt: 0, qid, sqsize: 31, cattr: 0, kato: 0 }.to_sqe(1);
    sqe.set_sgl(SglDescriptor::in_capsule(0, 1024));
    let data = ConnectData { hostid: [5; 16], cntlid, subnqn: SUB.into(), hostnqn: HOST.into() }.encode();
    let (status, result) = respond(c.command(&sqe, &data, true, now));
    assert_eq!(status, Status::SUCCESS);
    (c, result as u16)
}

#[test]
fn commands_route_and_io_leaves_as_backend_requests_without_a_transport() {
    let t = target(BackendConfig::Ram { size: 1 << 20 }, |_| {});
    let now = Instant::now();

    let mut none = Commands::new(t.clone(), None, TransportKind::Tcp.capabilities(&t.settings), now);
    let identify = Sqe::new(admin_opcode::IDENTIFY, 2);
    assert_eq!(respond(none.command(&identify, &[], true, now)).0, Status::CMD_SEQ_ERROR.with_dnr(), "nothing before Connect");

    let (mut admin, cntlid) = connect(&t, 0, CNTLID_DYNAMIC, now);
    let enable = PropertySet { size8: false, offset: reg::CC, value: 0x46_0001 }.to_sqe(3);
    assert_eq!(respond(admin.command(&enable, &[], true, now)).0, Status::SUCCESS);
    let (mut io, _) = connect(&t, 1, cntlid, now);

    // A 4 KiB read asks for a buffer; executing it queues one backend read into that buffer.
    let mut read = Sqe::new(io_opcode::READ, 4);
    read.set_nsid(1);
    read.set_slba(8);
    read.set_nlb(7);
    read.set_sgl(SglDescriptor::transport(4096));
    let Action::Buffer { work: Work::Io(plan), len: 4096, in_capsule: None } = io.command(&read, &[], true, now) else {
        panic!("a read needs a 4 KiB buffer")
    };
    assert_eq!(plan, IoPlan::Read { nsid: 1, offset: 4096, len: 4096 });
    let mut buf = AlignedBuf::with_align(64);
    buf.try_resize(4096).unwrap();
    assert_eq!(io.execute(plan, &mut buf, 77), Ok(1));
    assert_eq!(io.in_flight(), 1, "queued counts as in flight until its completion comes back");
    let reqs: Vec<(IoOp, u64, u64, u64)> = io
        .backend_requests()
        .map(|r| match r {
            BackendRequest::Submit(_, req) => (req.op, req.offset, req.len, req.tag),
            BackendRequest::Done(tag) => panic!("a RAM read is the backend's work, not done at once ({tag})"),
        })
        .collect();
    assert_eq!(reqs, [(IoOp::Read, 4096, 4096, 77)]);
    assert_eq!(io.backend_requests().count(), 0, "taken once");
    assert_eq!(io.request_done(Ok(()), 4), Status::SUCCESS);
    assert_eq!(io.io_done(plan, Status::SUCCESS), 4096, "the bytes read for the host");
    assert_eq!(io.in_flight(), 0);

    // Disconnect answers success and ends the queue.
    let disconnect = nvmf_proto::fabrics::disconnect_sqe(5);
    assert_eq!(disconnect.fctype(), fctype::DISCONNECT);
    assert_eq!(respond(io.command(&disconnect, &[], true, now)).0, Status::SUCCESS);
    assert!(io.take_ending(), "the transport closes once the response is out");
}

/// The asynchronous event path both transports share: an AER is held, and each tick the
/// transport asks `next_event` which held AER (CID) completes with which DW0 (NVMe/TCP answers
/// by CID, the RDMA queue finds the receive slot holding that CID). Built as the RDMA queue
/// builds its command layer: data moves as its keyed SGLs, normalized to TRANSFER_SGL.
#[test]
fn held_aers_complete_through_next_event_with_masking_until_log_04h_is_read() {
    let t = target(BackendConfig::Ram { size: 1 << 20 }, |_| {});
    let now = Instant::now();
    let (mut admin, _) = connect_with(&t, 0, CNTLID_DYNAMIC, TransportKind::Rdma, now);
    let enable = PropertySet { size8: false, offset: reg::CC, value: 0x46_0001 }.to_sqe(1);
    assert_eq!(respond(admin.command(&enable, &[], true, now)).0, Status::SUCCESS);
    let mut aec = Sqe::new(admin_opcode::SET_FEATURES, 2);
    aec.set_cdw(10, feature::ASYNC_EVENT_CONFIG as u32);
    aec.set_cdw(11, AEN_NS_ATTR);
    assert_eq!(respond(admin.command(&aec, &[], true, now)).0, Status::SUCCESS);
    for cid in [10, 11] {
        let aer = Sqe::new(admin_opcode::ASYNC_EVENT_REQUEST, cid);
        assert!(matches!(admin.command(&aer, &[], true, now), Action::Hold), "AER {cid} is held");
    }
    assert_eq!(admin.next_event(), None, "no event yet");

    t.namespace_changed(SUB, 2);
    assert_eq!(admin.next_event(), Some((10, AEN_NS_CHANGED_DW0 as u64)), "the oldest AER completes");
    assert_eq!(admin.next_event(), None, "one event, one completion");
    t.namespace_changed(SUB, 3);
    assert_eq!(admin.next_event(), None, "masked until log page 04h is read");

    let log = |cid: u16, rae: bool| {
        let mut s = Sqe::new(admin_opcode::GET_LOG_PAGE, cid);
        s.set_cdw(10, (1023 << 16) | (rae as u32) << 15 | log_page::CHANGED_NS_LIST as u32);
        s.set_sgl(SglDescriptor { addr: 0, length: 4096, sgl_type: TRANSFER_SGL });
        s
    };
    let nsids = |a: Action| match a {
        Action::Send(page) => page.chunks_exact(4).map(|d| u32::from_le_bytes(d.try_into().unwrap())).take_while(|n| *n != 0).collect::<Vec<_>>(),
        other => panic!("expected the log page, got {other:?}"),
    };
    assert_eq!(nsids(admin.command(&log(12, true), &[], true, now)), [2, 3]);
    t.namespace_changed(SUB, 4);
    assert_eq!(admin.next_event(), None, "read with RAE: still masked");
    assert_eq!(nsids(admin.command(&log(13, false), &[], true, now)), [4]);
    t.namespace_changed(SUB, 5);
    assert_eq!(admin.next_event(), Some((11, AEN_NS_CHANGED_DW0 as u64)), "unmasked: the second AER completes");
    assert_eq!(admin.next_event(), None, "no AER left to complete");
}

/// Identify Controller is answered from the queue's transport capabilities: an RDMA queue's
/// reply says keyed SGL data blocks are supported (Linux's RDMA host refuses a controller
/// without), a TCP queue's does not, and no transport edits the reply afterwards.
#[test]
fn identify_controller_reports_keyed_sgls_only_for_a_transport_that_takes_them() {
    let t = target(BackendConfig::Ram { size: 1 << 20 }, |_| {});
    let now = Instant::now();
    for (kind, sgl_type, keyed) in [(TransportKind::Tcp, SglDescriptor::transport(0).sgl_type, false), (TransportKind::Rdma, TRANSFER_SGL, true)] {
        let (mut admin, _) = connect_with(&t, 0, CNTLID_DYNAMIC, kind, now);
        let enable = PropertySet { size8: false, offset: reg::CC, value: 0x46_0001 }.to_sqe(1);
        assert_eq!(respond(admin.command(&enable, &[], true, now)).0, Status::SUCCESS);
        let mut id = Sqe::new(admin_opcode::IDENTIFY, 2);
        id.set_cdw(10, 1);
        id.set_sgl(SglDescriptor { addr: 0, length: 4096, sgl_type });
        let Action::Send(data) = admin.command(&id, &[], true, now) else { panic!("{kind:?}: Identify Controller data") };
        assert_eq!(data[536] & 1 << 2 != 0, keyed, "{kind:?}: SGLS bit 2 (keyed SGL data block)");
        assert_eq!(data[536] & 1, 1, "{kind:?}: SGLs supported");
    }
}
