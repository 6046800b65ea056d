//! A TLS 1.3 PSK session as a sans-I/O byte transform: OpenSSL does the handshake, and the
//! application records are sealed and opened here ([`crate::record`]: in place, no copies).
//!
//! The session owns two byte queues instead of a socket. The layer that moves bytes:
//! - passes every chunk it receives to [`TlsSession::feed`], which returns the plaintext it
//!   decrypted (possibly none) and advances the handshake;
//! - after every call, sends what [`TlsSession::take_ciphertext`] returns (handshake messages,
//!   alerts, close_notify) to the peer;
//! - encrypts with [`TlsSession::send`] once [`TlsSession::is_established`] says so.
//!
//! A socket layer avoids the copies of `feed`/`send` with [`TlsSession::recv_space`] and
//! [`TlsSession::received`] (the socket reads into the session's receive buffer, where records
//! are opened in place), [`TlsSession::read_plaintext`], and [`TlsSession::seal_vectored`]
//! (records sealed from the caller's slices straight into its send buffer).
//!
//! What is negotiated, per the NVMe/TCP transport specification: TLS 1.3 only; PSK only (no
//! certificate: a server that is not offered a known PSK fails the handshake, and a client refuses a
//! server that answers with a certificate); key exchange `psk_dhe_ke` (OpenSSL's default; `psk_ke`
//! without (EC)DHE is not accepted, as SSL_OP_ALLOW_NO_DHE_KEX stays off); the suites
//! TLS_AES_128_GCM_SHA256 and TLS_AES_256_GCM_SHA384, the one matching the PSK's hash; no session
//! tickets, no resumption, no 0-RTT.

mod classify;
mod land;
mod psk;

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::sync::{Arc, Mutex};

use openssl::ssl::{ErrorCode, Ssl, SslStream, SslVersion};

use crate::channel::{AppRecords, Failure, Ready};
use crate::ktls::{KernelKeys, TrafficKeys};
use crate::record::RecvBuf;
use crate::TlsHash;
use classify::{classify, Snapshot};
use psk::{state_index, ConnState};

pub use crate::error::TlsError;
pub use psk::{printable_identity, AlternatePsks, ClientConfig, PskLookup, ServerConfig, MAX_IDENTITY_LEN};

/// The in-memory "socket" OpenSSL reads from and writes to.
#[derive(Default)]
struct MemIo {
    input: VecDeque<u8>,
    output: Vec<u8>,
}

impl Read for MemIo {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.input.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.input.read(buf)
    }
}

impl Write for MemIo {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.output.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

#[derive(Debug)]
enum Phase {
    Handshaking,
    Established,
    Closed,
    /// The record layer went to the kernel ([`TlsSession::take_kernel_keys`]).
    Kernel,
    Failed(TlsError),
}

/// What an established session negotiated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionInfo {
    pub identity: String,
    pub hash: TlsHash,
    pub suite: String,
}

/// One side of a TLS 1.3 PSK connection, driven over in-memory buffers.
pub struct TlsSession {
    stream: SslStream<MemIo>,
    role: Role,
    phase: Phase,
    peer_closed: bool,
    info: Option<SessionInfo>,
    /// Server with alternate PSKs: where [`TlsSession::feed_into`] keeps the ClientHello.
    hello: Option<Arc<Mutex<crate::binder::ClientHelloCapture>>>,
    /// Application data went through these records: the kernel could no longer start at
    /// sequence 0.
    app_data_seen: bool,
    /// Record boundaries of what was fed, and whether anything was fed once established: the
    /// kernel must get the stream from a record's start, with no record taken here before.
    fed: crate::boundary::RecordBoundary,
    fed_after_handshake: bool,
    /// Once established: the traffic keys until the records are ours or the kernel's.
    keys: Option<KernelKeys>,
    /// Once established: our record layer.
    app: Option<AppRecords>,
    /// Received bytes: the handshake's go to OpenSSL, records after it are opened here in place.
    rx: RecvBuf,
    /// Records being received into the reader's buffer instead ([`crate::landing`]): until
    /// they are in, nothing else is read or handed out.
    landing: Option<crate::landing::RecordLanding>,
}

impl std::fmt::Debug for TlsSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSession").field("role", &self.role).field("phase", &self.phase).field("info", &self.info).finish()
    }
}

