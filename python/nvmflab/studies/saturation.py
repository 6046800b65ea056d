"""`saturation` (thesis table 6.1): where one initiator core and one target core stop scaling.

Legs (numjobs × iodepth of 4 KiB randread):
- `initiator`: every job pinned to one host core; the target gets the target cores.
- `target`: one target reactor; the jobs spread over the host cores.
The plateau rule is the analysis package's `find_plateau`; `saturation_iops` applies it.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from ..analysis.saturation import find_plateau
from ..plan import PerfJob
from ..spec import IoDepth, NumJobs
from .common import Context, backend_subsystem, point_knobs, repeated, tcp_point

RESOURCES = ("initiator", "target")


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")
    resources: list[Literal["initiator", "target"]] = Field(default=list(RESOURCES), min_length=1)
    numjobs: list[NumJobs] = Field(default=[1, 2, 3], min_length=1)
    iodepth: list[IoDepth] = Field(default=[1, 8, 32, 64, 128, 256], min_length=1)


def execute(ctx: Context, params: Params) -> None:
    for resource in params.resources:
        sets = [point_knobs(ctx, {"rw": "randread", "bs": 4096, "numjobs": j, "iodepth": qd,
                                  "resource": resource})
                for j in params.numjobs for qd in params.iodepth]
        ctx.run(repeated(ctx, sets, lambda knobs, r, res=resource: _point(ctx, res, knobs, r)),
                f"saturation: {resource}")


def _point(ctx: Context, resource: str, knobs: dict, repeat: int):
    point = tcp_point(ctx, resource, knobs, repeat, subsystem=backend_subsystem(ctx, "main"))
    topo = ctx.spec.topology
    if resource == "initiator":
        cpus = ctx.phys(topo.host_cores[:1])  # all jobs share one host core
    else:
        cpus = ctx.phys(topo.host_cores)
        point.target = replace(point.target, cores=ctx.phys(topo.target_cores[:1]))
    point.jobs = [PerfJob(role="main", knobs=point.jobs[0].knobs, cpus=cpus, nqn=point.jobs[0].nqn)]
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
