//! The engine behind `nvmf-perf run`: check the options against the namespace, start one
//! pinned thread per job with its own queue pair (or io_uring ring), gather the results.
//!
//! Over 600 lines only with its tests: about 420 lines of code (options to a plan, running it
//! over NVMe/TCP, NVMe/RDMA or a local file), the rest the tests of planning. The pieces live
//! in the submodules below, one job each.

pub mod args;
pub mod connects;
pub mod cpu;
pub mod engine;
pub mod histogram;
pub mod info;
pub mod interval;
pub mod job;
pub mod local;
pub mod rate;
pub mod report;
pub mod start_at;
pub mod verify;
pub mod workload;

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use nvmf_proto::Status;
use serde_json::{json, Map, Value};

use self::args::{RunArgs, TargetArgs};
use crate::tls as nvmf_host_tls;
use self::engine::TcpEngine;
use self::job::{run_job, JobFailure, JobResult, JobSpec};
use self::report::{JobReport, OutageWindow, Report};
use crate::{default_hostnqn, ConnectOptions, Controller, Error, ReconnectPolicy, Session};

/// Why a command did not produce a result; decides the exit status.
#[derive(Debug, thiserror::Error)]
pub enum PerfError {
    /// Bad arguments (exit 2).
    #[error("{0}")]
    Usage(String),
    /// The run itself failed: connect, I/O error, verify mismatch (exit 1).
    #[error("{0}")]
    Failed(String),
    /// The run failed after its jobs had measured: the error, and the report of what they
    /// measured until it (exit 1; nvmf-perf writes it in JSON with `error`).
    #[error("{error}")]
    Midway { error: String, report: Box<Report> },
}

impl PerfError {
    pub fn exit_code(&self) -> i32 {
        match self {
            PerfError::Usage(_) => 2,
            PerfError::Failed(_) | PerfError::Midway { .. } => 1,
        }
    }
}

impl From<Error> for PerfError {
    fn from(e: Error) -> Self {
        PerfError::Failed(e.to_string())
    }
}

pub(crate) fn usage(msg: impl Into<String>) -> PerfError {
    PerfError::Usage(msg.into())
}

/// Connection options from the nvme-cli style arguments.
pub fn connect_options(t: &TargetArgs) -> Result<ConnectOptions, PerfError> {
    let traddr = t.traddr.as_deref().ok_or_else(|| usage("missing -a/--traddr (the target's address)"))?;
    let host = if traddr.contains(':') && !traddr.starts_with('[') { format!("[{traddr}]") } else { traddr.to_string() };
    let mut o = ConnectOptions::new(format!("{host}:{}", t.trsvcid), t.hostnqn.clone().unwrap_or_else(default_hostnqn));
    o.hdr_digest = t.hdr_digest;
    o.data_digest = t.data_digest;
    o.kato_ms = t.kato.saturating_mul(1000);
    o.so_priority = t.so_priority;
    o.tos = t.tos;
    o.busy_poll_us = t.busy_poll_us;
    o.tcp_congestion = t.tcp_congestion.clone();
    o.disable_sqflow = t.disable_sqflow;
    let secret = |flag: &str, text: &Option<String>| {
        text.as_deref().map(nvmf_proto::auth::Secret::parse).transpose().map_err(|e| usage(format!("{flag}: {e}")))
    };
    o.dhchap_secret = secret("--dhchap-secret", &t.dhchap_secret)?;
    o.dhchap_ctrl_secret = secret("--dhchap-ctrl-secret", &t.dhchap_ctrl_secret)?;
    o.tls = match (&t.tls_key, t.tls) {
        (Some(key), _) => {
            let mut tls = nvmf_host_tls::TlsOptions::parse(key, t.tls_key_identity.as_deref(), &o.hostnqn).map_err(usage)?;
            tls.compat = t.tls_compat;
            // Neither chosen: try what a kernel target's keyring may hold (docs/tls.md).
            tls.fallback = t.tls_key_identity.is_none() && !t.tls_compat;
            if let Some(k) = &t.ktls {
                tls.ktls = nvmf_tls::KtlsMode::parse(k).ok_or_else(|| usage(format!("--ktls {k:?}: expected auto, on or off")))?;
            }
            Some(tls)
        }
        (None, true) => return Err(usage("--tls needs --tls-key (there is no keyring to take the PSK from)")),
        (None, false) if t.tls_key_identity.is_some() => return Err(usage("--tls-key-identity needs --tls-key")),
        (None, false) if t.tls_compat => return Err(usage("--tls-compat needs --tls-key")),
        (None, false) if t.ktls.is_some() => return Err(usage("--ktls needs --tls-key")),
        (None, false) => None,
    };
    if t.transport == "rdma" {
        if o.tls.is_some() || o.hdr_digest || o.data_digest || o.tcp_congestion.is_some() {
            return Err(usage("--tls, --hdr_digest, --data_digest and --tcp_congestion are NVMe/TCP only: not with -t rdma"));
        }
        if !cfg!(feature = "rdma") {
            return Err(usage(format!("-t rdma: {}", crate::connection::NO_RDMA)));
        }
        o.transport = crate::Transport::Rdma;
    }
    Ok(o)
}

