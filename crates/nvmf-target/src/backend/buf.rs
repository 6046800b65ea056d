//! Page-aligned, reusable data buffers: O_DIRECT needs aligned memory, and a command slot keeps
//! its buffer for the life of the connection so the data path does not allocate.

use std::alloc::{alloc_zeroed, dealloc, realloc, Layout};

const ALIGN: usize = 4096;

pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
    cap: usize,
}

// SAFETY: the buffer is plain owned memory, like Vec<u8>.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    pub fn new(capacity: usize) -> AlignedBuf {
        let mut b = AlignedBuf { ptr: std::ptr::null_mut(), len: 0, cap: 0 };
        b.reserve(capacity);
        b
    }

    /// Grows capacity to at least `cap` (rounded up to the alignment).
    fn reserve(&mut self, cap: usize) {
        let cap = cap.max(1).next_multiple_of(ALIGN);
        if cap <= self.cap {
            return;
        }
        let layout = Layout::from_size_align(cap, ALIGN).expect("aligned layout");
        // SAFETY: layout has non-zero size; realloc keeps the old layout's alignment.
        let ptr = unsafe {
            if self.ptr.is_null() {
                alloc_zeroed(layout)
            } else {
                realloc(self.ptr, Layout::from_size_align(self.cap, ALIGN).expect("layout"), cap)
            }
        };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        self.ptr = ptr;
        self.cap = cap;
    }

    /// Sets the length, growing if needed; contents up to the old length are kept, new bytes are
    /// whatever the buffer held before (callers overwrite them).
    pub fn resize(&mut self, len: usize) {
        self.reserve(len);
        self.len = len;
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for cap >= len bytes, initialised (allocated zeroed or written).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and we hold &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: allocated by reserve with this layout.
            unsafe { dealloc(self.ptr, Layout::from_size_align(self.cap, ALIGN).expect("layout")) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_keeps_data_and_alignment() {
        let mut b = AlignedBuf::new(10);
        b.resize(3);
        b.as_mut_slice().copy_from_slice(&[1, 2, 3]);
        b.resize(100_000);
        assert_eq!(&b.as_slice()[..3], &[1, 2, 3]);
        assert_eq!(b.as_mut_ptr() as usize % ALIGN, 0);
    }
}
