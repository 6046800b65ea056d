//! NVMe over RDMA on the host side: what a queue pair decides (this file) and its protocol as a
//! sans-I/O machine ([`machine::RdmaMachine`]), both with no RDMA device, always built and
//! tested; and the machine's thin driver on rdma-core (`queue::RdmaQueue`, with the `rdma`
//! cargo feature).
//!
//! The binding, per command: the SQE goes by SEND; write data of an I/O queue rides in the
//! capsule after the SQE when it fits IOCCSZ, otherwise the command names the slot's buffer with
//! a keyed SGL and the controller RDMA-READs the write data from it or RDMA-WRITEs read data into
//! it, before it SENDs the 16-byte completion (one reliable connection keeps that order, so data
//! has landed when the completion arrives). A slot is free again once both its completion and
//! its own SEND's work completion are in: only then may its capsule buffer be reused.

use nvmf_proto::nvme::SglDescriptor;
use nvmf_proto::rdma::{CmRequest, KeyedSgl, KEYED_SGL_MAX_LEN};
use nvmf_proto::Sqe;

use crate::command::Xfer;
use crate::connection::ConnectOptions;
use crate::error::{Error, Result};
use crate::queue_transport::QueueTransport;

pub mod machine;
#[cfg(feature = "rdma")]
pub mod queue;

/// The NVMe/RDMA port nvme-cli and the kernel default to.
pub const DEFAULT_PORT: u16 = 4420;

/// The CM private data of queue `qid` whose Connect will ask for SQSIZE `sqsize` (0's based):
/// the host takes as many responses at once (HRQSIZE) as it may have commands outstanding
/// (HSQSIZE + 1), as Linux's host asks.
pub fn cm_request(qid: u16, sqsize: u16, cntlid: u16) -> CmRequest {
    CmRequest { qid, hrqsize: sqsize.saturating_add(1), hsqsize: sqsize, cntlid }
}

/// Connects NVMe/RDMA queue `qid` to `opts.addr` for [`crate::QueuePair::connect`] (see
/// `queue::RdmaQueue::connect`); without the `rdma` cargo feature, an error that says how to
/// build one.
#[allow(clippy::too_many_arguments)]
pub fn connect_queue(opts: &ConnectOptions, qid: u16, depth: usize, buf_len: usize, in_capsule_max: usize, sqsize: u16, cntlid: u16) -> Result<Box<dyn QueueTransport>> {
    #[cfg(feature = "rdma")]
    {
        if opts.tls.is_some() {
            return Err(Error::Unsupported("TLS is NVMe/TCP only: it cannot be used with the rdma transport".into()));
        }
        Ok(Box::new(queue::RdmaQueue::connect(&opts.addr, opts.timeout, qid, depth, buf_len, in_capsule_max, sqsize, cntlid)?))
    }
    #[cfg(not(feature = "rdma"))]
    {
        let _ = (opts, qid, depth, buf_len, in_capsule_max, sqsize, cntlid);
        Err(Error::Unsupported(crate::connection::NO_RDMA.into()))
    }
}

/// SQSIZE (0's based) an RDMA I/O queue of `depth` slots asks for: twice its depth, at most
/// MQES's 1023. A controller posts a command's receive buffer again only once its response has
/// gone out, so a host that reuses a slot as soon as the response arrives can find no buffer
/// posted, and its SEND then waits out the RNR retry timer. Spare buffers avoid that (the
/// kernel host asks for 128 entries whatever its depth).
pub fn io_sqsize(depth: usize) -> u16 {
    (depth.max(1) * 2).min(1023) as u16
}

/// How one command's data moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataPath {
    /// No data.
    None,
    /// `n` bytes of write data follow the SQE in the capsule.
    InCapsule(usize),
    /// The controller moves `n` bytes to or from the slot's registered buffer.
    Keyed(usize),
}

/// A slot's registered data buffer as the controller names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteBuffer {
    pub addr: u64,
    pub len: usize,
    pub rkey: u32,
}

