"""Selections the contention, dimensions, busy-poll and parallelism analyses share."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import pandas as pd

from .stats import ci95_halfwidth, collapse_jobs

METRICS = ["iops", "bw_bytes", "lat_mean_ns", "lat_p90_ns", "lat_p99_ns", "lat_p99_99_ns", "usr_cpu", "sys_cpu",
           "perf_usr_s", "perf_sys_s", "target_usr_s", "target_sys_s", "total_ios", "runtime_ms"]


def with_knobs(frame: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    """The frame with point knobs that are not result columns (`app`, `config`, ...) as columns."""
    if frame.empty:
        return frame.assign(**{n: pd.Series(dtype=object) for n in names})
    parsed = [json.loads(k) if isinstance(k, str) else {} for k in frame["knobs_json"]]
    return frame.assign(**{n: [p.get(n) for p in parsed] for n in names})


def means(frame: pd.DataFrame, by: Sequence[str], metrics: Sequence[str] = METRICS) -> pd.DataFrame:
    """Per group: the mean of every metric over repeats (jobs of one point summed first), the
    number of repeats, and the 95 % interval half-width of IOPS and bandwidth."""
    if frame.empty:
        return pd.DataFrame(columns=list(by) + list(metrics) + ["repeats", "iops_ci95", "bw_ci95"])
    collapsed = collapse_jobs(frame)
    rows = []
    for key, group in collapsed.groupby(list(by), dropna=False, sort=True):
        row = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        for metric in metrics:
            values = pd.to_numeric(group[metric], errors="coerce").dropna() if metric in group else pd.Series([])
            row[metric] = float(values.mean()) if len(values) else math.nan
        row["repeats"] = int(group["point_id"].nunique()) if "point_id" in group else len(group)
        row["iops_ci95"] = ci95_halfwidth(pd.to_numeric(group["iops"], errors="coerce").tolist())
        row["bw_ci95"] = ci95_halfwidth(pd.to_numeric(group["bw_bytes"], errors="coerce").tolist())
        rows.append(row)
    return pd.DataFrame(rows)


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
