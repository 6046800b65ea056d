//! The target's sans-I/O NVMe/RDMA queue (`nvmf_target::transport::rdma::machine::Machine`) fed
//! a hostile host's capsules and a hostile device's work completions.
//!
//! The input is a script. Its first byte picks how far a well-formed prefix goes (nothing, an
//! admin Connect + CC.EN, or an I/O Connect to the controller of a second, well-behaved admin
//! queue). Then each step receives a capsule in a receive buffer (commands of every kind with
//! keyed SGLs of the right or a wrong length, in-capsule data, or none; sometimes cut short, or
//! in a buffer that is not posted), completes an RDMA READ or a SEND (outstanding or not), fails
//! a work request, or lets time pass. Backend requests run to completion after every step.
//!
//! What must hold whatever the input: no panic; every verb the machine asks for names a slot of
//! the queue, and a data verb at most the slot buffer's length; a receive is posted only when it
//! is not posted already, a READ or SEND only once at a time per slot; nothing is posted after
//! the Disconnect; buffers stay within the budget and all go back to the process when the
//! queues drop; and the other queue still answers afterwards.

use crate::script::{pattern, Script};
use crate::target_fixture::{capsule, connect_capsule, enable_sqe, target, with_engine, MAX_STEPS};
use nvmf_proto::fabrics::CNTLID_DYNAMIC;
use nvmf_proto::nvme::{admin_opcode, SGL_TRANSPORT_DATA_BLOCK};
use nvmf_proto::rdma::KeyedSgl;
use nvmf_proto::{Cqe, Sqe};
use nvmf_target::backend::IoEngine;
use nvmf_target::config::ReactorMode;
use nvmf_target::core::Target;
use nvmf_target::stats::ReactorStats;
use nvmf_target::transport::rdma::machine::{Machine, Post};
use nvmf_target::transport::BUFFER_BUDGET;
use std::sync::Arc;
use std::time::{Duration, Instant};

const DEPTH: u16 = 8;
/// The smallest allowed (one command of MDTS), so commands wait for buffer memory sometimes.
const BUFFER_MEMORY: u64 = 2 << 20;

pub fn run(input: &[u8]) {
    with_engine(|e| play(e, &mut Script::new(input)));
}

/// The driver's side of one queue: what is posted, checked as the machine asks.
struct Queue {
    m: Machine,
    recv_posted: Vec<bool>,
    read_posted: Vec<bool>,
    send_posted: Vec<bool>,
    disconnected: bool,
    responses: Vec<Cqe>,
}

impl Queue {
    fn new(target: &Arc<Target>, qid: u16, token: u32, now: Instant) -> Queue {
        let stats = Arc::new(ReactorStats::new(0, 0, ReactorMode::Event, 0));
        let n = DEPTH as usize;
        let mut q = Queue {
            m: Machine::new(target.clone(), None, stats, qid, DEPTH, token, now),
            recv_posted: vec![false; n],
            read_posted: vec![false; n],
            send_posted: vec![false; n],
            disconnected: false,
            responses: Vec::new(),
        };
        q.check_posts();
        assert!(q.recv_posted.iter().all(|p| *p), "every receive is posted at start");
        q
    }

    /// Runs backend requests until none is left, then checks what the machine asked to post.
    fn settle(&mut self, engine: &mut IoEngine) {
        let mut done = Vec::new();
        loop {
            self.m.submit(engine);
            engine.flush();
            engine.reap(&mut done);
            if done.is_empty() {
                if engine.in_flight() == 0 {
                    break;
                }
                engine.wait_one();
            }
            for c in done.drain(..) {
                self.m.io_done(c);
            }
        }
        assert_eq!(self.m.in_flight(), 0, "backend requests left in flight");
        self.check_posts();
        assert!(self.m.buffer_bytes() <= BUFFER_BUDGET, "slot buffers beyond the budget");
    }

