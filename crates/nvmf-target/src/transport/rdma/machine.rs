//! One NVMe over RDMA queue as a sans-I/O machine: work completions in (a capsule received, an
//! RDMA READ done, a response SEND done), backend completions and time in; the verbs to post
//! out ([`Post`]), and backend requests for the caller to submit. No verbs library here, so
//! tests and the fuzzer drive it without a device; `queue.rs` is the driver that registers
//! memory and posts what it asks.
//!
//! Slot `i` is receive buffer `i`: a command keeps its receive buffer until its response has
//! been sent, as nvmet does, so the host never has more commands than the queue has slots.
//! The per-command lifecycle, buffer charging against `buffer_memory` and the per-connection
//! budget, and waiting for memory in arrival order are the shared [`Slots`]'; here only what
//! RDMA adds: the keyed SGL of each command, and which verb moves its data.

use super::{normalize_sqe, KeyedSgl};
use crate::backend::{AlignedBuf, IoCompletion, IoEngine};
use crate::command::{Action, BackendRequest, Commands, Work};
use crate::core::{Port, Target, ADMIN_IN_CAPSULE};
use crate::stats::ReactorStats;
use crate::transport::slots::{SlotState, Slots, BUFFER_BUDGET};
use crate::transport::Transport;
use nvmf_proto::{Cqe, Sqe, Status};
use std::sync::Arc;
use std::time::Instant;

