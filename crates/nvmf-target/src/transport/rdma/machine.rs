//! One NVMe over RDMA queue as a sans-I/O machine: work completions in (a capsule received, an
//! RDMA READ done, a response SEND done), backend completions and time in; the verbs to post
//! out ([`Post`]), and backend requests for the caller to submit. No verbs library here, so
//! tests and the fuzzer drive it without a device; `queue.rs` is the driver that registers
//! memory and posts what it asks.
//!
//! Slot `i` is receive buffer `i`: a command keeps its receive buffer until its response has
//! been sent, as nvmet does, so the host never has more commands than the queue has slots.
//! The per-command lifecycle, buffer charging against `buffer_memory` and the per-connection
//! budget, and waiting for memory in arrival order are the shared [`Lifecycle`]'s; here only
//! what RDMA adds: the keyed SGL of each command, and the verbs its hooks post ([`DataPath`]).

use super::{normalize_sqe, KeyedSgl};
use crate::backend::{AlignedBuf, IoCompletion, IoEngine};
use crate::command::{BackendRequest, Commands, Work};
use crate::core::{Port, Target, ADMIN_IN_CAPSULE};
use crate::stats::ReactorStats;
use crate::transport::{At, DataPath, Lifecycle, SlotState, Slots, Transport, BUFFER_BUDGET};
use nvmf_proto::{Cqe, Sqe, Status};
use std::sync::Arc;
use std::time::Instant;

pub const SQE_LEN: usize = 64;
pub const CQE_LEN: usize = 16;

/// A verb the driver posts for the machine. Data buffers are named by slot: the driver
/// registers each slot's buffer ([`Machine::buffer`]) with the queue pair's protection domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Post {
    /// Post receive buffer `slot` (at start, and again once its command's response went out).
    Recv(u16),
    /// Signaled RDMA READ of `len` bytes of the host's memory at `addr`/`key` into the slot's
    /// buffer; its completion goes to [`Machine::read_done`].
    Read { slot: u16, len: u32, addr: u64, key: u32 },
    /// Unsignaled RDMA WRITE of the first `len` bytes of the slot's buffer to the host's memory
    /// at `addr`/`key`; the response SEND posted after it completes after it.
    Write { slot: u16, len: u32, addr: u64, key: u32 },
    /// Signaled SEND of the slot's completion (Send with Invalidate of `invalidate` when the host
    /// asked); its completion goes to [`Machine::sent`].
    Send { slot: u16, cqe: [u8; CQE_LEN], invalidate: Option<u32> },
    /// End the connection: the host sees it go.
    Disconnect,
}

/// The receive buffer size of a queue: an SQE and the in-capsule data it may carry. Admin queues
/// (and Connect) may carry up to 8 KiB in the capsule, as on TCP; I/O queues what IOCCSZ
/// advertises, at least that.
pub fn capsule_len(target: &Target, qid: u16) -> usize {
    let in_capsule = if qid == 0 { ADMIN_IN_CAPSULE } else { target.settings.in_capsule_data_size.max(ADMIN_IN_CAPSULE) };
    SQE_LEN + in_capsule as usize
}

pub struct Machine {
    /// The command layer and the command slots, with the lifecycle they share with every
    /// transport; `wire` is what it calls back (RDMA READ, RDMA WRITE, SEND).
    pub life: Lifecycle,
    wire: Wire,
    target: Arc<Target>,
    capsule_len: usize,
    depth: u16,
}

/// What the lifecycle's hooks need: the verbs to post and the state of the queue.
struct Wire {
    /// The keyed SGL of each slot's command, if it named one.
    sgls: Vec<Option<KeyedSgl>>,
    posts: Vec<Post>,
    /// The counters of the reactor that serves the queue, which the queue's join once it is
    /// connected; None until a reactor takes it (see [`Machine::detach`]).
    stats: Option<Arc<ReactorStats>>,
    /// The host disconnected, or we asked to: serve nothing more.
    closing: bool,
    /// The command layer ended the queue (Disconnect): disconnect once its response is out.
    ending: bool,
}

impl Transport for Machine {
    const KIND: crate::transport::TransportKind = crate::transport::TransportKind::Rdma;
}

impl Machine {
    /// A queue of `depth` commands (`qid` from the CM request) whose receives are all to be posted.
    pub fn new(target: Arc<Target>, port: Option<Port>, stats: Arc<ReactorStats>, qid: u16, depth: u16, token: u32, now: Instant) -> Machine {
        let slots = Slots::new(BUFFER_BUDGET, target.buffers.clone(), target.buffer_align);
        let cmd = Commands::new(target.clone(), port, Self::capabilities(&target.settings), now);
        let mut life = Lifecycle::new(cmd, slots);
        life.token = token;
        Machine {
            life,
            wire: Wire {
                sgls: vec![None; depth as usize],
                posts: (0..depth).map(Post::Recv).collect(),
                stats: Some(stats),
                closing: false,
                ending: false,
            },
            capsule_len: capsule_len(&target, qid),
            target,
            depth,
        }
    }

