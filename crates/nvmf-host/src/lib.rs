//! NVMe/TCP (and, with the `rdma` feature, NVMe over RDMA) host library and the `nvmf-perf`
//! load generator.
//!
//! [`Controller`] owns the admin queue (connect, enable, Identify, Set Features, Get Log Page,
//! Keep Alive, shutdown); [`IoQueue`] is one I/O queue pair on its own connection;
//! [`discover`] reads a discovery controller's log page; [`Session`] reconnects a lost
//! controller and its queues ([`ReconnectPolicy`]: nvme-cli's reconnect options). The wire
//! format comes from `nvmf-proto`; this crate moves the bytes. [`perf`] is the engine behind
//! `nvmf-perf`.

mod auth;
pub mod command;
pub mod connection;
pub mod controller;
pub mod discovery;
pub mod error;
mod fabrics;
pub mod io_queue;
pub mod link;
pub mod machine;
pub mod perf;
pub mod queue;
pub mod queue_transport;
pub mod rdma;
pub mod reconnect;
pub mod session;
pub mod tls;

pub use connection::{default_hostnqn, open_link, ConnectOptions, Link, Transport};
pub use controller::{Controller, IoQueueParams};
pub use discovery::{discover, discover_over};
pub use error::{Error, Result};
pub use io_queue::IoQueue;
pub use machine::QueueMachine;
pub use command::{Completion, Xfer};
pub use queue::QueuePair;
pub use queue_transport::{ProtocolMachine, QueueTransport};
pub use reconnect::ReconnectPolicy;
pub use session::{Outage, Session, SessionQueue};
pub use tls::{TlsLink, TlsOptions};
