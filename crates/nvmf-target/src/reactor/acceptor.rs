//! The acceptor thread: takes new connections through ICReq and Connect (with TLS where the
//! port has it), then hands each to the reactor the placement policy picks.

use super::tcp::{read_all, write_all};
use super::{apply_socket_options, AnyQueue, ConnectionPermit, Handoff, Placement, ReactorHandle, SocketOptions, TcpQueue, MAX_SLEEP, TICK};
use std::io::ErrorKind;
use crate::core::{Port, Target};
use crate::transport::tcp::Connection;
use crate::wire::Wire;
use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The acceptor: listeners plus connections that have not finished Connect yet.
pub struct Acceptor {
    pub target: Arc<Target>,
    pub listeners: Vec<(TcpListener, Port)>,
    pub reactors: Vec<ReactorHandle>,
    pub placement: Arc<Placement>,
    pub sockopts: SocketOptions,
    pub stop: Arc<AtomicBool>,
    /// The TLS server config and record layer choice, when a port allows TLS.
    pub tls_config: Option<crate::wire::TlsSetup>,
}

/// Connections refused over `max_connections`, logged at most once a second.
struct Refusals {
    count: u64,
    logged: Option<Instant>,
}

impl Refusals {
    fn note(&mut self, peer: std::net::SocketAddr, max: u32, now: Instant) {
        self.count += 1;
        if self.logged.is_none_or(|t| now.saturating_duration_since(t) >= Duration::from_secs(1)) {
            tracing::warn!(%peer, max, refused = self.count, "connection limit reached; closing new connections");
            self.logged = Some(now);
            self.count = 0;
        }
    }
}

struct Pending {
    stream: Wire,
    conn: Connection,
    permit: ConnectionPermit,
}

impl crate::transport::Accept for Acceptor {
    const THREAD: &'static str = "nvmf-acceptor";

    fn run(self) {
        Acceptor::run(self)
    }
}

impl Acceptor {
    pub fn run(mut self) {
        let poll = match Poll::new() {
            Ok(p) => p,
            Err(e) => return tracing::error!("acceptor cannot create poller: {e}"),
        };
        let n = self.listeners.len();
        for (i, (l, _)) in self.listeners.iter_mut().enumerate() {
            if let Err(e) = poll.registry().register(l, Token(i), Interest::READABLE) {
                tracing::error!("cannot register listener: {e}");
            }
        }
        let mut pending: Vec<Option<Pending>> = Vec::new();
        let mut refusals = Refusals { count: 0, logged: None };
        let mut events = Events::with_capacity(256);
        let mut poll = poll;
        // Connections to visit this round: those with events, or all of them on a tick. Visiting
        // all every round would cost O(pending) per event, and a flood of half-open connections
        // would then eat the CPU that connected hosts need.
        let mut touched: Vec<usize> = Vec::new();
        let mut last_tick = Instant::now();
        while !self.stop.load(Relaxed) {
            if let Err(e) = poll.poll(&mut events, Some(MAX_SLEEP)) {
                if e.kind() != ErrorKind::Interrupted {
                    tracing::error!("acceptor poll failed: {e}");
                }
            }
            let now = Instant::now();
            touched.clear();
            for ev in events.iter() {
                let t = ev.token().0;
                if t < n {
                    self.accept_all(t, &poll, &mut pending, now, &mut refusals, &mut touched);
                } else if let Some(Some(p)) = pending.get_mut(t - n) {
                    if read_all(&mut p.stream, &mut p.conn, now).is_none() {
                        p.conn.close();
                    }
                    touched.push(t - n);
                }
            }
            let tick = now.duration_since(last_tick) >= TICK;
            if tick {
                last_tick = now;
                touched.clear();
                touched.extend(0..pending.len());
            }
            touched.sort_unstable();
            touched.dedup();
            for &i in &touched {
                let Some(Some(p)) = pending.get_mut(i) else { continue };
                p.conn.process(now);
                if tick {
                    p.conn.tick(now);
                }
                // A TLS connection's Connect must name the host and subsystem of its PSK
                // identity: checked before the Connect response goes out.
                if let Some((subnqn, hostnqn)) = p.conn.placement() {
                    if !p.stream.connect_matches_identity(subnqn, hostnqn) {
                        let _ = poll.registry().deregister(&mut p.stream.stream);
                        pending[i] = None;
                        continue;
                    }
                }
                if !write_all(&mut p.stream, &mut p.conn) {
                    p.conn.close();
                }
                if p.conn.should_close() {
                    let _ = poll.registry().deregister(&mut p.stream.stream);
                    pending[i] = None;
                    continue;
                }
                if let Some((subnqn, hostnqn)) = p.conn.placement() {
                    let r = self.placement.pick(subnqn, hostnqn);
                    let Some(mut p) = pending[i].take() else { continue };
                    let _ = poll.registry().deregister(&mut p.stream.stream);
                    p.stream.note_napi_id();
                    let queue = AnyQueue::Tcp(TcpQueue { stream: p.stream, conn: p.conn });
                    self.reactors[r].send(Handoff::Queue(queue, p.permit));
                }
            }
            while matches!(pending.last(), Some(None)) {
                pending.pop();
            }
        }
    }

    /// Accepts every waiting connection of listener `i` (over the cap: closes it); each new
    /// one is read once and its slot added to `touched`.
    fn accept_all(
        &mut self,
        i: usize,
        poll: &Poll,
        pending: &mut Vec<Option<Pending>>,
        now: Instant,
        refusals: &mut Refusals,
        touched: &mut Vec<usize>,
    ) {
        let n = self.listeners.len();
        loop {
            let (mut stream, peer) = match self.listeners[i].0.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    return;
                }
            };
            tracing::debug!(%peer, "accepted");
            let Some(permit) = ConnectionPermit::take(&self.target) else {
                // Over the cap: close at once (the host sees the connection end, not a hang in
                // the listen backlog), and say so at most once a second.
                refusals.note(peer, self.target.settings.max_connections, now);
                let _ = stream.shutdown(std::net::Shutdown::Both);
                continue;
            };
            apply_socket_options(&stream, &self.sockopts);
            let slot = pending.iter().position(Option::is_none).unwrap_or_else(|| {
                pending.push(None);
                pending.len() - 1
            });
            if let Err(e) = poll.registry().register(&mut stream, Token(n + slot), Interest::READABLE) {
                tracing::warn!("cannot register connection: {e}");
                continue;
            }
            let port = &self.listeners[i].1;
            let mut stream = Wire::new(stream, port, self.tls_config.clone());
            let mut conn = Connection::new(self.target.clone(), Some(port.clone()), now);
            // Bytes may already be waiting (edge-triggered: no event would announce them).
            if read_all(&mut stream, &mut conn, now).is_none() {
                conn.close();
            }
            pending[slot] = Some(Pending { stream, conn, permit });
            touched.push(slot);
        }
    }
}
