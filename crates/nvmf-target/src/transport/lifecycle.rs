//! The per-command lifecycle every transport shares, written once (nvmet's `nvmet_req` path
//! between a transport and `core.c`): a command goes to the command layer, whose [`Action`] is
//! carried out here: respond, send data, hold (an AER), or take a buffer against the budget
//! (or wait for one in arrival order), get the host's data into it, execute, collect backend
//! completions, then send read data and respond. What moves bytes is the transport's, through
//! its [`DataPath`] hooks (TCP: R2T, C2HData, CapsuleResp; RDMA: READ, WRITE, SEND; loop:
//! copies). Generic over the hooks, so each transport gets its own monomorphized copy: no
//! dynamic dispatch or allocation on the per-command path.

use super::slots::{SlotState, Slots};
use super::DataPath;
use crate::backend::IoCompletion;
use crate::command::{Action, Commands, Work};
use nvmf_proto::{Sqe, Status};
use std::time::Instant;

/// A command that cannot get buffer memory is failed with Internal Error, DNR clear: the
/// failure is the controller's, not the command's or the transport's, and a retry may succeed.
pub const NO_MEMORY: Status = Status::INTERNAL_ERROR;

/// A command as the hooks see it: its CID, and its slot when it holds one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct At {
    pub cid: u16,
    pub slot: Option<u16>,
}

/// One queue's command layer and command slots.
pub struct Lifecycle {
    pub cmd: Commands,
    pub slots: Slots,
    /// Routes backend completions to this queue (the high half of request tags).
    pub token: u32,
}

impl Lifecycle {
    pub fn new(cmd: Commands, slots: Slots) -> Lifecycle {
        Lifecycle { cmd, slots, token: 0 }
    }

    /// A command capsule (`data`: its in-capsule data, `data_ok`: its digest held) of a command
    /// that holds `slot` already ([`DataPath::SLOT_PER_COMMAND`]) or none.
    #[inline]
    pub fn command<D: DataPath>(&mut self, d: &mut D, sqe: &Sqe, slot: Option<u16>, data: &[u8], data_ok: bool, now: Instant) {
        let connected = self.cmd.queue().is_some();
        let action = self.cmd.command(sqe, data, data_ok, now);
        self.act(d, At { cid: sqe.cid(), slot }, action);
        if !connected && self.cmd.queue().is_some() {
            d.connected(&mut self.cmd);
        }
    }

    /// Carries out what the command layer asked for command `at`.
    #[inline]
    pub fn act<D: DataPath>(&mut self, d: &mut D, at: At, action: Action) {
        match action {
            Action::Respond(status, result) => d.respond(&self.cmd, &mut self.slots, at, status, result),
            Action::Send(data) => self.send(d, at, &data),
            Action::Hold => {
                if let Some(idx) = at.slot {
                    self.slots[idx].state = SlotState::Held;
                }
            }
            Action::Buffer { work, len, in_capsule } => self.buffer(d, at, work, len, in_capsule),
        }
        if self.cmd.take_ending() {
            d.ending();
        }
    }

    /// Data the command layer produced (Identify, log pages...), then success. A command with a
    /// slot sends it from the slot's buffer (taken beyond the budget: admin data is small).
    fn send<D: DataPath>(&mut self, d: &mut D, at: At, data: &[u8]) {
        let Some(idx) = at.slot else {
            d.send_copy(&self.cmd, at.cid, data);
            return d.respond(&self.cmd, &mut self.slots, at, Status::SUCCESS, 0);
        };
        if !data.is_empty() {
            self.slots[idx].len = data.len() as u32;
            if !matches!(self.slots.reserve(idx, true), Ok(true)) {
                return d.respond(&self.cmd, &mut self.slots, at, NO_MEMORY, 0);
            }
            self.slots[idx].buf.as_mut_slice().copy_from_slice(data);
            d.send_data(&self.cmd, &mut self.slots, idx, data.len() as u32);
        }
        d.respond(&self.cmd, &mut self.slots, at, Status::SUCCESS, 0);
    }

