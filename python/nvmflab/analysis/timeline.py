"""Latency over time: which measurements' latency changed during the run, and their figures.

A load generator that records per-interval figures (nvmf-perf's `nvmflab.intervals`, one record
per --log_avg_msec interval) leaves them in the measurement's `intervals_json`. A run whose p99
moved (warm-up, a background tenant starting, a cache filling) is worth a look over time; a flat
one is not. The rule (docs/analysis.md, "Latency over time"):

the run changed when, at some split of its intervals into an earlier and a later part, the later
part's median p99 differs from the earlier part's by more than the spread (max − min) of p99
within either part, and by more than 20 % of the run's median p99.

Splits put at least one interval on each side, so a slow first interval (warm-up) or a last one
counts; where several splits qualify, the one whose gap exceeds its spread by most marks the
change. Fewer than 3 intervals say nothing. A load generator whose intervals carry no
percentiles (fio's averaged logs: IOPS and mean latency) is judged on its mean latency instead.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pandas as pd

from .. import plots
from .result import Figure

MIN_INTERVALS = 3
MIN_RELATIVE_CHANGE = 0.20  # below 20 % of the median a shift is not worth a figure
MAX_FIGURES = 6  # per study: the largest changes first


@dataclass
class Change:
    split: int  # index of the first interval of the later part
    before_ns: float  # median p99 of the earlier part
    after_ns: float  # median p99 of the later part

    @property
    def ratio(self) -> float:
        return self.after_ns / self.before_ns if self.before_ns else math.inf


def parse(intervals_json: object) -> list[dict]:
    """The records of one measurement; [] for NULL, NaN or empty."""
    if not isinstance(intervals_json, str) or not intervals_json.strip():
        return []
    records = json.loads(intervals_json)
    return records if isinstance(records, list) else []


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def latency_change(p99: list[float]) -> Change | None:
    """The split with the largest clear shift of p99 (rule above), or None when the run was steady."""
    values = [v for v in p99 if v is not None and not math.isnan(v)]
    if len(values) < MIN_INTERVALS:
        return None
    floor = MIN_RELATIVE_CHANGE * _median(values)
    best: Change | None = None
    best_margin = 0.0
    for split in range(1, len(values)):
        before, after = values[:split], values[split:]
        gap = abs(_median(after) - _median(before))
        spread = max(max(before) - min(before), max(after) - min(after))
        # Where the change is, the parts are each steady: the split that clears its spread by most.
        if gap > spread and gap > floor and gap - spread > best_margin:
            best, best_margin = Change(split, _median(before), _median(after)), gap - spread
    return best


def changed_rows(rows: pd.DataFrame) -> list[tuple[pd.Series, list[dict], Change]]:
    """Usable measurement rows whose latency changed over the run, largest relative change first."""
    if rows.empty or "intervals_json" not in rows:
        return []
    found = []
    for _, row in rows.iterrows():
        records = parse(row["intervals_json"])
        key = judged_metric(records)
        # Intervals without the metric (no I/O completed in them) take no part in the rule.
        records = [r for r in records if _number(r.get(key))]
        change = latency_change([r[key] for r in records])
        if change is not None:
            found.append((row, records, change))
    found.sort(key=lambda item: _size(item[2]), reverse=True)
    return found


def judged_metric(records: list[dict]) -> str:
    """p99 where the intervals have it, else the mean latency (fio's averaged logs)."""
    return "lat_p99_ns" if any(_number(r.get("lat_p99_ns")) for r in records) else "lat_mean_ns"


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not math.isnan(value)


def _size(change: Change) -> float:
    """How large a change is, up or down alike (2x slower ranks with 2x faster)."""
    return abs(math.log(change.ratio)) if 0 < change.ratio < math.inf else math.inf


def _where(row: pd.Series) -> str:
    knobs = json.loads(row["knobs_json"]) if isinstance(row.get("knobs_json"), str) else {}
    shown = ", ".join(f"{k}={v}" for k, v in sorted(knobs.items()) if k in _SHOWN_KNOBS)
    return f"{row['leg']} · {row['role']} · repeat {row['repeat']}" + (f" · {shown}" if shown else "")


_SHOWN_KNOBS = {"rw", "bs", "iodepth", "numjobs", "completion", "target_mode", "idle_poll_us", "bg_load_pct",
                "app", "resource", "target_stack", "host_stack"}


def timeline_figures(study: str, rows: pd.DataFrame) -> tuple[list[Figure], str | None]:
    """Figures for the changed rows (at most MAX_FIGURES) and one finding, None when none changed."""
    found = changed_rows(rows)
    if not found:
        return [], None
    figures = []
    for row, records, change in found[:MAX_FIGURES]:
        where = _where(row)
        name = f"{study}_timeline_{row['point_key']}_{row['role']}"
        figure = plots.latency_timeline(records, title=f"{study}: latency over the run ({where})",
                                        change_at_ms=records[change.split - 1]["t_ms"])
        what = "p99" if judged_metric(records) == "lat_p99_ns" else "mean latency"
        caption = (f"Per-interval latency and IOPS of {where}: {what} went from "
                   f"{change.before_ns / 1e3:.1f} µs to {change.after_ns / 1e3:.1f} µs (median before and after "
                   f"the dotted line).")
        figures.append(Figure(name, figure, caption))
    left_out = len(found) - len(figures)
    finding = (f"Latency changed during the run of {len(found)} measurement(s) "
               f"(p99, or the mean where only that was logged, shifted beyond its spread; figures "
               f"'latency over the run'"
               + (f", the {len(figures)} largest shown, {left_out} more not drawn" if left_out else "") + ").")
    return figures, finding
