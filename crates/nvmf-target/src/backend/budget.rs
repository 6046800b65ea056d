//! The process-wide cap on command data buffers. Each connection already has its own budget
//! (`transport::BUFFER_BUDGET`); this one bounds their sum, so many connections together cannot
//! make the process allocate more than the machine can spare. Lock free: one atomic add per
//! buffer that grows, nothing for buffers reused at their size.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

#[derive(Debug)]
pub struct MemoryBudget {
    limit: usize,
    used: AtomicUsize,
    /// The most `used` has been since start (`/stats`: whether the cap held).
    peak: AtomicUsize,
    /// Times a buffer had to wait because the process was at its cap (diagnostics, tests).
    refusals: AtomicU64,
}

impl MemoryBudget {
    pub fn new(limit: usize) -> MemoryBudget {
        MemoryBudget { limit, used: AtomicUsize::new(0), peak: AtomicUsize::new(0), refusals: AtomicU64::new(0) }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes taken by every connection's buffers (idle cached ones included).
    pub fn used(&self) -> usize {
        self.used.load(Relaxed)
    }

    pub fn peak(&self) -> usize {
        self.peak.load(Relaxed)
    }

    pub fn refusals(&self) -> u64 {
        self.refusals.load(Relaxed)
    }

    /// Takes `n` bytes if they fit under the cap (or unconditionally with `force`: data that
    /// already arrived in a capsule).
    pub fn try_take(&self, n: usize, force: bool) -> bool {
        if force {
            let before = self.used.fetch_add(n, Relaxed);
            self.peak.fetch_max(before + n, Relaxed);
            return true;
        }
        match self.used.fetch_update(Relaxed, Relaxed, |u| u.checked_add(n).filter(|t| *t <= self.limit)) {
            Ok(before) => {
                self.peak.fetch_max(before + n, Relaxed);
                true
            }
            Err(_) => {
                self.refusals.fetch_add(1, Relaxed);
                false
            }
        }
    }

    pub fn give_back(&self, n: usize) {
        self.used.fetch_sub(n, Relaxed);
    }

    /// True once the cap is reached: connections then hold back new commands while their
    /// output waits (see `Connection::reads_input`).
    pub fn full(&self) -> bool {
        self.used() >= self.limit
    }

    /// True above half the cap: connections then free buffers they are not using instead of
    /// caching them, so memory flows to the connections that wait for it.
    pub fn under_pressure(&self) -> bool {
        self.used() > self.limit / 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_up_to_the_limit_and_forced_takes_go_beyond() {
        let b = MemoryBudget::new(100);
        assert!(b.try_take(60, false));
        assert!(b.under_pressure());
        assert!(!b.try_take(41, false), "over the cap");
        assert_eq!(b.refusals(), 1);
        assert!(b.try_take(40, false));
        assert!(b.try_take(10, true), "in-capsule data already arrived");
        assert_eq!(b.used(), 110);
        b.give_back(110);
        assert_eq!(b.used(), 0);
        assert!(!b.under_pressure());
        assert_eq!(b.peak(), 110, "the peak stays after the bytes go back");
    }
}
