//! The NVMe/RDMA host queue pair as a pure machine, sans-I/O like NVMe/TCP's
//! [`crate::machine::QueueMachine`]: fed with commands and work completions, it returns the
//! verbs to post ([`Post`]) and pushes finished commands. It owns the capsule area (one SQE
//! plus in-capsule data per slot) and the receive area (one 16-byte completion per posted
//! receive); the driver (`queue::RdmaQueue`, with the `rdma` feature) registers both, registers the slots' data
//! buffers, and posts what it is told. Always built: its tests need no RDMA device.

use nvmf_proto::nvme::{CQE_LEN, SQE_LEN};
use nvmf_proto::{Cqe, Sqe};

use super::{build_command, DataPath, RemoteBuffer, SlotState};
use crate::command::{command_name, Completion, Xfer};
use crate::error::{Error, Result};
use crate::queue_transport::ProtocolMachine;

/// Receive work requests carry this bit in their ID; sends carry the slot's tag.
pub const RECV_BIT: u64 = 1 << 63;

/// A verb the driver must post.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Post {
    /// A signaled SEND of the first `len` bytes of slot `tag`'s capsule ([`RdmaMachine::capsule`]),
    /// work request ID `tag`.
    Send { tag: u16, len: usize },
    /// A receive into response buffer `index` ([`RdmaMachine::response_area`] at
    /// `index * CQE_LEN`, `CQE_LEN` bytes), work request ID `RECV_BIT | index`.
    Recv { index: usize },
}

/// A work completion as the machine reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkDone {
    pub wr_id: u64,
    pub byte_len: u32,
    /// The device's status name when the work request failed.
    pub failed: Option<String>,
}

#[derive(Debug)]
struct Slot {
    state: SlotState,
    /// The command as submitted, kept to resubmit it on a new connection after a reconnect.
    sqe: Sqe,
    xfer: Xfer,
}

/// One NVMe/RDMA queue pair's protocol state.
#[derive(Debug)]
pub struct RdmaMachine {
    qid: u16,
    in_capsule_max: usize,
    capsule_len: usize,
    slots: Vec<Slot>,
    /// One capsule per slot, at `tag * capsule_len`; never resized (the driver registers it).
    capsules: Vec<u8>,
    /// One completion per posted receive, at `i * CQE_LEN`; never resized.
    responses: Vec<u8>,
}

impl RdmaMachine {
    /// Queue `qid` with `depth` slots and `receives` receive buffers; write data up to
    /// `in_capsule_max` bytes rides in the capsule on I/O queues (none on the admin queue).
    pub fn new(qid: u16, depth: usize, receives: usize, in_capsule_max: usize) -> RdmaMachine {
        let in_capsule_max = if qid == 0 { 0 } else { in_capsule_max };
        let capsule_len = SQE_LEN + in_capsule_max;
        RdmaMachine {
            qid,
            in_capsule_max,
            capsule_len,
            slots: (0..depth).map(|_| Slot { state: SlotState::default(), sqe: Sqe::new(0, 0), xfer: Xfer::None }).collect(),
            capsules: vec![0; capsule_len * depth],
            responses: vec![0; CQE_LEN * receives],
        }
    }

    /// The receives to post before connecting: every response buffer.
    pub fn initial_receives(&self) -> impl Iterator<Item = Post> {
        (0..self.responses.len() / CQE_LEN).map(|index| Post::Recv { index })
    }

    /// The capsule area, for the driver to register.
    pub fn capsule_area(&mut self) -> &mut [u8] {
        &mut self.capsules
    }

    /// The receive area, for the driver to register.
    pub fn response_area(&mut self) -> &mut [u8] {
        &mut self.responses
    }

    /// Slot `tag`'s capsule (where a [`Post::Send`] starts).
    pub fn capsule(&mut self, tag: u16) -> &mut [u8] {
        &mut self.capsules[tag as usize * self.capsule_len..][..self.capsule_len]
    }

