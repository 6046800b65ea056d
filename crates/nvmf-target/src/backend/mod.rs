//! Namespace storage. A [`Backend`] is shared by every reactor that serves the namespace; each
//! reactor owns an [`IoEngine`] (its io_uring) through which requests are submitted and reaped,
//! so file I/O overlaps at any queue depth while null and ram complete at once.

mod budget;
mod buf;
mod file;
mod model;
mod null;
mod ram;

pub use budget::MemoryBudget;
pub use buf::{AlignedBuf, AllocError};
pub use file::{DurabilityCounters, FileStore};
pub use model::{ModelParams, ModelStore};
pub use ram::RamStore;

use io_uring::{opcode, squeue, types, IoUring};
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// A namespace's storage as the configuration describes it (config/ re-exports it).
#[derive(Debug, Clone, PartialEq)]
pub enum BackendConfig {
    Null { size: u64 },
    Ram { size: u64 },
    File { path: PathBuf },
    /// RAM answering like a device (backend/model.rs).
    Model { size: u64, params: ModelParams },
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("cannot open {path}: {source}")]
    Open { path: PathBuf, source: std::io::Error },
    #[error("{path}: {why}")]
    Unusable { path: PathBuf, why: String },
}

pub enum Backend {
    Null { size: u64 },
    Ram(RamStore),
    File(FileStore),
    Model(ModelStore),
}

impl Backend {
    pub fn open(config: &BackendConfig, block_size: u32) -> Result<Backend, BackendError> {
        Ok(match config {
            BackendConfig::Null { size } => Backend::Null { size: *size },
            BackendConfig::Ram { size } => Backend::Ram(RamStore::new(*size)),
            BackendConfig::File { path } => Backend::File(FileStore::open(path, block_size)?),
            BackendConfig::Model { size, params } => Backend::Model(ModelStore::new(*size, *params)),
        })
    }

    /// Capacity in bytes.
    pub fn size(&self) -> u64 {
        match self {
            Backend::Null { size } => *size,
            Backend::Ram(r) => r.size(),
            Backend::File(f) => f.size(),
            Backend::Model(m) => m.size(),
        }
    }

    /// Makes written data durable before a shutdown completes (CC.SHN). Blocking: file
    /// namespaces call fdatasync; null and ram have nothing to make durable.
    pub fn sync(&self) -> Result<(), i32> {
        match self {
            Backend::File(f) => f.sync(),
            Backend::Null { .. } | Backend::Ram(_) | Backend::Model(_) => Ok(()),
        }
    }

    /// The memory alignment this backend's I/O buffers need: what O_DIRECT asks of a file's
    /// memory, nothing for null and ram (they are read and written with plain copies).
    pub fn buffer_align(&self) -> usize {
        match self {
            Backend::File(f) => f.memory_align(),
            Backend::Null { .. } | Backend::Ram(_) | Backend::Model(_) => 1,
        }
    }

    /// Whether every read returns zeroes (null): a buffer already zero needs no backend work.
    pub fn reads_zeroes(&self) -> bool {
        matches!(self, Backend::Null { .. })
    }

    /// Whether written data goes nowhere (null): a write's data need not be kept in memory at all.
    pub fn discards_writes(&self) -> bool {
        matches!(self, Backend::Null { .. })
    }

