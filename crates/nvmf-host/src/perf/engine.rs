//! What a job needs from the thing that moves its I/O: the NVMe/TCP queue pair or the local
//! io_uring ring. Tags (0..depth) name both the I/O in flight and its reusable buffer, so the
//! data path neither allocates nor looks anything up.

use std::time::Duration;

use crate::{Completion, Error, SessionQueue};

pub trait Engine {
    /// Tags available: I/Os in flight at most.
    fn depth(&self) -> usize;

    /// The data buffer of `tag` (at least the largest I/O size asked for at creation).
    fn buffer(&mut self, tag: u16) -> &mut [u8];

    /// Queues one read or write of `len` bytes at byte `offset` using `tag`'s buffer. It may
    /// only be handed to the kernel at the next [`Engine::commit`], so that many commands share
    /// one system call.
    fn submit(&mut self, tag: u16, is_read: bool, offset: u64, len: usize) -> Result<(), Error>;

    /// Hands everything queued to the kernel.
    fn commit(&mut self) -> Result<(), Error>;

    /// Collects finished I/Os into `done` (cleared first). `wait` zero: only look; otherwise
    /// block up to `wait` for at least one.
    fn reap(&mut self, wait: Duration, done: &mut Vec<Completion>) -> Result<(), Error>;

    /// True once after the engine reconnected (its I/Os in flight were resubmitted), so the
    /// job restarts its stall clock instead of counting the outage as a stall.
    fn take_recovered(&mut self) -> bool {
        false
    }

    /// I/Os resubmitted after reconnects.
    fn retried(&self) -> u64 {
        0
    }
}

/// NVMe/TCP: byte offsets become LBAs of the queue's namespace. The queue belongs to a session,
/// so a lost connection is reconnected under the job's feet (see [`crate::session`]).
pub struct TcpEngine<'s> {
    pub queue: SessionQueue<'s>,
    pub lba_shift: u32,
}

impl Engine for TcpEngine<'_> {
    fn depth(&self) -> usize {
        self.queue.depth()
    }

    fn buffer(&mut self, tag: u16) -> &mut [u8] {
        self.queue.queue().buffer(tag)
    }

    fn submit(&mut self, tag: u16, is_read: bool, offset: u64, len: usize) -> Result<(), Error> {
        let slba = offset >> self.lba_shift;
        let nlb = (len >> self.lba_shift) as u32;
        if is_read {
            self.queue.queue().submit_read(tag, slba, nlb)
        } else {
            self.queue.queue().submit_write(tag, slba, nlb)
        }
    }

    fn commit(&mut self) -> Result<(), Error> {
        self.queue.commit()
    }

    fn reap(&mut self, wait: Duration, done: &mut Vec<Completion>) -> Result<(), Error> {
        self.queue.poll(wait, done)
    }

    fn take_recovered(&mut self) -> bool {
        self.queue.take_recovered()
    }

    fn retried(&self) -> u64 {
        self.queue.retried()
    }
}