    pub fn is_active(&self, tag: u16) -> bool {
        self.slots.get(tag as usize).is_some_and(|s| s.state.is_active())
    }

    /// Builds the capsule of a command with CID `tag` whose data is in `buf` (registered as
    /// `remote`); the SEND to post.
    pub fn submit(&mut self, tag: u16, mut sqe: Sqe, xfer: Xfer, buf: &[u8], remote: RemoteBuffer) -> Result<Post> {
        let (qid, icmax) = (self.qid, self.in_capsule_max);
        match self.slots.get(tag as usize) {
            None => return Err(Error::Unsupported(format!("tag {tag} beyond queue depth"))),
            Some(s) if s.state.is_active() => return Err(Error::Unsupported(format!("tag {tag} is already in flight"))),
            Some(_) => {}
        }
        let path = build_command(&mut sqe, tag, xfer, qid, icmax, remote)?;
        let capsule = self.capsule(tag);
        capsule[..SQE_LEN].copy_from_slice(&sqe.0);
        let data = match path {
            DataPath::InCapsule(n) => {
                capsule[SQE_LEN..SQE_LEN + n].copy_from_slice(&buf[..n]);
                n
            }
            DataPath::None | DataPath::Keyed(_) => 0,
        };
        let slot = &mut self.slots[tag as usize];
        slot.state.start();
        (slot.sqe, slot.xfer) = (sqe, xfer);
        Ok(Post::Send { tag, len: SQE_LEN + data })
    }

    /// Takes one work completion, pushing a finished command into `done`; the receive to post
    /// again, if it was one. A failed work request (flushed after a disconnect, or a transport
    /// error) ends the queue; a completion the machine never asked for is the controller's or
    /// the device's protocol error.
    pub fn completed(&mut self, wc: &WorkDone, done: &mut Vec<Completion>) -> Result<Option<Post>> {
        if let Some(status) = &wc.failed {
            return Err(Error::Io(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                format!("RDMA work request failed on queue {}: {status}", self.qid),
            )));
        }
        if wc.wr_id & RECV_BIT != 0 {
            let index = usize::try_from(wc.wr_id & !RECV_BIT).unwrap_or(usize::MAX);
            return self.response(index, wc.byte_len as usize, done).map(|()| Some(Post::Recv { index }));
        }
        let Some(slot) = usize::try_from(wc.wr_id).ok().and_then(|t| self.slots.get_mut(t)) else {
            return Err(Error::Protocol(format!("a SEND completion for tag {}, beyond queue {}'s depth", wc.wr_id, self.qid)));
        };
        if let Some(result) = slot.state.sent() {
            done.push(Completion { tag: wc.wr_id as u16, result });
        }
        Ok(None)
    }

    /// Receive buffer `index` holds a completion: record it on its slot.
    fn response(&mut self, index: usize, len: usize, done: &mut Vec<Completion>) -> Result<()> {
        let qid = self.qid;
        if index >= self.responses.len() / CQE_LEN {
            return Err(Error::Protocol(format!("a receive completion for buffer {index}, which was never posted")));
        }
        if len < CQE_LEN {
            return Err(Error::Protocol(format!("a {len}-byte response on queue {qid} (a completion has {CQE_LEN})")));
        }
        let cqe = Cqe::decode(self.responses[index * CQE_LEN..][..CQE_LEN].try_into().expect("16 bytes"));
        let Some(slot) = self.slots.get_mut(cqe.cid as usize) else {
            return Err(Error::Protocol(format!("a completion for CID {} beyond queue {qid}'s depth", cqe.cid)));
        };
        let result = if cqe.status.is_success() {
            Ok(cqe.result)
        } else {
            Err(Error::Status { command: command_name(slot.sqe.opcode(), slot.sqe.fctype(), qid), status: cqe.status })
        };
        if let Some(result) = slot.state.respond(result, cqe.cid, qid)? {
            done.push(Completion { tag: cqe.cid, result });
        }
        Ok(())
    }

    /// The commands in flight (tag, SQE, transfer), each now idle, to be submitted again on a
    /// fresh connection after a reconnect.
    pub fn take_in_flight(&mut self) -> Vec<(u16, Sqe, Xfer)> {
        let mut v = Vec::new();
        for (tag, slot) in self.slots.iter_mut().enumerate() {
            if slot.state.is_active() {
                slot.state.abort();
                v.push((tag as u16, slot.sqe, slot.xfer));
            }
        }
        v
    }
}

