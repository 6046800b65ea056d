//! NVMe/TCP over TLS 1.3 on the host: a [`Link`] that runs the TLS PSK handshake (before ICReq)
//! and then encrypts and decrypts below the connection, which does not know (userspace records
//! through `nvmf-tls`).

use std::time::{Duration, Instant};

use nvmf_tls::{ClientConfig, ConfiguredPsk, Derivation, IdentityVersion, TlsError, TlsPsk, TlsSession};

use crate::connection::Link;
use crate::error::{Error, Result};

/// TLS settings of a connection, as nvme-cli names them: `--tls`, `--tls-key`,
/// `--tls-key-identity`.
#[derive(Debug, Clone)]
pub struct TlsOptions {
    /// The configured PSK (`NVMeTLSkey-1:HH:<base64>:`).
    pub key: ConfiguredPsk,
    /// Which PSK identity to offer: `NVMe1R<hh> ... <digest>` (default) or `NVMe0R<hh> ...`.
    pub version: IdentityVersion,
    /// libnvme's `--compat` derivation.
    pub compat: bool,
}

impl TlsOptions {
    pub fn new(key: ConfiguredPsk) -> TlsOptions {
        TlsOptions { key, version: Derivation::default().version, compat: false }
    }

    /// Parses `--tls-key`, and `--tls-key-identity` when given: a PSK identity as nvme-cli and
    /// the keyring write it (`NVMe0R01 <hostnqn> <subnqn>`, `NVMe1R01 ... <digest>`), or only its
    /// version (`0`/`1`). The identity offered is always derived from the key for the NQNs of
    /// each connection; the option picks its version and, when it names a host, must name ours.
    pub fn parse(key: &str, identity: Option<&str>, hostnqn: &str) -> std::result::Result<TlsOptions, String> {
        let key = ConfiguredPsk::parse(key).map_err(|e| format!("--tls-key: {e}"))?;
        let mut o = TlsOptions::new(key);
        if let Some(id) = identity.map(str::trim) {
            o.version = match id {
                "0" => IdentityVersion::V0,
                "1" => IdentityVersion::V1,
                _ => {
                    let p = nvmf_tls::PskIdentity::parse(id).map_err(|e| format!("--tls-key-identity {id:?}: {e}"))?;
                    if p.hostnqn != hostnqn {
                        return Err(format!("--tls-key-identity names host {} but the host NQN is {hostnqn}", p.hostnqn));
                    }
                    if p.hash != o.key.cipher_hash() {
                        return Err(format!("--tls-key-identity is for {} but the key is for {}", p.hash, o.key.cipher_hash()));
                    }
                    p.version
                }
            };
        }
        Ok(o)
    }

    /// The TLS PSK and identity for a connection from `hostnqn` to `subnqn`.
    pub fn psk(&self, hostnqn: &str, subnqn: &str) -> Result<TlsPsk> {
        TlsPsk::derive(&self.key, hostnqn, subnqn, Derivation { version: self.version, compat: self.compat })
            .map_err(|e| Error::Auth(format!("cannot derive the TLS PSK: {e}")))
    }
}

/// What a failed handshake means to the caller: the key or identity was refused (an
/// authentication failure, not worth reconnecting for) or the connection broke.
fn tls_error(e: TlsError) -> Error {
    match e {
        TlsError::WrongKey { .. } | TlsError::Refused { .. } | TlsError::UnknownIdentity { .. } | TlsError::NoPsk { .. } => {
            Error::Auth(e.to_string())
        }
        TlsError::Closed => Error::Closed,
        other => Error::Protocol(other.to_string()),
    }
}

/// A [`Link`] carrying TLS 1.3 records over another link (the TCP socket).
pub struct TlsLink {
    inner: Box<dyn Link>,
    session: TlsSession,
    plain: Vec<u8>,
    plain_pos: usize,
    out: Vec<u8>,
    out_pos: usize,
    scratch: Vec<u8>,
}

