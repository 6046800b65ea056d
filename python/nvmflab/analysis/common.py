"""Selections and comparisons that several study analyses share."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import pandas as pd

from . import student as _student_t
from .decide import ALPHA, holm
from .recorded import DESCRIPTIVE, note
from .stats import (  # noqa: F401  (study_rows: the analyses import it from here)
    collapse_jobs, contrast_stats, study_rows, usable, usable_mask, welch_stats)

# The power at which a "no clear difference" states the smallest effect it could have seen.
POWER = 0.8


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
    se: float = math.nan  # the difference's standard error (NaN where no interval)
    dof: float = math.nan  # its Welch–Satterthwaite degrees of freedom

    @property
    def detectable(self) -> float:
        """The smallest |difference| this comparison would have found clear with 80 % power, at its
        standard error and its family's alpha (Bonferroni's first Holm step): decide.detectable's
        rule. NaN where unknown (no interval, or a Difference built without se/dof)."""
        if not self.decidable or math.isnan(self.se) or math.isnan(self.dof):
            return math.nan
        family = max(int(self.family or 1), 1)
        dof = max(self.dof, 1.0)
        quantiles = _student_t.ppf(1 - ALPHA / (2 * family), dof) + _student_t.ppf(POWER, dof)
        return float(quantiles * self.se)

    @property
    def baseline(self) -> float:
        """Side A's mean where the source says it (values or an aggregate row); NaN otherwise."""
        source = self.source or {}
        if source.get("a"):
            mean, _, _ = _summary(source["a"])
            return mean
        rows, metric = source.get("rows"), source.get("metric")
        if rows and metric and rows[0] is not None and hasattr(rows[0], "get"):
            value = rows[0].get(f"{metric}_mean", math.nan)
            return math.nan if value is None else float(value)
        return math.nan

    @property
    def why_undecided(self) -> str:
        """Why no interval could be formed, in a few words ('' when one was)."""
        if math.isnan(self.diff):
            return "no difference could be formed: a side has no usable value"
        if self.decidable:
            return ""
        if self.n < 2:
            return "only one repeat on a side" if self.n == 1 else "no repeats on a side"
        return f"{self.n} repeats without spread: no interval"

    def detectable_clause(self, fmt: Callable[[float], str]) -> str:
        """'an effect larger than ±X (±Y % of A) would have been seen with 80 % power at these N
        repeats', or '' where the detectable effect is unknown."""
        x = self.detectable
        if math.isnan(x):
            return ""
        base = self.baseline
        relative = f" (±{100 * x / abs(base):.0f} % of {fmt(abs(base))})" if base and not math.isnan(base) else ""
        return (f"an effect larger than ±{fmt(x)}{relative} would have been seen with "
                f"{100 * POWER:.0f} % power at these {_repeats(self.n)}")

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
        held = f" (excludes zero alone, not after Holm over {self.family})" if self.lost_to_holm else ""
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
        """', which excludes zero alone, not after Holm over N comparisons' where that applies."""
        if self.lost_to_holm:
            return f", which excludes zero alone, not after Holm over {self.family} comparisons"
        return ""

    def verdict(self, effect: str, same: str = "no clear difference") -> str:
        """`effect` (a ratio or percentage) when the difference is clear; `same` when the interval
        includes zero (or Holm drops it); 'cannot decide (why)' when no interval could be formed."""
        if self.clear:
            return effect
        return same if self.decidable else f"cannot decide ({self.why_undecided})"


def _noted(d: Difference, text: str) -> str:
    note(d, text)
    return text


def signed(value: float, fmt: Callable[[float], str]) -> str:
    """'+1.2 µs' / '−1.2 µs' with `fmt` formatting the magnitude."""
    return ("+" if value >= 0 else "−") + fmt(abs(value))


def _repeats(n: int) -> str:
    return "one repeat" if n <= 1 else f"{n} repeats"


