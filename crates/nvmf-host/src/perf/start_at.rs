//! `--start-at`: a start barrier across hosts. Several nvmf-perf processes (one per initiator
//! host) are given the same wall-clock moment; each connects, sets up its queues, then waits
//! for that moment before its first I/O. The moment each one was actually released goes into
//! the report (`nvmflab.start`), so the harness can measure the skew between hosts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

/// The furthest ahead a start may be set: a wrong clock or a typo must not park a run for days.
pub const MAX_AHEAD: Duration = Duration::from_secs(3600);

/// A wall-clock start moment, in ns since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartAt(pub u64);

/// `--start-at SECONDS`: Unix epoch seconds, fractions allowed (1764216000.25).
pub fn parse(s: &str) -> Result<StartAt, String> {
    let t = s.trim();
    if t.is_empty() || !t.chars().all(|c| c.is_ascii_digit() || c == '.') || t.matches('.').count() > 1 {
        return Err(format!("invalid start time {s:?}: expected Unix epoch seconds (1764216000 or 1764216000.25)"));
    }
    let (whole, frac) = t.split_once('.').unwrap_or((t, ""));
    let secs: u64 = whole.parse().map_err(|_| format!("invalid start time {s:?}: out of range"))?;
    // Up to nanoseconds; digits beyond are dropped rather than rounded.
    let digits: String = frac.chars().chain(std::iter::repeat('0')).take(9).collect();
    let nanos: u64 = digits.parse().map_err(|_| format!("invalid start time {s:?}"))?;
    secs.checked_mul(1_000_000_000)
        .and_then(|ns| ns.checked_add(nanos))
        .map(StartAt)
        .ok_or_else(|| format!("invalid start time {s:?}: out of range"))
}

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// Where every job thread waits; remembers the earliest release.
#[derive(Debug)]
pub struct StartGate {
    at: Option<StartAt>,
    released_ns: AtomicU64,
}

impl StartGate {
    /// A gate for `at`; an error when `at` lies more than MAX_AHEAD in the future.
    pub fn new(at: Option<StartAt>) -> Result<Self, String> {
        if let Some(StartAt(ns)) = at {
            let ahead = ns.saturating_sub(now_ns());
            if ahead > MAX_AHEAD.as_nanos() as u64 {
                return Err(format!(
                    "--start-at is {} s from now; at most {} s ahead is allowed (are the clocks set?)",
                    ahead / 1_000_000_000,
                    MAX_AHEAD.as_secs()
                ));
            }
        }
        Ok(Self { at, released_ns: AtomicU64::new(u64::MAX) })
    }

    /// Sleeps until the start moment (at once when it has passed or none was given).
    pub fn wait(&self) {
        if let Some(StartAt(at)) = self.at {
            loop {
                let now = now_ns();
                if now >= at {
                    break;
                }
                // Sleep most of the way, then in short steps: a single long sleep can overshoot.
                let left = at - now;
                std::thread::sleep(Duration::from_nanos(if left > 2_000_000 { left - 1_000_000 } else { left.min(50_000) }));
            }
        }
        self.released_ns.fetch_min(now_ns(), Ordering::Relaxed);
    }

    /// `{"at_ns", "released_ns"}` for the report; None without `--start-at`.
    pub fn to_json(&self) -> Option<Value> {
        let StartAt(at) = self.at?;
        let released = self.released_ns.load(Ordering::Relaxed);
        Some(json!({"at_ns": at, "released_ns": (released != u64::MAX).then_some(released)}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_whole_and_fractional_seconds() {
        assert_eq!(parse("1764216000"), Ok(StartAt(1_764_216_000_000_000_000)));
        assert_eq!(parse("1764216000.25"), Ok(StartAt(1_764_216_000_250_000_000)));
        assert_eq!(parse(" 1.000000001999 "), Ok(StartAt(1_000_000_001)));
    }

    #[test]
    fn refuses_what_is_not_epoch_seconds() {
        for bad in ["", "-1", "1e9", "1.2.3", "12s", "99999999999999999999", "18446744073.709551616"] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn refuses_a_start_far_ahead() {
        let far = StartAt(now_ns() + 2 * MAX_AHEAD.as_nanos() as u64);
        assert!(StartGate::new(Some(far)).unwrap_err().contains("at most"));
    }

    #[test]
    fn waits_until_the_moment_and_records_the_release() {
        let at = now_ns() + 30_000_000;
        let gate = StartGate::new(Some(StartAt(at))).unwrap();
        gate.wait();
        let released = gate.to_json().unwrap()["released_ns"].as_u64().unwrap();
        assert!(released >= at, "released {} ns early", at - released);
        assert!(released - at < 20_000_000, "released {} ms late", (released - at) / 1_000_000);
    }

    #[test]
    fn a_past_moment_or_none_releases_at_once() {
        let gate = StartGate::new(Some(StartAt(1))).unwrap();
        gate.wait();
        assert!(gate.to_json().unwrap()["released_ns"].as_u64().unwrap() > 1);
        let none = StartGate::new(None).unwrap();
        none.wait();
        assert!(none.to_json().is_none());
    }
}
