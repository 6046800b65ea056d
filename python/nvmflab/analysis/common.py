"""Selections and comparisons that several study analyses share."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from .stats import diff_interval, usable, usable_mask


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


def differs(a_mean: float, a_ci: float, b_mean: float, b_ci: float) -> bool | None:
    """True when the 95 % intervals do not overlap; None when either interval is unknown."""
    if any(math.isnan(v) for v in (a_mean, a_ci, b_mean, b_ci)):
        return None
    return abs(a_mean - b_mean) > a_ci + b_ci


def significance_note(a_mean: float, a_ci: float, b_mean: float, b_ci: float) -> str:
    verdict = differs(a_mean, a_ci, b_mean, b_ci)
    if verdict is None:
        return " (a single repeat each, so no confidence interval)"
    if verdict:
        return ""
    return " (within the 95 % confidence intervals of the repeats, so not a clear effect)"


def first(frame: pd.DataFrame, column: str) -> float:
    """The single value of `column` in a one-row selection; NaN when the selection is empty."""
    return float(frame[column].iloc[0]) if len(frame) else math.nan


@dataclass(frozen=True)
class Difference:
    """B minus A for one metric over repeats, with the 95 % interval of that difference (Welch)."""

    diff: float
    half: float  # NaN when either side has fewer than two repeats
    n: int  # the smaller repeat count of the two sides

    @property
    def decidable(self) -> bool:
        return not math.isnan(self.half) and not math.isnan(self.diff)

    @property
    def clear(self) -> bool:
        """True when the interval of the difference excludes zero."""
        return self.decidable and abs(self.diff) > self.half

    def text(self, fmt: Callable[[float], str]) -> str:
        """'+3.10 ± 2.40 µs' (or '+3.10 µs, no interval' with fewer than two repeats)."""
        if math.isnan(self.diff):
            return "n/a"
        sign = "+" if self.diff >= 0 else "−"
        if not self.decidable:
            return f"{sign}{fmt(abs(self.diff))} (no interval: {self.n} repeat(s))"
        return f"{sign}{fmt(abs(self.diff))} ± {fmt(self.half)}"


def compare(a: pd.Series | dict, b: pd.Series | dict, metric: str) -> Difference:
    """Difference b − a of `metric` between two rows of `aggregate()` (its _mean/_std/_n columns)."""
    def get(row, suffix):
        value = row.get(f"{metric}_{suffix}", math.nan) if row is not None else math.nan
        return math.nan if value is None else float(value)

    n_a, n_b = get(a, "n"), get(b, "n")
    diff, half = diff_interval(get(a, "mean"), get(a, "std"), n_a, get(b, "mean"), get(b, "std"), n_b)
    n = int(min(n_a if not math.isnan(n_a) else 0, n_b if not math.isnan(n_b) else 0))
    return Difference(diff, half, n)


def within_spread(values: list[float], halfwidths: list[float]) -> bool:
    """True when one value lies inside every point's 95 % interval (all intervals share a point).

    False when any interval is unknown (a single repeat): a flat reading cannot then be claimed.
    """
    pairs = [(v, h) for v, h in zip(values, halfwidths) if not math.isnan(v)]
    if not pairs or any(math.isnan(h) for _, h in pairs):
        return False
    return max(v - h for v, h in pairs) <= min(v + h for v, h in pairs)
