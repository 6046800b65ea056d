//! Reactor threads: each owns its queues, of every transport, for their whole life (no locks on
//! the data path), polls their fds with mio (TCP sockets; RDMA completion channels in event
//! mode, completion queues directly while polling), batches socket reads and writes, and reaps
//! its own io_uring. The acceptors (TCP: `acceptor`; RDMA CM: `rdma_acceptor`) take new queues
//! through Connect, then hand each to the reactor the placement policy picks (subsystem and
//! host NQN are known only after Connect).
//!
//! Here: the reactor loop, written once against [`QueueDriver`], and the hand-off; `tcp` (the
//! TCP queue's driver and the socket reads and writes the acceptor shares), `queues` (the queue
//! of either transport), `placement`, `sockopts` (options every accepted socket gets) and
//! `drive` (driving without a socket, for tests and fuzzers) beside it.

mod acceptor;
mod drive;
mod placement;
mod queues;
#[cfg(feature = "rdma")]
mod rdma_acceptor;
mod sockopts;
mod tcp;

pub use acceptor::Acceptor;
pub use queues::AnyQueue;
#[cfg(feature = "rdma")]
pub use rdma_acceptor::RdmaAcceptor;
pub use tcp::TcpQueue;
pub use drive::{drive, drive_and_take_output, submit};
pub use placement::Placement;
pub use sockopts::{apply_socket_options, set_congestion_control, SocketOptions};

use crate::backend::{IoCompletion, IoEngine};
use crate::config::ReactorMode;
use crate::core::Target;
use crate::stats::ReactorStats;
use crate::transport::QueueDriver;
use mio::{Events, Interest, Poll, Token, Waker};
use std::io::ErrorKind;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

const WAKER: Token = Token(usize::MAX - 1);
const RING: Token = Token(usize::MAX - 2);
/// How often idle connections check keep-alive and connect timeouts.
const TICK: Duration = Duration::from_millis(20);
/// Longest sleep in event mode (bounds keep-alive detection latency and shutdown).
const MAX_SLEEP: Duration = Duration::from_millis(100);
const IO_RING_ENTRIES: u32 = 1024;
/// A polling reactor with at most this many connections reads each of them every turn instead
/// of asking epoll which are readable, as a busy-polling ping-pong does: an I/O then costs one
/// receive syscall instead of an epoll_wait and a receive. With more connections it asks epoll,
/// so idle connections cost nothing per turn.
const DIRECT_POLL_MAX: usize = 4;
/// While reading directly, epoll is still drained this often (its edge events are not needed,
/// but they should not pile up).
const DIRECT_POLL_EPOLL_EVERY: u32 = 256;

/// Pins the calling thread to `core`; a warning (not an error) when the kernel refuses.
fn pin_to_core(core: usize) {
    // SAFETY: cpu_set_t is plain data; CPU_SET bounds-checks against its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if core >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
            tracing::warn!(core, "core number too large to pin; reactor runs unpinned");
            return;
        }
        libc::CPU_SET(core, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            tracing::warn!(core, "cannot pin reactor: {}; it runs unpinned", std::io::Error::last_os_error());
        }
    }
}

/// What an acceptor sends a reactor: a queue past Connect, or a CM event for an RDMA queue it
/// may own (the RDMA acceptor reads every queue's CM events and tells every reactor).
#[allow(clippy::large_enum_variant)] // sent once per queue
pub enum Handoff {
    Queue(AnyQueue, ConnectionPermit),
    #[cfg(feature = "rdma")]
    RdmaDisconnected(nvmf_rdma::CmId),
}

/// One of `max_connections`: taken at accept, given back when the connection is dropped
/// (wherever that happens: acceptor, reactor, or a reactor that shut down).
pub struct ConnectionPermit(Arc<Target>);

impl ConnectionPermit {
    /// None when `max_connections` are open.
    pub fn take(target: &Arc<Target>) -> Option<ConnectionPermit> {
        let max = target.settings.max_connections as usize;
        let taken = target.connections.fetch_update(Relaxed, Relaxed, |n| (n < max).then_some(n + 1));
        taken.is_ok().then(|| ConnectionPermit(target.clone()))
    }
}

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Relaxed);
    }
}

