//! `--local PATH`: the same workloads against a local file or block device through io_uring,
//! the baseline for "NVMe/TCP vs local" studies.
//!
//! The file is opened with O_DIRECT so the page cache does not turn the baseline into a memory
//! benchmark. File systems that refuse O_DIRECT (tmpfs) fall back to buffered I/O; the report's
//! `direct` knob says which one ran.

use std::alloc::{self, Layout};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::Duration;

use io_uring::{opcode, types, IoUring};

use super::engine::Engine;
use crate::{Completion, Error};

/// Buffers aligned for O_DIRECT on any logical block size up to 4 KiB.
const ALIGN: usize = 4096;

/// What a local target looks like to the planner.
#[derive(Debug, Clone, Copy)]
pub struct LocalInfo {
    pub size: u64,
    pub block_size: u64,
    pub direct: bool,
}

/// Opens (creating a regular file of at least `min_len` bytes if needed) and describes `path`.
pub fn open(path: &Path, writable: bool, min_len: u64) -> Result<(File, LocalInfo), Error> {
    let attempt = |direct: bool| {
        let mut o = OpenOptions::new();
        o.read(true).write(writable);
        if writable && min_len > 0 {
            o.create(true);
        }
        if direct {
            o.custom_flags(libc::O_DIRECT);
        }
        o.open(path)
    };
    let (file, direct) = match attempt(true) {
        Ok(f) => (f, true),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => (attempt(false)?, false),
        Err(e) => return Err(Error::Unsupported(format!("cannot open {}: {e}", path.display()))),
    };
    let meta = file.metadata()?;
    let (size, block_size) = if meta.file_type().is_block_device() {
        (ioctl_u64(&file, BLKGETSIZE64)?, ioctl_u32(&file, BLKSSZGET)? as u64)
    } else {
        if writable && meta.len() < min_len {
            file.set_len(min_len)?;
        }
        (meta.len().max(if writable { min_len } else { 0 }), 512)
    };
    Ok((file, LocalInfo { size, block_size, direct }))
}

/// Why reading `file` measures no device: a regular file with fewer bytes allocated than its
/// length (a freshly truncated one) has holes, and the kernel answers reads of a hole with zeroes
/// without touching the disk. None for a block device or a fully allocated file.
pub fn sparse_warning(file: &File, path: &Path) -> std::io::Result<Option<String>> {
    use std::os::unix::fs::MetadataExt;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Ok(None);
    }
    let allocated = meta.blocks().saturating_mul(512);
    Ok((allocated < meta.len()).then(|| {
        format!(
            "{} is sparse ({allocated} of {} bytes allocated): reads of its holes touch no device, so read results measure memory; fill it first (e.g. a write run over it, or fio/dd)",
            path.display(),
            meta.len()
        )
    }))
}

const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKSSZGET: libc::c_ulong = 0x1268;

fn ioctl_u64(f: &File, req: libc::c_ulong) -> std::io::Result<u64> {
    let mut v: u64 = 0;
    // SAFETY: the request writes one u64 into `v`.
    if unsafe { libc::ioctl(f.as_raw_fd(), req as _, &mut v) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(v)
}

fn ioctl_u32(f: &File, req: libc::c_ulong) -> std::io::Result<u32> {
    let mut v: libc::c_int = 0;
    // SAFETY: the request writes one int into `v`.
    if unsafe { libc::ioctl(f.as_raw_fd(), req as _, &mut v) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(v as u32)
}

/// One aligned allocation holding every tag's buffer.
struct AlignedBufs {
    ptr: *mut u8,
    layout: Layout,
    each: usize,
}

impl AlignedBufs {
    fn new(count: usize, each: usize) -> Self {
        let each = each.div_ceil(ALIGN) * ALIGN;
        let layout = Layout::from_size_align((count * each).max(ALIGN), ALIGN).expect("valid layout");
        // SAFETY: non-zero size; checked for null below.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            alloc::handle_alloc_error(layout);
        }
        AlignedBufs { ptr, layout, each }
    }

    fn get(&mut self, i: usize) -> &mut [u8] {
        // SAFETY: i < count (tags are bounded by depth), the slices do not overlap.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(i * self.each), self.each) }
    }
}

impl Drop for AlignedBufs {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in new().
        unsafe { alloc::dealloc(self.ptr, self.layout) }
    }
}

