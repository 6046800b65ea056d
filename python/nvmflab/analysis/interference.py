"""The `interference` study: a foreground tenant sharing a core with a capped background (ch. 6).

Legs: `initiator` (shared initiator core), `target` (shared target core), `control` (only the
network shared). Foreground (role `fg`) is the L-app (iodepth 1) or the T-app (deeper queue);
the background (role `bg`) is capped at bg_load_pct % of the resource's saturation point, `inf`
meaning uncapped ("max"). The isolated baseline is the foreground without background: rows of the
leg with bg_load_pct NaN, else the `isolated` leg. Points whose sanity invariant failed are left
out and listed.
"""

from __future__ import annotations

import json
import math

import pandas as pd

from .. import plots
from ..findings_data import Finding
from .common import (Difference, compare, corrected, descriptive, excluded_points, missing_leg, study_rows,
                     within_spread)
from .cores_used import used_text, with_cores
from .decide import fieller_summary, safe_upto
from .formulas import latency_interference, throughput_sustained
from .left_out import failed_rows
from .result import Figure, StudyResult, Table
from .stats import aggregate, collapse_jobs, diff_test, merge_histograms, usable, usable_mask
from .text import kiops, times, us

STUDY = "interference"
LEGS = {"initiator": "shared initiator core", "target": "shared target core",
        "control": "shared network only",
        "control_initiator": "shared network only, background as in the initiator leg",
        "control_target": "shared network only, background as in the target leg"}
# Default guideline thresholds (the study's [params] latency_limit / sustained_limit override them):
# an L-app tolerates p99 up to LATENCY_LIMIT× its isolated value, a T-app wants to keep at least
# SUSTAINED_LIMIT of its isolated throughput.
LATENCY_LIMIT = 2.0
SUSTAINED_LIMIT = 0.9
# A capped point whose background achieved less than this share of what was asked is labelled by
# what it achieved.
UNDERSHOOT = 0.9
MODE_UNKNOWN = "n/a"


def is_control(leg: str) -> bool:
    return leg.startswith("control")


def app_name(iodepth: float) -> str:
    return "L-app" if iodepth == 1 else f"T-app (QD{iodepth:g})"


def load_text(load: float) -> str:
    return "max" if math.isinf(load) else f"{load:g} %"


def load_label(requested: float, achieved: float) -> str:
    """How a point is named: by what the background achieved when that fell short of the request."""
    if math.isnan(achieved):
        return load_text(requested)
    if math.isinf(requested):
        return f"max (reached {achieved:.0f} %)"
    if achieved < requested * UNDERSHOOT:
        return f"{requested:g} % asked, reached {achieved:.0f} %"
    return f"{requested:g} %"


def limits(runs: pd.DataFrame) -> tuple[float, float]:
    """(latency limit ×, sustained limit fraction) from the latest interference run's [params]."""
    lat, sus = LATENCY_LIMIT, SUSTAINED_LIMIT
    if runs is None or runs.empty or "study" not in runs or "env_json" not in runs:
        return lat, sus
    for env in runs.loc[runs["study"] == STUDY, "env_json"]:
        try:
            params = json.loads(env or "{}").get("spec_effective", {}).get("params", {}) or {}
        except (TypeError, ValueError):
            continue
        lat = float(params.get("latency_limit", lat))
        sus = float(params.get("sustained_limit", sus))
    return lat, sus


