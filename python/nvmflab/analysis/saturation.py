"""The `saturation` study: where one initiator core and one target core stop scaling (table 6.1).

Legs: `initiator` and `target`, each sweeping numjobs × iodepth against one core of that
resource, or `combined` (one host core against one target core) on machines with too few cores to
separate them. The load of a point is its outstanding I/Os (numjobs × iodepth); where several
configurations give the same load the best one counts. The saturation point is found on that
envelope by `find_plateau` (rule in plateau.py and docs/analysis.md); only a confirmed plateau is
called a saturation point in the findings.
"""

from __future__ import annotations

import json

import pandas as pd

from .. import plots
from .common import excluded_points, leg_rows, missing_leg, study_rows
from .plateau import find_plateau, plateau_confirmed
from .result import Figure, StudyResult, Table
from .stats import aggregate
from .text import kiops

__all__ = ["analyze", "find_plateau", "plateau_confirmed", "saturation_point"]

STUDY = "saturation"
RESOURCES = {"initiator": "Initiator core", "target": "Target core"}
COMBINED = "One host core against one target core"


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
    return {"iops": point["iops_mean"], "ci95": point["iops_ci95"],
            "numjobs": point["numjobs"], "iodepth": point["iodepth"],
            "confirmed": plateau_confirmed(loads, iops, tolerance),
            "peak": envelope["iops_mean"].max(), "points": len(agg)}


def cores_used(data: pd.DataFrame) -> str | None:
    """'host 1 / target 0,2' from the points' knobs; None when they did not record their cores."""
    knobs = json.loads(data["knobs_json"].iloc[0] or "{}")
    if "host_cores" not in knobs:
        return None
    return f"host {knobs['host_cores']} / target {knobs['target_cores']}"


def order_finding(found: dict[str, dict]) -> str:
    """Which resource saturates first, claimed only as far as the plateau rule found saturation."""
    (a, pa), (b, pb) = sorted(found.items(), key=lambda item: item[1]["iops"])
    name_a, name_b = RESOURCES[a].lower(), RESOURCES[b].lower()
    if pa["confirmed"] and pb["confirmed"]:
        return f"The {name_a} saturates first: {kiops(pa['iops'])} vs {kiops(pb['iops'])} for the {name_b}."
    if not pa["confirmed"] and not pb["confirmed"]:
        return ("Neither core reached a plateau within the sweep, so which saturates first is unknown; "
                "extend numjobs or iodepth.")
    done, rising = (a, b) if pa["confirmed"] else (b, a)
    if found[rising]["peak"] >= found[done]["iops"]:
        return (f"The {RESOURCES[done].lower()} saturates first: {kiops(found[done]['iops'])}, while the "
                f"{RESOURCES[rising].lower()} was still rising past {kiops(found[rising]['peak'])}.")
    return (f"The {RESOURCES[done].lower()} saturates at {kiops(found[done]['iops'])}; the "
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
        table.append({"Resource": resource,
                      "Saturation point (KIOPS)": round(point["iops"] / 1e3, 2),
                      "± 95 % CI (KIOPS)": round(point["ci95"] / 1e3, 2),
                      "Saturation configuration": config,
                      "Plateau reached": "yes" if point["confirmed"] else "no (still rising)",
                      "Cores": cores_used(data),
                      "Points measured": point["points"]})
        figure = plots.iops_vs_qd(
            agg, "numjobs", f"{resource}: IOPS vs queue depth per number of jobs (4 KiB random read)",
            label=lambda n: f"numjobs = {n:g}")
        axes = figure.axes[0]
        axes.scatter([point["iodepth"]], [point["iops"] / 1e3], s=160, facecolors="none",
                     edgecolors="tab:red", linewidths=2, zorder=5,
                     label=f"saturation point {config}" if point["confirmed"] else f"highest load {config}")
        axes.legend(fontsize=9)
        out.figures.append(Figure(f"saturation_{leg}", figure,
                                  f"Throughput as load grows ({resource.lower()}); the red circle marks the saturation point found by the plateau rule "
                                  "(or the highest load, when throughput was still rising)."))
        if leg == "combined":
            state = (f"saturate at {kiops(point['iops'])} with {config}" if point["confirmed"] else
                     f"were still scaling at the largest load tried ({config}, {kiops(point['iops'])})")
            out.findings.append(
                f"This machine has too few cores to give each resource its own leg, so one host core "
                f"was measured against one target core ({cores_used(data) or 'cores not recorded'}): "
                f"together they {state}. That is the lower of the two saturation points; which core "
                "limits is not known.")
            continue
        found[leg] = point
        if point["confirmed"]:
            out.findings.append(f"The {resource.lower()} saturates at {kiops(point['iops'])} "
                                f"with {config} (highest measured {kiops(point['peak'])}).")
        else:
            out.findings.append(f"The {resource.lower()} was still scaling at the largest load "
                                f"tried ({config}, {kiops(point['iops'])}); its saturation "
                                "point lies beyond the sweep.")
    if table:
        out.tables.append(Table("Saturation points of compute resources", pd.DataFrame(table),
                                "KIOPS at the saturation point and the load generator "
                                "configuration reaching it (thesis table 6.1 shape); cores are "
                                "this machine's, as the leg ran."))
    if len(found) == 2:
        out.findings.append(order_finding(found))
    return out