// SAFETY: the allocation is owned exclusively; nothing else aliases it.
unsafe impl Send for AlignedBufs {}

/// An io_uring ring with `depth` tags over one file.
pub struct LocalEngine {
    ring: IoUring,
    file: File,
    bufs: AlignedBufs,
    depth: usize,
    inflight: usize,
}

impl LocalEngine {
    pub fn new(file: File, depth: usize, max_io: usize) -> Result<Self, Error> {
        let ring = IoUring::new(depth.next_power_of_two() as u32)?;
        Ok(LocalEngine { ring, file, bufs: AlignedBufs::new(depth, max_io), depth, inflight: 0 })
    }
}

impl Engine for LocalEngine {
    fn depth(&self) -> usize {
        self.depth
    }

    fn buffer(&mut self, tag: u16) -> &mut [u8] {
        self.bufs.get(tag as usize)
    }

    fn submit(&mut self, tag: u16, is_read: bool, offset: u64, len: usize) -> Result<(), Error> {
        let fd = types::Fd(self.file.as_raw_fd());
        let ptr = self.bufs.get(tag as usize).as_mut_ptr();
        let sqe = if is_read {
            opcode::Read::new(fd, ptr, len as u32).offset(offset).build()
        } else {
            opcode::Write::new(fd, ptr, len as u32).offset(offset).build()
        }
        .user_data(tag as u64 | ((len as u64) << 16));
        // SAFETY: the buffer lives in self.bufs until the completion is reaped; the SQ has room
        // for every tag, so push only fails if the caller reused a tag in flight.
        unsafe { self.ring.submission().push(&sqe) }
            .map_err(|_| Error::Unsupported("io_uring submission queue full".into()))?;
        self.inflight += 1;
        Ok(())
    }

    fn commit(&mut self) -> Result<(), Error> {
        self.ring.submit()?;
        Ok(())
    }

    fn reap(&mut self, wait: Duration, done: &mut Vec<Completion>) -> Result<(), Error> {
        done.clear();
        if !wait.is_zero() {
            if self.inflight == 0 {
                std::thread::sleep(wait);
                return Ok(());
            }
            if self.ring.completion().is_empty() {
                self.ring.submit_and_wait(1)?;
            }
        }
        for cqe in self.ring.completion() {
            let tag = (cqe.user_data() & 0xFFFF) as u16;
            let len = (cqe.user_data() >> 16) as i64;
            let res = cqe.result() as i64;
            let result = if res < 0 {
                Err(Error::Io(std::io::Error::from_raw_os_error(-res as i32)))
            } else if res != len {
                Err(Error::Unsupported(format!("short local I/O: {res} of {len} bytes (beyond the end of the file?)")))
            } else {
                Ok(0)
            };
            done.push(Completion { tag, result });
        }
        self.inflight -= done.len();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_then_reads_a_file_through_io_uring() {
        let dir = std::env::temp_dir().join(format!("nvmf-host-local-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("disk.img");
        let (file, info) = open(&path, true, 1 << 20).unwrap();
        assert_eq!(info.size, 1 << 20);
        let mut e = match LocalEngine::new(file, 4, 4096) {
            Ok(e) => e,
            Err(err) => {
                eprintln!("io_uring unavailable here, skipping: {err}");
                return;
            }
        };
        e.buffer(0)[..4096].fill(0xAB);
        e.submit(0, false, 8192, 4096).unwrap();
        e.commit().unwrap();
        let mut done = Vec::new();
        while done.is_empty() {
            e.reap(Duration::from_millis(10), &mut done).unwrap();
        }
        assert!(done[0].result.is_ok());
        e.buffer(1).fill(0);
        e.submit(1, true, 8192, 4096).unwrap();
        e.commit().unwrap();
        done.clear();
        while done.is_empty() {
            e.reap(Duration::from_millis(10), &mut done).unwrap();
        }
        assert_eq!(done[0].tag, 1);
        assert!(e.buffer(1)[..4096].iter().all(|&b| b == 0xAB));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
