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

use std::collections::VecDeque;
use std::ffi::{c_int, c_uchar, c_uint};
use std::io::{self, IoSlice, Read, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::{Arc, Mutex, OnceLock};

use foreign_types::ForeignTypeRef;
use libc::size_t;
use openssl::error::ErrorStack;
use openssl::ex_data::Index;
use openssl::ssl::{
    ClientHelloResponse, ErrorCode, Ssl, SslContext, SslContextBuilder, SslMethod, SslOptions, SslRef,
    SslSessionCacheMode, SslStream, SslVerifyMode, SslVersion,
};
use openssl_sys::{EVP_MD, SSL, SSL_CIPHER, SSL_CTX, SSL_SESSION};

use crate::channel::{AppRecords, Ready};
use crate::derive::{Derivation, IdentityVersion, PskIdentity, TlsPsk};
use crate::record::RecvBuf;
use crate::key::ConfiguredPsk;
use crate::ktls::{KernelKeys, TrafficKeys};
use crate::{Secret, TlsHash};

/// Longest PSK identity a server looks at (two 223-byte NQNs, the prefix and a SHA-384 digest fit).
pub const MAX_IDENTITY_LEN: usize = 1024;

type FindSessionCb = unsafe extern "C" fn(*mut SSL, *const c_uchar, size_t, *mut *mut SSL_SESSION) -> c_int;
type UseSessionCb =
    unsafe extern "C" fn(*mut SSL, *const EVP_MD, *mut *const c_uchar, *mut size_t, *mut *mut SSL_SESSION) -> c_int;

// OpenSSL (1.1.1 and 3.x) functions the `openssl-sys` crate does not declare: the TLS 1.3 external
// PSK callbacks and what building their SSL_SESSION takes. libssl is linked by `openssl-sys`.
extern "C" {
    fn SSL_CTX_set_psk_find_session_callback(ctx: *mut SSL_CTX, cb: Option<FindSessionCb>);
    fn SSL_CTX_set_psk_use_session_callback(ctx: *mut SSL_CTX, cb: Option<UseSessionCb>);
    fn SSL_SESSION_new() -> *mut SSL_SESSION;
    fn SSL_SESSION_free(s: *mut SSL_SESSION);
    fn SSL_SESSION_set1_master_key(s: *mut SSL_SESSION, key: *const c_uchar, len: size_t) -> c_int;
    fn SSL_SESSION_set_cipher(s: *mut SSL_SESSION, cipher: *const SSL_CIPHER) -> c_int;
    fn SSL_SESSION_set_protocol_version(s: *mut SSL_SESSION, version: c_int) -> c_int;
    fn SSL_CIPHER_find(ssl: *mut SSL, code: *const c_uchar) -> *const SSL_CIPHER;
    fn SSL_client_hello_get0_ext(ssl: *mut SSL, ext_type: c_uint, out: *mut *const c_uchar, outlen: *mut size_t) -> c_int;
    fn EVP_MD_get_size(md: *const EVP_MD) -> c_int;
}

const TLS1_3_VERSION: c_int = 0x0304;
const EXT_PRE_SHARED_KEY: c_uint = 41;
const EXT_PSK_KEY_EXCHANGE_MODES: c_uint = 45;
const PSK_DHE_KE: u8 = 1;

/// Why a session failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    /// Both sides know the identity but hold different keys (the PSK binder did not verify; on the
    /// client, the server's alert for that).
    #[error("TLS handshake failed: wrong key for PSK identity '{identity}' (the PSK binder did not verify)")]
    WrongKey { identity: String },
    /// Server: the client offered an identity this server has no key for.
    #[error("TLS handshake failed: no key for PSK identity '{identity}'")]
    UnknownIdentity { identity: String },
    /// Server: the client offered no PSK at all (certificate-based TLS, or a bare ClientHello).
    #[error("TLS handshake failed: the client offered no PSK identity ({detail})")]
    NoPsk { detail: String },
    /// Client: the server refused the handshake for the identity we offered.
    #[error("TLS handshake failed: the server refused PSK identity '{identity}' ({detail})")]
    Refused { identity: String, detail: String },
    /// The peer wants something this profile does not allow (TLS 1.2, another suite, a certificate).
    #[error("TLS handshake failed: {0}")]
    Unsupported(String),
    /// Malformed or unexpected records or messages.
    #[error("TLS protocol error: {0}")]
    Protocol(String),
    #[error("TLS session is not established yet")]
    NotEstablished,
    #[error("TLS session is closed")]
    Closed,
    #[error("TLS setup failed: {0}")]
    Setup(String),
}