    /// Whether completed writes may sit in a volatile cache until a Flush (reported as VWC).
    /// Null stores nothing and ram (model too) has no non-volatile medium to flush to: no cache.
    pub fn volatile_cache(&self) -> bool {
        matches!(self, Backend::File(f) if f.volatile_cache())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoOp {
    Read,
    Write,
    /// Write with Force Unit Access: durable when it completes.
    WriteFua,
    Flush,
    WriteZeroes,
    Deallocate,
}

/// One backend operation. `buf` points into a buffer the submitter keeps alive and unmoved until
/// the completion with the same `tag` has been reaped (for Read and Write; null otherwise).
#[derive(Debug, Clone, Copy)]
pub struct IoRequest {
    pub op: IoOp,
    pub offset: u64,
    pub len: u64,
    pub buf: *mut u8,
    pub tag: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoCompletion {
    pub tag: u64,
    /// `Err(errno)` when the backend failed.
    pub result: Result<(), i32>,
}

/// A file request in the ring, kept until it has moved all its bytes (a short read or write
/// is resubmitted for the remainder).
struct Pending {
    req: IoRequest,
    fd: RawFd,
    done: u64,
    /// Where a completed Flush or FUA write is counted (None for other operations: no
    /// reference-count traffic on the data path).
    counters: Option<Arc<DurabilityCounters>>,
    /// A model namespace's completion time: the request waits in the ring as an absolute
    /// timeout (boxed: the kernel reads it at submission, and `pending` may move).
    timer: Option<Box<types::Timespec>>,
}

/// Per-reactor submission engine. Without io_uring (kernel refuses it) file I/O runs
/// synchronously with pread/pwrite, which is logged once.
pub struct IoEngine {
    ring: Option<IoUring>,
    /// Requests in the ring, indexed by their user data.
    pending: Vec<Option<Pending>>,
    free: Vec<usize>,
    /// (user data, result) taken off the ring while making room in the SQ; handled by `reap`.
    cqes: Vec<(u64, i32)>,
    /// The batch of `cqes` being handled by `reap` (its capacity is reused).
    reaping: Vec<(u64, i32)>,
    done: Vec<IoCompletion>,
    in_flight: usize,
    unsubmitted: usize,
}

impl IoEngine {
    pub fn new(entries: u32) -> IoEngine {
        let ring = match IoUring::new(entries) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!("io_uring unavailable ({e}); file namespaces use synchronous I/O");
                None
            }
        };
        IoEngine {
            ring,
            pending: Vec::new(),
            free: Vec::new(),
            cqes: Vec::new(),
            reaping: Vec::new(),
            done: Vec::with_capacity(entries as usize),
            in_flight: 0,
            unsubmitted: 0,
        }
    }

    /// The ring's fd, readable when completions are waiting (for the reactor's poller).
    pub fn ring_fd(&self) -> Option<RawFd> {
        self.ring.as_ref().map(|r| r.as_raw_fd())
    }

    /// Requests submitted to the kernel and not yet reaped.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Completions [`reap`](Self::reap) can return without waiting (null and ram requests, or
    /// CQEs taken while submitting): a poller must not sleep on the ring fd while this holds.
    pub fn has_completions(&self) -> bool {
        !self.done.is_empty() || !self.cqes.is_empty()
    }

    /// Reports `tag` done at the next [`reap`](Self::reap) with no backend work: for a request
    /// the submitter could finish itself (a null read into a buffer it zeroed).
    pub fn complete_now(&mut self, tag: u64, result: Result<(), i32>) {
        self.done.push(IoCompletion { tag, result });
    }

    /// Starts `req`. Null and ram complete immediately (seen at the next [`reap`](Self::reap));
    /// a model namespace's request completes when its model says (an io_uring timeout).
    ///
    /// # Safety
    /// For Read and Write, `req.buf` must be valid for `req.len` bytes and stay valid and unmoved
    /// until this engine reports the completion with `req.tag`.
    pub unsafe fn submit(&mut self, backend: &Backend, req: IoRequest) {
        let result = match backend {
            Backend::Null { .. } => null::execute(&req),
            Backend::Ram(r) => r.execute(&req),
            Backend::File(f) if self.ring.is_some() && file::uring_entry(f.raw_fd(), &req).is_some() => {
                let counters = matches!(req.op, IoOp::Flush | IoOp::WriteFua).then(|| f.counters().clone());
                match self.start(Pending { req, fd: f.raw_fd(), done: 0, counters, timer: None }) {
                    Ok(()) => return,
                    Err(errno) => Err(errno),
                }
            }
            Backend::File(f) => f.execute_sync(&req),
            Backend::Model(m) => {
                let now = model::monotonic_ns();
                match m.execute(&req, now) {
                    // Without a ring (warned at start) the model's delay is lost: completes at once.
                    (Ok(()), done_at) if done_at > now && self.ring.is_some() => {
                        let ts = types::Timespec::new().sec(done_at / 1_000_000_000).nsec((done_at % 1_000_000_000) as u32);
                        match self.start(Pending { req, fd: -1, done: 0, counters: None, timer: Some(Box::new(ts)) }) {
                            Ok(()) => return,
                            Err(errno) => Err(errno),
                        }
                    }
                    (result, _) => result,
                }
            }
        };
        self.done.push(IoCompletion { tag: req.tag, result });
    }

    /// Puts `p` in the ring; on failure it is forgotten again.
    fn start(&mut self, p: Pending) -> Result<(), i32> {
        let id = self.free.pop().unwrap_or_else(|| {
            self.pending.push(None);
            self.pending.len() - 1
        });
        self.pending[id] = Some(p);
        self.in_flight += 1;
        self.push(id).inspect_err(|_| {
            self.pending[id] = None;
            self.free.push(id);
            self.in_flight -= 1;
        })
    }

    /// Queues the SQE for what is left of pending request `id`.
    fn push(&mut self, id: usize) -> Result<(), i32> {
        let p = self.pending[id].as_ref().expect("pending request");
        let entry = match &p.timer {
            Some(ts) => Self::timer_entry(ts).user_data(id as u64),
            None => Self::file_entry(p).user_data(id as u64),
        };
        let ring = self.ring.as_mut().expect("ring");
        loop {
            // SAFETY: the entry's buffer stays valid until its completion (submit's contract).
            if unsafe { ring.submission().push(&entry) }.is_ok() {
                self.unsubmitted += 1;
                return Ok(());
            }
            // SQ full: hand it to the kernel. Reap first: with the CQ full, older kernels refuse
            // to submit (EBUSY) until completions are taken, and we would spin forever.
            self.cqes.extend(ring.completion().map(|c| (c.user_data(), c.result())));
            match ring.submit() {
                Ok(_) => self.unsubmitted = 0,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY | libc::EAGAIN | libc::EINTR)) => {}
                Err(e) => {
                    tracing::error!("io_uring submit failed: {e}");
                    return Err(e.raw_os_error().unwrap_or(libc::EIO));
                }
            }
        }
    }

    /// The SQE for what is left of a file request.
    fn file_entry(p: &Pending) -> squeue::Entry {
        let rest = IoRequest {
            offset: p.req.offset + p.done,
            len: p.req.len - p.done,
            // SAFETY (of the pointer arithmetic): done < len, inside the caller's buffer.
            buf: if p.req.buf.is_null() { p.req.buf } else { unsafe { p.req.buf.add(p.done as usize) } },
            ..p.req
        };
        file::uring_entry(p.fd, &rest).expect("a ring operation")
    }

    /// An absolute CLOCK_MONOTONIC timeout: the ring completes it (-ETIME) at `ts`.
    fn timer_entry(ts: &types::Timespec) -> squeue::Entry {
        opcode::Timeout::new(ts).flags(types::TimeoutFlags::ABS).build()
    }

    /// Hands queued submissions to the kernel (one syscall for the batch).
    pub fn flush(&mut self) {
        if self.unsubmitted > 0 {
            if let Some(ring) = &mut self.ring {
                if let Err(e) = ring.submit() {
                    tracing::error!("io_uring submit failed: {e}");
                }
            }
            self.unsubmitted = 0;
        }
    }

    /// Moves every finished request into `out`.
    pub fn reap(&mut self, out: &mut Vec<IoCompletion>) {
        if let Some(ring) = &mut self.ring {
            self.cqes.extend(ring.completion().map(|c| (c.user_data(), c.result())));
        }
        // Resubmitting a remainder may take more CQEs off the ring: loop until none is left. The
        // batch vector is kept between calls so reaping allocates nothing.
        let mut batch = std::mem::take(&mut self.reaping);
        while !self.cqes.is_empty() {
            std::mem::swap(&mut self.cqes, &mut batch);
            for &(id, res) in &batch {
                self.complete(id as usize, res);
            }
            batch.clear();
        }
        self.reaping = batch;
        self.flush();
        out.append(&mut self.done);
    }

    /// One CQE of pending request `id`: done, failed, or short and resubmitted.
    fn complete(&mut self, id: usize, res: i32) {
        let Some(p) = self.pending.get_mut(id).and_then(Option::as_mut) else { return };
        let result = match p.req.op {
            // A model request's timer: expiring (-ETIME) is its completion.
            _ if p.timer.is_some() => {
                if res < 0 && res != -libc::ETIME { Err(-res) } else { Ok(()) }
            }
            IoOp::Read | IoOp::Write | IoOp::WriteFua => {
                p.done += res as u64;
                if p.done >= p.req.len {
                    if let Some(c) = &p.counters {
                        c.dsync_writes.fetch_add(1, Relaxed);
                    }
                    Ok(())
                } else if res == 0 {
                    // No progress (end of file, device gone): a short transfer is an error.
                    Err(libc::EIO)
                } else {
                    match self.push(id) {
                        Ok(()) => return,
                        Err(errno) => Err(errno),
                    }
                }
            }
            IoOp::Flush => {
                if let Some(c) = &p.counters {
                    c.fdatasyncs.fetch_add(1, Relaxed);
                }
                Ok(())
            }
            _ => Ok(()),
        };
        let tag = self.pending[id].take().expect("pending request").req.tag;
        self.free.push(id);
        self.in_flight -= 1;
        self.done.push(IoCompletion { tag, result });
    }

    /// Blocks until at least one submitted request completes (tests and shutdown draining).
    pub fn wait_one(&mut self) {
        if let Some(ring) = &mut self.ring {
            if self.in_flight > 0 && self.cqes.is_empty() {
                let _ = ring.submit_and_wait(1);
                self.unsubmitted = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(engine: &mut IoEngine, b: &Backend, op: IoOp, offset: u64, buf: &mut [u8]) -> Result<(), i32> {
        let req = IoRequest { op, offset, len: buf.len() as u64, buf: buf.as_mut_ptr(), tag: 7 };
        unsafe { engine.submit(b, req) };
        engine.flush();
        let mut out = Vec::new();
        loop {
            engine.reap(&mut out);
            if let Some(c) = out.pop() {
                assert_eq!(c.tag, 7);
                return c.result;
            }
            engine.wait_one();
        }
    }

    fn roundtrip(b: &Backend) {
        let mut e = IoEngine::new(8);
        let mut w = AlignedBuf::new();
        w.try_resize(8192).unwrap();
        for (i, x) in w.as_mut_slice().iter_mut().enumerate() {
            *x = (i % 251) as u8;
        }
        run(&mut e, b, IoOp::Write, 4096, w.as_mut_slice()).unwrap();
        let mut r = AlignedBuf::new();
        r.try_resize(8192).unwrap();
        run(&mut e, b, IoOp::Read, 4096, r.as_mut_slice()).unwrap();
        assert_eq!(r.as_slice(), w.as_slice());
        run(&mut e, b, IoOp::WriteZeroes, 4096, &mut r.as_mut_slice()[..4096]).unwrap();
        run(&mut e, b, IoOp::Read, 4096, r.as_mut_slice()).unwrap();
        assert!(r.as_slice()[..4096].iter().all(|x| *x == 0));
        assert_eq!(&r.as_slice()[4096..], &w.as_slice()[4096..]);
        run(&mut e, b, IoOp::Flush, 0, &mut []).unwrap();
    }

    #[test]
    fn ram_roundtrip() {
        roundtrip(&Backend::Ram(RamStore::new(1 << 20)));
    }

    /// A 1 MiB file backend in a fresh directory (removed by the caller).
    fn file_backend(name: &str) -> (Backend, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("nvmf-target-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("disk.img");
        std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
        (Backend::open(&BackendConfig::File { path: path.clone() }, 512).unwrap(), dir)
    }

    #[test]
    fn file_roundtrip() {
        let (b, dir) = file_backend("roundtrip");
        assert_eq!(b.size(), 1 << 20);
        roundtrip(&b);
        assert_eq!(b.sync(), Ok(()));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn counts(b: &Backend) -> (u64, u64) {
        let Backend::File(f) = b else { panic!("file backend") };
        let c = f.counters();
        (c.fdatasyncs.load(Relaxed), c.dsync_writes.load(Relaxed))
    }

    /// Flush must reach fdatasync and a FUA write must be a RWF_DSYNC write, counted only once
    /// the kernel completed them: with a no-op Flush or a plain FUA write these counts stay 0.
    fn flush_and_fua_are_durable_operations(e: &mut IoEngine, b: &Backend) {
        let mut w = AlignedBuf::new();
        w.try_resize(4096).unwrap();
        w.as_mut_slice().fill(0x5A);
        run(e, b, IoOp::Write, 0, w.as_mut_slice()).unwrap();
        assert_eq!(counts(b), (0, 0), "a plain write is neither");
        run(e, b, IoOp::Flush, 0, &mut []).unwrap();
        assert_eq!(counts(b), (1, 0), "Flush ran fdatasync");
        run(e, b, IoOp::WriteFua, 8192, w.as_mut_slice()).unwrap();
        assert_eq!(counts(b), (1, 1), "FUA write ran with RWF_DSYNC");
        let mut r = AlignedBuf::new();
        r.try_resize(4096).unwrap();
        run(e, b, IoOp::Read, 8192, r.as_mut_slice()).unwrap();
        assert_eq!(r.as_slice(), w.as_slice(), "FUA write stored its data");
    }

    #[test]
    fn file_flush_and_fua_through_io_uring() {
        let (b, dir) = file_backend("durable-ring");
        let mut e = IoEngine::new(8);
        flush_and_fua_are_durable_operations(&mut e, &b);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn file_flush_and_fua_without_io_uring() {
        let (b, dir) = file_backend("durable-sync");
        let mut e = IoEngine::new(8);
        e.ring = None; // as when the kernel refuses io_uring
        flush_and_fua_are_durable_operations(&mut e, &b);
        assert!(b.volatile_cache(), "a file namespace reports VWC");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_file_namespaces_have_a_volatile_cache() {
        assert!(!Backend::Null { size: 4096 }.volatile_cache());
        assert!(!Backend::Ram(RamStore::new(4096)).volatile_cache());
    }

    #[test]
    fn short_file_read_is_an_error() {
        // The file shrinks under the namespace: a read across the new end comes back short.
        let (b, dir) = file_backend("short");
        std::fs::OpenOptions::new().write(true).open(dir.join("disk.img")).unwrap().set_len((1 << 20) - 2048).unwrap();
        let mut e = IoEngine::new(8);
        let mut r = AlignedBuf::new();
        r.try_resize(8192).unwrap();
        assert_eq!(run(&mut e, &b, IoOp::Read, (1 << 20) - 8192, r.as_mut_slice()), Err(libc::EIO));
        assert_eq!(run(&mut e, &b, IoOp::Read, 0, r.as_mut_slice()), Ok(()), "whole reads still work");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn more_requests_than_ring_entries_all_complete() {
        // SQ of 2 and CQ of 4 entries for 256 requests submitted before any reap.
        let (b, dir) = file_backend("tiny-ring");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut e = IoEngine::new(2);
            let mut bufs: Vec<AlignedBuf> = (0..256).map(|_| AlignedBuf::new()).collect();
            for (i, buf) in bufs.iter_mut().enumerate() {
                buf.try_resize(4096).unwrap();
                let req = IoRequest { op: IoOp::Write, offset: (i as u64 % 256) * 4096, len: 4096, buf: buf.as_mut_ptr(), tag: i as u64 };
                unsafe { e.submit(&b, req) };
            }
            let mut out = Vec::new();
            while out.len() < 256 {
                e.flush();
                e.reap(&mut out);
                if out.len() < 256 {
                    e.wait_one();
                }
            }
            let _ = tx.send(out.iter().filter(|c| c.result.is_ok()).count());
        });
        let ok = rx.recv_timeout(std::time::Duration::from_secs(30)).expect("engine hung with a full ring");
        assert_eq!(ok, 256);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn model_requests_complete_when_the_model_says() {
        // One unit of 2 ms: three reads submitted together complete about 2, 4 and 6 ms later,
        // in that order, and carry what was written.
        let b = Backend::Model(ModelStore::new(1 << 20, ModelParams { latency_ns: 2_000_000, parallelism: 1, bandwidth: None }));
        let mut e = IoEngine::new(8);
        if e.ring_fd().is_none() {
            return; // no io_uring here: the model cannot delay (warned at start)
        }
        let mut w = vec![9u8; 4096];
        run(&mut e, &b, IoOp::Write, 0, &mut w).unwrap();
        let mut bufs = vec![vec![0u8; 4096]; 3];
        let start = std::time::Instant::now();
        for (i, buf) in bufs.iter_mut().enumerate() {
            let req = IoRequest { op: IoOp::Read, offset: 0, len: 4096, buf: buf.as_mut_ptr(), tag: i as u64 };
            unsafe { e.submit(&b, req) };
        }
        e.flush();
        let mut out = Vec::new();
        let mut at = Vec::new();
        while out.len() < 3 && start.elapsed() < std::time::Duration::from_secs(5) {
            e.wait_one();
            let before = out.len();
            e.reap(&mut out);
            at.extend(std::iter::repeat_n(start.elapsed(), out.len() - before));
        }
        assert_eq!(out.iter().map(|c| (c.tag, c.result)).collect::<Vec<_>>(), vec![(0, Ok(())), (1, Ok(())), (2, Ok(()))]);
        assert!(at[2] >= std::time::Duration::from_millis(6), "third read done after {:?}", at[2]);
        assert!(at[0] >= std::time::Duration::from_millis(2), "first read done after {:?}", at[0]);
        assert!(bufs.iter().all(|b| b.iter().all(|x| *x == 9)));
    }

    #[test]
    fn null_reads_zeroes() {
        let b = Backend::Null { size: 1 << 30 };
        let mut e = IoEngine::new(8);
        let mut buf = vec![0xAAu8; 4096];
        run(&mut e, &b, IoOp::Read, 0, &mut buf).unwrap();
        assert!(buf.iter().all(|x| *x == 0));
    }

    #[test]
    fn missing_file_names_path() {
        let e = Backend::open(&BackendConfig::File { path: "/nonexistent/d.img".into() }, 512).err().unwrap();
        assert!(e.to_string().contains("/nonexistent/d.img"));
    }
}
