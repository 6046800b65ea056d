"""Points of a study that failed or broke a sanity invariant, marked on every figure of the study
(issue 37 item 7): a red line under the figure and a caption sentence naming them, since their
aggregates simply lack them and a curve with a hole would otherwise read as complete. Skipped legs
are not failures: the report's headline names them."""

from __future__ import annotations

import math

import pandas as pd

from .. import plots
from .result import StudyResult

SHOWN = 5  # points named in a caption; the report's left-out table lists every row


def failed_rows(excluded: pd.DataFrame | None) -> pd.DataFrame:
    """The excluded rows that failed or were invalid (not the skipped ones)."""
    if excluded is None or excluded.empty or "status" not in excluded:
        return pd.DataFrame()
    return excluded[excluded["status"] != "skipped"]


def _point_text(point: pd.DataFrame) -> str:
    row = point.iloc[0]
    where = f"leg {row['leg']}" if "leg" in point else "a point"
    load = row.get("bg_load_pct")
    if load is not None and not (isinstance(load, float) and math.isnan(load)):
        where += f" at background load {'max' if math.isinf(load) else f'{float(load):g} %'}"
    invalid = row["status"] == "invalid" or (row["status"] == "ok" and pd.notna(row.get("invariant_detail")))
    reason = row.get("invariant_detail") if invalid else row.get("error")
    why = "invalid" if invalid else str(row["status"])
    return f"{where} ({why}" + (f": {reason}" if isinstance(reason, str) and reason else "") + ")"


def points_key(rows: pd.DataFrame) -> list[str]:
    return [c for c in ("run_id", "point_id") if c in rows] or ["leg"]


def sentence(rows: pd.DataFrame) -> str:
    """'n point(s) failed or were invalid and are not drawn: …' naming up to SHOWN of them."""
    points = [group for _, group in rows.groupby(points_key(rows), sort=True, dropna=False)]
    named = "; ".join(_point_text(p) for p in points[:SHOWN])
    more = f"; and {len(points) - SHOWN} more (the left-out table lists them)" if len(points) > SHOWN else ""
    plural = len(points) != 1
    return (f"{len(points)} point{'s' if plural else ''} failed or {'were' if plural else 'was'} invalid and "
            f"{'are' if plural else 'is'} not drawn: {named}{more}.")


def mark_figures(result: StudyResult) -> int:
    """Mark every figure of `result` with its study's failed or invalid points (a line under the
    figure, a sentence in the caption); returns how many points failed."""
    rows = failed_rows(result.excluded)
    if rows.empty:
        return 0
    count = rows.groupby(points_key(rows), dropna=False).ngroups
    text = sentence(rows)
    for figure in result.figures:
        plots.mark_failed(figure.figure, count)
        if text not in figure.caption:
            figure.caption = f"{figure.caption.strip()} {text}".strip()
    return count
