//! The run report: fio's JSON layout plus the `nvmflab` section (CONTRACTS.md section 3), and a
//! readable fio-like text summary.
//!
//! `lat_ns` and `clat_ns` are the same measurement here: submit to completion of each I/O, as
//! seen by the job thread. fio splits off submission latency (slat) because its engines submit
//! in a separate system call per I/O; ours batches submissions, so there is no per-I/O slat.

use serde_json::{json, Map, Value};

use super::histogram::{percentile_key, LatencyHistogram, LatencySummary};
use super::job::{DirStats, JobResult};

/// One job's outcome and where it ran.
#[derive(Debug, Clone)]
pub struct JobReport {
    pub result: JobResult,
    pub cpu: Option<usize>,
    /// Why the job stopped early (its result is what it measured until then); None: it finished.
    pub error: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Report {
    /// `tcp` or `local`.
    pub engine: &'static str,
    /// Every option the run used, by its command-line name.
    pub knobs: Map<String, Value>,
    pub timestamp: u64,
    pub jobs: Vec<JobReport>,
    /// Times the controller was unreachable during the run (empty for a run without one).
    pub outages: Vec<OutageWindow>,
    /// `--start-at` and when the first job was released (`nvmflab.start`); None without it.
    pub start: Option<Value>,
}

/// One outage of the run: the connection was lost at `start_ns` and every queue that noticed
/// was back at `end_ns` (None: never; the run failed when ctrl-loss-tmo expired). Times are ns
/// since the jobs started (the ramp included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutageWindow {
    pub start_ns: u64,
    pub end_ns: Option<u64>,
    pub attempts: u32,
    pub cause: String,
}

impl OutageWindow {
    fn to_json(&self) -> Value {
        let (start_ms, end_ms) = (self.start_ns / 1_000_000, self.end_ns.map(|e| e / 1_000_000));
        json!({
            "start_ms": start_ms,
            "end_ms": end_ms,
            // From the rounded ends, so that the three fields always agree.
            "duration_ms": end_ms.map(|e| e.saturating_sub(start_ms)),
            "reconnect_attempts": self.attempts,
            "cause": self.cause,
        })
    }
}

fn dir_json(d: &DirStats, runtime_ns: u64) -> Value {
    let s = d.lat.summary();
    let secs = runtime_ns as f64 / 1e9;
    let bw_bytes = (d.bytes as f64 / secs) as u64;
    let percentile: Map<String, Value> = s.percentiles.iter().map(|&(p, v)| (percentile_key(p), json!(v))).collect();
    json!({
        "io_bytes": d.bytes,
        "io_kbytes": d.bytes / 1024,
        "bw_bytes": bw_bytes,
        "bw": bw_bytes / 1024,
        "iops": d.ios as f64 / secs,
        "runtime": runtime_ns / 1_000_000,
        "total_ios": d.ios,
        "lat_ns": {"min": s.min, "max": s.max, "mean": s.mean, "stddev": s.stddev},
        "clat_ns": {"min": s.min, "max": s.max, "mean": s.mean, "stddev": s.stddev, "percentile": percentile},
    })
}

fn pct(part: std::time::Duration, wall_ns: u64) -> f64 {
    if wall_ns == 0 {
        0.0
    } else {
        part.as_nanos() as f64 * 100.0 / wall_ns as f64
    }
}

impl Report {
    fn merged(&self, read: bool) -> LatencyHistogram {
        let mut h = LatencyHistogram::new();
        for j in &self.jobs {
            h.merge(if read { &j.result.read.lat } else { &j.result.write.lat });
        }
        h
    }