/// The byte region and sizes a run works on, checked against the namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub block_size: u64,
    pub region_start: u64,
    pub region_len: u64,
}

/// Checks `bs`, `--offset`, `--size` and `--iodepth` against a namespace of `capacity` bytes in
/// `block_size` blocks, a largest transfer of `max_transfer` and at most `max_depth` commands.
pub fn plan(
    a: &RunArgs,
    capacity: u64,
    block_size: u64,
    max_transfer: Option<u64>,
    max_depth: u32,
) -> Result<Plan, PerfError> {
    if a.bs == 0 || a.bs % block_size != 0 {
        return Err(usage(format!("--bs {} is not a multiple of the namespace block size {block_size}", a.bs)));
    }
    if let Some(m) = max_transfer {
        if a.bs > m {
            return Err(usage(format!("--bs {} exceeds the controller's largest transfer (MDTS) of {m} bytes", a.bs)));
        }
    }
    if a.bs > u32::MAX as u64 / 2 || a.bs / block_size > 0x1_0000 {
        return Err(usage(format!("--bs {} is larger than one command can carry", a.bs)));
    }
    if a.offset % block_size != 0 {
        return Err(usage(format!("--offset {} is not a multiple of the block size {block_size}", a.offset)));
    }
    if a.offset >= capacity {
        return Err(usage(format!("--offset {} is at or beyond the end of the namespace ({capacity} bytes)", a.offset)));
    }
    let len = a.size.unwrap_or(capacity - a.offset);
    if a.offset.checked_add(len).is_none_or(|end| end > capacity) {
        return Err(usage(format!(
            "--offset {} + --size {len} goes beyond the namespace ({capacity} bytes)",
            a.offset
        )));
    }
    let per_job = if a.verify && a.rw.does_writes() { len / a.numjobs as u64 } else { len };
    if per_job < a.bs {
        return Err(usage(format!(
            "the region ({per_job} bytes per job) is smaller than one block of --bs {}",
            a.bs
        )));
    }
    if a.iodepth > max_depth {
        return Err(usage(format!("--iodepth {} exceeds what the controller accepts per queue ({max_depth})", a.iodepth)));
    }
    Ok(Plan { block_size, region_start: a.offset, region_len: len })
}

/// Every option the run used, for the report.
pub(crate) fn knobs(a: &RunArgs, plan: &Plan, extra: &[(&str, Value)]) -> Map<String, Value> {
    let t = &a.target;
    let mut m = Map::new();
    let mut put = |k: &str, v: Value| {
        m.insert(k.to_string(), v);
    };
    put("rw", json!(a.rw.name()));
    put("rwmixread", json!(a.rwmixread));
    put("bs", json!(a.bs));
    put("iodepth", json!(a.iodepth));
    put("numjobs", json!(a.numjobs));
    put("runtime", json!(a.runtime.map(|d| d.as_secs_f64())));
    put("ramp_time", json!(a.ramp_time.as_secs_f64()));
    put("rate_iops", json!(a.rate_iops));
    put("cpus_allowed", json!(a.cpus_allowed.as_ref().map(|c| &c.0)));
    put("size", json!(plan.region_len));
    put("offset", json!(plan.region_start));
    put("block_size", json!(plan.block_size));
    put("completion", json!(format!("{:?}", a.completion).to_lowercase()));
    put("verify", json!(a.verify));
    put("log_avg_msec", json!(a.log_avg_msec));
    put("hdr_digest", json!(t.hdr_digest));
    put("data_digest", json!(t.data_digest));
    put("so_priority", json!(t.so_priority));
    put("tos", json!(t.tos));
    put("busy_poll_us", json!(t.busy_poll_us));
    put("tcp_congestion", json!(t.tcp_congestion));
    put("kato", json!(t.kato));
    put("reconnect_delay", json!(a.reconnect_delay.as_secs_f64()));
    put("ctrl_loss_tmo", json!(a.ctrl_loss_tmo.0.map_or(-1.0, |d| d.as_secs_f64())));
    put("nsid", json!(a.nsid));
    put("transport", json!(t.transport));
    put("traddr", json!(t.traddr));
    put("trsvcid", json!(t.trsvcid));
    put("nqn", json!(a.nqn));
    put("hostnqn", json!(t.hostnqn));
    put("local", json!(a.local.as_ref().map(|p| p.display().to_string())));
    for (k, v) in extra {
        put(k, v.clone());
    }
    m
}