impl TlsSession {
    /// A client session; its ClientHello is ready in [`TlsSession::take_ciphertext`] at once.
    pub fn client(config: &ClientConfig) -> Result<Self, TlsError> {
        let idx = state_index()?;
        let mut ssl = Ssl::new(&config.ctx)?;
        ssl.set_ex_data(
            idx,
            ConnState {
                client_psk: Some(config.psk.clone()),
                lookup: None,
                alternates: None,
                hello: Default::default(),
                offered: None,
                selected: None,
                no_dhe_mode: false,
                secrets: Default::default(),
            },
        );
        ssl.set_connect_state();
        let mut s = TlsSession::wrap(ssl, Role::Client)?;
        s.drive()?;
        Ok(s)
    }

    /// A server session waiting for a ClientHello.
    pub fn server(config: &ServerConfig) -> Result<Self, TlsError> {
        let idx = state_index()?;
        let mut ssl = Ssl::new(&config.ctx)?;
        let hello = Arc::new(Mutex::new(Default::default()));
        ssl.set_ex_data(
            idx,
            ConnState {
                client_psk: None,
                lookup: Some(config.lookup.clone()),
                alternates: config.alternates.clone(),
                hello: hello.clone(),
                offered: None,
                selected: None,
                no_dhe_mode: false,
                secrets: Default::default(),
            },
        );
        ssl.set_accept_state();
        let mut s = TlsSession::wrap(ssl, Role::Server)?;
        // Only a server with alternates needs the ClientHello's bytes.
        s.hello = config.alternates.is_some().then_some(hello);
        Ok(s)
    }

    fn wrap(ssl: Ssl, role: Role) -> Result<Self, TlsError> {
        let stream = SslStream::new(ssl, MemIo::default())?;
        Ok(TlsSession {
            stream,
            role,
            phase: Phase::Handshaking,
            peer_closed: false,
            info: None,
            hello: None,
            app_data_seen: false,
            fed: Default::default(),
            fed_after_handshake: false,
            keys: None,
            app: None,
            rx: RecvBuf::default(),
            landing: None,
        })
    }

    pub fn role(&self) -> Role {
        self.role
    }

    /// The handshake is done: [`TlsSession::send`] works and [`TlsSession::info`] is set.
    pub fn is_established(&self) -> bool {
        matches!(self.phase, Phase::Established)
    }

    pub fn is_handshaking(&self) -> bool {
        matches!(self.phase, Phase::Handshaking)
    }

    /// The error the session failed with, if it did.
    pub fn error(&self) -> Option<&TlsError> {
        match &self.phase {
            Phase::Failed(e) => Some(e),
            _ => None,
        }
    }

    /// The peer sent close_notify.
    pub fn peer_closed(&self) -> bool {
        self.peer_closed
    }

    pub fn info(&self) -> Option<&SessionInfo> {
        self.info.as_ref()
    }

    /// Server: the identity the client offered, once its ClientHello is in (also after a failure).
    pub fn offered_identity(&self) -> Option<String> {
        let idx = state_index().ok()?;
        self.stream.ssl().ex_data(idx).and_then(|s| s.offered.clone())
    }

