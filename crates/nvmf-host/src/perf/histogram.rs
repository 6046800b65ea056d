//! Latency recording: an HDR histogram per job and direction, merged for the report.
//! Recording never allocates (the histogram is sized up front for 1 ns .. 1 h at 3 digits).

use hdrhistogram::Histogram;

/// Percentiles reported, with fio's key formatting.
pub const PERCENTILES: [f64; 5] = [50.0, 90.0, 99.0, 99.9, 99.99];

const MAX_NS: u64 = 3_600_000_000_000;

#[derive(Debug, Clone)]
pub struct LatencyHistogram {
    h: Histogram<u64>,
}

/// Summary statistics of one histogram, in nanoseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct LatencySummary {
    pub count: u64,
    pub min: u64,
    pub max: u64,
    pub mean: f64,
    pub stddev: f64,
    /// (percentile, value) for each of [`PERCENTILES`].
    pub percentiles: Vec<(f64, u64)>,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyHistogram {
    pub fn new() -> Self {
        LatencyHistogram { h: Histogram::new_with_bounds(1, MAX_NS, 3).expect("valid static bounds") }
    }

    /// Records one latency; values outside 1 ns .. 1 h are clamped rather than dropped.
    pub fn record(&mut self, ns: u64) {
        self.h.saturating_record(ns.clamp(1, MAX_NS));
    }

    pub fn count(&self) -> u64 {
        self.h.len()
    }

    /// Records `n` latencies of `ns` (used to rebuild a histogram from [`Self::buckets`]).
    pub fn record_n(&mut self, ns: u64, n: u64) {
        self.h.saturating_record_n(ns.clamp(1, MAX_NS), n);
    }

    /// Empties the histogram without freeing its counts array.
    pub fn reset(&mut self) {
        self.h.reset();
    }

    pub fn merge(&mut self, other: &LatencyHistogram) {
        self.h.add(&other.h).expect("same bounds");
    }

    pub fn summary(&self) -> LatencySummary {
        if self.h.is_empty() {
            return LatencySummary {
                count: 0,
                min: 0,
                max: 0,
                mean: 0.0,
                stddev: 0.0,
                percentiles: PERCENTILES.iter().map(|&p| (p, 0)).collect(),
            };
        }
        LatencySummary {
            count: self.h.len(),
            min: self.h.min(),
            max: self.h.max(),
            mean: self.h.mean(),
            stddev: self.h.stdev(),
            percentiles: PERCENTILES.iter().map(|&p| (p, self.h.value_at_percentile(p))).collect(),
        }
    }

    /// Every non-empty bucket as (highest equivalent value in ns, count), ascending: the full
    /// distribution for CDF plots.
    pub fn buckets(&self) -> Vec<(u64, u64)> {
        self.h
            .iter_recorded()
            .map(|v| (self.h.highest_equivalent(v.value_iterated_to()), v.count_at_value()))
            .collect()
    }
}

/// fio's percentile key: `99.900000`.
pub fn percentile_key(p: f64) -> String {
    format!("{p:.6}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_of_known_values() {
        let mut h = LatencyHistogram::new();
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        let s = h.summary();
        assert_eq!(s.count, 1000);
        assert!((999..=1001).contains(&s.min), "min {}", s.min);
        assert!((s.mean - 500_500.0).abs() / 500_500.0 < 0.01);
        let p50 = s.percentiles[0].1;
        assert!((499_000..=502_000).contains(&p50), "p50 {p50}");
        let p99 = s.percentiles[2].1;
        assert!((989_000..=992_000).contains(&p99), "p99 {p99}");
    }

    #[test]
    fn empty_and_merge_and_buckets() {
        let mut a = LatencyHistogram::new();
        assert_eq!(a.summary().count, 0);
        let mut b = LatencyHistogram::new();
        a.record(100);
        b.record(100);
        b.record(5000);
        a.merge(&b);
        assert_eq!(a.count(), 3);
        let buckets = a.buckets();
        assert_eq!(buckets.iter().map(|b| b.1).sum::<u64>(), 3);
        assert_eq!(buckets[0], (100, 2));
        a.record(0);
        a.record(u64::MAX);
        assert_eq!(a.count(), 5);
    }

    #[test]
    fn percentile_keys_are_fios() {
        let keys: Vec<String> = PERCENTILES.iter().map(|&p| percentile_key(p)).collect();
        assert_eq!(keys, ["50.000000", "90.000000", "99.000000", "99.900000", "99.990000"]);
    }
}