impl From<ErrorStack> for TlsError {
    fn from(e: ErrorStack) -> Self {
        TlsError::Setup(e.to_string())
    }
}

/// How a server finds the TLS PSK for an identity a client offers.
pub type PskLookup = dyn Fn(&str) -> Option<TlsPsk> + Send + Sync;

/// Other TLS PSKs an identity may stand for, tried by their binder when the first does not match
/// (see [`crate::binder`]).
pub type AlternatePsks = dyn Fn(&str) -> Vec<TlsPsk> + Send + Sync;

/// Per-connection state the OpenSSL callbacks reach through the SSL's ex_data.
struct ConnState {
    client_psk: Option<TlsPsk>,
    lookup: Option<Arc<PskLookup>>,
    alternates: Option<Arc<AlternatePsks>>,
    /// Server: the ClientHello as it arrived, for the binder check among alternates (the session
    /// fills it; OpenSSL's stream gives no mutable access to the ex_data).
    hello: Arc<Mutex<crate::binder::ClientHelloCapture>>,
    /// Server: the first identity the client offered.
    offered: Option<String>,
    /// Server: the key found for it.
    selected: Option<TlsPsk>,
    /// Server: the client offered a PSK but not the psk_dhe_ke mode (only psk_ke, or none).
    no_dhe_mode: bool,
    /// The application traffic secrets from OpenSSL's keylog callback, for kTLS.
    secrets: Mutex<AppSecrets>,
}

/// `CLIENT_TRAFFIC_SECRET_0` and `SERVER_TRAFFIC_SECRET_0` of a session.
#[derive(Default)]
struct AppSecrets {
    client: Option<Secret>,
    server: Option<Secret>,
}

/// OpenSSL's keylog callback: the only way it hands out the traffic secrets kTLS needs. Lines
/// are `LABEL <client random hex> <secret hex>`; only the two application secrets are kept.
fn keylog_cb(ssl: &SslRef, line: &str) {
    let mut parts = line.split_ascii_whitespace();
    let (Some(label), Some(_random), Some(hex), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return;
    };
    let is_client = match label {
        "CLIENT_TRAFFIC_SECRET_0" => true,
        "SERVER_TRAFFIC_SECRET_0" => false,
        _ => return,
    };
    if hex.len() % 2 != 0 || hex.len() > 2 * 64 {
        return;
    }
    let bytes: Option<Vec<u8>> =
        (0..hex.len()).step_by(2).map(|i| hex.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok())).collect();
    let (Some(bytes), Ok(idx)) = (bytes, state_index()) else { return };
    if let Some(state) = ssl.ex_data(idx) {
        let mut s = state.secrets.lock().unwrap_or_else(|p| p.into_inner());
        let slot = if is_client { &mut s.client } else { &mut s.server };
        *slot = Some(Secret::new(bytes));
    }
}

fn state_index() -> Result<Index<Ssl, ConnState>, TlsError> {
    static INDEX: OnceLock<Result<Index<Ssl, ConnState>, String>> = OnceLock::new();
    INDEX
        .get_or_init(|| Ssl::new_ex_index::<ConnState>().map_err(|e| e.to_string()))
        .clone()
        .map_err(TlsError::Setup)
}

fn base_context(hash_suites: &str) -> Result<SslContextBuilder, TlsError> {
    let mut b = SslContextBuilder::new(SslMethod::tls())?;
    b.set_min_proto_version(Some(SslVersion::TLS1_3))?;
    b.set_max_proto_version(Some(SslVersion::TLS1_3))?;
    b.set_ciphersuites(hash_suites)?;
    b.set_options(SslOptions::NO_TICKET | SslOptions::NO_COMPRESSION | SslOptions::NO_RENEGOTIATION);
    b.set_num_tickets(0)?;
    b.set_max_early_data(0)?;
    b.set_session_cache_mode(SslSessionCacheMode::OFF);
    b.set_keylog_callback(keylog_cb);
    Ok(b)
}

/// What a client connects with: one TLS PSK and its identity.
pub struct ClientConfig {
    ctx: SslContext,
    psk: TlsPsk,
}

impl ClientConfig {
    pub fn new(psk: TlsPsk) -> Result<Self, TlsError> {
        // Offer only the suite whose hash is the PSK's, so that the server cannot pick one the PSK
        // cannot be used with.
        let suite = psk.hash().suite();
        ClientConfig::with_suites(psk, suite)
    }

