//! Transports. Only NVMe/TCP: a sans-I/O per-connection state machine the reactor drives.

mod slots;
mod stall;
pub mod tcp;

pub use slots::BUFFER_BUDGET;