    /// Ciphertext to send to the peer: handshake messages, records, alerts. Take it after every
    /// call, failures included (a failed handshake leaves the alert that tells the peer why).
    pub fn take_ciphertext(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.stream.get_mut().output)
    }

    pub fn has_ciphertext(&self) -> bool {
        !self.stream.get_ref().output.is_empty()
    }

    /// Bytes received and not yet made into records: after [`TlsSession::feed`], at most one
    /// partial record.
    pub fn buffered_input(&self) -> usize {
        self.stream.get_ref().input.len() + self.rx.unopened() + self.landing.as_ref().map_or(0, |l| l.held())
    }

    /// Plaintext can be read without receiving more: a record is open or whole (or broken, so
    /// that the reader finds out).
    pub fn has_input_ready(&self) -> bool {
        !self.rx.plaintext().is_empty() || !matches!(self.rx.complete_record(), Ok(None))
    }

    /// Takes ciphertext from the peer; returns the plaintext it carried. Advances the handshake
    /// (then send [`TlsSession::take_ciphertext`]). After a failure every call returns that error.
    pub fn feed(&mut self, ciphertext: &[u8]) -> Result<Vec<u8>, TlsError> {
        let mut plaintext = Vec::new();
        self.feed_into(ciphertext, &mut plaintext)?;
        Ok(plaintext)
    }

    /// [`TlsSession::feed`] appending the plaintext to `plaintext` (a buffer the caller reuses).
    pub fn feed_into(&mut self, ciphertext: &[u8], plaintext: &mut Vec<u8>) -> Result<(), TlsError> {
        self.require_open()?;
        let mut rest = ciphertext;
        while !rest.is_empty() {
            let space = self.rx.space();
            let n = space.len().min(rest.len());
            space[..n].copy_from_slice(&rest[..n]);
            rest = &rest[n..];
            self.received(n)?;
            self.drain_plaintext(plaintext)?;
        }
        Ok(())
    }

    /// Where the socket's next bytes go: read into it, then call [`TlsSession::received`]. Never
    /// empty. With kTLS ahead, read no more than the handshake's record boundary allows.
    pub fn recv_space(&mut self) -> &mut [u8] {
        self.rx.space()
    }

    /// During a handshake read record by record (kTLS ahead): how many bytes the next read may
    /// take so that it stops at a record's end.
    pub fn handshake_read_limit(&self) -> usize {
        self.fed.want()
    }

    /// `n` bytes were read into [`TlsSession::recv_space`]. During the handshake they go to
    /// OpenSSL (then send [`TlsSession::take_ciphertext`]); after it they are records to open.
    pub fn received(&mut self, n: usize) -> Result<(), TlsError> {
        self.require_open()?;
        if self.landing.is_some() && n > 0 {
            // They are the landing records' bytes, out of place: nothing can be trusted now.
            let e = TlsError::Setup("bytes read into the receive buffer while records were landing elsewhere".into());
            return Err(self.record_failed((e, Some(80))));
        }
        let (established, handshaking) = (self.is_established(), self.is_handshaking());
        let bytes = self.rx.uncommitted(n);
        if !self.app_data_seen {
            self.fed_after_handshake |= established && n > 0;
            self.fed.advance(bytes);
        }
        if !handshaking {
            self.rx.commit(n);
            return Ok(());
        }
        if let Some(hello) = &self.hello {
            hello.lock().unwrap_or_else(|p| p.into_inner()).push(bytes);
        }
        self.stream.get_mut().input.extend(bytes);
        match self.drive() {
            Ok(()) => Ok(()),
            Err(e) => {
                self.stream.get_mut().input.clear();
                Err(e)
            }
        }
    }

    /// Copies decrypted bytes into `dst`: how many, 0 when no whole record has arrived (or the
    /// peer closed: [`TlsSession::peer_closed`]).
    pub fn read_plaintext(&mut self, dst: &mut [u8]) -> Result<usize, TlsError> {
        self.require_open()?;
        let mut done = 0;
        while done < dst.len() && self.next_plaintext()? {
            let p = self.rx.plaintext();
            let n = p.len().min(dst.len() - done);
            crate::record::copy_chunked(&mut dst[done..done + n], &p[..n]);
            self.rx.consume(n);
            done += n;
        }
        Ok(done)
    }

    fn drain_plaintext(&mut self, out: &mut Vec<u8>) -> Result<(), TlsError> {
        while self.next_plaintext()? {
            out.extend_from_slice(self.rx.plaintext());
            let n = self.rx.plaintext().len();
            self.rx.consume(n);
        }
        Ok(())
    }

    /// Opens records until plaintext is ready in `rx`: false when none is (yet).
    fn next_plaintext(&mut self) -> Result<bool, TlsError> {
        let Some(app) = self.app.as_mut() else { return Ok(false) };
        if self.peer_closed || self.landing.is_some() {
            return Ok(false);
        }
        match app.ready(&mut self.rx, &mut self.stream.get_mut().output) {
            Ok(Ready::Data) => {
                self.app_data_seen = true;
                Ok(true)
            }
            Ok(Ready::Empty) => Ok(false),
            Ok(Ready::PeerClosed) => {
                self.peer_closed = true;
                Ok(false)
            }
            Err(failure) => Err(self.record_failed(failure)),
        }
    }

    /// A record broke the session: the alert owed goes out, nothing received is kept.
    fn record_failed(&mut self, (e, alert): Failure) -> TlsError {
        if let (Some(d), Some(app)) = (alert, self.app.as_mut()) {
            app.alert(d, &mut self.stream.get_mut().output);
        }
        self.rx.clear();
        self.landing = None;
        self.fail(e)
    }

    /// Ok unless failed, closed or handed to the kernel.
    fn require_open(&self) -> Result<(), TlsError> {
        match &self.phase {
            Phase::Failed(e) => Err(e.clone()),
            Phase::Closed => Err(TlsError::Closed),
            Phase::Kernel => Err(handed_over()),
            _ => Ok(()),
        }
    }

    /// Encrypts `plaintext`; returns the records together with anything else queued to send.
    pub fn send(&mut self, plaintext: &[u8]) -> Result<Vec<u8>, TlsError> {
        let mut out = Vec::new();
        self.send_into(plaintext, &mut out)?;
        Ok(out)
    }

    /// [`TlsSession::send`] appending the ciphertext to `out` (a buffer the caller reuses).
    pub fn send_into(&mut self, plaintext: &[u8], out: &mut Vec<u8>) -> Result<(), TlsError> {
        self.seal_vectored(&[IoSlice::new(plaintext)], usize::MAX, out).map(|_| ())
    }

    /// Seals up to `limit` bytes of `bufs`, in order, as records of up to 16 KiB appended to
    /// `out` (after anything else queued to send), encrypting from the slices straight into
    /// `out`; returns how many plaintext bytes were taken.
    pub fn seal_vectored(&mut self, bufs: &[IoSlice<'_>], limit: usize, out: &mut Vec<u8>) -> Result<usize, TlsError> {
        self.require_established()?;
        let queued = &mut self.stream.get_mut().output;
        if out.is_empty() {
            std::mem::swap(out, queued);
        } else {
            out.append(queued);
        }
        let app = self.app.as_mut().ok_or_else(|| TlsError::Setup("no record layer".into()))?;
        let n = app.seal_vectored(bufs, limit, out)?;
        self.app_data_seen |= n > 0;
        Ok(n)
    }

    /// Ok while the session itself makes records (established, not handed to the kernel).
    fn require_established(&self) -> Result<(), TlsError> {
        match &self.phase {
            Phase::Established => Ok(()),
            Phase::Handshaking => Err(TlsError::NotEstablished),
            Phase::Closed => Err(TlsError::Closed),
            Phase::Kernel => Err(handed_over()),
            Phase::Failed(e) => Err(e.clone()),
        }
    }

    /// Sends close_notify; returns the bytes to send. The session takes no more data.
    pub fn close(&mut self) -> Vec<u8> {
        match (&self.phase, self.app.as_mut()) {
            (Phase::Established, Some(app)) => app.alert(0, &mut self.stream.get_mut().output),
            (Phase::Handshaking, _) => {
                let _ = self.stream.shutdown();
            }
            _ => return self.take_ciphertext(),
        }
        self.phase = Phase::Closed;
        self.take_ciphertext()
    }

    /// Gives the record layer to the kernel: the traffic keys of both directions (tx is ours,
    /// rx the peer's), for record sequence 0. Refused unless the session is established, no
    /// application data went through it, no received byte is left over and no handshake output
    /// is waiting to be sent: then the kernel would miss or repeat a record. For that the input
    /// must have been fed record by record ([`crate::boundary::RecordBoundary`]): whole records
    /// fed in one piece after the last handshake record cannot be told apart here. After this the
    /// session makes no records (`send`/`feed` fail); [`TlsSession::info`] stays.
    pub fn take_kernel_keys(&mut self) -> Result<KernelKeys, TlsError> {
        self.require_established()?;
        let refuse = |why: &str| Err(TlsError::Setup(format!("cannot hand the records to the kernel: {why}")));
        if self.app_data_seen || self.peer_closed {
            return refuse("application records already went through userspace");
        }
        if self.buffered_input() > 0 || !self.fed.at_boundary() || self.fed_after_handshake {
            return refuse("bytes after the handshake were read already");
        }
        if self.has_ciphertext() {
            return refuse("handshake output is not sent yet");
        }
        let Some(keys) = self.keys.take() else { return refuse("the traffic keys are gone") };
        self.app = None;
        self.phase = Phase::Kernel;
        Ok(keys)
    }

    /// The record layer was handed to the kernel.
    pub fn is_kernel(&self) -> bool {
        matches!(self.phase, Phase::Kernel)
    }

    fn state_snapshot(&self) -> Snapshot {
        let idx = state_index().ok();
        let st = idx.and_then(|i| self.stream.ssl().ex_data(i));
        Snapshot {
            offered: st.and_then(|s| s.offered.clone()),
            selected: st.is_some_and(|s| s.selected.is_some()),
            ours: st.and_then(|s| s.client_psk.as_ref().map(|p| p.identity().to_string())),
            no_dhe_mode: st.is_some_and(|s| s.no_dhe_mode),
        }
    }

    fn fail(&mut self, e: TlsError) -> TlsError {
        self.phase = Phase::Failed(e.clone());
        e
    }

    /// Advances the handshake over what OpenSSL was given. Once it is done, what OpenSSL did not
    /// read (the peer's first records may come with its Finished) moves to our record layer.
    fn drive(&mut self) -> Result<(), TlsError> {
        if let Phase::Handshaking = self.phase {
            match self.stream.do_handshake() {
                Ok(()) => {
                    self.established()?;
                    let left: Vec<u8> = std::mem::take(&mut self.stream.get_mut().input).into();
                    self.rx.push(&left);
                }
                Err(e) if e.code() == ErrorCode::WANT_READ => return Ok(()),
                Err(e) => {
                    let err = classify(self.role, &e, self.state_snapshot());
                    return Err(self.fail(err));
                }
            }
        }
        Ok(())
    }

    fn established(&mut self) -> Result<(), TlsError> {
        let ssl = self.stream.ssl();
        if ssl.version2() != Some(SslVersion::TLS1_3) {
            return Err(self.fail(TlsError::Unsupported("negotiated a version other than TLS 1.3".into())));
        }
        if !ssl.session_reused() {
            return Err(self.fail(TlsError::Unsupported("handshake completed without the PSK".into())));
        }
        let suite = ssl.current_cipher().map(|c| c.standard_name().unwrap_or(c.name()).to_string()).unwrap_or_default();
        let snap = self.state_snapshot();
        let identity = match self.role {
            Role::Client => snap.ours.unwrap_or_default(),
            Role::Server => snap.offered.unwrap_or_default(),
        };
        let hash = if suite.ends_with("SHA384") { TlsHash::Sha384 } else { TlsHash::Sha256 };
        let keys = match self.traffic_keys(hash) {
            Ok(k) => k,
            Err(e) => return Err(self.fail(e)),
        };
        self.app = Some(AppRecords::new(&keys)?);
        self.keys = Some(keys);
        self.info = Some(SessionInfo { identity, hash, suite });
        self.phase = Phase::Established;
        Ok(())
    }

    /// Both directions' keys (tx ours, rx the peer's) from the application traffic secrets
    /// OpenSSL's keylog callback gave.
    fn traffic_keys(&self, hash: TlsHash) -> Result<KernelKeys, TlsError> {
        let missing = |why: &str| TlsError::Setup(format!("no application traffic keys: {why}"));
        let (client, server) = {
            let idx = state_index()?;
            let state = self.stream.ssl().ex_data(idx).ok_or_else(|| missing("no session state"))?;
            let mut s = state.secrets.lock().unwrap_or_else(|p| p.into_inner());
            (s.client.take(), s.server.take())
        };
        let (Some(client), Some(server)) = (client, server) else {
            return Err(missing("OpenSSL gave no application traffic secrets (keylog callback)"));
        };
        if client.len() != hash.digest_len() || server.len() != hash.digest_len() {
            return Err(missing("the traffic secrets do not match the suite's hash"));
        }
        let (client, server) = (TrafficKeys::from_secret(hash, client.as_bytes()), TrafficKeys::from_secret(hash, server.as_bytes()));
        Ok(match self.role {
            Role::Client => KernelKeys { tx: client, rx: server },
            Role::Server => KernelKeys { tx: server, rx: client },
        })
    }
}

