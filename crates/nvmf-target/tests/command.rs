//! The command layer alone, with no transport: what a new transport (RDMA, loop) gets to build
//! on. Commands go in as SQEs with their data, come out as actions, and I/O leaves as backend
//! requests for the reactor to submit.

mod common;

use common::{target, HOST, SUB};
use nvmf_proto::fabrics::{fctype, reg, ConnectCmd, ConnectData, PropertySet, CNTLID_DYNAMIC};
use nvmf_proto::nvme::{admin_opcode, io_opcode, SglDescriptor, SGL_TRANSPORT_DATA_BLOCK};
use nvmf_proto::{Sqe, Status};
use nvmf_target::backend::{AlignedBuf, IoOp};
use nvmf_target::command::{Action, BackendRequest, Commands, Work};
use nvmf_target::config::BackendConfig;
use nvmf_target::core::Target;
use nvmf_target::io::IoPlan;
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
    let mut c = Commands::new(t.clone(), None, SGL_TRANSPORT_DATA_BLOCK, now);
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

    let mut none = Commands::new(t.clone(), None, SGL_TRANSPORT_DATA_BLOCK, now);
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
