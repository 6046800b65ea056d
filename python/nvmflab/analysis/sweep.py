"""Plain sweeps (`nvmflab run SPEC` without `study`): every point's main metrics, and the main
metrics against the swept knob.

The swept knobs are the knob columns whose value differs between the usable points. The first
numeric one is the x axis of the figures; the others, if any, name their lines.

A sweep of one knob over exactly two values is a comparison: its finding states the second value
against the first for IOPS, bandwidth, mean and p99 latency, each with its 95 % interval (Welch over
repeats, which `repeated` interleaves) and Holm's correction over the four metrics. The real A/A
run (`test_aa_run.py`: so_priority 0 against 6 on loopback) goes through this path.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd

from .. import plots
from ..findings_data import Finding
from .common import compare_frames, corrected, descriptive, excluded_points, stated, study_rows
from .decide import pick_best_summary
from .result import Figure, StudyResult, Table
from .stats import KNOB_COLUMNS, aggregate, usable
from .text import kiops, mbps, size, us

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


def with_point_knobs(data: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The rows with every point knob that varies and is not a result column (so_priority, tos, ...)
    as a column, and the names of those columns: a swept knob outside KNOB_COLUMNS is still swept
    (before, a sweep of so_priority read as "one point, nothing swept" and pooled both values)."""
    if data.empty or "knobs_json" not in data:
        return data, []
    parsed = [json.loads(k) if isinstance(k, str) else {} for k in data["knobs_json"]]
    names = sorted({n for p in parsed for n in p} - set(KNOBS) - {"file_dir"})
    varying = [n for n in names if len({json.dumps(p.get(n), sort_keys=True) for p in parsed}) > 1]
    return data.assign(**{n: [p.get(n) for p in parsed] for n in varying}), varying


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
    data, extra = with_point_knobs(data)
    knobs = swept_knobs(data) + extra
    agg = aggregate(data, by=knobs or ["leg"])
    out.tables.append(Table("Every point", points_table(agg, knobs),
                            "Mean over repeats; host CPU is the load generator's usr + sys % summed over "
                            "jobs, target CPU the target's CPU seconds over the point (ramp included)."))
    best, fastest = agg.loc[agg["iops_mean"].idxmax()], agg.loc[agg["lat_p99_ns_mean"].idxmin()]
    if not knobs:
        out.findings.append(descriptive(
            f"One point, nothing swept: {kiops(best['iops_mean'])}, p99 {us(best['lat_p99_ns_mean'])}."))
        return out
    if len(knobs) == 1 and len(agg) == 2:  # a comparison: its difference, not the larger of two means
        out.findings.append(two_values(data, knobs[0], list(agg[knobs[0]])))
    else:
        out.findings.append(picks(agg, knobs, name))
    _figures(name, agg, knobs, out)
    return out


def picks(agg: pd.DataFrame, knobs: list[str], study: str) -> Finding | str:
    """The highest throughput and the lowest p99 among the points, each a pick only where Welch finds
    it clearly better than every other point (decide.pick_best_summary, Holm over the k − 1)."""
    parts, picked = [], False
    for metric, word, fmt, higher in (("iops", "highest throughput", kiops, True),
                                      ("lat_p99_ns", "lowest p99", us, False)):
        stats = tuple(agg[f"{metric}_{k}"].to_numpy(dtype=float) for k in ("mean", "std", "n"))
        index = int(pick_best_summary(stats, higher_is_better=higher))
        if index >= 0:
            picked = True
            row = agg.iloc[index]
            parts.append(f"the {word}, {fmt(row[f'{metric}_mean'])}, at {_where(row, knobs)} (clearly "
                         f"{'above' if higher else 'below'} each of the other {len(agg) - 1}: Welch, Holm over them)")
        else:
            at = int(np.nanargmax(stats[0]) if higher else np.nanargmin(stats[0]))
            top = agg.iloc[at]
            best = f"the best mean, {fmt(top[f'{metric}_mean'])} at {_where(top, knobs)}"
            # Welch needs two repeats with spread on both sides: without them no test was run at all.
            formed = (stats[2] >= 2) & (stats[1] > 0)
            if not formed[at] or formed.sum() < 2:
                parts.append(f"cannot decide the {word} among the {len(agg)} ({best}; no interval: fewer than "
                             "two repeats, or repeats without spread)")
            else:
                parts.append(f"no clear best for the {word} among the {len(agg)} ({best}, is not clearly "
                             f"{'above' if higher else 'below'} every other: Welch, Holm over the {len(agg) - 1})")
    text = f"{len(agg)} points over {', '.join(knobs)}: " + "; ".join(parts) + "."
    return Finding(text, study, decided=True) if picked else text


CONTRAST = (("iops", "IOPS", kiops), ("bw_bytes", "bandwidth", mbps), ("lat_mean_ns", "mean latency", us),
            ("lat_p99_ns", "p99 latency", us))


def two_values(data: pd.DataFrame, knob: str, values: list) -> str:
    """The second value of a two-valued sweep against the first, per main metric (Holm over them)."""
    first, second = (data[data[knob].astype(str) == str(v)] for v in values)
    diffs = corrected([compare_frames(first, second, metric) for metric, _, _ in CONTRAST])
    parts = [f"{label} " + stated(d, fmt, "clearly different" if d.decidable else "cannot decide",
                                  same="no clear difference")
             for (_, label, fmt), d in zip(CONTRAST, diffs)]
    clear = [label for (_, label, _), d in zip(CONTRAST, diffs) if d.clear]
    head = (f"{knob} = {_value(knob, values[1])} against {knob} = {_value(knob, values[0])}: "
            + (f"a clear difference in {', '.join(clear)}" if clear else "no clear difference in any main metric"))
    return head + " — " + "; ".join(parts) + "."
