//! A queue pair on one connection, behind one trait: [`QueueTransport`] (in
//! [`crate::queue_transport`]) is what a transport's queue pair supplies (buffers, submit, commit,
//! poll, and moving onto a fresh connection after a reconnect), and [`QueuePair`] is what the admin queue, I/O queues ([`crate::IoQueue`]) and
//! reconnect ([`crate::Session`]) use, whatever the transport.
//!
//! NVMe/TCP's queue pair ([`TcpQueue`], here) is the sans-I/O [`QueueMachine`] (slots, PDUs,
//! digests) and the [`Link`] that moves its bytes, joined by a thin loop that sends what the
//! machine has to send (one vectored write: PDU headers and slot payloads together), receives
//! into the buffers it names (one vectored read: the rest of a payload into its slot, then the
//! receive buffer), and sleeps in the link when asked to wait. It is held inline, so the data
//! path of every NVMe/TCP benchmark is monomorphic; any other transport (NVMe/RDMA:
//! [`crate::rdma::connect_queue`]) is boxed behind the trait, and a new one is an implementation
//! of the trait plus an arm in [`QueuePair::connect`].

use std::any::Any;
use std::io::{ErrorKind, IoSlice, IoSliceMut};
use std::time::{Duration, Instant};

use nvmf_proto::{Digests, Sqe};

pub use crate::command::{command_name, Completion, Xfer};
use crate::connection::{open_link, ConnectOptions, Link, Transport};
use crate::error::{Error, Result};
pub use crate::machine::QueueMachine;
use crate::queue_transport::{wrong_transport, ProtocolMachine};
pub use crate::queue_transport::QueueTransport;

/// Slices handed to one vectored write: enough for a few dozen PDUs.
const SEND_SLICES: usize = 64;

/// A queue pair on its own connection.
pub struct QueuePair(Held);

// The TCP queue, the hot path of every benchmark, stays inline; other transports are boxed.
#[allow(clippy::large_enum_variant)]
enum Held {
    Tcp(TcpQueue),
    Boxed(Box<dyn QueueTransport>),
}

impl QueuePair {
    /// Opens queue `qid` on a new connection of `opts.transport` to `opts.addr`. `sqsize` (0's
    /// based) and `cntlid` are what its Connect will ask for: NVMe/RDMA states them already in
    /// the RDMA CM private data.
    #[allow(clippy::too_many_arguments)]
    pub fn connect(opts: &ConnectOptions, subnqn: &str, qid: u16, depth: usize, buf_len: usize, in_capsule_max: usize, sqsize: u16, cntlid: u16) -> Result<QueuePair> {
        match opts.transport {
            Transport::Tcp => QueuePair::open(open_link(opts, subnqn)?, opts, qid, depth, buf_len, in_capsule_max),
            Transport::Rdma => Ok(QueuePair::boxed(crate::rdma::connect_queue(opts, qid, depth, buf_len, in_capsule_max, sqsize, cntlid)?)),
        }
    }

    /// An NVMe/TCP queue pair on `link`, initialized (ICReq/ICResp) within `opts.timeout`.
    pub fn open(link: Box<dyn Link>, opts: &ConnectOptions, qid: u16, depth: usize, buf_len: usize, in_capsule_max: usize) -> Result<QueuePair> {
        Ok(QueuePair(Held::Tcp(TcpQueue::open(link, opts, qid, depth, buf_len, in_capsule_max)?)))
    }

    /// A queue pair of any other transport.
    pub fn boxed(q: Box<dyn QueueTransport>) -> QueuePair {
        QueuePair(Held::Boxed(q))
    }

    /// The queue behind the trait, for what is off the data path.
    fn transport(&self) -> &dyn QueueTransport {
        match &self.0 {
            Held::Tcp(q) => q,
            Held::Boxed(q) => q.as_ref(),
        }
    }

    fn transport_mut(&mut self) -> &mut dyn QueueTransport {
        match &mut self.0 {
            Held::Tcp(q) => q,
            Held::Boxed(q) => q.as_mut(),
        }
    }

    pub fn qid(&self) -> u16 {
        self.transport().qid()
    }

    pub fn depth(&self) -> usize {
        self.transport().depth()
    }

    pub fn in_capsule_max(&self) -> usize {
        self.transport().in_capsule_max()
    }

    /// The data buffer of `tag`: fill it before a write, read it after a read completes.
    pub fn buffer(&mut self, tag: u16) -> &mut [u8] {
        match &mut self.0 {
            Held::Tcp(q) => q.machine.buffer(tag),
            Held::Boxed(q) => q.buffer(tag),
        }
    }