    fn with_suites(psk: TlsPsk, suites: &str) -> Result<Self, TlsError> {
        let mut b = base_context(suites)?;
        // A server that does not take the PSK would have to authenticate with a certificate; with no
        // trust anchors configured, verification refuses it.
        b.set_verify(SslVerifyMode::PEER);
        // SAFETY: the builder's SSL_CTX is valid; the callback is a plain extern fn.
        unsafe { SSL_CTX_set_psk_use_session_callback(b.as_ptr(), Some(use_session_cb)) };
        Ok(ClientConfig { ctx: b.build(), psk })
    }

    pub fn psk(&self) -> &TlsPsk {
        &self.psk
    }
}

/// What a server accepts: any identity its lookup returns a TLS PSK for.
pub struct ServerConfig {
    ctx: SslContext,
    lookup: Arc<PskLookup>,
    alternates: Option<Arc<AlternatePsks>>,
}

impl ServerConfig {
    pub fn new(lookup: impl Fn(&str) -> Option<TlsPsk> + Send + Sync + 'static) -> Result<Self, TlsError> {
        let mut b = base_context(&format!("{}:{}", TlsHash::Sha256.suite(), TlsHash::Sha384.suite()))?;
        b.set_verify(SslVerifyMode::NONE);
        b.set_client_hello_callback(client_hello_cb);
        // SAFETY: as above.
        unsafe { SSL_CTX_set_psk_find_session_callback(b.as_ptr(), Some(find_session_cb)) };
        Ok(ServerConfig { ctx: b.build(), lookup: Arc::new(lookup), alternates: None })
    }

    /// A server with a fixed set of TLS PSKs, found by exact identity.
    pub fn with_keys(keys: Vec<TlsPsk>) -> Result<Self, TlsError> {
        ServerConfig::new(move |id| keys.iter().find(|k| k.identity() == id).cloned())
    }

    /// A server for subsystem `subnqn` that holds each allowed host's configured PSK: an offered
    /// `NVMe0R`/`NVMe1R` identity naming that host and subsystem gets the TLS PSK derived from the
    /// host's key with the identity's version. For version 1 the digest in the identity must match
    /// one derived from the key, so a host with another key is told apart before the binder is
    /// checked; the digest also tells which derivation the host used, the specification's or the
    /// older one of libnvme before 1.16 (nvme-cli's `--compat`, and what Debian trixie's nvme-cli
    /// 2.13 inserts into the keyring), and both are accepted. A version 0 identity carries no
    /// digest: it gets the derivation `compat` names.
    pub fn for_subsystem(subnqn: &str, hosts: Vec<(String, ConfiguredPsk)>, compat: bool) -> Result<Self, TlsError> {
        ServerConfig::for_subsystems(vec![subnqn.to_string()], hosts, compat)
    }

    /// [`ServerConfig::for_subsystem`] for a server that exports several subsystems (a target's
    /// port): an identity naming any of `subnqns` and a host in `hosts` is looked up.
    pub fn for_subsystems(subnqns: Vec<String>, hosts: Vec<(String, ConfiguredPsk)>, compat: bool) -> Result<Self, TlsError> {
        let hosts = Arc::new(hosts);
        let subs = Arc::new(subnqns);
        let (alt_hosts, alt_subs) = (hosts.clone(), subs.clone());
        let mut config = ServerConfig::new(move |offered| {
            let subnqns = &subs;
            let id = PskIdentity::parse(offered).ok()?;
            if !subnqns.contains(&id.subnqn) {
                return None;
            }
            let (_, key) = hosts.iter().find(|(h, _)| *h == id.hostnqn)?;
            if key.cipher_hash() != id.hash {
                return None;
            }
            let derive = |compat| TlsPsk::derive(key, &id.hostnqn, &id.subnqn, Derivation { version: id.version, compat }).ok();
            let mut psk = derive(compat)?;
            if id.version == IdentityVersion::V1 && psk.identity() != offered {
                // The other derivation, for a host whose keys libnvme derived the other way.
                if let Some(other) = derive(!compat).filter(|p| p.identity() == offered) {
                    psk = other;
                }
            }
            match id.version {
                IdentityVersion::V1 if psk.identity() != offered => {
                    // Same host and subsystem, other digest: the client holds another key. Hand
                    // OpenSSL a fresh random key, which no client can know, so that the binder
                    // fails and the error names the identity as a wrong key. (Never a fixed key:
                    // a client could compute its binder and get in.)
                    let mut junk = vec![0u8; id.hash.digest_len()];
                    openssl::rand::rand_bytes(&mut junk).ok()?;
                    TlsPsk::from_raw(offered, id.hash, &junk).ok()
                }
                _ => Some(psk),
            }
        })?;
        // A version 0 identity names no digest: the other derivation is chosen by the binder.
        config.alternates = Some(Arc::new(move |offered: &str| {
            let Ok(id) = PskIdentity::parse(offered) else { return Vec::new() };
            if id.version != IdentityVersion::V0 || !alt_subs.contains(&id.subnqn) {
                return Vec::new();
            }
            let Some((_, key)) = alt_hosts.iter().find(|(h, _)| *h == id.hostnqn) else { return Vec::new() };
            let how = Derivation { version: id.version, compat: !compat };
            TlsPsk::derive(key, &id.hostnqn, &id.subnqn, how).into_iter().collect()
        }));
        Ok(config)
    }
}

