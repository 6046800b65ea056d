"""The `saturation` study: where one initiator core and one target core stop scaling (table 6.1).

Legs: `initiator` and `target`, each sweeping numjobs × iodepth against one core of that
resource, or `combined` (one host core against one target core) on machines with too few cores to
separate them. The load of a point is its outstanding I/Os (numjobs × iodepth); where several
configurations give the same load the best one counts. The saturation point is found on that
envelope by `find_plateau` (rule in plateau.py and docs/analysis.md): that is the *knee*, where
growth stops. The *peak* is the highest throughput measured, the thesis' table 6.1 number; both are
reported. Which resource limits is confirmed from utilization at the peak: the target reactors'
busy time (/stats busy_ns, idle_ns) and the load generator's CPU (usr + sys over its cores).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from .. import plots
from ..findings_data import Finding
from .common import claim, compare, corrected, descriptive, excluded_points, leg_rows, missing_leg, study_rows
from .cores_used import cores_text
from .decide import fewest_not_below_summary
from .plateau import find_plateau, plateau_confirmed
from .result import Figure, StudyResult, Table
from .stats import aggregate
from .text import kiops

__all__ = ["analyze", "find_plateau", "plateau_confirmed", "saturation_point"]

STUDY = "saturation"
RESOURCES = {"initiator": "Initiator core", "target": "Target core"}
COMBINED = "One host core against one target core"
# A core counts as saturated when it was busy at least this share of the measured time.
BUSY = 0.9


def configuration(numjobs: float, iodepth: float) -> str:
    """The thesis' shorthand for a load generator configuration: P<jobs>.QD<depth>."""
    return f"P{numjobs:g}.QD{iodepth:g}"


def saturation_point(agg: pd.DataFrame, tolerance: float = 0.05) -> dict:
    """Saturation point of one resource from its aggregated numjobs × iodepth sweep."""
    agg = agg.assign(load=agg["numjobs"] * agg["iodepth"]).dropna(subset=["iops_mean"])
    envelope = agg.loc[agg.groupby("load")["iops_mean"].idxmax()].sort_values("load")
    envelope = envelope.reset_index(drop=True)
    loads, iops = envelope["load"].tolist(), envelope["iops_mean"].tolist()
    point = envelope.loc[find_plateau(loads, iops, tolerance)]
    top = envelope.loc[envelope["iops_mean"].idxmax()]
    return {"iops": point["iops_mean"], "ci95": point["iops_ci95"],
            "numjobs": point["numjobs"], "iodepth": point["iodepth"],
            "confirmed": plateau_confirmed(loads, iops, tolerance),
            "peak": top["iops_mean"], "peak_ci95": top["iops_ci95"], "peak_numjobs": top["numjobs"],
            "peak_std": top.get("iops_std", math.nan), "peak_n": top.get("iops_n", math.nan),
            "peak_iodepth": top["iodepth"], "points": len(agg)}


def utilization(data: pd.DataFrame, numjobs: float, iodepth: float) -> dict[str, float]:
    """Busy shares at one configuration, mean over repeats: the load generator's cores (host) and
    the busiest target reactor (target). NaN where the rows do not record them."""
    rows = data[(data["numjobs"] == numjobs) & (data["iodepth"] == iodepth)]
    host, target = [], []
    for _, row in rows.iterrows():
        knobs = json.loads(row.get("knobs_json") or "{}")
        cores = len(str(knobs["host_cores"]).split(",")) if knobs.get("host_cores") else 1
        cpu = (row.get("usr_cpu") or 0) + (row.get("sys_cpu") or 0)
        if not (isinstance(row.get("usr_cpu"), float) and math.isnan(row["usr_cpu"])):
            host.append(cpu / 100 / cores)
        counters = row.get("target_counters_json")
        if isinstance(counters, str) and counters:
            shares = [r.get("busy_ns", 0) / (r.get("busy_ns", 0) + r.get("idle_ns", 0))
                      for r in json.loads(counters).get("reactors", [])
                      if (r.get("busy_ns", 0) + r.get("idle_ns", 0)) > 0]
            if shares:
                target.append(max(shares))
    mean = lambda v: sum(v) / len(v) if v else math.nan  # noqa: E731
    return {"host": mean(host), "target": mean(target)}


