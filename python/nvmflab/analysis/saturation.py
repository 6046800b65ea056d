"""The `saturation` study: where one initiator core and one target core stop scaling (table 6.1).

Legs: `initiator` and `target`, each sweeping numjobs × iodepth against one core of that
resource. The load of a point is its outstanding I/Os (numjobs × iodepth); where several
configurations give the same load the best one counts. The saturation point is found on that
envelope by `find_plateau` (rule in plateau.py and docs/analysis.md).
"""

from __future__ import annotations

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


def analyze(measurements: pd.DataFrame, runs: pd.DataFrame) -> StudyResult:
    rows = study_rows(measurements, STUDY)
    out = StudyResult(STUDY, "Saturation points of the compute resources")
    out.excluded = excluded_points(rows)
    table, found = [], {}
    for leg, resource in RESOURCES.items():
        data = leg_rows(rows, leg, "main")
        if data.empty:
            out.findings.append(missing_leg(rows, leg, f"the {resource.lower()} saturation "
                                                       "point is unknown"))
            continue
        agg = aggregate(data, by=["numjobs", "iodepth"])
        point = saturation_point(agg)
        found[leg] = point
        config = configuration(point["numjobs"], point["iodepth"])
        table.append({"Resource": resource,
                      "Saturation point (KIOPS)": round(point["iops"] / 1e3, 2),
                      "± 95 % CI (KIOPS)": round(point["ci95"] / 1e3, 2),
                      "Saturation configuration": config,
                      "Plateau reached": "yes" if point["confirmed"] else "no (still rising)",
                      "Points measured": point["points"]})
        figure = plots.iops_vs_qd(
            agg, "numjobs", f"{resource}: IOPS vs queue depth per number of jobs (4 KiB random read)",
            label=lambda n: f"numjobs = {n:g}")
        axes = figure.axes[0]
        axes.scatter([point["iodepth"]], [point["iops"] / 1e3], s=160, facecolors="none",
                     edgecolors="tab:red", linewidths=2, zorder=5,
                     label=f"saturation point {config}")
        axes.legend(fontsize=9)
        out.figures.append(Figure(f"saturation_{leg}", figure,
                                  f"Throughput of one {resource.lower()} as load grows; the red "
                                  "circle marks the saturation point found by the plateau rule."))
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
                                "configuration reaching it (thesis table 6.1 shape)."))
    if len(found) == 2:
        first_, second = sorted(found, key=lambda leg: found[leg]["iops"])
        out.findings.append(
            f"The {RESOURCES[first_].lower()} saturates first: {kiops(found[first_]['iops'])} "
            f"vs {kiops(found[second]['iops'])} for the {RESOURCES[second].lower()}.")
    return out