    /// The queue is not served by a reactor yet (the acceptor drives it through Connect): its
    /// counters join none until [`attach`](Self::attach).
    pub fn detach(&mut self) {
        self.wire.stats = None;
    }

    /// A reactor serves the queue from now on: `token` routes its backend completions, its
    /// counters join `stats` (now, if Connect is done).
    pub fn attach(&mut self, token: u32, stats: Arc<ReactorStats>) {
        self.life.token = token;
        if self.life.cmd.queue().is_some() {
            self.life.cmd.attach(&stats);
        }
        self.wire.stats = Some(stats);
    }

    /// Once Connect succeeded: (subsystem NQN, host NQN) for the placement policy.
    pub fn placement(&self) -> Option<(&str, &str)> {
        self.life.cmd.placement()
    }

    /// Bytes of one receive buffer.
    pub fn capsule_len(&self) -> usize {
        self.capsule_len
    }

    pub fn depth(&self) -> u16 {
        self.depth
    }

    /// Moves the verbs to post, in order, to the end of `out`.
    pub fn take_posts(&mut self, out: &mut Vec<Post>) {
        out.append(&mut self.wire.posts);
    }

    /// Slot `slot`'s data buffer, for the driver to register (the verbs name it by slot). It
    /// changes (moves, grows, is freed) only while its slot is free.
    pub fn buffer(&mut self, slot: u16) -> Option<&mut AlignedBuf> {
        self.life.slots.get_mut(slot).map(|s| &mut s.buf)
    }

    pub fn closing(&self) -> bool {
        self.wire.closing
    }

    /// Commands waiting for buffer memory: true while any does.
    pub fn is_waiting(&self) -> bool {
        self.life.slots.is_holding()
    }

    /// Backend requests outstanding: the queue's buffers must outlive them.
    pub fn in_flight(&self) -> usize {
        self.life.cmd.in_flight()
    }

    /// Bytes of slot buffers this queue holds.
    pub fn buffer_bytes(&self) -> usize {
        self.life.slots.bytes()
    }

    /// Ends the queue from our side (Disconnect, a fatal error, a timeout): the host sees the
    /// connection go, and the CM reports it disconnected.
    pub fn shut(&mut self, why: &str) {
        if !self.wire.closing {
            tracing::info!(why, "closing NVMe/RDMA queue");
            self.wire.closing = true;
            self.life.cmd.release();
            self.wire.posts.push(Post::Disconnect);
        }
    }

    /// A work request failed. After a disconnect, posted work is flushed with an error: expected.
    pub fn failed(&mut self, status: &str) {
        if !self.wire.closing {
            self.shut(&format!("work request failed: {status}"));
        }
    }

    /// The slot of a completion, if it names one of ours and the queue still serves.
    fn live(&self, slot: u16) -> bool {
        !self.wire.closing && slot < self.depth
    }

    /// A command capsule arrived in receive buffer `slot` (`capsule`: the bytes received).
    pub fn received(&mut self, slot: u16, capsule: &[u8], now: Instant) {
        if !self.live(slot) {
            return;
        }
        if capsule.len() < SQE_LEN || capsule.len() > self.capsule_len {
            return self.shut("capsule shorter than an SQE or longer than a receive buffer");
        }
        let raw = Sqe::from_bytes(&capsule[..SQE_LEN]).expect("64 bytes");
        let (sqe, sgl) = normalize_sqe(&raw);
        if !self.life.slots.claim(slot, sqe.cid()) {
            return self.shut("a capsule arrived in a receive buffer that was not posted");
        }
        self.wire.sgls[slot as usize] = sgl;
        self.life.command(&mut self.wire, &sqe, Some(slot), &capsule[SQE_LEN..], true, now);
    }

    /// Serves the commands that wait for buffer memory, oldest first, while their buffers fit:
    /// after this queue's completions, and as the driver retries (memory freed elsewhere).
    pub fn serve_waiting(&mut self) {
        if self.target.buffers.under_pressure() {
            self.life.slots.trim();
        }
        self.life.admit_waiting(&mut self.wire);
    }

    /// The RDMA READ of the host's data into `slot`'s buffer completed.
    pub fn read_done(&mut self, slot: u16, now: Instant) {
        if !self.live(slot) || self.life.slots.get(slot).is_none_or(|s| s.state != SlotState::AwaitData) {
            return;
        }
        self.life.data_arrived(&mut self.wire, slot, now);
    }

