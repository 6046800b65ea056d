//! Stall detection: a connection that owes us something (the rest of a PDU, the data of an R2T)
//! or does not read what we send, and makes no progress for the stall timeout, is dropped. A
//! host that sends a PDU header and then nothing would otherwise hold its buffers forever;
//! keep-alive does not help, since a queue with kato = 0 is never timed out.
//!
//! Progress is a whole PDU received or any byte of ours written to the socket. Counting whole
//! PDUs, not bytes, defeats a host that dribbles one byte at a time.

use std::time::{Duration, Instant};

pub struct StallWatch {
    /// None: never drop (stall_timeout_ms = 0).
    timeout: Option<Duration>,
    progress: u64,
    seen: u64,
    since: Instant,
}

impl StallWatch {
    pub fn new(timeout_ms: u64, now: Instant) -> StallWatch {
        let timeout = (timeout_ms > 0).then(|| Duration::from_millis(timeout_ms));
        StallWatch { timeout, progress: 0, seen: 0, since: now }
    }

    /// A whole PDU came in, or some output went out.
    pub fn progressed(&mut self) {
        self.progress = self.progress.wrapping_add(1);
    }

    /// True once the connection has been `waiting` on its host, without progress, for longer
    /// than the timeout. Called from the periodic tick.
    pub fn expired(&mut self, waiting: bool, now: Instant) -> bool {
        if !waiting || self.progress != self.seen {
            self.seen = self.progress;
            self.since = now;
            return false;
        }
        self.timeout.is_some_and(|t| now.saturating_duration_since(self.since) > t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_waiting_without_progress_expires() {
        let t0 = Instant::now();
        let s = Duration::from_millis;
        let mut w = StallWatch::new(100, t0);
        assert!(!w.expired(true, t0 + s(50)));
        assert!(!w.expired(true, t0 + s(100)));
        assert!(w.expired(true, t0 + s(151)), "waiting with no progress for > 100 ms");
        w.progressed();
        assert!(!w.expired(true, t0 + s(160)), "progress restarts the clock");
        assert!(!w.expired(false, t0 + s(1000)), "an idle connection is not stalled");
        assert!(!w.expired(true, t0 + s(1050)));
        assert!(w.expired(true, t0 + s(1101)));
        let mut never = StallWatch::new(0, t0);
        assert!(!never.expired(true, t0 + s(1_000_000)), "0 disables");
    }
}
