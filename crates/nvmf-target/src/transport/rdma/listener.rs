//! An NVMe/RDMA port: its listening RDMA CM id, whose event channel reports connect requests and
//! every accepted queue's CM events (established, disconnected), and the acceptance of a connect
//! request (private data checked, the queue pair and buffers set up). The RDMA acceptor thread
//! (`crate::reactor::RdmaAcceptor`) reads the events, drives new queues through Connect and hands
//! each to a reactor.

use super::queue::{receive_memory, RdmaQueue};
use super::{cm_reject, cm_reply, cm_status, CmRequest};
use crate::core::{Port, Target};
use crate::stats::ReactorStats;
use crate::transport::BUFFER_BUDGET;
use nvmf_rdma::{Connection, Event, Listener};
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};

const BACKLOG: i32 = 128;

/// The listening id and its event channel. Every queue accepted on the port holds it: its CM id
/// reports on this channel, which must outlive it (the queues live on other threads).
pub type Channel = Arc<Mutex<Listener>>;

pub struct RdmaListener {
    /// The port, with the bound address (port 0 binds one).
    pub port: Port,
    channel: Channel,
    fd: RawFd,
}

impl RdmaListener {
    /// Binds `port.addr` on an RDMA device. Fails where no RDMA device serves the address
    /// (ENODEV, EADDRNOTAVAIL) or no RDMA CM exists.
    pub fn bind(port: Port) -> std::io::Result<RdmaListener> {
        let listener = Listener::bind(&port.addr.ip().to_string(), port.addr.port(), BACKLOG)?;
        let addr = SocketAddr::new(port.addr.ip(), listener.port());
        let fd = listener.fd();
        tracing::info!(%addr, "NVMe/RDMA listening");
        Ok(RdmaListener { port: Port { addr, ..port }, channel: Arc::new(Mutex::new(listener)), fd })
    }

    /// The event channel's fd: readable when [`next_event`](Self::next_event) has something.
    pub fn fd(&self) -> RawFd {
        self.fd
    }

    /// The next CM event of the port or of a queue accepted on it, if one waits.
    pub fn next_event(&self) -> std::io::Result<Option<Event>> {
        self.channel.lock().unwrap_or_else(|e| e.into_inner()).next_event()
    }

    /// A host asks to connect: checks its private data, sets up the queue (its receives posted,
    /// its counters in `unplaced` until a reactor takes it) and accepts. None when refused or
    /// failed (logged; the host's connect fails).
    pub fn accept(&self, ev: Event, target: &Arc<Target>, unplaced: &Arc<ReactorStats>) -> Option<RdmaQueue> {
        let req = match CmRequest::parse(&ev.private_data) {
            Ok(r) => r,
            Err(status) => {
                tracing::warn!(status, len = ev.private_data.len(), "refusing an RDMA connect request");
                let _ = ev.id.reject(&cm_reject(status));
                return None;
            }
        };
        let depth = req.depth();
        // Receive buffers are taken at accept, for the whole queue: bounded like a TCP
        // connection's command buffers.
        let memory = receive_memory(target, req.qid, depth);
        if memory > BUFFER_BUDGET {
            tracing::warn!(qid = req.qid, depth, memory, "refusing an RDMA connect request: no resources");
            let _ = ev.id.reject(&cm_reject(cm_status::NO_RESOURCES));
            return None;
        }
        // Per command at most an RDMA WRITE and a SEND, or an RDMA READ, are outstanding.
        let conn = match Connection::create(ev.id, 2 * depth + 1, depth) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(qid = req.qid, depth, "cannot create an RDMA queue pair: {e}");
                return None;
            }
        };
        let queue = RdmaQueue::new(conn, self.channel.clone(), target.clone(), Some(self.port.clone()), unplaced.clone(), req.qid, depth);
        let queue = match queue {
            Ok(q) => q,
            Err(e) => {
                // The connection (and its id) is gone with the error: the host's connect fails.
                tracing::warn!(qid = req.qid, depth, "cannot set up an RDMA queue: {e}");
                return None;
            }
        };
        if let Err(e) = queue.conn.accept(&cm_reply(depth as u16), ev.responder_resources, ev.initiator_depth) {
            tracing::warn!(qid = req.qid, "accepting an RDMA connection failed: {e}");
            return None;
        }
        tracing::debug!(qid = req.qid, hrqsize = req.hrqsize, hsqsize = req.hsqsize, "RDMA connection accepted");
        Some(queue)
    }

    /// Refuses a connect request over `max_connections`.
    pub fn refuse(&self, ev: Event) {
        let _ = ev.id.reject(&cm_reject(cm_status::NO_RESOURCES));
    }
}
