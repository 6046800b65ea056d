"""Selections the contention, dimensions, busy-poll and parallelism analyses share."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import pandas as pd

from .stats import aggregate, collapse_jobs

METRICS = ["iops", "bw_bytes", "lat_mean_ns", "lat_p90_ns", "lat_p99_ns", "lat_p99_99_ns", "usr_cpu", "sys_cpu",
           "perf_usr_s", "perf_sys_s", "target_usr_s", "target_sys_s", "total_ios", "runtime_ms"]


def with_knobs(frame: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    """The frame with point knobs that are not result columns (`app`, `config`, ...) as columns."""
    if frame.empty:
        return frame.assign(**{n: pd.Series(dtype=object) for n in names})
    parsed = [json.loads(k) if isinstance(k, str) else {} for k in frame["knobs_json"]]
    return frame.assign(**{n: [p.get(n) for p in parsed] for n in names})


def means(frame: pd.DataFrame, by: Sequence[str], metrics: Sequence[str] = METRICS) -> pd.DataFrame:
    """Per group: the mean of every metric over repeats (jobs of one point summed first, as
    `stats.aggregate` does), the number of repeats, and the 95 % interval half-width of IOPS and
    bandwidth. A thin view of `stats.aggregate`: the `<metric>_mean` columns under the metric's
    own name."""
    columns = list(by) + list(metrics) + ["repeats", "iops_ci95", "bw_ci95"]
    if frame.empty:
        return pd.DataFrame(columns=columns)
    wanted = list(dict.fromkeys(list(metrics) + ["iops", "bw_bytes"]))
    agg = aggregate(frame, by=list(by), metrics=wanted)
    out = agg[list(by)].copy()
    for metric in metrics:
        out[metric] = agg[f"{metric}_mean"] if f"{metric}_mean" in agg else math.nan
    # repeats: the measured points of the group, each (run, point, repeat) once however many jobs
    # or processes it had
    ids = [c for c in ("run_id", "point_id", "repeat") if c in frame]
    collapsed = collapse_jobs(frame)
    grouped = collapsed.groupby(list(by), dropna=False, sort=True)
    counts = grouped.apply(lambda g: len(g.drop_duplicates(ids)) if ids else len(g), include_groups=False)
    out["repeats"] = [int(v) for v in counts.values]
    out["iops_ci95"] = agg["iops_ci95"] if "iops_ci95" in agg else math.nan
    out["bw_ci95"] = agg["bw_bytes_ci95"] if "bw_bytes_ci95" in agg else math.nan
    return out.reset_index(drop=True)


def r1(value: float, scale: float = 1.0, digits: int = 1) -> float:
    return math.nan if value is None or math.isnan(value) else round(value / scale, digits)


def ratio(a: float, b: float) -> float:
    return math.nan if b is None or a is None or math.isnan(a) or math.isnan(b) or b == 0 else a / b


def spread(mean: float, ci: float) -> str:
    """' ± 3.1 %' of a mean's 95 % interval, or a note that one repeat gives none."""
    if mean is None or math.isnan(mean) or mean == 0:
        return ""
    if ci is None or math.isnan(ci):
        return " (one repeat, no interval)"
    return f" (± {100 * ci / mean:.1f} % at 95 %)"
