//! Command slots of one connection and the memory budget of their data buffers, which every
//! transport shares; the per-command lifecycle over them is `lifecycle.rs`.
//!
//! A command that outlives its capsule (R2T data, backend I/O, a wait for buffer memory) lives
//! in a slot; on TCP the slot index is its R2T transfer tag, on RDMA its receive buffer's index
//! (see [`Slots::claim`]). Buffers are sized from what the host asks
//! (up to MDTS) for up to SQSIZE + 1 commands, so without a cap one connection could make the
//! process allocate gigabytes: every connection gets [`BUFFER_BUDGET`] bytes of slot buffers,
//! and all connections together share the process-wide [`MemoryBudget`].

use crate::backend::{AlignedBuf, AllocError, MemoryBudget};
use crate::command::Work;
use nvmf_proto::{Sqe, Status};
use std::collections::VecDeque;
use std::sync::Arc;

/// Slot buffer bytes one connection may hold: 32 commands of MDTS (2 MiB) in flight, more
/// than a 25 Gb/s link keeps busy on one queue. Commands beyond it wait for memory (reads and
/// R2T writes) instead of failing; in-capsule data may exceed it by at most queue depth ×
/// in-capsule size, because that data has already arrived.
pub const BUFFER_BUDGET: usize = 64 << 20;

/// The work of a claimed slot until its command asks for a buffer (never executed: a command
/// reaches execution only through a buffer, which sets the real work).
const NO_WORK: Work = Work::AuthSend(Sqe([0; 64]));

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    Free,
    /// Waiting for the budget to have room for its buffer (FIFO, see [`Slots::hold`]).
    AwaitBuffer,
    /// Waiting for the host's data: H2CData after R2T (TCP), an RDMA READ (RDMA).
    AwaitData,
    /// Backend requests in flight (or, on RDMA, the command layer deciding).
    Executing,
    /// Done; its read data waits in the connection's output to be written from this buffer
    /// (TCP), or its RDMA WRITE and response SEND are posted (RDMA).
    Sending,
    /// An Asynchronous Event Request kept until an event completes it (RDMA, whose AER holds
    /// its receive buffer; TCP keeps none in a slot).
    Held,
}

pub struct Slot {
    pub state: SlotState,
    pub cid: u16,
    pub work: Work,
    /// Its capacity changes only through [`Slots::reserve`], which keeps the budget's count.
    pub buf: AlignedBuf,
    /// Bytes of data the command moves (the buffer's length once reserved).
    pub len: u32,
    pub received: u32,
    pub r2t_upto: u32,
    /// Set by a data digest error: the command completes with this once its data is in.
    pub failed: Option<Status>,
    pub pending: u32,
    pub status: Status,
}

pub struct Slots {
    slots: Vec<Slot>,
    free: Vec<u16>,
    held: VecDeque<u16>,
    /// Capacity of every slot buffer (all of it also counted in `process`).
    bytes: usize,
    budget: usize,
    process: Arc<MemoryBudget>,
    /// Memory alignment every buffer gets: the strictest the target's backends need.
    align: usize,
}

impl Slots {
    pub fn new(budget: usize, process: Arc<MemoryBudget>, align: usize) -> Slots {
        Slots { slots: Vec::new(), free: Vec::new(), held: VecDeque::new(), bytes: 0, budget, process, align }
    }

    fn fresh(&self, work: Work) -> Slot {
        Slot {
            state: SlotState::Free,
            cid: 0,
            work,
            buf: AlignedBuf::with_align(self.align),
            len: 0,
            received: 0,
            r2t_upto: 0,
            failed: None,
            pending: 0,
            status: Status::SUCCESS,
        }
    }

    fn start(&mut self, idx: u16, cid: u16, work: Work, len: u32) {
        let s = &mut self.slots[idx as usize];
        (s.state, s.cid, s.work, s.len) = (SlotState::Executing, cid, work, len);
        (s.received, s.r2t_upto, s.failed, s.pending, s.status) = (0, 0, None, 0, Status::SUCCESS);
    }

    /// A fresh slot for command `cid`, or `None` when `limit` slots are taken.
    pub fn alloc(&mut self, limit: usize, cid: u16, work: Work, len: u32) -> Option<u16> {
        let idx = match self.free.pop() {
            Some(i) => i,
            None if self.slots.len() < limit => {
                let s = self.fresh(work);
                self.slots.push(s);
                self.slots.len() as u16 - 1
            }
            None => return None,
        };
        self.start(idx, cid, work, len);
        Some(idx)
    }

    /// Takes slot `idx` itself for command `cid`, for a transport whose commands are tied to a
    /// resource of the same index (NVMe/RDMA: receive buffer `idx` holds the capsule until the
    /// response is sent, so the host never has more commands than slots). False when the slot
    /// is taken. The command has no work and no length until it asks for a buffer: the caller
    /// sets both then, before [`reserve`](Self::reserve).
    pub fn claim(&mut self, idx: u16, cid: u16) -> bool {
        while self.slots.len() <= idx as usize {
            let s = self.fresh(NO_WORK);
            self.free.push(self.slots.len() as u16);
            self.slots.push(s);
        }
        let Some(at) = self.free.iter().position(|&i| i == idx) else { return false };
        self.free.swap_remove(at);
        self.start(idx, cid, NO_WORK, 0);
        true
    }

