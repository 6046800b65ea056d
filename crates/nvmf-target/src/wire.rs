//! The bytes between a socket and a [`crate::transport::tcp::Connection`]: plain TCP, or TLS 1.3
//! (userspace records, `nvmf-tls`) applied as a byte transform below the connection, which stays
//! sans-I/O and never knows. A port's `tls` setting picks: `none` reads the socket directly;
//! `required` expects a TLS handshake record (first byte 0x16) and refuses anything else;
//! `allowed` looks at the first byte (0x16: TLS; anything else, an ICReq's 0x00: plain).
//!
//! kTLS: where the port's setup says so ([`TlsSetup::ktls`]), the TLS ULP is attached to the
//! socket before the handshake, the handshake is read record by record (so that no byte of the
//! host's first application record is taken), and once it is done the keys go to the kernel
//! (`nvmf_tls::ktls`): from then on the socket carries plaintext like a plain one, and a
//! non-data record (an alert) ends the connection with a log line.
//!
//! [`Wire`] is a `Read`/`Write` with the socket's semantics: a read returns `WouldBlock` only
//! when the socket did (so edge-triggered readiness still works: decrypted bytes are never left
//! behind a short read while ciphertext waits in the socket), a write takes plaintext and keeps
//! the ciphertext the socket did not take yet ([`Wire::has_pending_output`]).

use crate::config::PortTls;
use crate::core::Port;
use mio::net::TcpStream;
use nvmf_tls::ktls::{self, KtlsMode, NonData};
use nvmf_tls::{PskIdentity, ServerConfig, SessionInfo, TlsSession};
use std::io::{self, ErrorKind, IoSlice, IoSliceMut, Read, Write};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

mod landing;

/// First byte of a TLS handshake record (a ClientHello).
const TLS_HANDSHAKE: u8 = 0x16;
/// Plaintext taken per write: several TLS records (16 KiB each) per send.
const MAX_WRITE: usize = 256 << 10;

/// What a TLS port's connections need.
#[derive(Clone)]
pub struct TlsSetup {
    pub config: Arc<ServerConfig>,
    /// `On`: kTLS for every TLS connection (one the kernel refuses is closed); `Auto`: kTLS
    /// where the socket takes it, else userspace records; `Off`: userspace records. The target
    /// turns `Auto` into `Off` at start when the kernel has no kTLS at all.
    pub ktls: KtlsMode,
}

/// SO_INCOMING_NAPI_ID (asm-generic's value; the libc crate does not export it).
const SO_INCOMING_NAPI_ID: libc::c_int = 56;

/// The NAPI id of the queue a socket's packets arrived on, None where the kernel cannot say.
fn napi_id(fd: std::os::fd::RawFd) -> Option<u32> {
    let mut id: u32 = 0;
    let mut len = std::mem::size_of::<u32>() as libc::socklen_t;
    // SAFETY: a valid fd, and a u32 of `len` bytes the kernel writes at most `len` of.
    let r = unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, SO_INCOMING_NAPI_ID, (&mut id as *mut u32).cast(), &mut len) };
    (r == 0).then_some(id)
}

enum State {
    Plain,
    /// A TLS port before the first byte: `required` refuses plain NVMe/TCP.
    Sniff { required: bool },
    Tls(Box<TlsWire>),
    /// TLS with the records in the kernel: the socket reads and writes plaintext.
    Ktls(Box<SessionInfo>),
}

/// Userspace records: the socket reads into the session's receive buffer, where records are
/// opened in place, and writes seal from the connection's slices straight into `out`.
struct TlsWire {
    session: TlsSession,
    /// Ciphertext the socket has not taken yet; `out_pos` of it went.
    out: Vec<u8>,
    out_pos: usize,
    /// The peer ended the stream (EOF or close_notify).
    eof: bool,
    established_logged: bool,
    /// The TLS ULP is attached: handshake reads stop at record ends, and the records go to the
    /// kernel once the handshake is done.
    kernel: bool,
}

/// A connection's socket with the port's TLS setting.
pub struct Wire {
    pub stream: TcpStream,
    state: State,
    peer: Option<SocketAddr>,
    port: Port,
    tls: Option<TlsSetup>,
}

