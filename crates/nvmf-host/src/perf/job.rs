//! One job: a thread's loop that keeps `iodepth` I/Os in flight on its own engine, paces them
//! with the rate limiter, records latency after the ramp and checks verify patterns.

use std::time::{Duration, Instant};

use super::args::Completion as CompletionMode;
use super::cpu::ThreadUsage;
use super::engine::Engine;
use super::histogram::LatencyHistogram;
pub use super::interval::Interval;
use super::interval::IntervalLog;
use super::rate::RateLimiter;
use super::verify;
use super::workload::{RwMode, Workload};
use crate::{Completion, Error};

/// A stalled target is reported instead of waited on forever.
const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// A polling job reads the clock only when it needs a time stamp: when completions arrive
/// (their latency), when it paces submissions, and once every this many polls that found
/// nothing (the run's end and the stall check). Reading it on every empty poll took 3 to 19 %
/// of nvmf-perf's samples at 128 KiB randwrite (two profiles on the loaded 2-core VM). One
/// empty poll is at least one recv(2), so the time the job acts on is at most some tens of
/// microseconds stale, and never for a stamp.
const IDLE_POLLS_PER_CLOCK_READ: u32 = 64;

/// Where a job's time comes from: nanoseconds since the job started.
pub(crate) trait Clock {
    fn now_ns(&self) -> u64;
}

/// The monotonic clock (clock_gettime through the vDSO), started with the job.
struct MonotonicClock(Instant);

impl Clock for MonotonicClock {
    fn now_ns(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
}

/// Everything one job needs to know, already validated.
#[derive(Debug, Clone)]
pub struct JobSpec {
    pub index: usize,
    pub rw: RwMode,
    pub rwmixread: u8,
    pub bs: u64,
    /// Namespace LBA size (verify patterns are per logical block).
    pub block_size: u64,
    /// Byte range of the namespace this job works on.
    pub region_start: u64,
    pub region_len: u64,
    pub runtime: Option<Duration>,
    pub ramp_time: Duration,
    pub rate_iops: Option<u64>,
    pub completion: CompletionMode,
    pub verify: bool,
    /// Length of one latency-over-time interval (`--log_avg_msec`), ns; `None`: no intervals.
    pub log_avg_ns: Option<u64>,
    /// Verify generation of this run.
    pub generation: u64,
    pub seed: u64,
}

/// Counters of one direction after the ramp.
#[derive(Debug, Clone, Default)]
pub struct DirStats {
    pub ios: u64,
    pub bytes: u64,
    pub lat: LatencyHistogram,
}

#[derive(Debug, Clone, Default)]
pub struct JobResult {
    pub read: DirStats,
    pub write: DirStats,
    /// Measured wall time (after the ramp), ns.
    pub runtime_ns: u64,
    pub usage: ThreadUsage,
    /// Wall time of the whole thread, ns (the base of usr_cpu/sys_cpu).
    pub wall_ns: u64,
    /// I/Os submitted during the ramp (not measured, so not in `read`/`write`); each completed
    /// before the job ended, during the ramp or after it. With `read.ios + write.ios` and
    /// `verified_ios` this is every I/O command the job sent.
    pub ramp_ios: u64,
    /// Of `ramp_ios`, those that completed after the ramp ended (in flight at its end).
    pub ramp_late_ios: u64,
    /// Blocks read back and checked by the verify phase.
    pub verified_ios: u64,
    /// I/Os in flight when a connection was lost, resubmitted after the reconnect (each counts
    /// once in the totals: its completion is the one on the new connection).
    pub retried_ios: u64,
    /// Per-interval statistics (`--log_avg_msec`), in time order; empty when off.
    pub intervals: Vec<Interval>,
}

/// Per-tag state of an I/O in flight.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    submit_ns: u64,
    offset: u64,
    is_read: bool,
    /// Check the verify pattern when the read completes (and against which generation).
    check: Option<Option<u64>>,
    measured: bool,
}

struct Job<'a, E: Engine, C: Clock> {
    spec: &'a JobSpec,
    engine: E,
    clock: C,
    /// The last time read from `clock`.
    now: u64,
    /// Polls that found nothing since the clock was last read.
    idle_polls: u32,
    /// Submissions wait for the rate limiter: every poll needs the time.
    paced: bool,
    slots: Vec<Slot>,
    free: Vec<u16>,
    done: Vec<Completion>,
    /// Units (of bs) this run has written, for the verify read-back and for mixed workloads.
    written: Vec<u64>,
    last_progress_ns: u64,
}

