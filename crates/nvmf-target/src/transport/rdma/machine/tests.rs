//! The RDMA machine driven without a device: the test plays the driver, landing RDMA READ data
//! in slot buffers, completing SENDs and running backend requests on a real engine.

use super::*;
use crate::backend::IoEngine;
use crate::config::{BackendConfig, NamespaceConfig, SubsystemConfig, TargetSettings};
use crate::config::ReactorMode;
use nvmf_proto::fabrics::{cc, reg, ConnectCmd, ConnectData, PropertySet, CNTLID_DYNAMIC};
use nvmf_proto::nvme::{admin_opcode, io_opcode, SglDescriptor};

const SUBNQN: &str = "nqn.2024-01.io.nvmflab:rdma-machine";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-4000-8000-0000000000aa";
const DEPTH: u16 = 8;

fn target(buffer_memory: Option<u64>) -> Arc<Target> {
    let mut sub = SubsystemConfig::new(SUBNQN);
    sub.namespaces.push(NamespaceConfig { nsid: 1, backend: BackendConfig::Ram { size: 8 << 20 }, block_size: 512, nguid: None, uuid: None });
    let settings = TargetSettings { buffer_memory, ..TargetSettings::default() };
    Arc::new(Target::new(settings, &[sub], &[]).unwrap())
}

/// The test's end of one queue: the machine, an engine, and what it asked to post.
struct Host {
    m: Machine,
    engine: IoEngine,
    now: Instant,
}

impl Host {
    fn new(target: &Arc<Target>, qid: u16, token: u32) -> Host {
        let stats = Arc::new(ReactorStats::new(0, 0, ReactorMode::Event, 0));
        let now = Instant::now();
        let mut h = Host { m: Machine::new(target.clone(), None, stats, qid, DEPTH, token, now), engine: IoEngine::new(16), now };
        assert_eq!(h.posts(), (0..DEPTH).map(Post::Recv).collect::<Vec<_>>(), "every receive is posted first");
        h
    }

    fn posts(&mut self) -> Vec<Post> {
        let mut v = Vec::new();
        self.m.take_posts(&mut v);
        v
    }

    /// Runs the backend requests the machine queued until none is left.
    fn run_backend(&mut self) {
        let mut done = Vec::new();
        for _ in 0..100 {
            self.m.submit(&mut self.engine);
            self.engine.flush();
            self.engine.reap(&mut done);
            if done.is_empty() {
                if self.engine.in_flight() == 0 {
                    return;
                }
                self.engine.wait_one();
            }
            for c in done.drain(..) {
                self.m.io_done(c);
            }
        }
        panic!("backend requests did not finish");
    }

    /// Receives a capsule in `slot`, runs what it started, and returns the posts.
    fn capsule(&mut self, slot: u16, sqe: &Sqe, data: &[u8]) -> Vec<Post> {
        let mut c = sqe.0.to_vec();
        c.extend_from_slice(data);
        self.m.received(slot, &c, self.now);
        self.run_backend();
        self.posts()
    }

    /// The SEND of `slot` completes: its receive must be posted again.
    fn sent(&mut self, slot: u16) {
        self.m.sent(slot);
        assert_eq!(self.posts(), vec![Post::Recv(slot)], "the receive is reposted after the response");
    }

    fn connect(&mut self, qid: u16, cntlid: u16) -> Cqe {
        let mut sqe = ConnectCmd { recfmt: 0, qid, sqsize: DEPTH - 1, cattr: 0, kato: 0 }.to_sqe(1);
        sqe.set_sgl(SglDescriptor::in_capsule(0, 1024));
        let data = ConnectData { hostid: [7; 16], cntlid, subnqn: SUBNQN.into(), hostnqn: HOSTNQN.into() }.encode();
        let posts = self.capsule(0, &sqe, &data);
        self.sent(0);
        response(&posts, 0)
    }
}

/// The one response among `posts`, which must be for `slot`, last.
fn response(posts: &[Post], slot: u16) -> Cqe {
    match posts.last() {
        Some(Post::Send { slot: s, cqe, .. }) if *s == slot => Cqe::decode(cqe),
        _ => panic!("no response for slot {slot} last in {posts:?}"),
    }
}

fn keyed(sqe: &mut Sqe, len: u32, invalidate: bool) -> KeyedSgl {
    let k = KeyedSgl { addr: 0xABCD_0000, len, key: 0x1234, invalidate };
    k.set_in(sqe).expect("encodable");
    k
}

fn rw(op: u8, cid: u16, slba: u64, blocks: u16) -> Sqe {
    let mut sqe = Sqe::new(op, cid);
    sqe.set_nsid(1);
    sqe.set_slba(slba);
    sqe.set_nlb(blocks - 1);
    sqe
}

