//! Transports: each a per-connection state machine the reactors drive, on top of the shared
//! command layer ([`crate::command`]): NVMe/TCP, and NVMe over RDMA with the `rdma` feature
//! (`rdma.rs`: the binding's encodings, always built; `rdma/`: the transport), and an in-memory
//! loop for tests (`loopback.rs`, as nvmet's `loop.c`). Each supplies only its wire handling and
//! its [`DataPath`] hooks; the per-command lifecycle (`lifecycle.rs`) and the slots (`slots.rs`)
//! are shared.
//!
//! The contract between a transport and the rest of the target (docs/CONTRACTS.md, "Transport"):
//! a transport names its [`TransportKind`], whose [`Capabilities`] the command layer gets at
//! [`Commands::new`](crate::command::Commands::new). Identify Controller's SGL support, IOCCSZ,
//! the SGL type of data the transport moves itself and the discovery log's TRTYPE, ADRFAM and
//! TSAS all come from there, so no transport patches a response and the command layer never
//! asks which transport it serves.

mod lifecycle;
pub mod loopback;
pub mod rdma;
mod slots;
mod stall;
pub mod tcp;

pub use lifecycle::{At, Lifecycle};
pub use slots::{Slot, SlotState, Slots, BUFFER_BUDGET};

pub use crate::capabilities::{Capabilities, TransportKind, SGLS_KEYED_DATA_BLOCK};

use crate::backend::{IoCompletion, IoEngine};
use crate::command::{Commands, Work};
use crate::config::TargetSettings;
use crate::stats::ReactorStats;
use nvmf_proto::Status;
use std::sync::Arc;
use std::time::Instant;

/// What every transport implementation declares: its kind, and so its capabilities.
pub trait Transport {
    const KIND: TransportKind;

    fn capabilities(settings: &TargetSettings) -> Capabilities {
        Self::KIND.capabilities(settings)
    }
}

/// What a transport supplies to the shared per-command lifecycle ([`Lifecycle`]): how a
/// command's data comes from the host and goes to it, and how it is answered (docs/CONTRACTS.md,
/// "Transport"). The lifecycle decides when; these move the bytes. Slot buffers are the
/// lifecycle's; the hooks read and fill them through `slots`.
pub trait DataPath {
    /// Each command holds a slot from its arrival until the transport frees it once its response
    /// is sent (RDMA and loop: the slot is the command's receive buffer); otherwise only commands
    /// with data get one, freed by the lifecycle (TCP).
    const SLOT_PER_COMMAND: bool;
    /// The queue still serves commands (not closing).
    fn serving(&self) -> bool;
    /// Starts moving the host's data into slot `idx`'s buffer (TCP: R2T; RDMA: RDMA READ); its
    /// arrival goes to [`Lifecycle::data_arrived`]. `Err`: the command completes with it instead.
    fn fetch_data(&mut self, slots: &mut Slots, idx: u16) -> Result<(), Status>;
    /// Sends the first `len` bytes of slot `idx`'s buffer to the host (TCP: C2HData; RDMA: RDMA
    /// WRITE). True when that completed the command too (TCP with SQ flow control disabled), so
    /// no response follows. A transport that sends from the buffer after this returns marks the
    /// slot [`SlotState::Sending`] and frees it itself.
    fn send_data(&mut self, cmd: &Commands, slots: &mut Slots, idx: u16, len: u32) -> bool;
    /// Sends `data` of command `cid`, which holds no slot (never called when
    /// [`SLOT_PER_COMMAND`](Self::SLOT_PER_COMMAND)).
    fn send_copy(&mut self, cmd: &Commands, cid: u16, data: &[u8]);
    /// Sends the completion of command `at` (TCP: CapsuleResp; RDMA: SEND).
    fn respond(&mut self, cmd: &Commands, slots: &mut Slots, at: At, status: Status, result: u64);
    /// Command `cid` found no free slot: more outstanding than the queue allows.
    fn no_slot(&mut self, cmd: &mut Commands, cid: u16, work: Work);
    /// Connect succeeded: the queue is `cmd.queue()` from now on.
    fn connected(&mut self, cmd: &mut Commands);
    /// The command just answered ended the queue (Disconnect, failed authentication): close once
    /// its response is out.
    fn ending(&mut self);
}

/// How a transport accepts queues (docs/CONTRACTS.md, "Transport"): its acceptor owns the
/// transport's bound listeners (listening: TCP's sockets bound by `start`, so that port 0 resolves
/// before "ready"; RDMA's `RdmaListener::bind`), takes each new queue through Connect (ICReq and
/// TLS on TCP, the RDMA CM on RDMA) and hands it, as a [`QueueDriver`], to the reactor the
/// placement policy picks. `start` runs every transport's acceptor the same way
/// ([`spawn_acceptor`]).
pub trait Accept: Send + 'static {
    /// The acceptor thread's name.
    const THREAD: &'static str;
    /// Accepts until the target stops.
    fn run(self);
}

/// Starts `acceptor` on a thread of its own.
pub fn spawn_acceptor<A: Accept>(acceptor: A) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name(A::THREAD.into()).spawn(move || acceptor.run())
}

/// What a transport's queue supplies to the reactor that serves it (docs/CONTRACTS.md,
/// "Transport"): its fds for the reactor's poller, taking input (socket bytes, work
/// completions), progress, its backend requests and their completions, time, output, and
/// teardown. The reactor loop (`crate::reactor`) is written once against this; per-command data
/// fetch, data send and respond are each transport's [`DataPath`] hooks under the [`Lifecycle`].
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