/// Runs one job to completion on `engine`; the caller already pinned the thread.
pub fn run_job<E: Engine>(spec: &JobSpec, engine: E) -> Result<JobResult, JobFailure> {
    run_job_on(spec, engine, MonotonicClock(Instant::now()))
}

/// A job that stopped on an error, and what it measured until then (None: it never ran I/O).
#[derive(Debug)]
pub struct JobFailure {
    pub error: Error,
    /// Boxed: a JobResult is large, and this travels in every job's `Result`.
    pub partial: Option<Box<JobResult>>,
}

impl From<Error> for JobFailure {
    fn from(error: Error) -> Self {
        JobFailure { error, partial: None }
    }
}

/// [`run_job`] with its time from `clock`.
fn run_job_on<E: Engine, C: Clock>(spec: &JobSpec, engine: E, clock: C) -> Result<JobResult, JobFailure> {
    let usage0 = ThreadUsage::now();
    let depth = engine.depth();
    let units = (spec.region_len / spec.bs) as usize;
    let mut job = Job {
        spec,
        engine,
        clock,
        now: 0,
        idle_polls: 0,
        paced: false,
        slots: vec![Slot::default(); depth],
        free: (0..depth as u16).rev().collect(),
        done: Vec::with_capacity(depth),
        written: if spec.verify && spec.rw.does_writes() { vec![0; units.div_ceil(64)] } else { Vec::new() },
        last_progress_ns: 0,
    };
    if !spec.verify {
        // Incompressible, fixed contents: written once, reused for every write.
        let mut rng = fastrand::Rng::with_seed(spec.seed);
        for tag in 0..depth as u16 {
            job.engine.buffer(tag).iter_mut().for_each(|b| *b = rng.u8(..));
        }
    }
    let mut result = JobResult::default();
    let mut ran = job.main_phase(&mut result);
    if ran.is_ok() && !job.written.is_empty() {
        ran = job.verify_phase().map(|n| result.verified_ios = n);
    }
    result.retried_ios = job.engine.retried();
    result.usage = ThreadUsage::now().since(&usage0);
    result.wall_ns = job.now_ns();
    match ran {
        Ok(()) => Ok(result),
        Err(error) => {
            // What was measured counts up to the error (main_phase sets the runtime only at its end).
            if result.runtime_ns == 0 {
                result.runtime_ns = result.wall_ns.saturating_sub(spec.ramp_time.as_nanos() as u64).max(1);
            }
            Err(JobFailure { error, partial: Some(Box::new(result)) })
        }
    }
}

