//! kTLS: hands an established TLS 1.3 session's record layer to the Linux kernel
//! (`setsockopt(TCP_ULP, "tls")`, then `TLS_TX`/`TLS_RX` of linux/tls.h), so that the socket
//! reads and writes plaintext and the kernel makes and checks the records. The only part of this
//! crate that touches a socket; [`crate::boundary`] keeps the handshake from reading past it and
//! [`crate::session::TlsSession::take_kernel_keys`] gives the keys.
//!
//! Keys: OpenSSL hands out the application traffic secrets only through its keylog callback
//! (`CLIENT_TRAFFIC_SECRET_0`, `SERVER_TRAFFIC_SECRET_0`); key and IV are
//! HKDF-Expand-Label(secret, "key"/"iv", "", len) with the suite's hash (RFC 8446 7.3). The
//! record sequence numbers start at 0: no application record went through userspace and no
//! NewSessionTicket is sent (tickets are off).
//!
//! After the switch a record that is not application data (an alert, a NewSessionTicket from a
//! foreign server, a KeyUpdate) makes `read` fail with EIO until it is taken with
//! [`read_non_data`]; a record that fails authentication gives EBADMSG.

use std::ffi::{c_int, c_void};
use std::io;
use std::os::fd::RawFd;

use crate::derive::{hkdf_expand, hkdf_label};
use crate::{Secret, TlsHash};

// linux/tcp.h, linux/socket.h, linux/tls.h (declared here: the libc crate exports only part of it).
const TCP_ULP: c_int = 31;
const SOL_TLS: c_int = 282;
const TLS_TX: c_int = 1;
const TLS_RX: c_int = 2;
const TLS_1_3_VERSION: u16 = 0x0304;
const TLS_CIPHER_AES_GCM_128: u16 = 51;
const TLS_CIPHER_AES_GCM_256: u16 = 52;
/// cmsg type of a record's content type (TLS_SET_RECORD_TYPE is 1).
const TLS_GET_RECORD_TYPE: c_int = 2;
const TLS_SET_RECORD_TYPE: c_int = 1;

/// TLS record content types (RFC 8446 5.1).
pub const RECORD_ALERT: u8 = 21;
pub const RECORD_HANDSHAKE: u8 = 22;
const HANDSHAKE_NEW_SESSION_TICKET: u8 = 4;
const HANDSHAKE_KEY_UPDATE: u8 = 24;

/// `--ktls`: whether to give the record layer to the kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KtlsMode {
    /// kTLS where `setsockopt(TCP_ULP, "tls")` works, userspace records otherwise.
    #[default]
    Auto,
    /// kTLS or nothing: a kernel without it is an error.
    On,
    /// Userspace records always.
    Off,
}

impl KtlsMode {
    /// Exactly the documented words (docs/tls.md): `auto`, `on`, `off`; no aliases.
    pub fn parse(s: &str) -> Option<KtlsMode> {
        match s {
            "auto" => Some(KtlsMode::Auto),
            "on" => Some(KtlsMode::On),
            "off" => Some(KtlsMode::Off),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KtlsMode::Auto => "auto",
            KtlsMode::On => "on",
            KtlsMode::Off => "off",
        }
    }
}

impl std::fmt::Display for KtlsMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Which layer makes the records of a TLS connection: what the ready line and /stats say.
pub fn records_name(kernel: bool) -> &'static str {
    if kernel {
        "ktls"
    } else {
        "userspace"
    }
}

/// Key and IV of one direction, derived from its application traffic secret (kept for the
/// next generation: [`TrafficKeys::updated`]).
#[derive(Clone)]
pub struct TrafficKeys {
    hash: TlsHash,
    secret: Secret,
    key: Secret,
    iv: Secret,
}