impl ProtocolMachine for RdmaMachine {
    fn qid(&self) -> u16 {
        self.qid
    }

    fn depth(&self) -> usize {
        self.slots.len()
    }

    fn in_capsule_max(&self) -> usize {
        self.in_capsule_max
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvmf_proto::nvme::io_opcode;
    use nvmf_proto::rdma::keyed_sgl;
    use nvmf_proto::Status;

    const REMOTE: RemoteBuffer = RemoteBuffer { addr: 0x1000_0000, len: 8192, rkey: 0x77 };

    fn machine() -> RdmaMachine {
        RdmaMachine::new(1, 4, 8, 4096)
    }

    /// The controller's response to `cid` landing in receive buffer `index`.
    fn respond(m: &mut RdmaMachine, index: usize, cid: u16, status: Status, done: &mut Vec<Completion>) -> Result<Option<Post>> {
        let cqe = Cqe { result: 0x55, cid, status, ..Default::default() };
        m.response_area()[index * CQE_LEN..][..CQE_LEN].copy_from_slice(&cqe.encode());
        m.completed(&WorkDone { wr_id: RECV_BIT | index as u64, byte_len: CQE_LEN as u32, failed: None }, done)
    }

    fn sent(m: &mut RdmaMachine, tag: u16, done: &mut Vec<Completion>) -> Result<Option<Post>> {
        m.completed(&WorkDone { wr_id: tag as u64, byte_len: 0, failed: None }, done)
    }

    #[test]
    fn every_response_buffer_is_posted_first() {
        let posts: Vec<Post> = machine().initial_receives().collect();
        assert_eq!(posts, (0..8).map(|index| Post::Recv { index }).collect::<Vec<_>>());
    }

    #[test]
    fn a_read_names_the_slot_buffer_and_finishes_on_response_and_send() {
        let mut m = machine();
        let mut done = Vec::new();
        let post = m.submit(2, Sqe::new(io_opcode::READ, 0), Xfer::Read(8192), &[], REMOTE).unwrap();
        assert_eq!(post, Post::Send { tag: 2, len: SQE_LEN }, "the SQE alone");
        let sqe = Sqe(m.capsule(2)[..SQE_LEN].try_into().unwrap());
        assert_eq!(sqe.cid(), 2);
        assert_eq!(keyed_sgl(&sqe).map(|k| (k.addr, k.len, k.key)), Some((REMOTE.addr, 8192, REMOTE.rkey)));
        assert_eq!(respond(&mut m, 5, 2, Status::SUCCESS, &mut done).unwrap(), Some(Post::Recv { index: 5 }), "buffer 5 posted again");
        assert!(done.is_empty(), "the SEND's completion is not in yet");
        assert_eq!(sent(&mut m, 2, &mut done).unwrap(), None);
        assert!(matches!(done.as_slice(), [Completion { tag: 2, result: Ok(0x55) }]));
        assert!(!m.is_active(2));
    }

    #[test]
    fn a_small_write_rides_in_the_capsule() {
        let mut m = machine();
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        let post = m.submit(0, Sqe::new(io_opcode::WRITE, 0), Xfer::Write(4096), &data, REMOTE).unwrap();
        assert_eq!(post, Post::Send { tag: 0, len: SQE_LEN + 4096 });
        assert_eq!(&m.capsule(0)[SQE_LEN..], &data[..]);
        let mut done = Vec::new();
        sent(&mut m, 0, &mut done).unwrap();
        respond(&mut m, 0, 0, Status::SUCCESS, &mut done).unwrap();
        assert!(matches!(done.as_slice(), [Completion { tag: 0, result: Ok(_) }]));
    }

    #[test]
    fn an_error_status_fails_the_command_by_name() {
        let mut m = machine();
        let mut done = Vec::new();
        m.submit(1, Sqe::new(io_opcode::WRITE, 0), Xfer::Write(8192), &[0; 8192], REMOTE).unwrap();
        sent(&mut m, 1, &mut done).unwrap();
        respond(&mut m, 3, 1, Status::from_u16(0x0004), &mut done).unwrap();
        match done.as_slice() {
            [Completion { tag: 1, result: Err(Error::Status { command, status }) }] => {
                assert_eq!((*command, status.to_u16()), ("Write", 0x0004));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn hostile_and_unknown_completions_are_errors_not_panics() {
        let mut m = machine();
        let mut done = Vec::new();
        // A response for a CID with nothing in flight, and one beyond the depth.
        assert!(matches!(respond(&mut m, 0, 3, Status::SUCCESS, &mut done), Err(Error::Protocol(_))));
        assert!(matches!(respond(&mut m, 0, 999, Status::SUCCESS, &mut done), Err(Error::Protocol(m)) if m.contains("beyond")));
        // A receive buffer never posted, a SEND for a tag that does not exist, a short response.
        let wc = |wr_id, byte_len| WorkDone { wr_id, byte_len, failed: None };
        assert!(matches!(m.completed(&wc(RECV_BIT | 8, 16), &mut done), Err(Error::Protocol(_))));
        assert!(matches!(m.completed(&wc(RECV_BIT | (u64::MAX >> 1), 16), &mut done), Err(Error::Protocol(_))));
        assert!(matches!(m.completed(&wc(4, 0), &mut done), Err(Error::Protocol(_))));
        assert!(matches!(m.completed(&wc(u64::MAX >> 1, 0), &mut done), Err(Error::Protocol(_))));
        assert!(matches!(m.completed(&wc(RECV_BIT, 15), &mut done), Err(Error::Protocol(m)) if m.contains("15-byte")));
        // A stray SEND completion for an idle slot finishes nothing.
        assert_eq!(m.completed(&wc(0, 0), &mut done).unwrap(), None);
        // A failed work request ends the queue as a lost connection.
        let flushed = WorkDone { wr_id: 0, byte_len: 0, failed: Some("WR_FLUSH_ERR".into()) };
        let e = m.completed(&flushed, &mut done).unwrap_err();
        assert!(e.is_connection_loss() && e.to_string().contains("WR_FLUSH_ERR"), "{e}");
        assert!(done.is_empty());
    }

    #[test]
    fn commands_in_flight_are_handed_back_for_resubmission() {
        let mut m = machine();
        let mut done = Vec::new();
        m.submit(0, Sqe::new(io_opcode::READ, 0), Xfer::Read(512), &[], REMOTE).unwrap();
        m.submit(3, Sqe::new(io_opcode::WRITE, 0), Xfer::Write(8192), &[0; 8192], REMOTE).unwrap();
        m.submit(1, Sqe::new(io_opcode::FLUSH, 0), Xfer::None, &[], REMOTE).unwrap();
        sent(&mut m, 1, &mut done).unwrap();
        respond(&mut m, 0, 1, Status::SUCCESS, &mut done).unwrap();
        assert_eq!(done.len(), 1, "the flush finished");
        assert!(matches!(m.submit(0, Sqe::new(io_opcode::READ, 0), Xfer::Read(512), &[], REMOTE), Err(Error::Unsupported(_))), "tag 0 is busy");
        let back: Vec<(u16, Xfer)> = m.take_in_flight().into_iter().map(|(t, _, x)| (t, x)).collect();
        assert_eq!(back, vec![(0, Xfer::Read(512)), (3, Xfer::Write(8192))]);
        assert!(!m.is_active(0) && !m.is_active(3));
    }
}