    /// Hands the queued backend requests to the engine.
    pub fn submit(&mut self, engine: &mut IoEngine) {
        for r in self.life.cmd.backend_requests() {
            match r {
                // SAFETY: each request's buffer is a slot's, kept (not moved, not freed) until
                // its completion, and a closed queue is kept until in_flight is 0.
                BackendRequest::Submit(backend, req) => unsafe { engine.submit(backend, req) },
                BackendRequest::Done(tag) => engine.complete_now(tag, Ok(())),
            }
        }
    }

    /// A backend request of this queue finished.
    pub fn io_done(&mut self, c: IoCompletion) {
        self.life.complete_io(&mut self.wire, c);
    }

    /// The response of `slot` went out: its slot is free and its receive is posted again.
    pub fn sent(&mut self, slot: u16) {
        if !self.live(slot) || self.life.slots.get(slot).is_none_or(|s| s.state != SlotState::Sending) {
            return;
        }
        self.life.slots.free(slot);
        self.wire.sgls[slot as usize] = None;
        if self.wire.ending {
            return self.shut("host disconnected the queue (Fabrics Disconnect)");
        }
        self.wire.posts.push(Post::Recv(slot));
    }

    /// Time passes: keep-alive, Connect and authentication timeouts; asynchronous events (a
    /// namespace changed) complete the AERs this queue holds.
    pub fn tick(&mut self, now: Instant) {
        if !self.wire.closing && self.life.cmd.expired(now) {
            self.shut("timed out (keep-alive, Connect or authentication)");
        }
        if !self.wire.closing {
            self.life.complete_events(&mut self.wire);
        }
    }
}

impl DataPath for Wire {
    const SLOT_PER_COMMAND: bool = true;

    fn serving(&self) -> bool {
        !self.closing
    }

    /// An RDMA READ of the host's memory that the command's keyed SGL names.
    fn fetch_data(&mut self, slots: &mut Slots, slot: u16) -> Result<(), Status> {
        let len = slots[slot].len;
        match self.sgls[slot as usize] {
            Some(k) if k.len >= len => {
                self.posts.push(Post::Read { slot, len, addr: k.addr, key: k.key });
                Ok(())
            }
            Some(_) => Err(Status::SGL_INVALID_DATA_LEN.with_dnr()),
            None => Err(Status::SGL_INVALID_TYPE.with_dnr()),
        }
    }

    /// An RDMA WRITE of the slot buffer's first `len` bytes to the host's keyed SGL (as much as
    /// it has room for); the response SEND posted after it completes after it.
    fn send_data(&mut self, _cmd: &Commands, slots: &mut Slots, slot: u16, len: u32) -> bool {
        if let Some(k) = self.sgls[slot as usize] {
            let len = len.min(k.len).min(slots[slot].buf.len() as u32);
            self.posts.push(Post::Write { slot, len, addr: k.addr, key: k.key });
        }
        false
    }

    fn send_copy(&mut self, _cmd: &Commands, cid: u16, _data: &[u8]) {
        unreachable!("command {cid} without a slot on RDMA, where each holds its receive buffer's");
    }

    /// Sends the completion (with Invalidate when the host asked).
    fn respond(&mut self, cmd: &Commands, slots: &mut Slots, at: At, status: Status, result: u64) {
        let Some(slot) = at.slot else { return };
        let (sqid, sqhd) = cmd.sq_ids();
        let s = &mut slots[slot];
        let cqe = Cqe { result, sqhd, sqid, cid: s.cid, status };
        s.state = SlotState::Sending;
        let invalidate = self.sgls[slot as usize].filter(|k| k.invalidate).map(|k| k.key);
        self.posts.push(Post::Send { slot, cqe: cqe.encode(), invalidate });
    }

    fn no_slot(&mut self, _cmd: &mut Commands, cid: u16, _work: Work) {
        unreachable!("command {cid} without a slot on RDMA, where each holds its receive buffer's");
    }

    /// The queue's counters say RDMA and join its reactor's.
    fn connected(&mut self, cmd: &mut Commands) {
        let Some(q) = cmd.queue() else { return };
        let (cntlid, qid, sqsize) = (q.ctrl.cntlid, q.qid, q.sqsize);
        tracing::info!(cntlid, qid, sqsize, subnqn = %q.stats.subnqn, hostnqn = %q.stats.hostnqn, "RDMA queue connected");
        if let Some(stats) = &self.stats {
            cmd.attach(stats);
        }
    }

    fn ending(&mut self) {
        self.ending = true;
    }
}

#[cfg(test)]
mod tests;