def limit_check(leg: str, busy: dict[str, float]) -> str:
    """Whether utilization confirms the leg's resource as the limit at its peak."""
    own, other = ("host", "target") if leg == "initiator" else ("target", "host")
    name = {"host": "host core", "target": "target reactor"}
    if math.isnan(busy[own]):
        return f"unknown ({name[own]} utilization not recorded)"
    if busy[own] < BUSY:
        return (f"no: the {name[own]} was {(1 - busy[own]) * 100:.0f} % idle at the peak, so something else "
                "limited" + (f" (the {name[other]} was {busy[other] * 100:.0f} % busy)"
                             if not math.isnan(busy[other]) else ""))
    also = (f"; the {name[other]} was also {busy[other] * 100:.0f} % busy"
            if not math.isnan(busy[other]) and busy[other] >= BUSY else "")
    return f"yes ({name[own]} {busy[own] * 100:.0f} % busy{also})"


def cores_used(data: pd.DataFrame) -> str | None:
    """'host 1 / target 0,2' from the points' knobs; None when they did not record their cores."""
    knobs = json.loads(data["knobs_json"].iloc[0] or "{}")
    if "host_cores" not in knobs:
        return None
    return f"host {knobs['host_cores']} / target {knobs['target_cores']}"


def order_finding(found: dict[str, dict]) -> str:
    """Which resource saturates first, claimed only as far as the plateau rule found saturation."""
    (a, pa), (b, pb) = sorted(found.items(), key=lambda item: item[1]["peak"])
    name_a, name_b = RESOURCES[a].lower(), RESOURCES[b].lower()
    if pa["confirmed"] and pb["confirmed"]:
        d = compare({"iops_mean": pa["peak"], "iops_std": pa.get("peak_std", math.nan),
                     "iops_n": pa.get("peak_n", math.nan)},
                    {"iops_mean": pb["peak"], "iops_std": pb.get("peak_std", math.nan),
                     "iops_n": pb.get("peak_n", math.nan)}, "iops")
        text = claim(d, kiops, f"The {name_a} saturates first: peak {kiops(pa['peak'])} vs {kiops(pb['peak'])} "
                     f"for the {name_b}", f"peak IOPS between the {name_a} and the {name_b}",
                     f"{kiops(pa['peak'])} vs {kiops(pb['peak'])}; Welch")
        return text + ("." if d.clear else ", so which saturates first is unknown.")
    if not pa["confirmed"] and not pb["confirmed"]:
        return ("Neither core reached a plateau within the sweep, so which saturates first is unknown; "
                "extend numjobs or iodepth.")
    done, rising = (a, b) if pa["confirmed"] else (b, a)
    if found[rising]["peak"] >= found[done]["peak"]:
        return descriptive(f"The {RESOURCES[done].lower()} saturates first: peak {kiops(found[done]['peak'])}, "
                           f"while the {RESOURCES[rising].lower()} was still rising past "
                           f"{kiops(found[rising]['peak'])} (by the plateau rule on the means).")
    return descriptive(f"The {RESOURCES[done].lower()} saturates at {kiops(found[done]['peak'])}; the "
                       f"{RESOURCES[rising].lower()} was still rising at {kiops(found[rising]['peak'])}, so which "
                       "saturates first is unknown.")