impl TrafficKeys {
    /// HKDF-Expand-Label(secret, "key", "", key length) and (secret, "iv", "", 12), with the
    /// suite's hash: AES-128 for TLS_AES_128_GCM_SHA256, AES-256 for TLS_AES_256_GCM_SHA384.
    pub fn from_secret(hash: TlsHash, secret: &[u8]) -> TrafficKeys {
        let key_len = match hash {
            TlsHash::Sha256 => 16,
            TlsHash::Sha384 => 32,
        };
        let label = |name, len| hkdf_label(len, name, &[], false).expect("empty context");
        TrafficKeys {
            hash,
            secret: Secret::from_slice(secret),
            key: hkdf_expand(hash, secret, &label("key", key_len), key_len),
            iv: hkdf_expand(hash, secret, &label("iv", 12), 12),
        }
    }

    /// The keys after a KeyUpdate (RFC 8446 7.2): application_traffic_secret_N+1 =
    /// HKDF-Expand-Label(application_traffic_secret_N, "traffic upd", "", Hash.length).
    pub fn updated(&self) -> TrafficKeys {
        let len = self.hash.digest_len();
        let label = hkdf_label(len, "traffic upd", &[], false).expect("empty context");
        TrafficKeys::from_secret(self.hash, hkdf_expand(self.hash, self.secret.as_bytes(), &label, len).as_bytes())
    }

    pub fn hash(&self) -> TlsHash {
        self.hash
    }

    pub fn key(&self) -> &[u8] {
        self.key.as_bytes()
    }

    /// The 12-byte static IV; a record's nonce is it XOR the 64-bit sequence number.
    pub fn iv(&self) -> &[u8] {
        self.iv.as_bytes()
    }
}

impl std::fmt::Debug for TrafficKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TrafficKeys({})", self.hash)
    }
}

/// Both directions of an established session, as the kernel takes them.
#[derive(Debug)]
pub struct KernelKeys {
    pub tx: TrafficKeys,
    pub rx: TrafficKeys,
}

/// `struct tls12_crypto_info_aes_gcm_128` / `_256` (linux/tls.h): for TLS 1.3 the IV's first 4
/// bytes are the "salt", the other 8 the "iv", and rec_seq is the big-endian sequence number.
#[repr(C)]
struct CryptoInfo<const K: usize> {
    version: u16,
    cipher_type: u16,
    iv: [u8; 8],
    key: [u8; K],
    salt: [u8; 4],
    rec_seq: [u8; 8],
}

impl<const K: usize> CryptoInfo<K> {
    fn new(cipher_type: u16, keys: &TrafficKeys) -> Self {
        let mut c = CryptoInfo { version: TLS_1_3_VERSION, cipher_type, iv: [0; 8], key: [0; K], salt: [0; 4], rec_seq: [0; 8] };
        c.key.copy_from_slice(keys.key());
        c.salt.copy_from_slice(&keys.iv()[..4]);
        c.iv.copy_from_slice(&keys.iv()[4..]);
        c
    }

    fn set(&self, fd: RawFd, direction: c_int) -> io::Result<()> {
        setsockopt(fd, SOL_TLS, direction, (self as *const Self).cast(), std::mem::size_of::<Self>())
    }
}

