//! A queue pair on one connection: command slots indexed by CID, capsules batched into one
//! send buffer, and the receive side of NVMe/TCP (CapsuleResp, C2HData with the SUCCESS
//! optimisation, R2T answered with H2CData). Used for the admin queue (qid 0) and for I/O queues.
//!
//! On the data path nothing allocates: slots and their buffers are made once, PDUs are encoded
//! into the connection's reused send buffer, completions go into the caller's vector.

use std::time::{Duration, Instant};

use nvmf_proto::nvme::io_opcode;
use nvmf_proto::pdu::{encode_pdu, encode_pdu_header, CapsuleCmd, H2CData};
use nvmf_proto::{digest, Cqe, PduHeader, SglDescriptor, Sqe, Status};

use crate::connection::Connection;
use crate::error::{Error, Result};

/// Data movement of one command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Xfer {
    None,
    /// Controller to host (C2HData) into the slot buffer.
    Read(usize),
    /// Host to controller from the slot buffer: in the capsule when it fits, else by R2T.
    Write(usize),
    /// Host to controller, always in the capsule (Fabrics Connect data).
    WriteInCapsule(usize),
}

/// One finished command: `Ok` carries CQE DW0 (low half) and DW1.
#[derive(Debug)]
pub struct Completion {
    pub tag: u16,
    pub result: Result<u64>,
}

#[derive(Debug)]
struct Slot {
    buf: Vec<u8>,
    active: bool,
    /// The command as submitted, kept to resubmit it on a new connection after a reconnect.
    sqe: Sqe,
    opcode: u8,
    /// FCTYPE of a Fabrics command (names it in errors).
    fctype: u8,
    xfer: Xfer,
    /// C2HData bytes received so far.
    received: usize,
    /// Set when a received C2HData failed its data digest.
    digest_error: bool,
}

/// A queue pair on its own connection.
pub struct QueuePair {
    pub(crate) conn: Connection,
    qid: u16,
    slots: Vec<Slot>,
    /// Largest write carried in the capsule (admin: 8 KiB as Linux sends; I/O: from IOCCSZ).
    in_capsule_max: usize,
}

impl QueuePair {
    pub fn new(conn: Connection, qid: u16, depth: usize, buf_len: usize, in_capsule_max: usize) -> Self {
        let slots = (0..depth)
            .map(|_| Slot {
                buf: vec![0; buf_len],
                active: false,
                sqe: Sqe::new(0, 0),
                opcode: 0,
                fctype: 0,
                xfer: Xfer::None,
                received: 0,
                digest_error: false,
            })
            .collect();
        QueuePair { conn, qid, slots, in_capsule_max }
    }

    pub fn qid(&self) -> u16 {
        self.qid
    }

    pub fn depth(&self) -> usize {
        self.slots.len()
    }

    /// The data buffer of `tag`: fill it before a write, read it after a read completes.
    pub fn buffer(&mut self, tag: u16) -> &mut [u8] {
        &mut self.slots[tag as usize].buf
    }

    /// Grows `tag`'s buffer (admin commands with large data; never on the data path).
    pub fn ensure_buffer(&mut self, tag: u16, len: usize) {
        let b = &mut self.slots[tag as usize].buf;
        if b.len() < len {
            b.resize(len, 0);
        }
    }

    pub fn in_capsule_max(&self) -> usize {
        self.in_capsule_max
    }

