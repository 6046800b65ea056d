//! One job: a thread's loop that keeps `iodepth` I/Os in flight on its own engine, paces them
//! with the rate limiter, records latency after the ramp and checks verify patterns.

use std::time::{Duration, Instant};

use super::args::Completion as CompletionMode;
use super::cpu::ThreadUsage;
use super::engine::Engine;
use super::histogram::LatencyHistogram;
use super::rate::RateLimiter;
use super::verify;
use super::workload::{RwMode, Workload};
use crate::{Completion, Error};

/// A stalled target is reported instead of waited on forever.
const IO_TIMEOUT: Duration = Duration::from_secs(30);

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
    /// Blocks read back and checked by the verify phase.
    pub verified_ios: u64,
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

struct Job<'a, E: Engine> {
    spec: &'a JobSpec,
    engine: E,
    start: Instant,
    slots: Vec<Slot>,
    free: Vec<u16>,
    done: Vec<Completion>,
    /// Units (of bs) this run has written, for the verify read-back and for mixed workloads.
    written: Vec<u64>,
    last_progress_ns: u64,
}

/// Runs one job to completion on `engine`; the caller already pinned the thread.
pub fn run_job<E: Engine>(spec: &JobSpec, engine: E) -> Result<JobResult, Error> {
    let usage0 = ThreadUsage::now();
    let depth = engine.depth();
    let units = (spec.region_len / spec.bs) as usize;
    let mut job = Job {
        spec,
        engine,
        start: Instant::now(),
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
    job.main_phase(&mut result)?;
    if !job.written.is_empty() {
        result.verified_ios = job.verify_phase()?;
    }
    result.usage = ThreadUsage::now().since(&usage0);
    result.wall_ns = job.now_ns();
    Ok(result)
}

impl<E: Engine> Job<'_, E> {
    fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
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
        loop {
            let now = self.now_ns();
            let submitting = end_ns.map_or(true, |end| now < end) && (!one_pass || issued < pass);
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
            let inflight = self.slots.len() - self.free.len();
            if inflight == 0 && !submitting {
                break;
            }
            let until = if inflight > 0 && (self.free.is_empty() || !submitting) { None } else { paced_until.or(end_ns) };
            let wait = if inflight == 0 && paced_until.is_none() { Duration::ZERO } else { self.wait_for(until, now) };
            self.reap(wait, &mut |job, slot, now| {
                if slot.measured {
                    let d = if slot.is_read { &mut result.read } else { &mut result.write };
                    d.ios += 1;
                    d.bytes += job.spec.bs;
                    d.lat.record(now - slot.submit_ns);
                    last_done_ns = last_done_ns.max(now);
                }
            })?;
        }
        let end = end_ns.map_or(last_done_ns, |e| e.min(last_done_ns.max(self.now_ns().min(e))));
        result.runtime_ns = end.saturating_sub(ramp_ns).max(1);
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
        loop {
            let now = self.now_ns();
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
            self.reap(wait, &mut |_, _, _| checked += 1)?;
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

    /// Waits for completions, checks them and hands each slot to `on_done`.
    fn reap(&mut self, wait: Duration, on_done: &mut dyn FnMut(&Self, Slot, u64)) -> Result<(), Error> {
        let mut done = std::mem::take(&mut self.done);
        let r = self.engine.reap(wait, &mut done);
        let now = self.now_ns();
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
            return Ok(());
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
        outcome
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
