//! fio external ioengine for the nvmflab NVMe/TCP host.
//!
//! fio loads `libnvmf_fio.so` with `ioengine=external:/path/libnvmf_fio.so` and calls
//! [`get_ioengine`], which hands it the `struct ioengine_ops` defined in `src/shim.c`. The shim is
//! the only code that touches fio's structures (it is compiled against fio's own headers by
//! `build.rs`); it calls the `nvmf_fio_*` functions here, which do the NVMe/TCP work with
//! `nvmf-host`:
//!
//! - each fio job (thread or process) gets its own controller (admin queue + keep-alive) and one
//!   I/O queue pair (qid 1) of `iodepth` entries, opened in the engine's `init`, i.e. in the job's
//!   own thread or process;
//! - `filename` names a namespace (`ns1`, `n1`, `nsid=1` or `1`); several files (`ns1:ns2`)
//!   share the job's queue pair, each command carrying its namespace's NSID;
//! - `get_file_size` reports the namespace size (NSZE x block size); fio calls it before `init`
//!   (in the main process, before forking), so it uses a short-lived admin connection there;
//! - `queue` copies write data into the queue's slot buffer and submits; completions copy read
//!   data back into fio's buffer (one memcpy per I/O, see docs/fio-engine.md);
//! - `getevents` spins (`completion=poll`) or sleeps in ppoll (`completion=event`).
//!
//! Every error is printed on stderr as one `nvmf: ...` line naming what failed.

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nvmf_host::{default_hostnqn, Completion, ConnectOptions, Controller, Error, IoQueue, TlsOptions};

/// Operation codes of [`nvmf_fio_queue`] (shared with shim.c).
pub const OP_READ: c_int = 0;
pub const OP_WRITE: c_int = 1;
pub const OP_TRIM: c_int = 2;
pub const OP_FLUSH: c_int = 3;

/// I/Os in flight with no completion for this long fail the job (ETIMEDOUT) instead of hanging.
pub const STALL_LIMIT: Duration = Duration::from_secs(30);
/// Limit for connection set-up and each admin command.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

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

