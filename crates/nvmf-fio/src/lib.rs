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
//!
//! This file is the C interface shim.c calls; `settings` checks the engine options, `job` does
//! one job's NVMe/TCP work, `failure` turns errors into an errno and a message.

use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

mod failure;
mod job;
mod settings;

pub use failure::Failure;
use failure::libc_errno;
pub use job::{file_size, parse_namespace, Job, Namespace};
use settings::cstr;
pub use settings::{tls_options, Conf, Settings};

/// Operation codes of [`nvmf_fio_queue`] (shared with shim.c).
pub const OP_READ: c_int = 0;
pub const OP_WRITE: c_int = 1;
pub const OP_TRIM: c_int = 2;
pub const OP_FLUSH: c_int = 3;

/// I/Os in flight with no completion for this long fail the job (ETIMEDOUT) instead of hanging.
pub const STALL_LIMIT: Duration = Duration::from_secs(30);
/// Limit for connection set-up and each admin command.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

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