/// Reads the first identity of a ClientHello's pre_shared_key extension (RFC 8446 4.2.11).
fn first_offered_identity(ext: &[u8]) -> Option<&[u8]> {
    let ids_len = u16::from_be_bytes([*ext.first()?, *ext.get(1)?]) as usize;
    let ids = ext.get(2..2 + ids_len)?;
    let id_len = u16::from_be_bytes([*ids.first()?, *ids.get(1)?]) as usize;
    ids.get(2..2 + id_len)
}

/// An offered identity as it may go into an error or a log line: at most 64 bytes of an overlong
/// one, invalid UTF-8 replaced, control characters escaped (no line breaks or terminal escapes
/// from a peer). A well-formed NVMe identity comes out unchanged.
pub fn printable_identity(raw: &[u8]) -> String {
    let (head, more) = if raw.len() > MAX_IDENTITY_LEN { (&raw[..64], "...") } else { (raw, "") };
    let mut out = String::with_capacity(head.len() + more.len());
    for c in String::from_utf8_lossy(head).chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out.push_str(more);
    out
}

/// The body of ClientHello extension `ext_type`, if present.
fn client_hello_ext(ssl: &SslRef, ext_type: c_uint) -> Option<&[u8]> {
    let mut out: *const c_uchar = ptr::null();
    let mut len: size_t = 0;
    // SAFETY: called only from the ClientHello callback, where the SSL is valid; OpenSSL points
    // out/len into the ClientHello it holds at least as long as the callback runs, which the
    // returned borrow of `ssl` does not outlive.
    let found = unsafe { SSL_client_hello_get0_ext(ssl.as_ptr(), ext_type, &mut out, &mut len) };
    if found != 1 || out.is_null() {
        return None;
    }
    // SAFETY: see above.
    Some(unsafe { std::slice::from_raw_parts(out, len) })
}

fn client_hello_cb(ssl: &mut SslRef, _alert: &mut openssl::ssl::SslAlert) -> Result<ClientHelloResponse, ErrorStack> {
    let Ok(idx) = state_index() else { return Ok(ClientHelloResponse::SUCCESS) };
    let Some(ext) = client_hello_ext(ssl, EXT_PRE_SHARED_KEY) else { return Ok(ClientHelloResponse::SUCCESS) };
    let Some(raw) = first_offered_identity(ext) else { return Ok(ClientHelloResponse::SUCCESS) };
    // PskKeyExchangeModes: a length byte, then the modes.
    let no_dhe_mode = !client_hello_ext(ssl, EXT_PSK_KEY_EXCHANGE_MODES)
        .and_then(|m| m.get(1..1 + *m.first()? as usize))
        .is_some_and(|modes| modes.contains(&PSK_DHE_KE));
    let mut selected = match (ssl.ex_data(idx).and_then(|s| s.lookup.clone()), std::str::from_utf8(raw)) {
        (Some(lookup), Ok(id)) if raw.len() <= MAX_IDENTITY_LEN => lookup(id),
        _ => None,
    };
    // The key whose binder the client computed, where the identity leaves a choice.
    let other = match (ssl.ex_data(idx), std::str::from_utf8(raw), selected.as_ref()) {
        (Some(state), Ok(id), Some(first)) => state.alternates.as_ref().and_then(|alternates| {
            let capture = state.hello.lock().unwrap_or_else(|p| p.into_inner());
            let hello = capture.client_hello()?;
            if crate::binder::binder_matches(hello, first) {
                return None;
            }
            alternates(id).into_iter().find(|p| crate::binder::binder_matches(hello, p))
        }),
        _ => None,
    };
    if other.is_some() {
        selected = other;
    }
    let identity = printable_identity(raw);
    if let Some(psk) = &selected {
        // The suite is chosen before the PSK extension is looked at: make the PSK's the only one.
        ssl.set_ciphersuites(psk.hash().suite())?;
    }
    if let Some(state) = ssl.ex_data_mut(idx) {
        state.offered = Some(identity);
        state.selected = selected;
        state.no_dhe_mode = no_dhe_mode;
    }
    Ok(ClientHelloResponse::SUCCESS)
}

