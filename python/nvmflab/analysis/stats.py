"""Statistics over repeats and over latency histograms.

Every study repeats each point; a figure or table shows the mean with a 95 % confidence interval
(Student's t, because three repeats is the usual count). Latency CDFs and percentiles across
repeats come from the merged histograms, not from averaging percentiles.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from . import student as _student_t

# The knobs that define a point; grouping by them merges repeats of the same point.
KNOB_COLUMNS = [
    "leg", "role", "engine", "rw", "bs", "iodepth", "numjobs", "rate_iops", "completion",
    "target_mode", "idle_poll_us", "hdr_digest", "data_digest", "io_queues", "bg_load_pct",
]

METRIC_COLUMNS = [
    "iops", "bw_bytes", "lat_mean_ns", "lat_p50_ns", "lat_p90_ns", "lat_p99_ns", "lat_p99_9_ns",
    "lat_p99_99_ns", "lat_max_ns", "usr_cpu", "sys_cpu", "ctx", "voluntary_ctx",
    "involuntary_ctx", "target_usr_s", "target_sys_s",
]

# Columns that add up when one point ran several jobs or processes (per repeat and role).
# I/O counts and the processes' CPU seconds too, so CPU per I/O of the combined row stays right.
_ADDITIVE = {"iops", "bw_bytes", "read_iops", "write_iops", "total_ios", "ctx", "voluntary_ctx", "involuntary_ctx",
             "perf_usr_s", "perf_sys_s"}


def t95(dof: float) -> float:
    """Two-sided 95 % quantile of Student's t with `dof` degrees of freedom (NaN when dof < 1).

    From scipy.stats (exact for any dof, fractional Welch dof included), not a hand-typed table.
    """
    if dof is None or math.isnan(dof) or dof < 1:
        return math.nan
    return float(_student_t.ppf(0.975, dof))


def ci95_halfwidth(values: Sequence[float]) -> float:
    """Half-width of the 95 % confidence interval of the mean; NaN with fewer than 2 values."""
    data = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if len(data) < 2:
        return math.nan
    return t95(len(data) - 1) * float(data.std(ddof=1)) / math.sqrt(len(data))


def relative_ci95(values: Sequence[float]) -> float:
    """Half-width of the 95 % t interval of the mean as a fraction of |mean| (NaN when undefined)."""
    data = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    half = ci95_halfwidth(data)
    mean = float(np.mean(data)) if data else math.nan
    if math.isnan(half) or mean == 0 or math.isnan(mean):
        return math.nan
    return half / abs(mean)


def bootstrap_ci95(values: Sequence[float], statistic=np.median, resamples: int = 2000,
                   seed: int = 0) -> tuple[float, float]:
    """95 % percentile-bootstrap (scipy.stats.bootstrap) interval of `statistic` over the values: the
    interval for a percentile or median over repeats, where a t interval's normal shape does not
    hold. (NaN, NaN) with fewer than two values or when every value is the same."""
    data = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if len(data) < 2:
        return math.nan, math.nan
    if np.all(data == data[0]):
        return float(data[0]), float(data[0])
    from scipy.stats import bootstrap

    result = bootstrap((data,), statistic, n_resamples=resamples, confidence_level=0.95,
                       method="percentile", random_state=np.random.default_rng(seed))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def study_rows(measurements: pd.DataFrame, study: str) -> pd.DataFrame:
    """The rows of one study, every status."""
    if measurements.empty or "study" not in measurements:
        return measurements.iloc[0:0]
    return measurements[measurements["study"] == study]


def usable_mask(measurements: pd.DataFrame) -> pd.Series:
    """True for rows fit for analysis: status ok and no failed sanity invariant."""
    ok = measurements["status"] == "ok"
    if "invariant_ok" in measurements:
        ok &= measurements["invariant_ok"].map(lambda v: v is not False and v != 0)
    return ok


def usable(measurements: pd.DataFrame) -> pd.DataFrame:
    """The rows fit for analysis (see usable_mask)."""
    if measurements.empty:
        return measurements
    return measurements[usable_mask(measurements)]


def collapse_jobs(measurements: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, point, repeat, role): several jobs or processes of one role add up.

    Throughput and context switches are summed, latency columns take the worst job (a tenant
    sees the slowest of its jobs), CPU columns the mean, and histograms are merged.
    """
    keys = ["run_id", "point_id", "repeat", "role"]
    if measurements.empty or not measurements.duplicated(keys).any():
        return measurements
    rules: dict[str, object] = {}
    for column in measurements.columns:
        if column in keys:
            continue
        if column in _ADDITIVE:
            rules[column] = "sum"
        elif column.startswith("lat_"):
            rules[column] = "max"
        elif column in ("usr_cpu", "sys_cpu"):
            rules[column] = "mean"
        elif column == "histogram_json":
            rules[column] = lambda s: json.dumps(merge_histograms(s))
        else:
            rules[column] = "first"
    return measurements.groupby(keys, as_index=False, sort=False, dropna=False).agg(rules)