fn handed_over() -> TlsError {
    TlsError::Setup("the record layer was handed to the kernel (kTLS)".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::derive::{Derivation, TlsPsk};
    use crate::key::{ConfiguredPsk, PskTransform};

    /// A client offering both suites, the SHA-256 one first (as a foreign stack may), with a
    /// SHA-384 PSK: the server's ClientHello callback must narrow its suites to the PSK's.
    #[test]
    fn server_picks_the_suite_of_the_offered_psk() {
        for (t, hash) in [(PskTransform::Sha384, TlsHash::Sha384), (PskTransform::Sha256, TlsHash::Sha256)] {
            let key = ConfiguredPsk::generate(t, 0).unwrap();
            let psk = TlsPsk::derive(&key, "nqn.h", "nqn.s", Derivation::default()).unwrap();
            let both = [TlsHash::Sha256.suite(), TlsHash::Sha384.suite()];
            let order = if hash == TlsHash::Sha384 { both.join(":") } else { [both[1], both[0]].join(":") };
            let cc = ClientConfig::with_suites(psk, &order).unwrap();
            let sc = ServerConfig::for_subsystem("nqn.s", vec![("nqn.h".into(), key)], false).unwrap();
            let mut c = TlsSession::client(&cc).unwrap();
            let mut s = TlsSession::server(&sc).unwrap();
            for _ in 0..3 {
                s.feed(&c.take_ciphertext()).unwrap();
                c.feed(&s.take_ciphertext()).unwrap();
            }
            assert!(c.is_established() && s.is_established());
            assert_eq!(s.info().unwrap().suite, hash.suite());
        }
    }
}
