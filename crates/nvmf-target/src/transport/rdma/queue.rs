//! One NVMe over RDMA queue: its queue pair, receive buffers (one per command the host may have
//! outstanding; a command keeps its buffer until its response has been sent, as nvmet does),
//! response buffers, command data buffers, and the command layer behind it.
//!
//! Command data buffers count against the process's `buffer_memory`, as a TCP connection's do,
//! and against the same per-connection budget ([`BUFFER_BUDGET`]). A command whose buffer does
//! not fit waits, in arrival order, until buffers are freed: by this queue's own completions,
//! or by other queues and connections (the listener retries every [`WAIT_RETRY`]).
//!
//! Work request ids say what completed: kind in the high 32 bits, command slot (= receive
//! buffer index) in the low. RDMA WRITEs are unsignaled: the SEND after them on the same queue
//! pair completes after them.

use super::{normalize_sqe, KeyedSgl};
use crate::backend::{AlignedBuf, Charge, IoCompletion, IoEngine, MemoryBudget};
use crate::command::{Action, BackendRequest, Commands, Work};
use crate::core::{Port, Target, ADMIN_IN_CAPSULE};
use crate::stats::ReactorStats;
use crate::transport::{Transport, BUFFER_BUDGET};
use nvmf_proto::{Cqe, Sqe, Status};
use nvmf_rdma::{Connection, MemoryRegion, SendOp, WorkCompletion};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

const WR_RECV: u64 = 1;
const WR_RESPONSE: u64 = 2;
const WR_READ: u64 = 3;
const WR_WRITE: u64 = 4;
const SQE_LEN: usize = 64;
const CQE_LEN: usize = 16;
/// Data buffers kept for reuse per queue; more are freed when their command completes.
const KEEP_BUFFERS: usize = 16;
/// How often a command that waits for buffer memory tries again while nothing else wakes its
/// queue (memory freed by another thread), as a TCP reactor does.
pub const WAIT_RETRY: Duration = Duration::from_millis(20);

/// The receive buffer size of a queue: an SQE and the in-capsule data it may carry. Admin queues
/// (and Connect) may carry up to 8 KiB in the capsule, as on TCP; I/O queues what IOCCSZ
/// advertises, at least that.
fn capsule_len(target: &Target, qid: u16) -> usize {
    let in_capsule = if qid == 0 { ADMIN_IN_CAPSULE } else { target.settings.in_capsule_data_size.max(ADMIN_IN_CAPSULE) };
    SQE_LEN + in_capsule as usize
}

/// Bytes of receive buffers a queue of `depth` commands takes.
pub fn receive_memory(target: &Target, qid: u16, depth: u32) -> usize {
    capsule_len(target, qid) * depth as usize
}

fn wr_id(kind: u64, slot: usize) -> u64 {
    (kind << 32) | slot as u64
}

/// A command data buffer registered with the queue pair's PD. `mr` is declared first so that it
/// is deregistered before the memory is freed.
struct DataBuf {
    mr: MemoryRegion,
    buf: AlignedBuf,
    /// The buffer's capacity, counted against `buffer_memory` and against the queue's budget
    /// until it is freed (dropped): held, never read.
    _charges: (Charge, Charge),
}

/// Why no data buffer came.
enum NoBuffer {
    /// The queue's or the process's budget is full: the command waits.
    Wait,
    /// Allocating or registering failed: the command fails.
    Failed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    /// The receive buffer is posted.
    Posted,
    /// A command is being served (its data read, its backend requests run).
    Busy,
    /// A command waits for buffer memory (in `Queue::waiting`, oldest first).
    AwaitBuffer,
    /// An Asynchronous Event Request, held until an event completes it (see `tick`).
    Held,
    /// The response SEND is posted; the buffer is reposted when it completes.
    Responding,
}

struct Slot {
    state: SlotState,
    cid: u16,
    sgl: Option<KeyedSgl>,
    work: Option<Work>,
    data: Option<DataBuf>,
    /// The buffer length a command waiting for memory needs.
    want: u32,
    pending: u32,
    status: Status,
}

