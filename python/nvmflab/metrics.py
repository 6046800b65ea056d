"""nvmf-perf's JSON (fio layout) reduced to one row of the measurements table."""

from __future__ import annotations

import json
from typing import Any, Iterable

import numpy as np

PERCENTILES = {"lat_p50_ns": 50.0, "lat_p90_ns": 90.0, "lat_p99_ns": 99.0,
               "lat_p99_9_ns": 99.9, "lat_p99_99_ns": 99.99}
# The fields of one nvmflab.intervals record (per --log_avg_msec interval, summed over jobs).
INTERVAL_FIELDS = ("t_ms", "iops", "read_iops", "write_iops", "lat_mean_ns", "lat_p50_ns", "lat_p99_ns",
                   "lat_p99_9_ns")
_FIO_KEYS = {"lat_p50_ns": "50.000000", "lat_p90_ns": "90.000000", "lat_p99_ns": "99.000000",
             "lat_p99_9_ns": "99.900000", "lat_p99_99_ns": "99.990000"}


def merge_histograms(histograms: Iterable[Iterable[Iterable[int]]]) -> list[list[int]]:
    """Histograms ([[value_ns, count], ...] each) summed into one sorted histogram."""
    counts: dict[int, int] = {}
    for histogram in histograms:
        for value, count in histogram:
            counts[int(value)] = counts.get(int(value), 0) + int(count)
    return [[v, counts[v]] for v in sorted(counts) if counts[v] > 0]


def merged_histogram(perf: dict[str, Any]) -> list[list[int]]:
    """Read and write histograms merged into one sorted [[value_ns, count], ...]."""
    sides = perf.get("nvmflab", {}).get("histogram", {})
    return merge_histograms(sides.get(direction, []) for direction in ("read", "write"))


def histogram_percentile(histogram: list[list[int]], pct: float) -> float:
    """Smallest recorded value at or below which pct % of the I/Os completed (fio's rule)."""
    values = np.array([v for v, _ in histogram], dtype=float)
    counts = np.cumsum([c for _, c in histogram])
    rank = pct / 100.0 * counts[-1]
    return float(values[min(int(np.searchsorted(counts, rank, side="left")), len(values) - 1)])


def intervals(perf: dict[str, Any]) -> list[dict[str, float]] | None:
    """nvmflab.intervals as a list sorted by t_ms with only the known fields, or None when absent.
    A field a record lacks (an adapter that cannot tell) is None."""
    records = perf.get("nvmflab", {}).get("intervals")
    if not isinstance(records, list) or not records:
        return None
    cleaned = [{f: (None if r.get(f) is None else float(r[f])) for f in INTERVAL_FIELDS}
               for r in records if isinstance(r, dict) and r.get("t_ms") is not None]
    return sorted(cleaned, key=lambda r: r["t_ms"]) or None


def summarize(perf: dict[str, Any]) -> dict[str, Any]:
    """Sums over jobs and directions; latency percentiles from the merged histogram."""
    jobs = perf.get("jobs", [])
    sides = [job[d] for job in jobs for d in ("read", "write") if job.get(d, {}).get("total_ios", 0) > 0]
    total_ios = sum(s["total_ios"] for s in sides)
    row: dict[str, Any] = {
        "engine": perf.get("nvmflab", {}).get("engine"),
        "iops": float(sum(s.get("iops", 0.0) for s in sides)),
        "bw_bytes": float(sum(s.get("bw_bytes", 0) for s in sides)),
        "read_iops": float(sum(j.get("read", {}).get("iops", 0.0) for j in jobs)),
        "write_iops": float(sum(j.get("write", {}).get("iops", 0.0) for j in jobs)),
        "total_ios": int(total_ios),
        "runtime_ms": int(max((j.get("job_runtime", 0) for j in jobs), default=0)),
        "lat_mean_ns": (sum(s["clat_ns"]["mean"] * s["total_ios"] for s in sides) / total_ios
                        if total_ios else None),
        "lat_max_ns": float(max((s["clat_ns"]["max"] for s in sides), default=0)) if sides else None,
        "usr_cpu": float(sum(j.get("usr_cpu", 0.0) for j in jobs)),
        "sys_cpu": float(sum(j.get("sys_cpu", 0.0) for j in jobs)),
        "ctx": int(sum(j.get("ctx", 0) for j in jobs)),
        "voluntary_ctx": perf.get("nvmflab", {}).get("voluntary_ctx"),
        "involuntary_ctx": perf.get("nvmflab", {}).get("involuntary_ctx"),
    }
    histogram = merged_histogram(perf)
    row["histogram_json"] = json.dumps(histogram)
    series = intervals(perf)
    row["intervals_json"] = json.dumps(series) if series else None
    for column, pct in PERCENTILES.items():
        if histogram:
            row[column] = histogram_percentile(histogram, pct)
        elif sides:
            # No histogram: take the busiest direction's fio percentile.
            busiest = max(sides, key=lambda s: s["total_ios"])
            row[column] = float(busiest["clat_ns"].get("percentile", {}).get(_FIO_KEYS[column], "nan"))
        else:
            row[column] = None
    return row
