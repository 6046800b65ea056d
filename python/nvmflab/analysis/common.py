"""Selections and comparisons that several study analyses share."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import pandas as pd

from .decide import holm
from .stats import collapse_jobs, contrast_test, diff_test, usable, usable_mask


def study_rows(measurements: pd.DataFrame, study: str) -> pd.DataFrame:
    """The rows of one study, every status."""
    if measurements.empty or "study" not in measurements:
        return measurements.iloc[0:0]
    return measurements[measurements["study"] == study]


def excluded_points(rows: pd.DataFrame) -> pd.DataFrame:
    """Failed or invalid rows with the reason, for the report's 'left out' list."""
    if rows.empty:
        return rows.iloc[0:0]
    bad = rows[~usable_mask(rows)]
    columns = [c for c in ("run_id", "leg", "point_id", "point_key", "repeat", "role", "status",
                           "bg_load_pct", "error", "invariant_detail") if c in bad.columns]
    return bad[columns].reset_index(drop=True)


def leg_rows(rows: pd.DataFrame, leg: str, role: str | None = None) -> pd.DataFrame:
    """Usable rows of one leg (and role when given)."""
    selected = usable(rows)
    selected = selected[selected["leg"] == leg] if not selected.empty else selected
    if role is not None and not selected.empty:
        selected = selected[selected["role"] == role]
    return selected


def missing_leg(rows: pd.DataFrame, leg: str, consequence: str) -> str:
    """Why a leg has nothing usable, in one sentence: skipped (with the reason), failed, or absent."""
    mine = rows[rows["leg"] == leg] if not rows.empty else rows
    if mine.empty:
        return f"The {leg} leg was not measured, so {consequence}."
    skipped = mine[mine["status"] == "skipped"]
    if len(skipped) == len(mine):
        reason = skipped["error"].dropna()
        why = f" ({reason.iloc[0]})" if len(reason) else ""
        return f"The {leg} leg was skipped{why}, so {consequence}."
    errors = mine["error"].dropna()
    example = f", e.g. {errors.iloc[0]}" if len(errors) else ""
    return (f"The {leg} leg has no usable measurements ({len(mine)} failed or invalid{example}), "
            f"so {consequence}.")


def first(frame: pd.DataFrame, column: str) -> float:
    """The single value of `column` in a one-row selection; NaN when the selection is empty."""
    return float(frame[column].iloc[0]) if len(frame) else math.nan


@dataclass(frozen=True)
class Difference:
    """B minus A for one metric over repeats, with the 95 % interval of that difference (Welch)."""

    diff: float
    half: float  # NaN when either side has fewer than two repeats or zero spread
    n: int  # the smaller repeat count of the two sides
    p: float = math.nan  # Welch's two-sided p value (NaN where no interval)
    family: int = 1  # how many comparisons Holm's correction was taken over (1: none)
    holm: bool = True  # False when Holm's correction over the family does not reject this one
    # What the comparison was made from (metric, values or rows), for findings as data (findings_data.py).
    source: dict | None = field(default=None, compare=False, repr=False)

    @property
    def decidable(self) -> bool:
        return not math.isnan(self.half) and not math.isnan(self.diff)

    @property
    def clear(self) -> bool:
        """True when the interval of the difference excludes zero and, in a family, Holm's
        correction keeps it."""
        return self.decidable and abs(self.diff) > self.half and self.holm

    @property
    def lost_to_holm(self) -> bool:
        """The interval alone excludes zero, but not after Holm's correction over the family."""
        return self.decidable and abs(self.diff) > self.half and not self.holm

    def text(self, fmt: Callable[[float], str]) -> str:
        """'+3.10 ± 2.40 µs' (or '+3.10 µs, no interval' with fewer than two repeats)."""
        if math.isnan(self.diff):
            return "n/a"
        sign = "+" if self.diff >= 0 else "−"
        if not self.decidable:
            why = f"{self.n} repeat(s)" if self.n < 2 else "no spread over the repeats"
            return f"{sign}{fmt(abs(self.diff))} (no interval: {why})"
        held = " (not clear after Holm)" if self.lost_to_holm else ""
        return _noted(self, f"{sign}{fmt(abs(self.diff))} ± {fmt(self.half)}{held}")

    def interval(self, fmt: Callable[[float], str]) -> str:
        """'95 % interval of the difference +1.2 to +3.4 µs', or 'one repeat: no interval'."""
        if math.isnan(self.diff):
            return "no difference could be formed"
        if not self.decidable:
            if self.n >= 2:
                return f"{_repeats(self.n)} without spread: no interval"
            return f"{_repeats(self.n)}: no interval"
        low, high = signed(self.diff - self.half, fmt), signed(self.diff + self.half, fmt)
        unit = low.rsplit(" ", 1)[1] if " " in low else None
        if unit and high.endswith(" " + unit):
            low = low[: -len(unit) - 1]  # '−3.1 to +0.4 µs', the unit once
        return _noted(self, f"95 % interval of the difference {low} to {high}{self.holm_note()}")

    def holm_note(self) -> str:
        """', not clear after Holm's correction over N comparisons' where that applies."""
        if self.lost_to_holm:
            return f", not clear after Holm's correction over {self.family} comparisons"
        return ""

    def verdict(self, effect: str, same: str = "no significant difference") -> str:
        """`effect` (a ratio or percentage) when the interval excludes zero or none could be formed
        (fewer than two repeats, which interval() then says); `same` when it includes zero."""
        return same if self.decidable and not self.clear else effect