def analyze(measurements: pd.DataFrame, runs: pd.DataFrame) -> StudyResult:
    rows = study_rows(measurements, STUDY)
    out = StudyResult(STUDY, "Saturation points of the compute resources")
    out.excluded = excluded_points(rows)
    table, found = [], {}
    legs = list(RESOURCES.items())
    if not leg_rows(rows, "combined", "main").empty:
        legs.append(("combined", COMBINED))
    for leg, resource in legs:
        data = leg_rows(rows, leg, "main")
        if data.empty:
            out.findings.append(missing_leg(rows, leg, f"the {resource.lower()} saturation "
                                                       "point is unknown"))
            continue
        agg = aggregate(data, by=["numjobs", "iodepth"])
        point = saturation_point(agg)
        config = configuration(point["numjobs"], point["iodepth"])
        peak_config = configuration(point["peak_numjobs"], point["peak_iodepth"])
        busy = utilization(data, point["peak_numjobs"], point["peak_iodepth"])
        point["limit"] = limit_check(leg, busy) if leg in RESOURCES else "n/a (both cores in one leg)"
        table.append({"Resource": resource,
                      "Peak (KIOPS)": round(point["peak"] / 1e3, 2),
                      "± 95 % CI (KIOPS)": round(point["peak_ci95"] / 1e3, 2),
                      "Peak configuration": peak_config,
                      "Knee (KIOPS)": round(point["iops"] / 1e3, 2),
                      "Knee configuration": config,
                      "Plateau reached": "yes" if point["confirmed"] else "no (still rising)",
                      "Host busy at peak (%)": round(busy["host"] * 100, 1),
                      "Target reactor busy at peak (%)": round(busy["target"] * 100, 1),
                      "Limit confirmed": point["limit"],
                      "Cores": used if (used := cores_text(data)) != "—" else cores_used(data),
                      "Points measured": point["points"]})
        figure = plots.iops_vs_qd(
            agg, "numjobs", f"{resource}: IOPS vs queue depth per number of jobs (4 KiB random read)",
            label=lambda n: f"numjobs = {n:g}")
        axes = figure.axes[0]
        axes.scatter([point["iodepth"]], [point["iops"] / 1e3], s=160, facecolors="none",
                     edgecolors="tab:red", linewidths=2, zorder=5,
                     label=f"knee {config}" if point["confirmed"] else f"highest load {config}")
        axes.scatter([point["peak_iodepth"]], [point["peak"] / 1e3], s=120, marker="*", color="tab:orange",
                     zorder=6, label=f"peak {peak_config}")
        axes.legend(fontsize=9)
        out.figures.append(Figure(f"saturation_{leg}", figure,
                                  f"Throughput as load grows ({resource.lower()}); the red circle marks the knee found by the plateau rule "
                                  "(or the highest load, when throughput was still rising), the star the peak."))
        if leg == "combined":
            state = (f"peak at {kiops(point['peak'])} with {peak_config} (knee {kiops(point['iops'])} "
                     f"with {config})" if point["confirmed"] else
                     f"were still scaling at the largest load tried ({config}, {kiops(point['iops'])})")
            out.findings.append(descriptive(
                f"This machine has too few cores to give each resource its own leg, so one host core "
                f"was measured against one target core ({cores_used(data) or 'cores not recorded'}): "
                f"together they {state}. That is the lower of the two saturation points; which core "
                "limits is not known."))
            continue
        found[leg] = point
        if point["confirmed"]:
            out.findings.append(descriptive(
                f"The {resource.lower()} peaks at {kiops(point['peak'])} with {peak_config}; "
                f"its knee (growth below 5 %) is at {kiops(point['iops'])} with {config}. "
                f"Utilization confirms it as the limit: {point['limit']}."))
        else:
            out.findings.append(descriptive(
                f"The {resource.lower()} was still scaling at the largest load "
                f"tried ({config}, {kiops(point['iops'])}); its saturation point lies beyond the sweep."))
    if table:
        out.tables.append(Table("Saturation points of compute resources", pd.DataFrame(table),
                                "Peak: the highest KIOPS measured and the configuration reaching "
                                "it (thesis table 6.1 shape, the saturation point the interference "
                                "study caps on); knee: where the plateau rule finds growth stops. "
                                f"A limit is confirmed when its core was at least {BUSY * 100:.0f} % "
                                "busy at the peak. Cores are this machine's, as the leg ran."))
    if len(found) == 2:
        out.findings.append(order_finding(found))
    _target_cores(rows, out)
    return out


def _core_count(knobs_json: str) -> int:
    """Number of cores in a point's `target_cores` cpulist ('0-1,4' -> 3)."""
    text = json.loads(knobs_json or "{}").get("target_cores") or ""
    count = 0
    for part in str(text).split(","):
        if "-" in part:
            low, high = part.split("-")
            count += int(high) - int(low) + 1
        elif part.strip():
            count += 1
    return count


