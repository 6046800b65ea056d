//! The handshake's PSK side: the OpenSSL contexts a client and a server connect with
//! ([`ClientConfig`], [`ServerConfig`]), the callbacks that hand OpenSSL the TLS PSK of an offered
//! identity, and the per-connection state they share through the SSL's ex_data (the application
//! traffic secrets from the keylog callback included).

use std::ffi::{c_int, c_uchar, c_uint};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::{Arc, Mutex, OnceLock};

use foreign_types::ForeignTypeRef;
use libc::size_t;
use openssl::error::ErrorStack;
use openssl::ex_data::Index;
use openssl::ssl::{ClientHelloResponse, Ssl, SslContext, SslContextBuilder, SslMethod, SslOptions, SslRef, SslSessionCacheMode, SslVerifyMode, SslVersion};
use openssl_sys::{EVP_MD, SSL, SSL_CIPHER, SSL_CTX, SSL_SESSION};

use crate::derive::{Derivation, IdentityVersion, PskIdentity, TlsPsk};
use crate::error::TlsError;
use crate::key::ConfiguredPsk;
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

/// How a server finds the TLS PSK for an identity a client offers.
pub type PskLookup = dyn Fn(&str) -> Option<TlsPsk> + Send + Sync;

/// Other TLS PSKs an identity may stand for, tried by their binder when the first does not match
/// (see [`crate::binder`]).
pub type AlternatePsks = dyn Fn(&str) -> Vec<TlsPsk> + Send + Sync;

/// Per-connection state the OpenSSL callbacks reach through the SSL's ex_data.
pub(super) struct ConnState {
    pub(super) client_psk: Option<TlsPsk>,
    pub(super) lookup: Option<Arc<PskLookup>>,
    pub(super) alternates: Option<Arc<AlternatePsks>>,
    /// Server: the ClientHello as it arrived, for the binder check among alternates (the session
    /// fills it; OpenSSL's stream gives no mutable access to the ex_data).
    pub(super) hello: Arc<Mutex<crate::binder::ClientHelloCapture>>,
    /// Server: the first identity the client offered.
    pub(super) offered: Option<String>,
    /// Server: the key found for it.
    pub(super) selected: Option<TlsPsk>,
    /// Server: the client offered a PSK but not the psk_dhe_ke mode (only psk_ke, or none).
    pub(super) no_dhe_mode: bool,
    /// The application traffic secrets from OpenSSL's keylog callback, for kTLS.
    pub(super) secrets: Mutex<AppSecrets>,
}

/// `CLIENT_TRAFFIC_SECRET_0` and `SERVER_TRAFFIC_SECRET_0` of a session.
#[derive(Default)]
pub(super) struct AppSecrets {
    pub(super) client: Option<Secret>,
    pub(super) server: Option<Secret>,
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

pub(super) fn state_index() -> Result<Index<Ssl, ConnState>, TlsError> {
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
    pub(super) ctx: SslContext,
    pub(super) psk: TlsPsk,
}

impl ClientConfig {
    pub fn new(psk: TlsPsk) -> Result<Self, TlsError> {
        // Offer only the suite whose hash is the PSK's, so that the server cannot pick one the PSK
        // cannot be used with.
        let suite = psk.hash().suite();
        ClientConfig::with_suites(psk, suite)
    }

    pub(super) fn with_suites(psk: TlsPsk, suites: &str) -> Result<Self, TlsError> {
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
    pub(super) ctx: SslContext,
    pub(super) lookup: Arc<PskLookup>,
    pub(super) alternates: Option<Arc<AlternatePsks>>,
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


#[cfg(test)]
mod tests {
    use super::*;

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

