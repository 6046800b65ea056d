//! An I/O queue: one connection joined to a controller with Connect (qid N, the controller's
//! cntlid), carrying NVM commands for one namespace.

use std::time::Duration;

use nvmf_proto::nvme::io_opcode;
use nvmf_proto::Sqe;

use crate::connection::{Link, Transport};
use crate::error::{Error, Result};
use crate::fabrics::{self, IoQueueParams};
use crate::command::{Completion, Xfer};
use crate::queue::QueuePair;

/// An I/O queue on its own connection.
pub struct IoQueue {
    qp: QueuePair,
    nsid: u32,
    lba_shift: u32,
    /// Largest I/O, as asked at connect (a reconnect asks the same).
    max_io: usize,
}

/// Bytes of Connect's data (the smallest slot buffer a queue pair may have).
const CONNECT_DATA_LEN: usize = 1024;

/// I/O queue `qid` on `link` (or, without one, a new connection of `params.opts.transport`),
/// joined to the controller with Connect, in a queue pair of `slots` command slots of `buf_len`
/// bytes each (a reconnect's may be fewer and smaller: see [`QueuePair::fresh_shape`]).
fn join_io_queue(link: Option<Box<dyn Link>>, params: &IoQueueParams, qid: u16, depth: usize, slots: usize, buf_len: usize) -> Result<QueuePair> {
    // SQSIZE is 0's based: depth + 1 entries, so `depth` commands never fill the queue (RDMA
    // asks for more: see rdma::io_sqsize).
    let sqsize = match params.opts.transport {
        Transport::Tcp => depth as u16,
        Transport::Rdma => crate::rdma::io_sqsize(depth),
    };
    let (opts, buf_len) = (&params.opts, buf_len.max(CONNECT_DATA_LEN));
    let mut qp = match link {
        Some(link) => QueuePair::open(link, opts, qid, slots, buf_len, params.in_capsule)?,
        None => QueuePair::connect(opts, &params.subnqn, qid, slots, buf_len, params.in_capsule, sqsize, params.cntlid)?,
    };
    fabrics::connect(&mut qp, opts, &params.subnqn, params.cntlid, sqsize, 0)?;
    Ok(qp)
}

impl IoQueue {
    /// Connects I/O queue `qid` with `depth` command slots, each with a `max_io`-byte buffer.
    pub fn connect(params: &IoQueueParams, qid: u16, depth: usize, max_io: usize) -> Result<IoQueue> {
        let qp = join_io_queue(None, params, qid, depth, depth.max(1), max_io)?;
        Ok(IoQueue { qp, nsid: 1, lba_shift: 9, max_io })
    }

    /// [`IoQueue::connect`] over `link` instead of a TCP connection to `params.opts.addr`.
    pub fn connect_over(link: Box<dyn Link>, params: &IoQueueParams, qid: u16, depth: usize, max_io: usize) -> Result<IoQueue> {
        let qp = join_io_queue(Some(link), params, qid, depth, depth.max(1), max_io)?;
        Ok(IoQueue { qp, nsid: 1, lba_shift: 9, max_io })
    }

    /// Joins the same qid to the controller `params` names (after a controller reconnect) on a
    /// new connection, and resubmits every command in flight there. Returns how many.
    pub fn reconnect(&mut self, params: &IoQueueParams) -> Result<usize> {
        let (slots, buf_len) = self.qp.fresh_shape(self.max_io.max(CONNECT_DATA_LEN));
        let fresh = join_io_queue(None, params, self.qp.qid(), self.qp.depth(), slots, buf_len)?;
        self.qp.resubmit_on(fresh, params.in_capsule)
    }

    /// Namespace the NVM commands address and its logical block size (a power of two).
    pub fn set_namespace(&mut self, nsid: u32, block_size: u64) {
        self.nsid = nsid;
        self.lba_shift = block_size.trailing_zeros();
    }

    pub fn qid(&self) -> u16 {
        self.qp.qid()
    }

    pub fn depth(&self) -> usize {
        self.qp.depth()
    }

    pub fn buffer(&mut self, tag: u16) -> &mut [u8] {
        self.qp.buffer(tag)
    }

    fn rw_sqe(&self, opcode: u8, slba: u64, nlb: u32) -> Result<Sqe> {
        if nlb == 0 || nlb > 0x1_0000 {
            return Err(Error::Unsupported(format!("{nlb} blocks in one command (1..=65536 allowed)")));
        }
        let mut sqe = Sqe::new(opcode, 0);
        sqe.set_nsid(self.nsid);
        sqe.set_slba(slba);
        sqe.set_nlb((nlb - 1) as u16);
        Ok(sqe)
    }

