//! The NVMe/RDMA listener thread: one per RDMA port. It takes RDMA CM events (connect requests
//! with the NVMe-oF private data, established, disconnected), owns every queue accepted on
//! the port, polls their completion queues and submits their backend requests through its own
//! io_uring engine. It sleeps in poll(2) on the CM channel, each queue's completion channel and
//! the ring.

use super::queue::{receive_memory, Queue, WAIT_RETRY};
use super::{cm_reject, cm_reply, cm_status, CmRequest};
use crate::transport::BUFFER_BUDGET;
use crate::backend::{IoCompletion, IoEngine};
use crate::core::{Port, Target};
use crate::stats::ReactorStats;
use nvmf_rdma::{Connection, EventKind, Listener};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Longest sleep: timeouts (keep-alive, Connect) and the stop flag are checked at least this often.
const TICK: Duration = Duration::from_millis(100);
const BACKLOG: i32 = 128;

pub struct RdmaListenerHandle {
    pub addr: SocketAddr,
    pub thread: JoinHandle<()>,
}

/// Binds `port.addr` on an RDMA device and starts its thread. Fails where no RDMA device serves
/// the address (ENODEV, EADDRNOTAVAIL) or no RDMA CM exists. The thread's time and its queues'
/// counters go to `stats` (`/stats` lists it among the reactors).
pub fn spawn(target: Arc<Target>, port: Port, stats: Arc<ReactorStats>, stop: Arc<AtomicBool>) -> std::io::Result<RdmaListenerHandle> {
    let listener = Listener::bind(&port.addr.ip().to_string(), port.addr.port(), BACKLOG)?;
    let addr = SocketAddr::new(port.addr.ip(), listener.port());
    let port = Port { addr, ..port };
    let thread = std::thread::Builder::new()
        .name(format!("nvmf-rdma-{}", addr.port()))
        .spawn(move || Loop { target, port, listener, queues: Vec::new(), engine: IoEngine::new(256), stats, stop }.run())?;
    Ok(RdmaListenerHandle { addr, thread })
}

struct Loop {
    target: Arc<Target>,
    port: Port,
    listener: Listener,
    /// Indexed by token (the high half of backend request tags).
    queues: Vec<Option<Queue>>,
    engine: IoEngine,
    stats: Arc<ReactorStats>,
    stop: Arc<AtomicBool>,
}

impl Loop {
    fn run(mut self) {
        tracing::info!(addr = %self.port.addr, "NVMe/RDMA listening");
        let mut done = Vec::<IoCompletion>::new();
        let mut last_tick = Instant::now();
        while !self.stop.load(Relaxed) {
            let now = Instant::now();
            self.cm_events();
            for q in self.queues.iter_mut().flatten() {
                if let Err(e) = q.conn.rearm() {
                    q.shut(&format!("arming the CQ failed: {e}"));
                }
                q.poll(&mut self.engine, now);
            }
            self.engine.flush();
            self.engine.reap(&mut done);
            for c in done.drain(..) {
                if let Some(Some(q)) = self.queues.get_mut((c.tag >> 32) as usize) {
                    q.io_done(c);
                }
            }
            if now.duration_since(last_tick) >= TICK {
                last_tick = now;
                for q in self.queues.iter_mut().flatten() {
                    q.tick(now);
                }
            }
            self.reap_closed();
            let slept = Instant::now();
            self.stats.busy_ns.add(slept.duration_since(now).as_nanos() as u64);
            if self.sleep() {
                self.stats.idle_ns.add(slept.elapsed().as_nanos() as u64);
                self.stats.wakeups.add(1);
            }
        }
        for q in self.queues.iter_mut().flatten() {
            q.shut("target stopping");
        }
        // Buffers must outlive the backend requests that point into them.
        while self.queues.iter().flatten().any(|q| q.in_flight() > 0) {
            self.engine.wait_one();
            self.engine.reap(&mut done);
            for c in done.drain(..) {
                if let Some(Some(q)) = self.queues.get_mut((c.tag >> 32) as usize) {
                    q.io_done(c);
                }
            }
        }
        // Before the listener: the queues' CM ids report on its event channel.
        self.queues.clear();
    }

