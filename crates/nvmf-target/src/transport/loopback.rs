//! The loop transport, as Linux nvmet's `loop.c`: a host in the same process hands capsules over
//! as values and takes data and responses back as values, with nothing on a wire. It exists to
//! test the command layer through a transport, and as the proof that a transport is one file:
//! it supplies only [`DataPath`] hooks (copies) under the shared [`Lifecycle`].
//!
//! Each command names the host memory its data SGL describes, given with its capsule: the data
//! of a write (fetched by copy, as RDMA fetches by READ) or room for a read's. Like RDMA, each
//! command holds a slot from submission until its response is taken. Its capabilities
//! (`TransportKind::Loop`) are TCP's transport SGL data blocks, no keyed SGLs and no secure
//! channel, with the discovery TRTYPE of loop.

use super::{At, DataPath, Lifecycle, SlotState, Slots, Transport, TransportKind, BUFFER_BUDGET};
use crate::backend::{IoCompletion, IoEngine};
use crate::command::{BackendRequest, Commands, Work};
use crate::core::Target;
use nvmf_proto::{Cqe, Sqe, Status};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

/// Rounds [`Loop::run`] takes at most: each moves data, submits and reaps backend requests.
const MAX_ROUNDS: usize = 1000;

/// What the target sends back, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Data for command `cid`'s host memory (a read's, Identify's).
    Data { cid: u16, data: Vec<u8> },
    Response(Cqe),
}

/// A capsule the loop cannot take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoopError {
    /// Every slot holds a command: the host submitted more than the queue's depth.
    QueueFull,
    /// The queue ended (Disconnect, failed authentication, timeout).
    Closed,
}

/// One loop queue: the command layer and slots, an engine for its backend requests, and what
/// the hooks produced.
pub struct Loop {
    life: Lifecycle,
    wire: Wire,
    engine: IoEngine,
    depth: u16,
}

/// The hooks' side: host memory per slot, and what waits to be done or taken.
struct Wire {
    /// The host memory each slot's command named.
    host: Vec<Vec<u8>>,
    /// Slots whose data is to be copied from host memory (a fetch in flight), oldest first.
    fetches: VecDeque<u16>,
    /// Slots answered: free once the response is queued.
    answered: Vec<u16>,
    replies: Vec<Reply>,
    closing: bool,
}

impl Transport for Loop {
    const KIND: TransportKind = TransportKind::Loop;
}

impl Loop {
    /// A queue of `depth` commands, served as long as the value lives.
    pub fn new(target: Arc<Target>, depth: u16, now: Instant) -> Loop {
        let slots = Slots::new(BUFFER_BUDGET, target.buffers.clone(), target.buffer_align);
        let cmd = Commands::new(target.clone(), None, Self::capabilities(&target.settings), now);
        let wire = Wire { host: vec![Vec::new(); depth as usize], fetches: VecDeque::new(), answered: Vec::new(), replies: Vec::new(), closing: false };
        Loop { life: Lifecycle::new(cmd, slots), wire, engine: IoEngine::new(depth.max(1) as u32), depth }
    }

    /// The command layer (its queue once connected).
    pub fn commands(&self) -> &Commands {
        &self.life.cmd
    }

    /// Commands waiting for buffer memory.
    pub fn is_waiting(&self) -> bool {
        self.life.slots.is_holding()
    }

    /// Takes a capsule: `sqe`, its in-capsule data, and `host`, the host memory its data SGL
    /// names (a write's data, room for a read's; empty when none). Call [`run`](Self::run) to
    /// carry it through.
    pub fn submit(&mut self, sqe: &Sqe, in_capsule: &[u8], host: Vec<u8>, now: Instant) -> Result<(), LoopError> {
        if self.wire.closing {
            return Err(LoopError::Closed);
        }
        let cid = sqe.cid();
        let slot = (0..self.depth).find(|&i| self.life.slots.claim(i, cid)).ok_or(LoopError::QueueFull)?;
        self.wire.host[slot as usize] = host;
        self.life.command(&mut self.wire, sqe, Some(slot), in_capsule, true, now);
        self.free_answered();
        Ok(())
    }

