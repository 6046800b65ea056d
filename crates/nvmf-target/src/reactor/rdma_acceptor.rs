//! The RDMA CM acceptor thread: the NVMe/RDMA counterpart of `acceptor.rs`. It reads every RDMA
//! port's CM events, accepts connect requests (within `max_connections`, as TCP connections
//! are), drives each new queue through Connect, then hands it to the reactor the placement
//! policy picks. A queue's later CM events (the host disconnected) arrive here too, and go to
//! every reactor: the one that serves the queue shuts it. It sleeps in poll(2) on the CM
//! channels and the new queues' completion channels.

use super::{AnyQueue, ConnectionPermit, Handoff, Placement, ReactorHandle, MAX_SLEEP};
use crate::backend::{IoCompletion, IoEngine};
use crate::config::ReactorMode;
use crate::core::Target;
use crate::stats::ReactorStats;
use crate::transport::rdma::{RdmaListener, RdmaQueue};
use crate::transport::QueueDriver;
use nvmf_rdma::EventKind;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often new queues check their Connect timeout.
const TICK: Duration = Duration::from_millis(100);

pub struct RdmaAcceptor {
    target: Arc<Target>,
    listeners: Vec<RdmaListener>,
    reactors: Vec<ReactorHandle>,
    placement: Arc<Placement>,
    stop: Arc<AtomicBool>,
    /// Queues before Connect, with their place among `max_connections`.
    pending: Vec<(RdmaQueue, ConnectionPermit)>,
    /// What a queue's machine is made with; no queue's counters join it (they join their
    /// reactor's at hand-off).
    unplaced: Arc<ReactorStats>,
}

impl crate::transport::Accept for RdmaAcceptor {
    const THREAD: &'static str = "nvmf-rdma-cm";

    fn run(self) {
        RdmaAcceptor::run(self)
    }
}

impl RdmaAcceptor {
    pub fn new(target: Arc<Target>, listeners: Vec<RdmaListener>, reactors: Vec<ReactorHandle>, placement: Arc<Placement>, stop: Arc<AtomicBool>) -> RdmaAcceptor {
        let unplaced = Arc::new(ReactorStats::new(usize::MAX, 0, ReactorMode::Event, 0));
        RdmaAcceptor { target, listeners, reactors, placement, stop, pending: Vec::new(), unplaced }
    }

    pub fn run(mut self) {
        // Backend requests of queues before Connect: none are expected (only Connect is served
        // then), but a queue is handed off only with none in flight.
        let mut engine = IoEngine::new(16);
        let mut done = Vec::<IoCompletion>::new();
        let mut last_tick = Instant::now();
        while !self.stop.load(Relaxed) {
            if !engine.has_completions() {
                self.sleep();
            }
            let now = Instant::now();
            for i in 0..self.listeners.len() {
                self.cm_events(i, now);
            }
            let tick = now.duration_since(last_tick) >= TICK;
            if tick {
                last_tick = now;
            }
            for (q, _) in &mut self.pending {
                q.poll_input(now);
                q.service(now, tick);
                q.submit(&mut engine);
            }
            engine.flush();
            engine.reap(&mut done);
            for c in done.drain(..) {
                // Tags name no queue before hand-off (every machine has token 0): at most one
                // pending queue can have requests, so finding it by in_flight is exact enough.
                if let Some((q, _)) = self.pending.iter_mut().find(|(q, _)| q.in_flight() > 0) {
                    q.complete_io(c);
                }
            }
            self.hand_off();
        }
        // Buffers must outlive the backend requests that point into them.
        for (q, _) in &mut self.pending {
            q.shut("target stopping");
        }
        while engine.in_flight() > 0 {
            engine.wait_one();
            engine.reap(&mut done);
            done.clear();
        }
    }

    /// Waits for a CM event or a new queue's completion, at most [`MAX_SLEEP`].
    fn sleep(&mut self) {
        let mut fds: Vec<libc::pollfd> = self.listeners.iter().map(|l| libc::pollfd { fd: l.fd(), events: libc::POLLIN, revents: 0 }).collect();
        for (q, _) in &mut self.pending {
            if q.arm(Instant::now()) {
                return; // input came before it was armed: no sleep
            }
            fds.push(libc::pollfd { fd: q.conn.completion_fd(), events: libc::POLLIN, revents: 0 });
        }
        // SAFETY: fds is a valid array of fds.len() entries.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, MAX_SLEEP.as_millis() as i32) };
    }

    fn cm_events(&mut self, i: usize, now: Instant) {
        // Bounded: a flood of connect requests waits for the next turn after this many.
        for _ in 0..256 {
            let ev = match self.listeners[i].next_event() {
                Ok(Some(ev)) => ev,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!("reading RDMA CM events failed: {e}");
                    return;
                }
            };
            match ev.kind {
                EventKind::ConnectRequest => {
                    let Some(permit) = ConnectionPermit::take(&self.target) else {
                        tracing::warn!(max = self.target.settings.max_connections, "refusing an RDMA connect request: connection limit reached");
                        self.listeners[i].refuse(ev);
                        continue;
                    };
                    if let Some(mut q) = self.listeners[i].accept(ev, &self.target, &self.unplaced) {
                        q.poll_input(now);
                        self.pending.push((q, permit));
                    }
                }
                EventKind::Established => tracing::debug!("RDMA connection established"),
                kind => {
                    if kind != EventKind::Disconnected {
                        tracing::info!(event = %ev.name(), status = ev.status, "RDMA CM event");
                    }
                    match self.pending.iter_mut().find(|(q, _)| q.conn.cm_id() == ev.id) {
                        Some((q, _)) => q.shut("host disconnected"),
                        None => {
                            for r in &self.reactors {
                                r.send(Handoff::RdmaDisconnected(ev.id));
                            }
                        }
                    }
                }
            }
        }
    }

    /// Hands each queue past Connect to its reactor; drops those that closed before.
    fn hand_off(&mut self) {
        let mut i = 0;
        while i < self.pending.len() {
            let q = &self.pending[i].0;
            if q.closing() && q.in_flight() == 0 {
                self.pending.swap_remove(i);
                continue;
            }
            let Some((subnqn, hostnqn)) = q.placement() else {
                i += 1;
                continue;
            };
            let r = self.placement.pick(subnqn, hostnqn);
            let (q, permit) = self.pending.swap_remove(i);
            self.reactors[r].send(Handoff::Queue(AnyQueue::Rdma(Box::new(q)), permit));
        }
    }
}