    /// Waits for a CM event, a completion or a backend completion, at most one tick
    /// ([`WAIT_RETRY`] while a command waits for buffer memory); false when backend completions
    /// are there already and it did not sleep.
    fn sleep(&mut self) -> bool {
        if self.engine.has_completions() {
            return false;
        }
        let mut fds = vec![libc::pollfd { fd: self.listener.fd(), events: libc::POLLIN, revents: 0 }];
        fds.extend(self.queues.iter().flatten().map(|q| libc::pollfd { fd: q.conn.completion_fd(), events: libc::POLLIN, revents: 0 }));
        if let Some(fd) = self.engine.ring_fd().filter(|_| self.engine.in_flight() > 0) {
            fds.push(libc::pollfd { fd, events: libc::POLLIN, revents: 0 });
        }
        // A command waiting for buffer memory that another thread frees has nothing to wake it.
        let wait = if self.queues.iter().flatten().any(|q| q.is_waiting()) { WAIT_RETRY } else { TICK };
        // SAFETY: fds is a valid array of fds.len() entries.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait.as_millis() as i32) };
        true
    }

    fn cm_events(&mut self) {
        loop {
            let ev = match self.listener.next_event() {
                Ok(Some(ev)) => ev,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!("reading RDMA CM events failed: {e}");
                    return;
                }
            };
            match ev.kind {
                EventKind::ConnectRequest => self.connect_request(ev),
                EventKind::Established => tracing::debug!("RDMA connection established"),
                EventKind::Disconnected => {
                    if let Some(q) = self.queues.iter_mut().flatten().find(|q| q.conn.cm_id() == ev.id) {
                        q.shut("host disconnected");
                    }
                }
                EventKind::Rejected | EventKind::Other(_) => {
                    tracing::info!(event = %ev.name(), status = ev.status, "RDMA CM event");
                    if let Some(q) = self.queues.iter_mut().flatten().find(|q| q.conn.cm_id() == ev.id) {
                        q.shut(&ev.name());
                    }
                }
            }
        }
    }

    /// A host asks to connect: check its private data, set up the queue, accept.
    fn connect_request(&mut self, ev: nvmf_rdma::Event) {
        let req = match CmRequest::parse(&ev.private_data) {
            Ok(r) => r,
            Err(status) => {
                tracing::warn!(status, len = ev.private_data.len(), "refusing an RDMA connect request");
                let _ = ev.id.reject(&cm_reject(status));
                return;
            }
        };
        let depth = req.depth();
        // Receive buffers are taken at accept, for the whole queue: bounded like a TCP
        // connection's command buffers, and connections count against max_connections.
        let live = self.queues.iter().flatten().count();
        let memory = receive_memory(&self.target, req.qid, depth);
        if live >= self.target.settings.max_connections as usize || memory > BUFFER_BUDGET {
            tracing::warn!(qid = req.qid, depth, memory, live, "refusing an RDMA connect request: no resources");
            let _ = ev.id.reject(&cm_reject(cm_status::NO_RESOURCES));
            return;
        }
        // Per command at most an RDMA WRITE and a SEND, or an RDMA READ, are outstanding.
        let conn = match Connection::create(ev.id, 2 * depth + 1, depth) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(qid = req.qid, depth, "cannot create an RDMA queue pair: {e}");
                return;
            }
        };
        let token = self.queues.iter().position(Option::is_none).unwrap_or(self.queues.len());
        let queue = Queue::new(conn, self.target.clone(), Some(self.port.clone()), self.stats.clone(), req.qid, depth, token as u32);
        let queue = match queue {
            Ok(q) => q,
            Err(e) => {
                // The connection (and its id) is gone with the error: the host's connect fails.
                tracing::warn!(qid = req.qid, depth, "cannot set up an RDMA queue: {e}");
                return;
            }
        };
        if let Err(e) = queue.conn.accept(&cm_reply(depth as u16), ev.responder_resources, ev.initiator_depth) {
            tracing::warn!(qid = req.qid, "accepting an RDMA connection failed: {e}");
            return;
        }
        tracing::debug!(qid = req.qid, hrqsize = req.hrqsize, hsqsize = req.hsqsize, "RDMA connection accepted");
        if token == self.queues.len() {
            self.queues.push(Some(queue));
        } else {
            self.queues[token] = Some(queue);
        }
    }

    /// Frees queues that are closed and have no backend request left.
    fn reap_closed(&mut self) {
        for q in self.queues.iter_mut() {
            if q.as_ref().is_some_and(|q| q.closing() && q.in_flight() == 0) {
                *q = None;
            }
        }
    }
}