/// The acceptor's handle on one reactor.
#[derive(Clone)]
pub struct ReactorHandle {
    pub tx: Sender<Handoff>,
    pub waker: Arc<Waker>,
}

impl ReactorHandle {
    /// Sends `h` and wakes the reactor; false when it has stopped.
    pub fn send(&self, h: Handoff) -> bool {
        let sent = self.tx.send(h).is_ok();
        if sent {
            let _ = self.waker.wake();
        }
        sent
    }
}


struct Entry {
    queue: AnyQueue,
    /// Connection ended; kept only until the backend finishes with the queue's buffers.
    gone: bool,
    _permit: ConnectionPermit,
}

pub struct Reactor {
    pub stats: Arc<ReactorStats>,
    mode: ReactorMode,
    idle_poll: Duration,
    core: usize,
    rx: Receiver<Handoff>,
    poll: Poll,
    stop: Arc<AtomicBool>,
}

impl Reactor {
    pub fn new(
        index: usize,
        core: usize,
        mode: ReactorMode,
        idle_poll_us: u64,
        stop: Arc<AtomicBool>,
    ) -> std::io::Result<(Reactor, ReactorHandle)> {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let (tx, rx) = std::sync::mpsc::channel();
        let stats = Arc::new(ReactorStats::new(index, core, mode, idle_poll_us));
        let reactor = Reactor { stats, mode, idle_poll: Duration::from_micros(idle_poll_us), core, rx, poll, stop };
        Ok((reactor, ReactorHandle { tx, waker }))
    }

