//! One fio job's NVMe/TCP work: its controller and I/O queue pair, the namespaces its files
//! name, the I/Os in flight and their completions, and namespace sizes asked before a job opens.

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_void};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nvmf_host::{Completion, Controller, Error, IoQueue};

use crate::failure::{errno_of, libc_errno, Failure};
use crate::settings::Settings;
use crate::{OP_FLUSH, OP_READ, OP_TRIM, OP_WRITE, STALL_LIMIT};

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
    pub(crate) settings: Settings,
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