fn cstr(p: *const c_char) -> Option<String> {
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

    fn connect(&self) -> Result<Controller, Failure> {
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

/// An error for fio: an errno and a message for the user.
#[derive(Debug)]
pub struct Failure {
    pub errno: c_int,
    pub message: String,
}

impl Failure {
    fn new(errno: c_int, message: impl Into<String>) -> Self {
        Failure { errno, message: message.into() }
    }
    fn invalid(message: impl Into<String>) -> Self {
        Failure::new(libc_errno::EINVAL, message)
    }
}

/// The errno values used here (Linux), without a libc dependency.
mod libc_errno {
    pub const EIO: i32 = 5;
    pub const EACCES: i32 = 13;
    pub const EINVAL: i32 = 22;
    pub const ETIMEDOUT: i32 = 110;
}

fn errno_of(e: &Error) -> c_int {
    match e {
        Error::Connect { source, .. } | Error::Io(source) => source.raw_os_error().unwrap_or(libc_errno::EIO),
        Error::Timeout(_) => libc_errno::ETIMEDOUT,
        Error::Unsupported(_) => libc_errno::EINVAL,
        // A refused TLS key or DH-HMAC-CHAP secret: permission, not an I/O failure.
        Error::Auth(_) => libc_errno::EACCES,
        _ => libc_errno::EIO,
    }
}

/// The NSID a fio `filename` names: `ns1`, `n1`, `nsid=1`, `nsid1` or `1`.
pub fn parse_namespace(filename: &str) -> Result<u32, String> {
    let f = filename.trim();
    let digits = ["nsid=", "nsid", "ns", "n"].iter().find_map(|p| f.strip_prefix(p)).unwrap_or(f);
    match digits.parse::<u32>() {
        Ok(n) if n != 0 && n != u32::MAX => Ok(n),
        _ => Err(format!(
            "filename={filename:?} names no namespace: use filename=ns1 (or n1, nsid=1, 1) for NSID 1"
        )),
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Namespace {
    pub nsid: u32,
    pub block_size: u64,
    /// Bytes (NSZE x block size).
    pub size: u64,
}

fn identify(ctrl: &Controller, filename: &str, what: &str) -> Result<Namespace, Failure> {
    let nsid = parse_namespace(filename).map_err(Failure::invalid)?;
    let ns = ctrl.identify_namespace(nsid).map_err(|e| {
        Failure::new(errno_of(&e), format!("namespace {nsid} of {} ({what}): {e}", ctrl.subnqn()))
    })?;
    let block_size = ns.block_size();
    Ok(Namespace { nsid, block_size, size: ns.nsze * block_size })
}

struct Inflight {
    io_u: *mut c_void,
    buf: *mut u8,
    len: usize,
    read: bool,
}

#[derive(Clone, Copy)]
struct Event {
    io_u: *mut c_void,
    error: c_int,
}

/// One fio job's connection: a controller and one I/O queue pair.
pub struct Job {
    settings: Settings,
    queue: Option<IoQueue>,
    ctrl: Option<Controller>,
    namespaces: Vec<Namespace>,
    current: usize,
    max_io: usize,
    free: Vec<u16>,
    inflight: Vec<Option<Inflight>>,
    busy: usize,
    done: Vec<Completion>,
    ready: VecDeque<Event>,
    events: Vec<Event>,
    broken: Option<String>,
    errors_logged: u32,
}

impl Job {
    /// Connects the controller and the job's I/O queue (qid 1, `iodepth` entries).
    pub fn open(settings: Settings) -> Result<Job, Failure> {
        let ctrl = settings.connect()?;
        let id = ctrl.identity();
        let mut max_depth = ctrl.max_queue_entries().saturating_sub(1);
        if id.maxcmd != 0 {
            max_depth = max_depth.min(id.maxcmd as u32);
        }
        if settings.iodepth > max_depth {
            return Err(Failure::invalid(format!(
                "iodepth={} is more than the controller's queues take ({max_depth})",
                settings.iodepth
            )));
        }
        if let Some(mt) = ctrl.max_transfer() {
            if settings.max_bs > mt {
                return Err(Failure::invalid(format!(
                    "bs={} is larger than the controller's largest transfer (MDTS: {mt} bytes)",
                    settings.max_bs
                )));
            }
        }
        let fail = |what: &str, e: Error| Failure::new(errno_of(&e), format!("{what} on {}: {e}", settings.addr()));
        let (nsq, ncq) = ctrl.set_number_of_queues(1).map_err(|e| fail("Set Features (Number of Queues)", e))?;
        if nsq.min(ncq) == 0 {
            return Err(Failure::new(libc_errno::EIO, "the controller granted no I/O queue"));
        }
        let depth = settings.iodepth as usize;
        let max_io = settings.max_bs as usize;
        let queue = IoQueue::connect(&ctrl.io_queue_params(), 1, depth, max_io)
            .map_err(|e| fail("connecting the I/O queue", e))?;
        Ok(Job {
            settings,
            queue: Some(queue),
            ctrl: Some(ctrl),
            namespaces: Vec::new(),
            current: usize::MAX,
            max_io,
            free: (0..depth as u16).rev().collect(),
            inflight: (0..depth).map(|_| None).collect(),
            busy: 0,
            done: Vec::with_capacity(depth),
            ready: VecDeque::with_capacity(depth),
            events: Vec::with_capacity(depth),
            broken: None,
            errors_logged: 0,
        })
    }

    fn log(&self, msg: &str) {
        eprintln!("nvmf (job {}): {msg}", self.settings.job);
    }

    /// The handle of `filename`'s namespace (identified once per job).
    pub fn open_file(&mut self, filename: &str) -> Result<u64, Failure> {
        let nsid = parse_namespace(filename).map_err(Failure::invalid)?;
        if let Some(i) = self.namespaces.iter().position(|n| n.nsid == nsid) {
            return Ok(i as u64);
        }
        let ctrl = self.ctrl.as_ref().ok_or_else(|| Failure::new(libc_errno::EIO, "the job is closed"))?;
        let ns = identify(ctrl, filename, "open")?;
        self.namespaces.push(ns);
        Ok(self.namespaces.len() as u64 - 1)
    }

    pub fn namespace(&self, handle: u64) -> Option<Namespace> {
        self.namespaces.get(handle as usize).copied()
    }

    /// Queues one I/O. Ok(true): queued, Ok(false): no free slot (fio retries after reaping).
    ///
    /// # Safety
    /// `buf` must be valid for `len` bytes until the I/O's completion is returned.
    pub unsafe fn queue(&mut self, io_u: *mut c_void, handle: u64, op: c_int, offset: u64, buf: *mut u8, len: u64) -> Result<bool, Failure> {
        if let Some(why) = &self.broken {
            return Err(Failure::new(libc_errno::EIO, why.clone()));
        }
        let ns = self.namespace(handle).ok_or_else(|| Failure::invalid(format!("no open namespace #{handle}")))?;
        let Some(tag) = self.free.pop() else { return Ok(false) };
        let q = self.queue.as_mut().expect("queue open while the job is");
        if self.current != handle as usize {
            q.set_namespace(ns.nsid, ns.block_size);
            self.current = handle as usize;
        }
        let bs = ns.block_size;
        let check = || -> Result<(u64, u32), Failure> {
            if len == 0 || offset % bs != 0 || len % bs != 0 {
                return Err(Failure::invalid(format!(
                    "offset {offset} length {len} is not a whole number of {bs}-byte blocks of namespace {}",
                    ns.nsid
                )));
            }
            if len as usize > self.max_io || offset.checked_add(len).is_none_or(|end| end > ns.size) {
                return Err(Failure::invalid(format!(
                    "offset {offset} length {len} is outside namespace {} ({} bytes) or over bs {}",
                    ns.nsid, ns.size, self.max_io
                )));
            }
            Ok((offset / bs, (len / bs) as u32))
        };
        let submitted = match op {
            OP_READ => check().and_then(|(slba, nlb)| q.submit_read(tag, slba, nlb).map_err(|e| Failure::new(errno_of(&e), e.to_string()))),
            OP_WRITE => check().and_then(|(slba, nlb)| {
                // SAFETY: the caller guarantees buf..buf+len is valid; check() bounded len by max_io.
                let src = std::slice::from_raw_parts(buf, len as usize);
                q.buffer(tag)[..src.len()].copy_from_slice(src);
                q.submit_write(tag, slba, nlb).map_err(|e| Failure::new(errno_of(&e), e.to_string()))
            }),
            OP_TRIM => check().and_then(|(slba, nlb)| {
                q.submit_deallocate(tag, &[(slba, nlb)]).map_err(|e| Failure::new(errno_of(&e), e.to_string()))
            }),
            OP_FLUSH => q.submit_flush(tag).map_err(|e| Failure::new(errno_of(&e), e.to_string())),
            _ => Err(Failure::invalid(format!("operation {op} is not supported"))),
        };
        if let Err(e) = submitted {
            self.free.push(tag);
            return Err(e);
        }
        self.inflight[tag as usize] = Some(Inflight { io_u, buf, len: len as usize, read: op == OP_READ });
        self.busy += 1;
        Ok(true)
    }

    pub fn commit(&mut self) -> Result<(), Failure> {
        if let Some(why) = &self.broken {
            return Err(Failure::new(libc_errno::EIO, why.clone()));
        }
        let r = self.queue.as_mut().expect("queue open").commit();
        r.map_err(|e| self.break_queue(&e))
    }

    fn break_queue(&mut self, e: &Error) -> Failure {
        let msg = format!("the I/O queue to {} failed with {} I/Os in flight: {e}", self.settings.addr(), self.busy);
        self.log(&msg);
        self.broken = Some(msg.clone());
        self.fail_inflight();
        Failure::new(errno_of(e), msg)
    }

    /// The queue is gone: every I/O in flight completes with EIO so fio can reap it and end.
    fn fail_inflight(&mut self) {
        for tag in 0..self.inflight.len() {
            if let Some(inf) = self.inflight[tag].take() {
                self.free.push(tag as u16);
                self.ready.push_back(Event { io_u: inf.io_u, error: libc_errno::EIO });
            }
        }
        self.busy = 0;
    }

    /// Waits for at least `min` (at most `max`) completions; `timeout` None waits as long as
    /// completions keep coming (a queue silent for [`STALL_LIMIT`] with I/Os in flight fails).
    pub fn getevents(&mut self, min: usize, max: usize, timeout: Option<Duration>) -> Result<usize, Failure> {
        self.events.clear();
        let max = max.max(1);
        let min = min.min(max);
        let start = Instant::now();
        let deadline = timeout.map(|t| start + t);
        let mut last_progress = start;
        let mut first = true;
        loop {
            while self.events.len() < max {
                match self.ready.pop_front() {
                    Some(e) => self.events.push(e),
                    None => break,
                }
            }
            let enough = self.events.len() >= min;
            let idle = self.busy == 0 && self.ready.is_empty();
            if self.events.len() >= max || (enough && !first) || idle || self.broken.is_some() {
                return Ok(self.events.len());
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) && !first {
                return Ok(self.events.len());
            }
            if now.duration_since(last_progress) >= STALL_LIMIT {
                let msg = format!(
                    "{} I/Os in flight to {} without a completion for {} s",
                    self.busy,
                    self.settings.addr(),
                    STALL_LIMIT.as_secs()
                );
                self.log(&msg);
                self.broken = Some(msg.clone());
                self.fail_inflight();
                self.unreap();
                return Err(Failure::new(libc_errno::ETIMEDOUT, msg));
            }
            let wait = if enough || self.settings.poll {
                Duration::ZERO
            } else {
                let slice = Duration::from_millis(100);
                deadline.map_or(slice, |d| d.saturating_duration_since(now).min(slice))
            };
            first = false;
            let mut done = std::mem::take(&mut self.done);
            let polled = self.queue.as_mut().expect("queue open").poll(wait, &mut done);
            if let Err(e) = polled {
                self.done = done;
                let f = self.break_queue(&e);
                self.unreap();
                return Err(f);
            }
            if !done.is_empty() {
                last_progress = Instant::now();
            }
            for c in done.drain(..) {
                self.complete(c);
            }
            self.done = done;
        }
    }

    /// Puts the events of a getevents that fails back, for the next call to return.
    fn unreap(&mut self) {
        while let Some(ev) = self.events.pop() {
            self.ready.push_front(ev);
        }
    }

    fn complete(&mut self, c: Completion) {
        let Some(inf) = self.inflight.get_mut(c.tag as usize).and_then(Option::take) else {
            self.log(&format!("completion for tag {} which has no I/O in flight (ignored)", c.tag));
            return;
        };
        self.busy -= 1;
        let error = match c.result {
            Ok(_) => {
                if inf.read {
                    let q = self.queue.as_mut().expect("queue open");
                    // SAFETY: fio keeps the io_u's buffer valid until the event is reaped.
                    let dst = unsafe { std::slice::from_raw_parts_mut(inf.buf, inf.len) };
                    dst.copy_from_slice(&q.buffer(c.tag)[..inf.len]);
                }
                0
            }
            Err(e) => {
                if self.errors_logged < 10 {
                    self.log(&format!("I/O failed: {e}"));
                    self.errors_logged += 1;
                }
                libc_errno::EIO
            }
        };
        self.free.push(c.tag);
        self.ready.push_back(Event { io_u: inf.io_u, error });
    }

    /// The `i`th event of the last [`Job::getevents`]: (io_u, errno).
    pub fn event(&self, i: usize) -> Option<(*mut c_void, c_int)> {
        self.events.get(i).map(|e| (e.io_u, e.error))
    }

    /// Disconnects the I/O queue (when idle) and shuts the controller down.
    pub fn close(mut self) {
        if let Some(q) = self.queue.take() {
            if self.busy == 0 && self.broken.is_none() {
                let _ = q.disconnect(Duration::from_secs(2));
            }
        }
        if let Some(c) = self.ctrl.take() {
            if self.broken.is_none() {
                let _ = c.shutdown();
            }
        }
    }
}

/// (target address, subsystem NQN, NSID) of a namespace.
type NamespaceKey = (String, String, u32);
/// Namespace sizes already asked for, so that `numjobs=N` asks once.
static SIZES: Mutex<Option<HashMap<NamespaceKey, u64>>> = Mutex::new(None);

/// The size of `filename`'s namespace: from the open job, else with a short-lived connection.
pub fn file_size(job: Option<&mut Job>, settings: &Settings, filename: &str) -> Result<u64, Failure> {
    if let Some(job) = job {
        let h = job.open_file(filename)?;
        return Ok(job.namespace(h).map_or(0, |n| n.size));
    }
    let nsid = parse_namespace(filename).map_err(Failure::invalid)?;
    let key = (settings.addr(), settings.subnqn.clone(), nsid);
    if let Some(s) = SIZES.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(HashMap::new).get(&key) {
        return Ok(*s);
    }
    let ctrl = settings.connect()?;
    let ns = identify(&ctrl, filename, "size");
    let _ = ctrl.shutdown();
    let ns = ns?;
    SIZES.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(HashMap::new).insert(key, ns.size);
    Ok(ns.size)
}

// ---- the C interface used by shim.c ----

fn guarded<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        eprintln!("nvmf: internal error (panic) in the engine; see the message above");
        fallback
    })
}

fn report(job: u32, f: &Failure) -> c_int {
    eprintln!("nvmf (job {job}): {}", f.message);
    f.errno.max(1)
}

/// Opens a job; null on failure (the reason is printed, the errno is in `*error`).
///
/// # Safety
/// `conf` must point to a valid [`Conf`]; `error` null or valid.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_job_open(conf: *const Conf, error: *mut c_int) -> *mut c_void {
    let (job, errno) = guarded((std::ptr::null_mut(), libc_errno::EIO), || {
        let settings = match Settings::from_conf(conf) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("nvmf: {e}");
                return (std::ptr::null_mut(), libc_errno::EINVAL);
            }
        };
        let n = settings.job;
        match Job::open(settings) {
            Ok(j) => (Box::into_raw(Box::new(j)) as *mut c_void, 0),
            Err(f) => (std::ptr::null_mut(), report(n, &f)),
        }
    });
    if !error.is_null() {
        *error = errno;
    }
    job
}