    /// Queues a command with CID `tag`; it goes out at the next [`QueuePair::commit`] or poll.
    pub fn submit(&mut self, tag: u16, mut sqe: Sqe, xfer: Xfer) -> Result<()> {
        let slot = self
            .slots
            .get_mut(tag as usize)
            .ok_or_else(|| Error::Unsupported(format!("tag {tag} beyond queue depth")))?;
        if slot.active {
            return Err(Error::Unsupported(format!("tag {tag} is already in flight")));
        }
        let len = match xfer {
            Xfer::None => 0,
            Xfer::Read(n) | Xfer::Write(n) | Xfer::WriteInCapsule(n) => n,
        };
        if len > slot.buf.len() {
            return Err(Error::Unsupported(format!("{len}-byte transfer exceeds the {}-byte buffer", slot.buf.len())));
        }
        let in_capsule = match xfer {
            Xfer::WriteInCapsule(_) => true,
            Xfer::Write(n) => n <= self.in_capsule_max,
            _ => false,
        };
        sqe.set_cid(tag);
        sqe.set_sgl(if in_capsule {
            SglDescriptor::in_capsule(0, len as u32)
        } else {
            SglDescriptor::transport(len as u32)
        });
        slot.active = true;
        slot.sqe = sqe;
        slot.opcode = sqe.opcode();
        slot.fctype = sqe.fctype();
        slot.xfer = xfer;
        slot.received = 0;
        slot.digest_error = false;
        let data = if in_capsule { &slot.buf[..len] } else { &[][..] };
        encode_pdu(&mut self.conn.tx, &PduHeader::CapsuleCmd(CapsuleCmd { sqe }), data, self.conn.digests);
        Ok(())
    }

