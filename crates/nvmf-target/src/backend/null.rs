//! Null backend: stores nothing, reads return zeroes (like null_blk with zeroing).

use super::{IoOp, IoRequest};

pub(super) fn execute(req: &IoRequest) -> Result<(), i32> {
    if req.op == IoOp::Read && req.len > 0 {
        // SAFETY: the submitter guarantees buf is valid for len bytes.
        unsafe { std::ptr::write_bytes(req.buf, 0, req.len as usize) };
    }
    Ok(())
}
