//! Limits under abuse, in process with a clock the test moves: stalled connections are dropped,
//! the process-wide buffer cap makes commands wait (not fail, not allocate) and bounds the
//! output a host leaves unread, and a Connect over the controller cap is answered Connect
//! Controller Busy.

use crate::common;

use common::Queue;
use nvmf_proto::fabrics::CNTLID_DYNAMIC;
use nvmf_proto::nvme::{io_opcode, SglDescriptor};
use nvmf_proto::pdu::{encode_pdu, CapsuleCmd, H2CData, IcReq};
use nvmf_proto::{Digests, PduHeader, Sqe, Status};
use nvmf_target::config::BackendConfig;
use nvmf_target::reactor::drive;
use std::time::Duration;

const MS: Duration = Duration::from_millis(1);
const RAM: BackendConfig = BackendConfig::Ram { size: 8 << 20 };

fn icreq_bytes() -> Vec<u8> {
    let mut b = Vec::new();
    let icreq = PduHeader::IcReq(IcReq { pfv: 0, hpda: 0, hdgst: false, ddgst: false, maxr2t: 0 });
    encode_pdu(&mut b, &icreq, &[], Digests::default());
    b
}

/// A write of `len` bytes at LBA 0 whose data must come through R2T.
fn r2t_write(len: u32) -> Sqe {
    let mut w = Sqe::new(io_opcode::WRITE, 0);
    w.set_nsid(1);
    w.set_nlb((len / 512 - 1) as u16);
    w.set_sgl(SglDescriptor::transport(len));
    w
}

#[test]
fn a_half_sent_pdu_is_dropped_after_the_stall_timeout() {
    let t = common::target(RAM, |s| s.stall_timeout_ms = 500);
    let mut half = Queue::raw(&t);
    half.send_bytes(&icreq_bytes()[..40]);
    let mut silent = Queue::raw(&t);
    half.advance(400 * MS);
    silent.advance(400 * MS);
    assert!(!half.conn.should_close(), "400 ms: within the timeout");
    half.advance(200 * MS);
    silent.advance(200 * MS);
    assert!(half.conn.should_close(), "600 ms after its first bytes the rest of the ICReq never came");
    assert!(!silent.conn.should_close(), "a connection that owes nothing is left to the connect timeout");
}

#[test]
fn dribbled_bytes_do_not_keep_a_pdu_alive() {
    let t = common::target(RAM, |s| s.stall_timeout_ms = 500);
    let mut q = Queue::raw(&t);
    let icreq = icreq_bytes();
    for (i, byte) in icreq[..100].iter().enumerate() {
        q.send_bytes(&[*byte]);
        q.advance(50 * MS);
        if q.conn.should_close() {
            assert!(i >= 9, "dropped after {i} bytes, before the timeout");
            return;
        }
    }
    panic!("one byte every 50 ms kept a 128-byte ICReq pending for 5 s");
}

#[test]
fn an_unanswered_r2t_is_dropped_and_an_idle_queue_is_not() {
    let t = common::target(RAM, |s| s.stall_timeout_ms = 500);
    let (mut admin, mut io) = Queue::admin_and_io(&t);
    io.submit(r2t_write(64 << 10), &[]);
    assert!(matches!(io.recv(), Some(PduHeader::R2T(_))), "the target asks for the data");
    // The clock starts at the tick after the last progress (the R2T going out).
    for _ in 0..4 {
        io.advance(200 * MS);
        admin.advance(200 * MS);
    }
    assert!(io.conn.should_close(), "the host never sent the H2CData it owed");
    assert!(!admin.conn.should_close(), "an idle admin queue (kato 0) stays");
    assert_eq!(t.buffers.used(), 64 << 10, "its buffer is counted until the reactor drops it");
    drop(io);
    assert_eq!(t.buffers.used(), 0, "and given back to the process then");
}

