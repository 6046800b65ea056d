//! Userspace NVMe/TCP target. See README.md.

pub mod admin;
pub mod backend;
pub mod config;
pub mod core;
pub mod discovery;
pub mod fabrics;
pub mod io;
pub mod stats;
pub mod transport;