fn refused(msg: String) -> io::Error {
    io::Error::new(ErrorKind::ConnectionAborted, msg)
}

impl Wire {
    /// Wraps an accepted socket for `port`; `tls` is the target's TLS setup (needed on `allowed`
    /// and `required` ports).
    pub fn new(stream: TcpStream, port: &Port, tls: Option<TlsSetup>) -> Wire {
        let peer = stream.peer_addr().ok();
        let state = match port.tls {
            PortTls::None => {
                port.tls_stats.plain_connections.fetch_add(1, Relaxed);
                State::Plain
            }
            PortTls::Allowed => State::Sniff { required: false },
            PortTls::Required => State::Sniff { required: true },
        };
        Wire { stream, state, peer, port: port.clone(), tls }
    }

    /// Counts the connection under its socket's NAPI id in the port's /stats (called once, when
    /// the connection leaves the acceptor: its Connect has arrived, so the kernel knows the id).
    pub fn note_napi_id(&self) {
        if let Some(id) = napi_id(self.stream.as_raw_fd()) {
            *self.port.tls_stats.napi_ids.lock().unwrap_or_else(|e| e.into_inner()).entry(id).or_default() += 1;
        }
    }

    /// The connection runs TLS (the handshake may still be going on).
    pub fn is_tls(&self) -> bool {
        matches!(self.state, State::Tls(_) | State::Ktls(_))
    }

    /// The kernel makes this connection's TLS records.
    pub fn is_ktls(&self) -> bool {
        matches!(self.state, State::Ktls(_))
    }

    /// The PSK identity of an established TLS session.
    pub fn tls_identity(&self) -> Option<&str> {
        match &self.state {
            State::Tls(t) => t.session.info().map(|i| i.identity.as_str()),
            State::Ktls(info) => Some(info.identity.as_str()),
            _ => None,
        }
    }

    /// Checks the Connect's host and subsystem against the TLS identity: false (and a log line)
    /// when they differ, so that one host's key does not let it connect as another.
    pub fn connect_matches_identity(&self, subnqn: &str, hostnqn: &str) -> bool {
        let Some(identity) = self.tls_identity() else { return true };
        match PskIdentity::parse(identity) {
            Ok(id) if id.hostnqn == hostnqn && (id.subnqn == subnqn || subnqn == crate::config::DISCOVERY_NQN) => true,
            _ => {
                self.port.tls_stats.identity_mismatches.fetch_add(1, Relaxed);
                tracing::warn!(
                    peer = ?self.peer, portid = self.port.portid, identity, hostnqn, subnqn,
                    "Connect names another host or subsystem than the TLS PSK identity; closing the connection"
                );
                false
            }
        }
    }

    /// Ciphertext is waiting for the socket to take it.
    pub fn has_pending_output(&self) -> bool {
        match &self.state {
            State::Tls(t) => t.out_pos < t.out.len(),
            _ => false,
        }
    }

    /// Decrypted bytes are waiting to be read (the socket may have none).
    pub fn has_buffered_input(&self) -> bool {
        match &self.state {
            State::Tls(t) => t.session.has_input_ready(),
            _ => false,
        }
    }

    /// Writes pending ciphertext; Ok(true) when none is left.
    pub fn flush_pending(&mut self) -> io::Result<bool> {
        match &mut self.state {
            State::Tls(t) => t.flush_out(&mut self.stream),
            _ => Ok(true),
        }
    }