    /// Moves this queue onto `conn` (a new connection already joined to the controller) and
    /// submits again every command that was in flight on the old one, from its kept SQE and
    /// buffer: a write may then run twice, which rewrites the same data. Returns how many.
    pub(crate) fn resubmit_on(&mut self, conn: Connection, in_capsule_max: usize) -> Result<usize> {
        self.conn = conn;
        self.in_capsule_max = in_capsule_max;
        let mut n = 0;
        for tag in 0..self.slots.len() {
            let slot = &mut self.slots[tag];
            if slot.active {
                slot.active = false;
                let (sqe, xfer) = (slot.sqe, slot.xfer);
                self.submit(tag as u16, sqe, xfer)?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Sends what is queued without waiting (the rest goes out during polls).
    pub fn commit(&mut self) -> Result<()> {
        self.conn.flush()?;
        Ok(())
    }

    /// Processes what has arrived, pushing finished commands into `done` (cleared first).
    /// With a non-zero `wait` it sleeps in poll(2) up to `wait` until at least one finishes.
    pub fn poll(&mut self, wait: Duration, done: &mut Vec<Completion>) -> Result<()> {
        done.clear();
        // No clock read when polling (wait zero): this runs once per spin of a polling job.
        let deadline = (!wait.is_zero()).then(|| Instant::now() + wait);
        loop {
            self.conn.flush()?;
            let n = self.conn.fill()?;
            self.process(done)?;
            if self.conn.has_pending_tx() {
                self.conn.flush()?;
            }
            if !done.is_empty() || wait.is_zero() {
                return Ok(());
            }
            if let (0, Some(deadline)) = (n, deadline) {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(());
                }
                self.conn.wait(left)?;
            }
        }
    }

    /// Submits one command on tag 0 and waits for it (admin commands, simple tools).
    pub fn execute(&mut self, sqe: Sqe, xfer: Xfer, timeout: Duration) -> Result<u64> {
        let name = command_name(sqe.opcode(), sqe.fctype(), self.qid);
        self.submit(0, sqe, xfer)?;
        let deadline = Instant::now() + timeout;
        let mut done = Vec::with_capacity(1);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout(format!("{name}: no completion within {} ms", timeout.as_millis())));
            }
            self.poll(left, &mut done)?;
            if let Some(c) = done.pop() {
                return c.result;
            }
        }
    }

    fn process(&mut self, done: &mut Vec<Completion>) -> Result<()> {
        while let Some(frame) = self.conn.next_frame()? {
            match frame.header {
                PduHeader::CapsuleResp(r) => {
                    let slot = active_slot(&mut self.slots, r.cqe.cid, "CapsuleResp")?;
                    let result = slot_result(slot, &r.cqe, self.qid);
                    slot.active = false;
                    done.push(Completion { tag: r.cqe.cid, result });
                }
                PduHeader::C2HData(d) => {
                    let slot = active_slot(&mut self.slots, d.cccid, "C2HData")?;
                    let Xfer::Read(len) = slot.xfer else {
                        return Err(Error::Protocol(format!("C2HData for CID {} which reads nothing", d.cccid)));
                    };
                    let (off, dl) = (d.datao as usize, d.datal as usize);
                    if off != slot.received || off + dl > len || dl != frame.data.len() {
                        return Err(Error::Protocol(format!(
                            "C2HData for CID {}: DATAO {off} DATAL {dl}, expected offset {} within {len} bytes",
                            d.cccid, slot.received
                        )));
                    }
                    slot.buf[off..off + dl].copy_from_slice(&self.conn.rx_bytes()[frame.data.clone()]);
                    slot.received += dl;
                    slot.digest_error |= !frame.data_digest_ok;
                    if d.success {
                        if !d.last || slot.received != len {
                            return Err(Error::Protocol(format!(
                                "C2HData SUCCESS for CID {} before all {len} bytes arrived (LAST_PDU {})",
                                d.cccid, d.last
                            )));
                        }
                        // SUCCESS: the command completed and no CapsuleResp follows.
                        let result = if slot.digest_error { Err(digest_error(d.cccid)) } else { Ok(0) };
                        slot.active = false;
                        done.push(Completion { tag: d.cccid, result });
                    }
                }
                PduHeader::R2T(r) => {
                    let slot = active_slot(&mut self.slots, r.cccid, "R2T")?;
                    let len = match slot.xfer {
                        Xfer::Write(n) => n,
                        _ => return Err(Error::Protocol(format!("R2T for CID {} which writes nothing", r.cccid))),
                    };
                    let (off, rl) = (r.r2to as usize, r.r2tl as usize);
                    if rl == 0 || off + rl > len {
                        return Err(Error::Protocol(format!(
                            "R2T for CID {}: R2TO {off} R2TL {rl} outside the {len}-byte write",
                            r.cccid
                        )));
                    }
                    let chunk_max = self.conn.maxh2cdata as usize;
                    let mut pos = off;
                    while pos < off + rl {
                        let n = chunk_max.min(off + rl - pos);
                        let hdr = H2CData { cccid: r.cccid, ttag: r.ttag, datao: pos as u32, datal: n as u32, last: pos + n == off + rl };
                        let data = &slot.buf[pos..pos + n];
                        encode_pdu_header(&mut self.conn.tx, &PduHeader::H2CData(hdr), n, self.conn.digests);
                        self.conn.tx.extend_from_slice(data);
                        if self.conn.digests.data {
                            self.conn.tx.extend_from_slice(&digest::data_digest(data).to_le_bytes());
                        }
                        pos += n;
                    }
                }
                other => {
                    return Err(Error::Protocol(format!("unexpected {:?} PDU on an established queue", other.pdu_type())))
                }
            }
            self.conn.consume(&frame);
        }
        Ok(())
    }

}

fn active_slot<'a>(slots: &'a mut [Slot], cid: u16, what: &str) -> Result<&'a mut Slot> {
    match slots.get_mut(cid as usize) {
        Some(s) if s.active => Ok(s),
        _ => Err(Error::Protocol(format!("{what} for CID {cid}, which has no command in flight"))),
    }
}

fn digest_error(cid: u16) -> Error {
    Error::Protocol(format!("data digest mismatch in C2HData for CID {cid}"))
}