pub struct Queue {
    pub cmd: Commands,
    target: Arc<Target>,
    /// The port thread's counters, which the queue's join once it is connected.
    stats: Arc<ReactorStats>,
    token: u32,
    capsule_len: usize,
    slots: Vec<Slot>,
    spare: Vec<DataBuf>,
    /// Commands waiting for buffer memory, oldest first: a small command does not pass a large one.
    waiting: VecDeque<usize>,
    /// Capacity of this queue's data buffers (spares included), at most BUFFER_BUDGET.
    budget: Arc<MemoryBudget>,
    recv_mr: MemoryRegion,
    recv_mem: AlignedBuf,
    rsp_mr: MemoryRegion,
    rsp_mem: AlignedBuf,
    /// The host disconnected, or we asked to: serve nothing more.
    pub closing: bool,
    /// The command layer ended the queue (Disconnect): disconnect once its response is out.
    ending: bool,
    /// Declared last: dropped after the memory regions registered on it.
    pub conn: Connection,
}

impl Transport for Queue {
    const KIND: crate::transport::TransportKind = crate::transport::TransportKind::Rdma;
}

impl Queue {
    /// Sets up the buffers of a queue of `depth` commands and posts the receives; the caller
    /// accepts the connection after this.
    pub fn new(
        conn: Connection,
        target: Arc<Target>,
        port: Option<Port>,
        stats: Arc<ReactorStats>,
        qid: u16,
        depth: u32,
        token: u32,
    ) -> std::io::Result<Queue> {
        let nomem = || std::io::Error::from(std::io::ErrorKind::OutOfMemory);
        let capsule_len = capsule_len(&target, qid);
        let depth = depth as usize;
        let mut recv_mem = AlignedBuf::new();
        recv_mem.try_resize(capsule_len * depth).map_err(|_| nomem())?;
        let mut rsp_mem = AlignedBuf::new();
        rsp_mem.try_resize(CQE_LEN * depth).map_err(|_| nomem())?;
        // SAFETY: both buffers live in the Queue, unmoved (heap memory), and the regions are
        // dropped before them (field order).
        let recv_mr = unsafe { conn.register(recv_mem.as_mut_ptr(), recv_mem.len())? };
        let rsp_mr = unsafe { conn.register(rsp_mem.as_mut_ptr(), rsp_mem.len())? };
        let slots = (0..depth)
            .map(|_| Slot { state: SlotState::Posted, cid: 0, sgl: None, work: None, data: None, want: 0, pending: 0, status: Status::SUCCESS })
            .collect();
        let now = Instant::now();
        let mut q = Queue {
            cmd: Commands::new(target.clone(), port, Self::capabilities(&target.settings), now),
            target,
            stats,
            token,
            capsule_len,
            slots,
            spare: Vec::new(),
            waiting: VecDeque::new(),
            budget: Arc::new(MemoryBudget::new(BUFFER_BUDGET)),
            recv_mr,
            recv_mem,
            rsp_mr,
            rsp_mem,
            closing: false,
            ending: false,
            conn,
        };
        for i in 0..depth {
            q.post_recv(i)?;
        }
        Ok(q)
    }

    fn post_recv(&mut self, slot: usize) -> std::io::Result<()> {
        self.slots[slot].state = SlotState::Posted;
        let at = slot * self.capsule_len;
        // SAFETY: the range lies in recv_mem, registered as recv_mr, alive while the QP is.
        unsafe {
            let p = self.recv_mem.as_mut_ptr().add(at);
            self.conn.post_recv(wr_id(WR_RECV, slot), p, self.capsule_len as u32, self.recv_mr.lkey)
        }
    }