    /// Decides plain or TLS from the first byte. Ok(false): no byte yet (or EOF).
    fn sniff(&mut self, required: bool) -> io::Result<bool> {
        let mut first = [0u8; 1];
        let n = loop {
            match self.stream.peek(&mut first) {
                Ok(n) => break n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        };
        if n == 0 {
            return Ok(false);
        }
        if first[0] == TLS_HANDSHAKE {
            let setup = self.tls.as_ref().ok_or_else(|| refused("TLS port without a TLS configuration".into()))?;
            let session = TlsSession::server(&setup.config).map_err(|e| refused(e.to_string()))?;
            let kernel = match setup.ktls {
                KtlsMode::Off => false,
                mode => match ktls::attach(self.stream.as_raw_fd()) {
                    Ok(()) => true,
                    Err(e) if mode == KtlsMode::On => {
                        tracing::warn!(peer = ?self.peer, portid = self.port.portid, "--ktls on: {e}; closing the connection");
                        return Err(refused(e.to_string()));
                    }
                    Err(e) => {
                        self.port.tls_stats.ktls_fallbacks.fetch_add(1, Relaxed);
                        tracing::debug!(peer = ?self.peer, "{e}: TLS records in userspace");
                        false
                    }
                },
            };
            self.state = State::Tls(Box::new(TlsWire { session, out: Vec::new(), out_pos: 0, eof: false, established_logged: false, kernel }));
        } else if required {
            self.port.tls_stats.plain_refused.fetch_add(1, Relaxed);
            tracing::warn!(
                peer = ?self.peer, portid = self.port.portid, first_byte = first[0],
                "plain NVMe/TCP (no TLS handshake) on a port that requires TLS; closing the connection"
            );
            return Err(refused("plain NVMe/TCP on a TLS-required port".into()));
        } else {
            self.port.tls_stats.plain_connections.fetch_add(1, Relaxed);
            self.state = State::Plain;
        }
        Ok(true)
    }
}

impl TlsWire {
    fn flush_out(&mut self, stream: &mut TcpStream) -> io::Result<bool> {
        while self.out_pos < self.out.len() {
            match stream.write(&self.out[self.out_pos..]) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => self.out_pos += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        self.out.clear();
        self.out_pos = 0;
        Ok(true)
    }

    /// A session failure: logged with the host it names, counted when the handshake failed,
    /// and its alert sent (after the count: a peer that reads it may look at the counters).
    fn failed(&mut self, stream: &mut TcpStream, port: &Port, peer: Option<SocketAddr>, e: nvmf_tls::TlsError, was_handshaking: bool) -> io::Error {
        let identity = self.session.offered_identity();
        let hostnqn = identity.as_deref().and_then(|i| PskIdentity::parse(i).ok()).map(|i| i.hostnqn);
        if was_handshaking {
            port.tls_stats.handshake_failures.fetch_add(1, Relaxed);
        }
        tracing::warn!(
            peer = ?peer, portid = port.portid, host = hostnqn.as_deref().unwrap_or("?"),
            identity = identity.as_deref().unwrap_or("none offered"),
            "{e}; closing the connection"
        );
        self.queue_ciphertext();
        let _ = self.flush_out(stream);
        refused(e.to_string())
    }

    fn queue_ciphertext(&mut self) {
        if self.session.has_ciphertext() {
            let c = self.session.take_ciphertext();
            self.out.extend_from_slice(&c);
        }
    }
}

impl Read for Wire {
    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        match (&self.state, bufs) {
            // One buffer (no payload landing): recv, whose kernel path is shorter than readv's
            // (measured on loopback with 72 bytes queued: 3.26 against 3.43 µs per call).
            (State::Plain, [one]) => self.stream.read(one),
            (State::Plain, bufs) => self.stream.read_vectored(bufs),
            (State::Ktls(_), bufs) => self.read_kernel(bufs),
            (_, bufs) => self.read_each(bufs),
        }
    }

    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_records(buf, false)
    }
}