    /// Grows `tag`'s buffer (admin commands with large data; never on the data path). A buffer
    /// that cannot grow (an RDMA registration failed) stays as it was: the command then fails
    /// with the buffer's size named.
    pub fn ensure_buffer(&mut self, tag: u16, len: usize) {
        if let Err(e) = self.transport_mut().ensure_buffer(tag, len) {
            tracing::warn!("growing tag {tag}'s buffer to {len} bytes: {e}");
        }
    }

    /// Queues a command with CID `tag`; it goes out at the next [`QueuePair::commit`] or poll
    /// (NVMe/RDMA: at once).
    pub fn submit(&mut self, tag: u16, sqe: Sqe, xfer: Xfer) -> Result<()> {
        match &mut self.0 {
            Held::Tcp(q) => q.machine.submit(tag, sqe, xfer),
            Held::Boxed(q) => q.submit(tag, sqe, xfer),
        }
    }

    /// The slots and buffer length of the fresh queue pair a reconnect joins for
    /// [`QueuePair::resubmit_on`]: see [`QueueTransport::fresh_shape`].
    pub(crate) fn fresh_shape(&self, buf_len: usize) -> (usize, usize) {
        self.transport().fresh_shape(buf_len)
    }

    /// Moves this queue onto `fresh`'s connection (already joined to the controller) and
    /// submits again every command in flight on the old one. Returns how many.
    pub(crate) fn resubmit_on(&mut self, fresh: QueuePair, in_capsule_max: usize) -> Result<usize> {
        let fresh = match fresh.0 {
            Held::Tcp(f) => Box::new(f) as Box<dyn QueueTransport>,
            Held::Boxed(f) => f,
        };
        self.transport_mut().resubmit_on(fresh.into_any(), in_capsule_max)
    }

    /// Sends what is queued without waiting (the rest goes out during polls).
    pub fn commit(&mut self) -> Result<()> {
        match &mut self.0 {
            Held::Tcp(q) => q.flush().map(|_| ()),
            Held::Boxed(q) => q.commit(),
        }
    }

    /// Processes what has arrived, pushing finished commands into `done` (cleared first).
    /// With a non-zero `wait` it sleeps up to `wait` until at least one finishes.
    pub fn poll(&mut self, wait: Duration, done: &mut Vec<Completion>) -> Result<()> {
        match &mut self.0 {
            Held::Tcp(q) => q.poll(wait, done),
            Held::Boxed(q) => q.poll(wait, done),
        }
    }