    /// Ends the queue from our side (Disconnect, a fatal error, a timeout): the host sees the
    /// connection go, and the CM reports it disconnected.
    pub fn shut(&mut self, why: &str) {
        if !self.closing {
            tracing::info!(why, "closing NVMe/RDMA queue");
            self.closing = true;
            self.waiting.clear();
            self.cmd.release();
            let _ = self.conn.disconnect();
        }
    }

    /// Handles the completions on the CQ; backend requests go to `engine`.
    pub fn poll(&mut self, engine: &mut IoEngine, now: Instant) {
        let mut wcs = [WorkCompletion::default(); 32];
        loop {
            let n = match self.conn.poll(&mut wcs) {
                Ok(n) => n,
                Err(e) => {
                    self.shut(&format!("polling the CQ failed: {e}"));
                    return;
                }
            };
            for wc in &wcs[..n] {
                self.completion(wc, now);
            }
            self.serve_waiting();
            self.submit(engine);
            if n < wcs.len() {
                return;
            }
        }
    }

    fn completion(&mut self, wc: &WorkCompletion, now: Instant) {
        let (kind, slot) = (wc.wr_id >> 32, (wc.wr_id & 0xFFFF_FFFF) as usize);
        if !wc.ok() {
            // After a disconnect, posted work is flushed with an error: expected.
            if !self.closing {
                self.shut(&format!("work request failed: {}", wc.status_name()));
            }
            return;
        }
        if self.closing || slot >= self.slots.len() {
            return;
        }
        match kind {
            WR_RECV => self.capsule(slot, wc.byte_len as usize, now),
            WR_READ => self.data_read(slot, now),
            WR_RESPONSE => self.response_sent(slot),
            _ => {}
        }
    }

    /// A command capsule arrived in receive buffer `slot`.
    fn capsule(&mut self, slot: usize, len: usize, now: Instant) {
        if len < SQE_LEN || len > self.capsule_len {
            return self.shut("capsule shorter than an SQE");
        }
        let at = slot * self.capsule_len;
        let recv = std::mem::take(&mut self.recv_mem);
        let capsule = &recv.as_slice()[at..at + len];
        let raw = Sqe::from_bytes(capsule).expect("64 bytes");
        let (sqe, sgl) = normalize_sqe(&raw);
        let s = &mut self.slots[slot];
        s.state = SlotState::Busy;
        s.cid = sqe.cid();
        s.sgl = sgl;
        s.status = Status::SUCCESS;
        let connected = self.cmd.queue().is_some();
        let action = self.cmd.command(&sqe, &capsule[SQE_LEN..], true, now);
        self.act(slot, action);
        self.recv_mem = recv;
        if !connected {
            self.on_connect();
        }
    }

    /// Once Connect succeeded: the queue's counters join the port thread's.
    fn on_connect(&mut self) {
        let Some(q) = self.cmd.queue() else { return };
        let (cntlid, qid, sqsize) = (q.ctrl.cntlid, q.qid, q.sqsize);
        tracing::info!(cntlid, qid, sqsize, subnqn = %q.stats.subnqn, hostnqn = %q.stats.hostnqn, "RDMA queue connected");
        self.cmd.attach(&self.stats);
    }

    /// Carries out what the command layer asked for the command in `slot`.
    fn act(&mut self, slot: usize, action: Action) {
        match action {
            Action::Respond(status, result) => self.respond(slot, status, result),
            Action::Send(data) => self.send_data(slot, &data),
            Action::Hold => self.slots[slot].state = SlotState::Held,
            Action::Buffer { work, len, in_capsule } => self.buffer(slot, work, len, in_capsule),
        }
        if self.cmd.take_ending() {
            self.ending = true;
        }
    }