#[test]
fn commands_wait_for_the_process_buffer_cap_then_run() {
    // 2 MiB for every connection together: one 2 MiB write fills it.
    let t = common::target(RAM, |s| s.buffer_memory = Some(2 << 20));
    let (_admin, cntlid) = Queue::admin(&t);
    let (mut a, cqe) = Queue::open(&t, 1, cntlid);
    assert_eq!(cqe.status, Status::SUCCESS);
    let (mut b, cqe) = Queue::open(&t, 2, cntlid);
    assert_eq!(cqe.status, Status::SUCCESS);

    let big = 2 << 20;
    let cid_a = a.submit(r2t_write(big), &[]);
    let Some(PduHeader::R2T(first)) = a.recv() else { panic!("A's write gets an R2T") };
    assert_eq!(t.buffers.used(), big as usize);
    b.submit(r2t_write(4096), &[]);
    assert!(b.recv().is_none(), "B's write waits: the process cap is reached");
    assert!(t.buffers.refusals() > 0);
    b.advance(20 * MS);
    assert!(b.recv().is_none(), "still waiting while A holds the memory");

    // A sends its data, R2T by R2T, and completes.
    let mut r2t = first;
    loop {
        let data = vec![0x33u8; r2t.r2tl as usize];
        let last = r2t.r2to + r2t.r2tl == big;
        let h = H2CData { cccid: cid_a, ttag: r2t.ttag, datao: r2t.r2to, datal: r2t.r2tl, last };
        a.send(PduHeader::H2CData(h), &data);
        match a.recv() {
            Some(PduHeader::R2T(next)) => r2t = next,
            Some(PduHeader::CapsuleResp(r)) => {
                assert_eq!(r.cqe.status, Status::SUCCESS);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(t.buffers.used() < big as usize, "A's buffer went back to the process (it was under pressure)");
    b.advance(20 * MS);
    assert!(matches!(b.recv(), Some(PduHeader::R2T(_))), "B's write got its memory on the next tick");
    assert_eq!(t.buffers.peak(), big as usize, "the cap held: B waited instead of adding to A's 2 MiB");
}

/// A 4 KiB read at LBA 0.
fn read_4k() -> Sqe {
    let mut r = Sqe::new(io_opcode::READ, 0);
    r.set_nsid(1);
    r.set_nlb(7);
    r.set_sgl(SglDescriptor::transport(4096));
    r
}

#[test]
fn output_a_host_leaves_unread_counts_against_the_process_buffer_cap() {
    const CAP: usize = 2 << 20; // the least allowed: one command of MDTS
    // Flushes: they need no buffer memory, so only the output rule can hold them back. 24 bytes
    // of answer each: 400 000 of them would pass the 8 MiB per-connection high-water mark.
    const COMMANDS: u32 = 400_000;
    let t = common::target(RAM, |s| s.buffer_memory = Some(CAP as u64));
    let (_admin, cntlid) = Queue::admin(&t);
    let (mut greedy, _) = Queue::open(&t, 1, cntlid);
    let (mut other, _) = Queue::open(&t, 2, cntlid);
    let read = |q: &mut Queue| {
        let (data, cqe) = q.command_with_data(read_4k(), &[]);
        assert_eq!((cqe.status, data.len()), (Status::SUCCESS, 4096));
    };
    read(&mut other);

    // The greedy host keeps its 32 commands outstanding as the target frees their slots, and
    // takes none of the answers.
    let mut sent = 0u32;
    while sent < COMMANDS && !greedy.conn.wants().hold {
        let mut burst = Vec::new();
        for _ in 0..32 {
            sent += 1;
            let mut sqe = Sqe::new(io_opcode::FLUSH, sent as u16);
            sqe.set_nsid(1);
            encode_pdu(&mut burst, &PduHeader::CapsuleCmd(CapsuleCmd { sqe }), &[], Digests::default());
        }
        greedy.conn.feed(&burst);
        drive(&mut greedy.conn, greedy.now, &mut greedy.engine);
    }
    let queued = greedy.conn.output_len();
    assert!(t.buffers.full(), "its output filled the cap: {} of {CAP} bytes, {queued} queued", t.buffers.used());
    assert!(queued < 3 * CAP, "it stopped at the cap, not at the 8 MiB mark: {queued} bytes queued");
    assert!(greedy.conn.wants().hold, "the rest of its commands wait");
    read(&mut other); // a connection with little output queued goes on

    // Once the host reads, the commands held back run, every one answered once.
    greedy.advance(MS);
    let mut answered = 0;
    while let Some(pdu) = greedy.recv() {
        if let PduHeader::CapsuleResp(r) = pdu {
            assert_eq!(r.cqe.status, Status::SUCCESS);
            answered += 1;
        }
    }
    assert_eq!(answered, sent as usize);
    greedy.advance(MS); // a tick with nothing queued gives the grown output buffer back
    assert!(t.buffers.used() < CAP / 4, "the output's memory went back: {} bytes used", t.buffers.used());
    drop((greedy, other, _admin));
    assert_eq!(t.buffers.used(), 0, "and the rest with the connections");
}

#[test]
fn a_connect_over_the_controller_cap_is_controller_busy() {
    let t = common::target(RAM, |s| s.max_controllers = 1);
    let (_first, cqe) = Queue::open(&t, 0, CNTLID_DYNAMIC);
    assert_eq!(cqe.status, Status::SUCCESS);
    let (_second, cqe) = Queue::open(&t, 0, CNTLID_DYNAMIC);
    assert_eq!(cqe.status, Status::CONNECT_CTRL_BUSY.with_dnr(), "SCT 1 SC 0x81");
    drop(_first);
    let (_third, cqe) = Queue::open(&t, 0, CNTLID_DYNAMIC);
    assert_eq!(cqe.status, Status::SUCCESS, "room again once the first controller is gone");
}