    fn check_posts(&mut self) {
        let mut posts = Vec::new();
        self.m.take_posts(&mut posts);
        for p in posts {
            assert!(!self.disconnected, "{p:?} posted after the Disconnect");
            let slot = match p {
                Post::Recv(s) | Post::Read { slot: s, .. } | Post::Write { slot: s, .. } | Post::Send { slot: s, .. } => s as usize,
                Post::Disconnect => {
                    self.disconnected = true;
                    continue;
                }
            };
            assert!(slot < DEPTH as usize, "{p:?} names no slot of the queue");
            match p {
                Post::Recv(_) => {
                    assert!(!self.recv_posted[slot] && !self.send_posted[slot], "{p:?} while posted or responding");
                    self.recv_posted[slot] = true;
                }
                Post::Read { len, .. } | Post::Write { len, .. } => {
                    let buf = self.m.buffer(slot as u16).map_or(0, |b| b.len());
                    assert!(len > 0 && len as usize <= buf, "{p:?} beyond the slot's {buf}-byte buffer");
                    assert!(!self.recv_posted[slot] && !self.read_posted[slot], "{p:?} for a posted receive or twice");
                    if matches!(p, Post::Read { .. }) {
                        self.read_posted[slot] = true;
                    }
                }
                Post::Send { cqe, .. } => {
                    assert!(!self.recv_posted[slot] && !self.send_posted[slot] && !self.read_posted[slot], "{p:?} out of turn");
                    self.send_posted[slot] = true;
                    self.responses.push(Cqe::decode(&cqe));
                }
                Post::Disconnect => unreachable!(),
            }
        }
    }

    fn receive(&mut self, slot: u16, capsule: &[u8], now: Instant, engine: &mut IoEngine) {
        if let Some(p) = self.recv_posted.get_mut(slot as usize) {
            *p = false;
        }
        self.m.received(slot, capsule, now);
        self.settle(engine);
    }

    fn command(&mut self, slot: u16, sqe: &Sqe, data: &[u8], now: Instant, engine: &mut IoEngine) -> Option<Cqe> {
        let mut c = sqe.0.to_vec();
        c.extend_from_slice(data);
        let before = self.responses.len();
        self.receive(slot, &c, now, engine);
        let cqe = self.responses.get(before).copied();
        if cqe.is_some() {
            self.sent(slot, engine);
        }
        cqe
    }

    fn sent(&mut self, slot: u16, engine: &mut IoEngine) {
        if let Some(p) = self.send_posted.get_mut(slot as usize) {
            *p = false;
        }
        self.m.sent(slot);
        self.m.serve_waiting();
        self.settle(engine);
    }

    fn connect(&mut self, qid: u16, cntlid: u16, now: Instant, engine: &mut IoEngine) -> Option<Cqe> {
        let (sqe, data) = connect_capsule(qid, cntlid, DEPTH - 1);
        self.command(0, &sqe, &data, now, engine)
    }

    fn enable(&mut self, now: Instant, engine: &mut IoEngine) -> Option<Cqe> {
        self.command(1, &enable_sqe(), &[], now, engine)
    }
}

fn play(engine: &mut IoEngine, s: &mut Script) {
    let target = target(|c| c.target.buffer_memory = Some(BUFFER_MEMORY));
    let mut now = Instant::now();
    let mut bystander = Queue::new(&target, 0, 0, now);
    let cqe = bystander.connect(0, CNTLID_DYNAMIC, now, engine).expect("bystander Connect answered");
    assert!(cqe.status.is_success(), "bystander Connect failed: {}", cqe.status);
    let cntlid = cqe.result as u16;
    assert!(bystander.enable(now, engine).is_some_and(|c| c.status.is_success()), "bystander CC.EN = 1 failed");

    let setup = s.u8();
    let qid = if setup % 3 == 2 { 1 + s.pick(3) as u16 } else { 0 };
    let mut q = Queue::new(&target, qid, 1, now);
    match setup % 3 {
        0 => {}
        1 => {
            q.connect(0, CNTLID_DYNAMIC, now, engine);
            q.enable(now, engine);
        }
        _ => {
            q.connect(qid, cntlid, now, engine);
        }
    }
    for _ in 0..MAX_STEPS {
        if s.is_empty() || q.disconnected {
            break;
        }
        step(&mut q, s, &mut now, engine);
    }
    q.m.shut("fuzz input done");
    q.settle(engine);
    drop(q);

    // The other queue is unaffected: its controller still answers.
    let cqe = bystander.command(2, &Sqe::new(admin_opcode::KEEP_ALIVE, 9), &[], now, engine);
    assert!(cqe.is_some_and(|c| c.status.is_success() && c.cid == 9), "the bystander queue stopped answering: {cqe:?}");
    drop(bystander);
    assert_eq!(target.buffers.used(), 0, "buffer memory left charged after both queues dropped");
}

