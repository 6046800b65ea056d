//! An NVMe/TCP connection as the reactor drives it: its socket (the [`Wire`], TLS or not) and
//! the sans-I/O [`Connection`] behind the [`QueueDriver`] hooks, with the socket reads and
//! writes the acceptor shares.

use super::drive::submit;
use crate::backend::{IoCompletion, IoEngine};
use crate::stats::ReactorStats;
use crate::transport::tcp::Connection;
use crate::transport::QueueDriver;
use crate::wire::Wire;
use mio::{Interest, Registry, Token};
use std::io::{ErrorKind, IoSlice, IoSliceMut, Read, Write};
use std::sync::Arc;
use std::time::Instant;

pub struct TcpQueue {
    pub stream: Wire,
    pub conn: Connection,
}

impl QueueDriver for TcpQueue {
    #[inline]
    fn register(&mut self, registry: &Registry, token: Token) -> std::io::Result<()> {
        registry.register(&mut self.stream.stream, token, Interest::READABLE | Interest::WRITABLE)
    }

    #[inline]
    fn attach(&mut self, token: u32, stats: &Arc<ReactorStats>, now: Instant) {
        self.conn.attach(token, stats);
        // Input the acceptor decrypted and the connection had no room for yet.
        if self.stream.has_buffered_input() && read_all(&mut self.stream, &mut self.conn, now).is_none() {
            self.conn.close();
        }
    }

    #[inline]
    fn ready(&mut self, ev: &mio::event::Event, now: Instant) {
        if (ev.is_readable() || ev.is_read_closed() || ev.is_error()) && read_all(&mut self.stream, &mut self.conn, now).is_none() {
            self.conn.close();
        }
    }

    #[inline]
    fn poll_input(&mut self, now: Instant) -> Option<usize> {
        let n = read_all(&mut self.stream, &mut self.conn, now);
        if n.is_none() {
            self.conn.close();
        }
        n
    }

    #[inline]
    fn polls_without_syscall(&self) -> bool {
        false
    }

    #[inline]
    fn process(&mut self, now: Instant) {
        self.conn.process(now);
    }

    #[inline]
    fn submit(&mut self, engine: &mut IoEngine) {
        submit(&mut self.conn, engine);
    }

    #[inline]
    fn complete_io(&mut self, c: IoCompletion) {
        self.conn.complete_io(c);
    }

    #[inline]
    fn service(&mut self, now: Instant, tick: bool) {
        let (stream, conn) = (&mut self.stream, &mut self.conn);
        if tick {
            conn.tick(now);
            if conn.wants().hold {
                // Memory may have been freed by another connection: read what waited in the
                // socket while the input buffer was full (read_all processes first when it
                // is), then try again.
                match read_all(stream, conn, now) {
                    None => conn.close(),
                    Some(_) => conn.process(now),
                }
            }
        }
        let wants = conn.wants();
        if wants.write || stream.has_pending_output() {
            if !write_all(stream, conn) {
                conn.close();
            } else {
                let drained = !wants.read && conn.wants().read;
                // Output drained below the mark: read what we held back.
                if drained && read_all(stream, conn, now).is_none() {
                    conn.close();
                }
                // That input, and commands waiting for the buffers written data freed.
                if drained || wants.hold {
                    conn.process(now);
                }
            }
        }
    }

    #[inline]
    fn arm(&mut self, _: Instant) -> bool {
        false // edge-triggered socket readiness needs no arming
    }

    #[inline]
    fn should_close(&self) -> bool {
        self.conn.should_close()
    }

    fn teardown(&mut self, registry: &Registry) {
        self.conn.close();
        let _ = registry.deregister(&mut self.stream.stream);
        let _ = self.stream.stream.shutdown(std::net::Shutdown::Both);
    }

    #[inline]
    fn in_flight(&self) -> usize {
        self.conn.in_flight()
    }
}

/// Reads all available bytes: how many, or None when the peer closed or the socket failed.
///
/// Readiness is edge-triggered, so the socket must be read until it would block. Each read is
/// vectored: a large payload whose header is in lands straight in its command buffer, the
/// bytes after it in the receive buffer. After a read that filled all it was given, the PDUs
/// in are processed: that makes room, and tells where the next payload goes. Only if that
/// frees nothing (output backpressure, or a connection that is not attached yet) does reading
/// stop; the reactor reads again once output drains.
pub(super) fn read_all(stream: &mut Wire, conn: &mut Connection, now: Instant) -> Option<usize> {
    let mut total = 0;
    loop {
        if !conn.wants().read {
            return Some(total); // backpressure: resume once output drains
        }
        let result = {
            let mut iov: [IoSliceMut; 4] = std::array::from_fn(|_| IoSliceMut::new(&mut []));
            let n = conn.recv_slices(&mut iov);
            let want: usize = iov[..n].iter().map(|s| s.len()).sum();
            (want > 0).then(|| (stream.read_vectored(&mut iov[..n]), want))
        };
        let Some((read, want)) = result else {
            conn.process(now);
            let mut probe: [IoSliceMut; 4] = std::array::from_fn(|_| IoSliceMut::new(&mut []));
            if conn.recv_slices(&mut probe) == 0 {
                return Some(total);
            }
            continue;
        };
        match read {
            Ok(0) => return None,
            Ok(n) => {
                conn.recv_commit(n);
                total += n;
                if n < want {
                    return Some(total);
                }
                conn.process(now);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Some(total),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return None,
        }
    }
}

/// Slices per vectored write: a null read under 16 KiB takes two (its header, its spliced zeros),
/// so that a QD128 burst of them still goes out in one call (Linux takes up to 1024).
const WRITE_IOV: usize = 256;

/// Writes as much queued output as the socket takes, many PDUs per syscall: one vectored
/// write gathers headers and responses with read data straight from the command buffers.
pub(super) fn write_all(stream: &mut Wire, conn: &mut Connection) -> bool {
    match stream.flush_pending() {
        Ok(true) => {}
        Ok(false) => return true,
        Err(_) => return false,
    }
    while conn.output_len() > 0 {
        let written = {
            let mut iov = [IoSlice::new(&[]); WRITE_IOV];
            let n = conn.output_slices(&mut iov);
            stream.write_vectored(&iov[..n])
        };
        match written {
            Ok(0) => return false,
            Ok(n) => conn.consume_output(n),
            Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
    true
}