def _target_cores(rows: pd.DataFrame, out: StudyResult) -> None:
    """The `target_cores` leg: IOPS per number of target cores, and the fewest cores whose IOPS is
    not significantly below the best (the interval of the difference includes zero)."""
    if rows.empty or "target_cores" not in set(rows["leg"]):
        return
    data = leg_rows(rows, "target_cores", "main")
    if data.empty:
        out.findings.append(missing_leg(rows, "target_cores", "target saturation by core count is unknown"))
        return
    data = data.assign(target_core_count=data["knobs_json"].map(_core_count))
    agg = aggregate(data, by=["target_core_count", "numjobs", "iodepth"]).sort_values("target_core_count")
    out.tables.append(Table("Target saturation by number of target cores", pd.DataFrame({
        "target cores": agg["target_core_count"].astype(int), "host jobs": agg["numjobs"].astype(int),
        "QD per job": agg["iodepth"].astype(int), "KIOPS": (agg["iops_mean"] / 1e3).round(2),
        "± KIOPS (95 %)": (agg["iops_ci95"] / 1e3).round(2), "repeats": agg["iops_n"].astype(int),
        "cores used": [cores_text(data[(data["target_core_count"] == c) & (data["numjobs"] == j)
                                       & (data["iodepth"] == d)])
                       for c, j, d in zip(agg["target_core_count"], agg["numjobs"], agg["iodepth"])]}),
        f"One target reactor per core against host jobs enough to load them; {cores_used(data) or ''}"))
    figure = plots.series_vs_x(agg.assign(series="4 KiB random read"), "target_core_count", "iops",
                               series="series", title="IOPS vs number of target cores", xlabel="Target cores",
                               ylabel=plots.KIOPS_LABEL, scale=1e-3, log2x=False)
    out.figures.append(Figure("saturation_target_cores", figure,
                              "Throughput per number of target cores, 95 % intervals over repeats."))
    # The fewest cores whose IOPS is not clearly below the best's, Holm over the comparisons with the
    # best (decide.fewest_not_below_summary); the same rule the A/A check measures.
    best = agg.loc[agg["iops_mean"].idxmax()]
    best_n = int(best["target_core_count"])
    configs = [row for _, row in agg.iterrows()]
    diffs = corrected([compare(row, best, "iops") for row in configs if int(row["target_core_count"]) != best_n])
    if any(not d.decidable for d in diffs):
        out.findings.append(f"Target cores: cannot decide whether fewer than the {best_n} that gave the most IOPS "
                            f"({kiops(best['iops_mean'])}) would do: fewer than two repeats (or no spread), so no "
                            "interval.")
        return
    pick = int(fewest_not_below_summary(tuple(np.array([float(r[f"iops_{k}"]) for r in configs])
                                              for k in ("mean", "std", "n"))))
    enough = configs[pick]
    others = [r for r in configs if int(r["target_core_count"]) != best_n]
    d = next((dd for r, dd in zip(others, diffs) if r is enough), None)
    n = int(enough["target_core_count"])
    if n != best_n:
        tail = (f"; {best_n} cores gave no clear difference ({kiops(best['iops_mean'])}, difference "
                f"{d.text(kiops)}: the 95 % interval includes zero, or Holm over the {len(diffs)} comparisons "
                "with the best does not exclude it)")
    elif best_n == int(agg["target_core_count"].max()):
        tail = " — the largest count measured, so the target may scale further"
    else:
        tail = "; more cores gave no more throughput"
    fewer = "" if n == int(agg["target_core_count"].min()) else "; every smaller count was significantly slower (Holm-corrected)"
    out.findings.append(Finding(  # decided by fewest_not_below_summary
        f"{n} target core(s) reach the highest throughput measured ({kiops(enough['iops_mean'])} "
        f"± {enough['iops_ci95'] / 1e3:.1f}K, 95 % interval){fewer}{tail}.", STUDY, decided=True))
