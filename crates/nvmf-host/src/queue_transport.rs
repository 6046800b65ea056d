//! The contract between a host queue pair and its transport: [`QueueTransport`] is what a
//! transport's queue pair supplies to [`crate::QueuePair`], [`ProtocolMachine`] what its sans-I/O
//! protocol machine answers about the queue. A leaf module: the queue pair (`queue.rs`) and
//! every transport (`rdma/`) import it, it imports neither.

use std::any::Any;
use std::time::Duration;

use nvmf_proto::Sqe;

use crate::command::{Completion, Xfer};
use crate::error::{Error, Result};

/// What a transport's protocol machine (NVMe/TCP's [`crate::QueueMachine`], NVMe/RDMA's
/// [`crate::rdma::machine::RdmaMachine`]) says of its queue pair.
pub trait ProtocolMachine {
    fn qid(&self) -> u16;
    /// Command slots: tags are `0..depth()`.
    fn depth(&self) -> usize;
    /// Bytes of write data a command may carry in its capsule.
    fn in_capsule_max(&self) -> usize;
}

/// What a transport's queue pair supplies. Tags are command slots (the CID), `0..depth()`.
pub trait QueueTransport: Send {
    /// The protocol machine behind this queue pair.
    fn machine(&self) -> &dyn ProtocolMachine;
    fn qid(&self) -> u16 {
        self.machine().qid()
    }
    fn depth(&self) -> usize {
        self.machine().depth()
    }
    /// Bytes of write data a command may carry in its capsule.
    fn in_capsule_max(&self) -> usize {
        self.machine().in_capsule_max()
    }
    /// The data buffer of `tag`: fill it before a write, read it after a read completes.
    fn buffer(&mut self, tag: u16) -> &mut [u8];
    /// Grows `tag`'s buffer to at least `len` bytes (admin commands; never on the data path).
    fn ensure_buffer(&mut self, tag: u16, len: usize) -> Result<()>;
    /// Queues (or posts) a command with CID `tag`.
    fn submit(&mut self, tag: u16, sqe: Sqe, xfer: Xfer) -> Result<()>;
    /// Sends what is queued without waiting.
    fn commit(&mut self) -> Result<()>;
    /// Processes what has arrived, pushing finished commands into `done` (cleared first).
    /// With a non-zero `wait` it sleeps up to `wait` until at least one finishes.
    fn poll(&mut self, wait: Duration, done: &mut Vec<Completion>) -> Result<()>;
    /// The slots and buffer length a fresh queue pair of this transport needs so that this one
    /// can move onto it ([`QueueTransport::resubmit_on`]), given `buf_len`, this queue's own.
    /// The fresh pair's buffers carry only Connect before that.
    fn fresh_shape(&self, buf_len: usize) -> (usize, usize);
    /// Moves this queue onto `fresh` (same transport, already joined to the controller),
    /// keeping its slots and buffers, and submits again every command in flight on the old
    /// connection (a write may then run twice, which rewrites the same data). Returns how many.
    fn resubmit_on(&mut self, fresh: Box<dyn Any>, in_capsule_max: usize) -> Result<usize>;
    /// This queue as `Any`, for [`QueueTransport::resubmit_on`] on its own kind.
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

/// What `resubmit_on` answers when handed a fresh queue pair of another transport.
pub(crate) fn wrong_transport() -> Error {
    Error::Unsupported("resubmitting onto a queue pair of another transport".into())
}
