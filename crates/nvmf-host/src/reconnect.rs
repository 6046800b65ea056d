//! When to try reconnecting after a lost connection, and when to give up: nvme-cli's
//! `--reconnect-delay` and `--ctrl-loss-tmo` as a clock-free state machine. The caller feeds it
//! time stamps and does the connecting and the sleeping, so tests drive it with a fake clock.
//!
//! Meanings follow Linux (`nvmf_should_reconnect`): attempt k starts k × `reconnect_delay` after
//! the loss (an attempt that ran past the next start is followed at once), and no attempt starts
//! later than `ctrl_loss_tmo` after the loss (0: no attempt at all; `None`: forever). With fast
//! attempts that is Linux's ctrl_loss_tmo / reconnect_delay attempts; Linux counts them, we bound
//! time instead, so slow connect attempts cannot stretch an outage past the timeout asked for.

use std::time::{Duration, Instant};

/// nvme-cli's reconnect options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconnectPolicy {
    /// Time between attempts (`--reconnect-delay`).
    pub reconnect_delay: Duration,
    /// How long after the loss attempts may start (`--ctrl-loss-tmo`); `None` = forever (-1).
    pub ctrl_loss_tmo: Option<Duration>,
}

impl ReconnectPolicy {
    /// No reconnect: the first lost connection fails the caller (ctrl-loss-tmo 0).
    pub const NEVER: ReconnectPolicy =
        ReconnectPolicy { reconnect_delay: Duration::from_secs(1), ctrl_loss_tmo: Some(Duration::ZERO) };
}

impl Default for ReconnectPolicy {
    /// A load generator's defaults: retry every second for 10 s (nvme-cli: 10 s and 600 s), so
    /// a target restart is ridden through and a dead target fails the run in seconds.
    fn default() -> Self {
        ReconnectPolicy { reconnect_delay: Duration::from_secs(1), ctrl_loss_tmo: Some(Duration::from_secs(10)) }
    }
}

/// What to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Try to connect now.
    Attempt,
    /// Nothing before this instant.
    WaitUntil(Instant),
    /// ctrl-loss-tmo has passed: stop.
    GiveUp,
}

/// The reconnect schedule of one outage.
#[derive(Debug, Clone)]
pub struct Schedule {
    policy: ReconnectPolicy,
    lost_at: Instant,
    next_at: Instant,
    attempts: u32,
}

impl Schedule {
    pub fn new(policy: ReconnectPolicy, lost_at: Instant) -> Schedule {
        Schedule { policy, lost_at, next_at: lost_at + policy.reconnect_delay, attempts: 0 }
    }

    pub fn step(&self, now: Instant) -> Step {
        if let Some(tmo) = self.policy.ctrl_loss_tmo {
            if self.next_at > self.lost_at + tmo {
                return Step::GiveUp;
            }
        }
        if now < self.next_at {
            Step::WaitUntil(self.next_at)
        } else {
            Step::Attempt
        }
    }

    /// The attempt that [`Schedule::step`] asked for ended in failure at `now`.
    pub fn failed(&mut self, now: Instant) {
        self.attempts += 1;
        // On the grid of the loss time, so oversleeping and fast failures do not drift it.
        self.next_at = (self.next_at + self.policy.reconnect_delay).max(now);
    }

    /// Attempts made so far.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    pub fn lost_at(&self) -> Instant {
        self.lost_at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(delay_ms: u64, tmo_ms: Option<u64>) -> ReconnectPolicy {
        ReconnectPolicy {
            reconnect_delay: Duration::from_millis(delay_ms),
            ctrl_loss_tmo: tmo_ms.map(Duration::from_millis),
        }
    }

    const MS: Duration = Duration::from_millis(1);

    /// Runs the schedule against a fake clock; `ok_at_attempt` is the attempt that succeeds.
    /// Returns the times (ms after the loss) of every attempt, and whether it gave up.
    fn simulate(p: ReconnectPolicy, attempt_cost_ms: u32, ok_at_attempt: Option<u32>) -> (Vec<u64>, bool) {
        let t0 = Instant::now();
        let mut now = t0;
        let mut s = Schedule::new(p, t0);
        let mut tried = Vec::new();
        for _ in 0..10_000 {
            match s.step(now) {
                Step::GiveUp => return (tried, true),
                Step::WaitUntil(t) => {
                    assert!(t > now, "waits only forward");
                    now = t;
                }
                Step::Attempt => {
                    tried.push((now - t0).as_millis() as u64);
                    now += MS * attempt_cost_ms;
                    if ok_at_attempt == Some(tried.len() as u32) {
                        return (tried, false);
                    }
                    s.failed(now);
                }
            }
        }
        panic!("schedule never ended");
    }

    #[test]
    fn attempts_come_every_delay_until_the_loss_timeout() {
        let (tried, gave_up) = simulate(policy(1000, Some(5000)), 0, None);
        assert_eq!(tried, [1000, 2000, 3000, 4000, 5000], "as Linux: ctrl_loss_tmo / reconnect_delay attempts");
        assert!(gave_up);
    }

    #[test]
    fn slow_attempts_do_not_stretch_the_timeout() {
        // Attempts shorter than the delay keep the grid.
        let (tried, gave_up) = simulate(policy(1000, Some(5000)), 700, None);
        assert_eq!(tried, [1000, 2000, 3000, 4000, 5000]);
        assert!(gave_up);
        // Each attempt takes 1.5 s (a connect timing out): the next follows at once, and none
        // starts after the timeout.
        let (tried, gave_up) = simulate(policy(1000, Some(5000)), 1500, None);
        assert_eq!(tried, [1000, 2500, 4000]);
        assert!(gave_up);
    }

    #[test]
    fn success_ends_the_schedule() {
        let (tried, gave_up) = simulate(policy(200, Some(5000)), 5, Some(3));
        assert_eq!(tried, [200, 400, 600]);
        assert!(!gave_up);
    }

    #[test]
    fn zero_timeout_never_attempts_and_minus_one_never_gives_up() {
        let (tried, gave_up) = simulate(policy(1000, Some(0)), 0, None);
        assert!(tried.is_empty() && gave_up, "ctrl-loss-tmo 0: fail at once");
        let t0 = Instant::now();
        assert_eq!(Schedule::new(ReconnectPolicy::NEVER, t0).step(t0), Step::GiveUp);
        let (tried, gave_up) = simulate(policy(10, None), 0, Some(500));
        assert_eq!(tried.len(), 500);
        assert!(!gave_up, "ctrl-loss-tmo -1: keep trying");
    }

    #[test]
    fn waiting_is_reported_until_the_attempt_time() {
        let t0 = Instant::now();
        let s = Schedule::new(policy(1000, Some(3000)), t0);
        assert_eq!(s.step(t0), Step::WaitUntil(t0 + 1000 * MS));
        assert_eq!(s.step(t0 + 999 * MS), Step::WaitUntil(t0 + 1000 * MS));
        assert_eq!(s.step(t0 + 1000 * MS), Step::Attempt);
        assert_eq!(s.attempts(), 0);
    }
}
