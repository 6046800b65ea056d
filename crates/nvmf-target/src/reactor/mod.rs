//! Reactor threads: each owns its connections for their whole life (no locks on the data path),
//! polls their sockets with mio, batches socket reads and writes, and reaps its own io_uring.
//! The acceptor thread takes new connections through ICReq and Connect, then hands each to the
//! reactor the placement policy picks (subsystem and host NQN are known only after Connect).
//!
//! Here: the reactor loop and what it shares with the acceptor (socket reads and writes, the
//! hand-off); `acceptor`, `placement`, `sockopts` (options every accepted socket gets) and
//! `drive` (the same driving without a socket, for tests and fuzzers) beside it.

mod acceptor;
mod drive;
mod placement;
mod sockopts;

pub use acceptor::Acceptor;
pub use drive::{drive, drive_and_take_output, submit};
pub use placement::Placement;
pub use sockopts::{apply_socket_options, set_congestion_control, SocketOptions};

use crate::backend::{IoCompletion, IoEngine};
use crate::config::ReactorMode;
use crate::core::Target;
use crate::stats::ReactorStats;
use crate::transport::tcp::Connection;
use crate::wire::Wire;
use mio::{Events, Interest, Poll, Token, Waker};
use std::io::{ErrorKind, IoSlice, IoSliceMut, Read, Write};
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