    /// `nvmflab.intervals`: interval k of every job merged (I/O counts and IOPS summed, latency
    /// histograms merged), in time order.
    pub fn intervals_json(&self) -> Vec<Value> {
        let n = self.jobs.iter().map(|j| j.result.intervals.len()).max().unwrap_or(0);
        let mut h = LatencyHistogram::new();
        (0..n)
            .map(|k| {
                h.reset();
                let (mut t_ns, mut read_iops, mut write_iops) = (0u64, 0.0, 0.0);
                for iv in self.jobs.iter().filter_map(|j| j.result.intervals.get(k)) {
                    t_ns = t_ns.max(iv.end_ns);
                    let secs = iv.end_ns.saturating_sub(iv.start_ns).max(1) as f64 / 1e9;
                    read_iops += iv.read_ios as f64 / secs;
                    write_iops += iv.write_ios as f64 / secs;
                    for &(v, c) in &iv.buckets {
                        h.record_n(v, c);
                    }
                }
                let s = h.summary();
                let p = |q: f64| s.percentiles.iter().find(|(pp, _)| *pp == q).map_or(0, |x| x.1) as f64;
                json!({
                    "t_ms": t_ns / 1_000_000,
                    "iops": read_iops + write_iops,
                    "read_iops": read_iops,
                    "write_iops": write_iops,
                    "lat_mean_ns": s.mean,
                    "lat_p50_ns": p(50.0),
                    "lat_p99_ns": p(99.0),
                    "lat_p99_9_ns": p(99.9),
                })
            })
            .collect()
    }

    pub fn to_json(&self) -> Value {
        let jobs: Vec<Value> = self
            .jobs
            .iter()
            .enumerate()
            .map(|(i, j)| {
                let r = &j.result;
                let u = &r.usage;
                json!({
                    "jobname": format!("job{i}"),
                    "groupid": 0,
                    // fio's errno; EIO for a job stopped by an error (the message: nvmflab.jobs[i].error).
                    "error": if j.error.is_some() { libc::EIO } else { 0 },
                    "job_runtime": r.runtime_ns / 1_000_000,
                    "read": dir_json(&r.read, r.runtime_ns),
                    "write": dir_json(&r.write, r.runtime_ns),
                    "usr_cpu": pct(u.user, r.wall_ns),
                    "sys_cpu": pct(u.sys, r.wall_ns),
                    "ctx": u.voluntary_ctx + u.involuntary_ctx,
                    "majf": u.majflt,
                    "minf": u.minflt,
                })
            })
            .collect();
        let buckets = |read| -> Vec<Value> { self.merged(read).buckets().into_iter().map(|(v, c)| json!([v, c])).collect() };
        let per_job: Vec<Value> = self
            .jobs
            .iter()
            .map(|j| {
                json!({
                    "cpu": j.cpu,
                    "voluntary_ctx": j.result.usage.voluntary_ctx,
                    "involuntary_ctx": j.result.usage.involuntary_ctx,
                    "ramp_ios": j.result.ramp_ios,
                    "ramp_late_ios": j.result.ramp_late_ios,
                    "verified_ios": j.result.verified_ios,
                    "retried_ios": j.result.retried_ios,
                    "error": j.error,
                })
            })
            .collect();
        json!({
            "fio version": concat!("nvmf-perf-", env!("CARGO_PKG_VERSION")),
            "timestamp": self.timestamp,
            "jobs": jobs,
            "nvmflab": {
                "engine": self.engine,
                "knobs": self.knobs,
                "voluntary_ctx": self.jobs.iter().map(|j| j.result.usage.voluntary_ctx).sum::<u64>(),
                "involuntary_ctx": self.jobs.iter().map(|j| j.result.usage.involuntary_ctx).sum::<u64>(),
                "histogram": {"read": buckets(true), "write": buckets(false)},
                "jobs": per_job,
                "intervals": self.intervals_json(),
                "outages": self.outages.iter().map(OutageWindow::to_json).collect::<Vec<_>>(),
                "start": self.start,
            }
        })
    }

    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let knob = |k: &str| self.knobs.get(k).map(|v| v.to_string().trim_matches('"').to_string()).unwrap_or_default();
        out.push_str(&format!(
            "nvmf-perf ({}): rw={}, bs={}, iodepth={}, numjobs={}, completion={}\n",
            self.engine,
            knob("rw"),
            knob("bs"),
            knob("iodepth"),
            knob("numjobs"),
            knob("completion")
        ));
        for (i, j) in self.jobs.iter().enumerate() {
            let r = &j.result;
            let cpu = j.cpu.map_or("any".to_string(), |c| c.to_string());
            out.push_str(&format!("job{i}: (groupid=0, cpu={cpu}): err= 0\n"));
            for (name, d) in [("read", &r.read), ("write", &r.write)] {
                if d.ios > 0 {
                    out.push_str(&dir_text(name, d, r.runtime_ns));
                }
            }
            let u = &r.usage;
            out.push_str(&format!(
                "  cpu          : usr={:.2}%, sys={:.2}%, ctx={} (voluntary {}, involuntary {}), majf={}, minf={}\n",
                pct(u.user, r.wall_ns),
                pct(u.sys, r.wall_ns),
                u.voluntary_ctx + u.involuntary_ctx,
                u.voluntary_ctx,
                u.involuntary_ctx,
                u.majflt,
                u.minflt
            ));
            if r.verified_ios > 0 {
                out.push_str(&format!("  verify       : {} I/Os read back, all blocks correct\n", r.verified_ios));
            }
            if r.retried_ios > 0 {
                out.push_str(&format!("  retried      : {} I/Os resubmitted after reconnecting\n", r.retried_ios));
            }
        }
        for o in &self.outages {
            let end = o.end_ns.map_or("never reconnected".to_string(), |e| {
                format!("back at {} ms, {} ms down", e / 1_000_000, (e / 1_000_000).saturating_sub(o.start_ns / 1_000_000))
            });
            out.push_str(&format!(
                "outage: lost at {} ms, {end}, {} reconnect attempt(s); cause: {}\n",
                o.start_ns / 1_000_000,
                o.attempts,
                o.cause
            ));
        }
        out.push_str("\nRun status (all jobs):\n");
        let runtime_ns = self.jobs.iter().map(|j| j.result.runtime_ns).max().unwrap_or(1);
        for (name, read) in [("READ", true), ("WRITE", false)] {
            let (ios, bytes) = self.jobs.iter().fold((0, 0), |(i, b), j| {
                let d = if read { &j.result.read } else { &j.result.write };
                (i + d.ios, b + d.bytes)
            });
            if ios > 0 {
                let secs = runtime_ns as f64 / 1e9;
                out.push_str(&format!(
                    "  {name}: IOPS={}, bw={}/s, io={}, run={}msec\n",
                    human(ios as f64 / secs),
                    human_bytes(bytes as f64 / secs),
                    human_bytes(bytes as f64),
                    runtime_ns / 1_000_000
                ));
            }
        }
        out
    }
}