    /// Submits one command on tag 0 and waits for it (admin commands, simple tools).
    pub fn execute(&mut self, sqe: Sqe, xfer: Xfer, timeout: Duration) -> Result<u64> {
        let name = command_name(sqe.opcode(), sqe.fctype(), self.qid());
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
}

/// An NVMe/TCP queue pair: the protocol machine and the link that moves its bytes.
pub struct TcpQueue {
    link: Box<dyn Link>,
    machine: QueueMachine,
    /// The last read returned fewer bytes than asked: the socket was empty then, so a read
    /// before the next wait would most likely find nothing (EAGAIN, a syscall per I/O at QD1).
    drained: bool,
}

/// A plain connection closed or reset before the ICResp is what a port that requires TLS does to
/// a host that starts with ICReq (ours and nvmet alike send no answer), so say so. Still a
/// connection loss ([`Error::is_connection_loss`]), as before.
fn plain_refusal_hint(e: Error) -> Error {
    let cause = match &e {
        Error::Closed => "closed".to_string(),
        Error::Io(io) if matches!(io.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe) => io.to_string(),
        _ => return e,
    };
    Error::Io(std::io::Error::new(
        ErrorKind::ConnectionReset,
        format!(
            "the target dropped the connection before answering ICReq ({cause}): the port may require TLS (--tls), or the target is at its connection limit"
        ),
    ))
}

impl TcpQueue {
    /// Initializes a connection on `link` (ICReq/ICResp with the digests `opts` asks for,
    /// within `opts.timeout`) for queue `qid` with `depth` slots of `buf_len`-byte buffers.
    fn open(link: Box<dyn Link>, opts: &ConnectOptions, qid: u16, depth: usize, buf_len: usize, in_capsule_max: usize) -> Result<TcpQueue> {
        let digests = Digests { header: opts.hdr_digest, data: opts.data_digest };
        let mut qp = TcpQueue { link, machine: QueueMachine::new(qid, depth, buf_len, in_capsule_max, digests), drained: false };
        let deadline = Instant::now() + opts.timeout;
        let mut done = Vec::new();
        while !qp.machine.is_ready() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout("no ICResp from the target".into()));
            }
            qp.poll(left, &mut done).map_err(|e| if opts.tls.is_none() { plain_refusal_hint(e) } else { e })?;
        }
        Ok(qp)
    }

    /// Writes as much of the pending output as the link takes now. True when all went out.
    fn flush(&mut self) -> Result<bool> {
        while self.machine.has_output() {
            let mut iov = [IoSlice::new(&[]); SEND_SLICES];
            let n = self.machine.output_slices(&mut iov);
            // One slice (small I/O: everything in the send buffer) takes write(2), cheaper than writev(2).
            let sent = if n == 1 { self.link.send(&iov[0])? } else { self.link.send_vectored(&iov[..n])? };
            match sent {
                0 => return Ok(false),
                sent => self.machine.consume_output(sent),
            }
        }
        Ok(true)
    }

    /// Reads what the link has now into the buffers the machine names; the byte count.
    fn fill(&mut self) -> Result<usize> {
        // While large reads stream in, a read that finds nothing still takes the socket's lock,
        // and the sender's softirq then queues the payload behind it instead of delivering it:
        // asking poll(2) first spares that (128 KiB randread QD32 1.14x on loopback, bench/README.md).
        if self.machine.expects_large_input() && !self.link.readable_now()? {
            self.drained = true;
            return Ok(0);
        }
        let [landing, rx] = self.machine.input_slices();
        let asked = landing.len() + rx.len();
        // Nothing landing (small I/O): read(2), cheaper than readv(2).
        let n = if landing.is_empty() { self.link.recv(rx)? } else { self.link.recv_vectored(&mut [IoSliceMut::new(landing), IoSliceMut::new(rx)])? };
        self.drained = n < asked || n == 0;
        self.machine.received(n);
        Ok(n)
    }

    /// Processes what has arrived, pushing finished commands into `done` (cleared first).
    /// With a non-zero `wait` it sleeps in the link up to `wait` until at least one finishes.
    fn poll(&mut self, wait: Duration, done: &mut Vec<Completion>) -> Result<()> {
        done.clear();
        // No clock read when polling (wait zero): this runs once per spin of a polling job.
        let deadline = (!wait.is_zero()).then(|| Instant::now() + wait);
        // A sleeping caller whose last read came up short waits first: the wait is level-triggered
        // (data that came since wakes it at once, and a TLS link wakes for records it holds), so
        // nothing is missed, and at QD1 the EAGAIN read between send and wait goes (issue 40).
        let mut skip_read = deadline.is_some() && self.drained;
        loop {
            let initializing = !self.machine.is_ready();
            self.flush()?;
            let n = if std::mem::take(&mut skip_read) { 0 } else { self.fill()? };
            if let Err(e) = self.machine.process(done) {
                // Best effort: the H2CTermReq the machine may have queued for a framing error.
                let _ = self.flush_until(Instant::now() + Duration::from_millis(100));
                return Err(e);
            }
            if self.machine.has_output() {
                self.flush()?;
            }
            if !done.is_empty() || wait.is_zero() || initializing && self.machine.is_ready() {
                return Ok(());
            }
            if let (0, Some(deadline)) = (n, deadline) {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(());
                }
                self.link.wait(left, self.machine.has_output())?;
            }
        }
    }

    /// Flushes everything pending, sleeping as needed, until `deadline`.
    fn flush_until(&mut self, deadline: Instant) -> Result<()> {
        while !self.flush()? {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout("the target stopped reading from the socket".into()));
            }
            self.link.wait(left, true)?;
        }
        Ok(())
    }
}

impl QueueTransport for TcpQueue {
    fn machine(&self) -> &dyn ProtocolMachine {
        &self.machine
    }

    fn buffer(&mut self, tag: u16) -> &mut [u8] {
        self.machine.buffer(tag)
    }

    fn ensure_buffer(&mut self, tag: u16, len: usize) -> Result<()> {
        self.machine.ensure_buffer(tag, len);
        Ok(())
    }

    fn submit(&mut self, tag: u16, sqe: Sqe, xfer: Xfer) -> Result<()> {
        self.machine.submit(tag, sqe, xfer)
    }

    fn commit(&mut self) -> Result<()> {
        self.flush().map(|_| ())
    }

    fn poll(&mut self, wait: Duration, done: &mut Vec<Completion>) -> Result<()> {
        TcpQueue::poll(self, wait, done)
    }

    /// One slot: the machine keeps its own slots and takes over only the fresh connection's
    /// framing, whose receive buffer is sized from the buffer length.
    fn fresh_shape(&self, buf_len: usize) -> (usize, usize) {
        (1, buf_len)
    }

