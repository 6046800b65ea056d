//! File backend: a regular file or a block device, read and written through the reactor's
//! io_uring. Opened with O_DIRECT so the page cache does not hide the device; filesystems that
//! refuse O_DIRECT (tmpfs, some overlayfs) answer EINVAL, and then the file is opened buffered
//! with a warning naming the path.
//!
//! Durability: Flush is fdatasync (IORING_OP_FSYNC with DATASYNC), a FUA write is a write with
//! RWF_DSYNC, so each is durable when it completes. [`DurabilityCounters`] count both once the
//! kernel reports them done, so tests can tell a real flush from a no-op.

use super::{AlignedBuf, BackendError, IoOp, IoRequest};
use io_uring::{opcode, squeue, types};
use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// BLKGETSIZE64: the size of a block device in bytes.
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;

pub struct FileStore {
    file: File,
    size: u64,
    direct: bool,
    /// Alignment O_DIRECT needs of buffer memory (1 when buffered).
    memory_align: usize,
    path: PathBuf,
    volatile_cache: bool,
    counters: Arc<DurabilityCounters>,
}

/// Durable operations the kernel completed successfully for one file namespace.
#[derive(Debug, Default)]
pub struct DurabilityCounters {
    /// fdatasync calls: Flush commands and shutdown syncs.
    pub fdatasyncs: AtomicU64,
    /// Writes issued with RWF_DSYNC (FUA).
    pub dsync_writes: AtomicU64,
}

/// The io_uring entry (without user data) for reads, writes and flushes of `fd`; `None` for
/// operations done synchronously.
pub(super) fn uring_entry(fd: RawFd, req: &IoRequest) -> Option<squeue::Entry> {
    let fd = types::Fd(fd);
    Some(match req.op {
        IoOp::Read => opcode::Read::new(fd, req.buf, req.len as u32).offset(req.offset).build(),
        IoOp::Write => opcode::Write::new(fd, req.buf, req.len as u32).offset(req.offset).build(),
        IoOp::WriteFua => {
            opcode::Write::new(fd, req.buf, req.len as u32).offset(req.offset).rw_flags(libc::RWF_DSYNC).build()
        }
        IoOp::Flush => opcode::Fsync::new(fd).flags(types::FsyncFlags::DATASYNC).build(),
        IoOp::WriteZeroes | IoOp::Deallocate => return None,
    })
}

