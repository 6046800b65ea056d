"""Selections and comparisons that several study analyses share."""

from __future__ import annotations

import math

import pandas as pd

from .stats import usable, usable_mask


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