    /// A command that needs a buffer: from the capsule's data, from the host through the
    /// transport, or for the backend to fill (reads). I/O waits for buffer memory when the
    /// budget is short, behind the commands that wait already; in-capsule data (it has arrived)
    /// and Connect or AUTH_Send data (small, rare) are taken beyond the budgets.
    #[inline]
    fn buffer<D: DataPath>(&mut self, d: &mut D, at: At, work: Work, len: u32, in_capsule: Option<&[u8]>) {
        let Some(idx) = self.slot_for(d, at, work, len) else { return };
        if in_capsule.is_some() && matches!(work, Work::Io(plan) if self.cmd.discards_data(plan)) {
            // A write to a null namespace: its data goes nowhere, so it stays where it arrived
            // (SPDK's null bdev never reads it either). ram and file namespaces copy it below.
            self.slots[idx].received = len;
            return self.execute(d, idx);
        }
        if let Some(data) = in_capsule {
            if self.take_in_capsule(d, idx) {
                let s = &mut self.slots[idx];
                s.buf.as_mut_slice().copy_from_slice(data);
                s.received = len;
                self.execute(d, idx);
            }
            return;
        }
        let io = matches!(work, Work::Io(_));
        match () {
            _ if io && len == 0 => self.execute(d, idx),
            _ if io && self.slots.is_holding() => self.slots.hold(idx),
            _ => match self.slots.reserve(idx, !io) {
                Ok(true) => self.start_transfer(d, idx),
                Ok(false) if io => self.slots.hold(idx),
                _ => {
                    tracing::warn!(cid = at.cid, len, "no memory for a command buffer");
                    self.finish(d, idx, NO_MEMORY);
                }
            },
        }
    }

    /// The slot of command `at` set to `work` and `len`: its own, or a fresh one. None when
    /// there is none left (the transport answered).
    #[inline]
    fn slot_for<D: DataPath>(&mut self, d: &mut D, at: At, work: Work, len: u32) -> Option<u16> {
        if let Some(idx) = at.slot {
            let s = &mut self.slots[idx];
            (s.work, s.len) = (work, len);
            return Some(idx);
        }
        let idx = self.slots.alloc(self.cmd.slot_limit(), at.cid, work, len);
        if idx.is_none() {
            d.no_slot(&mut self.cmd, at.cid, work);
        }
        idx
    }

    /// Sizes slot `idx`'s buffer for data that comes in its capsule, beyond the budget (the data
    /// has arrived or is arriving: waiting would save nothing). False when the command was
    /// answered instead (no memory).
    fn take_in_capsule<D: DataPath>(&mut self, d: &mut D, idx: u16) -> bool {
        if self.slots.reserve(idx, true).is_err() {
            tracing::warn!(cid = self.slots[idx].cid, len = self.slots[idx].len, "no memory for a command buffer");
            self.finish(d, idx, NO_MEMORY);
            return false;
        }
        true
    }

    /// A slot with its buffer for command `cid` whose data comes in its capsule but has not
    /// arrived yet (the transport receives it there); None when the command was answered.
    pub fn claim_in_capsule<D: DataPath>(&mut self, d: &mut D, cid: u16, work: Work, len: u32) -> Option<u16> {
        let idx = self.slot_for(d, At { cid, slot: None }, work, len)?;
        self.take_in_capsule(d, idx).then_some(idx)
    }

    /// A command with its buffer: the host's data is fetched into it, or it runs (reads).
    #[inline]
    fn start_transfer<D: DataPath>(&mut self, d: &mut D, idx: u16) {
        let s = &mut self.slots[idx];
        let fetch = match s.work {
            Work::Io(plan) => plan.host_data_len() > 0,
            Work::Connect(_) | Work::AuthSend(_) => true,
        };
        if !fetch {
            return self.execute(d, idx);
        }
        s.state = SlotState::AwaitData;
        if let Err(status) = d.fetch_data(&mut self.slots, idx) {
            self.finish(d, idx, status);
        }
    }

    /// Starts the commands waiting for buffer memory, in arrival order, while the budget has
    /// room and the queue serves.
    pub fn admit_waiting<D: DataPath>(&mut self, d: &mut D) {
        while d.serving() {
            let Some(idx) = self.slots.first_held() else { return };
            match self.slots.reserve(idx, false) {
                Ok(false) => return,
                Ok(true) => {
                    self.slots.pop_held();
                    self.start_transfer(d, idx);
                }
                Err(_) => {
                    self.slots.pop_held();
                    tracing::warn!(cid = self.slots[idx].cid, "no memory for a command buffer");
                    self.finish(d, idx, NO_MEMORY);
                }
            }
        }
    }

