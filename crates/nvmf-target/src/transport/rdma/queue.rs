//! One NVMe over RDMA queue's driver: its queue pair, receive and response buffers, and the
//! memory registrations of its command data buffers. What the queue does is the sans-I/O
//! [`Machine`]'s: this file hands it the work completions and posts the verbs it returns, and
//! is driven by a reactor through [`QueueDriver`] as a TCP connection is: its completion queue
//! polled every turn the reactor does not sleep, its completion channel armed before it does.
//!
//! Work request ids say what completed: kind in the high 32 bits, slot (= receive buffer
//! index) in the low. RDMA WRITEs are unsignaled: the SEND after them on the same queue pair
//! completes after them.

use super::listener::Channel;
use super::machine::{capsule_len, Machine, Post, CQE_LEN};
use crate::backend::{AlignedBuf, IoCompletion, IoEngine};
use crate::core::{Port, Target};
use crate::stats::ReactorStats;
use crate::transport::QueueDriver;
use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};
use nvmf_rdma::{Connection, MemoryRegion, SendOp, WorkCompletion};
use std::sync::Arc;
use std::time::Instant;

const WR_RECV: u64 = 1;
const WR_RESPONSE: u64 = 2;
const WR_READ: u64 = 3;
const WR_WRITE: u64 = 4;
/// Bytes of receive buffers a queue of `depth` commands takes.
pub fn receive_memory(target: &Target, qid: u16, depth: u32) -> usize {
    capsule_len(target, qid) * depth as usize
}

fn wr_id(kind: u64, slot: u16) -> u64 {
    (kind << 32) | slot as u64
}

/// The registration of a slot's data buffer, with the address and capacity it covers: when the
/// slot's buffer is another one, the registration is dropped.
struct DataMr {
    addr: usize,
    cap: usize,
    mr: MemoryRegion,
}

pub struct RdmaQueue {
    /// Declared first: dropped before the buffers they cover (the machine's slots).
    data_mrs: Vec<Option<DataMr>>,
    pub machine: Machine,
    posts: Vec<Post>,
    recv_mr: MemoryRegion,
    recv_mem: AlignedBuf,
    rsp_mr: MemoryRegion,
    rsp_mem: AlignedBuf,
    /// The completion channel asked to report the next completion, and has not yet.
    armed: bool,
    /// Dropped after the memory regions registered on it.
    pub conn: Connection,
    /// Declared last: the event channel the connection's CM id reports on outlives it.
    _channel: Channel,
}

impl RdmaQueue {
    /// Sets up the buffers of a queue of `depth` commands and posts the receives; the caller
    /// accepts the connection after this. Until a reactor attaches it, its counters join none
    /// (`unplaced` is only what the machine is made with).
    pub fn new(
        conn: Connection,
        channel: Channel,
        target: Arc<Target>,
        port: Option<Port>,
        unplaced: Arc<ReactorStats>,
        qid: u16,
        depth: u32,
    ) -> std::io::Result<RdmaQueue> {
        let nomem = || std::io::Error::from(std::io::ErrorKind::OutOfMemory);
        let depth = u16::try_from(depth).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        let mut machine = Machine::new(target, port, unplaced, qid, depth, 0, Instant::now());
        machine.detach();
        let mut recv_mem = AlignedBuf::new();
        recv_mem.try_resize(machine.capsule_len() * depth as usize).map_err(|_| nomem())?;
        let mut rsp_mem = AlignedBuf::new();
        rsp_mem.try_resize(CQE_LEN * depth as usize).map_err(|_| nomem())?;
        // SAFETY: both buffers live in the Queue, unmoved (heap memory), and the regions are
        // dropped before them (field order).
        let recv_mr = unsafe { conn.register(recv_mem.as_mut_ptr(), recv_mem.len())? };
        let rsp_mr = unsafe { conn.register(rsp_mem.as_mut_ptr(), rsp_mem.len())? };
        let mut q = RdmaQueue {
            data_mrs: (0..depth).map(|_| None).collect(),
            machine,
            posts: Vec::new(),
            recv_mr,
            recv_mem,
            rsp_mr,
            rsp_mem,
            armed: false,
            conn,
            _channel: channel,
        };
        // The first receives: a failure here fails the setup rather than the connection later.
        q.machine.take_posts(&mut q.posts);
        for p in std::mem::take(&mut q.posts) {
            q.post(p)?;
        }
        Ok(q)
    }

