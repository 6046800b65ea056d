//! Transports. Only NVMe/TCP: a sans-I/O per-connection state machine the reactor drives.

pub mod tcp;