impl<const K: usize> Drop for CryptoInfo<K> {
    fn drop(&mut self) {
        for b in self.key.iter_mut().chain(self.iv.iter_mut()).chain(self.salt.iter_mut()) {
            // SAFETY: a valid, exclusive reference; volatile so the wipe is not optimised away.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}

fn setsockopt(fd: RawFd, level: c_int, name: c_int, value: *const c_void, len: usize) -> io::Result<()> {
    // SAFETY: `value` points to `len` readable bytes for the duration of the call.
    let r = unsafe { libc::setsockopt(fd, level, name, value, len as libc::socklen_t) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Why the kernel did not take the record layer.
#[derive(Debug, thiserror::Error)]
pub enum KtlsError {
    /// `TCP_ULP "tls"` was refused: the kernel has no TLS ULP (module `tls` not loaded and not
    /// loadable by this process) or the socket cannot take it. Nothing changed on the socket.
    #[error("the kernel has no kTLS: setsockopt(TCP_ULP, \"tls\") failed: {0} (is the tls module loaded? modprobe tls)")]
    NoUlp(io::Error),
    /// The ULP is there but it refused the keys. `half_done`: TLS_TX went in and TLS_RX did
    /// not, so the socket cannot go on with userspace records either.
    #[error("the kernel refused the TLS 1.3 {suite} keys for {direction}: {source}")]
    Keys { suite: &'static str, direction: &'static str, source: io::Error, half_done: bool },
}

/// Attaches the TLS ULP to a connected TCP socket. It passes bytes through unchanged until
/// [`enable`] gives it keys, so a failure later can still fall back to userspace records.
pub fn attach(fd: RawFd) -> Result<(), KtlsError> {
    setsockopt(fd, libc::IPPROTO_TCP, TCP_ULP, b"tls".as_ptr().cast(), 3).map_err(KtlsError::NoUlp)
}

/// Hands both directions to the kernel at record sequence 0. The socket must have the ULP
/// ([`attach`]), and no application record may have gone through userspace.
pub fn enable(fd: RawFd, keys: &KernelKeys) -> Result<(), KtlsError> {
    let suite = keys.tx.hash().suite();
    let set = |k: &TrafficKeys, dir| match k.hash() {
        TlsHash::Sha256 => CryptoInfo::<16>::new(TLS_CIPHER_AES_GCM_128, k).set(fd, dir),
        TlsHash::Sha384 => CryptoInfo::<32>::new(TLS_CIPHER_AES_GCM_256, k).set(fd, dir),
    };
    set(&keys.tx, TLS_TX).map_err(|source| KtlsError::Keys { suite, direction: "sending (TLS_TX)", source, half_done: false })?;
    set(&keys.rx, TLS_RX).map_err(|source| KtlsError::Keys { suite, direction: "receiving (TLS_RX)", source, half_done: true })
}

/// Whether this kernel has kTLS, without a connection: `TCP_ULP "tls"` on an unconnected socket
/// fails with ENOTCONN when the ULP exists (it needs an established socket) and ENOENT when it
/// does not. Err says why not.
pub fn probe() -> Result<(), String> {
    // SAFETY: plain socket(2); the fd is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(format!("cannot make a socket to probe kTLS: {}", io::Error::last_os_error()));
    }
    let r = attach(fd);
    // SAFETY: closes the fd made above, once.
    unsafe { libc::close(fd) };
    match r {
        Ok(()) => Ok(()),
        Err(KtlsError::NoUlp(e)) if e.raw_os_error() == Some(libc::ENOTCONN) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

/// A record that is not application data, read off a kTLS socket after `read` said EIO.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NonData {
    /// NewSessionTickets only (a foreign server's; we never resume): skip and read on.
    Tickets,
    /// An alert: close_notify (0) or an error; the peer is done.
    Alert { level: u8, description: u8 },
    /// Anything else (a KeyUpdate, which the kernel here does not follow, or junk): fatal.
    Other(String),
}

impl NonData {
    /// What a log line says about it.
    pub fn describe(&self) -> String {
        match self {
            NonData::Tickets => "NewSessionTicket".into(),
            NonData::Alert { level, description } => {
                let what = match description {
                    0 => "close_notify",
                    10 => "unexpected_message",
                    20 => "bad_record_mac",
                    40 => "handshake_failure",
                    47 => "illegal_parameter",
                    50 => "decode_error",
                    51 => "decrypt_error",
                    80 => "internal_error",
                    90 => "user_canceled",
                    _ => "other",
                };
                format!("TLS alert {what} ({description}, level {level})")
            }
            NonData::Other(s) => s.clone(),
        }
    }

    /// close_notify: the peer closed in order.
    pub fn is_close_notify(&self) -> bool {
        matches!(self, NonData::Alert { description: 0, .. })
    }
}

/// Reads the non-data record the kernel holds at the head of a kTLS socket (after `read` gave
/// EIO) with its content type, and says what it is. Ok(None): nothing there (WouldBlock).
pub fn read_non_data(fd: RawFd) -> io::Result<Option<NonData>> {
    let mut body = [0u8; 16 * 1024 + 256];
    let mut iov = libc::iovec { iov_base: body.as_mut_ptr().cast(), iov_len: body.len() };
    // Room for one cmsg with a byte of data, u64-aligned as cmsghdr wants.
    let mut control = [0u64; 8];
    // SAFETY: zeroed msghdr is valid; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: a valid msghdr with valid buffers.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::WouldBlock { Ok(None) } else { Err(e) };
    }
    let n = n as usize;
    let mut content_type = None;
    // SAFETY: walking the control buffer recvmsg filled, with the libc macros.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == SOL_TLS && (*c).cmsg_type == TLS_GET_RECORD_TYPE {
                content_type = Some(*libc::CMSG_DATA(c));
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(Some(classify_non_data(content_type, &body[..n])))
}

/// What a non-data record's content type and plaintext say (bounded parsing of hostile bytes).
pub fn classify_non_data(content_type: Option<u8>, body: &[u8]) -> NonData {
    match content_type {
        Some(RECORD_ALERT) if body.len() == 2 => NonData::Alert { level: body[0], description: body[1] },
        Some(RECORD_ALERT) => NonData::Other(format!("a malformed TLS alert of {} bytes", body.len())),
        Some(RECORD_HANDSHAKE) => {
            // Handshake messages: type (1), length (3), body; only tickets are harmless here.
            let mut rest = body;
            while let [kind, a, b, c, tail @ ..] = rest {
                let len = u32::from_be_bytes([0, *a, *b, *c]) as usize;
                if *kind != HANDSHAKE_NEW_SESSION_TICKET || len > tail.len() {
                    let what = if *kind == HANDSHAKE_KEY_UPDATE { "a KeyUpdate, which kTLS here does not follow".to_string() } else { format!("TLS handshake message {kind} after the handshake") };
                    return NonData::Other(what);
                }
                rest = &tail[len..];
            }
            if rest.is_empty() && !body.is_empty() {
                NonData::Tickets
            } else {
                NonData::Other("a truncated TLS handshake record after the handshake".into())
            }
        }
        Some(t) => NonData::Other(format!("a TLS record of content type {t}")),
        None => NonData::Other("a record the kernel gave without its content type".into()),
    }
}

/// Sends close_notify on a kTLS socket (best effort, non-blocking): the record type goes in a
/// TLS_SET_RECORD_TYPE cmsg.
pub fn send_close_notify(fd: RawFd) -> io::Result<()> {
    let mut alert = [1u8, 0]; // warning, close_notify
    let mut iov = libc::iovec { iov_base: alert.as_mut_ptr().cast(), iov_len: alert.len() };
    let mut control = [0u64; 8];
    // SAFETY: zeroed msghdr is valid; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    // SAFETY: one cmsg with one byte of data fits the 64-byte buffer; CMSG_* compute inside it.
    unsafe {
        msg.msg_controllen = libc::CMSG_SPACE(1) as _;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = SOL_TLS;
        (*c).cmsg_type = TLS_SET_RECORD_TYPE;
        (*c).cmsg_len = libc::CMSG_LEN(1) as _;
        *libc::CMSG_DATA(c) = RECORD_ALERT;
    }
    // SAFETY: a valid msghdr with valid buffers.
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crypto_info_has_the_kernel_layout() {
        // sizeof(struct tls12_crypto_info_aes_gcm_128) = 40, _256 = 56 (linux/tls.h).
        assert_eq!(std::mem::size_of::<CryptoInfo<16>>(), 40);
        assert_eq!(std::mem::size_of::<CryptoInfo<32>>(), 56);
        let keys = TrafficKeys::from_secret(TlsHash::Sha256, &[7u8; 32]);
        let c = CryptoInfo::<16>::new(TLS_CIPHER_AES_GCM_128, &keys);
        assert_eq!((c.version, c.cipher_type), (0x0304, 51));
        assert_eq!([&c.salt[..], &c.iv[..]].concat(), keys.iv());
        assert_eq!(&c.key[..], keys.key());
        assert_eq!(c.rec_seq, [0; 8]);
    }

    /// RFC 8448 section 3 ("Simple 1-RTT Handshake"): the server's application traffic secret
    /// and the write key and IV derived from it.
    #[test]
    fn rfc8448_application_keys() {
        let hex = |s: &str| -> Vec<u8> {
            let s: String = s.split_whitespace().collect();
            (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
        };
        let secret = hex("a1 1a f9 f0 55 31 f8 56 ad 47 11 6b 45 a9 50 32 82 04 b4 f4 4b fb 6b 3a 4b 4f 1f 3f cb 63 16 43");
        let k = TrafficKeys::from_secret(TlsHash::Sha256, &secret);
        assert_eq!(k.key(), hex("9f 02 28 3b 6c 9c 07 ef c2 6b b9 f2 ac 92 e3 56"));
        assert_eq!(k.iv(), hex("cf 78 2b 88 dd 83 54 9a ad f1 e9 84"));
    }

    #[test]
    fn modes_parse() {
        assert_eq!(KtlsMode::parse("auto"), Some(KtlsMode::Auto));
        assert_eq!(KtlsMode::parse("on"), Some(KtlsMode::On));
        assert_eq!(KtlsMode::parse("off"), Some(KtlsMode::Off));
        // Issue 41: undocumented aliases were taken; only the documented words are.
        for word in ["kernel", "yes", "true", "no", "false", " ON ", "On", ""] {
            assert_eq!(KtlsMode::parse(word), None, "{word:?}");
        }
        assert_eq!(KtlsMode::default(), KtlsMode::Auto);
    }

    #[test]
    fn non_data_records_are_classified_with_bounds() {
        assert!(classify_non_data(Some(RECORD_ALERT), &[1, 0]).is_close_notify());
        assert_eq!(classify_non_data(Some(RECORD_ALERT), &[2, 20]), NonData::Alert { level: 2, description: 20 });
        assert!(matches!(classify_non_data(Some(RECORD_ALERT), &[2]), NonData::Other(_)));
        assert_eq!(classify_non_data(Some(RECORD_HANDSHAKE), &[4, 0, 0, 2, 9, 9, 4, 0, 0, 0]), NonData::Tickets);
        assert!(matches!(classify_non_data(Some(RECORD_HANDSHAKE), &[4, 0, 0, 9, 1]), NonData::Other(_)));
        let ku = classify_non_data(Some(RECORD_HANDSHAKE), &[24, 0, 0, 1, 0]);
        assert!(matches!(&ku, NonData::Other(s) if s.contains("KeyUpdate")));
        assert!(matches!(classify_non_data(Some(RECORD_HANDSHAKE), &[]), NonData::Other(_)));
        assert!(matches!(classify_non_data(Some(23), b"x"), NonData::Other(_)));
        assert!(matches!(classify_non_data(None, b""), NonData::Other(_)));
        assert!(NonData::Alert { level: 2, description: 51 }.describe().contains("decrypt_error"));
    }

    proptest::proptest! {
        /// Whatever a peer puts in a non-data record: a classification, never a panic.
        #[test]
        fn hostile_non_data_records_are_classified(t in proptest::option::of(0u8..=255), body in proptest::collection::vec(0u8..=255, 0..64)) {
            let d = classify_non_data(t, &body);
            proptest::prop_assert!(!d.describe().is_empty());
            if d == NonData::Tickets {
                proptest::prop_assert_eq!(t, Some(RECORD_HANDSHAKE));
            }
        }
    }

    /// On this machine the probe must agree with attaching the ULP to a real connection.
    #[test]
    fn probe_agrees_with_a_connected_socket() {
        use std::os::fd::AsRawFd;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let _s = l.accept().unwrap();
        let attached = attach(c.as_raw_fd());
        assert_eq!(probe().is_ok(), attached.is_ok(), "probe {:?}, attach {:?}", probe(), attached.err());
        if let Err(e) = probe() {
            assert!(e.contains("TCP_ULP") && e.contains("modprobe tls"), "{e}");
        }
    }
}
