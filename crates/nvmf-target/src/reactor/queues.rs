//! The queues a reactor serves, of every transport, behind one [`QueueDriver`]: an enum rather
//! than a trait object, so that a build without RDMA has one variant and the reactor's calls
//! compile to direct (inlined) calls into the TCP queue.

use super::tcp::TcpQueue;
use crate::backend::{IoCompletion, IoEngine};
use crate::stats::ReactorStats;
use crate::transport::QueueDriver;
use mio::{Registry, Token};
use std::sync::Arc;
use std::time::Instant;

// The TCP queue stays in place (the reactor's hot path); the rarer RDMA queue is boxed.
#[allow(clippy::large_enum_variant)]
pub enum AnyQueue {
    Tcp(TcpQueue),
    #[cfg(feature = "rdma")]
    Rdma(Box<crate::transport::rdma::RdmaQueue>),
}

/// Runs `$e` with `$q` bound to the queue, whichever transport's.
macro_rules! each {
    ($self:ident, $q:ident => $e:expr) => {
        match $self {
            AnyQueue::Tcp($q) => $e,
            #[cfg(feature = "rdma")]
            AnyQueue::Rdma($q) => $e,
        }
    };
}

impl AnyQueue {
    /// The host disconnected the RDMA queue of CM id `id` (the RDMA acceptor reads the CM
    /// events of every queue): true when this is that queue, now shutting.
    #[cfg(feature = "rdma")]
    pub fn rdma_disconnected(&mut self, id: nvmf_rdma::CmId) -> bool {
        match self {
            AnyQueue::Rdma(q) if q.conn.cm_id() == id => {
                q.shut("host disconnected");
                true
            }
            _ => false,
        }
    }
}

impl QueueDriver for AnyQueue {
    #[inline]
    fn register(&mut self, registry: &Registry, token: Token) -> std::io::Result<()> {
        each!(self, q => q.register(registry, token))
    }
    #[inline]
    fn attach(&mut self, token: u32, stats: &Arc<ReactorStats>, now: Instant) {
        each!(self, q => q.attach(token, stats, now))
    }
    #[inline]
    fn ready(&mut self, event: &mio::event::Event, now: Instant) {
        each!(self, q => q.ready(event, now))
    }
    #[inline]
    fn poll_input(&mut self, now: Instant) -> Option<usize> {
        each!(self, q => q.poll_input(now))
    }
    #[inline]
    fn polls_without_syscall(&self) -> bool {
        each!(self, q => q.polls_without_syscall())
    }
    #[inline]
    fn process(&mut self, now: Instant) {
        each!(self, q => q.process(now))
    }
    #[inline]
    fn submit(&mut self, engine: &mut IoEngine) {
        each!(self, q => q.submit(engine))
    }
    #[inline]
    fn complete_io(&mut self, c: IoCompletion) {
        each!(self, q => q.complete_io(c))
    }
    #[inline]
    fn service(&mut self, now: Instant, tick: bool) {
        each!(self, q => q.service(now, tick))
    }
    #[inline]
    fn arm(&mut self, now: Instant) -> bool {
        each!(self, q => q.arm(now))
    }
    #[inline]
    fn should_close(&self) -> bool {
        each!(self, q => q.should_close())
    }
    fn teardown(&mut self, registry: &Registry) {
        each!(self, q => q.teardown(registry))
    }
    #[inline]
    fn in_flight(&self) -> usize {
        each!(self, q => q.in_flight())
    }
}
