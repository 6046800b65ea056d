//! Transports: each a sans-I/O per-connection state machine the reactor drives, on top of the
//! shared command layer ([`crate::command`]): NVMe/TCP, and NVMe over RDMA with the `rdma`
//! feature (`rdma.rs`: the binding's encodings, always built; `rdma/`: the transport).

pub mod rdma;
mod slots;
mod stall;
pub mod tcp;

pub use slots::BUFFER_BUDGET;