    pub fn closing(&self) -> bool {
        self.machine.closing()
    }

    /// Connect is done and nothing is in flight: the acceptor may hand the queue to a reactor.
    pub fn placement(&self) -> Option<(&str, &str)> {
        self.machine.placement().filter(|_| !self.machine.closing() && self.machine.in_flight() == 0)
    }

    pub fn shut(&mut self, why: &str) {
        self.machine.shut(why);
        self.flush();
    }

    /// Handles the completions on the CQ: how many, None when it cannot be polled (the queue
    /// then shuts).
    fn poll_cq(&mut self, now: Instant) -> Option<usize> {
        let mut wcs = [WorkCompletion::default(); 32];
        let mut total = 0;
        loop {
            let n = match self.conn.poll(&mut wcs) {
                Ok(n) => n,
                Err(e) => {
                    self.shut(&format!("polling the CQ failed: {e}"));
                    return None;
                }
            };
            for wc in &wcs[..n] {
                self.completion(wc, now);
            }
            total += n;
            if n > 0 {
                self.machine.serve_waiting();
                self.flush();
            }
            if n < wcs.len() {
                return Some(total);
            }
        }
    }

    fn completion(&mut self, wc: &WorkCompletion, now: Instant) {
        let (kind, slot) = (wc.wr_id >> 32, (wc.wr_id & 0xFFFF) as u16);
        if !wc.ok() {
            return self.machine.failed(&wc.status_name());
        }
        match kind {
            WR_RECV => {
                let cl = self.machine.capsule_len();
                let at = slot as usize * cl;
                let len = (wc.byte_len as usize).min(cl);
                let Some(capsule) = self.recv_mem.as_slice().get(at..at + len) else { return };
                self.machine.received(slot, capsule, now);
            }
            WR_READ => self.machine.read_done(slot, now),
            WR_RESPONSE => self.machine.sent(slot),
            _ => {}
        }
    }


    /// Posts what the machine asked for; a verb that cannot be posted ends the queue.
    fn flush(&mut self) {
        self.forget_stale_registrations();
        // Bounded: a failure shuts the machine, which asks for one Disconnect and then nothing.
        for _ in 0..2 {
            self.machine.take_posts(&mut self.posts);
            if self.posts.is_empty() {
                return;
            }
            let mut failure = None;
            for p in std::mem::take(&mut self.posts) {
                if let Err(e) = self.post(p) {
                    failure.get_or_insert(format!("posting {p:?} failed: {e}"));
                }
            }
            match failure {
                Some(why) => self.machine.shut(&why),
                None => return,
            }
        }
    }

    /// Drops the registrations of buffers a slot no longer has (freed, or moved to another slot),
    /// so freed memory is not kept pinned.
    fn forget_stale_registrations(&mut self) {
        for (slot, mr) in self.data_mrs.iter_mut().enumerate() {
            let Some(m) = mr else { continue };
            // Read through as_slice: as_mut_ptr would forget that the buffer is known zero.
            let current = self.machine.buffer(slot as u16).map(|b| (b.as_slice().as_ptr() as usize, b.capacity()));
            if current != Some((m.addr, m.cap)) {
                *mr = None;
            }
        }
    }

    /// The address and local key of slot `slot`'s data buffer, `len` bytes of which a verb moves;
    /// registered on first use.
    fn data_buffer(&mut self, slot: u16, len: u32) -> std::io::Result<(*mut u8, u32)> {
        let invalid = || std::io::Error::from(std::io::ErrorKind::InvalidInput);
        let buf = self.machine.buffer(slot).ok_or_else(invalid)?;
        if len as usize > buf.len() || len == 0 {
            return Err(invalid());
        }
        let (addr, cap) = (buf.as_mut_ptr(), buf.capacity());
        let entry = self.data_mrs.get_mut(slot as usize).ok_or_else(invalid)?;
        if let Some(m) = entry.as_ref().filter(|m| (m.addr, m.cap) == (addr as usize, cap)) {
            return Ok((addr, m.mr.lkey));
        }
        // SAFETY: the buffer does not move or shrink while its slot is busy, and a registration
        // is dropped (forget_stale_registrations, field order) once the slot's buffer changes.
        let mr = unsafe { self.conn.register(addr, cap)? };
        let lkey = mr.lkey;
        *entry = Some(DataMr { addr: addr as usize, cap, mr });
        Ok((addr, lkey))
    }