/// # Safety
/// `job` must come from [`nvmf_fio_job_open`] and not be used afterwards.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_job_close(job: *mut c_void) {
    if !job.is_null() {
        let job = Box::from_raw(job as *mut Job);
        guarded((), move || job.close());
    }
}

/// Namespace size of `filename` in `*size`; 0 or an errno.
///
/// # Safety
/// `job` null or from [`nvmf_fio_job_open`]; `conf`, `filename`, `size` valid.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_file_size(job: *mut c_void, conf: *const Conf, filename: *const c_char, size: *mut u64) -> c_int {
    guarded(libc_errno::EIO, || {
        let settings = match Settings::from_conf(conf) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("nvmf: {e}");
                return libc_errno::EINVAL;
            }
        };
        let name = cstr(filename).unwrap_or_default();
        match file_size((job as *mut Job).as_mut(), &settings, &name) {
            Ok(s) => {
                *size = s;
                0
            }
            Err(f) => report(settings.job, &f),
        }
    })
}

/// # Safety
/// `job` from [`nvmf_fio_job_open`]; `filename`, `handle` valid.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_open_file(job: *mut c_void, filename: *const c_char, handle: *mut u64) -> c_int {
    guarded(libc_errno::EIO, || {
        let Some(job) = (job as *mut Job).as_mut() else { return libc_errno::EIO };
        match job.open_file(&cstr(filename).unwrap_or_default()) {
            Ok(h) => {
                *handle = h;
                0
            }
            Err(f) => report(job.settings.job, &f),
        }
    })
}