    pub fn run(mut self) {
        pin_to_core(self.core);
        let mut engine = IoEngine::new(IO_RING_ENTRIES);
        if let Some(fd) = engine.ring_fd() {
            let _ = self.poll.registry().register(&mut mio::unix::SourceFd(&fd), RING, Interest::READABLE);
        }
        let mut conns: Vec<Option<Entry>> = Vec::new();
        let mut free: Vec<usize> = Vec::new();
        // Queues whose input is taken every turn the reactor does not sleep (RDMA completion
        // queues), and which are armed before it sleeps.
        let mut polled = 0usize;
        let mut events = Events::with_capacity(1024);
        let mut done: Vec<IoCompletion> = Vec::with_capacity(1024);
        let mut touched: Vec<usize> = Vec::with_capacity(1024);
        let mut last_work = Instant::now();
        let mut last_tick = last_work;
        // One clock read per turn while polling (reading the clock was 16 % of a polling
        // reactor's time in a 4 KiB QD32 profile): a turn starts when the last one ended.
        let mut turn_end = last_work;
        let mut turn: u32 = 0;
        while !self.stop.load(Relaxed) {
            let loop_start = turn_end;
            turn = turn.wrapping_add(1);
            touched.clear();
            let direct = self.mode == ReactorMode::Poll && conns.len() - free.len() <= DIRECT_POLL_MAX;
            let mut timeout = match self.mode {
                _ if engine.has_completions() => Some(Duration::ZERO),
                ReactorMode::Poll => Some(Duration::ZERO),
                ReactorMode::Event if loop_start.duration_since(last_work) < self.idle_poll => Some(Duration::ZERO),
                ReactorMode::Event => Some(MAX_SLEEP),
            };
            // About to sleep: queues that must ask for a wake-up do, and input that came before
            // they asked is taken now instead.
            let mut armed_input = false;
            if timeout != Some(Duration::ZERO) && polled > 0 {
                for (idx, slot) in conns.iter_mut().enumerate() {
                    if let Some(e) = slot.as_mut().filter(|e| !e.gone) {
                        if e.queue.arm(loop_start) {
                            armed_input = true;
                            touched.push(idx);
                        }
                    }
                }
                if armed_input {
                    timeout = Some(Duration::ZERO);
                }
            }
            if direct && turn % DIRECT_POLL_EPOLL_EVERY != 0 {
                events.clear();
            } else if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != ErrorKind::Interrupted {
                    tracing::error!("reactor {} poll failed: {e}", self.stats.index);
                }
            }
            let slept = timeout != Some(Duration::ZERO);
            let now = if slept { Instant::now() } else { loop_start };
            if slept {
                self.stats.idle_ns.add(now.duration_since(loop_start).as_nanos() as u64);
                self.stats.wakeups.add(1);
            }
            let work_start = now;
            let mut worked = !events.is_empty() || armed_input;

            while let Ok(h) = self.rx.try_recv() {
                worked = true;
                let (mut queue, permit) = match h {
                    Handoff::Queue(q, permit) => (q, permit),
                    #[cfg(feature = "rdma")]
                    Handoff::RdmaDisconnected(id) => {
                        if let Some(idx) = conns.iter_mut().position(|s| s.as_mut().is_some_and(|e| e.queue.rdma_disconnected(id))) {
                            touched.push(idx);
                        }
                        continue;
                    }
                };
                let idx = free.pop().unwrap_or_else(|| {
                    conns.push(None);
                    conns.len() - 1
                });
                if let Err(e) = queue.register(self.poll.registry(), Token(idx)) {
                    tracing::error!("cannot register connection: {e}");
                    free.push(idx);
                    continue;
                }
                queue.attach(idx as u32, &self.stats, now);
                polled += queue.polls_without_syscall() as usize;
                conns[idx] = Some(Entry { queue, gone: false, _permit: permit });
                touched.push(idx);
            }

            for ev in events.iter() {
                let idx = ev.token().0;
                if ev.token() == WAKER || ev.token() == RING {
                    continue;
                }
                let Some(Some(e)) = conns.get_mut(idx) else { continue };
                if e.gone {
                    continue;
                }
                e.queue.ready(ev, now);
                touched.push(idx);
            }
            if direct || polled > 0 {
                for (idx, slot) in conns.iter_mut().enumerate() {
                    let Some(e) = slot else { continue };
                    if e.gone || !(direct || e.queue.polls_without_syscall()) {
                        continue;
                    }
                    match e.queue.poll_input(now) {
                        None => {}
                        Some(0) => continue,
                        Some(_) => worked = true,
                    }
                    touched.push(idx);
                }
            }

            for &idx in &touched {
                if let Some(Some(e)) = conns.get_mut(idx) {
                    if !e.gone {
                        e.queue.process(now);
                    }
                    e.queue.submit(&mut engine);
                }
            }
            engine.flush();
            engine.reap(&mut done);
            for c in done.drain(..) {
                let idx = (c.tag >> 32) as usize;
                if let Some(Some(e)) = conns.get_mut(idx) {
                    e.queue.complete_io(c);
                }
                worked = true;
            }

            let tick = now.duration_since(last_tick) >= TICK;
            if tick {
                last_tick = now;
            }
            for (idx, slot) in conns.iter_mut().enumerate() {
                let Some(e) = slot else { continue };
                if !e.gone {
                    e.queue.service(now, tick);
                }
                e.queue.submit(&mut engine);
                if !e.gone && e.queue.should_close() {
                    e.queue.teardown(self.poll.registry());
                    e.gone = true;
                }
                if e.gone && e.queue.in_flight() == 0 {
                    polled -= e.queue.polls_without_syscall() as usize;
                    *slot = None;
                    free.push(idx);
                }
            }
            engine.flush();

            turn_end = Instant::now();
            if worked {
                last_work = turn_end;
                self.stats.busy_ns.add(turn_end.duration_since(work_start).as_nanos() as u64);
            } else if !slept {
                self.stats.idle_ns.add(turn_end.duration_since(loop_start).as_nanos() as u64);
            }
        }
        // Shutdown: end every connection, then let the backend finish with every buffer.
        for e in conns.iter_mut().flatten() {
            if !e.gone {
                e.queue.teardown(self.poll.registry());
            }
        }
        while engine.in_flight() > 0 {
            engine.wait_one();
            engine.reap(&mut done);
            for c in done.drain(..) {
                if let Some(Some(e)) = conns.get_mut((c.tag >> 32) as usize) {
                    e.queue.complete_io(c);
                    e.queue.submit(&mut engine);
                }
            }
        }
    }
}