/// A TLS 1.3 SSL_SESSION carrying `psk` as its resumption secret, with the PSK's suite.
///
/// # Safety
/// `ssl` must be a valid SSL pointer.
unsafe fn psk_session(ssl: *mut SSL, psk: &TlsPsk) -> *mut SSL_SESSION {
    let code = psk.hash().suite_code();
    let cipher = SSL_CIPHER_find(ssl, code.as_ptr());
    if cipher.is_null() {
        return ptr::null_mut();
    }
    let sess = SSL_SESSION_new();
    if sess.is_null() {
        return ptr::null_mut();
    }
    let key = psk.key();
    if SSL_SESSION_set1_master_key(sess, key.as_ptr(), key.len()) != 1
        || SSL_SESSION_set_cipher(sess, cipher) != 1
        || SSL_SESSION_set_protocol_version(sess, TLS1_3_VERSION) != 1
    {
        SSL_SESSION_free(sess);
        return ptr::null_mut();
    }
    sess
}

/// Server: OpenSSL asks for the session of an offered identity. Returns 1 with `*sess` null when
/// there is none (the handshake then fails: there is no certificate to fall back on).
unsafe extern "C" fn find_session_cb(
    ssl: *mut SSL,
    identity: *const c_uchar,
    identity_len: size_t,
    sess: *mut *mut SSL_SESSION,
) -> c_int {
    catch_unwind(AssertUnwindSafe(|| {
        *sess = ptr::null_mut();
        let Ok(idx) = state_index() else { return 0 };
        let ssl_ref = SslRef::from_ptr_mut(ssl);
        let offered: &[u8] = if identity.is_null() { &[] } else { std::slice::from_raw_parts(identity, identity_len) };
        let Some(state) = ssl_ref.ex_data_mut(idx) else { return 0 };
        if offered.len() > MAX_IDENTITY_LEN {
            return 1;
        }
        let Ok(offered) = std::str::from_utf8(offered) else {
            if state.offered.is_none() {
                state.offered = Some(printable_identity(offered));
            }
            return 1;
        };
        // The ClientHello callback looked the first identity up already; other identities (or a
        // ClientHello seen without that callback) are looked up here.
        let psk = match &state.selected {
            Some(p) if p.identity() == offered => Some(p.clone()),
            _ => state.lookup.as_ref().and_then(|l| l(offered)),
        };
        if state.offered.is_none() {
            state.offered = Some(printable_identity(offered.as_bytes()));
        }
        let Some(psk) = psk else { return 1 };
        let s = psk_session(ssl, &psk);
        if s.is_null() {
            return 0;
        }
        state.selected = Some(psk);
        *sess = s;
        1
    }))
    .unwrap_or(0)
}

/// Client: OpenSSL asks for the PSK to offer (again after a HelloRetryRequest, then with `md` set
/// to the hash the chosen suite needs).
unsafe extern "C" fn use_session_cb(
    ssl: *mut SSL,
    md: *const EVP_MD,
    id: *mut *const c_uchar,
    idlen: *mut size_t,
    sess: *mut *mut SSL_SESSION,
) -> c_int {
    catch_unwind(AssertUnwindSafe(|| {
        *sess = ptr::null_mut();
        *id = ptr::null();
        *idlen = 0;
        let Ok(idx) = state_index() else { return 0 };
        let ssl_ref = SslRef::from_ptr_mut(ssl);
        let Some(psk) = ssl_ref.ex_data(idx).and_then(|s| s.client_psk.as_ref()) else { return 0 };
        if !md.is_null() && EVP_MD_get_size(md) as usize != psk.hash().digest_len() {
            return 1;
        }
        let s = psk_session(ssl, psk);
        if s.is_null() {
            return 0;
        }
        // OpenSSL copies the identity before this returns; the pointer stays valid regardless,
        // as the PSK lives in the SSL's ex_data.
        *id = psk.identity().as_ptr();
        *idlen = psk.identity().len();
        *sess = s;
        1
    }))
    .unwrap_or(0)
}

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
        self.stream.get_ref().input.len() + self.rx.unopened()
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
            dst[done..done + n].copy_from_slice(&p[..n]);
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
        if self.peer_closed {
            return Ok(false);
        }
        match app.ready(&mut self.rx) {
            Ok(Ready::Data) => {
                self.app_data_seen = true;
                Ok(true)
            }
            Ok(Ready::Empty) => Ok(false),
            Ok(Ready::PeerClosed) => {
                self.peer_closed = true;
                Ok(false)
            }
            Err((e, alert)) => {
                if let Some(d) = alert {
                    app.alert(d, &mut self.stream.get_mut().output);
                }
                self.rx.clear();
                Err(self.fail(e))
            }
        }
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

