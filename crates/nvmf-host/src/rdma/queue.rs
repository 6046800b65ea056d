//! One NVMe/RDMA queue pair on rdma-core (through `nvmf-rdma`): the thin driver of
//! [`RdmaMachine`]. It does RDMA CM connect with the binding's private data, registers the
//! machine's capsule and receive areas and the slots' data buffers, posts the verbs the machine
//! returns, and feeds it the work completions it polls.
//!
//! Memory: each slot's data buffer is registered once for the controller's RDMA READ and WRITE
//! (re-registered when an admin command grows it, and on the fresh connection after a reconnect)
//! and named by its remote key in every keyed SGL, never invalidated; the capsule area (one SQE
//! plus in-capsule data per slot) and the receive area (one 16-byte completion per posted
//! receive) are registered for local access only.

use std::any::Any;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use nvmf_proto::nvme::CQE_LEN;
use nvmf_proto::rdma::{cm_status, parse_cm_reject, parse_cm_reply};
use nvmf_proto::Sqe;
use nvmf_rdma::{Connection, Connector, EventKind, MemoryRegion, SendOp, WorkCompletion};

use super::machine::{Post, RdmaMachine, WorkDone, RECV_BIT};
use super::{cm_request, split_addr, RemoteBuffer};
use crate::command::{Completion, Xfer};
use crate::error::{Error, Result};
use crate::queue_transport::{wrong_transport, ProtocolMachine, QueueTransport};

/// A slot's data buffer and its registration.
struct DataBuffer {
    // Declared before `buf`: the registration goes before the memory it covers.
    mr: MemoryRegion,
    buf: Vec<u8>,
}

impl DataBuffer {
    fn remote(&self) -> RemoteBuffer {
        RemoteBuffer { addr: self.buf.as_ptr() as u64, len: self.buf.len(), rkey: self.mr.rkey }
    }
}