impl<E: Engine, C: Clock> Job<'_, E, C> {
    fn now_ns(&mut self) -> u64 {
        self.now = self.clock.now_ns();
        self.idle_polls = 0;
        self.now
    }

    fn wait_for(&self, until_ns: Option<u64>, now: u64) -> Duration {
        match self.spec.completion {
            CompletionMode::Poll => Duration::ZERO,
            CompletionMode::Event => {
                let cap = Duration::from_millis(100);
                until_ns.map_or(cap, |u| Duration::from_nanos(u.saturating_sub(now)).min(cap))
            }
        }
    }

    fn main_phase(&mut self, result: &mut JobResult) -> Result<(), Error> {
        let spec = self.spec;
        let ramp_ns = spec.ramp_time.as_nanos() as u64;
        let end_ns = spec.runtime.map(|r| ramp_ns + r.as_nanos() as u64);
        let mut workload =
            Workload::new(spec.rw, spec.rwmixread, spec.bs, spec.region_start, spec.region_len, spec.seed);
        let pass = workload.units();
        // A write workload under --verify covers its region once (capped by --runtime) and is
        // then read back, like fio's do_verify; everything else is time based when --runtime is set.
        let one_pass = end_ns.is_none() || (spec.verify && spec.rw.does_writes());
        let mut rate = spec.rate_iops.map(|r| RateLimiter::new(r, 0));
        let mut issued = 0u64;
        let mut last_done_ns = ramp_ns;
        let mut log = spec.log_avg_ns.map(IntervalLog::new);
        // I/Os still in flight when a timed run ends complete after it; they belong to the last
        // interval, as they belong to the totals.
        let last_t = end_ns.map_or(u64::MAX, |e| (e - ramp_ns).saturating_sub(1));
        // Each turn starts at the time the last reap took (one clock read per turn).
        let mut now = self.now_ns();
        loop {
            let submitting = end_ns.is_none_or(|end| now < end) && (!one_pass || issued < pass);
            let mut paced_until = None;
            if submitting {
                while let Some(&tag) = self.free.last() {
                    if one_pass && issued >= pass {
                        break;
                    }
                    if let Some(rl) = rate.as_mut() {
                        if !rl.try_take(now) {
                            paced_until = Some(rl.next_deadline_ns());
                            break;
                        }
                    }
                    self.free.pop();
                    let io = workload.next_io();
                    self.issue(tag, io.is_read, io.offset, now, now >= ramp_ns)?;
                    issued += 1;
                }
                self.engine.commit()?;
            }
            self.paced = paced_until.is_some();
            let inflight = self.slots.len() - self.free.len();
            if inflight == 0 && !submitting {
                break;
            }
            let until = if inflight > 0 && (self.free.is_empty() || !submitting) { None } else { paced_until.or(end_ns) };
            let wait = if inflight == 0 && paced_until.is_none() { Duration::ZERO } else { self.wait_for(until, now) };
            now = self.reap(wait, &mut |job, slot, now| {
                if slot.measured {
                    let d = if slot.is_read { &mut result.read } else { &mut result.write };
                    d.ios += 1;
                    d.bytes += job.spec.bs;
                    d.lat.record(now - slot.submit_ns);
                    if let Some(log) = log.as_mut() {
                        log.record((now - ramp_ns).min(last_t), slot.is_read, now - slot.submit_ns);
                    }
                    last_done_ns = last_done_ns.max(now);
                } else {
                    result.ramp_ios += 1;
                    if now >= ramp_ns {
                        result.ramp_late_ios += 1;
                    }
                }
            })?;
        }
        let end = end_ns.map_or(last_done_ns, |e| e.min(last_done_ns.max(self.now_ns().min(e))));
        result.runtime_ns = end.saturating_sub(ramp_ns).max(1);
        if let Some(log) = log {
            result.intervals = log.finish(result.runtime_ns);
        }
        Ok(())
    }

    /// Reads back every unit this run wrote and checks it against this run's generation.
    fn verify_phase(&mut self) -> Result<u64, Error> {
        let bs = self.spec.bs;
        let written = std::mem::take(&mut self.written);
        let mut units = written
            .iter()
            .enumerate()
            .flat_map(|(w, &bits)| (0..64).filter(move |b| bits & (1 << b) != 0).map(move |b| (w * 64 + b) as u64));
        let mut checked = 0;
        let mut exhausted = false;
        let mut now = self.now_ns();
        loop {
            while !exhausted {
                let Some(&tag) = self.free.last() else { break };
                let Some(unit) = units.next() else {
                    exhausted = true;
                    break;
                };
                self.free.pop();
                self.slots[tag as usize].check = Some(Some(self.spec.generation));
                self.issue_raw(tag, true, self.spec.region_start + unit * bs, now, false)?;
            }
            self.engine.commit()?;
            if self.free.len() == self.slots.len() && exhausted {
                return Ok(checked);
            }
            let wait = self.wait_for(None, now);
            now = self.reap(wait, &mut |_, _, _| checked += 1)?;
        }
    }

    fn issue(&mut self, tag: u16, is_read: bool, offset: u64, now: u64, measured: bool) -> Result<(), Error> {
        let spec = self.spec;
        self.slots[tag as usize].check = if !spec.verify || !is_read {
            None
        } else if spec.rw.does_writes() {
            // Mixed workload: only blocks this run already wrote have a known pattern.
            self.unit_written(offset).then_some(Some(spec.generation))
        } else {
            Some(None)
        };
        if !is_read && spec.verify {
            let bs = spec.bs as usize;
            let bsz = spec.block_size;
            verify::fill(&mut self.engine.buffer(tag)[..bs], bsz as usize, offset / bsz, spec.generation);
        }
        self.issue_raw(tag, is_read, offset, now, measured)
    }

    fn issue_raw(&mut self, tag: u16, is_read: bool, offset: u64, now: u64, measured: bool) -> Result<(), Error> {
        if self.free.len() + 1 == self.slots.len() {
            // Nothing was in flight: the stall clock starts now, not at the last completion.
            self.last_progress_ns = now;
        }
        let slot = &mut self.slots[tag as usize];
        slot.submit_ns = now;
        slot.offset = offset;
        slot.is_read = is_read;
        slot.measured = measured;
        self.engine.submit(tag, is_read, offset, self.spec.bs as usize)
    }

    fn unit_written(&self, offset: u64) -> bool {
        let u = ((offset - self.spec.region_start) / self.spec.bs) as usize;
        self.written.get(u / 64).is_some_and(|w| w & (1 << (u % 64)) != 0)
    }

    /// Waits up to `wait` for completions, checks them and hands each slot to `on_done` with the
    /// time they were seen; returns that time. An empty poll returns the last time read unless
    /// the job paces or [`IDLE_POLLS_PER_CLOCK_READ`] polls have passed without a read: a
    /// returned time is fresh whenever it can become a stamp (completions, pacing), since
    /// submissions only follow completions or the rate limiter.
    fn reap(&mut self, wait: Duration, on_done: &mut dyn FnMut(&Self, Slot, u64)) -> Result<u64, Error> {
        let mut done = std::mem::take(&mut self.done);
        let r = self.engine.reap(wait, &mut done);
        let recovered = self.engine.take_recovered();
        let now = if !done.is_empty() || !wait.is_zero() || self.paced || recovered || self.idle_polls >= IDLE_POLLS_PER_CLOCK_READ {
            self.now_ns()
        } else {
            self.idle_polls += 1;
            self.now
        };
        if recovered {
            // Time spent reconnecting is an outage (reported as such), not a stalled target.
            self.last_progress_ns = now;
        }
        if done.is_empty() {
            self.done = done;
            r?;
            if now - self.last_progress_ns > IO_TIMEOUT.as_nanos() as u64 && self.free.len() < self.slots.len() {
                return Err(Error::Timeout(format!(
                    "{} I/Os outstanding without a completion for {} s",
                    self.slots.len() - self.free.len(),
                    IO_TIMEOUT.as_secs()
                )));
            }
            return Ok(now);
        }
        self.last_progress_ns = now;
        let mut outcome = r;
        for d in done.drain(..) {
            let slot = self.slots[d.tag as usize];
            if outcome.is_ok() {
                outcome = d.result.and_then(|_| self.complete(d.tag, slot));
            }
            on_done(self, slot, now);
            self.free.push(d.tag);
        }
        self.done = done;
        outcome.map(|()| now)
    }

    fn complete(&mut self, tag: u16, slot: Slot) -> Result<(), Error> {
        let spec = self.spec;
        if let Some(generation) = slot.check {
            let bsz = spec.block_size;
            let buf = &self.engine.buffer(tag)[..spec.bs as usize];
            verify::check(buf, bsz as usize, slot.offset / bsz, generation)
                .map_err(|m| Error::Verify(m.to_string()))?;
        }
        if !slot.is_read && !self.written.is_empty() {
            let u = ((slot.offset - spec.region_start) / spec.bs) as usize;
            self.written[u / 64] |= 1 << (u % 64);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    const MS: u64 = 1_000_000;

    /// Simulated time, shared by the fake clock and the fake engine, and the clock reads made.
    #[derive(Default)]
    struct SimTime {
        ns: Cell<u64>,
        reads: Cell<u64>,
    }

    struct SimClock(Rc<SimTime>);

    impl Clock for SimClock {
        fn now_ns(&self) -> u64 {
            self.0.reads.set(self.0.reads.get() + 1);
            self.0.ns.get()
        }
    }

    /// An engine whose every I/O takes exactly `service_ns` of simulated time, and whose every
    /// poll (reap) takes `poll_ns`: a completion is seen by the first poll that ends at or
    /// after its due time, so its latency lies in `[service_ns, service_ns + poll_ns)`.
    struct SimEngine {
        time: Rc<SimTime>,
        service_ns: u64,
        poll_ns: u64,
        due: Vec<Option<u64>>,
        bufs: Vec<Vec<u8>>,
    }

    impl SimEngine {
        fn new(time: &Rc<SimTime>, depth: usize, service_ns: u64, poll_ns: u64) -> Self {
            SimEngine { time: Rc::clone(time), service_ns, poll_ns, due: vec![None; depth], bufs: vec![vec![0; 4096]; depth] }
        }
    }

    impl Engine for SimEngine {
        fn depth(&self) -> usize {
            self.due.len()
        }
        fn buffer(&mut self, tag: u16) -> &mut [u8] {
            &mut self.bufs[tag as usize]
        }
        fn submit(&mut self, tag: u16, _: bool, _: u64, _: usize) -> Result<(), Error> {
            self.due[tag as usize] = Some(self.time.ns.get() + self.service_ns);
            Ok(())
        }
        fn commit(&mut self) -> Result<(), Error> {
            Ok(())
        }
        fn reap(&mut self, wait: Duration, done: &mut Vec<Completion>) -> Result<(), Error> {
            done.clear();
            let mut t = self.time.ns.get() + self.poll_ns;
            if !wait.is_zero() {
                // Sleeping: wake at the first due completion, or after `wait`.
                let first = self.due.iter().flatten().min().copied();
                t = t.max(first.unwrap_or(u64::MAX).min(self.time.ns.get() + wait.as_nanos() as u64));
            }
            self.time.ns.set(t);
            for (tag, due) in self.due.iter_mut().enumerate() {
                if due.is_some_and(|d| d <= t) {
                    *due = None;
                    done.push(Completion { tag: tag as u16, result: Ok(0) });
                }
            }
            Ok(())
        }
    }

    fn sim_spec(completion: CompletionMode, rate_iops: Option<u64>) -> JobSpec {
        JobSpec {
            index: 0,
            rw: RwMode::RandRead,
            rwmixread: 100,
            bs: 4096,
            block_size: 512,
            region_start: 0,
            region_len: 1 << 20,
            runtime: Some(Duration::from_millis(20)),
            ramp_time: Duration::from_millis(1),
            rate_iops,
            completion,
            verify: false,
            log_avg_ns: None,
            generation: 1,
            seed: 7,
        }
    }

    /// Runs a job on the simulated engine: the result, the clock reads per measured I/O and
    /// the simulated time at its end.
    fn simulate(spec: &JobSpec, depth: usize, service_ns: u64, poll_ns: u64) -> (JobResult, f64, u64) {
        let time = Rc::new(SimTime::default());
        let r = run_job_on(spec, SimEngine::new(&time, depth, service_ns, poll_ns), SimClock(Rc::clone(&time))).unwrap();
        let reads = time.reads.get() as f64 / r.read.ios as f64;
        (r, reads, time.ns.get())
    }

    /// The latency recorded is what it always was: from the submission to the poll that saw the
    /// completion, whatever clock reads a polling job leaves out.
    #[test]
    fn latencies_keep_their_meaning_with_fewer_clock_reads() {
        let (service, poll) = (10_000, 100);
        for (depth, rate) in [(1, None), (32, None), (4, Some(50_000))] {
            for mode in [CompletionMode::Poll, CompletionMode::Event] {
                let (r, reads_per_io, _) = simulate(&sim_spec(mode, rate), depth, service, poll);
                let s = r.read.lat.summary();
                assert!(s.count > 100, "{depth} {rate:?} {mode:?}: {} I/Os", s.count);
                assert_eq!(s.count, r.read.ios);
                // The histogram keeps 3 significant digits: 10 ns at 10 us.
                assert!(s.min >= service - 10 && s.max <= service + poll + 10, "{depth} {rate:?} {mode:?}: {s:?}");
                if let Some(rate) = rate {
                    let achieved = r.read.ios as f64 * 1e9 / r.runtime_ns as f64;
                    assert!((achieved / rate as f64 - 1.0).abs() < 0.05, "paced at {achieved:.0} IOPS, asked {rate}");
                } else if mode == CompletionMode::Poll {
                    // A clock read per poll would be ~100 per I/O at QD1 (10 us / 100 ns).
                    assert!(reads_per_io < 3.0, "{depth}: {reads_per_io:.1} clock reads per I/O");
                }
            }
        }
    }

    /// A run ends on time although empty polls skip the clock.
    #[test]
    fn a_polling_run_ends_on_time_without_reading_the_clock_every_poll() {
        let (r, _, end) = simulate(&sim_spec(CompletionMode::Poll, None), 1, 10_000, 100);
        // 1 ms of ramp and 20 ms measured: the end is seen at the next completion (each I/O
        // takes 10 us) and the last I/O then completes.
        assert!((21 * MS..21 * MS + 20_100).contains(&end), "ended at {end} ns");
        assert_eq!(r.runtime_ns, 20 * MS);
        let expect = 20 * MS / 10_000;
        assert!(r.read.ios.abs_diff(expect) <= 2, "{} I/Os, expected about {expect}", r.read.ios);
    }
}
