//! Wire codec for NVMe over TCP.
//!
//! Knows bytes, not sockets: PDU headers and framing, submission and completion queue entries,
//! the Fabrics and Admin structures NVMe/TCP needs, and the CRC32C digests. Nothing here does I/O,
//! spawns threads or panics on input, so the target and the host drive it directly and tests and
//! fuzzers can feed it anything. The one exception is [`sockopts`]: the socket options both sides
//! set on a connection, here so that they are written once. [`spliced`] is the output queue both
//! sides send from (PDU bytes with payloads spliced in from command buffers).
//!
//! Layouts follow the NVMe/TCP Transport Specification 1.0, NVMe over Fabrics 1.1 and NVMe Base 2.0;
//! all multi-byte fields are little endian.

pub mod auth;
pub mod congestion;
pub mod digest;
pub mod discovery;
pub mod fabrics;
pub mod frame;
pub mod identify;
pub mod nvme;
pub mod pdu;
pub mod rdma;
pub mod sockopts;
pub mod spliced;
pub mod units;
mod le;

pub use frame::{FatalError, Frame, FrameHeader, Framer, Role};
pub use nvme::{Cqe, SglDescriptor, Sqe, Status};
pub use pdu::{Digests, PduHeader, PduType};

/// A structure that is too short or carries an invalid value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("{what}: need {need} bytes, got {got}")]
    Short { what: &'static str, need: usize, got: usize },
    #[error("{what}: {detail}")]
    Invalid { what: &'static str, detail: String },
}
