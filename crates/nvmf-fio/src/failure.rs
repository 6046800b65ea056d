//! What the engine reports to fio when something fails: an errno and a message.

use std::ffi::c_int;

use nvmf_host::Error;

/// An error for fio: an errno and a message for the user.
#[derive(Debug)]
pub struct Failure {
    pub errno: c_int,
    pub message: String,
}

impl Failure {
    pub(crate) fn new(errno: c_int, message: impl Into<String>) -> Self {
        Failure { errno, message: message.into() }
    }
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Failure::new(libc_errno::EINVAL, message)
    }
}

/// The errno values used here (Linux), without a libc dependency.
pub(crate) mod libc_errno {
    pub const EIO: i32 = 5;
    pub const EACCES: i32 = 13;
    pub const EINVAL: i32 = 22;
    pub const ETIMEDOUT: i32 = 110;
}

pub(crate) fn errno_of(e: &Error) -> c_int {
    match e {
        Error::Connect { source, .. } | Error::Io(source) => source.raw_os_error().unwrap_or(libc_errno::EIO),
        Error::Timeout(_) => libc_errno::ETIMEDOUT,
        Error::Unsupported(_) => libc_errno::EINVAL,
        // A refused TLS key or DH-HMAC-CHAP secret: permission, not an I/O failure.
        Error::Auth(_) => libc_errno::EACCES,
        _ => libc_errno::EIO,
    }
}