/// An admin queue connected and enabled, and an I/O queue connected to its controller.
fn io_queue(target: &Arc<Target>) -> (Host, Host) {
    let mut admin = Host::new(target, 0, 0);
    let cqe = admin.connect(0, CNTLID_DYNAMIC);
    assert!(cqe.status.is_success(), "admin Connect: {}", cqe.status);
    let value = (cc::EN | cc::IOSQES_64 | cc::IOCQES_16) as u64;
    let posts = admin.capsule(1, &PropertySet { size8: false, offset: reg::CC, value }.to_sqe(2), &[]);
    assert!(response(&posts, 1).status.is_success());
    admin.sent(1);
    let mut io = Host::new(target, 1, 1);
    let cqe = io.connect(1, cqe.result as u16);
    assert!(cqe.status.is_success(), "I/O Connect: {}", cqe.status);
    (admin, io)
}

#[test]
fn connect_in_capsule_is_answered_by_send_and_the_receive_reposted() {
    let t = target(None);
    let mut q = Host::new(&t, 0, 0);
    let cqe = q.connect(0, CNTLID_DYNAMIC);
    assert!(cqe.status.is_success(), "{}", cqe.status);
    assert_eq!((cqe.cid, cqe.sqid), (1, 0));
    assert!(q.m.life.cmd.queue().is_some_and(|q| q.qid == 0), "connected");
}

#[test]
fn a_write_is_fetched_by_rdma_read_then_a_read_returns_it_by_rdma_write_then_send() {
    let t = target(None);
    let (_admin, mut io) = io_queue(&t);
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();

    let mut w = rw(io_opcode::WRITE, 5, 8, 8);
    let k = keyed(&mut w, 4096, false);
    let posts = io.capsule(2, &w, &[]);
    assert_eq!(posts, vec![Post::Read { slot: 2, len: 4096, addr: k.addr, key: k.key }], "the host's data is fetched first");
    // The READ lands the host's data in the slot's buffer.
    io.m.buffer(2).unwrap().as_mut_slice().copy_from_slice(&data);
    io.m.read_done(2, io.now);
    io.run_backend();
    let posts = io.posts();
    let cqe = response(&posts, 2);
    assert_eq!(posts.len(), 1, "a write sends no data: {posts:?}");
    assert!(cqe.status.is_success() && cqe.cid == 5, "{cqe:?}");
    io.sent(2);

    let mut r = rw(io_opcode::READ, 6, 8, 8);
    let k = keyed(&mut r, 4096, true);
    let posts = io.capsule(3, &r, &[]);
    assert_eq!(posts.len(), 2, "{posts:?}");
    assert_eq!(posts[0], Post::Write { slot: 3, len: 4096, addr: k.addr, key: k.key });
    assert!(matches!(posts[1], Post::Send { slot: 3, invalidate: Some(0x1234), .. }), "Send with Invalidate: {posts:?}");
    assert!(response(&posts, 3).status.is_success());
    assert_eq!(io.m.buffer(3).unwrap().as_slice(), &data[..], "the RDMA WRITE sends what was written");
    io.sent(3);
}

#[test]
fn identify_data_goes_by_rdma_write_before_the_response() {
    let t = target(None);
    let (mut admin, _io) = io_queue(&t);
    let mut id = Sqe::new(admin_opcode::IDENTIFY, 9);
    id.set_cdw(10, 1); // Identify Controller
    keyed(&mut id, 4096, false);
    let posts = admin.capsule(4, &id, &[]);
    assert!(matches!(posts[..], [Post::Write { slot: 4, len: 4096, .. }, Post::Send { slot: 4, .. }]), "{posts:?}");
    let subnqn = &admin.m.buffer(4).unwrap().as_slice()[768..768 + SUBNQN.len()];
    assert_eq!(subnqn, SUBNQN.as_bytes());
}

#[test]
fn commands_wait_for_buffer_memory_and_are_served_in_arrival_order() {
    // 128 KiB for the process: A (64 KiB) and B (60 KiB) fit; C (64 KiB) waits, and D (4 KiB)
    // waits behind it though it would fit.
    let t = target(Some(128 << 10));
    let (_admin, mut io) = io_queue(&t);
    let mut reads = Vec::new();
    for (slot, blocks) in [(1u16, 128u16), (2, 120), (3, 128), (4, 8)] {
        let mut w = rw(io_opcode::WRITE, 10 + slot, 0, blocks);
        keyed(&mut w, blocks as u32 * 512, false);
        reads.push(io.capsule(slot, &w, &[]));
    }
    assert!(matches!(reads[0][..], [Post::Read { slot: 1, .. }]), "{:?}", reads[0]);
    assert!(matches!(reads[1][..], [Post::Read { slot: 2, .. }]), "{:?}", reads[1]);
    assert!(reads[2].is_empty() && reads[3].is_empty(), "C and D wait: {reads:?}");
    assert!(io.m.is_waiting());

    // A completes and its response goes out: its memory serves C, then D, in that order.
    io.m.read_done(1, io.now);
    io.run_backend();
    assert!(response(&io.posts(), 1).status.is_success());
    io.m.sent(1);
    io.m.serve_waiting();
    let posts = io.posts();
    assert_eq!(posts[0], Post::Recv(1));
    assert!(matches!(posts[1..], [Post::Read { slot: 3, len: 65536, .. }, Post::Read { slot: 4, len: 4096, .. }]), "{posts:?}");
    assert!(!io.m.is_waiting());
    assert!(t.buffers.used() <= 128 << 10, "within the process budget: {}", t.buffers.used());
}

