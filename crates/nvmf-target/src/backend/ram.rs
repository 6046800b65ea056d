//! RAM backend: a zero-filled array shared by all reactors. Stored as atomic words so that
//! concurrent commands to the same blocks from different reactors are well defined in Rust
//! (NVMe leaves their ordering undefined; relaxed word accesses compile to plain moves).

use super::{IoOp, IoRequest};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub struct RamStore {
    words: Box<[AtomicU64]>,
}

impl RamStore {
    pub fn new(size: u64) -> RamStore {
        let n = size.div_ceil(8) as usize;
        RamStore { words: (0..n).map(|_| AtomicU64::new(0)).collect() }
    }

    pub fn size(&self) -> u64 {
        self.words.len() as u64 * 8
    }

    /// Offsets and lengths are whole blocks (checked by the I/O command layer), so word aligned.
    pub(super) fn execute(&self, req: &IoRequest) -> Result<(), i32> {
        let first = (req.offset / 8) as usize;
        let n = (req.len / 8) as usize;
        let Some(words) = self.words.get(first..first + n) else { return Err(libc::EINVAL) };
        match req.op {
            IoOp::Read => {
                for (i, w) in words.iter().enumerate() {
                    // SAFETY: buf is valid for len = 8 * n bytes (submitter's contract).
                    unsafe { (req.buf as *mut u64).add(i).write_unaligned(w.load(Relaxed)) };
                }
            }
            IoOp::Write | IoOp::WriteFua => {
                for (i, w) in words.iter().enumerate() {
                    // SAFETY: as above.
                    w.store(unsafe { (req.buf as *const u64).add(i).read_unaligned() }, Relaxed);
                }
            }
            IoOp::WriteZeroes | IoOp::Deallocate => words.iter().for_each(|w| w.store(0, Relaxed)),
            IoOp::Flush => {}
        }
        Ok(())
    }
}