    /// The first slot in `state` whose command is `cid` (an AER an event completes).
    pub fn find(&self, state: SlotState, cid: u16) -> Option<u16> {
        self.slots.iter().position(|s| s.state == state && s.cid == cid).map(|i| i as u16)
    }

    /// Returns a slot to the free list; its buffer stays for reuse until the budget needs it,
    /// or goes back at once when the process is short of buffer memory.
    pub fn free(&mut self, idx: u16) {
        self.slots[idx as usize].state = SlotState::Free;
        self.free.push(idx);
        if self.process.under_pressure() {
            self.release_buffer(idx);
        }
    }

    fn release_buffer(&mut self, idx: u16) {
        let buf = &mut self.slots[idx as usize].buf;
        self.bytes -= buf.capacity();
        self.process.give_back(buf.capacity());
        buf.release();
    }

    /// Frees every idle buffer (the process is short of memory, or the connection goes idle).
    pub fn trim(&mut self) {
        self.reclaim(usize::MAX);
    }

    pub fn get(&self, idx: u16) -> Option<&Slot> {
        self.slots.get(idx as usize)
    }

    pub fn get_mut(&mut self, idx: u16) -> Option<&mut Slot> {
        self.slots.get_mut(idx as usize)
    }

    /// Bytes held by slot buffers.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Sizes slot `idx`'s buffer to its `len`. `Ok(false)`: the connection's or the process's
    /// budget has no room now (never with `over_budget`); `Err`: the allocator failed even after
    /// freeing idle buffers.
    pub fn reserve(&mut self, idx: u16, over_budget: bool) -> Result<bool, AllocError> {
        let len = self.slots[idx as usize].len as usize;
        if len > self.slots[idx as usize].buf.capacity() {
            // An idle buffer big enough is taken over: no allocation, no change to the count.
            if let Some(&j) = self.free.iter().find(|&&j| self.slots[j as usize].buf.capacity() >= len) {
                let big = std::mem::replace(&mut self.slots[j as usize].buf, AlignedBuf::with_align(self.align));
                self.slots[j as usize].buf = std::mem::replace(&mut self.slots[idx as usize].buf, big);
            }
        }
        let cap = self.slots[idx as usize].buf.capacity();
        if len <= cap {
            return self.slots[idx as usize].buf.try_resize(len).map(|()| true);
        }
        let new_cap = AlignedBuf::capacity_for(len);
        let after = (self.bytes - cap).saturating_add(new_cap);
        if after > self.budget {
            self.reclaim(after - self.budget);
        }
        if (self.bytes - cap).saturating_add(new_cap) > self.budget && !over_budget {
            return Ok(false);
        }
        // The new buffer is counted before it exists and the old one after it is gone: for a
        // moment both are, which errs on the safe side.
        if !self.process.try_take(new_cap, over_budget) {
            self.reclaim(usize::MAX);
            if !self.process.try_take(new_cap, false) {
                return Ok(false);
            }
        }
        let mut r = self.slots[idx as usize].buf.try_resize(len);
        if r.is_err() {
            self.reclaim(usize::MAX);
            r = self.slots[idx as usize].buf.try_resize(len);
        }
        match r {
            Ok(()) => {
                self.process.give_back(cap);
                self.bytes = self.bytes - cap + new_cap;
                Ok(true)
            }
            Err(e) => {
                self.process.give_back(new_cap);
                Err(e)
            }
        }
    }

    /// Frees idle buffers (of free slots) until `want` bytes are released or none is left.
    fn reclaim(&mut self, want: usize) {
        let mut released = 0;
        for k in 0..self.free.len() {
            if released >= want {
                break;
            }
            let i = self.free[k];
            released += self.slots[i as usize].buf.capacity();
            self.release_buffer(i);
        }
    }

    /// Queues slot `idx` until [`reserve`](Self::reserve) finds room; FIFO, so large commands
    /// are not starved by small ones.
    pub fn hold(&mut self, idx: u16) {
        self.slots[idx as usize].state = SlotState::AwaitBuffer;
        self.held.push_back(idx);
    }

    /// A command waits for H2CData the host owes after our R2T.
    pub fn awaits_data(&self) -> bool {
        self.slots.iter().any(|s| s.state == SlotState::AwaitData)
    }

    pub fn is_holding(&self) -> bool {
        !self.held.is_empty()
    }

    pub fn first_held(&self) -> Option<u16> {
        self.held.front().copied()
    }

    pub fn pop_held(&mut self) {
        self.held.pop_front();
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        self.process.give_back(self.bytes);
    }
}

impl std::ops::Index<u16> for Slots {
    type Output = Slot;
    fn index(&self, idx: u16) -> &Slot {
        &self.slots[idx as usize]
    }
}

impl std::ops::IndexMut<u16> for Slots {
    fn index_mut(&mut self, idx: u16) -> &mut Slot {
        &mut self.slots[idx as usize]
    }
}