pub(crate) fn job_specs(a: &RunArgs, plan: &Plan) -> Vec<JobSpec> {
    let generation = fastrand::u64(1..);
    let split = a.verify && a.rw.does_writes();
    // Under write --verify each job owns a slice, so it verifies only blocks it wrote itself.
    let slice = (plan.region_len / a.numjobs as u64) / a.bs * a.bs;
    (0..a.numjobs as usize)
        .map(|i| JobSpec {
            index: i,
            rw: a.rw,
            rwmixread: a.rwmixread,
            bs: a.bs,
            block_size: plan.block_size,
            region_start: if split { plan.region_start + i as u64 * slice } else { plan.region_start },
            region_len: if split { slice } else { plan.region_len },
            runtime: a.runtime,
            ramp_time: a.ramp_time,
            rate_iops: a.rate_iops,
            completion: a.completion,
            verify: a.verify,
            log_avg_ns: (a.log_avg_msec > 0).then(|| a.log_avg_msec.saturating_mul(1_000_000)),
            generation,
            seed: generation ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        })
        .collect()
}

fn cpu_of(a: &RunArgs, i: usize) -> Option<usize> {
    a.cpus_allowed.as_ref().map(|c| c.0[i % c.0.len()])
}

/// Jobs that did not all finish: the first error, and what every job measured when at least one
/// measured something (a job that never ran counts as empty, its error in its report).
pub(crate) struct JobsFailed {
    pub error: PerfError,
    pub measured: Option<Vec<JobReport>>,
}

/// Why one job thread ended early, and what it measured until then.
type JobError = (PerfError, Option<Box<JobResult>>);

/// Runs every job on its own thread (pinned when --cpus_allowed is given).
pub(crate) fn run_jobs<F>(a: &RunArgs, specs: &[JobSpec], start: F) -> Result<Vec<JobReport>, JobsFailed>
where
    F: Fn(&JobSpec) -> Result<JobResult, JobFailure> + Sync,
{
    let results: Vec<Result<JobResult, JobError>> = std::thread::scope(|s| {
        let handles: Vec<_> = specs
            .iter()
            .map(|spec| {
                let cpu = cpu_of(a, spec.index);
                let start = &start;
                std::thread::Builder::new()
                    .name(format!("job{}", spec.index))
                    .spawn_scoped(s, move || {
                        if let Some(c) = cpu {
                            cpu::pin_current_thread(c).map_err(|e| {
                                (PerfError::Failed(format!("job{}: cannot pin to CPU {c}: {e}", spec.index)), None)
                            })?;
                        }
                        start(spec).map_err(|f| (PerfError::Failed(format!("job{}: {}", spec.index, f.error)), f.partial))
                    })
                    .expect("spawn job thread")
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err((PerfError::Failed("a job thread panicked".into()), None))))
            .collect()
    });
    let mut reports = Vec::with_capacity(results.len());
    let mut first_error = None;
    let mut any_measured = false;
    for (i, r) in results.into_iter().enumerate() {
        let (result, error) = match r {
            Ok(result) => (Some(result), None),
            Err((e, partial)) => {
                let text = e.to_string();
                first_error.get_or_insert(e);
                (partial.map(|p| *p), Some(text))
            }
        };
        any_measured |= result.is_some();
        reports.push(JobReport { result: result.unwrap_or_default(), cpu: cpu_of(a, i), error });
    }
    match first_error {
        None => Ok(reports),
        Some(error) => Err(JobsFailed { error, measured: any_measured.then_some(reports) }),
    }
}

