"""Which configurations stayed noisy: the report's note on `repeats = "auto"` runs.

With `repeats = "auto"` the harness repeats a configuration until the 95 % t interval of its main
metric (IOPS of the `main`/`fg` role; p99 latency for an L-app, the metric its decisions use) is within `ci_within_pct` of the
mean, or `max_repeats` is reached. The configurations that reached the cap still unstable are named
in a finding, computed from the stored measurements and the run's spec text, so a report written
later (`nvmflab report`) says the same as the run's console did.
"""

from __future__ import annotations

import json
import tomllib

import pandas as pd

from .stats import collapse_jobs, relative_ci95, usable

DEFAULT_MAX_REPEATS = 10
DEFAULT_WITHIN_PCT = 5.0


def main_metric(knobs: dict) -> str:
    """p99 latency for an L-app (its decisions are taken on p99), IOPS for everything else."""
    return "lat_p99_ns" if knobs.get("app") == "L-app" else "iops"


def auto_settings(runs: pd.DataFrame, study: str) -> tuple[int, float] | None:
    """(max_repeats, ci_within_pct) of the study's latest run when its spec repeats "auto", else None."""
    if runs is None or runs.empty or "spec_toml" not in runs:
        return None
    mine = runs[runs["study"] == study]
    if mine.empty:
        return None
    text = mine.sort_values("run_id")["spec_toml"].iloc[-1]
    try:
        raw = tomllib.loads(text if isinstance(text, str) else "")
    except tomllib.TOMLDecodeError:
        return None
    if raw.get("repeats", "auto") != "auto":
        return None
    return int(raw.get("max_repeats", DEFAULT_MAX_REPEATS)), float(raw.get("ci_within_pct", DEFAULT_WITHIN_PCT))


def spread(rows: pd.DataFrame) -> pd.DataFrame:
    """Per configuration (leg and knobs): repeats, the main metric and its relative 95 % interval."""
    out = []
    rows = usable(rows)
    if rows.empty:
        return pd.DataFrame(columns=["leg", "knobs_json", "metric", "repeats", "rel_ci95"])
    for (leg, knobs_json), group in rows.groupby(["leg", "knobs_json"], sort=False):
        roles = set(group["role"])
        role = "main" if "main" in roles else "fg" if "fg" in roles else None
        if role is None:
            continue
        knobs = json.loads(knobs_json)
        metric = main_metric(knobs)
        values = pd.to_numeric(collapse_jobs(group[group["role"] == role])[metric], errors="coerce").dropna()
        out.append({"leg": leg, "knobs_json": knobs_json, "metric": metric, "repeats": len(values),
                    "rel_ci95": relative_ci95(values.tolist())})
    return pd.DataFrame(out)


def _label(knobs_json: str) -> str:
    knobs = json.loads(knobs_json)
    shown = ("app", "rw", "bs", "iodepth", "numjobs", "completion", "target_mode", "idle_poll_us", "io_queues",
             "bg_load_pct", "target_cores")
    return " ".join(f"{k}={knobs[k]}" for k in shown if knobs.get(k) is not None)


def capped_finding(rows: pd.DataFrame, runs: pd.DataFrame, study: str) -> str | None:
    """One sentence naming the configurations that hit max_repeats still unstable; None when none did
    or the study's spec did not repeat automatically."""
    settings = auto_settings(runs, study)
    if settings is None or rows.empty:
        return None
    cap, within = settings
    table = spread(rows)
    if table.empty:
        return None
    hit = table[(table["repeats"] >= cap) & (table["rel_ci95"] > within / 100)]
    if hit.empty:
        return None
    names = "; ".join(
        f"{r.leg} {_label(r.knobs_json)} ({'p99 latency' if r.metric == 'lat_p99_ns' else 'IOPS'} "
        f"±{r.rel_ci95 * 100:.1f} % after {r.repeats} repeats)" for r in hit.itertuples())
    return (f"Not stable: {len(hit)} configuration(s) reached max_repeats ({cap}) with the 95 % interval of "
            f"their main metric still wider than {within:g} % of the mean — read their comparisons with that "
            f"noise in mind: {names}.")


def stability_note(measurements: pd.DataFrame, runs: pd.DataFrame, study: str) -> str | None:
    """capped_finding over one study's rows (the report's hook)."""
    if measurements.empty or "study" not in measurements:
        return None
    return capped_finding(measurements[measurements["study"] == study], runs, study)