    fn resubmit_on(&mut self, fresh: Box<dyn Any>, in_capsule_max: usize) -> Result<usize> {
        let fresh = fresh.downcast::<TcpQueue>().map_err(|_| wrong_transport())?;
        let TcpQueue { link, machine, drained } = *fresh;
        self.link = link;
        self.drained = drained;
        self.machine.resubmit_on(machine, in_capsule_max)
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use nvmf_proto::pdu::{encode_pdu, CapsuleResp, IcResp};
    use nvmf_proto::{Cqe, PduHeader, Status};

    use super::*;

    type Shared<T> = Arc<Mutex<T>>;

    /// Bytes in memory: `now` is readable at once, each wait makes the next of `later` arrive
    /// (as a level-triggered poll would return). Logs every read and wait.
    struct Scripted {
        now: Arc<Mutex<Vec<u8>>>,
        later: Mutex<VecDeque<Vec<u8>>>,
        log: Arc<Mutex<Vec<String>>>,
    }

    impl Link for Scripted {
        fn recv(&mut self, buf: &mut [u8]) -> Result<usize> {
            let mut now = self.now.lock().unwrap();
            let n = buf.len().min(now.len());
            buf[..n].copy_from_slice(&now[..n]);
            now.drain(..n);
            self.log.lock().unwrap().push(format!("recv {n}"));
            Ok(n)
        }
        fn send(&mut self, buf: &[u8]) -> Result<usize> {
            Ok(buf.len())
        }
        fn wait(&self, _timeout: Duration, _writing: bool) -> Result<()> {
            self.log.lock().unwrap().push("wait".into());
            if let Some(chunk) = self.later.lock().unwrap().pop_front() {
                self.now.lock().unwrap().extend_from_slice(&chunk);
            }
            Ok(())
        }
    }

    fn pdu(h: PduHeader) -> Vec<u8> {
        let mut v = Vec::new();
        encode_pdu(&mut v, &h, &[], Digests::default());
        v
    }

    fn response(cid: u16) -> Vec<u8> {
        pdu(PduHeader::CapsuleResp(CapsuleResp { cqe: Cqe { cid, status: Status::SUCCESS, ..Default::default() } }))
    }

    /// A ready queue (its ICResp read whole, a short read) whose later input comes in `chunks`.
    /// Also the readable bytes, for a test to add to.
    fn queue(chunks: Vec<Vec<u8>>) -> (TcpQueue, Shared<Vec<String>>, Shared<Vec<u8>>) {
        let log = Arc::new(Mutex::new(Vec::new()));
        let icresp = pdu(PduHeader::IcResp(IcResp { pfv: 0, cpda: 0, hdgst: false, ddgst: false, maxh2cdata: 8192 }));
        let now = Arc::new(Mutex::new(icresp));
        let link = Scripted { now: now.clone(), later: Mutex::new(chunks.into()), log: log.clone() };
        let opts = ConnectOptions::new("unused", "nqn.2014-08.org.nvmexpress:uuid:test");
        let q = TcpQueue::open(Box::new(link), &opts, 1, 4, 8192, 0).unwrap();
        log.lock().unwrap().clear();
        (q, log, now)
    }

    fn poll_one(q: &mut TcpQueue, wait: Duration) -> Vec<Completion> {
        q.machine.submit(0, Sqe::new(0, 0), Xfer::None).unwrap();
        q.flush().unwrap();
        let mut done = Vec::new();
        q.poll(wait, &mut done).unwrap();
        done
    }

    #[test]
    fn a_sleeping_poll_after_a_short_read_waits_before_reading() {
        // Reading first would find nothing: at QD1 that EAGAIN read was a syscall per I/O.
        let (mut q, log, _) = queue(vec![response(0)]);
        assert_eq!(poll_one(&mut q, Duration::from_secs(1)).len(), 1);
        assert_eq!(*log.lock().unwrap(), ["wait", "recv 24"]);
    }

    #[test]
    fn a_response_split_across_reads_still_completes() {
        let r = response(0);
        let (mut q, log, _) = queue(vec![r[..10].to_vec(), r[10..].to_vec()]);
        assert_eq!(poll_one(&mut q, Duration::from_secs(1)).len(), 1);
        assert_eq!(*log.lock().unwrap(), ["wait", "recv 10", "recv 0", "wait", "recv 14"]);
    }

    #[test]
    fn a_spinning_poll_reads_without_waiting() {
        // Polling jobs never sleep, so they must read even after a short read.
        let (mut q, log, now) = queue(vec![]);
        now.lock().unwrap().extend_from_slice(&response(0));
        assert_eq!(poll_one(&mut q, Duration::ZERO).len(), 1);
        assert_eq!(*log.lock().unwrap(), ["recv 24"]);
    }
}
