//! A queue pair on one connection: command slots indexed by CID, capsules batched into one
//! send buffer, and the receive side of NVMe/TCP (CapsuleResp, C2HData with the SUCCESS
//! optimisation, R2T answered with H2CData). Used for the admin queue (qid 0) and for I/O queues
//! ([`crate::IoQueue`]). It knows PDUs, not sockets: its connection's [`crate::connection::Link`]
//! moves the bytes.
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