    /// Carries the commands taken as far as they go: copies fetched data, runs backend requests
    /// until none is left, admits commands waiting for memory.
    pub fn run(&mut self, now: Instant) {
        let mut done = Vec::new();
        for _ in 0..MAX_ROUNDS {
            while let Some(slot) = self.wire.fetches.pop_front() {
                self.fetched(slot, now);
            }
            self.submit_backend();
            self.engine.flush();
            self.engine.reap(&mut done);
            let idle = done.is_empty() && self.engine.in_flight() == 0 && self.wire.fetches.is_empty();
            for c in done.drain(..) {
                self.complete_io(c);
            }
            self.free_answered();
            self.life.admit_waiting(&mut self.wire);
            self.free_answered();
            if idle && self.wire.fetches.is_empty() && self.life.cmd.in_flight() == 0 {
                return;
            }
            if self.engine.in_flight() > 0 {
                self.engine.wait_one();
            }
        }
    }

    /// Data and responses sent since the last call, in order.
    pub fn take_replies(&mut self) -> Vec<Reply> {
        std::mem::take(&mut self.wire.replies)
    }

    /// Time passes: timeouts, and asynchronous events completing held AERs.
    pub fn tick(&mut self, now: Instant) {
        if !self.wire.closing && self.life.cmd.expired(now) {
            self.wire.closing = true;
            self.life.cmd.release();
        }
        if !self.wire.closing {
            self.life.complete_events(&mut self.wire);
            self.free_answered();
        }
    }

    /// The host memory of `slot`'s command is copied into its buffer.
    fn fetched(&mut self, slot: u16, now: Instant) {
        let s = &mut self.life.slots[slot];
        let len = s.len as usize;
        s.buf.as_mut_slice().copy_from_slice(&self.wire.host[slot as usize][..len]);
        self.life.data_arrived(&mut self.wire, slot, now);
    }

    fn submit_backend(&mut self) {
        for r in self.life.cmd.backend_requests() {
            match r {
                // SAFETY: each request's buffer is a slot's, kept (not moved, not freed) until
                // its completion: `run` returns only once none is in flight.
                BackendRequest::Submit(backend, req) => unsafe { self.engine.submit(backend, req) },
                BackendRequest::Done(tag) => self.engine.complete_now(tag, Ok(())),
            }
        }
    }

    fn complete_io(&mut self, c: IoCompletion) {
        self.life.complete_io(&mut self.wire, c);
    }

    fn free_answered(&mut self) {
        for slot in self.wire.answered.drain(..) {
            self.life.slots.free(slot);
        }
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        // Buffers must outlive their backend requests.
        for _ in 0..MAX_ROUNDS {
            if self.engine.in_flight() == 0 {
                break;
            }
            self.engine.wait_one();
        }
    }
}

impl DataPath for Wire {
    const SLOT_PER_COMMAND: bool = true;

    fn serving(&self) -> bool {
        !self.closing
    }

    /// A copy from the host memory named with the capsule, done by [`Loop::run`].
    fn fetch_data(&mut self, slots: &mut Slots, slot: u16) -> Result<(), Status> {
        if self.host[slot as usize].len() < slots[slot].len as usize {
            return Err(Status::SGL_INVALID_DATA_LEN.with_dnr());
        }
        self.fetches.push_back(slot);
        Ok(())
    }

    fn send_data(&mut self, _cmd: &Commands, slots: &mut Slots, slot: u16, len: u32) -> bool {
        let s = &slots[slot];
        let len = (len as usize).min(s.buf.len()).min(self.host[slot as usize].len());
        self.replies.push(Reply::Data { cid: s.cid, data: s.buf.as_slice()[..len].to_vec() });
        false
    }

    fn send_copy(&mut self, _cmd: &Commands, cid: u16, _data: &[u8]) {
        unreachable!("command {cid} without a slot on the loop, where each holds one from submission");
    }

    fn respond(&mut self, cmd: &Commands, slots: &mut Slots, at: At, status: Status, result: u64) {
        let (sqid, sqhd) = cmd.sq_ids();
        self.replies.push(Reply::Response(Cqe { result, sqhd, sqid, cid: at.cid, status }));
        if let Some(slot) = at.slot {
            slots[slot].state = SlotState::Sending;
            self.answered.push(slot);
        }
    }

    fn no_slot(&mut self, _cmd: &mut Commands, cid: u16, _work: Work) {
        unreachable!("command {cid} without a slot on the loop, where each holds one from submission");
    }

    fn connected(&mut self, _cmd: &mut Commands) {}

    fn ending(&mut self) {
        self.closing = true;
    }
}
