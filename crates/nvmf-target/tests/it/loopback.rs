//! The command layer driven through the loop transport (`transport/loopback.rs`): capsules in,
//! data and responses out as values, over the same per-command lifecycle as TCP and RDMA.

use crate::common;

use common::{target, HOST, SUB};
use nvmf_proto::fabrics::{reg, ConnectCmd, ConnectData, PropertySet, CNTLID_DYNAMIC};
use nvmf_proto::nvme::{admin_opcode, io_opcode, SglDescriptor};
use nvmf_proto::{Cqe, Sqe, Status};
use nvmf_target::config::{BackendConfig, NamespaceConfig, SubsystemConfig, TargetSettings};
use nvmf_target::core::Target;
use nvmf_target::transport::loopback::{Loop, LoopError, Reply};
use std::sync::Arc;
use std::time::Instant;

const DEPTH: u16 = 8;

/// Submits one capsule, runs it through, and returns what came back.
fn exchange(q: &mut Loop, sqe: &Sqe, in_capsule: &[u8], host: Vec<u8>) -> Vec<Reply> {
    let now = Instant::now();
    q.submit(sqe, in_capsule, host, now).expect("a free slot");
    q.run(now);
    q.take_replies()
}

/// The one response among `replies`, which must be the last.
fn response(replies: &[Reply]) -> Cqe {
    match replies.last() {
        Some(Reply::Response(cqe)) => *cqe,
        other => panic!("expected a response last, got {other:?} in {replies:?}"),
    }
}

fn connect(t: &Arc<Target>, qid: u16, cntlid: u16) -> (Loop, Cqe) {
    let mut q = Loop::new(t.clone(), DEPTH, Instant::now());
    let mut sqe = ConnectCmd { recfmt: 0, qid, sqsize: DEPTH - 1, cattr: 0, kato: 0 }.to_sqe(1);
    sqe.set_sgl(SglDescriptor::in_capsule(0, 1024));
    let data = ConnectData { hostid: [5; 16], cntlid, subnqn: SUB.into(), hostnqn: HOST.into() }.encode();
    let replies = exchange(&mut q, &sqe, &data, Vec::new());
    assert_eq!(replies.len(), 1, "Connect is answered by one response: {replies:?}");
    let cqe = response(&replies);
    (q, cqe)
}

/// An enabled controller's admin queue and one I/O queue.
fn io_queue(t: &Arc<Target>) -> (Loop, Loop) {
    let (mut admin, cqe) = connect(t, 0, CNTLID_DYNAMIC);
    assert!(cqe.status.is_success(), "admin Connect: {}", cqe.status);
    let enable = PropertySet { size8: false, offset: reg::CC, value: 0x46_0001 }.to_sqe(2);
    assert!(response(&exchange(&mut admin, &enable, &[], Vec::new())).status.is_success());
    let (io, cqe) = connect(t, 1, cqe.result as u16);
    assert!(cqe.status.is_success(), "I/O Connect: {}", cqe.status);
    (admin, io)
}

/// A target whose buffer memory is `bytes`, below what configuration validation accepts.
fn small_buffer_target(bytes: u64) -> Arc<Target> {
    let mut sub = SubsystemConfig::new(SUB);
    sub.namespaces.push(NamespaceConfig { nsid: 1, backend: BackendConfig::Ram { size: 1 << 20 }, block_size: 512, nguid: None, uuid: None });
    let settings = TargetSettings { buffer_memory: Some(bytes), ..TargetSettings::default() };
    Arc::new(Target::new(settings, &[sub], &[]).unwrap())
}

/// A read or write of `blocks` 512-byte blocks at `slba` whose data the transport moves.
fn rw(op: u8, cid: u16, slba: u64, blocks: u16) -> Sqe {
    let mut s = Sqe::new(op, cid);
    s.set_nsid(1);
    s.set_slba(slba);
    s.set_nlb(blocks - 1);
    s.set_sgl(SglDescriptor::transport(blocks as u32 * 512));
    s
}

#[test]
fn connect_then_identify_controller_returns_its_data_before_the_response() {
    let t = target(BackendConfig::Ram { size: 1 << 20 }, |_| {});
    let mut none = Loop::new(t.clone(), DEPTH, Instant::now());
    let identify = Sqe::new(admin_opcode::IDENTIFY, 9);
    assert_eq!(response(&exchange(&mut none, &identify, &[], vec![0; 4096])).status, Status::CMD_SEQ_ERROR.with_dnr(), "nothing before Connect");

    let (mut admin, cqe) = connect(&t, 0, CNTLID_DYNAMIC);
    assert!(cqe.status.is_success(), "{}", cqe.status);
    assert_eq!((cqe.cid, cqe.sqid), (1, 0));
    assert!(admin.commands().queue().is_some_and(|q| q.qid == 0), "connected");
    // /stats names the queue's transport from its kind, as it does TCP's and RDMA's
    assert_eq!(admin.commands().queue().map(|q| q.stats.transport.name()), Some("loop"));
    let enable = PropertySet { size8: false, offset: reg::CC, value: 0x46_0001 }.to_sqe(2);
    assert!(response(&exchange(&mut admin, &enable, &[], Vec::new())).status.is_success());

    let mut identify = Sqe::new(admin_opcode::IDENTIFY, 3);
    identify.set_cdw(10, 1); // CNS 01h: the controller
    identify.set_sgl(SglDescriptor::transport(4096));
    let replies = exchange(&mut admin, &identify, &[], vec![0; 4096]);
    let [Reply::Data { cid: 3, data }, Reply::Response(cqe)] = &replies[..] else { panic!("data, then the response: {replies:?}") };
    assert!(cqe.status.is_success() && cqe.cid == 3, "{cqe:?}");
    assert_eq!(data.len(), 4096);
    let subnqn = &data[768..768 + SUB.len()];
    assert_eq!(subnqn, SUB.as_bytes(), "Identify Controller names the subsystem");
}