/// The run's report from its jobs, or, when they failed after measuring, the error with the
/// report of what they measured.
fn finish(jobs: Result<Vec<JobReport>, JobsFailed>, report: impl FnOnce(Vec<JobReport>) -> Report) -> Result<Report, PerfError> {
    match jobs {
        Ok(jobs) => Ok(report(jobs)),
        Err(JobsFailed { error, measured: Some(jobs) }) => Err(PerfError::Midway { error: error.to_string(), report: Box::new(report(jobs)) }),
        Err(JobsFailed { error, measured: None }) => Err(error),
    }
}

pub(crate) fn timestamp() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// `nvmf-perf run`.
pub fn run(a: &RunArgs) -> Result<Report, PerfError> {
    if let Some(list) = &a.cpus_allowed {
        cpu::check_allowed(&list.0).map_err(|e| usage(format!("--cpus_allowed: {e}")))?;
    }
    match &a.local {
        Some(path) => run_local(a, path),
        None if a.connects => connects::run(a),
        None => run_tcp(a),
    }
}

fn run_tcp(a: &RunArgs) -> Result<Report, PerfError> {
    let nqn = a.nqn.as_deref().ok_or_else(|| usage("missing -n/--nqn (the subsystem NQN), or use --local PATH"))?;
    let opts = connect_options(&a.target)?;
    let ctrl = Controller::connect(&opts, nqn)?;
    let ns = ctrl.identify_namespace(a.nsid).map_err(|e| match e {
        // A namespace the subsystem does not have is a wrong --nsid, not a failed run.
        Error::Unsupported(_) => usage(format!("--nsid {}: {e}", a.nsid)),
        Error::Status { status, .. } if (status.sct, status.sc) == (Status::INVALID_NS.sct, Status::INVALID_NS.sc) => {
            usage(format!("--nsid {}: {e}", a.nsid))
        }
        e => e.into(),
    })?;
    let block_size = ns.block_size();
    let id = ctrl.identity();
    let mut max_depth = ctrl.max_queue_entries().saturating_sub(1);
    if id.maxcmd != 0 {
        max_depth = max_depth.min(id.maxcmd as u32);
    }
    let plan = plan(a, ns.nsze * block_size, block_size, ctrl.max_transfer(), max_depth)?;
    let (nsq, ncq) = ctrl.set_number_of_queues(a.numjobs as u16)?;
    if (nsq.min(ncq) as u32) < a.numjobs {
        return Err(PerfError::Failed(format!(
            "the controller granted {} I/O queues, --numjobs {} needs one each",
            nsq.min(ncq),
            a.numjobs
        )));
    }
    let extra = [
        ("cntlid", json!(ctrl.cntlid())),
        ("in_capsule_data_size", json!(ctrl.io_queue_params().in_capsule)),
    ];
    let gate = start_at::StartGate::new(a.start_at).map_err(usage)?;
    let session = reconnecting_session(a, ctrl, ns.nsze, block_size);
    let specs = job_specs(a, &plan);
    let started = Instant::now();
    let jobs = run_jobs(a, &specs, |spec| {
        let mut queue = session.io_queue(spec.index as u16 + 1, a.iodepth as usize, a.bs as usize)?;
        queue.queue().set_namespace(a.nsid, block_size);
        gate.wait();
        run_job(spec, TcpEngine { queue, lba_shift: block_size.trailing_zeros() })
    });
    let outages = session.outages().iter().map(|o| outage_window(o, started)).collect();
    if let Some(ctrl) = session.into_controller() {
        if let Err(e) = ctrl.shutdown() {
            tracing::warn!("controller shutdown: {e}");
        }
    }
    let start = gate.to_json();
    finish(jobs, |jobs| Report { engine: a.target.engine(), knobs: knobs(a, &plan, &extra), timestamp: timestamp(), jobs, outages, start })
}

