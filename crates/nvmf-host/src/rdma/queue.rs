//! One NVMe/RDMA queue pair on rdma-core (through `nvmf-rdma`): RDMA CM connect with the
//! binding's private data, capsules by SEND, completions received into posted buffers, data
//! moved by the controller through keyed SGLs on the slots' registered buffers.
//!
//! Memory: each slot's data buffer is registered once for the controller's RDMA READ and WRITE
//! (re-registered when an admin command grows it) and named by its remote key in every keyed SGL,
//! never invalidated; the capsule area (one SQE plus in-capsule data per slot) and the receive
//! area (one 16-byte completion per posted receive) are registered for local access only.

use std::any::Any;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use nvmf_proto::nvme::{CQE_LEN, SQE_LEN};
use nvmf_proto::rdma::{cm_status, parse_cm_reject, parse_cm_reply};
use nvmf_proto::{Cqe, Sqe};
use nvmf_rdma::{Connection, Connector, EventKind, MemoryRegion, SendOp, WorkCompletion};

use super::{build_command, cm_request, split_addr, DataPath, RemoteBuffer, SlotState};
use crate::command::{command_name, Completion, Xfer};
use crate::error::{Error, Result};
use crate::queue::{wrong_transport, QueueTransport};

/// Receive work requests carry this bit in their ID; sends carry the slot's tag.
const RECV_BIT: u64 = 1 << 63;

struct Slot {
    // Declared before `buf`: the registration goes before the memory it covers.
    mr: MemoryRegion,
    buf: Vec<u8>,
    state: SlotState,
    /// The command as submitted, kept to resubmit it on a new connection after a reconnect.
    sqe: Sqe,
    xfer: Xfer,
}

/// An NVMe/RDMA queue pair.
pub struct RdmaQueue {
    qid: u16,
    in_capsule_max: usize,
    slots: Vec<Slot>,
    /// One capsule (SQE + in-capsule data) per slot, at `tag * capsule_len`.
    capsules: Vec<u8>,
    capsules_mr: MemoryRegion,
    capsule_len: usize,
    /// One completion per posted receive, at `i * CQE_LEN`.
    responses: Vec<u8>,
    responses_mr: MemoryRegion,
    wc: [WorkCompletion; 32],
    /// A SEND that could not be posted (the connection is failing): its command stays in
    /// flight, and the next commit or poll reports the loss, as NVMe/TCP's would, so that a
    /// reconnect resubmits it.
    post_error: Option<Error>,
    // The regions above are dropped before the connection, and the connection before its
    // CM id's event channel.
    conn: Connection,
    cm: Connector,
}

fn io_err(what: &str, e: std::io::Error) -> Error {
    Error::Io(std::io::Error::new(e.kind(), format!("{what}: {e}")))
}