def with_modes(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` with a `completion` column on every row (a stack that does not record it: "n/a")."""
    if rows.empty:
        return rows
    if "completion" not in rows:
        return rows.assign(completion=MODE_UNKNOWN)
    return rows.assign(completion=rows["completion"].fillna(MODE_UNKNOWN).astype(str))


def _baselines(fg: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """Isolated foreground per (leg, completion, iodepth): same-leg rows without background, else
    `isolated` rows of the same completion mode."""
    same_leg = fg[fg["bg_load_pct"].isna()]
    isolated = with_modes(usable(rows))
    isolated = isolated[(isolated["leg"] == "isolated") & isolated["role"].isin(["fg", "main"])]
    own = aggregate(same_leg, by=["leg", "completion", "iodepth"])
    shared = aggregate(isolated, by=["completion", "iodepth"])
    result = []
    for (leg, mode), group in fg.groupby(["leg", "completion"]):
        for iodepth in group["iodepth"].unique():
            match = own[(own["leg"] == leg) & (own["completion"] == mode) & (own["iodepth"] == iodepth)]
            if match.empty and not shared.empty:
                match = shared[(shared["completion"] == mode) & (shared["iodepth"] == iodepth)].assign(leg=leg)
            result.append(match)
    frames = [f for f in result if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else own.iloc[0:0]


def _background(bg: pd.DataFrame, fg_iodepth: pd.Series) -> pd.DataFrame:
    """Achieved background load in % of saturation, per (leg, completion, fg iodepth, bg_load_pct)."""
    columns = ["leg", "completion", "iodepth", "bg_load_pct", "achieved_pct", "bg_iops", "bg_jobs"]
    if bg.empty:
        return pd.DataFrame(columns=columns)
    bg = bg.assign(requested=pd.to_numeric(bg["rate_iops"], errors="coerce").fillna(0) * bg["numjobs"],
                   jobs=bg["numjobs"])
    # Several background processes of one point add up (the target leg uses two).
    bg = bg.groupby(["run_id", "point_id", "repeat"], as_index=False).agg(
        leg=("leg", "first"), completion=("completion", "first"), bg_load_pct=("bg_load_pct", "first"),
        iops=("iops", "sum"),
        requested=("requested", "sum"), jobs=("jobs", "sum"))
    bg["iodepth"] = bg["point_id"].map(fg_iodepth)
    capped = (bg["requested"] > 0) & ~bg["bg_load_pct"].map(math.isinf)
    # Every capped point implies the saturation IOPS its percentage refers to (each completion
    # mode calibrated its own).
    saturation = (bg["requested"] / (bg["bg_load_pct"] / 100)).where(capped)
    bg["saturation_iops"] = saturation.groupby([bg["leg"], bg["completion"]]).transform("median")
    bg["achieved_pct"] = bg["iops"] / bg["saturation_iops"] * 100
    return bg.groupby(["leg", "completion", "iodepth", "bg_load_pct"], as_index=False).agg(
        achieved_pct=("achieved_pct", "mean"), bg_iops=("iops", "mean"), bg_jobs=("jobs", "max"))


def _curves(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (leg, foreground iodepth, background load) with both interference metrics.

    `load` is the background load the point achieved (% of the resource's saturation point), or the
    requested one where no saturation point is known; curves are ordered by it.
    """
    good = with_modes(usable(rows))
    if good.empty:
        return pd.DataFrame()
    fg = good[(good["role"] == "fg") & good["leg"].isin(list(LEGS))]
    bg = good[(good["role"] == "bg") & good["leg"].isin(list(LEGS))]
    if fg.empty:
        return pd.DataFrame()
    base = _baselines(fg, rows).set_index(["leg", "completion", "iodepth"])
    loaded = aggregate(fg[fg["bg_load_pct"].notna()], by=["leg", "completion", "iodepth", "bg_load_pct"])
    if loaded.empty:
        return pd.DataFrame()
    achieved = _background(bg, fg.drop_duplicates("point_id").set_index("point_id")["iodepth"])
    curves = loaded.merge(achieved, on=["leg", "completion", "iodepth", "bg_load_pct"], how="left")
    records = []
    for _, row in curves.iterrows():
        key = (row["leg"], row["completion"], row["iodepth"])
        iso = base.loc[key] if key in base.index else pd.Series(dtype=float)
        base_p99 = iso.get("lat_p99_ns_mean", math.nan)
        base_iops = iso.get("iops_mean", math.nan)
        got = row["achieved_pct"]
        _, lat_low, lat_high = ratio_interval(iso, row, "lat_p99_ns")
        _, sus_low, sus_high = ratio_interval(iso, row, "iops")
        records.append({
            "leg": row["leg"], "completion": row["completion"], "app": app_name(row["iodepth"]),
            "iodepth": row["iodepth"],
            "bg_load_pct": row["bg_load_pct"], "achieved_pct": got,
            "load": row["bg_load_pct"] if math.isnan(got) else got,
            "load_label": load_label(row["bg_load_pct"], got),
            "bg_iops": row.get("bg_iops", math.nan), "bg_jobs": row.get("bg_jobs", math.nan),
            "p99_ns": row["lat_p99_ns_mean"], "iops": row["iops_mean"],
            "isolated_p99_ns": base_p99, "isolated_iops": base_iops,
            "latency_interference": latency_interference(row["lat_p99_ns_mean"], base_p99),
            "latency_interference_ci95": latency_interference(row["lat_p99_ns_ci95"], base_p99),
            "throughput_sustained": throughput_sustained(row["iops_mean"], base_iops),
            "throughput_sustained_ci95": throughput_sustained(row["iops_ci95"], base_iops),
            "latency_interference_low": lat_low, "latency_interference_high": lat_high,
            "throughput_sustained_low": sus_low, "throughput_sustained_high": sus_high,
            "repeats": row["iops_n"],
            "p99_diff": compare(iso, row, "lat_p99_ns"), "iops_diff": compare(iso, row, "iops"),
        })
    return pd.DataFrame(records).sort_values(["leg", "completion", "iodepth", "load"])


def ratio_interval(iso, row, metric: str) -> tuple[float, float, float]:
    """(ratio, low, high): loaded / isolated mean of `metric` from two aggregate() rows, with
    Fieller's 95 % interval, which includes the isolated baseline's variance (decide.fieller_summary).
    NaN bounds where either side has fewer than two repeats or no spread."""
    def get(r, suffix):
        value = r.get(f"{metric}_{suffix}", math.nan) if r is not None else math.nan
        return math.nan if value is None else float(value)

    ratio, low, high = fieller_summary(get(iso, "mean"), get(iso, "std"), get(iso, "n"),
                                       get(row, "mean"), get(row, "std"), get(row, "n"))
    return float(ratio), float(low), float(high)


def _span(low: float, high: float, fmt) -> str:
    """'1.52–1.61' for an interval, 'unbounded' when it is, 'no interval' when there is none."""
    if math.isnan(low) or math.isnan(high):
        return "no interval"
    if math.isinf(low) or math.isinf(high):
        return "unbounded"
    return f"{fmt(low)}–{fmt(high)}"


def highest_safe_load(curve: pd.DataFrame, metric: str, limit: float, higher_is_worse: bool) -> float | None:
    """Highest achieved load up to which `metric` is on the safe side of `limit` at every load
    (below it when higher is worse, at least it otherwise); None if the first load fails.

    `decide.safe_upto` decides, the rule the A/A check measures. Loads are those the background
    achieved (`load`), so a guideline never names a load the background did not reach. The
    guideline passes the interval's bound as `metric` (`latency_interference_high`,
    `throughput_sustained_low`): a load is safe only when its whole 95 % interval is on the good
    side of the limit, and a load without an interval is not safe. Each load is one one-sided test
    at 2.5 %; requiring every load up to the guideline to pass is an intersection-union test, so
    the family needs no further correction.
    """
    column = "load" if "load" in curve else "bg_load_pct"
    ordered = curve[~curve[column].map(math.isinf)].sort_values(column)
    if ordered.empty:
        return None
    last = int(safe_upto(ordered[metric].astype(float).to_numpy(), limit, higher_is_worse))
    return None if last < 0 else float(ordered[column].iloc[last])


def largest_jump(curve: pd.DataFrame, metric: str) -> dict | None:
    """The largest change of `metric` between consecutive achieved loads (the knee read by eye).

    For latency interference the change is the ratio of consecutive values, for throughput
    sustained the drop in points; None with fewer than two loads.
    """
    ordered = curve.dropna(subset=[metric]).sort_values("load")
    ordered = ordered[~ordered["load"].map(math.isinf)]
    best = None
    for (_, lo), (_, hi) in zip(ordered.iterrows(), list(ordered.iterrows())[1:]):
        if metric == "latency_interference":
            size = hi[metric] / lo[metric] if lo[metric] > 0 else math.nan
        else:
            size = lo[metric] - hi[metric]
        if not math.isnan(size) and (best is None or size > best["size"]):
            halves = [lo.get(f"{metric}_ci95", math.nan), hi.get(f"{metric}_ci95", math.nan)]
            # no interval (one repeat, or repeats without spread): the jump cannot be told from noise
            judged = all(not math.isnan(h) and h > 0 for h in halves)
            best = {"size": size, "from_load": lo["load"], "to_load": hi["load"],
                    "from": lo[metric], "to": hi[metric],
                    "noise": within_spread([lo[metric], hi[metric]], halves) if judged else None}
    return best


def _jump_text(jump: dict | None, metric: str) -> str:
    if jump is None:
        return "n/a (fewer than two loads)"
    fmt = (lambda v: f"{v:.2f}×") if metric == "latency_interference" else (lambda v: f"{v * 100:.0f} %")
    return (f"{fmt(jump['from'])} → {fmt(jump['to'])} between {jump['from_load']:.0f} % and "
            f"{jump['to_load']:.0f} % achieved load"
            + (" (within the repeats' spread: no knee)" if jump.get("noise")
               else " (no interval at one of the two loads, so not judged)" if jump.get("noise") is None else ""))


def _describe(curve: pd.DataFrame, metric: str, unit: str) -> str:
    values = curve[metric].dropna()
    if values.empty:
        return "could not be computed (no isolated baseline or no loaded points)"
    low, high = curve.loc[values.idxmin()], curve.loc[values.idxmax()]
    fmt = (lambda v: f"{v:.2f}×") if unit == "×" else (lambda v: f"{v * 100:.0f} %")
    rows = curve.dropna(subset=[metric])
    # "Stayed near" only when one value lies within every load's 95 % interval.
    if len(rows) > 1 and within_spread(rows[metric].tolist(), rows[f"{metric}_ci95"].tolist()):
        return (f"stayed near {fmt(values.mean())} at every load ({fmt(values.min())}–{fmt(values.max())}, "
                "within the repeats' 95 % intervals)")
    first, last = rows.iloc[0], rows.iloc[-1]
    return (f"went from {fmt(first[metric])} at {first['load_label']} to "
            f"{fmt(last[metric])} at {last['load_label']} background load "
            f"(lowest {fmt(low[metric])}, highest {fmt(high[metric])})")


def _control(curve: pd.DataFrame, what: str, app: str) -> str:
    """The control's verdict from the interval of the difference, claiming only what it measured."""
    row = curve.iloc[-1]
    jobs = "" if math.isnan(row["bg_jobs"]) else f"{row['bg_jobs']:g} job(s), "
    bg = f"a background of {jobs}{kiops(row['bg_iops'])} uncapped" if not math.isnan(row["bg_iops"]) else \
        "an uncapped background"
    p99, iops = corrected([row["p99_diff"], row["iops_diff"]])  # one family: Holm over p99 and IOPS
    head = (f"Control ({what}), {app}: with {bg}, latency interference {times(row['latency_interference'])}, "
            f"throughput sustained {row['throughput_sustained'] * 100:.0f} % "
            f"(p99 difference {p99.text(lambda v: f'{v / 1e3:.2f} µs')}, IOPS difference "
            f"{iops.text(lambda v: f'{v / 1e3:.2f} K')})")
    if not p99.decidable or not iops.decidable:
        return head + " — fewer than two repeats (or repeats without spread), so no interval: the control cannot judge."
    worse = [name for name, d, bad in (("p99", p99, p99.diff > 0), ("IOPS", iops, iops.diff < 0))
             if d.clear and bad]
    if worse:
        return (head + f" — a measurable change in {' and '.join(worse)}: sharing only the network and "
                "the remaining common parts interferes by this much in this run, and the other legs "
                "include it.")
    return (head + " — no measurable change (both intervals of the difference include zero) at this "
            "background; loads other than this one were not tested.")


# Above this share of the calibrated saturation point, the background did clearly more than the
# point it was scaled to (repeat noise is a few %): that point was not the resource's limit.
BEYOND_REFERENCE_PCT = 105.0


def reached_text(achieved: float) -> str:
    """The tail of a finding saying how far the background got, and that the reference was not the
    limit when it got clearly past 100 % of it."""
    if math.isnan(achieved):
        return ""
    text = f"; the background reached at most {achieved:.0f} % of the resource's saturation point"
    if achieved > BEYOND_REFERENCE_PCT:
        text += (" as calibrated, so that reference was not the resource's limit (the background alone "
                 "did more): loads in % of it overstate how close to the limit these points ran")
    return text


def unintended_sharing(rows: pd.DataFrame, leg: str) -> str:
    """The cores the leg's points used when any of them mapped processes meant for different cores
    onto one (`fg_bg_shared_core`); "" when none did."""
    if "fg_bg_shared_core" not in rows or "leg" not in rows:
        return ""
    mine = rows[(rows["leg"] == leg) & rows["fg_bg_shared_core"].map(lambda v: v is True or v == 1)]
    if mine.empty:
        return ""
    return used_text(with_cores(mine.drop_duplicates("point_key") if "point_key" in mine else mine)) or "cores"


def _findings(curves: pd.DataFrame, rows: pd.DataFrame, out: StudyResult,
              guidelines: list[dict], lat_limit: float, sus_limit: float) -> None:
    for leg, what in LEGS.items():
        leg_curves = curves[curves["leg"] == leg] if not curves.empty else curves
        if leg_curves.empty:
            if leg in ("initiator", "target") or (leg == "control" and not any(
                    curves["leg"].map(is_control)) if not curves.empty else leg == "control"):
                out.findings.append(missing_leg(rows, leg, f"interference on the {what} is unknown"))
            continue
        several = curves["completion"].nunique() > 1
        for (mode, app), curve in leg_curves.groupby(["completion", "app"], sort=False):
            what = f"{LEGS[leg]}, completion {mode}" if several else LEGS[leg]
            achieved_text = reached_text(curve["achieved_pct"].max())
            if is_control(leg):
                if math.isnan(curve["latency_interference"].max()) or math.isnan(curve["throughput_sustained"].min()):
                    out.findings.append(f"Control ({what}), {app}: interference could not be computed (no "
                                        "isolated foreground measurement), so the control proves nothing.")
                    continue
                out.findings.append(_control(curve, what, app))
                continue
            base = curve.iloc[0]
            if app == "L-app":
                metric, limit_value, worse_up = "latency_interference", lat_limit, True
                out.findings.append(descriptive(
                    f"{what.capitalize()}, {app} (isolated p99 {us(base['isolated_p99_ns'])}): "
                    f"latency interference {_describe(curve, metric, '×')}{achieved_text}."))
                rule = f"p99 below {lat_limit:g}× isolated"
            else:
                metric, limit_value, worse_up = "throughput_sustained", sus_limit, False
                out.findings.append(descriptive(
                    f"{what.capitalize()}, {app} (isolated {kiops(base['isolated_iops'])}): "
                    f"throughput sustained {_describe(curve, metric, '%')}{achieved_text}."))
                rule = f"throughput sustained at least {sus_limit * 100:g} %"
            bound = "latency_interference_high" if metric == "latency_interference" else "throughput_sustained_low"
            safe = highest_safe_load(curve, bound, limit_value, worse_up)
            by_mean = highest_safe_load(curve, metric, limit_value, worse_up)
            jump = largest_jump(curve, metric)
            reached = curve["load"][~curve["load"].map(math.isinf)].max()
            measured_all = safe is not None and not math.isnan(reached) and safe >= reached
            limit = f"{safe:.0f} %" if safe is not None else "none"
            capped = curve[~curve["load"].map(math.isinf)].sort_values("load")
            no_interval = not capped.empty and math.isnan(capped.iloc[0][bound])
            guidelines.append({"resource": LEGS[leg], "completion": mode, "application": app, "criterion": rule,
                               "keep background load at or below": limit,
                               "by the means alone": f"{by_mean:.0f} %" if by_mean is not None else "none",
                               "highest load reached": "n/a" if math.isnan(reached) else f"{reached:.0f} %",
                               "largest jump": _jump_text(jump, metric)})
            lowest = curve.iloc[0]["load_label"]
            wrapped = unintended_sharing(rows, leg)
            if wrapped:  # issue 22 item 8: a guideline about one shared resource needs the rest apart
                guidelines[-1]["keep background load at or below"] = "not given (unintended sharing)"
                out.findings.append(f"Guideline ({what}, {app}): not given: on this machine processes meant for "
                                    f"different cores shared one ({wrapped}), so these points measure more "
                                    f"sharing than the {LEGS[leg]} alone.")
            elif safe is None and no_interval:
                out.findings.append(f"Guideline ({what}, {app}): no load can be called safe ({rule}): the lowest "
                                    f"background load tried ({lowest}) has no 95 % interval of its ratio (fewer "
                                    "than two repeats, or repeats without spread)"
                                    + (f"; by the means alone it would be {by_mean:.0f} %" if by_mean is not None
                                       else "") + ".")
            elif safe is None:
                # decided by the lowest load's Fieller interval lying beyond the limit
                out.findings.append(Finding(f"Guideline ({what}, {app}): even the lowest background load "
                                            f"tried ({lowest}) broke the limit ({rule}: its 95 % interval of the "
                                            "ratio is beyond it); do not share this resource with a background "
                                            "tenant.", STUDY, decided=True))
            else:
                beyond = (f"; the background reached no more than {reached:.0f} %, so nothing is known "
                          "about higher loads" if measured_all else "")
                # decided: every load up to it has its whole Fieller interval on the safe side
                out.findings.append(Finding(f"Guideline ({what}, {app}): keep the achieved background load at or "
                                            f"below {limit} to keep {rule} (the whole 95 % interval of the ratio, "
                                            f"isolated baseline's variance included){beyond}.", STUDY, decided=True))
            if jump is not None:
                out.findings.append(descriptive(f"Largest jump ({what}, {app}): {_jump_text(jump, metric)}."))


# -- the thesis's polling hypothesis (§6.3) --------------------------------------------------------
# The thesis measured, with fio polling for completions (hipri), a flat ~38× L-app latency
# interference and 49 % T-app throughput on a shared initiator core, and wrote that this "may result
# from the polling by the Fio process" without testing it. With both completion modes measured, the
# interval of poll − event per background load tests it.
THESIS_CLAIM = ("the thesis's hypothesis (§6.3) that its flat ~38× initiator latency interference and "
                "49 % T-app throughput came from the load generator polling for completions")


def _per_repeat(rows: pd.DataFrame) -> pd.DataFrame:
    """Interference metrics per repeat: each loaded foreground repeat over its leg's isolated
    foreground (the same repeat round when measured, else the mean of the isolated repeats)."""
    good = with_modes(usable(rows))
    if good.empty:
        return pd.DataFrame()
    fg = collapse_jobs(good[(good["role"] == "fg") & good["leg"].isin(list(LEGS))])
    if fg.empty:
        return pd.DataFrame()
    keys = ["leg", "completion", "iodepth"]
    iso = fg[fg["bg_load_pct"].isna()]
    iso_repeat = iso.groupby(keys + ["repeat"])[["lat_p99_ns", "iops"]].mean()
    iso_mean = iso.groupby(keys)[["lat_p99_ns", "iops"]].mean()
    records = []
    for _, row in fg[fg["bg_load_pct"].notna()].iterrows():
        key = tuple(row[k] for k in keys)
        if key + (row["repeat"],) in iso_repeat.index:
            base = iso_repeat.loc[key + (row["repeat"],)]
        elif key in iso_mean.index:
            base = iso_mean.loc[key]
        else:
            continue
        records.append({**{k: row[k] for k in keys}, "bg_load_pct": row["bg_load_pct"], "repeat": row["repeat"],
                        "latency_interference": latency_interference(row["lat_p99_ns"], base["lat_p99_ns"]),
                        "throughput_sustained": throughput_sustained(row["iops"], base["iops"])})
    return pd.DataFrame(records)


def _summary(values: pd.Series) -> tuple[float, float, int]:
    values = pd.to_numeric(values, errors="coerce").dropna()
    n = len(values)
    return (float(values.mean()) if n else math.nan, float(values.std(ddof=1)) if n > 1 else math.nan, n)


def mode_difference(samples: pd.DataFrame, metric: str) -> Difference:
    """poll − event of `metric` over repeats (Welch's 95 % interval of the difference)."""
    event = pd.to_numeric(samples.loc[samples["completion"] == "event", metric], errors="coerce").dropna()
    poll = pd.to_numeric(samples.loc[samples["completion"] == "poll", metric], errors="coerce").dropna()
    ev, po = _summary(event), _summary(poll)
    diff, half, p = diff_test(ev[0], ev[1], ev[2], po[0], po[1], po[2])
    # the metric and both sides' repeats, for findings as data (findings_data.evidence)
    return Difference(diff, half, min(ev[2], po[2]), p,
                      source={"metric": metric, "a": event.tolist(), "b": poll.tolist()})


def polling_hypothesis(rows: pd.DataFrame, curves: pd.DataFrame, leg: str = "initiator") -> tuple[str, pd.DataFrame]:
    """(verdict, per-load table) on the thesis's polling hypothesis for `leg`.

    The verdict's first word is one of: "supported" (polling clearly worse at some load, clearly
    better at none), "contradicted" (clearly better with polling at some load, clearly worse at
    none), "mixed", "no clear difference" (every interval includes zero), "undecided" (fewer than
    two repeats per mode), "untested" (one completion mode measured).
    """
    mine = curves[curves["leg"] == leg] if not curves.empty else curves
    measured = sorted(set(mine["completion"])) if not mine.empty else []
    if mine.empty:
        return "", pd.DataFrame()
    if not {"event", "poll"} <= set(measured):
        return (f"untested: the {LEGS[leg]} leg ran with completion {', '.join(measured)} only, so "
                f"{THESIS_CLAIM} cannot be tested here (run with [params] completion = [\"event\", \"poll\"])",
                pd.DataFrame())
    samples = _per_repeat(rows)
    samples = samples[samples["leg"] == leg] if not samples.empty else samples
    table, worse, better, undecided, clear_rows = [], 0, 0, 0, 0
    cells = []
    for (app, load), cell in mine.groupby(["app", "bg_load_pct"], sort=True):
        if set(cell["completion"]) < {"event", "poll"}:
            continue
        metric = "latency_interference" if app == "L-app" else "throughput_sustained"
        iodepth = cell["iodepth"].iloc[0]
        sel = samples[(samples["iodepth"] == iodepth) & (samples["bg_load_pct"] == load)] if not samples.empty \
            else samples
        d = mode_difference(sel, metric) if not sel.empty else Difference(math.nan, math.nan, 0)
        cells.append((app, load, cell, metric, d))
    # Every (application, load) cell is one test of the same hypothesis: Holm over the cells.
    fixed = corrected([d for *_, d in cells])
    for (app, load, cell, metric, _), d in zip(cells, fixed):
        by_mode = cell.set_index("completion")
        bad = d.diff > 0 if metric == "latency_interference" else d.diff < 0
        if not d.decidable:
            verdict = "cannot decide (fewer than two repeats per mode, or no spread)"
            undecided += 1
        elif d.clear:
            clear_rows += 1
            worse, better = worse + bool(bad), better + (not bad)
            verdict = "worse with poll" if bad else "better with poll"
        else:
            verdict = "no clear difference"
        fmt = (lambda v: f"{v:.2f}×") if metric == "latency_interference" else (lambda v: f"{v * 100:.1f} %")
        table.append({
            "app": app, "metric": metric.replace("_", " "), "requested bg load": load_text(load),
            "achieved (event / poll)": " / ".join(
                "n/a" if math.isnan(by_mode.at[m, "achieved_pct"]) else f"{by_mode.at[m, 'achieved_pct']:.0f} %"
                for m in ("event", "poll")),
            "event": fmt(by_mode.at["event", metric]), "poll": fmt(by_mode.at["poll", metric]),
            "poll − event (95 % interval)": d.text(fmt) if metric == "latency_interference"
            else d.text(lambda v: f"{v * 100:.1f} pt"),
            "repeats": d.n, "verdict": verdict})
    frame = pd.DataFrame(table)
    if frame.empty:
        return "", frame
    tested = len(frame)
    l_app = mine[mine["app"] == "L-app"]
    level = ""
    if not l_app.empty:
        level = ("; L-app latency interference ranged " + ", ".join(
            f"{l_app.loc[l_app['completion'] == m, 'latency_interference'].min():.2f}–"
            f"{l_app.loc[l_app['completion'] == m, 'latency_interference'].max():.2f}× with completion {m}"
            for m in ("event", "poll")) + " (the thesis: ~38×)")
    if undecided == tested:
        return (f"undecided: {THESIS_CLAIM} cannot be judged from this run: fewer than two repeats (or none with spread) per "
                f"completion mode, so no interval of poll − event{level}.", frame)
    if worse and not better:
        return (f"supported: {THESIS_CLAIM} is supported by this run: with polling, interference was "
                f"clearly worse at {worse} of {tested} (application, load) points (the 95 % interval of "
                f"poll − event excludes zero, Holm-corrected over the points) and clearly better at none{level}.", frame)
    if better and not worse:
        return (f"contradicted: {THESIS_CLAIM} is contradicted by this run: interference was clearly "
                f"lower with polling at {better} of {tested} (application, load) points and clearly "
                f"higher at none{level}.", frame)
    if worse and better:
        return (f"mixed: on {THESIS_CLAIM} this run is mixed: polling was clearly worse at {worse} and "
                f"clearly better at {better} of {tested} (application, load) points{level}.", frame)
    return (f"no clear difference: {THESIS_CLAIM} is neither supported nor contradicted by this run: at "
            f"every one of the {tested - undecided} (application, load) points with an interval, the 95 % "
            "interval of poll − event includes zero (no clear difference; more repeats narrow it)"
            + (f" ({undecided} point(s) had fewer than two repeats)" if undecided else "") + f"{level}.", frame)


ACHIEVED_LABEL = "Achieved background load (% of the resource's saturation point)"


def _figures(curves: pd.DataFrame, rows: pd.DataFrame, out: StudyResult, lat_limit: float,
             sus_limit: float) -> None:
    # The x-axis is the load the background achieved, not the one asked for.
    curves = curves.assign(bg_load_pct=curves["load"].map(lambda v: v if math.isinf(v) else round(v, 1)))
    several = curves["completion"].nunique() > 1
    legs = curves["leg"].map(LEGS) + (", completion " + curves["completion"] if several else "")
    curves = curves.assign(leg_series=legs)
    lat = curves[(curves["app"] == "L-app")]
    tput = curves[(curves["app"] != "L-app")]
    if tput.empty:  # no T-app measured (the quick variant): the L-app's throughput is still the foreground's
        tput = curves
    tput_app = "L-app" if (tput["app"] == "L-app").all() else "T-app"
    failed = failed_rows(rows[~usable_mask(rows)] if len(rows) else rows)  # marked on the load axis
    lapp_failed = (failed["iodepth"] == 1) if "iodepth" in failed else pd.Series(True, index=failed.index)

    def failed_loads(mask: pd.Series) -> list[float]:
        return [] if failed.empty or "bg_load_pct" not in failed else failed.loc[mask, "bg_load_pct"].dropna().tolist()

    if not lat.empty:
        out.figures.append(Figure("interference_latency_vs_load", plots.vs_load(
            lat.assign(series=lat["leg_series"]), "latency_interference", series="series",
            title="L-app latency interference vs background load (p99 loaded / p99 isolated)",
            ylabel="Latency interference (×, higher is worse)", reference=1.0,
            threshold=lat_limit, threshold_label=f"guideline limit {lat_limit:g}×",
            failed_loads=failed_loads(lapp_failed)),
            "p99 of the 4 KiB QD1 foreground divided by its isolated p99, per achieved background load "
            "and shared resource (thesis figs. 6.1 and 6.3)."))
        out.figures[-1].figure.axes[0].set_xlabel(ACHIEVED_LABEL)
    out.figures.append(Figure("interference_throughput_vs_load", plots.vs_load(
        tput.assign(series=tput["leg_series"] + ", " + tput["app"]),
        "throughput_sustained", series="series", scale=100,
        title=f"{tput_app} throughput sustained vs background load (IOPS loaded / IOPS isolated)",
        ylabel="Throughput sustained (%, lower is worse)", reference=1.0,
        threshold=sus_limit, threshold_label=f"guideline limit {sus_limit * 100:g} %",
        failed_loads=failed_loads(lapp_failed if tput_app == "L-app" else ~lapp_failed)),
        f"Foreground {tput_app} IOPS as a share of its isolated IOPS, per achieved background load and "
        "shared resource (thesis figs. 6.2 and 6.4 show it for the T-app)."))
    out.figures[-1].figure.axes[0].set_xlabel(ACHIEVED_LABEL)
    good = usable(rows)
    good = with_modes(good)
    target_l = good[(good["leg"] == "target") & (good["role"] == "fg") & (good["iodepth"] == 1)]
    if not target_l.empty:
        histograms = {("isolated" if math.isnan(load) else f"background {load_text(load)}")
                      + (f", completion {mode}" if several else ""):
                      merge_histograms(group["histogram_json"])
                      for (mode, load), group in target_l.groupby(["completion", "bg_load_pct"], dropna=False)}
        out.figures.append(Figure("interference_target_latency_cdf", plots.latency_cdf(
            histograms, "L-app latency CDF with a shared target core, per background load"),
            "Completion latency distribution of the foreground over all repeats; the dotted line "
            "is the 99th percentile."))


def analyze(measurements: pd.DataFrame, runs: pd.DataFrame) -> StudyResult:
    rows = study_rows(measurements, STUDY)
    out = StudyResult(STUDY, "Interference on a shared initiator core and a shared target core")
    out.excluded = excluded_points(rows)
    if rows.empty:
        out.findings.append("The interference study has no measurements.")
        return out
    invalid = rows[rows["invariant_ok"].map(lambda v: v is False or v == 0)
                   & rows["invariant_ok"].notna()] if "invariant_ok" in rows else rows.iloc[0:0]
    if not invalid.empty:
        example = invalid["invariant_detail"].dropna()
        out.findings.append(
            f"{invalid['point_id'].nunique()} point(s) broke a sanity invariant and were left out "
            f"(legs: {', '.join(sorted(invalid['leg'].unique()))})"
            + (f", e.g. {example.iloc[0]}" if len(example) else "") + ".")
    if "fg_bg_shared_core" in rows and rows["fg_bg_shared_core"].fillna(False).astype(bool).any():
        out.findings.append("Some points mapped processes meant for different cores onto one "
                            "core (too few cores on this machine); their interference includes "
                            "that extra sharing.")
    curves = _curves(rows)
    guidelines: list[dict] = []
    lat_limit, sus_limit = limits(runs)
    _findings(curves, rows, out, guidelines, lat_limit, sus_limit)
    if curves.empty:
        return out
    table = curves.assign(**{
        "bg load": curves["load_label"],
        "requested bg load": curves["bg_load_pct"].map(load_text),
        "achieved bg load (%)": curves["achieved_pct"].round(1),
        "fg p99 (µs)": (curves["p99_ns"] / 1e3).round(2),
        "latency interference (×)": curves["latency_interference"].round(2),
        "95 % interval (×)": [_span(lo, hi, lambda v: f"{v:.2f}") for lo, hi in
                              zip(curves["latency_interference_low"], curves["latency_interference_high"])],
        "fg KIOPS": (curves["iops"] / 1e3).round(2),
        "throughput sustained (%)": (curves["throughput_sustained"] * 100).round(1),
        "95 % interval (%)": [_span(lo, hi, lambda v: f"{100 * v:.1f}") for lo, hi in
                              zip(curves["throughput_sustained_low"], curves["throughput_sustained_high"])],
    })[["leg", "completion", "app", "bg load", "requested bg load", "achieved bg load (%)", "fg p99 (µs)",
        "latency interference (×)", "95 % interval (×)", "fg KIOPS", "throughput sustained (%)",
        "95 % interval (%)", "repeats"]]
    out.tables.append(Table("Interference per background load", table,
                            "latency interference = p99(with load) / p99(isolated); throughput "
                            "sustained = IOPS(with load) / IOPS(isolated); the intervals are Fieller's "
                            "95 % intervals of those ratios, the isolated baseline's variance included "
                            "(what the guideline is judged on); 'max' = uncapped "
                            "background; rows are ordered by the load the background achieved, and a "
                            f"point that achieved under {UNDERSHOOT * 100:.0f} % of its request is named "
                            "by what it reached."))
    verdict, hypothesis = polling_hypothesis(rows, curves)
    if verdict:
        text = verdict.split(": ", 1)[1]
        sentence = (f"Polling hypothesis ({verdict.split(':')[0]}): {text[0].upper()}{text[1:]}"
                    + ("" if text.endswith(".") else "."))
        out.findings.append(descriptive(sentence) if verdict.startswith("untested") else sentence)
    if not hypothesis.empty:
        out.tables.append(Table("Initiator interference: completion poll vs event", hypothesis,
                                "Per application and requested background load (each mode capped at "
                                "its own calibrated saturation point): the interference metric under each "
                                "host completion mode and poll − event with Welch's 95 % interval over "
                                "repeats; latency interference per repeat is that repeat's p99 over the "
                                "isolated p99 of the same round. 'worse with poll' means more latency "
                                "interference or less throughput sustained with polling."))
    _figures(curves, rows, out, lat_limit, sus_limit)
    if guidelines:
        out.recommendations = pd.DataFrame(guidelines)
    return out