/// A slot: mostly one whose receive is posted (a real device completes only those).
fn pick_slot(s: &mut Script, posted: &[bool]) -> u16 {
    let choice = s.u8();
    if choice & 0x80 != 0 {
        return (choice & 0x7F) as u16 % (DEPTH + 2);
    }
    let free: Vec<usize> = (0..posted.len()).filter(|&i| posted[i]).collect();
    if free.is_empty() {
        return (choice as u16) % DEPTH;
    }
    free[choice as usize % free.len()] as u16
}

fn step(q: &mut Queue, s: &mut Script, now: &mut Instant, engine: &mut IoEngine) {
    match s.u8() % 8 {
        0..=3 => {
            let slot = pick_slot(s, &q.recv_posted);
            let (mut sqe, data) = capsule(s);
            // The transport's data block becomes a keyed SGL of its length, or a wrong one.
            let sgl = sqe.sgl();
            if sgl.sgl_type == SGL_TRANSPORT_DATA_BLOCK {
                let len = if s.pick(4) == 0 { s.u32() & 0xFF_FFFF } else { sgl.length };
                let k = KeyedSgl { addr: s.u64(), len, key: s.u32(), invalidate: s.bool() };
                k.set_in(&mut sqe);
            }
            let mut bytes = sqe.0.to_vec();
            bytes.extend_from_slice(&data);
            if s.pick(16) == 0 {
                bytes.truncate(s.pick(80));
            }
            bytes.truncate(q.m.capsule_len() + 1);
            q.receive(slot, &bytes, *now, engine);
        }
        4 => {
            // An RDMA READ completes (mostly one that was posted), its data landed.
            let reads: Vec<usize> = (0..DEPTH as usize).filter(|&i| q.read_posted[i]).collect();
            let slot = if reads.is_empty() || s.pick(8) == 0 { s.pick(DEPTH as usize + 1) } else { reads[s.pick(reads.len())] };
            if let Some(b) = q.m.buffer(slot as u16) {
                let seed = s.u16();
                b.as_mut_slice().iter_mut().enumerate().for_each(|(i, x)| *x = pattern(seed, i));
            }
            if let Some(r) = q.read_posted.get_mut(slot) {
                *r = false;
            }
            q.m.read_done(slot as u16, *now);
            q.settle(engine);
        }
        5 => {
            let sends: Vec<usize> = (0..DEPTH as usize).filter(|&i| q.send_posted[i]).collect();
            let slot = if sends.is_empty() || s.pick(8) == 0 { s.pick(DEPTH as usize + 1) } else { sends[s.pick(sends.len())] };
            if q.send_posted.get(slot).is_some_and(|p| *p) || slot >= DEPTH as usize {
                q.sent(slot as u16, engine);
            } else {
                // A SEND completion for no SEND: the machine must ignore it.
                q.m.sent(slot as u16);
                q.settle(engine);
            }
        }
        6 if s.pick(4) == 0 => {
            q.m.failed("fuzzed work request error");
            q.settle(engine);
        }
        _ => {
            // Keep-alive and Connect timeouts; memory freed elsewhere.
            *now += Duration::from_secs(s.u8() as u64);
            q.m.tick(*now);
            q.m.serve_waiting();
            q.settle(engine);
        }
    }
}