impl RdmaQueue {
    /// Connects queue `qid` to the controller at `addr` (`host:port`) over RDMA CM, asking in
    /// the private data for SQSIZE `sqsize` (0's based; the Connect command must ask the same)
    /// and controller `cntlid`; `depth` slots of `buf_len`-byte buffers, write data up to
    /// `in_capsule_max` bytes in the capsule on I/O queues.
    #[allow(clippy::too_many_arguments)]
    pub fn connect(addr: &str, timeout: Duration, qid: u16, depth: usize, buf_len: usize, in_capsule_max: usize, sqsize: u16, cntlid: u16) -> Result<RdmaQueue> {
        let (host, port) = split_addr(addr)?;
        let connect_err = |source: std::io::Error| Error::Connect { addr: format!("rdma:{addr}"), source };
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        let cm = Connector::resolve(&host, port, ms).map_err(connect_err)?;
        let req = cm_request(qid, sqsize, cntlid);
        let depth = depth.clamp(1, req.depth() as usize);
        let receives = req.hrqsize as usize;
        let conn = Connection::create(cm.id(), depth as u32 + 1, receives as u32).map_err(connect_err)?;
        let in_capsule_max = if qid == 0 { 0 } else { in_capsule_max };
        let capsule_len = SQE_LEN + in_capsule_max;
        let mut capsules = vec![0u8; capsule_len * depth];
        let mut responses = vec![0u8; CQE_LEN * receives];
        // SAFETY: the vectors are never resized and outlive their regions (field order).
        let capsules_mr = unsafe { conn.register(capsules.as_mut_ptr(), capsules.len()) }.map_err(|e| io_err("registering capsules", e))?;
        let responses_mr = unsafe { conn.register(responses.as_mut_ptr(), responses.len()) }.map_err(|e| io_err("registering receive buffers", e))?;
        let slots = (0..depth).map(|_| new_slot(&conn, buf_len)).collect::<Result<Vec<_>>>()?;
        let mut q = RdmaQueue {
            qid,
            in_capsule_max,
            slots,
            capsules,
            capsules_mr,
            capsule_len,
            responses,
            responses_mr,
            wc: [WorkCompletion::default(); 32],
            post_error: None,
            conn,
            cm,
        };
        for i in 0..receives {
            q.post_recv(i)?;
        }
        q.conn.connect(&req.encode()).map_err(connect_err)?;
        let deadline = Instant::now() + timeout;
        loop {
            let Some(ev) = q.cm.next_event().map_err(|e| io_err("RDMA CM", e))? else {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(Error::Timeout(format!("rdma:{addr} did not answer the connect request of queue {qid}")));
                }
                wait_readable(&[q.cm.fd()], left)?;
                continue;
            };
            match ev.kind {
                EventKind::Established => {
                    // CRQSIZE: the controller's receive queue; fewer than our slots would overrun it.
                    if let Some(crq) = parse_cm_reply(&ev.private_data) {
                        if (crq as usize) < q.slots.len() {
                            return Err(Error::Protocol(format!("the controller's receive queue ({crq}) is smaller than queue {qid}'s {} slots", q.slots.len())));
                        }
                    }
                    tracing::debug!(qid, depth, receives, "NVMe/RDMA queue connected");
                    return Ok(q);
                }
                EventKind::Rejected => {
                    let why = match parse_cm_reject(&ev.private_data) {
                        Some(s) => format!("status {s:#x}, {}", cm_status::name(s)),
                        None => format!("CM status {}, no NVMe/RDMA reject data", ev.status),
                    };
                    return Err(connect_err(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, format!("queue {qid} rejected: {why}"))));
                }
                _ => {
                    let e = std::io::Error::new(std::io::ErrorKind::ConnectionAborted, format!("{} (status {})", ev.name(), ev.status));
                    return Err(connect_err(e));
                }
            }
        }
    }

    /// Grows `tag`'s buffer (admin commands with large data), registering it anew.
    pub fn ensure_buffer(&mut self, tag: u16, len: usize) -> Result<()> {
        if self.slots[tag as usize].buf.len() >= len {
            return Ok(());
        }
        let slot = &mut self.slots[tag as usize];
        if slot.state.is_active() {
            return Err(Error::Unsupported(format!("tag {tag}'s buffer cannot grow while its command is in flight")));
        }
        let fresh = new_slot(&self.conn, len)?;
        // The old registration goes before its buffer (Slot's field order).
        *slot = fresh;
        Ok(())
    }

    fn post_recv(&mut self, i: usize) -> Result<()> {
        let p = self.responses[i * CQE_LEN..].as_mut_ptr();
        // SAFETY: the slice lies in responses_mr, which lives as long as the connection.
        unsafe { self.conn.post_recv(RECV_BIT | i as u64, p, CQE_LEN as u32, self.responses_mr.lkey) }.map_err(|e| io_err("posting a receive", e))
    }

    /// Sends a command with CID `tag` (SEND of its capsule). A SEND the connection refuses is
    /// reported at the next commit or poll, its command in flight.
    pub fn submit(&mut self, tag: u16, mut sqe: Sqe, xfer: Xfer) -> Result<()> {
        let (qid, icmax, clen) = (self.qid, self.in_capsule_max, self.capsule_len);
        let slot = self.slots.get_mut(tag as usize).ok_or_else(|| Error::Unsupported(format!("tag {tag} beyond queue depth")))?;
        if slot.state.is_active() {
            return Err(Error::Unsupported(format!("tag {tag} is already in flight")));
        }
        let buf = RemoteBuffer { addr: slot.buf.as_ptr() as u64, len: slot.buf.len(), rkey: slot.mr.rkey };
        let path = build_command(&mut sqe, tag, xfer, qid, icmax, buf)?;
        let capsule = &mut self.capsules[tag as usize * clen..][..clen];
        capsule[..SQE_LEN].copy_from_slice(&sqe.0);
        let data = match path {
            DataPath::InCapsule(n) => {
                capsule[SQE_LEN..SQE_LEN + n].copy_from_slice(&slot.buf[..n]);
                n
            }
            DataPath::None | DataPath::Keyed(_) => 0,
        };
        slot.state.start();
        (slot.sqe, slot.xfer) = (sqe, xfer);
        let p = capsule.as_mut_ptr();
        // SAFETY: the capsule lies in capsules_mr and is not touched until the SEND completes.
        if let Err(e) = unsafe { self.conn.post_send(SendOp::Send, tag as u64, true, p, (SQE_LEN + data) as u32, self.capsules_mr.lkey) } {
            self.post_error.get_or_insert(io_err("posting a SEND", e));
        }
        Ok(())
    }

    /// Takes the completions that are in, pushing finished commands into `done` (cleared
    /// first). With a non-zero `wait` it sleeps on the completion channel up to `wait` until at
    /// least one finishes.
    pub fn poll(&mut self, wait: Duration, done: &mut Vec<Completion>) -> Result<()> {
        done.clear();
        if let Some(e) = self.post_error.take() {
            return Err(e);
        }
        let deadline = (!wait.is_zero()).then(|| Instant::now() + wait);
        loop {
            self.reap(done)?;
            let Some(deadline) = deadline else { return Ok(()) };
            if !done.is_empty() {
                return Ok(());
            }
            // Arm, then look once more: a completion between the last poll and the arming
            // raises no event.
            self.conn.rearm().map_err(|e| io_err("arming the CQ", e))?;
            self.reap(done)?;
            if !done.is_empty() {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(());
            }
            wait_readable(&[self.conn.completion_fd(), self.cm.fd()], left)?;
            self.check_cm()?;
        }
    }

    /// A disconnect or error event on the CM channel ends the queue.
    fn check_cm(&mut self) -> Result<()> {
        while let Some(ev) = self.cm.next_event().map_err(|e| io_err("RDMA CM", e))? {
            match ev.kind {
                EventKind::Established => {}
                EventKind::Disconnected => return Err(Error::Closed),
                _ => return Err(Error::Io(std::io::Error::new(std::io::ErrorKind::ConnectionAborted, format!("RDMA CM: {}", ev.name())))),
            }
        }
        Ok(())
    }

    fn reap(&mut self, done: &mut Vec<Completion>) -> Result<()> {
        loop {
            let n = self.conn.poll(&mut self.wc).map_err(|e| io_err("polling the CQ", e))?;
            for i in 0..n {
                let wc = self.wc[i];
                if !wc.ok() {
                    // Flushed work after a disconnect, or a transport error: the queue is gone.
                    return Err(Error::Io(std::io::Error::new(
                        std::io::ErrorKind::ConnectionAborted,
                        format!("RDMA work request failed on queue {}: {}", self.qid, wc.status_name()),
                    )));
                }
                if wc.wr_id & RECV_BIT != 0 {
                    self.response((wc.wr_id & !RECV_BIT) as usize, wc.byte_len as usize, done)?;
                } else {
                    let tag = wc.wr_id as u16;
                    if let Some(result) = self.slots.get_mut(tag as usize).and_then(|s| s.state.sent()) {
                        done.push(Completion { tag, result });
                    }
                }
            }
            if n < self.wc.len() {
                return Ok(());
            }
        }
    }

    /// Receive buffer `i` holds a completion: record it on its slot and post the buffer again.
    fn response(&mut self, i: usize, len: usize, done: &mut Vec<Completion>) -> Result<()> {
        if i * CQE_LEN >= self.responses.len() {
            return Err(Error::Protocol(format!("a receive completion for buffer {i}, which was never posted")));
        }
        if len < CQE_LEN {
            return Err(Error::Protocol(format!("a {len}-byte response on queue {} (a completion has {CQE_LEN})", self.qid)));
        }
        let cqe = Cqe::decode(self.responses[i * CQE_LEN..][..CQE_LEN].try_into().expect("16 bytes"));
        self.post_recv(i)?;
        let qid = self.qid;
        let Some(slot) = self.slots.get_mut(cqe.cid as usize) else {
            return Err(Error::Protocol(format!("a completion for CID {} beyond queue {qid}'s depth", cqe.cid)));
        };
        let result = if cqe.status.is_success() {
            Ok(cqe.result)
        } else {
            Err(Error::Status { command: command_name(slot.sqe.opcode(), slot.sqe.fctype(), qid), status: cqe.status })
        };
        if let Some(result) = slot.state.respond(result, cqe.cid, qid)? {
            done.push(Completion { tag: cqe.cid, result });
        }
        Ok(())
    }
}

