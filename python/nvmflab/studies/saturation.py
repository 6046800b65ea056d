"""`saturation` (thesis table 6.1): where one initiator core and one target core stop scaling.

Legs (numjobs × iodepth of 4 KiB randread), on this machine's physical cores:
- `initiator`: every job on one host core; the target gets every target core apart from it (at
  least two, so the target is not what limits).
- `target`: one target reactor; the jobs spread over every host core apart from it (at least two).
A leg left with fewer than two cores on its other side cannot isolate its resource: its points are
stored `skipped` with the reason. When no leg can run, the `combined` leg measures one host core
against one target core instead: the lower of the two saturation points, without telling which.
Every point records its cores (`host_cores`, `target_cores`) among its knobs.
The plateau rule (the knee) is the analysis package's `find_plateau`; `saturation_iops` applies it,
and `peak_iops` gives the peak the interference study caps its backgrounds on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from ..analysis.saturation import find_plateau
from ..cores import cpulist
from ..plan import Point
from ..spec import IoDepth, NumJobs
from .common import Context, point_knobs, repeated, tcp_point

RESOURCES = ("initiator", "target")


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")
    resources: list[Literal["initiator", "target"]] = Field(default=list(RESOURCES), min_length=1)
    numjobs: list[NumJobs] = Field(default=[1, 2, 3], min_length=1)
    iodepth: list[IoDepth] = Field(default=[1, 8, 32, 64, 128, 256], min_length=1)


@dataclass(frozen=True)
class Layout:
    host: tuple[int, ...]  # physical cores of the load generator
    target: tuple[int, ...]  # physical cores of the target, one reactor each
    skip_reason: str | None = None  # why this machine cannot isolate the leg's resource


def layouts(ctx: Context, resources: list[str]) -> dict[str, Layout]:
    """The cores of each leg; `combined` replaces the legs when none can isolate its resource."""
    topo = ctx.spec.topology
    hosts = list(dict.fromkeys(ctx.phys(topo.host_cores)))
    targets = list(dict.fromkeys(ctx.phys(topo.target_cores)))
    legs = {}
    for resource in resources:
        one, others, side = (hosts[0], targets, "target") if resource == "initiator" else (targets[0], hosts, "host")
        many = tuple(c for c in others if c != one)
        reason = None if len(many) >= 2 else (
            f"too few cores to isolate the {resource} core: the leg needs at least two {side} cores apart from "
            f"it, and the spec's {side}_cores give {len(many)} on this machine (usable cores: {cpulist(ctx.cores)})")
        legs[resource] = Layout((one,), many, reason) if resource == "initiator" else Layout(many, (one,), reason)
    if all(layout.skip_reason for layout in legs.values()):
        host = next((c for c in hosts if c != targets[0]), hosts[0])
        legs["combined"] = Layout((host,), (targets[0],))
    return legs


def execute(ctx: Context, params: Params) -> None:
    for leg, layout in layouts(ctx, params.resources).items():
        cores = {"host_cores": cpulist(list(layout.host)), "target_cores": cpulist(list(layout.target))}
        sets = [point_knobs(ctx, {"rw": "randread", "bs": 4096, "numjobs": j, "iodepth": qd, "resource": leg} | cores)
                for j in params.numjobs for qd in params.iodepth]
        ctx.run(repeated(ctx, sets, lambda knobs, r, leg=leg, layout=layout: _point(ctx, leg, layout, knobs, r)),
                f"saturation: {leg}" + (" (skipped)" if layout.skip_reason else ""))


def _point(ctx: Context, leg: str, layout: Layout, knobs: dict, repeat: int) -> Point:
    point = tcp_point(ctx, leg, knobs, repeat, skip_reason=layout.skip_reason)
    point.target = replace(point.target, cores=layout.target)
    point.jobs = [replace(point.jobs[0], cpus=layout.host)]
    return point


def saturation_iops(frame: pd.DataFrame, load_column: str = "iodepth") -> tuple[float, dict]:
    """Saturation throughput of the ok points in `frame` (mean over repeats per load) and its row."""
    ok = frame[(frame["status"] == "ok") & frame["iops"].notna()]
    if ok.empty:
        return math.nan, {}
    group_keys = [c for c in ("numjobs", load_column) if c in ok.columns]
    means = ok.groupby(group_keys, as_index=False)["iops"].mean()
    means["load"] = means[load_column] * (means["numjobs"] if "numjobs" in group_keys and load_column != "numjobs" else 1)
    means = means.sort_values(["load"] + group_keys).reset_index(drop=True)
    index = find_plateau(list(means["load"]), list(means["iops"]), tolerance=0.05)
    return float(means.loc[index, "iops"]), means.loc[index].to_dict()


def peak_iops(frame: pd.DataFrame) -> float:
    """The highest mean IOPS (over repeats) of any configuration among the ok points in `frame`.

    This is the saturation point the thesis caps interference backgrounds on (its 128.24 KIOPS at
    P1.QD128 was the peak of the sweep), not the knee `saturation_iops` finds where growth slows.
    """
    ok = frame[(frame["status"] == "ok") & frame["iops"].notna()]
    if ok.empty:
        return math.nan
    keys = [c for c in ("numjobs", "iodepth") if c in ok.columns]
    per_point = ok.groupby(["run_id", "point_id", "repeat"] + keys, as_index=False)["iops"].sum() \
        if "point_id" in ok.columns else ok
    return float(per_point.groupby(keys)["iops"].mean().max())
