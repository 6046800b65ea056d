//! Aligned, reusable data buffers: O_DIRECT needs aligned memory, and a command slot keeps
//! its buffer between commands so the data path rarely allocates. Alignment is only as strict
//! as the backends need: glibc keeps about 8.2 KiB resident for a 4 KiB buffer aligned to a
//! page, 4.1 KiB for one aligned to a cache line. Allocation is fallible: the
//! sizes come from the network, and a failed allocation must fail one command, not abort the
//! process.

use std::alloc::{alloc_zeroed, dealloc, Layout};

/// Alignment of buffers made with [`AlignedBuf::new`]: a page, enough for any O_DIRECT.
const PAGE_ALIGN: usize = 4096;
/// Capacities are rounded up to a multiple of this, so a kept buffer also serves commands of
/// other lengths up to its capacity.
const CAPACITY_STEP: usize = 4096;

/// The allocator had no memory for a buffer (or the size was absurd).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocError;

pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
    cap: usize,
    /// A power of two.
    align: usize,
    /// Leading bytes known to be zero: a null namespace's read then costs nothing. Any mutable
    /// access clears it, since the caller may write.
    zeroed: usize,
}

// SAFETY: the buffer is plain owned memory, like Vec<u8>.
unsafe impl Send for AlignedBuf {}

impl Default for AlignedBuf {
    fn default() -> Self {
        AlignedBuf::new()
    }
}

impl AlignedBuf {
    /// An empty page-aligned buffer; allocates nothing.
    pub const fn new() -> AlignedBuf {
        AlignedBuf::with_align(PAGE_ALIGN)
    }

    /// An empty buffer whose memory will be aligned to `align` (rounded up to a power of two).
    pub const fn with_align(align: usize) -> AlignedBuf {
        let align = if align <= 1 { 1 } else { align.next_power_of_two() };
        AlignedBuf { ptr: std::ptr::null_mut(), len: 0, cap: 0, align, zeroed: 0 }
    }

    pub fn align(&self) -> usize {
        self.align
    }

    /// The capacity a buffer of `len` bytes occupies (saturating: absurd sizes fail to allocate).
    pub fn capacity_for(len: usize) -> usize {
        len.checked_next_multiple_of(CAPACITY_STEP).unwrap_or(usize::MAX)
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Sets the length. Within capacity the contents stay; beyond it the buffer is replaced by a
    /// zeroed one (callers overwrite the contents, and zeroing means no stale bytes are exposed).
    pub fn try_resize(&mut self, len: usize) -> Result<(), AllocError> {
        if len > self.cap {
            let cap = Self::capacity_for(len);
            let layout = Layout::from_size_align(cap, self.align).map_err(|_| AllocError)?;
            // SAFETY: layout has non-zero size (len > cap >= 0).
            let ptr = unsafe { alloc_zeroed(layout) };
            if ptr.is_null() {
                return Err(AllocError);
            }
            self.release();
            self.ptr = ptr;
            self.cap = cap;
            self.zeroed = cap;
        }
        self.len = len;
        Ok(())
    }

    /// Frees the memory; the buffer is empty afterwards.
    pub fn release(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: allocated by try_resize with this layout.
            unsafe { dealloc(self.ptr, Layout::from_size_align_unchecked(self.cap, self.align)) };
        }
        self.ptr = std::ptr::null_mut();
        self.len = 0;
        self.cap = 0;
        self.zeroed = 0;
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        if self.ptr.is_null() {
            return &[];
        }
        // SAFETY: ptr is valid for cap >= len bytes, initialised (allocated zeroed or written).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.ptr.is_null() {
            return &mut [];
        }
        self.zeroed = 0;
        // SAFETY: as above, and we hold &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Null while nothing is allocated (only for zero-length requests).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.zeroed = 0;
        self.ptr
    }

    /// How many leading bytes are known to be zero.
    pub fn known_zero(&self) -> usize {
        self.zeroed.min(self.len)
    }

    /// Makes the first `len` bytes (at most the length) zero, writing them only when they may
    /// not be: after a read of a null namespace the next one finds the buffer still zero.
    pub fn zero_prefix(&mut self, len: usize) {
        let len = len.min(self.len);
        if self.zeroed < len {
            // SAFETY: ptr is valid for len <= self.len bytes (len > 0 means it is allocated).
            unsafe { std::ptr::write_bytes(self.ptr, 0, len) };
            self.zeroed = len;
        }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_zeroed_and_aligned_keeps_data_within_capacity() {
        let mut b = AlignedBuf::new();
        assert!(b.as_slice().is_empty());
        b.try_resize(3).unwrap();
        b.as_mut_slice().copy_from_slice(&[1, 2, 3]);
        b.try_resize(4096).unwrap();
        assert_eq!(&b.as_slice()[..3], &[1, 2, 3], "same allocation");
        b.try_resize(100_000).unwrap();
        assert!(b.as_slice().iter().all(|x| *x == 0), "a new allocation is zeroed");
        assert_eq!(b.capacity(), AlignedBuf::capacity_for(100_000));
        assert_eq!(b.as_mut_ptr() as usize % PAGE_ALIGN, 0);
        b.release();
        assert_eq!((b.len(), b.capacity()), (0, 0));
    }

    #[test]
    fn a_buffer_keeps_the_alignment_it_was_made_with_across_growth() {
        for align in [1, 64, 512, 4096] {
            let mut b = AlignedBuf::with_align(align);
            for len in [512, 4096, 5000, 131072] {
                b.try_resize(len).unwrap();
                assert_eq!(b.as_mut_ptr() as usize % align, 0, "align {align} len {len}");
                assert_eq!(b.align(), align);
            }
        }
        assert_eq!(AlignedBuf::with_align(48).align(), 64, "rounded up to a power of two");
        assert_eq!(AlignedBuf::new().align(), PAGE_ALIGN);
    }

    #[test]
    fn impossible_sizes_fail_instead_of_aborting() {
        let mut b = AlignedBuf::new();
        assert_eq!(b.try_resize(usize::MAX - 100), Err(AllocError), "layout overflow");
        // black_box: LLVM may otherwise elide an allocation nobody reads and call it a success.
        let r = b.try_resize(std::hint::black_box(1 << 60));
        std::hint::black_box(b.as_mut_ptr());
        assert_eq!(r, Err(AllocError), "allocator says no");
        assert_eq!(b.capacity(), 0);
        b.try_resize(10).unwrap();
    }

    #[test]
    fn zero_prefix_writes_only_what_may_have_been_written() {
        let mut b = AlignedBuf::new();
        b.try_resize(8192).unwrap();
        b.zero_prefix(8192);
        assert!(b.as_slice().iter().all(|x| *x == 0));
        assert_eq!(b.known_zero(), 8192);
        b.as_mut_slice()[100] = 7;
        assert_eq!(b.known_zero(), 0, "a mutable borrow may have written anywhere");
        b.zero_prefix(4096);
        assert_eq!(b.as_slice()[100], 0, "written through as_mut_slice, so zeroed again");
        // SAFETY: in bounds; as_mut_ptr is how a backend gets the buffer.
        unsafe { *b.as_mut_ptr().add(5000) = 9 };
        b.zero_prefix(8192);
        assert_eq!(b.as_slice()[5000], 0, "written through as_mut_ptr, so zeroed again");
        b.zero_prefix(1 << 20);
        assert_eq!(b.len(), 8192, "never beyond the length");
    }
}
