"""Plain sweeps (`nvmflab run SPEC` without `study`): every point's main metrics, and the main
metrics against the swept knob.

The swept knobs are the knob columns whose value differs between the usable points. The first
numeric one is the x axis of the figures; the others, if any, name their lines.
"""

from __future__ import annotations

import re

import pandas as pd

from .. import plots
from .common import excluded_points, study_rows
from .result import Figure, StudyResult, Table
from .stats import KNOB_COLUMNS, aggregate, usable
from .text import kiops, size, us

KNOBS = [c for c in KNOB_COLUMNS if c not in ("leg", "role", "engine")]
AXIS_LABELS = {
    "iodepth": plots.QD_LABEL,
    "bs": "Block size (bs)",
    "numjobs": "Jobs (numjobs, one queue pair each)",
    "idle_poll_us": "Target idle poll period (idle_poll_us, µs)",
    "rate_iops": "Rate cap per job (rate_iops, IOPS; 0 = none)",
}
LOG2_KNOBS = ("iodepth", "bs", "numjobs")


def swept_knobs(data: pd.DataFrame) -> list[str]:
    return [k for k in KNOBS if k in data and data[k].astype(str).nunique() > 1]


def _value(knob: str, value: object) -> str:
    return size(value) if knob == "bs" else f"{value:g}" if isinstance(value, float) else str(value)


def _where(row: pd.Series, knobs: list[str]) -> str:
    return ", ".join(f"{k} = {_value(k, row[k])}" for k in knobs)


def points_table(agg: pd.DataFrame, knobs: list[str]) -> pd.DataFrame:
    table = pd.DataFrame({k: [_value(k, v) for v in agg[k]] for k in knobs})
    table["repeats"] = agg["iops_n"].values
    table["KIOPS"] = (agg["iops_mean"] / 1e3).round(2).values
    table["± 95 % CI (KIOPS)"] = (agg["iops_ci95"] / 1e3).round(2).values
    table["MB/s"] = (agg["bw_bytes_mean"] / 1e6).round(1).values
    table["p50 (µs)"] = (agg["lat_p50_ns_mean"] / 1e3).round(1).values
    table["p99 (µs)"] = (agg["lat_p99_ns_mean"] / 1e3).round(1).values
    table["host CPU (%)"] = (agg["usr_cpu_mean"] + agg["sys_cpu_mean"]).round(1).values
    table["target CPU (s)"] = (agg["target_usr_s_mean"] + agg["target_sys_s_mean"]).round(2).values
    return table


def _figures(name: str, agg: pd.DataFrame, knobs: list[str], out: StudyResult) -> None:
    numeric = [k for k in knobs if pd.api.types.is_numeric_dtype(agg[k]) and not pd.api.types.is_bool_dtype(agg[k])]
    x = (numeric or knobs)[0]
    others = [k for k in knobs if k != x]
    agg = agg.assign(series=agg.apply(lambda row: _where(row, others), axis=1)) if others else agg
    log2x = x in LOG2_KNOBS and bool((agg[x] > 0).all())
    common = dict(series="series" if others else None, xlabel=AXIS_LABELS.get(x, x), log2x=log2x,
                  xformat=size if x == "bs" else lambda v: f"{v:g}", label=(lambda v: v) if others else None)
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    out.figures.append(Figure(f"{safe}_iops_vs_{x}", plots.series_vs_x(
        agg, x, "iops", title=f"{name}: throughput vs {x}", ylabel=plots.KIOPS_LABEL, scale=1e-3, **common),
        f"Mean IOPS over repeats for each value of {x}; error bars are 95 % confidence intervals."))
    out.figures.append(Figure(f"{safe}_p99_vs_{x}", plots.series_vs_x(
        agg, x, "lat_p99_ns", title=f"{name}: p99 latency vs {x}", ylabel=plots.P99_LABEL, scale=1e-3, **common),
        f"Mean p99 completion latency over repeats for each value of {x}."))


def analyze(measurements: pd.DataFrame, runs: pd.DataFrame, name: str) -> StudyResult:
    rows = study_rows(measurements, name)
    out = StudyResult(name, "Sweep: the main metrics of every point")
    out.excluded = excluded_points(rows)
    data = usable(rows)
    if data.empty:
        out.findings.append(f"The sweep has no usable measurement ({rows['point_id'].nunique()} point(s), "
                            "all failed, skipped or invalid).")
        return out
    knobs = swept_knobs(data)
    agg = aggregate(data, by=knobs or ["leg"])
    out.tables.append(Table("Every point", points_table(agg, knobs),
                            "Mean over repeats; host CPU is the load generator's usr + sys % summed over "
                            "jobs, target CPU the target's CPU seconds over the point (ramp included)."))
    best, fastest = agg.loc[agg["iops_mean"].idxmax()], agg.loc[agg["lat_p99_ns_mean"].idxmin()]
    if not knobs:
        out.findings.append(f"One point, nothing swept: {kiops(best['iops_mean'])}, p99 {us(best['lat_p99_ns_mean'])}.")
        return out
    out.findings.append(
        f"{len(agg)} points over {', '.join(knobs)}: the highest throughput, {kiops(best['iops_mean'])}, at "
        f"{_where(best, knobs)}; the lowest p99, {us(fastest['lat_p99_ns_mean'])}, at {_where(fastest, knobs)}.")
    _figures(name, agg, knobs, out)
    return out