/// Chooses the data path of a command on queue `qid` and writes its CID and SGL into `sqe`.
/// In-capsule data goes on I/O queues only, up to `in_capsule_max` (from IOCCSZ): Linux's
/// nvmet-rdma takes none on the admin queue, so admin writes (Connect data too) are keyed on
/// `buf`, the slot's buffer.
pub fn build_command(sqe: &mut Sqe, tag: u16, xfer: Xfer, qid: u16, in_capsule_max: usize, buf: RemoteBuffer) -> Result<DataPath> {
    let (len, write) = match xfer {
        Xfer::None => (0, false),
        Xfer::Read(n) => (n, false),
        Xfer::Write(n) | Xfer::WriteInCapsule(n) => (n, true),
    };
    if len > buf.len {
        return Err(Error::Unsupported(format!("{len}-byte transfer exceeds the {}-byte buffer", buf.len)));
    }
    sqe.set_cid(tag);
    let path = if len == 0 {
        DataPath::None
    } else if write && qid != 0 && len <= in_capsule_max {
        DataPath::InCapsule(len)
    } else {
        DataPath::Keyed(len)
    };
    match path {
        DataPath::InCapsule(n) => sqe.set_sgl(SglDescriptor::in_capsule(0, n as u32)),
        DataPath::Keyed(n) => {
            if n > KEYED_SGL_MAX_LEN as usize {
                return Err(Error::Unsupported(format!("{n}-byte transfer exceeds a keyed SGL's 24-bit length")));
            }
            KeyedSgl { addr: buf.addr, len: n as u32, key: buf.rkey, invalidate: false }.set_in(sqe).expect("length checked");
        }
        // Linux's host names no memory the same way: a keyed SGL of length 0.
        DataPath::None => KeyedSgl { addr: 0, len: 0, key: 0, invalidate: false }.set_in(sqe).expect("zero length"),
    }
    Ok(path)
}

/// A command slot's progress. Two events finish a command, in either order: the controller's
/// response, and the work completion of the SEND that carried its capsule (until then the
/// capsule buffer may still be read by the device, so the slot cannot be reused).
#[derive(Debug, Default)]
pub struct SlotState {
    active: bool,
    sent: bool,
    response: Option<Result<u64>>,
}

impl SlotState {
    /// A command was posted on the slot.
    pub fn start(&mut self) {
        *self = SlotState { active: true, sent: false, response: None };
    }

    /// Posting failed: the slot is free again.
    pub fn abort(&mut self) {
        *self = SlotState::default();
    }

    pub fn is_active(&self) -> bool {
        self.active
    }

    /// The slot's SEND completed; the command's result when its response was already in.
    pub fn sent(&mut self) -> Option<Result<u64>> {
        self.sent = true;
        self.take_if_done()
    }

    /// The controller answered the slot's command; the result when its SEND has completed
    /// too. A response for a slot with no command in flight, or a second one, is the
    /// controller's protocol error (`cid` and `qid` name it).
    pub fn respond(&mut self, result: Result<u64>, cid: u16, qid: u16) -> Result<Option<Result<u64>>> {
        if !self.active || self.response.is_some() {
            return Err(Error::Protocol(format!("a completion for CID {cid} that is not in flight on queue {qid}")));
        }
        self.response = Some(result);
        Ok(self.take_if_done())
    }

    fn take_if_done(&mut self) -> Option<Result<u64>> {
        if self.active && self.sent && self.response.is_some() {
            self.active = false;
            return self.response.take();
        }
        None
    }
}