def merge_generators(measurements: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, point, repeat): every load generator of a point (all roles) adds up as in
    collapse_jobs, for studies whose roles are parts of one workload rather than tenants."""
    if measurements.empty:
        return measurements
    return collapse_jobs(measurements.assign(role="main"))


def aggregate(
    measurements: pd.DataFrame,
    by: Sequence[str] | None = None,
    metrics: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Mean, std, n and 95 % CI half-width of each metric over repeats, one row per point.

    `by` defaults to the knob columns present; missing knob values (NaN) form their own group,
    so an isolated run (bg_load_pct NaN) is kept apart from loaded ones. Output columns are the
    `by` columns plus `<metric>_mean`, `<metric>_std`, `<metric>_n`, `<metric>_ci95`.
    """
    by = [c for c in (by or KNOB_COLUMNS) if c in measurements.columns]
    metrics = [m for m in (metrics or METRIC_COLUMNS) if m in measurements.columns]
    if measurements.empty:
        columns = list(by) + [f"{m}_{s}" for m in metrics for s in ("mean", "std", "n", "ci95")]
        return pd.DataFrame(columns=columns)
    rows = []
    for key, group in collapse_jobs(measurements).groupby(by, dropna=False, sort=True):
        row = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        for metric in metrics:
            values = pd.to_numeric(group[metric], errors="coerce").dropna()
            row[f"{metric}_mean"] = float(values.mean()) if len(values) else math.nan
            row[f"{metric}_std"] = float(values.std(ddof=1)) if len(values) > 1 else math.nan
            row[f"{metric}_n"] = int(len(values))
            row[f"{metric}_ci95"] = ci95_halfwidth(values.tolist())
        rows.append(row)
    return pd.DataFrame(rows)


def _parse_histogram(histogram: object) -> list[tuple[float, int]]:
    if histogram is None or (isinstance(histogram, float) and math.isnan(histogram)):
        return []
    if isinstance(histogram, str):
        histogram = json.loads(histogram) if histogram.strip() else []
    return [(float(value), int(count)) for value, count in histogram]


def merge_histograms(histograms: Iterable[object]) -> list[tuple[float, int]]:
    """Sum [value_ns, count] histograms (lists or their JSON text) into one, sorted by value."""
    totals: dict[float, int] = {}
    for histogram in histograms:
        for value, count in _parse_histogram(histogram):
            totals[value] = totals.get(value, 0) + count
    return sorted((value, count) for value, count in totals.items() if count > 0)


def histogram_percentile(histogram: object, percentile: float) -> float:
    """Smallest recorded value at or below which `percentile` % of the samples lie (NaN if empty)."""
    if not 0 <= percentile <= 100:
        raise ValueError(f"percentile must lie in [0, 100], got {percentile}")
    buckets = _parse_histogram(histogram)
    total = sum(count for _, count in buckets)
    if total == 0:
        return math.nan
    needed = percentile / 100 * total
    seen = 0
    for value, count in sorted(buckets):
        seen += count
        if seen >= needed:
            return value
    return sorted(buckets)[-1][0]


def histogram_cdf(histogram: object) -> tuple[np.ndarray, np.ndarray]:
    """(values_ns, cumulative fraction) of a histogram, ready to plot as a CDF."""
    buckets = sorted(_parse_histogram(histogram))
    if not buckets:
        return np.array([]), np.array([])
    values = np.array([value for value, _ in buckets], dtype=float)
    counts = np.cumsum([count for _, count in buckets], dtype=float)
    return values, counts / counts[-1]