/// A connection moving from the acceptor to a reactor.
pub struct Handoff {
    pub stream: Wire,
    pub conn: Connection,
    pub permit: ConnectionPermit,
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
pub struct ReactorHandle {
    pub tx: Sender<Handoff>,
    pub waker: Arc<Waker>,
}


struct Entry {
    stream: Wire,
    conn: Connection,
    /// Socket closed; kept only until the backend finishes with the connection's buffers.
    gone: bool,
    _permit: ConnectionPermit,
}

/// Reads all available bytes: how many, or None when the peer closed or the socket failed.
///
/// Readiness is edge-triggered, so the socket must be read until it would block. Each read is
/// vectored: a large payload whose header is in lands straight in its command buffer, the
/// bytes after it in the receive buffer. After a read that filled all it was given, the PDUs
/// in are processed: that makes room, and tells where the next payload goes. Only if that
/// frees nothing (output backpressure, or a connection that is not attached yet) does reading
/// stop; the reactor reads again once output drains.
fn read_all(stream: &mut Wire, conn: &mut Connection, now: Instant) -> Option<usize> {
    let mut total = 0;
    loop {
        if !conn.wants().read {
            return Some(total); // backpressure: resume once output drains
        }
        let result = {
            let mut iov: [IoSliceMut; 4] = std::array::from_fn(|_| IoSliceMut::new(&mut []));
            let n = conn.recv_slices(&mut iov);
            let want: usize = iov[..n].iter().map(|s| s.len()).sum();
            (want > 0).then(|| (stream.read_vectored(&mut iov[..n]), want))
        };
        let Some((read, want)) = result else {
            conn.process(now);
            let mut probe: [IoSliceMut; 4] = std::array::from_fn(|_| IoSliceMut::new(&mut []));
            if conn.recv_slices(&mut probe) == 0 {
                return Some(total);
            }
            continue;
        };
        match read {
            Ok(0) => return None,
            Ok(n) => {
                conn.recv_commit(n);
                total += n;
                if n < want {
                    return Some(total);
                }
                conn.process(now);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Some(total),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return None,
        }
    }
}

/// Writes as much queued output as the socket takes, many PDUs per syscall: one vectored
/// write gathers headers and responses with read data straight from the command buffers.
fn write_all(stream: &mut Wire, conn: &mut Connection) -> bool {
    match stream.flush_pending() {
        Ok(true) => {}
        Ok(false) => return true,
        Err(_) => return false,
    }
    while conn.output_len() > 0 {
        let written = {
            let mut iov = [IoSlice::new(&[]); 64];
            let n = conn.output_slices(&mut iov);
            stream.write_vectored(&iov[..n])
        };
        match written {
            Ok(0) => return false,
            Ok(n) => conn.consume_output(n),
            Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
    true
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
            let direct = self.mode == ReactorMode::Poll && conns.len() - free.len() <= DIRECT_POLL_MAX;
            let timeout = match self.mode {
                _ if engine.has_completions() => Some(Duration::ZERO),
                ReactorMode::Poll => Some(Duration::ZERO),
                ReactorMode::Event if loop_start.duration_since(last_work) < self.idle_poll => Some(Duration::ZERO),
                ReactorMode::Event => Some(MAX_SLEEP),
            };
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
            let mut worked = !events.is_empty();
            touched.clear();

            while let Ok(h) = self.rx.try_recv() {
                worked = true;
                let idx = free.pop().unwrap_or_else(|| {
                    conns.push(None);
                    conns.len() - 1
                });
                let Handoff { mut stream, mut conn, permit } = h;
                if let Err(e) = self.poll.registry().register(&mut stream.stream, Token(idx), Interest::READABLE | Interest::WRITABLE) {
                    tracing::error!("cannot register connection: {e}");
                    free.push(idx);
                    continue;
                }
                conn.attach(idx as u32, &self.stats);
                // Input the acceptor decrypted and the connection had no room for yet.
                if stream.has_buffered_input() && read_all(&mut stream, &mut conn, now).is_none() {
                    conn.close();
                }
                conns[idx] = Some(Entry { stream, conn, gone: false, _permit: permit });
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
                if (ev.is_readable() || ev.is_read_closed() || ev.is_error()) && read_all(&mut e.stream, &mut e.conn, now).is_none() {
                    e.conn.close();
                }
                touched.push(idx);
            }
            if direct {
                for (idx, slot) in conns.iter_mut().enumerate() {
                    let Some(e) = slot else { continue };
                    if e.gone {
                        continue;
                    }
                    match read_all(&mut e.stream, &mut e.conn, now) {
                        None => e.conn.close(),
                        Some(0) => continue,
                        Some(_) => worked = true,
                    }
                    touched.push(idx);
                }
            }

            for &idx in &touched {
                if let Some(Some(e)) = conns.get_mut(idx) {
                    if !e.gone {
                        e.conn.process(now);
                    }
                    submit(&mut e.conn, &mut engine);
                }
            }
            engine.flush();
            engine.reap(&mut done);
            for c in done.drain(..) {
                let idx = (c.tag >> 32) as usize;
                if let Some(Some(e)) = conns.get_mut(idx) {
                    e.conn.complete_io(c);
                    touched.push(idx);
                }
                worked = true;
            }

            let tick = now.duration_since(last_tick) >= TICK;
            if tick {
                last_tick = now;
            }
            for (idx, slot) in conns.iter_mut().enumerate() {
                let Some(e) = slot else { continue };
                if tick && !e.gone {
                    e.conn.tick(now);
                    if e.conn.wants().hold {
                        // Memory may have been freed by another connection: read what waited in
                        // the socket while the input buffer was full (read_all processes first
                        // when it is), then try again.
                        match read_all(&mut e.stream, &mut e.conn, now) {
                            None => e.conn.close(),
                            Some(_) => e.conn.process(now),
                        }
                    }
                }
                let wants = e.conn.wants();
                if !e.gone && (wants.write || e.stream.has_pending_output()) {
                    if !write_all(&mut e.stream, &mut e.conn) {
                        e.conn.close();
                    } else {
                        let drained = !wants.read && e.conn.wants().read;
                        // Output drained below the mark: read what we held back.
                        if drained && read_all(&mut e.stream, &mut e.conn, now).is_none() {
                            e.conn.close();
                        }
                        // That input, and commands waiting for the buffers written data freed.
                        if drained || wants.hold {
                            e.conn.process(now);
                        }
                    }
                }
                submit(&mut e.conn, &mut engine);
                if !e.gone && e.conn.should_close() {
                    e.conn.close();
                    let _ = self.poll.registry().deregister(&mut e.stream.stream);
                    let _ = e.stream.stream.shutdown(std::net::Shutdown::Both);
                    e.gone = true;
                }
                if e.gone && e.conn.in_flight() == 0 {
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
        // Shutdown: close sockets, then let the backend finish with every buffer.
        for e in conns.iter_mut().flatten() {
            e.conn.close();
            let _ = e.stream.stream.shutdown(std::net::Shutdown::Both);
        }
        while engine.in_flight() > 0 {
            engine.wait_one();
            engine.reap(&mut done);
            for c in done.drain(..) {
                if let Some(Some(e)) = conns.get_mut((c.tag >> 32) as usize) {
                    e.conn.complete_io(c);
                    submit(&mut e.conn, &mut engine);
                }
            }
        }
    }
}
