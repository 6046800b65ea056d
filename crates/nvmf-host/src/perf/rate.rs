//! `--rate_iops`: issue I/O on absolute deadlines (start + k / rate) so that the achieved rate
//! does not drift the way "sleep an interval after each I/O" does. Time is passed in as
//! nanoseconds since the job started, which keeps the math testable with a fake clock.

/// Deadline schedule for one job.
#[derive(Debug, Clone)]
pub struct RateLimiter {
    rate_iops: u64,
    start_ns: u64,
    issued: u64,
}

impl RateLimiter {
    /// A schedule of `rate_iops` I/Os per second beginning at `start_ns`.
    pub fn new(rate_iops: u64, start_ns: u64) -> Self {
        RateLimiter { rate_iops: rate_iops.max(1), start_ns, issued: 0 }
    }

    /// The deadline of the next I/O: start + issued / rate, computed exactly (no accumulated
    /// rounding error) in 128-bit arithmetic.
    pub fn next_deadline_ns(&self) -> u64 {
        let offset = (self.issued as u128 * 1_000_000_000u128) / self.rate_iops as u128;
        self.start_ns.saturating_add(offset.min(u64::MAX as u128) as u64)
    }

    /// Takes one I/O slot if its deadline has passed. A job that fell behind (the target
    /// stalled, all tags were busy) catches up back-to-back, which keeps the average on rate.
    pub fn try_take(&mut self, now_ns: u64) -> bool {
        if now_ns >= self.next_deadline_ns() {
            self.issued += 1;
            true
        } else {
            false
        }
    }

    /// Nanoseconds until the next slot (0 when one is due).
    pub fn wait_ns(&self, now_ns: u64) -> u64 {
        self.next_deadline_ns().saturating_sub(now_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Simulates a job that checks the limiter every `tick_ns` for `dur_ns` and counts I/Os.
    fn simulate(rate: u64, tick_ns: u64, dur_ns: u64) -> u64 {
        let mut rl = RateLimiter::new(rate, 0);
        let mut now = 0;
        let mut n = 0;
        while now < dur_ns {
            while rl.try_take(now) {
                n += 1;
            }
            now += tick_ns;
        }
        n
    }

    #[test]
    fn achieved_rate_is_within_five_percent() {
        for &(rate, tick) in &[(1000u64, 1_000u64), (50_000, 7_000), (3, 1_000_000), (200_000, 13_000)] {
            let n = simulate(rate, tick, 2_000_000_000);
            let expect = rate * 2;
            let err = (n as f64 - expect as f64).abs() / expect as f64;
            assert!(err <= 0.05, "rate {rate} tick {tick}: {n} I/Os, expected {expect}");
        }
    }

    #[test]
    fn deadlines_are_absolute_and_exact() {
        let mut rl = RateLimiter::new(3, 100);
        assert_eq!(rl.next_deadline_ns(), 100);
        assert!(rl.try_take(100));
        assert_eq!(rl.next_deadline_ns(), 100 + 333_333_333);
        assert!(!rl.try_take(200));
        assert_eq!(rl.wait_ns(200), 333_333_233);
        assert!(rl.try_take(1_000_000_000));
        assert!(rl.try_take(1_000_000_000));
        // The third I/O lands exactly at one second: no drift from rounding 1/3 s.
        assert_eq!(rl.next_deadline_ns(), 1_000_000_100);
    }

    #[test]
    fn a_late_job_catches_up_then_keeps_the_rate() {
        let mut rl = RateLimiter::new(1000, 0);
        let mut burst = 0;
        while rl.try_take(10_000_000) {
            burst += 1;
        }
        assert_eq!(burst, 11, "slots at 0, 1, ..., 10 ms are all due");
        assert!(!rl.try_take(10_500_000));
        assert!(rl.try_take(11_000_000));
    }
}
