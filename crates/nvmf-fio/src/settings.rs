//! The engine options as fio hands them over ([`Conf`], shared with shim.c), checked into
//! [`Settings`], and how a job connects with them.

use std::ffi::{c_char, CStr};

use nvmf_host::{default_hostnqn, ConnectOptions, Controller, Error, TlsOptions};

use crate::failure::{errno_of, Failure};
use crate::CONNECT_TIMEOUT;

/// The engine options and the fio job parameters the engine needs (mirrors `struct nvmf_fio_conf`).
#[repr(C)]
pub struct Conf {
    pub traddr: *const c_char,
    pub subnqn: *const c_char,
    pub hostnqn: *const c_char,
    pub trsvcid: u32,
    pub hdr_digest: u32,
    pub data_digest: u32,
    pub poll: u32,
    pub iodepth: u32,
    pub thread_number: u32,
    pub max_bs: u64,
    pub tls_key: *const c_char,
    pub tls_key_identity: *const c_char,
    pub tls: u32,
    pub tls_compat: u32,
}

/// The TLS settings from the engine options, as nvmf-perf takes `--tls`, `--tls-key` and
/// `--tls-key-identity`: a key implies `tls`; `tls` without a key is refused (there is no
/// keyring). The target holds each PSK under a host NQN, so the host NQN must be a fixed one
/// (`hostnqn=` or /etc/nvme/hostnqn), not the random one made when neither exists.
pub fn tls_options(tls: bool, key: Option<String>, identity: Option<String>, hostnqn: Option<&str>) -> Result<Option<TlsOptions>, String> {
    let Some(key) = key else {
        if tls {
            return Err("tls=1 needs tls_key= (the PSK, NVMeTLSkey-1:HH:<base64>:; there is no keyring)".into());
        }
        if identity.is_some() {
            return Err("tls_key_identity= needs tls_key=".into());
        }
        return Ok(None);
    };
    let hostnqn = match hostnqn {
        Some(h) => h.to_string(),
        None => match std::fs::read_to_string("/etc/nvme/hostnqn").map(|s| s.trim().to_string()) {
            Ok(h) if !h.is_empty() => h,
            _ => return Err("tls_key= needs hostnqn= (or /etc/nvme/hostnqn): the target holds the PSK per host NQN".into()),
        },
    };
    let parsed = TlsOptions::parse(&key, identity.as_deref(), &hostnqn);
    // The host library's messages name nvmf-perf's flags; say the engine's option names.
    parsed.map(Some).map_err(|e| e.replace("--tls-key-identity", "tls_key_identity=").replace("--tls-key", "tls_key="))
}

/// [`Conf`] checked and owned.
#[derive(Debug, Clone)]
pub struct Settings {
    pub traddr: String,
    pub trsvcid: u16,
    pub subnqn: String,
    pub hostnqn: Option<String>,
    pub hdr_digest: bool,
    pub data_digest: bool,
    pub poll: bool,
    pub iodepth: u32,
    pub max_bs: u64,
    /// fio's job number (for messages).
    pub job: u32,
    /// TLS 1.3 with a PSK (`tls`, `tls_key`, `tls_key_identity`): every connection of the job,
    /// the size query's included, does the handshake before ICReq.
    pub tls: Option<TlsOptions>,
}

pub(crate) fn cstr(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: fio hands NUL-terminated strings it owns for the call's duration.
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().trim().to_string();
    (!s.is_empty()).then_some(s)
}

impl Settings {
    /// # Safety
    /// `c` must point to a valid [`Conf`] whose strings are NUL-terminated or null.
    pub unsafe fn from_conf(c: *const Conf) -> Result<Settings, String> {
        let c = c.as_ref().ok_or("no engine configuration")?;
        let traddr = cstr(c.traddr).ok_or("the job sets no traddr= (the target's address)")?;
        let subnqn = cstr(c.subnqn).ok_or("the job sets no subnqn= (the NVM subsystem NQN)")?;
        let trsvcid = u16::try_from(c.trsvcid)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("trsvcid={} is not a TCP port", c.trsvcid))?;
        let hostnqn = cstr(c.hostnqn);
        let mut tls = tls_options(c.tls != 0, cstr(c.tls_key), cstr(c.tls_key_identity), hostnqn.as_deref())?;
        match tls.as_mut() {
            Some(t) => {
                t.compat = c.tls_compat != 0;
                // Neither chosen: try what a kernel keyring may hold, as nvmf-perf does.
                t.fallback = cstr(c.tls_key_identity).is_none() && !t.compat;
            }
            None if c.tls_compat != 0 => return Err("tls_compat=1 needs tls_key=".into()),
            None => {}
        }
        Ok(Settings {
            traddr,
            trsvcid,
            subnqn,
            hostnqn,
            hdr_digest: c.hdr_digest != 0,
            data_digest: c.data_digest != 0,
            poll: c.poll != 0,
            iodepth: c.iodepth.max(1),
            max_bs: c.max_bs.max(512),
            job: c.thread_number,
            tls,
        })
    }

    /// `host:port`, with IPv6 literals in brackets.
    pub fn addr(&self) -> String {
        if self.traddr.contains(':') && !self.traddr.starts_with('[') {
            format!("[{}]:{}", self.traddr, self.trsvcid)
        } else {
            format!("{}:{}", self.traddr, self.trsvcid)
        }
    }

    pub fn connect_options(&self) -> ConnectOptions {
        let hostnqn = self.hostnqn.clone().unwrap_or_else(default_hostnqn);
        let mut o = ConnectOptions::new(self.addr(), hostnqn);
        o.hdr_digest = self.hdr_digest;
        o.data_digest = self.data_digest;
        o.timeout = CONNECT_TIMEOUT;
        o.tls = self.tls.clone();
        o
    }

    pub(crate) fn connect(&self) -> Result<Controller, Failure> {
        Controller::connect(&self.connect_options(), &self.subnqn).map_err(|e| {
            let msg = match &e {
                // Already names the address.
                Error::Connect { .. } => format!("{e} (subnqn {})", self.subnqn),
                _ => format!("cannot connect to {} (subnqn {}): {e}", self.addr(), self.subnqn),
            };
            Failure::new(errno_of(&e), msg)
        })
    }
}
