"""fio as a load generator: its command line from a point's knobs and its reports read back.

Any stack whose host side runs fio (the kernel host today; a userspace host through fio's external
ioengine could use the same) builds the argv and reads the JSON report, the json+ latency bins and
the per-interval logs here, so the reading of fio's output is one piece of code with one set of tests.
fio's JSON is hostile input: sizes, types and numbers are checked, and a bad report is one
StackError line.
"""

from __future__ import annotations

import json
from typing import Any

from ..cores import cpulist
from ..plan import PerfJob
from .base import StackError

# fio's percentiles: the ones the harness records (metrics.PERCENTILES).
PERCENTILE_LIST = "50:90:99:99.9:99.99"
MAX_REPORT_CHARS = 64 << 20


def fio_argv(fio: str, job: PerfJob, filename: str, engine: str, runtime: float, ramp_time: float,
             output: str, direct: bool = True) -> list[str]:
    k = job.knobs
    argv = [fio, f"--name={job.role}", f"--filename={filename}", f"--direct={int(direct)}", f"--ioengine={engine}",
            f"--rw={k['rw']}", f"--bs={k['bs']}", f"--iodepth={k['iodepth']}", f"--numjobs={k['numjobs']}",
            f"--cpus_allowed={cpulist(list(job.cpus))}", "--cpus_allowed_policy=split",
            "--time_based", f"--runtime={_ms(runtime, 1)}", f"--ramp_time={_ms(ramp_time)}",
            # No --group_reporting: the harness sums jobs itself, and a group's usr_cpu/sys_cpu would
            # be the jobs' mean and its job_runtime their sum. Percentiles then come from the busiest
            # job (exact for one job; a sample of identical jobs otherwise).
            f"--percentile_list={PERCENTILE_LIST}",
            # IOPS and mean completion latency per interval, one log per job and kind (fio's
            # averaged logs carry no percentiles)
            f"--write_iops_log={log_prefix(output)}", f"--write_lat_log={log_prefix(output)}",
            f"--log_avg_msec={LOG_AVG_MSEC}",
            # json+ adds each job's latency bins, merged into one histogram like nvmf-perf's
            "--output-format=json+", f"--output={output}"]
    if k["completion"] == "poll":
        argv.append("--hipri")
    if k["rw"] in ("rw", "randrw", "readwrite"):
        argv.append(f"--rwmixread={k['rwmixread']}")
    if k.get("rate_iops"):
        argv.append(f"--rate_iops={k['rate_iops']}")  # per job, as nvmf-perf's
    if k.get("size"):
        argv.append(f"--size={k['size']}")
    return argv


LOG_AVG_MSEC = 1000
MAX_LOG_LINES = 100_000


def log_prefix(output: str) -> str:
    return output[:-5] + "-log" if output.endswith(".json") else output + "-log"


def fio_intervals(logs: dict[tuple[str, int], str], avg_msec: int) -> list[dict[str, Any]]:
    """nvmflab.intervals from fio's averaged logs ("time_ms, value, direction, bs, offset" lines):
    IOPS summed over jobs and directions, mean latency weighted by each side's IOPS."""
    per: dict[int, dict[str, float]] = {}
    weights: dict[tuple[int, int, int], float] = {}  # (t, job, direction) -> IOPS, to weight clat
    for (kind, job), text in sorted(logs.items(), key=lambda item: item[0][0] != "iops"):
        for line in text.splitlines()[:MAX_LOG_LINES]:
            fields = [f.strip() for f in line.split(",")]
            try:
                t_ms, value, direction = int(fields[0]), float(fields[1]), int(fields[2])
            except (IndexError, ValueError):
                raise StackError(f"fio {kind} log of job {job}: unreadable line {line[:60]!r}") from None
            if direction not in (0, 1) or value < 0 or t_ms < 0:
                raise StackError(f"fio {kind} log of job {job}: out-of-range line {line[:60]!r}")
            t = max(1, round(t_ms / avg_msec)) * avg_msec  # fio stamps drift by a millisecond or two
            if kind != "iops" and t not in per:
                continue  # a latency line past the last IOPS line (fio's partial last window)
            slot = per.setdefault(t, {"iops": 0.0, "read_iops": 0.0, "write_iops": 0.0, "lat_sum": 0.0, "w": 0.0})
            if kind == "iops":
                slot["iops"] += value
                slot["read_iops" if direction == 0 else "write_iops"] += value
                weights[(t, job, direction)] = value
            else:
                weight = weights.get((t, job, direction), 0.0)
                slot["lat_sum"] += value * weight
                slot["w"] += weight
    return [{"t_ms": t, "iops": s["iops"], "read_iops": s["read_iops"], "write_iops": s["write_iops"],
             "lat_mean_ns": s["lat_sum"] / s["w"] if s["w"] else None,
             "lat_p50_ns": None, "lat_p99_ns": None, "lat_p99_9_ns": None} for t, s in sorted(per.items())]


def parse_fio(text: str) -> dict[str, Any]:
    """fio's JSON report, unchanged (metrics.summarize reads it as it reads nvmf-perf's)."""
    if len(text) > MAX_REPORT_CHARS:
        raise StackError(f"fio report is {len(text)} characters, more than {MAX_REPORT_CHARS}")
    # fio may print notes ("fio: ...") before the JSON when --output is not a fresh file.
    start = text.find("{")
    try:
        report = json.loads(text[start:]) if start >= 0 else None
    except (json.JSONDecodeError, RecursionError) as err:
        raise StackError(f"fio report is not JSON: {' '.join(str(err).split())}") from None
    if not isinstance(report, dict) or not isinstance(report.get("jobs"), list):
        raise StackError("fio report is not JSON with a jobs list")
    for job in report["jobs"]:
        if not isinstance(job, dict) or any(not isinstance(job.get(d, {}), dict) for d in ("read", "write")):
            raise StackError("fio report has a job that is not an object with read/write sections")
        if job.get("error"):
            raise StackError(f"fio job {str(job.get('jobname'))[:60]!r} reports error {job.get('error')!r}")
    histogram = {d: fio_bins(report["jobs"], d) for d in ("read", "write")}
    if any(histogram.values()):
        report["nvmflab"] = {"engine": "fio", "histogram": histogram}
    return report


def fio_bins(jobs: list[dict[str, Any]], direction: str) -> list[list[int]]:
    """json+'s completion-latency bins of every job, added: [[value_ns, count], ...] sorted.
    Adding bins (not averaging percentiles) gives the true percentiles over all jobs."""
    counts: dict[int, int] = {}
    for job in jobs:
        bins = job.get(direction, {}).get("clat_ns", {}).get("bins", {})
        if not isinstance(bins, dict):
            raise StackError(f"fio report: {direction} clat_ns bins is not an object")
        for value, count in bins.items():
            try:
                value_ns, n = int(value), int(count)
            except (TypeError, ValueError):
                raise StackError(f"fio report: {direction} latency bin {str(value)[:20]!r} is not a number") from None
            if value_ns < 0 or n < 0:
                raise StackError(f"fio report: {direction} latency bin {value_ns} has a negative value or count")
            counts[value_ns] = counts.get(value_ns, 0) + n
    return [[v, counts[v]] for v in sorted(counts) if counts[v] > 0]


def _ms(seconds: float, least: int = 0) -> str:
    return f"{max(least, round(seconds * 1000))}ms"