/// 0 queued, 1 busy (no free slot), or a negative errno (the I/O completed with that error).
///
/// # Safety
/// `job` from [`nvmf_fio_job_open`]; `buf` valid for `len` bytes until the I/O's event.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_queue(job: *mut c_void, io_u: *mut c_void, handle: u64, op: c_int, offset: u64, buf: *mut c_void, len: u64) -> c_int {
    guarded(-libc_errno::EIO, || {
        let Some(job) = (job as *mut Job).as_mut() else { return -libc_errno::EIO };
        match job.queue(io_u, handle, op, offset, buf as *mut u8, len) {
            Ok(true) => 0,
            Ok(false) => 1,
            Err(f) => -report(job.settings.job, &f),
        }
    })
}

/// 0 or a negative errno.
///
/// # Safety
/// `job` from [`nvmf_fio_job_open`].
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_commit(job: *mut c_void) -> c_int {
    guarded(-libc_errno::EIO, || {
        let Some(job) = (job as *mut Job).as_mut() else { return -libc_errno::EIO };
        match job.commit() {
            Ok(()) => 0,
            Err(f) => -f.errno.max(1),
        }
    })
}

/// Number of events ready (see [`nvmf_fio_event`]) or a negative errno. `timeout_ns` < 0: none.
///
/// # Safety
/// `job` from [`nvmf_fio_job_open`].
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_getevents(job: *mut c_void, min: u32, max: u32, timeout_ns: i64) -> c_int {
    guarded(-libc_errno::EIO, || {
        let Some(job) = (job as *mut Job).as_mut() else { return -libc_errno::EIO };
        let timeout = (timeout_ns >= 0).then(|| Duration::from_nanos(timeout_ns as u64));
        match job.getevents(min as usize, max as usize, timeout) {
            Ok(n) => n as c_int,
            Err(f) => -f.errno.max(1),
        }
    })
}