/// The controller under `--reconnect-delay` / `--ctrl-loss-tmo`; after a reconnect it must
/// still grant a queue per job and show the namespace with the size the run planned for.
fn reconnecting_session(a: &RunArgs, ctrl: Controller, nsze: u64, block_size: u64) -> Session {
    let policy = ReconnectPolicy { reconnect_delay: a.reconnect_delay, ctrl_loss_tmo: a.ctrl_loss_tmo.0 };
    let nsid = a.nsid;
    Session::new(ctrl, policy).with_io_queues(a.numjobs as u16).with_check(Box::new(move |c: &Controller| {
        let ns = c.identify_namespace(nsid)?;
        if (ns.nsze, ns.block_size()) != (nsze, block_size) {
            return Err(Error::Unsupported(format!(
                "namespace {nsid} changed: {} blocks of {} bytes, was {nsze} of {block_size}",
                ns.nsze,
                ns.block_size()
            )));
        }
        Ok(())
    }))
}

fn outage_window(o: &crate::Outage, started: Instant) -> OutageWindow {
    let since = |t: Instant| t.saturating_duration_since(started).as_nanos() as u64;
    OutageWindow { start_ns: since(o.start), end_ns: o.end.map(since), attempts: o.attempts, cause: o.cause.clone() }
}