def diff_interval(mean_a: float, std_a: float, n_a: float, mean_b: float, std_b: float,
                  n_b: float) -> tuple[float, float]:
    """(mean_b − mean_a, half-width of its 95 % interval) from two summaries over repeats.

    Welch's interval (`decide.welch_summary`): the standard error is sqrt(s_a²/n_a + s_b²/n_b) and
    the degrees of freedom come from the Welch–Satterthwaite formula (fractional, at least 1). The
    half-width is NaN when either side has fewer than two repeats or repeats that are all equal
    (zero spread is no interval, not certainty).
    """
    diff, half, _ = diff_test(mean_a, std_a, n_a, mean_b, std_b, n_b)
    return diff, half


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def diff_test(mean_a: float, std_a: float, n_a: float, mean_b: float, std_b: float,
              n_b: float) -> tuple[float, float, float]:
    """diff_interval plus Welch's two-sided p value (NaN where no interval)."""
    from .decide import welch_summary

    if _missing(mean_a) or _missing(mean_b):
        return math.nan, math.nan, math.nan
    diff = float(mean_b) - float(mean_a)
    if any(_missing(v) for v in (std_a, n_a, std_b, n_b)):
        return diff, math.nan, math.nan
    _, half, p, _ = welch_summary(mean_a, std_a, n_a, mean_b, std_b, n_b)
    return diff, float(half), float(p)


def welch_stats(mean_a: float, std_a: float, n_a: float, mean_b: float, std_b: float,
                n_b: float) -> tuple[float, float, float, float, float]:
    """diff_test plus the difference's standard error and Welch–Satterthwaite dof (NaN where no
    interval): what Difference.detectable needs."""
    diff, half, p = diff_test(mean_a, std_a, n_a, mean_b, std_b, n_b)
    if math.isnan(half):
        return diff, half, p, math.nan, math.nan
    va, vb = float(std_a) ** 2 / float(n_a), float(std_b) ** 2 / float(n_b)
    dof = max(1.0, (va + vb) ** 2 / (va ** 2 / (float(n_a) - 1) + vb ** 2 / (float(n_b) - 1)))
    return diff, half, p, math.sqrt(va + vb), dof


def contrast_interval(terms: Sequence[tuple[float, float, float, float]]) -> tuple[float, float]:
    """(Σ cᵢ·meanᵢ, half-width of its 95 % interval) for terms (cᵢ, meanᵢ, stdᵢ, nᵢ) of independent
    summaries over repeats: a linear contrast such as (netns − loopback) − (loopback − local).

    Welch–Satterthwaite as in diff_interval (which is the contrast −a + b): the standard error is
    sqrt(Σ cᵢ²·sᵢ²/nᵢ) and the degrees of freedom are fractional, at least 1. The half-width is NaN
    when any term has fewer than two repeats or zero spread.
    """
    value, half, _ = contrast_test(terms)
    return value, half


def contrast_test(terms: Sequence[tuple[float, float, float, float]]) -> tuple[float, float, float]:
    """contrast_interval plus the two-sided p value of the contrast (NaN where no interval)."""
    return contrast_stats(terms)[:3]


def contrast_stats(terms: Sequence[tuple[float, float, float, float]]) -> tuple[float, float, float, float, float]:
    """contrast_test plus the contrast's standard error and Welch–Satterthwaite degrees of freedom
    (value, half, p, se, dof; all but the value NaN where no interval)."""
    nan5 = (math.nan,) * 5
    if not terms or any(_missing(mean) for _, mean, _, _ in terms):
        return nan5
    value = float(sum(float(c) * float(mean) for c, mean, _, _ in terms))
    undecided = (value,) + nan5[1:]
    if any(_missing(std) or _missing(n) or n < 2 or (float(c) != 0 and float(std) == 0)
           for c, _, std, n in terms):
        return undecided
    parts = [(float(c) ** 2 * float(std) ** 2 / n, n) for c, _, std, n in terms]
    se2 = sum(v for v, _ in parts)
    if se2 == 0:
        return undecided
    dof = max(1.0, se2 ** 2 / sum(v ** 2 / (n - 1) for v, n in parts if v))
    se = math.sqrt(se2)
    return value, t95(dof) * se, float(2 * _student_t.sf(abs(value) / se, dof)), se, dof