    /// A registered buffer of `len` bytes, counted against the budgets; `force` takes it beyond
    /// them (data that arrived already, small admin data).
    fn data_buf(&mut self, len: usize, force: bool) -> Result<DataBuf, NoBuffer> {
        if let Some(i) = self.spare.iter().position(|d| d.buf.capacity() >= len) {
            let mut d = self.spare.swap_remove(i);
            d.buf.try_resize(len).map_err(|_| NoBuffer::Failed)?;
            return Ok(d);
        }
        let want = len.max(4096).next_power_of_two();
        let cap = AlignedBuf::capacity_for(want);
        let charges = match self.charge(cap, force) {
            Some(c) => c,
            None => {
                // Our idle buffers first: they may be what keeps the budget full.
                self.drop_spares();
                self.charge(cap, force).ok_or(NoBuffer::Wait)?
            }
        };
        let mut buf = AlignedBuf::with_align(self.target.buffer_align);
        buf.try_resize(want).map_err(|_| NoBuffer::Failed)?;
        // SAFETY: the region is dropped before the buffer (DataBuf's field order) and the buffer's
        // memory does not move while its length stays within capacity.
        let mr = unsafe { self.conn.register(buf.as_mut_ptr(), buf.capacity()) }.map_err(|_| NoBuffer::Failed)?;
        buf.try_resize(len).map_err(|_| NoBuffer::Failed)?;
        Ok(DataBuf { mr, buf, _charges: charges })
    }

    /// `cap` bytes of both budgets (the process's and this queue's), or `None` when either is
    /// full (a charge taken from one is given back when the other refuses).
    fn charge(&self, cap: usize, force: bool) -> Option<(Charge, Charge)> {
        let queue = self.budget.charge(cap, force)?;
        Some((self.target.buffers.charge(cap, force)?, queue))
    }

    /// Frees the idle buffers kept for reuse (their charges go back as they drop).
    fn drop_spares(&mut self) {
        self.spare.clear();
    }

    /// The slot's buffer is kept for reuse, or freed when enough are kept or the process is
    /// short of buffer memory (others may wait for it).
    fn release_buf(&mut self, slot: usize) {
        if let Some(d) = self.slots[slot].data.take() {
            if self.spare.len() < KEEP_BUFFERS && !self.target.buffers.under_pressure() {
                self.spare.push(d);
            }
        }
    }

    fn buffer(&mut self, slot: usize, work: Work, len: u32, in_capsule: Option<&[u8]>) {
        // In-capsule data has arrived already and admin data is small: both are taken beyond
        // the budgets, as on TCP, so that Connect and authentication never wait.
        let force = in_capsule.is_some() || !matches!(work, Work::Io(_));
        if !force && !self.waiting.is_empty() {
            return self.hold(slot, work, len);
        }
        match self.data_buf(len as usize, force) {
            Ok(data) => self.transfer(slot, work, data, in_capsule),
            Err(NoBuffer::Wait) => self.hold(slot, work, len),
            Err(NoBuffer::Failed) => {
                tracing::warn!(len, "no memory for a command buffer");
                self.respond(slot, Status::INTERNAL_ERROR, 0)
            }
        }
    }

    /// The command in `slot` waits for buffer memory, behind those that wait already.
    fn hold(&mut self, slot: usize, work: Work, len: u32) {
        let s = &mut self.slots[slot];
        (s.state, s.work, s.want) = (SlotState::AwaitBuffer, Some(work), len);
        self.waiting.push_back(slot);
    }

    /// Commands waiting for buffer memory: true while any does.
    pub fn is_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// Serves the commands that wait for buffer memory, oldest first, while their buffers fit.
    fn serve_waiting(&mut self) {
        if self.target.buffers.under_pressure() {
            self.drop_spares();
        }
        while let Some(&slot) = self.waiting.front() {
            let (len, work) = (self.slots[slot].want, self.slots[slot].work);
            let Some(work) = work else {
                self.waiting.pop_front();
                continue;
            };
            match self.data_buf(len as usize, false) {
                Err(NoBuffer::Wait) => return,
                Ok(data) => {
                    self.waiting.pop_front();
                    self.slots[slot].state = SlotState::Busy;
                    self.transfer(slot, work, data, None);
                }
                Err(NoBuffer::Failed) => {
                    self.waiting.pop_front();
                    tracing::warn!(len, "no memory for a command buffer");
                    self.respond(slot, Status::INTERNAL_ERROR, 0);
                }
            }
        }
    }