fn run_local(a: &RunArgs, path: &std::path::Path) -> Result<Report, PerfError> {
    let writable = a.rw.does_writes();
    let min_len = a.size.map_or(0, |s| a.offset.saturating_add(s));
    let (file, info) = local::open(path, writable, min_len)?;
    if a.rw.does_reads() {
        if let Some(why) = local::sparse_warning(&file, path).map_err(Error::from)? {
            tracing::warn!("{why}");
        }
    }
    let plan = plan(a, info.size, info.block_size, None, u32::from(u16::MAX))?;
    let specs = job_specs(a, &plan);
    let gate = start_at::StartGate::new(a.start_at).map_err(usage)?;
    let jobs = run_jobs(a, &specs, |spec| {
        let engine = local::LocalEngine::new(file.try_clone().map_err(Error::from)?, a.iodepth as usize, a.bs as usize)?;
        gate.wait();
        run_job(spec, engine)
    });
    let extra = [("direct", json!(info.direct))];
    let start = gate.to_json();
    finish(jobs, |jobs| Report { engine: "local", knobs: knobs(a, &plan, &extra), timestamp: timestamp(), jobs, outages: Vec::new(), start })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn run_args(extra: &[&str]) -> RunArgs {
        let argv = ["nvmf-perf", "run", "--local", "/dev/null"].into_iter().chain(extra.iter().copied());
        match args::Cli::try_parse_from(argv).unwrap().command {
            args::Command::Run(r) => r,
            _ => unreachable!("parsed a run command"),
        }
    }

    const MIB: u64 = 1 << 20;

    fn check(extra: &[&str]) -> Result<Plan, PerfError> {
        plan(&run_args(extra), 64 * MIB, 512, Some(MIB), 127)
    }

    #[test]
    fn transport_rdma_is_taken_without_tcp_only_options() {
        let rdma = |extra: &[&str]| {
            let argv = ["nvmf-perf", "discover", "-t", "rdma", "-a", "10.0.0.1", "-s", "4421"].into_iter().chain(extra.iter().copied());
            match args::Cli::try_parse_from(argv).unwrap().command {
                args::Command::Discover(d) => connect_options(&d.target),
                _ => unreachable!("parsed a discover command"),
            }
        };
        let built_with_rdma = cfg!(feature = "rdma");
        match rdma(&[]) {
            Ok(o) => {
                assert!(built_with_rdma, "a build without the feature took -t rdma");
                assert_eq!((o.transport, o.addr.as_str()), (crate::Transport::Rdma, "10.0.0.1:4421"));
            }
            Err(e) => {
                assert!(!built_with_rdma, "{e}");
                assert!(e.exit_code() == 2 && e.to_string().contains("--features rdma"), "{e}");
            }
        }
        for tcp_only in [&["--hdr_digest"][..], &["--tcp_congestion", "cubic"]] {
            let e = rdma(tcp_only).unwrap_err();
            assert!(e.to_string().contains("NVMe/TCP only"), "{tcp_only:?}: {e}");
        }
        assert!(args::Cli::try_parse_from(["nvmf-perf", "discover", "-t", "fc", "-a", "x"]).is_err());
    }

    #[test]
    fn disable_sqflow_reaches_the_connect_options_and_is_off_by_default() {
        let opts = |extra: &[&str]| {
            let argv = ["nvmf-perf", "discover", "-a", "127.0.0.1"].into_iter().chain(extra.iter().copied());
            match args::Cli::try_parse_from(argv).unwrap().command {
                args::Command::Discover(d) => connect_options(&d.target).unwrap(),
                _ => unreachable!("parsed a discover command"),
            }
        };
        assert!(!opts(&[]).disable_sqflow, "nvme-cli connects with SQ flow control unless told");
        assert!(opts(&["--disable-sqflow"]).disable_sqflow);
    }

    #[test]
    fn tcp_congestion_reaches_the_connect_options_and_bad_names_are_refused() {
        let parse = |extra: &[&str]| {
            let argv = ["nvmf-perf", "discover", "-a", "127.0.0.1"].into_iter().chain(extra.iter().copied());
            args::Cli::try_parse_from(argv).map(|cli| match cli.command {
                args::Command::Discover(d) => connect_options(&d.target).unwrap().tcp_congestion,
                _ => unreachable!("parsed a discover command"),
            })
        };
        assert_eq!(parse(&[]).unwrap(), None, "the system's congestion control unless told");
        assert_eq!(parse(&["--tcp_congestion", "cubic"]).unwrap().as_deref(), Some("cubic"));
        for bad in ["", "Cubic", "cubic;reno", "a_name_of_16_byt"] {
            let e = parse(&["--tcp_congestion", bad]).unwrap_err();
            assert!(e.to_string().contains("invalid congestion control"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn plan_defaults_to_the_rest_of_the_namespace() {
        let p = check(&["--offset", "1m"]).unwrap();
        assert_eq!(p, Plan { block_size: 512, region_start: MIB, region_len: 63 * MIB });
    }

    #[test]
    fn arguments_the_namespace_cannot_satisfy_are_usage_errors() {
        for (extra, needle) in [
            (&["--bs", "1000"][..], "not a multiple of the namespace block size 512"),
            (&["--bs", "2m"], "MDTS"),
            (&["--offset", "100"], "--offset 100 is not a multiple"),
            (&["--offset", "64m"], "beyond the end"),
            (&["--size", "65m"], "goes beyond the namespace"),
            (&["--offset", "60m", "--size", "8m"], "goes beyond the namespace"),
            (&["--size", "2k", "--bs", "4k"], "smaller than one block"),
            (&["--iodepth", "128"], "--iodepth 128 exceeds"),
        ] {
            let e = check(extra).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{extra:?}");
            assert!(e.to_string().contains(needle), "{extra:?}: {e}");
        }
    }

    #[test]
    fn write_verify_splits_the_region_between_jobs() {
        let a = run_args(&["--rw", "randwrite", "--verify", "--numjobs", "3", "--bs", "4k", "--size", "1m"]);
        let p = plan(&a, 64 * MIB, 512, None, 127).unwrap();
        let specs = job_specs(&a, &p);
        assert_eq!(specs.len(), 3);
        let slice = specs[0].region_len;
        assert_eq!(slice % 4096, 0);
        for (i, s) in specs.iter().enumerate() {
            assert_eq!(s.region_start, i as u64 * slice);
            assert_eq!(s.generation, specs[0].generation, "one generation per run");
        }
        let shared = run_args(&["--rw", "randread", "--numjobs", "2"]);
        let specs = job_specs(&shared, &plan(&shared, 64 * MIB, 512, None, 127).unwrap());
        assert!(specs.iter().all(|s| s.region_start == 0 && s.region_len == 64 * MIB), "reads share the region like fio");
    }

    #[test]
    fn a_local_timed_run_logs_intervals_that_add_up() {
        let path = std::env::temp_dir().join(format!("nvmf-perf-intervals-{}.img", std::process::id()));
        let a = run_args(&[
            "--rw", "randwrite", "--bs", "4k", "--size", "1m", "--iodepth", "4", "--numjobs", "2",
            "--runtime", "2", "--ramp_time", "300ms", "--log_avg_msec", "200", "--rate_iops", "2000",
        ]);
        let a = RunArgs { local: Some(path.clone()), ..a };
        let report = match run(&a) {
            Ok(r) => r,
            Err(e) if e.to_string().contains("io_uring") || e.to_string().contains("Operation not permitted") => {
                eprintln!("io_uring unavailable here, skipping: {e}");
                let _ = std::fs::remove_file(&path);
                return;
            }
            Err(e) => panic!("{e}"),
        };
        std::fs::remove_file(&path).unwrap();
        let v = report.to_json();
        let iv = v["nvmflab"]["intervals"].as_array().unwrap();
        assert_eq!(iv.len(), 10, "2 s in 200 ms intervals: {iv:?}");
        assert_eq!(v["nvmflab"]["knobs"]["log_avg_msec"], 200);
        let total: u64 = (0..2).map(|i| v["jobs"][i]["write"]["total_ios"].as_u64().unwrap()).sum();
        let mut sum = 0.0;
        let mut prev_t = 0;
        for i in iv {
            let mut keys: Vec<&str> = i.as_object().unwrap().keys().map(|k| k.as_str()).collect();
            keys.sort_unstable();
            assert_eq!(
                keys,
                ["iops", "lat_mean_ns", "lat_p50_ns", "lat_p99_9_ns", "lat_p99_ns", "read_iops", "t_ms", "write_iops"]
            );
            let t = i["t_ms"].as_u64().unwrap();
            assert!(t > prev_t, "time goes forward: {iv:?}");
            let dt = (t - prev_t) as f64 / 1e3;
            prev_t = t;
            sum += i["iops"].as_f64().unwrap() * dt;
            assert_eq!(i["read_iops"].as_f64().unwrap(), 0.0);
            let (p50, p99, p999) =
                (i["lat_p50_ns"].as_f64().unwrap(), i["lat_p99_ns"].as_f64().unwrap(), i["lat_p99_9_ns"].as_f64().unwrap());
            assert!(p50 > 0.0 && p50 <= p99 && p99 <= p999, "{i}");
            assert!(i["lat_mean_ns"].as_f64().unwrap() > 0.0);
            // Two jobs capped at 2000 IOPS each. The limiter keeps absolute deadlines, so after a
            // stall one interval may catch up above the cap; what was done by the end of each
            // interval never is (counting from the start of the 300 ms ramp, plus one slot per job).
            let iops = i["iops"].as_f64().unwrap();
            assert!(iops > 0.0, "{i}");
            let cap = 2.0 * 2000.0 * (0.3 + t as f64 / 1e3) + 2.0;
            assert!(sum <= cap * 1.01, "{sum} I/Os done by {t} ms, over the cap {cap}: {iv:?}");
        }
        assert_eq!(prev_t, 2000);
        assert!((sum - total as f64).abs() <= 0.01 * total as f64 + 2.0, "intervals sum to {sum}, total {total}");

        let off = RunArgs { log_avg_msec: 0, runtime: Some(std::time::Duration::from_millis(200)), ..a.clone() };
        if let Ok(r) = run(&off) {
            assert_eq!(r.to_json()["nvmflab"]["intervals"].as_array().unwrap().len(), 0);
        }
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_local_write_verify_run_passes_and_reports() {
        let path = std::env::temp_dir().join(format!("nvmf-perf-plan-{}.img", std::process::id()));
        let a = run_args(&["--rw", "write", "--bs", "4k", "--size", "256k", "--iodepth", "4", "--verify", "--numjobs", "2"]);
        let a = RunArgs { local: Some(path.clone()), ..a };
        let report = match run(&a) {
            Ok(r) => r,
            Err(e) if e.to_string().contains("io_uring") || e.to_string().contains("Operation not permitted") => {
                eprintln!("io_uring unavailable here, skipping: {e}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        std::fs::remove_file(&path).unwrap();
        let v = report.to_json();
        assert_eq!(v["jobs"].as_array().unwrap().len(), 2);
        let writes: u64 = (0..2).map(|i| v["jobs"][i]["write"]["total_ios"].as_u64().unwrap()).sum();
        assert_eq!(writes, 64, "one pass of 256 KiB in 4 KiB writes, split between two jobs");
        assert_eq!(v["nvmflab"]["jobs"][0]["verified_ios"], 32);
        assert_eq!(v["nvmflab"]["engine"], "local");
        assert_eq!(v["nvmflab"]["knobs"]["verify"], true);
    }
}
