//! A large payload's records received straight into its command buffer over userspace TLS
//! (`nvmf_tls::landing`), as plain TCP lands the payload there (`transport/tcp/landing.rs`).
//! Records that do not fit the buffer, and everything when no payload lands, go through the
//! session's receive buffer ([`Wire::read`]).

use super::{State, Wire};
use std::io::{self, ErrorKind, Read};
use std::sync::atomic::Ordering::Relaxed;

impl Wire {
    /// Reads plaintext into `dst`, the rest of a payload that lands in its command buffer, with
    /// [`Read::read`]'s contract (a short count or `WouldBlock` only once the socket had no more).
    pub(super) fn read_landing(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        let t = match &mut self.state {
            State::Tls(t) if !t.kernel && t.session.is_established() => t,
            _ => return self.read(dst),
        };
        let mut done = 0;
        let mut drained = false;
        loop {
            match t.session.read_plaintext(&mut dst[done..]) {
                Ok(n) => done += n,
                Err(e) => return Err(t.failed(&mut self.stream, &self.port, self.peer, e, false)),
            }
            t.eof |= t.session.peer_closed();
            if done == dst.len() || t.eof {
                return Ok(done);
            }
            let landing = match t.session.land_start(&mut dst[done..]) {
                Ok(landing) => landing,
                Err(e) => return Err(t.failed(&mut self.stream, &self.port, self.peer, e, false)),
            };
            if drained {
                return if done > 0 { Ok(done) } else { Err(ErrorKind::WouldBlock.into()) };
            }
            let (read, want) = if landing {
                let mut iov = t.session.land_slices(&mut dst[done..]);
                let want: usize = iov.iter().map(|s| s.len()).sum();
                (self.stream.read_vectored(&mut iov), want)
            } else {
                let limit = t.session.landing_read_limit();
                let space = t.session.recv_space();
                let want = space.len().min(limit);
                (self.stream.read(&mut space[..want]), want)
            };
            let n = match read {
                Ok(0) => {
                    t.eof = true;
                    return Ok(done);
                }
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock && done > 0 => return Ok(done),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            drained = n < want;
            let fed = if landing {
                t.session.land_received(n, &mut dst[done..]).map(|opened| {
                    let k = opened.unwrap_or(0);
                    done += k;
                    self.port.tls_stats.landed_bytes.fetch_add(k as u64, Relaxed);
                })
            } else {
                t.session.received(n)
            };
            // A KeyUpdate's answer, or the alert of a failure, goes out now.
            t.queue_ciphertext();
            if let Err(e) = fed {
                return Err(t.failed(&mut self.stream, &self.port, self.peer, e, false));
            }
            let _ = t.flush_out(&mut self.stream);
        }
    }
}
