//! `--log_avg_msec`: a job's completions counted and their latencies kept per interval, for the
//! report's time series (fio's `write_lat_log` with `log_avg_msec`).

use super::histogram::LatencyHistogram;

/// One `--log_avg_msec` interval of one job: completions whose time (since the ramp ended) falls
/// in `[start_ns, end_ns)`; the last interval ends with the measured runtime and also holds the
/// I/Os still in flight then (they count in the totals too).
#[derive(Debug, Clone, Default)]
pub struct Interval {
    pub start_ns: u64,
    pub end_ns: u64,
    pub read_ios: u64,
    pub write_ios: u64,
    /// The latency histogram's non-empty buckets, (value ns, count): compact, merged per
    /// interval across jobs by the report.
    pub buckets: Vec<(u64, u64)>,
}

/// The interval being filled. Its histogram is reused (reset) at every boundary, so the data
/// path only compares one time stamp and records into a preallocated histogram.
#[derive(Debug, Default)]
pub(crate) struct IntervalLog {
    len_ns: u64,
    /// End of the current interval, ns since the ramp ended.
    end_ns: u64,
    read_ios: u64,
    write_ios: u64,
    lat: LatencyHistogram,
    done: Vec<Interval>,
}

impl IntervalLog {
    pub(crate) fn new(len_ns: u64) -> Self {
        IntervalLog { len_ns, end_ns: len_ns, ..Default::default() }
    }

    /// Closes intervals until `t_ns` falls in the current one.
    fn advance(&mut self, t_ns: u64) {
        while t_ns >= self.end_ns {
            self.close(self.end_ns);
            self.end_ns += self.len_ns;
        }
    }

    fn close(&mut self, end_ns: u64) {
        self.done.push(Interval {
            start_ns: self.end_ns - self.len_ns,
            end_ns,
            read_ios: self.read_ios,
            write_ios: self.write_ios,
            buckets: self.lat.buckets(),
        });
        self.lat.reset();
        self.read_ios = 0;
        self.write_ios = 0;
    }

    #[inline]
    pub(crate) fn record(&mut self, t_ns: u64, is_read: bool, lat_ns: u64) {
        if t_ns >= self.end_ns {
            self.advance(t_ns);
        }
        if is_read {
            self.read_ios += 1;
        } else {
            self.write_ios += 1;
        }
        self.lat.record(lat_ns);
    }

    /// Ends the log at `runtime_ns`: the full intervals before it, then a last one (shorter
    /// when the runtime is not a multiple of the interval) ending at `runtime_ns`.
    pub(crate) fn finish(mut self, runtime_ns: u64) -> Vec<Interval> {
        while self.end_ns < runtime_ns {
            self.close(self.end_ns);
            self.end_ns += self.len_ns;
        }
        let start = self.end_ns - self.len_ns;
        if runtime_ns > start || self.read_ios + self.write_ios > 0 {
            self.close(runtime_ns.max(start + 1));
        }
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn completions_land_in_the_interval_of_their_time() {
        let mut log = IntervalLog::new(200 * MS);
        log.record(10 * MS, true, 1000);
        log.record(199 * MS, false, 3000);
        log.record(200 * MS, true, 2000);
        // Nothing completes in [400, 600): that interval is still reported, empty.
        log.record(650 * MS, true, 5000);
        let iv = log.finish(700 * MS);
        let ends: Vec<u64> = iv.iter().map(|i| i.end_ns / MS).collect();
        assert_eq!(ends, [200, 400, 600, 700], "full intervals, then a short last one ending with the run");
        assert_eq!((iv[0].read_ios, iv[0].write_ios), (1, 1));
        assert_eq!((iv[1].read_ios, iv[1].write_ios), (1, 0));
        assert_eq!(iv[2].read_ios + iv[2].write_ios, 0);
        assert!(iv[2].buckets.is_empty());
        assert_eq!(iv[3].start_ns, 600 * MS);
        assert_eq!(iv[0].buckets.iter().map(|b| b.1).sum::<u64>(), 2);
    }

    #[test]
    fn a_runtime_that_is_a_multiple_of_the_interval_has_no_stub() {
        let mut log = IntervalLog::new(100 * MS);
        for t in 0..1000 {
            log.record(t * MS, true, 10);
        }
        let iv = log.finish(1000 * MS);
        assert_eq!(iv.len(), 10);
        assert!(iv.iter().all(|i| i.read_ios == 100 && i.end_ns - i.start_ns == 100 * MS));
    }
}