impl TlsLink {
    /// Runs the handshake on `inner` until it is established or `deadline`.
    pub fn handshake(inner: Box<dyn Link>, psk: TlsPsk, deadline: Instant) -> Result<TlsLink> {
        let config = ClientConfig::new(psk).map_err(tls_error)?;
        let session = TlsSession::client(&config).map_err(tls_error)?;
        let mut l = TlsLink {
            inner,
            session,
            plain: Vec::new(),
            plain_pos: 0,
            out: Vec::new(),
            out_pos: 0,
            scratch: vec![0; 64 << 10],
        };
        l.queue();
        loop {
            l.flush_out()?;
            if l.session.is_established() {
                return Ok(l);
            }
            let n = match l.inner.recv(&mut l.scratch) {
                Ok(n) => n,
                Err(Error::Closed) => {
                    // No alert to tell why. A kernel target (tlshd) that finds no PSK for the
                    // identity closes like this, and a version 1 identity names the key by its
                    // digest, so a wrong key looks the same as a port without TLS.
                    return Err(Error::Protocol(format!(
                        "the target closed the connection during the TLS handshake: it holds no PSK for identity '{}' \
                         (another key, or keys derived the other way: compat) or its port does not take TLS",
                        config.psk().identity()
                    )));
                }
                Err(e) => return Err(e),
            };
            if n > 0 {
                let fed = l.session.feed_into(&l.scratch[..n], &mut l.plain);
                l.queue();
                let _ = l.flush_out();
                fed.map_err(tls_error)?;
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout("no TLS handshake reply from the target".into()));
            }
            l.inner.wait(left, l.out_pos < l.out.len())?;
        }
    }

    /// The cipher suite and identity in use.
    pub fn info(&self) -> Option<&nvmf_tls::SessionInfo> {
        self.session.info()
    }

    fn queue(&mut self) {
        if self.session.has_ciphertext() {
            let c = self.session.take_ciphertext();
            self.out.extend_from_slice(&c);
        }
    }

    /// Ok(true) when all ciphertext went out.
    fn flush_out(&mut self) -> Result<bool> {
        while self.out_pos < self.out.len() {
            match self.inner.send(&self.out[self.out_pos..])? {
                0 => return Ok(false),
                n => self.out_pos += n,
            }
        }
        self.out.clear();
        self.out_pos = 0;
        Ok(true)
    }
}

impl Link for TlsLink {
    fn recv(&mut self, buf: &mut [u8]) -> Result<usize> {
        // Records the socket did not take when they were sent.
        self.flush_out()?;
        if self.plain_pos == self.plain.len() {
            self.plain.clear();
            self.plain_pos = 0;
            let n = self.inner.recv(&mut self.scratch)?;
            if n == 0 {
                return Ok(0);
            }
            let fed = self.session.feed_into(&self.scratch[..n], &mut self.plain);
            self.queue();
            let _ = self.flush_out();
            fed.map_err(tls_error)?;
            if self.plain.is_empty() && self.session.peer_closed() {
                return Err(Error::Closed);
            }
        }
        let avail = &self.plain[self.plain_pos..];
        let n = avail.len().min(buf.len());
        buf[..n].copy_from_slice(&avail[..n]);
        self.plain_pos += n;
        Ok(n)
    }

    fn send(&mut self, buf: &[u8]) -> Result<usize> {
        if !self.flush_out()? {
            return Ok(0);
        }
        let n = buf.len().min(256 << 10);
        self.session.send_into(&buf[..n], &mut self.out).map_err(tls_error)?;
        self.flush_out()?;
        Ok(n)
    }

    fn wait(&self, timeout: Duration, writing: bool) -> Result<()> {
        if self.plain_pos < self.plain.len() {
            return Ok(());
        }
        self.inner.wait(timeout, writing || self.out_pos < self.out.len())
    }
}