def _parts(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def stated(d: Difference, fmt: Callable[[float], str], effect: str, detail: str = "",
           same: str = "no clear difference") -> str:
    """A comparison as a finding states it: `effect` when the difference is clear, else `same` (the
    interval includes zero or Holm drops it) with the smallest effect the run could have seen, else
    'cannot decide (why)'; then in parentheses `detail` and the interval."""
    if d.clear:
        return f"{effect} ({_parts(detail, d.interval(fmt))})"
    if d.decidable:
        return f"{same} ({_parts(detail, d.interval(fmt), d.detectable_clause(fmt))})"
    return _noted(d, f"cannot decide ({_parts(d.why_undecided, detail)})")


def claim(d: Difference, fmt: Callable[[float], str], effect: str, what: str, detail: str = "") -> str:
    """A whole sentence (no final period) that starts with its verdict: `effect` (detail; interval)
    when the difference is clear; 'No clear difference in {what} (detail; interval; the smallest
    effect it could have seen)' when the interval includes zero or Holm drops it; 'Cannot tell
    whether {what} changed (why; detail)' when no interval could be formed."""
    if d.clear:
        return f"{effect} ({_parts(detail, d.interval(fmt))})"
    if d.decidable:
        return f"No clear difference in {what} ({_parts(detail, d.interval(fmt), d.detectable_clause(fmt))})"
    return _noted(d, f"Cannot tell whether {what} changed ({_parts(d.why_undecided, detail)})")


def descriptive(text: str) -> str:
    """A sentence that passed no test, marked so (before a final period, if any): the report and
    findings.json list it as descriptive, never as decided."""
    text = str(text)
    if text.endswith("."):
        return f"{text[:-1]} {DESCRIPTIVE}."
    return f"{text} {DESCRIPTIVE}"


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
    diff, half, p, se, dof = welch_stats(ma, sa, na, mb, sb, nb)
    return Difference(diff, half, min(na, nb), p, source={"a": list(a), "b": list(b)}, se=se, dof=dof)


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
    value, half, p, se, dof = contrast_stats(rows)
    n = int(min((0 if math.isnan(n) else n) for _, _, _, n in rows)) if rows else 0
    return Difference(value, half, n, p, source={"metric": metric, "terms": list(terms)}, se=se, dof=dof)


def compare(a: pd.Series | dict, b: pd.Series | dict, metric: str) -> Difference:
    """Difference b − a of `metric` between two rows of `aggregate()` (its _mean/_std/_n columns)."""
    def get(row, suffix):
        value = row.get(f"{metric}_{suffix}", math.nan) if row is not None else math.nan
        return math.nan if value is None else float(value)

    n_a, n_b = get(a, "n"), get(b, "n")
    diff, half, p, se, dof = welch_stats(get(a, "mean"), get(a, "std"), n_a, get(b, "mean"), get(b, "std"), n_b)
    n = int(min(n_a if not math.isnan(n_a) else 0, n_b if not math.isnan(n_b) else 0))
    return Difference(diff, half, n, p, source={"metric": metric, "rows": (a, b)}, se=se, dof=dof)


def corrected(diffs: Sequence[Difference]) -> list[Difference]:
    """The family of differences with Holm's correction applied (for a finding that picks among
    several candidates or tests many cells): each keeps its own 95 % interval, and one whose
    interval excludes zero but that Holm does not reject is no longer `clear`."""
    if not diffs:
        return []
    rejected = holm([d.p for d in diffs])
    family = sum(1 for d in diffs if d.decidable)
    return [replace(d, family=family, holm=bool(keep)) if d.decidable else d
            for d, keep in zip(diffs, rejected)]


def within_spread(values: list[float], halfwidths: list[float]) -> bool:
    """True when one value lies inside every point's 95 % interval (all intervals share a point).

    False when any interval is unknown (a single repeat): a flat reading cannot then be claimed.
    """
    pairs = [(v, h) for v, h in zip(values, halfwidths) if not math.isnan(v)]
    if not pairs or any(math.isnan(h) for _, h in pairs):
        return False
    return max(v - h for v, h in pairs) <= min(v + h for v, h in pairs)