impl RdmaQueue {
    /// Takes over `fresh`'s connection (a new one, joined to the controller, with as many
    /// slots) and posts again every command that was in flight here. The slots keep their
    /// buffers, so data of commands that finished before the loss stays where the caller
    /// reads it; each buffer is registered anew in the fresh connection's protection domain.
    fn take_over(&mut self, mut fresh: RdmaQueue) -> Result<usize> {
        if fresh.qid != self.qid || fresh.slots.len() < self.slots.len() {
            return Err(Error::Unsupported(format!(
                "resubmitting queue {} ({} slots) onto queue {} with {} slots",
                self.qid,
                self.slots.len(),
                fresh.qid,
                fresh.slots.len()
            )));
        }
        // The connection and its capsule and receive areas change places: `fresh` now holds
        // the old ones and goes at the end, with the buffers it was connected with.
        std::mem::swap(&mut self.conn, &mut fresh.conn);
        std::mem::swap(&mut self.cm, &mut fresh.cm);
        std::mem::swap(&mut self.capsules, &mut fresh.capsules);
        std::mem::swap(&mut self.capsules_mr, &mut fresh.capsules_mr);
        std::mem::swap(&mut self.responses, &mut fresh.responses);
        std::mem::swap(&mut self.responses_mr, &mut fresh.responses_mr);
        (self.in_capsule_max, self.capsule_len) = (fresh.in_capsule_max, fresh.capsule_len);
        self.post_error = None;
        for slot in &mut self.slots {
            // SAFETY: as in new_slot; the old registration goes at the assignment, one
            // buffer at a time, so no more memory is pinned than one buffer's worth.
            let mr = unsafe { self.conn.register_remote(slot.buf.as_mut_ptr(), slot.buf.len()) };
            // Some slots would stay registered on the old connection: not worth retrying.
            slot.mr = mr.map_err(|e| Error::Unsupported(format!("registering a data buffer again after a reconnect: {e}")))?;
        }
        let mut n = 0;
        for tag in 0..self.slots.len() {
            let slot = &mut self.slots[tag];
            if slot.state.is_active() {
                slot.state.abort();
                let (sqe, xfer) = (slot.sqe, slot.xfer);
                self.submit(tag as u16, sqe, xfer)?;
                n += 1;
            }
        }
        Ok(n)
    }
}

