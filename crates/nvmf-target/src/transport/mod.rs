//! Transports: each a per-connection state machine the reactors drive, on top of the shared
//! command layer ([`crate::command`]): NVMe/TCP, and NVMe over RDMA with the `rdma` feature
//! (`rdma.rs`: the binding's encodings, always built; `rdma/`: the transport).
//!
//! The contract between a transport and the rest of the target (docs/CONTRACTS.md, "Transport"):
//! a transport names its [`TransportKind`], whose [`Capabilities`] the command layer gets at
//! [`Commands::new`](crate::command::Commands::new). Identify Controller's SGL support, IOCCSZ,
//! the SGL type of data the transport moves itself and the discovery log's TRTYPE, ADRFAM and
//! TSAS all come from there, so no transport patches a response and the command layer never
//! asks which transport it serves.

pub mod rdma;
mod slots;
mod stall;
pub mod tcp;

pub use slots::BUFFER_BUDGET;

pub use crate::capabilities::{Capabilities, TransportKind, SGLS_KEYED_DATA_BLOCK};

use crate::backend::{IoCompletion, IoEngine};
use crate::config::TargetSettings;
use crate::stats::ReactorStats;
use std::sync::Arc;
use std::time::Instant;

/// What every transport implementation declares: its kind, and so its capabilities.
pub trait Transport {
    const KIND: TransportKind;

    fn capabilities(settings: &TargetSettings) -> Capabilities {
        Self::KIND.capabilities(settings)
    }
}

/// What a transport's queue supplies to the reactor that serves it (docs/CONTRACTS.md,
/// "Transport"): its fds for the reactor's poller, taking input (socket bytes, work
/// completions), progress, its backend requests and their completions, time, output, and
/// teardown. The reactor loop (`crate::reactor`) is written once against this; per-command data
/// fetch, data send and respond stay inside each transport's machine, over the shared slots.
pub trait QueueDriver {
    /// Registers the queue's fds with the reactor's poller under `token`.
    fn register(&mut self, registry: &mio::Registry, token: mio::Token) -> std::io::Result<()>;
    /// The queue now belongs to this reactor: `token` routes its backend completions back, its
    /// counters join `stats`. Input already taken in (by the acceptor) is handled.
    fn attach(&mut self, token: u32, stats: &Arc<ReactorStats>, now: Instant);
    /// The poller reported one of the queue's fds: take what it announced.
    fn ready(&mut self, event: &mio::event::Event, now: Instant);
    /// Takes input without being told there is some (a polling turn): how much, or None when
    /// the connection is lost.
    fn poll_input(&mut self, now: Instant) -> Option<usize>;
    /// True when [`poll_input`](Self::poll_input) costs no syscall, so a reactor that does not
    /// sleep calls it every turn whatever the number of queues (an RDMA completion queue is
    /// memory; a socket read is a syscall).
    fn polls_without_syscall(&self) -> bool;
    /// Handles the input taken.
    fn process(&mut self, now: Instant);
    /// Hands its queued backend requests to the reactor's engine.
    fn submit(&mut self, engine: &mut IoEngine);
    /// A backend request of this queue finished.
    fn complete_io(&mut self, c: IoCompletion);
    /// Once per turn: timeouts on `tick`, commands waiting for memory, output.
    fn service(&mut self, now: Instant, tick: bool);
    /// Before the reactor sleeps (event mode): asks its fds to report the next input; true when
    /// input came meanwhile (taken in: the reactor must not sleep).
    fn arm(&mut self, now: Instant) -> bool;
    fn should_close(&self) -> bool;
    /// Ends the connection (the peer sees it go) and takes its fds off `registry`; the reactor
    /// keeps the queue until [`in_flight`](Self::in_flight) is 0.
    fn teardown(&mut self, registry: &mio::Registry);
    /// Backend requests outstanding: the queue's buffers must outlive them.
    fn in_flight(&self) -> usize;
}
