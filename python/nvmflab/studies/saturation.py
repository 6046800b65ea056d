"""`saturation` (thesis table 6.1): where one initiator core and one target core stop scaling.

Legs (numjobs × iodepth of 4 KiB randread), on this machine's physical cores:
- `initiator`: every job on one host core; the target gets every target core apart from it (at
  least two, so the target is not what limits).
- `target`: one target reactor; the jobs spread over every host core apart from it (at least two).
A leg left with fewer than two cores on its other side cannot isolate its resource: its points are
stored `skipped` with the reason. When no leg can run, the `combined` leg measures one host core
against one target core instead: the lower of the two saturation points, without telling which.
- `target_cores` (the thesis artifact's target scaling): 1, 2, 4… target reactors against host jobs
  enough to saturate them (`scaling_jobs_per_core` jobs per target core at `scaling_iodepth`) on a
  fixed set of host cores that no count's target uses, so only the target's core count changes. On a
  local topology the host and target share the machine: a count is run when it leaves at least
  `scaling_min_host_cores` cores for the host; with fewer than two such counts the leg is stored
  `skipped` with the reason. On ssh the target's usable cores bound the counts.
Every point records its cores (`host_cores`, `target_cores`) among its knobs.
The plateau rule (the knee) is the analysis package's `find_plateau`; `saturation_iops` applies it,
and `peak_iops` gives the peak the interference study caps its backgrounds on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Annotated, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from ..analysis.saturation import find_plateau
from ..cores import cpulist
from ..plan import Point
from ..spec import IoDepth, NumJobs
from .common import Context, interleave, point_knobs, repeated, tcp_point

RESOURCES = ("initiator", "target")


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")
    resources: list[Literal["initiator", "target"]] = Field(default=list(RESOURCES), min_length=1)
    numjobs: list[NumJobs] = Field(default=[1, 2, 3], min_length=1)
    iodepth: list[IoDepth] = Field(default=[1, 8, 32, 64, 128, 256], min_length=1)
    # the `target_cores` leg: target reactor counts ([] leaves the leg out), host load per target core
    target_core_counts: list[Annotated[int, Field(ge=1, le=128)]] = Field(default=[1, 2, 4])
    scaling_iodepth: IoDepth = 64
    scaling_jobs_per_core: Annotated[int, Field(ge=1, le=64)] = 2
    scaling_min_host_cores: Annotated[int, Field(ge=1)] = 2


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
    legs = []
    for leg, layout in layouts(ctx, params.resources).items():
        cores = {"host_cores": cpulist(list(layout.host)), "target_cores": cpulist(list(layout.target))}
        sets = [point_knobs(ctx, {"rw": "randread", "bs": 4096, "numjobs": j, "iodepth": qd, "resource": leg} | cores)
                for j in params.numjobs for qd in params.iodepth]
        legs.append(repeated(ctx, sets, lambda knobs, r, leg=leg, layout=layout: _point(ctx, leg, layout, knobs, r)))
    if legs:  # the resources side by side (repeat outermost): which saturates first is their comparison
        ctx.run(interleave(*legs), "saturation: " + " + ".join(layouts(ctx, params.resources)),
                compare_by=lambda p: (p.knobs["numjobs"], p.knobs["iodepth"]))
    if params.target_core_counts:
        scaling = scaling_layouts(ctx, params)
        sets, by_count = [], {}
        for count, layout in scaling.items():
            jobs = min(256, params.scaling_jobs_per_core * count)
            knobs = point_knobs(ctx, {"rw": "randread", "bs": 4096, "numjobs": jobs, "iodepth": params.scaling_iodepth,
                                      "resource": "target_cores", "host_cores": cpulist(list(layout.host)),
                                      "target_cores": cpulist(list(layout.target))})
            sets.append(knobs)
            by_count[knobs["target_cores"]] = layout
        skipped = all(layout.skip_reason for layout in scaling.values())
        ctx.run(repeated(ctx, sets, lambda knobs, r: _point(ctx, "target_cores", by_count[knobs["target_cores"]],
                                                            knobs, r)),
                "saturation: target_cores" + (" (skipped)" if skipped else ""))


def scaling_layouts(ctx: Context, params: Params) -> dict[int, Layout]:
    """Target core count -> cores of the `target_cores` leg; every count skipped (with why) when fewer
    than two counts fit. The host cores are the same for every count."""
    counts = sorted(set(params.target_core_counts))
    need = params.scaling_min_host_cores
    if ctx.spec.topology.kind == "local":
        machine = list(dict.fromkeys(ctx.cores))
        fitting = [k for k in counts if len(machine) - k >= need]
        top = max(fitting, default=0)
        host = tuple(machine[top:]) if fitting else tuple(machine[-1:])
        targets = {k: tuple(machine[:k]) for k in counts}
        why = (f"too few cores to sweep the target's core count: {len(machine)} usable cores "
               f"({cpulist(machine)}) leave room for {len(fitting)} of the counts {counts} with at least {need} "
               f"host cores apart from the target's; the leg needs two")
    else:
        target_cores = list(dict.fromkeys(ctx.target_cores))
        fitting = [k for k in counts if k <= len(target_cores)]
        host = tuple(dict.fromkeys(ctx.cores))
        targets = {k: tuple(target_cores[:k]) for k in counts}
        why = (f"too few target cores to sweep the core count: the target has {len(target_cores)} usable cores, "
               f"enough for {len(fitting)} of the counts {counts}; the leg needs two")
    if len(fitting) < 2:
        return {k: Layout(host, targets[k] or (host[0],), why) for k in counts}
    return {k: Layout(host, targets[k]) for k in fitting}


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