fn dir_text(name: &str, d: &DirStats, runtime_ns: u64) -> String {
    let secs = runtime_ns as f64 / 1e9;
    let s: LatencySummary = d.lat.summary();
    let pcts: Vec<String> = s.percentiles.iter().map(|&(p, v)| format!("{p:.2}th=[{v}]")).collect();
    format!(
        "  {name}: IOPS={}, BW={}/s ({} in {}msec)\n    clat (nsec): min={}, max={}, avg={:.2}, stdev={:.2}\n    clat percentiles (nsec): {}\n",
        human(d.ios as f64 / secs),
        human_bytes(d.bytes as f64 / secs),
        human_bytes(d.bytes as f64),
        runtime_ns / 1_000_000,
        s.min,
        s.max,
        s.mean,
        s.stddev,
        pcts.join(", ")
    )
}

fn human(v: f64) -> String {
    match v {
        v if v >= 1e6 => format!("{:.2}M", v / 1e6),
        v if v >= 1e3 => format!("{:.1}k", v / 1e3),
        v => format!("{v:.0}"),
    }
}

fn human_bytes(v: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = v;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1}{}", UNITS[u])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::cpu::ThreadUsage;
    use std::time::Duration;

    fn sample() -> Report {
        let mut read = DirStats::default();
        for v in [1000u64, 2000, 3000, 4000] {
            read.ios += 1;
            read.bytes += 4096;
            read.lat.record(v);
        }
        let result = JobResult {
            read,
            runtime_ns: 2_000_000_000,
            wall_ns: 2_000_000_000,
            usage: ThreadUsage { user: Duration::from_millis(500), sys: Duration::from_millis(250), voluntary_ctx: 3, involuntary_ctx: 2, ..Default::default() },
            ..Default::default()
        };
        let mut knobs = Map::new();
        knobs.insert("rw".into(), json!("randread"));
        knobs.insert("bs".into(), json!(4096));
        Report { engine: "tcp", knobs, timestamp: 1, jobs: vec![JobReport { result, cpu: Some(0), error: None }], outages: vec![], start: None }
    }

    #[test]
    fn json_has_fios_keys_and_the_nvmflab_section() {
        let v = sample().to_json();
        assert!(v["fio version"].as_str().unwrap().starts_with("nvmf-perf-"));
        let job = &v["jobs"][0];
        for k in ["jobname", "groupid", "error", "job_runtime", "read", "write", "usr_cpu", "sys_cpu", "ctx", "majf", "minf"] {
            assert!(!job[k].is_null(), "jobs[0].{k} missing");
        }
        let read = &job["read"];
        for k in ["io_bytes", "io_kbytes", "bw_bytes", "bw", "iops", "runtime", "total_ios", "lat_ns", "clat_ns"] {
            assert!(!read[k].is_null(), "read.{k} missing");
        }
        for k in ["min", "max", "mean", "stddev"] {
            assert!(!read["lat_ns"][k].is_null() && !read["clat_ns"][k].is_null(), "{k}");
        }
        let p = read["clat_ns"]["percentile"].as_object().unwrap();
        let keys: Vec<&str> = p.keys().map(|s| s.as_str()).collect();
        assert_eq!(keys, ["50.000000", "90.000000", "99.000000", "99.900000", "99.990000"]);
        assert_eq!(read["total_ios"], 4);
        assert_eq!(read["io_bytes"], 16384);
        assert_eq!(read["iops"].as_f64().unwrap(), 2.0);
        assert_eq!(read["bw"], 8, "KiB/s");
        assert_eq!(read["runtime"], 2000, "ms");
        assert_eq!(job["usr_cpu"].as_f64().unwrap(), 25.0);
        assert_eq!(job["sys_cpu"].as_f64().unwrap(), 12.5);
        assert_eq!(job["ctx"], 5);
        assert_eq!(job["write"]["total_ios"], 0);
        assert_eq!(job["write"]["iops"].as_f64().unwrap(), 0.0);
        let n = &v["nvmflab"];
        assert_eq!(n["engine"], "tcp");
        assert_eq!(n["knobs"]["rw"], "randread");
        assert_eq!(n["voluntary_ctx"], 3);
        assert_eq!(n["involuntary_ctx"], 2);
        let hist = n["histogram"]["read"].as_array().unwrap();
        assert_eq!(hist.iter().map(|b| b[1].as_u64().unwrap()).sum::<u64>(), 4);
        assert_eq!(n["histogram"]["write"].as_array().unwrap().len(), 0);
        assert_eq!(n["jobs"][0]["cpu"], 0);
        assert_eq!(n["jobs"][0]["ramp_ios"], 0);
        assert_eq!(n["jobs"][0]["ramp_late_ios"], 0);
        assert_eq!(n["jobs"][0]["retried_ios"], 0);
        assert_eq!(n["outages"].as_array().unwrap().len(), 0);
    }

    #[test]
    fn outages_are_reported_with_their_window() {
        let mut r = sample();
        r.jobs[0].result.retried_ios = 3;
        r.outages = vec![
            OutageWindow { start_ns: 1_500_400_000, end_ns: Some(2_750_300_000), attempts: 2, cause: "the target closed the connection".into() },
            OutageWindow { start_ns: 4_000_000_000, end_ns: None, attempts: 5, cause: "Keep Alive: timed out".into() },
        ];
        let v = r.to_json();
        let o = &v["nvmflab"]["outages"];
        assert_eq!(o[0]["start_ms"], 1500);
        assert_eq!(o[0]["end_ms"], 2750);
        assert_eq!(o[0]["duration_ms"], 1250, "end_ms - start_ms, though 1249.9 ms passed");
        assert_eq!(o[0]["reconnect_attempts"], 2);
        assert_eq!(o[0]["cause"], "the target closed the connection");
        assert!(o[1]["end_ms"].is_null() && o[1]["duration_ms"].is_null(), "never back: no end");
        assert_eq!(v["nvmflab"]["jobs"][0]["retried_ios"], 3);
        let t = r.to_text();
        assert!(t.contains("outage: lost at 1500 ms, back at 2750 ms, 1250 ms down, 2 reconnect attempt(s)"), "{t}");
        assert!(t.contains("never reconnected"), "{t}");
        assert!(t.contains("3 I/Os resubmitted"), "{t}");
    }

    #[test]
    fn text_summary_is_readable() {
        let t = sample().to_text();
        assert!(t.contains("job0"), "{t}");
        assert!(t.contains("read: IOPS=2"), "{t}");
        assert!(t.contains("50.00th=["), "{t}");
        assert!(t.contains("usr=25.00%"), "{t}");
        assert!(!t.contains("write: IOPS"), "no writes, no write line: {t}");
    }
}