/// The io_u of event `index` of the last getevents, its errno in `*error`.
///
/// # Safety
/// `job` from [`nvmf_fio_job_open`]; `error` valid.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_event(job: *mut c_void, index: c_int, error: *mut c_int) -> *mut c_void {
    let Some(job) = (job as *mut Job).as_ref() else { return std::ptr::null_mut() };
    match job.event(index.max(0) as usize) {
        Some((io_u, e)) => {
            *error = e;
            io_u
        }
        None => std::ptr::null_mut(),
    }
}

#[cfg(nvmf_fio_shim)]
extern "C" {
    fn nvmf_fio_shim_ops() -> *mut c_void;
}

/// fio's entry point for external engines (`dlsym(handle, "get_ioengine")`): the engine's
/// `struct ioengine_ops`, or null (with the reason on stderr) in a build without fio headers.
///
/// # Safety
/// `ops` must be valid for one pointer write.
#[no_mangle]
pub unsafe extern "C" fn get_ioengine(ops: *mut *mut c_void) {
    #[cfg(nvmf_fio_shim)]
    {
        *ops = nvmf_fio_shim_ops();
    }
    #[cfg(not(nvmf_fio_shim))]
    {
        eprintln!(
            "nvmf: this libnvmf_fio.so was built without fio headers ({}); rebuild with `make fio-engine`",
            option_env!("NVMF_FIO_STUB_REASON").unwrap_or("unknown reason")
        );
        *ops = std::ptr::null_mut();
    }
}

