//! `nvmf-perf run --connects`: each operation is a whole connect instead of an I/O, so the report's
//! latency is what a reconnect storm pays per controller (the TCP connect, the TLS handshake, ICReq,
//! Fabrics Connect and DH-HMAC-CHAP on the admin queue, Set Features Number of Queues, and the same
//! for one I/O queue), timed until the I/O queue is ready. The disconnect that follows each one (I/O
//! queue closed, then a normal controller shutdown) is not timed but is in the job's CPU time, so CPU per
//! operation is per connect and disconnect. `--numjobs` N connects from N threads at once.

use std::time::{Duration, Instant};

use super::args::RunArgs;
use super::cpu::ThreadUsage;
use super::job::{JobResult, JobSpec};
use super::report::Report;
use super::{connect_options, job_specs, knobs, run_jobs, timestamp, usage, PerfError, Plan};
use crate::{ConnectOptions, Controller, Error, IoQueue};

pub fn run(a: &RunArgs) -> Result<Report, PerfError> {
    let nqn = a.nqn.as_deref().ok_or_else(|| usage("--connects needs -n/--nqn (the subsystem to connect to)"))?;
    if a.verify || a.rate_iops.is_some() {
        return Err(usage("--connects measures connects: --verify and --rate_iops do not apply"));
    }
    let opts = connect_options(&a.target)?;
    // No namespace is read: the plan only fills the report's size fields.
    let plan = Plan { block_size: 512, region_start: 0, region_len: a.bs };
    let specs = job_specs(a, &plan);
    let jobs = run_jobs(a, &specs, |spec| Ok(connect_loop(a, &opts, nqn, spec)?)).map_err(|f| f.error)?;
    let extra = [("connects", serde_json::json!(true))];
    Ok(Report { engine: a.target.engine(), knobs: knobs(a, &plan, &extra), timestamp: timestamp(), jobs, outages: Vec::new(), start: None })
}

/// Connects and disconnects through the ramp (unmeasured), then for `--runtime` (at least once),
/// recording each connect's time as a read I/O of no bytes. CPU time and wall time are the whole
/// thread's, ramp included, as for an I/O job.
fn connect_loop(a: &RunArgs, opts: &ConnectOptions, nqn: &str, _spec: &JobSpec) -> Result<JobResult, Error> {
    let (started, usage_before) = (Instant::now(), ThreadUsage::now());
    let mut result = JobResult::default();
    while started.elapsed() < a.ramp_time {
        connect_once(a, opts, nqn)?;
        result.ramp_ios += 1;
    }
    let measured_from = Instant::now();
    loop {
        let took = connect_once(a, opts, nqn)?;
        result.read.ios += 1;
        result.read.lat.record(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX));
        if a.runtime.is_none_or(|r| measured_from.elapsed() >= r) {
            break;
        }
    }
    result.runtime_ns = u64::try_from(measured_from.elapsed().as_nanos()).unwrap_or(u64::MAX);
    result.usage = ThreadUsage::now().since(&usage_before);
    result.wall_ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
    Ok(result)
}

/// One controller with one I/O queue of `--iodepth` entries: the time until it is ready, after
/// which both are taken down again.
fn connect_once(a: &RunArgs, opts: &ConnectOptions, nqn: &str) -> Result<Duration, Error> {
    let t0 = Instant::now();
    let ctrl = Controller::connect(opts, nqn)?;
    ctrl.set_number_of_queues(1)?;
    let queue = IoQueue::connect(&ctrl.io_queue_params(), 1, a.iodepth as usize, a.bs as usize)?;
    let took = t0.elapsed();
    // Closing the I/O queue's connection is its teardown, as the kernel host does: SPDK 24.01
    // answers a Fabrics Disconnect with Invalid Command Opcode.
    drop(queue);
    ctrl.shutdown()?;
    Ok(took)
}