    /// All the host's data is in slot `idx`'s buffer (`failed`: some arrived damaged): an I/O
    /// runs; Connect and AUTH_Send go back to the command layer.
    #[inline]
    pub fn data_arrived<D: DataPath>(&mut self, d: &mut D, idx: u16, now: Instant) {
        let s = &mut self.slots[idx];
        (s.received, s.state) = (s.len, SlotState::Executing);
        match (s.work, s.failed) {
            (Work::Io(_), Some(status)) => self.finish(d, idx, status),
            (Work::Io(_), None) => self.execute(d, idx),
            (work, failed) => {
                let (cid, data) = (s.cid, s.buf.as_slice()[..s.len as usize].to_vec());
                let slot = if D::SLOT_PER_COMMAND {
                    Some(idx)
                } else {
                    self.slots.free(idx);
                    None
                };
                let connected = self.cmd.queue().is_some();
                let action = self.cmd.data_in(work, &data, failed, now);
                self.act(d, At { cid, slot }, action);
                if !connected && self.cmd.queue().is_some() {
                    d.connected(&mut self.cmd);
                }
            }
        }
    }

    /// Hands a command whose data (if any) is in its buffer to the command layer, which queues
    /// its backend requests.
    #[inline]
    pub fn execute<D: DataPath>(&mut self, d: &mut D, idx: u16) {
        let tag = ((self.token as u64) << 32) | idx as u64;
        let s = &mut self.slots[idx];
        s.state = SlotState::Executing;
        let Work::Io(plan) = s.work else { return self.finish(d, idx, Status::INTERNAL_ERROR) };
        match self.cmd.execute(plan, &mut s.buf, tag) {
            Ok(0) => self.finish(d, idx, Status::SUCCESS),
            Ok(n) => s.pending = n,
            Err(status) => self.finish(d, idx, status),
        }
    }

    /// A backend request finished (`tag` as given at submission). True when it was its
    /// command's last.
    #[inline]
    pub fn complete_io<D: DataPath>(&mut self, d: &mut D, c: IoCompletion) -> bool {
        let idx = (c.tag & 0xFFFF) as u16;
        let Some(s) = self.slots.get_mut(idx) else { return false };
        if s.state != SlotState::Executing || s.pending == 0 {
            return false;
        }
        s.pending -= 1;
        let status = self.cmd.request_done(c.result, s.cid);
        if !status.is_success() {
            s.status = status;
        }
        if s.pending > 0 {
            return false;
        }
        let status = s.status;
        self.finish(d, idx, status);
        true
    }

    /// Completes a slot's command: its read data (on success), then the response, unless the
    /// queue no longer serves. The slot is free then, unless the transport still uses it (data
    /// sent from its buffer, or [`DataPath::SLOT_PER_COMMAND`]: the transport frees it).
    #[inline]
    pub fn finish<D: DataPath>(&mut self, d: &mut D, idx: u16, status: Status) {
        let s = &self.slots[idx];
        let at = At { cid: s.cid, slot: Some(idx) };
        if d.serving() {
            let read = match s.work {
                Work::Io(plan) => self.cmd.io_done(plan, status),
                _ => 0,
            };
            let completed = read > 0 && d.send_data(&self.cmd, &mut self.slots, idx, read as u32);
            if !completed {
                d.respond(&self.cmd, &mut self.slots, at, status, 0);
            }
        }
        if !D::SLOT_PER_COMMAND && self.slots[idx].state != SlotState::Sending {
            self.slots.free(idx);
        }
    }

    /// Asynchronous events (a namespace changed) complete the AERs the queue holds: the command
    /// layer says which (by CID) and with what DW0.
    pub fn complete_events<D: DataPath>(&mut self, d: &mut D) {
        while let Some((cid, dw0)) = self.cmd.next_event() {
            let slot = self.slots.find(SlotState::Held, cid);
            if D::SLOT_PER_COMMAND && slot.is_none() {
                tracing::warn!(cid, "an asynchronous event for an AER this queue does not hold");
                continue;
            }
            d.respond(&self.cmd, &mut self.slots, At { cid, slot }, Status::SUCCESS, dw0);
        }
    }
}