/// True when this build contains the fio side (`src/shim.c`).
pub const HAS_FIO_SHIM: bool = cfg!(nvmf_fio_shim);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_are_named_like_nvme_cli_and_fio_users_expect() {
        for f in ["ns1", "n1", "nsid=1", "nsid1", "1", " ns1 "] {
            assert_eq!(parse_namespace(f), Ok(1), "{f}");
        }
        assert_eq!(parse_namespace("ns12"), Ok(12));
        for f in ["", "ns0", "job1", "nsx", "/dev/nvme0n1", "ns-1"] {
            let e = parse_namespace(f).unwrap_err();
            assert!(e.contains("filename=ns1"), "{e}");
        }
    }

    #[test]
    fn ipv6_addresses_get_brackets() {
        let mut s = Settings {
            traddr: "::1".into(),
            trsvcid: 4420,
            subnqn: "nqn.x".into(),
            hostnqn: None,
            hdr_digest: false,
            data_digest: false,
            poll: false,
            iodepth: 1,
            max_bs: 4096,
            job: 1,
            tls: None,
        };
        assert_eq!(s.addr(), "[::1]:4420");
        s.traddr = "127.0.0.1".into();
        assert_eq!(s.addr(), "127.0.0.1:4420");
    }

    // A SHA-256 key (hash field 01) from libnvme's test/psk.c, as nvmf-tls's key tests use it.
    const KEY: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0f01fb42-9f7f-4856-b0b3-51e60b8de349";

    #[test]
    fn tls_options_follow_nvme_cli_rules() {
        assert!(tls_options(false, None, None, None).unwrap().is_none());
        // A key implies tls; the identity option picks the version.
        let o = tls_options(false, Some(KEY.into()), None, Some(HOST)).unwrap().unwrap();
        assert_eq!(format!("{:?}", o.version), "V1");
        let v0 = tls_options(true, Some(KEY.into()), Some("0".into()), Some(HOST)).unwrap().unwrap();
        assert_eq!(format!("{:?}", v0.version), "V0");
        let id = format!("NVMe0R01 {HOST} nqn.x");
        let named = tls_options(true, Some(KEY.into()), Some(id), Some(HOST)).unwrap().unwrap();
        assert_eq!(format!("{:?}", named.version), "V0");
    }

    #[test]
    fn bad_tls_options_are_refused_with_the_engine_option_names() {
        let e = tls_options(true, None, None, Some(HOST)).unwrap_err();
        assert!(e.contains("tls=1 needs tls_key="), "{e}");
        let e = tls_options(false, None, Some("1".into()), Some(HOST)).unwrap_err();
        assert!(e.contains("tls_key_identity= needs tls_key="), "{e}");
        let e = tls_options(true, Some("NVMeTLSkey-1:01:AAAA:".into()), None, Some(HOST)).unwrap_err();
        assert!(e.starts_with("tls_key=:"), "{e}");
        let other = "NVMe0R01 nqn.2014-08.org.nvmexpress:uuid:other nqn.x";
        let e = tls_options(true, Some(KEY.into()), Some(other.into()), Some(HOST)).unwrap_err();
        assert!(e.starts_with("tls_key_identity=") && e.contains("names host"), "{e}");
    }
}