fn slot_result(slot: &Slot, cqe: &Cqe, qid: u16) -> Result<u64> {
    if !cqe.status.is_success() {
        return Err(Error::Status { command: command_name(slot.opcode, slot.fctype, qid), status: cqe.status });
    }
    if slot.digest_error {
        return Err(digest_error(cqe.cid));
    }
    if let Xfer::Read(len) = slot.xfer {
        if slot.received != len {
            return Err(Error::Status { command: command_name(slot.opcode, slot.fctype, qid), status: short_read_status() });
        }
    }
    Ok(cqe.result)
}

/// A successful CapsuleResp for a read that did not deliver all its data is a data transfer error.
fn short_read_status() -> Status {
    Status::DATA_TRANSFER_ERROR
}

/// Readable name of a command for error messages.
pub fn command_name(opcode: u8, fctype: u8, qid: u16) -> &'static str {
    use nvmf_proto::fabrics::fctype as f;
    use nvmf_proto::nvme::admin_opcode as a;
    if opcode == a::FABRICS {
        return match fctype {
            f::CONNECT => "Connect",
            f::PROPERTY_GET => "Property Get",
            f::PROPERTY_SET => "Property Set",
            f::DISCONNECT => "Disconnect",
            f::AUTH_SEND => "AUTH_Send",
            f::AUTH_RECV => "AUTH_Receive",
            _ => "Fabrics command",
        };
    }
    if qid == 0 {
        match opcode {
            a::GET_LOG_PAGE => "Get Log Page",
            a::IDENTIFY => "Identify",
            a::SET_FEATURES => "Set Features",
            a::GET_FEATURES => "Get Features",
            a::KEEP_ALIVE => "Keep Alive",
            a::ASYNC_EVENT_REQUEST => "Asynchronous Event Request",
            _ => "Admin command",
        }
    } else {
        match opcode {
            io_opcode::READ => "Read",
            io_opcode::WRITE => "Write",
            io_opcode::FLUSH => "Flush",
            io_opcode::WRITE_ZEROES => "Write Zeroes",
            io_opcode::DATASET_MANAGEMENT => "Dataset Management",
            _ => "I/O command",
        }
    }
}

/// An I/O queue: one connection joined to a controller with Connect (qid N, the controller's
/// cntlid), carrying NVM commands for one namespace.
pub struct IoQueue {
    qp: QueuePair,
    nsid: u32,
    lba_shift: u32,
    /// Largest I/O, as asked at connect (a reconnect asks the same).
    max_io: usize,
}

/// A new connection for I/O queue `qid`, joined to the controller with Connect, in a queue pair
/// of `slots` command slots (a reconnect needs only Connect's: it keeps its own).
fn join_io_queue(params: &crate::IoQueueParams, qid: u16, depth: usize, max_io: usize, slots: usize) -> Result<QueuePair> {
    let conn = Connection::open(&params.opts, max_io as u32)?;
    let mut qp = QueuePair::new(conn, qid, slots, max_io.max(1024), params.in_capsule);
    // SQSIZE is 0's based: depth + 1 entries, so `depth` commands never fill the queue.
    crate::controller::connect_cmd(&mut qp, &params.opts, &params.subnqn, params.cntlid, depth as u16, 0)?;
    Ok(qp)
}

impl IoQueue {
    /// Connects I/O queue `qid` with `depth` command slots, each with a `max_io`-byte buffer.
    pub fn connect(params: &crate::IoQueueParams, qid: u16, depth: usize, max_io: usize) -> Result<IoQueue> {
        let qp = join_io_queue(params, qid, depth, max_io, depth.max(1))?;
        Ok(IoQueue { qp, nsid: 1, lba_shift: 9, max_io })
    }

    /// Joins the same qid to the controller `params` names (after a controller reconnect) on a
    /// new connection, and resubmits every command in flight there. Returns how many.
    pub fn reconnect(&mut self, params: &crate::IoQueueParams) -> Result<usize> {
        let fresh = join_io_queue(params, self.qp.qid(), self.qp.depth(), self.max_io, 1)?;
        self.qp.resubmit_on(fresh.conn, params.in_capsule)
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