    fn post(&mut self, p: Post) -> std::io::Result<()> {
        match p {
            Post::Recv(slot) => {
                let cl = self.machine.capsule_len();
                let at = slot as usize * cl;
                if at + cl > self.recv_mem.len() {
                    return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
                }
                // SAFETY: the range lies in recv_mem, registered as recv_mr, alive while the QP is.
                unsafe {
                    let ptr = self.recv_mem.as_mut_ptr().add(at);
                    self.conn.post_recv(wr_id(WR_RECV, slot), ptr, cl as u32, self.recv_mr.lkey)
                }
            }
            Post::Read { slot, len, addr, key } => {
                let (ptr, lkey) = self.data_buffer(slot, len)?;
                // SAFETY: the buffer (len bytes, registered) stays in the slot until the READ completes.
                unsafe { self.conn.post_send(SendOp::Read(addr, key), wr_id(WR_READ, slot), true, ptr, len, lkey) }
            }
            Post::Write { slot, len, addr, key } => {
                let (ptr, lkey) = self.data_buffer(slot, len)?;
                // SAFETY: the buffer stays in the slot until the response SEND after it completes.
                unsafe { self.conn.post_send(SendOp::Write(addr, key), wr_id(WR_WRITE, slot), false, ptr, len, lkey) }
            }
            Post::Send { slot, cqe, invalidate } => {
                let at = slot as usize * CQE_LEN;
                let Some(rsp) = self.rsp_mem.as_mut_slice().get_mut(at..at + CQE_LEN) else {
                    return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
                };
                rsp.copy_from_slice(&cqe);
                let op = invalidate.map_or(SendOp::Send, SendOp::SendInvalidate);
                // SAFETY: the 16 bytes lie in rsp_mem (registered), reused only after this SEND completes.
                unsafe {
                    let ptr = self.rsp_mem.as_mut_ptr().add(at);
                    self.conn.post_send(op, wr_id(WR_RESPONSE, slot), true, ptr, CQE_LEN as u32, self.rsp_mr.lkey)
                }
            }
            Post::Disconnect => self.conn.disconnect(),
        }
    }
}

impl QueueDriver for RdmaQueue {
    fn register(&mut self, registry: &Registry, token: Token) -> std::io::Result<()> {
        registry.register(&mut SourceFd(&self.conn.completion_fd()), token, Interest::READABLE)
    }

    fn attach(&mut self, token: u32, stats: &Arc<ReactorStats>, _: Instant) {
        self.machine.attach(token, stats.clone());
        // Whatever the acceptor armed, this reactor arms before it first sleeps.
        self.armed = false;
    }

    #[inline]
    fn ready(&mut self, _: &mio::event::Event, now: Instant) {
        // The completion channel reported: the next sleep must arm it again.
        self.armed = false;
        self.poll_cq(now);
    }

    #[inline]
    fn poll_input(&mut self, now: Instant) -> Option<usize> {
        self.poll_cq(now)
    }

    #[inline]
    fn polls_without_syscall(&self) -> bool {
        true
    }

    #[inline]
    fn process(&mut self, _: Instant) {}

    #[inline]
    fn submit(&mut self, engine: &mut IoEngine) {
        self.machine.submit(engine);
    }

    #[inline]
    fn complete_io(&mut self, c: IoCompletion) {
        self.machine.io_done(c);
        self.flush();
    }

    #[inline]
    fn service(&mut self, now: Instant, tick: bool) {
        if tick {
            // Keep-alive, Connect and authentication timeouts, asynchronous events, and commands
            // waiting for memory another queue may have freed.
            self.machine.tick(now);
            self.machine.serve_waiting();
            self.flush();
        }
    }

    /// Consumes the channel's events and asks for the next completion, then takes what came
    /// before it asked (that would wake no one).
    fn arm(&mut self, now: Instant) -> bool {
        if !self.armed {
            if let Err(e) = self.conn.rearm() {
                self.shut(&format!("arming the CQ failed: {e}"));
                return true;
            }
            self.armed = true;
        }
        self.poll_cq(now).is_none_or(|n| n > 0)
    }

    fn should_close(&self) -> bool {
        self.machine.closing()
    }

    fn teardown(&mut self, registry: &Registry) {
        let _ = registry.deregister(&mut SourceFd(&self.conn.completion_fd()));
        self.shut("target stopping");
    }

    fn in_flight(&self) -> usize {
        self.machine.in_flight()
    }
}
