//! Transports: each a sans-I/O per-connection state machine the reactor drives, on top of the
//! shared command layer ([`crate::command`]). Only NVMe/TCP so far.

mod slots;
mod stall;
pub mod tcp;

pub use slots::BUFFER_BUDGET;