#[test]
fn a_write_fetched_from_host_memory_reads_back_the_same() {
    let t = target(BackendConfig::Ram { size: 1 << 20 }, |_| {});
    let (_admin, mut io) = io_queue(&t);
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    let replies = exchange(&mut io, &rw(io_opcode::WRITE, 5, 16, 8), &[], data.clone());
    assert_eq!(replies.len(), 1, "a write sends no data: {replies:?}");
    assert!(response(&replies).status.is_success());

    let replies = exchange(&mut io, &rw(io_opcode::READ, 6, 16, 8), &[], vec![0; 4096]);
    let [Reply::Data { cid: 6, data: read }, Reply::Response(cqe)] = &replies[..] else { panic!("data, then the response: {replies:?}") };
    assert!(cqe.status.is_success(), "{}", cqe.status);
    assert_eq!(read, &data, "the read returns what was written");

    // In-capsule data goes the same way, without a fetch.
    let mut w = rw(io_opcode::WRITE, 7, 24, 1);
    w.set_sgl(SglDescriptor::in_capsule(0, 512));
    assert!(response(&exchange(&mut io, &w, &[0xA5; 512], Vec::new())).status.is_success());
    let replies = exchange(&mut io, &rw(io_opcode::READ, 8, 24, 1), &[], vec![0; 512]);
    assert_eq!(replies[0], Reply::Data { cid: 8, data: vec![0xA5; 512] });
}

#[test]
fn commands_wait_for_buffer_memory_and_are_served_in_arrival_order() {
    // 128 KiB for the process: A (64 KiB) and B (60 KiB) fit; C (64 KiB) waits, and D (4 KiB)
    // waits behind it though it would fit.
    let t = small_buffer_target(128 << 10);
    let (_admin, mut io) = io_queue(&t);
    let now = Instant::now();
    for (cid, slba, blocks) in [(11u16, 0u64, 128u16), (12, 256, 120), (13, 512, 128), (14, 768, 8)] {
        io.submit(&rw(io_opcode::WRITE, cid, slba, blocks), &[], vec![cid as u8; blocks as usize * 512], now).unwrap();
    }
    assert!(io.is_waiting(), "C and D wait for memory");
    assert!(io.take_replies().is_empty(), "nothing is answered before the data is fetched");

    io.run(now);
    assert!(!io.is_waiting());
    let cids: Vec<u16> = io.take_replies().iter().map(|r| match r {
        Reply::Response(c) if c.status.is_success() => c.cid,
        other => panic!("expected a successful response, got {other:?}"),
    }).collect();
    assert_eq!(cids, [11, 12, 13, 14], "served in arrival order");
    assert!(t.buffers.used() <= 128 << 10, "within the process budget: {}", t.buffers.used());
    let replies = exchange(&mut io, &rw(io_opcode::READ, 15, 768, 8), &[], vec![0; 4096]);
    assert_eq!(replies[0], Reply::Data { cid: 15, data: vec![14; 4096] }, "D's data landed after its wait");
}

#[test]
fn errors_come_back_as_statuses_and_the_queue_keeps_serving() {
    let t = target(BackendConfig::Ram { size: 1 << 20 }, |_| {});
    let (_admin, mut io) = io_queue(&t);
    let replies = exchange(&mut io, &rw(io_opcode::READ, 1, 2040, 16), &[], vec![0; 8192]);
    assert_eq!(replies, [Reply::Response(Cqe { status: Status::LBA_OUT_OF_RANGE.with_dnr(), ..response(&replies) })], "no data for a failed read");
    // Host memory shorter than the write's length: the fetch fails, the command gets its status.
    let replies = exchange(&mut io, &rw(io_opcode::WRITE, 2, 0, 8), &[], vec![0; 512]);
    assert_eq!(response(&replies).status, Status::SGL_INVALID_DATA_LEN.with_dnr());
    assert!(response(&exchange(&mut io, &rw(io_opcode::WRITE, 3, 0, 1), &[], vec![1; 512])).status.is_success());

    // More commands than slots are refused by name, not lost.
    let now = Instant::now();
    for cid in 0..DEPTH {
        io.submit(&rw(io_opcode::WRITE, 20 + cid, 0, 1), &[], vec![0; 512], now).unwrap();
    }
    assert_eq!(io.submit(&rw(io_opcode::WRITE, 40, 0, 1), &[], vec![0; 512], now), Err(LoopError::QueueFull));
    io.run(now);
    assert_eq!(io.take_replies().len(), DEPTH as usize, "each command answered once");
}