    /// The command in `slot` has its buffer: the host's data is fetched into it (or copied from
    /// the capsule), then the command runs.
    fn transfer(&mut self, slot: usize, work: Work, mut data: DataBuf, in_capsule: Option<&[u8]>) {
        if let Some(d) = in_capsule {
            data.buf.as_mut_slice().copy_from_slice(d);
        }
        let s = &mut self.slots[slot];
        s.work = Some(work);
        let len = data.buf.len() as u32;
        let fetch = in_capsule.is_none()
            && match work {
                Work::Io(plan) => plan.host_data_len() > 0,
                Work::Connect(_) | Work::AuthSend(_) => true,
            };
        s.data = Some(data);
        if !fetch {
            return self.execute(slot);
        }
        // The host's data: one RDMA READ of its keyed SGL into our buffer.
        let Some(sgl) = s.sgl else { return self.respond(slot, Status::SGL_INVALID_TYPE.with_dnr(), 0) };
        let d = s.data.as_mut().expect("just set");
        let (p, lkey) = (d.buf.as_mut_ptr(), d.mr.lkey);
        // SAFETY: the buffer (len bytes, registered) stays in the slot until the READ completes.
        let r = unsafe { self.conn.post_send(SendOp::Read(sgl.addr, sgl.key), wr_id(WR_READ, slot), true, p, len, lkey) };
        if let Err(e) = r {
            self.shut(&format!("posting an RDMA READ failed: {e}"));
        }
    }

    /// The RDMA READ of the host's data completed.
    fn data_read(&mut self, slot: usize, now: Instant) {
        match self.slots[slot].work {
            Some(Work::Io(_)) => self.execute(slot),
            Some(work) => {
                let data = self.slots[slot].data.as_ref().map(|d| d.buf.as_slice().to_vec()).unwrap_or_default();
                self.release_buf(slot);
                let connected = self.cmd.queue().is_some();
                let action = self.cmd.data_in(work, &data, None, now);
                self.act(slot, action);
                if !connected {
                    self.on_connect();
                }
            }
            None => {}
        }
    }

    fn execute(&mut self, slot: usize) {
        let tag = ((self.token as u64) << 32) | slot as u64;
        let s = &mut self.slots[slot];
        let Some(Work::Io(plan)) = s.work else { return self.respond(slot, Status::INTERNAL_ERROR, 0) };
        let mut empty = AlignedBuf::new();
        let buf = match s.data.as_mut() {
            Some(d) => &mut d.buf,
            None => &mut empty,
        };
        match self.cmd.execute(plan, buf, tag) {
            Ok(0) => self.finish(slot, Status::SUCCESS),
            Ok(n) => self.slots[slot].pending = n,
            Err(status) => self.finish(slot, status),
        }
    }

    /// Hands the queued backend requests to the engine.
    pub fn submit(&mut self, engine: &mut IoEngine) {
        for r in self.cmd.backend_requests() {
            match r {
                // SAFETY: each request's buffer is a slot's DataBuf, kept until its completion
                // (a closed queue is kept until in_flight is 0).
                BackendRequest::Submit(backend, req) => unsafe { engine.submit(backend, req) },
                BackendRequest::Done(tag) => engine.complete_now(tag, Ok(())),
            }
        }
    }

