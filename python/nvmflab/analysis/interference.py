"""The `interference` study: a foreground tenant sharing a core with a capped background (ch. 6).

Legs: `initiator` (shared initiator core), `target` (shared target core), `control` (only the
network shared). Foreground (role `fg`) is the L-app (iodepth 1) or the T-app (deeper queue);
the background (role `bg`) is capped at bg_load_pct % of the resource's saturation point, `inf`
meaning uncapped ("max"). The isolated baseline is the foreground without background: rows of the
leg with bg_load_pct NaN, else the `isolated` leg. Points whose sanity invariant failed are left
out and listed.
"""

from __future__ import annotations

import math

import pandas as pd

from .. import plots
from .common import excluded_points, missing_leg, study_rows
from .formulas import latency_interference, throughput_sustained
from .result import Figure, StudyResult, Table
from .stats import aggregate, merge_histograms, usable
from .text import kiops, us

STUDY = "interference"
LEGS = {"initiator": "shared initiator core", "target": "shared target core",
        "control": "shared network only"}
# Guideline thresholds: an L-app tolerates p99 up to LATENCY_LIMIT× its isolated value, a T-app
# wants to keep at least SUSTAINED_LIMIT of its isolated throughput.
LATENCY_LIMIT = 2.0
SUSTAINED_LIMIT = 0.9
# The control experiment passes when interference stays within this margin of 1.
CONTROL_MARGIN = 0.10


def app_name(iodepth: float) -> str:
    return "L-app" if iodepth == 1 else f"T-app (QD{iodepth:g})"


def load_text(load: float) -> str:
    return "max" if math.isinf(load) else f"{load:g} %"