/// `host:port` (or `[v6]:port`, or a host alone) as RDMA CM wants it: host and port apart.
pub fn split_addr(addr: &str) -> Result<(String, u16)> {
    let bad = || Error::Unsupported(format!("{addr:?} is not an address RDMA CM can connect to (host:port)"));
    let (host, port) = match addr.rsplit_once(':') {
        // A colon in the host part is IPv6: bracketed with a port, else a bare address.
        Some((h, p)) if !h.contains(':') || h.starts_with('[') => (h, Some(p)),
        _ => (addr, None),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(bad());
    }
    let port = match port {
        Some(p) => p.parse::<u16>().map_err(|_| bad())?,
        None => DEFAULT_PORT,
    };
    Ok((host.to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvmf_proto::rdma::keyed_sgl;

    #[test]
    fn private_data_asks_for_as_many_responses_as_commands() {
        let r = cm_request(2, 127, 5);
        assert_eq!(r, CmRequest { qid: 2, hrqsize: 128, hsqsize: 127, cntlid: 5 });
        // What the target parses back, and what nvmet requires of an admin queue (HSQSIZE + 1 <= 32).
        assert_eq!(CmRequest::parse(&r.encode()), Ok(r));
        let admin = cm_request(0, 31, 0xFFFF);
        assert_eq!((admin.hrqsize, admin.depth()), (32, 32));
    }

    #[test]
    fn io_queues_ask_for_spare_receive_buffers() {
        assert_eq!(io_sqsize(8), 16);
        assert_eq!(io_sqsize(0), 2);
        assert_eq!(io_sqsize(600), 1023, "MQES bounds it");
        assert!(CmRequest::parse(&cm_request(1, io_sqsize(1000), 1).encode()).is_ok());
    }

    fn command(xfer: Xfer, qid: u16) -> (Sqe, Result<DataPath>) {
        let mut sqe = Sqe::new(0x01, 0);
        let r = build_command(&mut sqe, 7, xfer, qid, 8192, RemoteBuffer { addr: 0xDEAD_0000, len: 1 << 20, rkey: 0x1234_5678 });
        (sqe, r)
    }

    #[test]
    fn small_io_queue_writes_ride_in_the_capsule() {
        let (sqe, path) = command(Xfer::Write(4096), 1);
        assert_eq!(path.unwrap(), DataPath::InCapsule(4096));
        assert_eq!(sqe.cid(), 7);
        let sgl = sqe.sgl();
        assert_eq!((sgl.sgl_type, sgl.addr, sgl.length), (0x01, 0, 4096), "data block, offset 0");
        assert_eq!(command(Xfer::WriteInCapsule(1024), 1).1.unwrap(), DataPath::InCapsule(1024));
    }

    #[test]
    fn reads_large_writes_and_admin_writes_name_the_slot_buffer_by_key() {
        for (xfer, qid) in [(Xfer::Read(4096), 1), (Xfer::Write(8193), 1), (Xfer::WriteInCapsule(1024), 0), (Xfer::Read(1 << 20), 3)] {
            let (sqe, path) = command(xfer, qid);
            let n = match xfer {
                Xfer::Read(n) | Xfer::Write(n) | Xfer::WriteInCapsule(n) => n,
                Xfer::None => 0,
            };
            assert_eq!(path.unwrap(), DataPath::Keyed(n), "{xfer:?} on qid {qid}");
            assert_eq!(keyed_sgl(&sqe), Some(KeyedSgl { addr: 0xDEAD_0000, len: n as u32, key: 0x1234_5678, invalidate: false }));
        }
    }

    #[test]
    fn no_data_is_a_null_keyed_sgl_and_oversized_transfers_are_refused() {
        let (sqe, path) = command(Xfer::None, 1);
        assert_eq!(path.unwrap(), DataPath::None);
        assert_eq!(keyed_sgl(&sqe), Some(KeyedSgl { addr: 0, len: 0, key: 0, invalidate: false }));
        assert!(matches!(command(Xfer::Read((1 << 20) + 1), 1).1, Err(Error::Unsupported(_))));
        let mut sqe = Sqe::new(0x02, 0);
        let huge = build_command(&mut sqe, 0, Xfer::Read(16 << 20), 1, 0, RemoteBuffer { addr: 0, len: 32 << 20, rkey: 1 });
        assert!(matches!(huge, Err(Error::Unsupported(m)) if m.contains("24-bit")));
    }

    #[test]
    fn a_slot_finishes_once_both_its_response_and_its_send_are_in() {
        let mut s = SlotState::default();
        assert!(s.respond(Ok(1), 3, 1).is_err(), "a response for an idle slot");
        assert!(s.sent().is_none(), "a stray SEND completion finishes nothing");
        // Response first, then the SEND's completion.
        s.start();
        assert!(matches!(s.respond(Ok(7), 3, 1), Ok(None)));
        assert!(s.is_active());
        assert!(matches!(s.respond(Ok(8), 3, 1), Err(Error::Protocol(m)) if m.contains("CID 3")), "a second response");
        assert!(matches!(s.sent(), Some(Ok(7))));
        assert!(!s.is_active());
        // The SEND's completion first, then a failed response.
        s.start();
        assert!(s.sent().is_none());
        let st = nvmf_proto::Status::from_u16(0x0004);
        let r = s.respond(Err(Error::Status { command: "Read", status: st }), 3, 1).unwrap();
        assert!(matches!(r, Some(Err(Error::Status { .. }))));
        assert!(!s.is_active());
        s.start();
        s.abort();
        assert!(!s.is_active() && s.sent().is_none());
    }

    #[test]
    fn addresses_split_into_host_and_port() {
        assert_eq!(split_addr("10.0.0.1:4421").unwrap(), ("10.0.0.1".into(), 4421));
        assert_eq!(split_addr("10.0.0.1").unwrap(), ("10.0.0.1".into(), 4420));
        assert_eq!(split_addr("[fe80::1]:4422").unwrap(), ("fe80::1".into(), 4422));
        assert_eq!(split_addr("fe80::1").unwrap(), ("fe80::1".into(), 4420));
        assert!(split_addr("10.0.0.1:notaport").is_err());
        assert!(split_addr(":4420").is_err());
        assert!(split_addr("10.0.0.1:70000").is_err());
    }
}