    /// A backend request of this queue finished.
    pub fn io_done(&mut self, c: IoCompletion) {
        let slot = (c.tag & 0xFFFF_FFFF) as usize;
        let Some(s) = self.slots.get_mut(slot) else { return };
        if s.pending == 0 {
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

    /// An I/O command completes: its read data by RDMA WRITE, then the response.
    fn finish(&mut self, slot: usize, status: Status) {
        let Some(Work::Io(plan)) = self.slots[slot].work else { return self.respond(slot, status, 0) };
        let read = self.cmd.io_done(plan, status);
        if read > 0 {
            if let Err(e) = self.write_to_host(slot, None) {
                return self.shut(&format!("posting an RDMA WRITE failed: {e}"));
            }
        }
        self.respond(slot, status, 0);
    }

    /// Data the command layer produced (Identify, log pages...): RDMA WRITE, then success.
    fn send_data(&mut self, slot: usize, data: &[u8]) {
        if !data.is_empty() {
            let Ok(mut d) = self.data_buf(data.len(), true) else { return self.respond(slot, Status::INTERNAL_ERROR, 0) };
            d.buf.as_mut_slice().copy_from_slice(data);
            self.slots[slot].data = Some(d);
            if let Err(e) = self.write_to_host(slot, Some(data.len())) {
                return self.shut(&format!("posting an RDMA WRITE failed: {e}"));
            }
        }
        self.respond(slot, Status::SUCCESS, 0);
    }

    /// Posts an unsignaled RDMA WRITE of the slot's buffer (its first `len` bytes, or all) to the
    /// host's keyed SGL; the response SEND posted next completes after it.
    fn write_to_host(&mut self, slot: usize, len: Option<usize>) -> std::io::Result<()> {
        let s = &mut self.slots[slot];
        let (Some(sgl), Some(d)) = (s.sgl, s.data.as_mut()) else { return Ok(()) };
        let len = len.unwrap_or(d.buf.len()).min(sgl.len as usize);
        let (p, lkey) = (d.buf.as_mut_ptr(), d.mr.lkey);
        // SAFETY: the buffer stays in the slot until the response SEND after it completes.
        unsafe { self.conn.post_send(SendOp::Write(sgl.addr, sgl.key), wr_id(WR_WRITE, slot), false, p, len as u32, lkey) }
    }

    /// Sends the completion of the command in `slot` (with Invalidate when the host asked).
    fn respond(&mut self, slot: usize, status: Status, result: u64) {
        let (sqid, sqhd) = self.cmd.sq_ids();
        let s = &mut self.slots[slot];
        let cqe = Cqe { result, sqhd, sqid, cid: s.cid, status };
        s.state = SlotState::Responding;
        let op = match s.sgl {
            Some(k) if k.invalidate => SendOp::SendInvalidate(k.key),
            _ => SendOp::Send,
        };
        let at = slot * CQE_LEN;
        self.rsp_mem.as_mut_slice()[at..at + CQE_LEN].copy_from_slice(&cqe.encode());
        // SAFETY: the 16 bytes lie in rsp_mem (registered), reused only after this SEND completes.
        let r = unsafe {
            let p = self.rsp_mem.as_mut_ptr().add(at);
            self.conn.post_send(op, wr_id(WR_RESPONSE, slot), true, p, CQE_LEN as u32, self.rsp_mr.lkey)
        };
        if let Err(e) = r {
            self.shut(&format!("posting a response failed: {e}"));
        }
    }

    /// The response of `slot` went out: its buffers are free and its receive is posted again.
    fn response_sent(&mut self, slot: usize) {
        if self.slots[slot].state != SlotState::Responding {
            return;
        }
        self.release_buf(slot);
        let s = &mut self.slots[slot];
        (s.work, s.sgl, s.pending) = (None, None, 0);
        if self.ending {
            return self.shut("host disconnected the queue (Fabrics Disconnect)");
        }
        if let Err(e) = self.post_recv(slot) {
            self.shut(&format!("reposting a receive failed: {e}"));
        }
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
            match self.slots.iter().position(|s| s.state == SlotState::Held && s.cid == cid) {
                Some(slot) => self.respond(slot, Status::SUCCESS, dw0),
                None => tracing::warn!(cid, "an asynchronous event for an AER this queue does not hold"),
            }
        }
    }

    /// Backend requests outstanding: the queue's buffers must outlive them.
    pub fn in_flight(&self) -> usize {
        self.cmd.in_flight()
    }
}