fn reasons(e: &openssl::ssl::Error) -> String {
    match e.ssl_error() {
        Some(stack) => {
            let r: Vec<String> =
                stack.errors().iter().map(|x| x.reason().unwrap_or("unknown reason").to_string()).collect();
            if r.is_empty() {
                e.to_string()
            } else {
                r.join("; ")
            }
        }
        None => e.to_string(),
    }
}

/// What the callbacks saw, for classifying a failure.
struct Snapshot {
    offered: Option<String>,
    selected: bool,
    ours: Option<String>,
    no_dhe_mode: bool,
}

/// Turns OpenSSL's failure into what the caller can act on.
fn classify(role: Role, e: &openssl::ssl::Error, snap: Snapshot) -> TlsError {
    let Snapshot { offered, selected, ours, no_dhe_mode } = snap;
    let why = reasons(e);
    let has = |s: &str| why.contains(s);
    let version = has("unsupported protocol") || has("version") || has("wrong ssl version");
    match role {
        Role::Server => match offered {
            _ if version => TlsError::Unsupported(format!("the client does not speak TLS 1.3 ({why})")),
            Some(identity) if no_dhe_mode => TlsError::Unsupported(format!(
                "the client offers PSK identity '{identity}' without the psk_dhe_ke mode; PSK without (EC)DHE is refused"
            )),
            Some(identity) if has("binder does not verify") => TlsError::WrongKey { identity },
            Some(identity) if !selected => TlsError::UnknownIdentity { identity },
            Some(_) => TlsError::Protocol(why),
            None if has("record") || has("length") || has("packet") || has("unexpected message") => TlsError::Protocol(why),
            None => TlsError::NoPsk { detail: why },
        },
        Role::Client => {
            let identity = ours.unwrap_or_default();
            // OpenSSL servers answer a binder that does not verify with illegal_parameter, GnuTLS
            // (tlshd) ones with decrypt_error; both mean the server knows the identity but its key
            // differs (an unknown identity gets handshake_failure or unknown_psk_identity).
            if has("decrypt error") || has("illegal parameter") {
                TlsError::WrongKey { identity }
            } else if version {
                TlsError::Unsupported(format!("the server does not speak TLS 1.3 ({why})"))
            } else if has("certificate") {
                TlsError::Unsupported(format!("the server did not take the PSK and offered a certificate ({why})"))
            } else if has("alert") {
                TlsError::Refused { identity, detail: why }
            } else {
                TlsError::Protocol(why)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::PskTransform;

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

    #[test]
    fn identities_are_made_printable() {
        assert_eq!(printable_identity(b"NVMe1R01 nqn.a nqn.b AAAA="), "NVMe1R01 nqn.a nqn.b AAAA=");
        assert_eq!(printable_identity(b"a\nb\x1b[2J\xff"), "a\\nb\\u{1b}[2J\u{fffd}");
        let long = vec![b'x'; MAX_IDENTITY_LEN + 1];
        assert_eq!(printable_identity(&long).len(), 67);
    }

    #[test]
    fn first_identity_parsing_is_bounded() {
        assert_eq!(first_offered_identity(&[]), None);
        assert_eq!(first_offered_identity(&[0, 5, 0, 3, b'a', b'b']), None);
        assert_eq!(first_offered_identity(&[0, 9, 0, 3, b'a', b'b', b'c', 0, 0, 0, 0]), Some(&b"abc"[..]));
        assert_eq!(first_offered_identity(&[0xff, 0xff, 0xff, 0xff]), None);
    }
}