def _baselines(fg: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """Isolated foreground per (leg, iodepth): same-leg rows without background, else `isolated`."""
    same_leg = fg[fg["bg_load_pct"].isna()]
    isolated = usable(rows)
    isolated = isolated[(isolated["leg"] == "isolated") & isolated["role"].isin(["fg", "main"])]
    own = aggregate(same_leg, by=["leg", "iodepth"])
    shared = aggregate(isolated, by=["iodepth"])
    result = []
    for leg in fg["leg"].unique():
        for iodepth in fg.loc[fg["leg"] == leg, "iodepth"].unique():
            match = own[(own["leg"] == leg) & (own["iodepth"] == iodepth)]
            if match.empty:
                match = shared[shared["iodepth"] == iodepth].assign(leg=leg)
            result.append(match)
    frames = [f for f in result if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else own.iloc[0:0]


def _background(bg: pd.DataFrame, fg_iodepth: pd.Series) -> pd.DataFrame:
    """Achieved background load in % of saturation, per (leg, fg iodepth, bg_load_pct)."""
    if bg.empty:
        return pd.DataFrame(columns=["leg", "iodepth", "bg_load_pct", "achieved_pct"])
    bg = bg.assign(requested=pd.to_numeric(bg["rate_iops"], errors="coerce") * bg["numjobs"])
    # Several background processes of one point add up (the target leg uses two).
    bg = bg.groupby(["run_id", "point_id", "repeat"], as_index=False).agg(
        leg=("leg", "first"), bg_load_pct=("bg_load_pct", "first"), iops=("iops", "sum"),
        requested=("requested", "sum"))
    bg["iodepth"] = bg["point_id"].map(fg_iodepth)
    capped = (bg["requested"] > 0) & ~bg["bg_load_pct"].map(math.isinf)
    # Every capped point implies the saturation IOPS its percentage refers to.
    saturation = (bg["requested"] / (bg["bg_load_pct"] / 100)).where(capped)
    bg["saturation_iops"] = saturation.groupby(bg["leg"]).transform("median")
    bg["achieved_pct"] = bg["iops"] / bg["saturation_iops"] * 100
    return (bg.groupby(["leg", "iodepth", "bg_load_pct"], as_index=False)["achieved_pct"].mean())


def _curves(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (leg, foreground iodepth, background load) with both interference metrics."""
    good = usable(rows)
    fg = good[(good["role"] == "fg") & good["leg"].isin(list(LEGS))]
    bg = good[(good["role"] == "bg") & good["leg"].isin(list(LEGS))]
    if fg.empty:
        return pd.DataFrame()
    base = _baselines(fg, rows).set_index(["leg", "iodepth"])
    loaded = aggregate(fg[fg["bg_load_pct"].notna()], by=["leg", "iodepth", "bg_load_pct"])
    achieved = _background(bg, fg.drop_duplicates("point_id").set_index("point_id")["iodepth"])
    curves = loaded.merge(achieved, on=["leg", "iodepth", "bg_load_pct"], how="left")
    records = []
    for _, row in curves.iterrows():
        key = (row["leg"], row["iodepth"])
        base_p99 = base["lat_p99_ns_mean"].get(key, math.nan)
        base_iops = base["iops_mean"].get(key, math.nan)
        records.append({
            "leg": row["leg"], "app": app_name(row["iodepth"]), "iodepth": row["iodepth"],
            "bg_load_pct": row["bg_load_pct"], "achieved_pct": row["achieved_pct"],
            "p99_ns": row["lat_p99_ns_mean"], "iops": row["iops_mean"],
            "isolated_p99_ns": base_p99, "isolated_iops": base_iops,
            "latency_interference": latency_interference(row["lat_p99_ns_mean"], base_p99),
            "latency_interference_ci95": latency_interference(row["lat_p99_ns_ci95"], base_p99),
            "throughput_sustained": throughput_sustained(row["iops_mean"], base_iops),
            "throughput_sustained_ci95": throughput_sustained(row["iops_ci95"], base_iops),
            "repeats": row["iops_n"],
        })
    return pd.DataFrame(records).sort_values(["leg", "iodepth", "bg_load_pct"])


def highest_safe_load(curve: pd.DataFrame, metric: str, ok) -> float | None:
    """Highest capped load up to which `ok(metric)` holds at every load; None if the first fails."""
    safe = None
    for _, row in curve[~curve["bg_load_pct"].map(math.isinf)].sort_values("bg_load_pct").iterrows():
        if math.isnan(row[metric]) or not ok(row[metric]):
            break
        safe = row["bg_load_pct"]
    return safe


def _describe(curve: pd.DataFrame, metric: str, unit: str) -> str:
    values = curve[metric].dropna()
    if values.empty:
        return f"could not be computed (no isolated baseline or no loaded points)"
    low, high = curve.loc[values.idxmin()], curve.loc[values.idxmax()]
    fmt = (lambda v: f"{v:.2f}×") if unit == "×" else (lambda v: f"{v * 100:.0f} %")
    if values.max() <= values.min() * 1.25:
        return f"stayed near {fmt(values.mean())} at every load ({fmt(values.min())}–{fmt(values.max())})"
    first, last = curve.iloc[0], curve.iloc[-1]
    return (f"went from {fmt(first[metric])} at {load_text(first['bg_load_pct'])} to "
            f"{fmt(last[metric])} at {load_text(last['bg_load_pct'])} background load "
            f"(lowest {fmt(low[metric])}, highest {fmt(high[metric])})")


def _findings(curves: pd.DataFrame, rows: pd.DataFrame, out: StudyResult,
              guidelines: list[dict]) -> None:
    for leg, what in LEGS.items():
        leg_curves = curves[curves["leg"] == leg] if not curves.empty else curves
        if leg_curves.empty:
            out.findings.append(missing_leg(rows, leg, f"interference on the {what} is unknown"))
            continue
        for app, curve in leg_curves.groupby("app", sort=False):
            achieved = curve["achieved_pct"].max()
            achieved_text = ("" if math.isnan(achieved)
                             else f"; the background reached at most {achieved:.0f} % of the "
                                  "resource's saturation point")
            if leg == "control":
                worst_lat = curve["latency_interference"].max()
                worst_tput = curve["throughput_sustained"].min()
                if math.isnan(worst_lat) or math.isnan(worst_tput):
                    out.findings.append(f"Control ({what}), {app}: interference could not be computed (no "
                                        "isolated foreground measurement), so the control proves nothing.")
                    continue
                negligible = (worst_lat <= 1 + CONTROL_MARGIN and worst_tput >= 1 - CONTROL_MARGIN)
                out.findings.append(
                    f"Control ({what}), {app}: latency interference at most {worst_lat:.2f}×, "
                    f"throughput sustained at least {worst_tput * 100:.0f} % — "
                    + ("negligible, so the other legs measure the shared core."
                       if negligible else
                       f"NOT negligible (beyond ±{CONTROL_MARGIN * 100:.0f} %), so the network "
                       "or other shared parts also interfere in the other legs."))
                continue
            base = curve.iloc[0]
            if app == "L-app":
                out.findings.append(
                    f"{what.capitalize()}, {app} (isolated p99 {us(base['isolated_p99_ns'])}): "
                    f"latency interference {_describe(curve, 'latency_interference', '×')}"
                    f"{achieved_text}.")
                safe = highest_safe_load(curve, "latency_interference", lambda v: v < LATENCY_LIMIT)
                rule = f"p99 below {LATENCY_LIMIT:g}× isolated"
            else:
                out.findings.append(
                    f"{what.capitalize()}, {app} (isolated {kiops(base['isolated_iops'])}): "
                    f"throughput sustained {_describe(curve, 'throughput_sustained', '%')}"
                    f"{achieved_text}.")
                safe = highest_safe_load(curve, "throughput_sustained", lambda v: v >= SUSTAINED_LIMIT)
                rule = f"throughput sustained at least {SUSTAINED_LIMIT * 100:.0f} %"
            lowest = curve["bg_load_pct"].min()
            limit = f"{safe:g} %" if safe is not None else "none"
            guidelines.append({"resource": what, "application": app, "criterion": rule,
                               "keep background load at or below": limit})
            if safe is None:
                out.findings.append(f"Guideline ({what}, {app}): even the lowest background load "
                                    f"tried ({load_text(lowest)}) broke the limit ({rule}); do "
                                    "not share this resource with a background tenant.")
            else:
                out.findings.append(f"Guideline ({what}, {app}): keep the background load at or "
                                    f"below {limit} to keep {rule}.")


def _figures(curves: pd.DataFrame, rows: pd.DataFrame, out: StudyResult) -> None:
    lat = curves[(curves["app"] == "L-app")]
    tput = curves[(curves["app"] != "L-app")]
    if tput.empty:  # no T-app measured (the quick variant): the L-app's throughput is still the foreground's
        tput = curves
    tput_app = "L-app" if (tput["app"] == "L-app").all() else "T-app"
    if not lat.empty:
        out.figures.append(Figure("interference_latency_vs_load", plots.vs_load(
            lat.assign(series=lat["leg"].map(LEGS)), "latency_interference", series="series",
            title="L-app latency interference vs background load (p99 loaded / p99 isolated)",
            ylabel="Latency interference (×, higher is worse)", reference=1.0,
            threshold=LATENCY_LIMIT, threshold_label=f"guideline limit {LATENCY_LIMIT:g}×"),
            "p99 of the 4 KiB QD1 foreground divided by its isolated p99, per background load "
            "and shared resource (thesis figs. 6.1 and 6.3)."))
    out.figures.append(Figure("interference_throughput_vs_load", plots.vs_load(
        tput.assign(series=tput["leg"].map(LEGS) + ", " + tput["app"]),
        "throughput_sustained", series="series", scale=100,
        title=f"{tput_app} throughput sustained vs background load (IOPS loaded / IOPS isolated)",
        ylabel="Throughput sustained (%, lower is worse)", reference=1.0,
        threshold=SUSTAINED_LIMIT, threshold_label=f"guideline limit {SUSTAINED_LIMIT * 100:.0f} %"),
        f"Foreground {tput_app} IOPS as a share of its isolated IOPS, per background load and "
        "shared resource (thesis figs. 6.2 and 6.4 show it for the T-app)."))
    good = usable(rows)
    target_l = good[(good["leg"] == "target") & (good["role"] == "fg") & (good["iodepth"] == 1)]
    if not target_l.empty:
        histograms = {("isolated" if math.isnan(load) else f"background {load_text(load)}"):
                      merge_histograms(group["histogram_json"])
                      for load, group in target_l.groupby("bg_load_pct", dropna=False)}
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
    _findings(curves, rows, out, guidelines)
    if curves.empty:
        return out
    table = curves.assign(**{
        "bg_load_pct": curves["bg_load_pct"].map(load_text),
        "achieved bg load (%)": curves["achieved_pct"].round(1),
        "fg p99 (µs)": (curves["p99_ns"] / 1e3).round(2),
        "latency interference (×)": curves["latency_interference"].round(2),
        "fg KIOPS": (curves["iops"] / 1e3).round(2),
        "throughput sustained (%)": (curves["throughput_sustained"] * 100).round(1),
    })[["leg", "app", "bg_load_pct", "achieved bg load (%)", "fg p99 (µs)",
        "latency interference (×)", "fg KIOPS", "throughput sustained (%)", "repeats"]]
    out.tables.append(Table("Interference per background load", table,
                            "latency interference = p99(with load) / p99(isolated); throughput "
                            "sustained = IOPS(with load) / IOPS(isolated); 'max' = uncapped "
                            "background."))
    _figures(curves, rows, out)
    if guidelines:
        out.recommendations = pd.DataFrame(guidelines)
    return out