#[test]
fn hostile_capsules_get_their_status_and_the_queue_keeps_serving() {
    let t = target(None);
    let (_admin, mut io) = io_queue(&t);
    // A keyed SGL whose length is not the command's.
    let mut r = rw(io_opcode::READ, 1, 0, 8);
    keyed(&mut r, 512, false);
    let cqe = response(&io.capsule(1, &r, &[]), 1);
    assert_eq!(cqe.status, Status::SGL_INVALID_DATA_LEN.with_dnr());
    io.sent(1);
    // An unknown keyed subtype: not a keyed SGL we move, so the command layer refuses its type.
    let mut r = rw(io_opcode::READ, 2, 0, 8);
    keyed(&mut r, 4096, false);
    r.0[39] = 0x42;
    let cqe = response(&io.capsule(2, &r, &[]), 2);
    assert_eq!(cqe.status, Status::SGL_INVALID_TYPE.with_dnr());
    io.sent(2);
    // More than the largest transfer (MDTS), within the namespace.
    let blocks = (crate::core::MAX_TRANSFER / 512 + 8) as u16;
    let mut r = rw(io_opcode::READ, 3, 0, blocks);
    keyed(&mut r, blocks as u32 * 512, false);
    let cqe = response(&io.capsule(3, &r, &[]), 3);
    assert_eq!(cqe.status, Status::INVALID_FIELD.with_dnr());
    io.sent(3);
    // Beyond the namespace.
    let mut r = rw(io_opcode::READ, 7, (8 << 20) / 512 - 1, 2);
    keyed(&mut r, 1024, false);
    let cqe = response(&io.capsule(7, &r, &[]), 7);
    assert_eq!(cqe.status, Status::LBA_OUT_OF_RANGE.with_dnr());
    io.sent(7);
    // A completion for nothing outstanding and one beyond the queue change nothing.
    io.m.read_done(5, io.now);
    io.m.sent(6);
    io.m.read_done(500, io.now);
    assert!(io.posts().is_empty());
    // The queue still serves.
    let mut r = rw(io_opcode::READ, 4, 0, 1);
    keyed(&mut r, 512, false);
    let posts = io.capsule(4, &r, &[]);
    assert!(response(&posts, 4).status.is_success() && !io.m.closing());
}

#[test]
fn a_capsule_in_a_busy_slot_or_shorter_than_an_sqe_ends_the_queue() {
    let t = target(None);
    let (_admin, mut io) = io_queue(&t);
    let mut w = rw(io_opcode::WRITE, 1, 0, 8);
    keyed(&mut w, 4096, false);
    assert!(matches!(io.capsule(1, &w, &[])[..], [Post::Read { .. }]));
    // The same receive buffer again while its command waits for its data.
    assert_eq!(io.capsule(1, &w, &[]), vec![Post::Disconnect]);
    assert!(io.m.closing());

    let (_admin, mut io) = io_queue(&t);
    io.m.received(2, &[0; 20], io.now);
    assert_eq!(io.posts(), vec![Post::Disconnect]);
}

/// The RDMA acceptor drives a queue through Connect detached, then a reactor attaches it: only
/// then do its counters join the reactor's, marked RDMA, and its placement names who connected.
#[test]
fn a_queue_connected_before_placement_joins_the_reactor_that_attaches_it() {
    let t = target(None);
    let mut admin = Host::new(&t, 0, 0);
    admin.m.detach();
    assert_eq!(admin.m.placement(), None, "no placement before Connect");
    assert!(admin.connect(0, CNTLID_DYNAMIC).status.is_success());
    assert_eq!(admin.m.placement(), Some((SUBNQN, HOSTNQN)));
    let reactor = Arc::new(ReactorStats::new(1, 3, ReactorMode::Poll, 0));
    let registry = |r: &Arc<ReactorStats>| crate::stats::StatsRegistry {
        start: Instant::now(),
        reactors: vec![r.clone()],
        ports: Vec::new(),
        buffers: t.buffers.clone(),
    };
    assert_eq!(registry(&reactor).json()["reactors"][0]["queues"], serde_json::json!([]), "nothing joined before attach");
    admin.m.attach(7, reactor.clone());
    let queues = registry(&reactor).json()["reactors"][0]["queues"].clone();
    assert_eq!((queues[0]["qid"].as_u64(), queues[0]["transport"].as_str()), (Some(0), Some("rdma")), "{queues}");
    assert_eq!(queues[0]["commands"], 1, "the Connect counted: {queues}");
}