/// An NVMe/RDMA queue pair.
pub struct RdmaQueue {
    buffers: Vec<DataBuffer>,
    capsules_mr: MemoryRegion,
    responses_mr: MemoryRegion,
    /// Owns the capsule and receive areas the two regions above cover.
    machine: RdmaMachine,
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
        let mut machine = RdmaMachine::new(qid, depth, receives, in_capsule_max);
        let capsules = machine.capsule_area();
        // SAFETY: the machine never resizes its areas, and it outlives their regions (field order).
        let capsules_mr = unsafe { conn.register(capsules.as_mut_ptr(), capsules.len()) }.map_err(|e| io_err("registering capsules", e))?;
        let responses = machine.response_area();
        let responses_mr = unsafe { conn.register(responses.as_mut_ptr(), responses.len()) }.map_err(|e| io_err("registering receive buffers", e))?;
        let buffers = (0..depth).map(|_| new_buffer(&conn, buf_len)).collect::<Result<Vec<_>>>()?;
        let mut q = RdmaQueue { buffers, capsules_mr, responses_mr, machine, wc: [WorkCompletion::default(); 32], post_error: None, conn, cm };
        let receives: Vec<Post> = q.machine.initial_receives().collect();
        for post in receives {
            q.post(post)?;
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
                        if (crq as usize) < depth {
                            return Err(Error::Protocol(format!("the controller's receive queue ({crq}) is smaller than queue {qid}'s {depth} slots")));
                        }
                    }
                    tracing::debug!(qid, depth, receives = req.hrqsize, "NVMe/RDMA queue connected");
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
        if self.buffers[tag as usize].buf.len() >= len {
            return Ok(());
        }
        if self.machine.is_active(tag) {
            return Err(Error::Unsupported(format!("tag {tag}'s buffer cannot grow while its command is in flight")));
        }
        // The old registration goes before its buffer (DataBuffer's field order).
        self.buffers[tag as usize] = new_buffer(&self.conn, len)?;
        Ok(())
    }

    /// Posts what the machine asked for. A receive that cannot be posted ends the queue; a
    /// SEND's failure is kept for the next commit or poll.
    fn post(&mut self, post: Post) -> Result<()> {
        match post {
            Post::Recv { index } => {
                let p = self.machine.response_area()[index * CQE_LEN..].as_mut_ptr();
                // SAFETY: the slice lies in responses_mr, which lives as long as the connection.
                unsafe { self.conn.post_recv(RECV_BIT | index as u64, p, CQE_LEN as u32, self.responses_mr.lkey) }.map_err(|e| io_err("posting a receive", e))
            }
            Post::Send { tag, len } => {
                let p = self.machine.capsule(tag).as_mut_ptr();
                // SAFETY: the capsule lies in capsules_mr and is not touched until the SEND completes.
                if let Err(e) = unsafe { self.conn.post_send(SendOp::Send, tag as u64, true, p, len as u32, self.capsules_mr.lkey) } {
                    self.post_error.get_or_insert(io_err("posting a SEND", e));
                }
                Ok(())
            }
        }
    }

    /// Sends a command with CID `tag` (SEND of its capsule). A SEND the connection refuses is
    /// reported at the next commit or poll, its command in flight.
    pub fn submit(&mut self, tag: u16, sqe: Sqe, xfer: Xfer) -> Result<()> {
        let buf = self.buffers.get(tag as usize).ok_or_else(|| Error::Unsupported(format!("tag {tag} beyond queue depth")))?;
        let post = self.machine.submit(tag, sqe, xfer, &buf.buf, buf.remote())?;
        self.post(post)
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

    /// Feeds the machine what the CQ holds and posts the receives it hands back.
    fn reap(&mut self, done: &mut Vec<Completion>) -> Result<()> {
        loop {
            let n = self.conn.poll(&mut self.wc).map_err(|e| io_err("polling the CQ", e))?;
            for i in 0..n {
                let wc = self.wc[i];
                let wc = WorkDone { wr_id: wc.wr_id, byte_len: wc.byte_len, failed: (!wc.ok()).then(|| wc.status_name()) };
                if let Some(post) = self.machine.completed(&wc, done)? {
                    self.post(post)?;
                }
            }
            if n < self.wc.len() {
                return Ok(());
            }
        }
    }

    /// Takes over `fresh`'s connection (a new one, joined to the controller, with as many
    /// slots) and posts again every command that was in flight here. The slots keep their
    /// buffers, so data of commands that finished before the loss stays where the caller
    /// reads it; each buffer is registered anew in the fresh connection's protection domain.
    fn take_over(&mut self, mut fresh: RdmaQueue) -> Result<usize> {
        let (qid, depth) = (self.machine.qid(), self.machine.depth());
        if fresh.machine.qid() != qid || fresh.machine.depth() < depth {
            let (fq, fd) = (fresh.machine.qid(), fresh.machine.depth());
            return Err(Error::Unsupported(format!("resubmitting queue {qid} ({depth} slots) onto queue {fq} with {fd} slots")));
        }
        // The connection, the machine (its capsule and receive areas) and their regions change
        // places: `fresh` now holds the old ones, and what was in flight is taken from them.
        std::mem::swap(&mut self.conn, &mut fresh.conn);
        std::mem::swap(&mut self.cm, &mut fresh.cm);
        std::mem::swap(&mut self.machine, &mut fresh.machine);
        std::mem::swap(&mut self.capsules_mr, &mut fresh.capsules_mr);
        std::mem::swap(&mut self.responses_mr, &mut fresh.responses_mr);
        self.post_error = None;
        let in_flight = fresh.machine.take_in_flight();
        for b in &mut self.buffers {
            // SAFETY: as in new_buffer; the old registration goes at the assignment, one
            // buffer at a time, so at most one buffer's worth more is pinned.
            let mr = unsafe { self.conn.register_remote(b.buf.as_mut_ptr(), b.buf.len()) };
            // Some buffers would stay registered on the old connection: not worth retrying.
            b.mr = mr.map_err(|e| Error::Unsupported(format!("registering a data buffer again after a reconnect: {e}")))?;
        }
        let n = in_flight.len();
        for (tag, sqe, xfer) in in_flight {
            self.submit(tag, sqe, xfer)?;
        }
        Ok(n)
    }
}

impl QueueTransport for RdmaQueue {
    fn machine(&self) -> &dyn ProtocolMachine {
        &self.machine
    }

    fn buffer(&mut self, tag: u16) -> &mut [u8] {
        &mut self.buffers[tag as usize].buf
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
        (self.machine.depth(), 0)
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

fn new_buffer(conn: &Connection, len: usize) -> Result<DataBuffer> {
    let mut buf = vec![0u8; len.max(1)];
    // SAFETY: the buffer is never resized while registered and is dropped after its region.
    let mr = unsafe { conn.register_remote(buf.as_mut_ptr(), buf.len()) }.map_err(|e| io_err("registering a data buffer", e))?;
    Ok(DataBuffer { mr, buf })
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