impl Wire {
    /// [`Read::read`]; with `before_landing` (the bytes after a payload that lands) the socket
    /// reads stop at the end of the next record's header, so that the next payload's records
    /// can land too instead of being read here in bulk.
    fn read_records(&mut self, buf: &mut [u8], before_landing: bool) -> io::Result<usize> {
        if let State::Sniff { required } = self.state {
            if !self.sniff(required)? {
                // Nothing yet, or EOF: a plain read tells which.
                return self.stream.read(buf);
            }
        }
        let t = match &mut self.state {
            State::Tls(t) => t,
            State::Ktls(_) => return self.read_kernel(&mut [IoSliceMut::new(buf)]),
            _ => return self.stream.read(buf),
        };
        if buf.is_empty() {
            return Ok(0);
        }
        let mut done = 0;
        // A socket read returned less than it was given and ended on a record boundary: the
        // socket is empty and the host's send was whole, so what is open is all there is
        // (WouldBlock if nothing), as a plain read's short count says, and bytes that arrive
        // later raise a new edge. Reading again only to get EAGAIN was one syscall of four per
        // 4 KiB QD1 I/O (issue 40). After a partial record the rest is on its way: reading
        // again often finds it, where returning meant more sleeps at 128 KiB writes.
        let mut drained = false;
        loop {
            if t.kernel && t.session.is_established() {
                break;
            }
            if t.session.is_established() {
                match t.session.read_plaintext(&mut buf[done..]) {
                    Ok(n) => done += n,
                    Err(e) => return Err(t.failed(&mut self.stream, &self.port, self.peer, e, false)),
                }
                if done == buf.len() {
                    return Ok(done);
                }
                t.eof |= t.session.peer_closed();
            }
            if t.eof {
                return Ok(done);
            }
            if drained && t.session.buffered_input() == 0 {
                return if done > 0 { Ok(done) } else { Err(ErrorKind::WouldBlock.into()) };
            }
            // With kTLS ahead, no read may go past the record being read.
            let limit = match (t.kernel, before_landing && t.session.is_established()) {
                (true, _) => t.session.handshake_read_limit(),
                (false, true) => t.session.landing_read_limit(),
                (false, false) => usize::MAX,
            };
            let space = t.session.recv_space();
            let want = space.len().min(limit);
            match self.stream.read(&mut space[..want]) {
                Ok(0) => t.eof = true,
                Ok(n) => {
                    drained = n < want;
                    let was_handshaking = t.session.is_handshaking();
                    let fed = t.session.received(n);
                    t.queue_ciphertext();
                    if let Err(e) = fed {
                        return Err(t.failed(&mut self.stream, &self.port, self.peer, e, was_handshaking));
                    }
                    // Handshake replies go out now; a full socket keeps them pending.
                    let _ = t.flush_out(&mut self.stream);
                    if t.session.is_established() && !t.established_logged {
                        t.established_logged = true;
                        self.port.tls_stats.tls_connections.fetch_add(1, Relaxed);
                        if let Some(info) = t.session.info() {
                            tracing::debug!(peer = ?self.peer, identity = info.identity, suite = info.suite, "TLS established");
                        }
                    }
                }
                // What is decrypted is all there is for now.
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if done > 0 {
                        return Ok(done);
                    }
                    return Err(e);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.hand_to_kernel()?;
        self.read(buf)
    }

    /// The handshake is done on a socket with the TLS ULP: hands the records to the kernel.
    /// Nothing after the client's Finished was read (the reads stopped at its end), and the
    /// server's flight went out before the client could send that Finished.
    fn hand_to_kernel(&mut self) -> io::Result<()> {
        let State::Tls(t) = &mut self.state else { return Ok(()) };
        t.kernel = false;
        let fd = self.stream.as_raw_fd();
        let handed = match (t.out_pos < t.out.len(), t.session.has_input_ready()) {
            (false, false) => t.session.take_kernel_keys().map_err(|e| e.to_string()).and_then(|keys| ktls::enable(fd, &keys).map_err(|e| e.to_string())),
            _ => Err("handshake bytes are still buffered".to_string()),
        };
        let info = t.session.info().cloned();
        match (handed, info) {
            (Ok(()), Some(info)) => {
                self.port.tls_stats.ktls_connections.fetch_add(1, Relaxed);
                tracing::debug!(peer = ?self.peer, identity = info.identity, suite = info.suite, "TLS records handed to the kernel (kTLS)");
                self.state = State::Ktls(Box::new(info));
                Ok(())
            }
            (Err(e), _) => {
                // The keys may be in the kernel for one direction already: the connection
                // cannot go on in userspace.
                tracing::warn!(peer = ?self.peer, portid = self.port.portid, "kTLS: {e}; closing the connection");
                Err(refused(format!("kTLS: {e}")))
            }
            (Ok(()), None) => Err(refused("kTLS: no session information".into())),
        }
    }

    /// Reads plaintext from a kTLS socket. A record that is not application data makes the
    /// kernel answer EIO: it is read with its type, and an alert ends the stream (EOF, with a
    /// log line), NewSessionTickets are skipped, anything else is an error.
    fn read_kernel(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        loop {
            let r = match &mut *bufs {
                [one] => self.stream.read(one),
                many => self.stream.read_vectored(many),
            };
            let e = match r {
                Err(e) if e.raw_os_error() == Some(libc::EIO) => e,
                Err(e) if e.raw_os_error() == Some(libc::EBADMSG) => {
                    tracing::warn!(peer = ?self.peer, portid = self.port.portid, "kTLS: a TLS record failed authentication; closing the connection");
                    return Err(e);
                }
                other => return other,
            };
            match ktls::read_non_data(self.stream.as_raw_fd()) {
                Ok(Some(NonData::Tickets)) => continue,
                Ok(Some(record)) if record.is_close_notify() => {
                    tracing::debug!(peer = ?self.peer, "kTLS: the host sent close_notify");
                    return Ok(0);
                }
                Ok(Some(record @ NonData::Alert { .. })) => {
                    tracing::warn!(peer = ?self.peer, portid = self.port.portid, "kTLS: the host sent {}; closing the connection", record.describe());
                    return Ok(0);
                }
                Ok(Some(record)) => {
                    tracing::warn!(peer = ?self.peer, portid = self.port.portid, "kTLS: the host sent {}; closing the connection", record.describe());
                    return Err(refused(record.describe()));
                }
                Ok(None) => return Err(e),
                Err(e2) => {
                    tracing::warn!(peer = ?self.peer, portid = self.port.portid, "kTLS: cannot read a non-data record ({e2}); closing the connection");
                    return Err(e2);
                }
            }
        }
    }
}

impl Wire {
    /// Reads into several buffers in order, with [`Read::read`]'s contract: fewer bytes than
    /// they hold only when the socket had no more (edge-triggered readiness relies on it).
    /// Plain TCP is one `readv`, straight from the socket into each buffer; with TLS the bytes
    /// are decrypted into the session's buffer first and copied from there (the record layer
    /// needs a whole record before it can authenticate any of it), except where several buffers
    /// mean a payload landing in its command buffer (the first): its records land there too
    /// ([`Wire::read_landing`]).
    fn read_each(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        let mut total = 0;
        let landing = bufs.len() > 1;
        for (i, b) in bufs.iter_mut().enumerate().filter(|(_, b)| !b.is_empty()) {
            let read = if landing && i == 0 { self.read_landing(b) } else { self.read_records(b, landing) };
            match read {
                Ok(n) => {
                    total += n;
                    if n < b.len() {
                        break;
                    }
                }
                Err(e) if total > 0 && e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        Ok(total)
    }
}

impl Write for Wire {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let t = match &mut self.state {
            State::Tls(t) => t,
            // Plain, or kTLS: the kernel makes the records.
            _ => return self.stream.write_vectored(bufs),
        };
        if !t.flush_out(&mut self.stream)? {
            return Err(ErrorKind::WouldBlock.into());
        }
        if !t.session.is_established() {
            // Nothing to send before the handshake is done (the connection answers nothing
            // before ICReq, which comes after it).
            return Err(ErrorKind::WouldBlock.into());
        }
        let n = t.session.seal_vectored(bufs, MAX_WRITE, &mut t.out).map_err(|e| refused(e.to_string()))?;
        if n > 0 {
            t.flush_out(&mut self.stream)?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Port {
    /// "none", "allowed" or "required", with the record layer where TLS can be used
    /// (`required:ktls`, `allowed:userspace`).
    pub fn tls_description(&self) -> String {
        match self.records() {
            None => "none".into(),
            Some(records) => format!("{}:{records}", self.tls.name()),
        }
    }

    /// "ktls" or "userspace" on a port that takes TLS; None on a `none` port.
    pub fn records(&self) -> Option<&'static str> {
        match self.tls {
            PortTls::None => None,
            _ => Some(ktls::records_name(self.tls_stats.kernel_records.load(Relaxed))),
        }
    }
}
