//! Namespace storage. A [`Backend`] is shared by every reactor that serves the namespace; each
//! reactor owns an [`IoEngine`] (its io_uring) through which requests are submitted and reaped,
//! so file I/O overlaps at any queue depth while null and ram complete at once.

mod buf;
mod file;
mod null;
mod ram;

pub use buf::AlignedBuf;
pub use file::FileStore;
pub use ram::RamStore;

use crate::config::BackendConfig;
use io_uring::IoUring;
use std::path::PathBuf;

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
}

impl Backend {
    pub fn open(config: &BackendConfig, block_size: u32) -> Result<Backend, BackendError> {
        Ok(match config {
            BackendConfig::Null { size } => Backend::Null { size: *size },
            BackendConfig::Ram { size } => Backend::Ram(RamStore::new(*size)),
            BackendConfig::File { path } => Backend::File(FileStore::open(path, block_size)?),
        })
    }

    /// Capacity in bytes.
    pub fn size(&self) -> u64 {
        match self {
            Backend::Null { size } => *size,
            Backend::Ram(r) => r.size(),
            Backend::File(f) => f.size(),
        }
    }

    /// Whether writes may sit in a volatile cache (reported as VWC; Flush then matters).
    pub fn volatile_cache(&self) -> bool {
        matches!(self, Backend::File(f) if !f.is_direct())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoOp {
    Read,
    Write,
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

/// Per-reactor submission engine. Without io_uring (kernel refuses it) file I/O runs
/// synchronously with pread/pwrite, which is logged once.
pub struct IoEngine {
    ring: Option<IoUring>,
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
        IoEngine { ring, done: Vec::with_capacity(entries as usize), in_flight: 0, unsubmitted: 0 }
    }

    /// The ring's fd, readable when completions are waiting (for the reactor's poller).
    pub fn ring_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.ring.as_ref().map(|r| r.as_raw_fd())
    }

    /// Requests submitted to the kernel and not yet reaped.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Starts `req`. Null and ram complete immediately (seen at the next [`reap`](Self::reap)).
    ///
    /// # Safety
    /// For Read and Write, `req.buf` must be valid for `req.len` bytes and stay valid and unmoved
    /// until this engine reports the completion with `req.tag`.
    pub unsafe fn submit(&mut self, backend: &Backend, req: IoRequest) {
        let result = match backend {
            Backend::Null { .. } => null::execute(&req),
            Backend::Ram(r) => r.execute(&req),
            Backend::File(f) => match &mut self.ring {
                Some(ring) => {
                    if let Some(entry) = f.sqe(&req) {
                        while ring.submission().push(&entry).is_err() {
                            // SQ full: hand what is queued to the kernel to make room.
                            if let Err(e) = ring.submit() {
                                tracing::error!("io_uring submit failed: {e}");
                            }
                            self.unsubmitted = 0;
                        }
                        self.unsubmitted += 1;
                        self.in_flight += 1;
                        return;
                    }
                    f.execute_sync(&req)
                }
                None => f.execute_sync(&req),
            },
        };
        self.done.push(IoCompletion { tag: req.tag, result });
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
        out.append(&mut self.done);
        if let Some(ring) = &mut self.ring {
            for cqe in ring.completion() {
                self.in_flight -= 1;
                let res = cqe.result();
                out.push(IoCompletion { tag: cqe.user_data(), result: if res < 0 { Err(-res) } else { Ok(()) } });
            }
        }
    }

    /// Blocks until at least one submitted request completes (tests and shutdown draining).
    pub fn wait_one(&mut self) {
        if let Some(ring) = &mut self.ring {
            if self.in_flight > 0 {
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
        let mut w = AlignedBuf::new(8192);
        w.resize(8192);
        for (i, x) in w.as_mut_slice().iter_mut().enumerate() {
            *x = (i % 251) as u8;
        }
        run(&mut e, b, IoOp::Write, 4096, w.as_mut_slice()).unwrap();
        let mut r = AlignedBuf::new(8192);
        r.resize(8192);
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

    #[test]
    fn file_roundtrip() {
        let dir = std::env::temp_dir().join(format!("nvmf-target-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("disk.img");
        std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
        let b = Backend::open(&BackendConfig::File { path: path.clone() }, 512).unwrap();
        assert_eq!(b.size(), 1 << 20);
        roundtrip(&b);
        std::fs::remove_dir_all(&dir).unwrap();
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