def _noted(d: Difference, text: str) -> str:
    from ..findings_data import note

    note(d, text)
    return text


def signed(value: float, fmt: Callable[[float], str]) -> str:
    """'+1.2 µs' / '−1.2 µs' with `fmt` formatting the magnitude."""
    return ("+" if value >= 0 else "−") + fmt(abs(value))


def _repeats(n: int) -> str:
    return "one repeat" if n <= 1 else f"{n} repeats"


def stated(d: Difference, fmt: Callable[[float], str], effect: str, detail: str = "",
           same: str = "no significant difference") -> str:
    """A comparison as a finding states it: the effect (or 'no significant difference' when the 95 %
    interval of the difference includes zero), then in parentheses `detail` and the interval."""
    inner = f"{detail}; {d.interval(fmt)}" if detail else d.interval(fmt)
    return f"{d.verdict(effect, same)} ({inner})"


def repeat_values(frame: pd.DataFrame, metric: str) -> list[float]:
    """Per-repeat values of `metric` (jobs of one point summed first, as extra.means does)."""
    if frame is None or frame.empty or metric not in frame:
        return []
    values = pd.to_numeric(collapse_jobs(frame)[metric], errors="coerce").dropna()
    return [float(v) for v in values]


def _summary(values: Sequence[float]) -> tuple[float, float, int]:
    data = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    n = len(data)
    mean = sum(data) / n if n else math.nan
    std = math.sqrt(sum((v - mean) ** 2 for v in data) / (n - 1)) if n > 1 else math.nan
    return mean, std, n


def compare_values(a: Sequence[float], b: Sequence[float]) -> Difference:
    """Difference mean(b) − mean(a) of two samples over repeats, with its 95 % Welch interval."""
    (ma, sa, na), (mb, sb, nb) = _summary(a), _summary(b)
    diff, half, p = diff_test(ma, sa, na, mb, sb, nb)
    return Difference(diff, half, min(na, nb), p, source={"a": list(a), "b": list(b)})


def compare_frames(a: pd.DataFrame, b: pd.DataFrame, metric: str) -> Difference:
    """compare_values over the per-repeat values of `metric` in two selections of rows."""
    d = compare_values(repeat_values(a, metric), repeat_values(b, metric))
    return replace(d, source={**(d.source or {}), "metric": metric, "frames": (a, b)})


def contrast(terms: Sequence[tuple[float, pd.Series | dict]], metric: str) -> Difference:
    """Σ cᵢ·metricᵢ over rows of aggregate() (their _mean/_std/_n), with its 95 % interval."""
    def get(row, suffix):
        value = row.get(f"{metric}_{suffix}", math.nan) if row is not None else math.nan
        return math.nan if value is None else float(value)

    rows = [(c, get(r, "mean"), get(r, "std"), get(r, "n")) for c, r in terms]
    value, half, p = contrast_test(rows)
    n = int(min((0 if math.isnan(n) else n) for _, _, _, n in rows)) if rows else 0
    return Difference(value, half, n, p, source={"metric": metric, "terms": list(terms)})


def compare(a: pd.Series | dict, b: pd.Series | dict, metric: str) -> Difference:
    """Difference b − a of `metric` between two rows of `aggregate()` (its _mean/_std/_n columns)."""
    def get(row, suffix):
        value = row.get(f"{metric}_{suffix}", math.nan) if row is not None else math.nan
        return math.nan if value is None else float(value)

    n_a, n_b = get(a, "n"), get(b, "n")
    diff, half, p = diff_test(get(a, "mean"), get(a, "std"), n_a, get(b, "mean"), get(b, "std"), n_b)
    n = int(min(n_a if not math.isnan(n_a) else 0, n_b if not math.isnan(n_b) else 0))
    return Difference(diff, half, n, p, source={"metric": metric, "rows": (a, b)})


def corrected(diffs: Sequence[Difference]) -> list[Difference]:
    """The family of differences with Holm's correction applied (for a finding that picks among
    several candidates or tests many cells): each keeps its own 95 % interval, and one whose
    interval excludes zero but that Holm does not reject is no longer `clear`."""
    if not diffs:
        return []
    rejected = holm([d.p for d in diffs])
    family = sum(1 for d in diffs if d.decidable)
    return [Difference(d.diff, d.half, d.n, d.p, family=family, holm=bool(keep), source=d.source)
            if d.decidable else d
            for d, keep in zip(diffs, rejected)]


def within_spread(values: list[float], halfwidths: list[float]) -> bool:
    """True when one value lies inside every point's 95 % interval (all intervals share a point).

    False when any interval is unknown (a single repeat): a flat reading cannot then be claimed.
    """
    pairs = [(v, h) for v, h in zip(values, halfwidths) if not math.isnan(v)]
    if not pairs or any(math.isnan(h) for _, h in pairs):
        return False
    return max(v - h for v, h in pairs) <= min(v + h for v, h in pairs)