pub const SQE_LEN: usize = 64;
pub const CQE_LEN: usize = 16;
/// What a command gets when no buffer memory can be had at all (the allocator failed).
const NO_MEMORY: Status = Status::INTERNAL_ERROR;

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
    pub cmd: Commands,
    target: Arc<Target>,
    /// The counters of the reactor that serves the queue, which the queue's join once it is
    /// connected; None until a reactor takes it (see [`Machine::detach`]).
    stats: Option<Arc<ReactorStats>>,
    /// Routes backend completions to this queue (the high half of request tags).
    token: u32,
    capsule_len: usize,
    depth: u16,
    slots: Slots,
    /// The keyed SGL of each slot's command, if it named one.
    sgls: Vec<Option<KeyedSgl>>,
    posts: Vec<Post>,
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
        Machine {
            cmd: Commands::new(target.clone(), port, Self::capabilities(&target.settings), now),
            capsule_len: capsule_len(&target, qid),
            target,
            stats: Some(stats),
            token,
            depth,
            slots,
            sgls: vec![None; depth as usize],
            posts: (0..depth).map(Post::Recv).collect(),
            closing: false,
            ending: false,
        }
    }

    /// The queue is not served by a reactor yet (the acceptor drives it through Connect): its
    /// counters join none until [`attach`](Self::attach).
    pub fn detach(&mut self) {
        self.stats = None;
    }

    /// A reactor serves the queue from now on: `token` routes its backend completions, its
    /// counters join `stats` (now, if Connect is done).
    pub fn attach(&mut self, token: u32, stats: Arc<ReactorStats>) {
        self.token = token;
        if self.cmd.queue().is_some() {
            self.cmd.attach(&stats);
        }
        self.stats = Some(stats);
    }

    /// Once Connect succeeded: (subsystem NQN, host NQN) for the placement policy.
    pub fn placement(&self) -> Option<(&str, &str)> {
        self.cmd.placement()
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
        out.append(&mut self.posts);
    }

    /// Slot `slot`'s data buffer, for the driver to register (the verbs name it by slot). It
    /// changes (moves, grows, is freed) only while its slot is free.
    pub fn buffer(&mut self, slot: u16) -> Option<&mut AlignedBuf> {
        self.slots.get_mut(slot).map(|s| &mut s.buf)
    }

    pub fn closing(&self) -> bool {
        self.closing
    }

    /// Commands waiting for buffer memory: true while any does.
    pub fn is_waiting(&self) -> bool {
        self.slots.is_holding()
    }

    /// Backend requests outstanding: the queue's buffers must outlive them.
    pub fn in_flight(&self) -> usize {
        self.cmd.in_flight()
    }

    /// Bytes of slot buffers this queue holds.
    pub fn buffer_bytes(&self) -> usize {
        self.slots.bytes()
    }

    /// Ends the queue from our side (Disconnect, a fatal error, a timeout): the host sees the
    /// connection go, and the CM reports it disconnected.
    pub fn shut(&mut self, why: &str) {
        if !self.closing {
            tracing::info!(why, "closing NVMe/RDMA queue");
            self.closing = true;
            self.cmd.release();
            self.posts.push(Post::Disconnect);
        }
    }

    /// A work request failed. After a disconnect, posted work is flushed with an error: expected.
    pub fn failed(&mut self, status: &str) {
        if !self.closing {
            self.shut(&format!("work request failed: {status}"));
        }
    }

    /// The slot of a completion, if it names one of ours and the queue still serves.
    fn live(&self, slot: u16) -> bool {
        !self.closing && slot < self.depth
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
        if !self.slots.claim(slot, sqe.cid()) {
            return self.shut("a capsule arrived in a receive buffer that was not posted");
        }
        self.sgls[slot as usize] = sgl;
        let connected = self.cmd.queue().is_some();
        let action = self.cmd.command(&sqe, &capsule[SQE_LEN..], true, now);
        self.act(slot, action);
        if !connected {
            self.on_connect();
        }
    }

    /// Once Connect succeeded: the queue's counters say RDMA and join its reactor's.
    fn on_connect(&mut self) {
        let Some(q) = self.cmd.queue() else { return };
        let (cntlid, qid, sqsize) = (q.ctrl.cntlid, q.qid, q.sqsize);
        tracing::info!(cntlid, qid, sqsize, subnqn = %q.stats.subnqn, hostnqn = %q.stats.hostnqn, "RDMA queue connected");
        q.stats.rdma.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(stats) = &self.stats {
            self.cmd.attach(stats);
        }
    }

    /// Carries out what the command layer asked for the command in `slot`.
    fn act(&mut self, slot: u16, action: Action) {
        match action {
            Action::Respond(status, result) => self.respond(slot, status, result),
            Action::Send(data) => self.send_data(slot, &data),
            Action::Hold => self.slots[slot].state = SlotState::Held,
            Action::Buffer { work, len, in_capsule } => self.buffer_for(slot, work, len, in_capsule),
        }
        if self.cmd.take_ending() {
            self.ending = true;
        }
    }

    /// A command that needs a buffer. In-capsule data has arrived already and admin data is
    /// small: both are taken beyond the budgets, as on TCP, so Connect and authentication never
    /// wait; I/O waits for memory behind the commands that wait already.
    fn buffer_for(&mut self, slot: u16, work: Work, len: u32, in_capsule: Option<&[u8]>) {
        let s = &mut self.slots[slot];
        (s.work, s.len) = (work, len);
        let force = in_capsule.is_some() || !matches!(work, Work::Io(_));
        if !force && self.slots.is_holding() {
            return self.slots.hold(slot);
        }
        match self.slots.reserve(slot, force) {
            Ok(true) => self.transfer(slot, in_capsule),
            Ok(false) if !force => self.slots.hold(slot),
            _ => {
                tracing::warn!(len, "no memory for a command buffer");
                self.finish(slot, NO_MEMORY);
            }
        }
    }

    /// Serves the commands that wait for buffer memory, oldest first, while their buffers fit:
    /// after this queue's completions, and as the driver retries (memory freed elsewhere).
    pub fn serve_waiting(&mut self) {
        if self.target.buffers.under_pressure() {
            self.slots.trim();
        }
        while !self.closing {
            let Some(slot) = self.slots.first_held() else { return };
            match self.slots.reserve(slot, false) {
                Ok(false) => return,
                Ok(true) => {
                    self.slots.pop_held();
                    self.slots[slot].state = SlotState::Executing;
                    self.transfer(slot, None);
                }
                Err(_) => {
                    self.slots.pop_held();
                    tracing::warn!(cid = self.slots[slot].cid, "no memory for a command buffer");
                    self.finish(slot, NO_MEMORY);
                }
            }
        }
    }

    /// The command in `slot` has its buffer: the host's data is fetched into it by RDMA READ
    /// (or copied from the capsule), then the command runs.
    fn transfer(&mut self, slot: u16, in_capsule: Option<&[u8]>) {
        let s = &mut self.slots[slot];
        if let Some(d) = in_capsule {
            s.buf.as_mut_slice().copy_from_slice(d);
            s.received = s.len;
        }
        let fetch = in_capsule.is_none()
            && match s.work {
                Work::Io(plan) => plan.host_data_len() > 0,
                Work::Connect(_) | Work::AuthSend(_) => true,
            };
        if !fetch {
            return self.execute(slot);
        }
        let len = s.len;
        match self.sgls[slot as usize] {
            Some(k) if k.len >= len => {
                s.state = SlotState::AwaitData;
                self.posts.push(Post::Read { slot, len, addr: k.addr, key: k.key });
            }
            Some(_) => self.finish(slot, Status::SGL_INVALID_DATA_LEN.with_dnr()),
            None => self.finish(slot, Status::SGL_INVALID_TYPE.with_dnr()),
        }
    }

    /// The RDMA READ of the host's data into `slot`'s buffer completed.
    pub fn read_done(&mut self, slot: u16, now: Instant) {
        if !self.live(slot) || self.slots.get(slot).is_none_or(|s| s.state != SlotState::AwaitData) {
            return;
        }
        let s = &mut self.slots[slot];
        (s.received, s.state) = (s.len, SlotState::Executing);
        match s.work {
            Work::Io(_) => self.execute(slot),
            work => {
                let data = s.buf.as_slice().to_vec();
                let connected = self.cmd.queue().is_some();
                let action = self.cmd.data_in(work, &data, None, now);
                self.act(slot, action);
                if !connected {
                    self.on_connect();
                }
            }
        }
    }

    /// Hands a command whose data (if any) is in its buffer to the command layer, which queues
    /// its backend requests.
    fn execute(&mut self, slot: u16) {
        let tag = ((self.token as u64) << 32) | slot as u64;
        let s = &mut self.slots[slot];
        s.state = SlotState::Executing;
        let Work::Io(plan) = s.work else { return self.finish(slot, Status::INTERNAL_ERROR) };
        match self.cmd.execute(plan, &mut s.buf, tag) {
            Ok(0) => self.finish(slot, Status::SUCCESS),
            Ok(n) => s.pending = n,
            Err(status) => self.finish(slot, status),
        }
    }

    /// Hands the queued backend requests to the engine.
    pub fn submit(&mut self, engine: &mut IoEngine) {
        for r in self.cmd.backend_requests() {
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
        let slot = (c.tag & 0xFFFF_FFFF) as u16;
        let Some(s) = self.slots.get_mut(slot) else { return };
        if s.state != SlotState::Executing || s.pending == 0 {
            return;
        }
        s.pending -= 1;
        let status = self.cmd.request_done(c.result, s.cid);
        if !status.is_success() {
            s.status = status;
        }
        if s.pending == 0 && !self.closing {
            let status = s.status;
            self.finish(slot, status);
        }
    }

    /// A command with a buffer completes: an I/O's read data by RDMA WRITE, then the response.
    fn finish(&mut self, slot: u16, status: Status) {
        let read = match self.slots[slot].work {
            Work::Io(plan) => self.cmd.io_done(plan, status),
            _ => 0,
        };
        if read > 0 {
            self.write_to_host(slot, read as u32);
        }
        self.respond(slot, status, 0);
    }

    /// Data the command layer produced (Identify, log pages...): RDMA WRITE, then success.
    fn send_data(&mut self, slot: u16, data: &[u8]) {
        if !data.is_empty() {
            self.slots[slot].len = data.len() as u32;
            if !matches!(self.slots.reserve(slot, true), Ok(true)) {
                return self.respond(slot, NO_MEMORY, 0);
            }
            self.slots[slot].buf.as_mut_slice().copy_from_slice(data);
            self.write_to_host(slot, data.len() as u32);
        }
        self.respond(slot, Status::SUCCESS, 0);
    }

    /// An RDMA WRITE of the slot buffer's first `len` bytes to the host's keyed SGL (as much as
    /// it has room for).
    fn write_to_host(&mut self, slot: u16, len: u32) {
        let Some(k) = self.sgls[slot as usize] else { return };
        let len = len.min(k.len).min(self.slots[slot].buf.len() as u32);
        self.posts.push(Post::Write { slot, len, addr: k.addr, key: k.key });
    }

    /// Sends the completion of the command in `slot` (with Invalidate when the host asked).
    fn respond(&mut self, slot: u16, status: Status, result: u64) {
        let (sqid, sqhd) = self.cmd.sq_ids();
        let s = &mut self.slots[slot];
        let cqe = Cqe { result, sqhd, sqid, cid: s.cid, status };
        s.state = SlotState::Sending;
        let invalidate = self.sgls[slot as usize].filter(|k| k.invalidate).map(|k| k.key);
        self.posts.push(Post::Send { slot, cqe: cqe.encode(), invalidate });
    }

    /// The response of `slot` went out: its slot is free and its receive is posted again.
    pub fn sent(&mut self, slot: u16) {
        if !self.live(slot) || self.slots.get(slot).is_none_or(|s| s.state != SlotState::Sending) {
            return;
        }
        self.slots.free(slot);
        self.sgls[slot as usize] = None;
        if self.ending {
            return self.shut("host disconnected the queue (Fabrics Disconnect)");
        }
        self.posts.push(Post::Recv(slot));
    }

    /// Time passes: keep-alive, Connect and authentication timeouts; asynchronous events.
    pub fn tick(&mut self, now: Instant) {
        if !self.closing && self.cmd.expired(now) {
            self.shut("timed out (keep-alive, Connect or authentication)");
        }
        if !self.closing {
            self.complete_events();
        }
    }

    /// Asynchronous events (a namespace changed) complete the AERs this queue holds, as on
    /// TCP: the command layer says which AER (by CID) and what DW0; here only its slot is found.
    fn complete_events(&mut self) {
        while let Some((cid, dw0)) = self.cmd.next_event() {
            match self.slots.find(SlotState::Held, cid) {
                Some(slot) => self.respond(slot, Status::SUCCESS, dw0),
                None => tracing::warn!(cid, "an asynchronous event for an AER this queue does not hold"),
            }
        }
    }
}

#[cfg(test)]
mod tests;