impl FileStore {
    pub fn open(path: &Path, block_size: u32) -> Result<FileStore, BackendError> {
        let open = |flags: i32| OpenOptions::new().read(true).write(true).custom_flags(flags).open(path);
        let (file, direct) = match open(libc::O_DIRECT) {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::warn!(path = %path.display(), "O_DIRECT refused by the filesystem; using buffered I/O");
                (open(0).map_err(|source| BackendError::Open { path: path.into(), source })?, false)
            }
            Err(source) => return Err(BackendError::Open { path: path.into(), source }),
        };
        let meta = file.metadata().map_err(|source| BackendError::Open { path: path.into(), source })?;
        let raw_size = if meta.file_type().is_block_device() {
            let mut size: u64 = 0;
            // SAFETY: BLKGETSIZE64 writes one u64 through the pointer.
            if unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size) } != 0 {
                let why = format!("BLKGETSIZE64 failed: {}", std::io::Error::last_os_error());
                return Err(BackendError::Unusable { path: path.into(), why });
            }
            size
        } else if meta.is_file() {
            meta.len()
        } else {
            return Err(BackendError::Unusable { path: path.into(), why: "not a regular file or block device".into() });
        };
        let size = raw_size - raw_size % block_size as u64;
        if size == 0 {
            let why = format!("smaller than one {block_size}-byte block; create it first, e.g. truncate -s 1G");
            return Err(BackendError::Unusable { path: path.into(), why });
        }
        let volatile_cache = has_volatile_cache(&meta, direct);
        let memory_align = if direct { direct_io_memory_align(&file) } else { 1 };
        Ok(FileStore { file, size, direct, memory_align, path: path.into(), volatile_cache, counters: Arc::default() })
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn is_direct(&self) -> bool {
        self.direct
    }

    pub fn memory_align(&self) -> usize {
        self.memory_align
    }

    pub(super) fn raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Whether completed writes can still be lost on power failure until a Flush (VWC).
    pub fn volatile_cache(&self) -> bool {
        self.volatile_cache
    }

    pub fn counters(&self) -> &Arc<DurabilityCounters> {
        &self.counters
    }

    /// Makes written data durable (CC.SHN shutdown). Blocking, outside the data path.
    pub fn sync(&self) -> Result<(), i32> {
        // SAFETY: the fd is open for the life of self.
        if unsafe { libc::fdatasync(self.file.as_raw_fd()) } == 0 {
            self.counters.fdatasyncs.fetch_add(1, Relaxed);
            return Ok(());
        }
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO))
    }

    /// How many fdatasyncs completed (Flush commands and shutdown syncs).
    pub fn sync_count(&self) -> u64 {
        self.counters.fdatasyncs.load(Relaxed)
    }

    /// Synchronous execution: Write Zeroes and Deallocate always, everything without io_uring.
    pub(super) fn execute_sync(&self, req: &IoRequest) -> Result<(), i32> {
        let fd = self.file.as_raw_fd();
        let (off, len) = (req.offset as libc::off_t, req.len as libc::off_t);
        let errno = || std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
        // SAFETY (all calls): fd is open; buf is valid for len bytes (submitter's contract).
        match req.op {
            IoOp::Read | IoOp::Write | IoOp::WriteFua => {
                let mut done = 0usize;
                while done < req.len as usize {
                    let rest = req.len as usize - done;
                    let n = unsafe {
                        let p = req.buf.add(done);
                        let at = off + done as libc::off_t;
                        let iov = libc::iovec { iov_base: p as *mut libc::c_void, iov_len: rest };
                        match req.op {
                            IoOp::Read => libc::pread(fd, p as *mut libc::c_void, rest, at),
                            IoOp::WriteFua => libc::pwritev2(fd, &iov, 1, at, libc::RWF_DSYNC),
                            _ => libc::pwrite(fd, p as *const libc::c_void, rest, at),
                        }
                    };
                    if n <= 0 {
                        return Err(if n == 0 { libc::EIO } else { errno() });
                    }
                    done += n as usize;
                }
                if req.op == IoOp::WriteFua {
                    self.counters.dsync_writes.fetch_add(1, Relaxed);
                }
                Ok(())
            }
            IoOp::Flush => self.sync(),
            IoOp::Deallocate => {
                // Advisory: a filesystem that cannot punch holes still completes the command.
                unsafe { libc::fallocate(fd, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, off, len) };
                Ok(())
            }
            IoOp::WriteZeroes => {
                let mode = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
                if unsafe { libc::fallocate(fd, mode, off, len) } == 0 {
                    return Ok(());
                }
                self.write_zeroes_slow(req)
            }
        }
    }

    /// Write Zeroes for filesystems without FALLOC_FL_ZERO_RANGE: write zeroed blocks.
    fn write_zeroes_slow(&self, req: &IoRequest) -> Result<(), i32> {
        const CHUNK: u64 = 1 << 20;
        // New allocations are zeroed.
        let mut zeroes = AlignedBuf::new();
        zeroes.try_resize(CHUNK.min(req.len) as usize).map_err(|_| libc::ENOMEM)?;
        let mut done = 0;
        while done < req.len {
            let n = CHUNK.min(req.len - done);
            let chunk = IoRequest { op: IoOp::Write, offset: req.offset + done, len: n, buf: zeroes.as_mut_ptr(), tag: 0 };
            self.execute_sync(&chunk).inspect_err(|e| {
                tracing::error!(path = %self.path.display(), "write zeroes failed: errno {e}");
            })?;
            done += n;
        }
        Ok(())
    }
}

/// Whether writes that completed may still sit in a volatile cache. A buffered file: the page
/// cache, yes. O_DIRECT bypasses the page cache but not the device's write cache nor the
/// filesystem's metadata (a write into a hole allocates blocks that only fdatasync commits), so a
/// regular file is always volatile. A block device opened O_DIRECT is volatile unless the kernel
/// says its cache is write through (`queue/write_cache` in sysfs).
fn has_volatile_cache(meta: &std::fs::Metadata, direct: bool) -> bool {
    if !direct || !meta.file_type().is_block_device() {
        return true;
    }
    use std::os::unix::fs::MetadataExt;
    let rdev = meta.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    // A partition's queue is its parent disk's: /sys/dev/block/M:m/../queue for partitions.
    let dev = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    let mode = std::fs::read_to_string(dev.join("queue/write_cache"))
        .or_else(|_| std::fs::read_to_string(dev.join("../queue/write_cache")));
    !matches!(mode.as_deref().map(str::trim), Ok("write through"))
}

/// The memory alignment O_DIRECT needs for `file`, from statx (STATX_DIOALIGN, Linux 6.1; block
/// devices 6.11). A page where the kernel does not say: enough for every device.
fn direct_io_memory_align(file: &File) -> usize {
    // SAFETY: statx is plain data; the kernel fills it through the pointer.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let empty = c"";
    // SAFETY: AT_EMPTY_PATH with an empty path queries the open descriptor itself.
    let rc = unsafe { libc::statx(file.as_raw_fd(), empty.as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_DIOALIGN, &mut stx) };
    if rc == 0 && stx.stx_mask & libc::STATX_DIOALIGN != 0 && stx.stx_dio_mem_align > 0 {
        stx.stx_dio_mem_align as usize
    } else {
        4096
    }
}