    /// Read `nlb` blocks at `slba` into `tag`'s buffer.
    pub fn submit_read(&mut self, tag: u16, slba: u64, nlb: u32) -> Result<()> {
        let sqe = self.rw_sqe(io_opcode::READ, slba, nlb)?;
        self.qp.submit(tag, sqe, Xfer::Read((nlb as usize) << self.lba_shift))
    }

    /// Write `nlb` blocks at `slba` from `tag`'s buffer.
    pub fn submit_write(&mut self, tag: u16, slba: u64, nlb: u32) -> Result<()> {
        let sqe = self.rw_sqe(io_opcode::WRITE, slba, nlb)?;
        self.qp.submit(tag, sqe, Xfer::Write((nlb as usize) << self.lba_shift))
    }

    pub fn submit_write_zeroes(&mut self, tag: u16, slba: u64, nlb: u32) -> Result<()> {
        let sqe = self.rw_sqe(io_opcode::WRITE_ZEROES, slba, nlb)?;
        self.qp.submit(tag, sqe, Xfer::None)
    }

    pub fn submit_flush(&mut self, tag: u16) -> Result<()> {
        let mut sqe = Sqe::new(io_opcode::FLUSH, 0);
        sqe.set_nsid(self.nsid);
        self.qp.submit(tag, sqe, Xfer::None)
    }

    /// Dataset Management with the Deallocate attribute over `(slba, nlb)` ranges (1..=256).
    pub fn submit_deallocate(&mut self, tag: u16, ranges: &[(u64, u32)]) -> Result<()> {
        if ranges.is_empty() || ranges.len() > 256 {
            return Err(Error::Unsupported(format!("{} DSM ranges (1..=256 allowed)", ranges.len())));
        }
        let len = ranges.len() * 16;
        self.qp.ensure_buffer(tag, len);
        let buf = self.qp.buffer(tag);
        for (i, &(slba, nlb)) in ranges.iter().enumerate() {
            let r = &mut buf[i * 16..i * 16 + 16];
            r[0..4].fill(0);
            r[4..8].copy_from_slice(&nlb.to_le_bytes());
            r[8..16].copy_from_slice(&slba.to_le_bytes());
        }
        let mut sqe = Sqe::new(io_opcode::DATASET_MANAGEMENT, 0);
        sqe.set_nsid(self.nsid);
        sqe.set_cdw(10, ranges.len() as u32 - 1);
        sqe.set_cdw(11, 1 << 2);
        self.qp.submit(tag, sqe, Xfer::Write(len))
    }

    pub fn commit(&mut self) -> Result<()> {
        self.qp.commit()
    }

    pub fn poll(&mut self, wait: Duration, done: &mut Vec<Completion>) -> Result<()> {
        self.qp.poll(wait, done)
    }

    /// Reads `buf.len()` bytes at `slba` and waits (tag 0; for tools, not for load).
    pub fn read(&mut self, slba: u64, buf: &mut [u8], timeout: Duration) -> Result<()> {
        let sqe = self.rw_sqe(io_opcode::READ, slba, (buf.len() >> self.lba_shift) as u32)?;
        self.qp.ensure_buffer(0, buf.len());
        self.qp.execute(sqe, Xfer::Read(buf.len()), timeout)?;
        buf.copy_from_slice(&self.qp.buffer(0)[..buf.len()]);
        Ok(())
    }

    /// Writes `data` at `slba` and waits (tag 0; for tools, not for load).
    pub fn write(&mut self, slba: u64, data: &[u8], timeout: Duration) -> Result<()> {
        let sqe = self.rw_sqe(io_opcode::WRITE, slba, (data.len() >> self.lba_shift) as u32)?;
        self.qp.ensure_buffer(0, data.len());
        self.qp.buffer(0)[..data.len()].copy_from_slice(data);
        self.qp.execute(sqe, Xfer::Write(data.len()), timeout).map(|_| ())
    }

    /// Fabrics Disconnect of this queue, then close (every command must have completed).
    pub fn disconnect(mut self, timeout: Duration) -> Result<()> {
        self.qp.execute(nvmf_proto::fabrics::disconnect_sqe(0), Xfer::None, timeout).map(|_| ())
    }
}