impl QueueTransport for RdmaQueue {
    fn qid(&self) -> u16 {
        self.qid
    }

    fn depth(&self) -> usize {
        self.slots.len()
    }

    fn in_capsule_max(&self) -> usize {
        self.in_capsule_max
    }

    fn buffer(&mut self, tag: u16) -> &mut [u8] {
        &mut self.slots[tag as usize].buf
    }

    fn ensure_buffer(&mut self, tag: u16, len: usize) -> Result<()> {
        RdmaQueue::ensure_buffer(self, tag, len)
    }

    fn submit(&mut self, tag: u16, sqe: Sqe, xfer: Xfer) -> Result<()> {
        RdmaQueue::submit(self, tag, sqe, xfer)
    }

    /// Nothing waits ([`RdmaQueue::submit`] posts at once), but a SEND that failed to post is
    /// reported here.
    fn commit(&mut self) -> Result<()> {
        self.post_error.take().map_or(Ok(()), Err)
    }

    fn poll(&mut self, wait: Duration, done: &mut Vec<Completion>) -> Result<()> {
        RdmaQueue::poll(self, wait, done)
    }

    /// Every slot, with buffers only as large as Connect's data: capsules are registered per
    /// connection, the slots' own buffers move over and are registered again.
    fn fresh_shape(&self, _buf_len: usize) -> (usize, usize) {
        (self.slots.len(), 0)
    }

    fn resubmit_on(&mut self, fresh: Box<dyn Any>, _in_capsule_max: usize) -> Result<usize> {
        let fresh = fresh.downcast::<RdmaQueue>().map_err(|_| wrong_transport())?;
        self.take_over(*fresh)
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

impl Drop for RdmaQueue {
    fn drop(&mut self) {
        // Tell the controller at once; the verbs resources go with the fields.
        let _ = self.conn.disconnect();
    }
}

fn new_slot(conn: &Connection, len: usize) -> Result<Slot> {
    let mut buf = vec![0u8; len.max(1)];
    // SAFETY: the buffer is never resized while registered and is dropped after its region.
    let mr = unsafe { conn.register_remote(buf.as_mut_ptr(), buf.len()) }.map_err(|e| io_err("registering a data buffer", e))?;
    Ok(Slot { mr, buf, state: SlotState::default(), sqe: Sqe::new(0, 0), xfer: Xfer::None })
}

/// Sleeps in poll(2) until one of `fds` is readable or `timeout` passed.
fn wait_readable(fds: &[RawFd], timeout: Duration) -> Result<()> {
    let mut p: Vec<libc::pollfd> = fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
    // SAFETY: p is a valid array of p.len() pollfds.
    if unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) } < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e.into());
        }
    }
    Ok(())
}
