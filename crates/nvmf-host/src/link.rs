//! [`Link`]: the bytes under a queue's protocol machine. A module of its own so that the links
//! (the TCP socket in `connection`, TLS records in `tls`) depend on it and not on each other.

use std::io::{IoSlice, IoSliceMut};
use std::time::Duration;

use crate::error::Result;

/// The byte stream under a connection: a TCP socket, TLS records over one, or bytes in memory
/// (tests, fuzzing).
pub trait Link: Send {
    /// Reads what has arrived into `buf`: how many bytes, 0 when none has yet;
    /// [`crate::Error::Closed`] once the peer ended the stream.
    fn recv(&mut self, buf: &mut [u8]) -> Result<usize>;
    /// Writes what the link takes now: how many bytes, 0 when it would block.
    fn send(&mut self, buf: &[u8]) -> Result<usize>;
    /// [`Link::recv`] into several buffers in order (readv(2) on a socket). By default only the
    /// first non-empty one is filled.
    fn recv_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> Result<usize> {
        match bufs.iter_mut().find(|b| !b.is_empty()) {
            Some(b) => self.recv(b),
            None => Ok(0),
        }
    }
    /// [`Link::send`] from several buffers in order (writev(2) on a socket). By default only
    /// the first non-empty one is sent.
    fn send_vectored(&mut self, bufs: &[IoSlice<'_>]) -> Result<usize> {
        match bufs.iter().find(|b| !b.is_empty()) {
            Some(b) => self.send(b),
            None => Ok(0),
        }
    }
    /// Sleeps until input may have arrived (or, with `writing`, the link may take more) or
    /// `timeout` passed.
    fn wait(&self, timeout: Duration, writing: bool) -> Result<()>;
    /// Whether input may be waiting, asked without reading (and without the socket's lock).
    /// By default always: the caller then just reads.
    fn readable_now(&self) -> Result<bool> {
        Ok(true)
    }
}
