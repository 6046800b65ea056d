"""`parallelism` (the Arm study): how jobs, request size and queue depth spend CPU and shape latency,
local against remote.

Legs, all on a file of the backend's size (local: the host stack's local engine on it; remote:
NVMe/TCP to a target serving it), 1 job unless swept:
- `numjobs`: remote 4 KiB random reads at `numjobs_iodepth` for every `numjobs` (latency,
  bandwidth, host and target CPU);
- `size_local` / `size_remote`: every `bs` at `size_iodepth` (CPU cost per I/O and its user/kernel
  split by request size, remote against local);
- `depth_local` / `depth_remote`: 4 KiB random reads over `iodepth` (tail latency, local vs remote).
The load generators run on the spec's host cores; the target on its target cores.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..spec import IoDepth, NumJobs, Size
from ..plan import Point
from .common import Context, interleave, point_knobs, repeated
from .placing import distinct, file_subsystem, local_file_point, placed_point, work_file


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")
    numjobs: list[NumJobs] = Field(default=[1, 2, 4, 8], min_length=1)
    numjobs_iodepth: IoDepth = 16
    bs: list[Size] = Field(default=["4k", "16k", "64k", "128k", "256k", "1m"], min_length=1)
    size_iodepth: IoDepth = 16
    iodepth: list[IoDepth] = Field(default=[1, 2, 4, 8, 16, 32, 64, 128], min_length=1)
    rw: Literal["randread", "read", "randwrite", "write"] = "randread"
    legs: list[Literal["numjobs", "size", "depth"]] = Field(default=["numjobs", "size", "depth"], min_length=1)


def execute(ctx: Context, params: Params) -> None:
    topo = ctx.spec.topology
    host_cpus, target_cpus = distinct(ctx.phys(topo.host_cores)), distinct(ctx.target_phys(topo.target_cores))
    path = work_file(ctx, "parallelism")
    sub = file_subsystem(ctx, "parallelism", path)

    def knobs(**over) -> dict:
        return point_knobs(ctx, {"rw": params.rw, "bs": 4096, "numjobs": 1, "backend": "file"} | over)

    def remote(leg: str, sets: list[dict]) -> list[Point]:
        return repeated(ctx, sets, lambda k, r: placed_point(ctx, leg, k, r, host_cpus, target_cpus, subsystem=sub))

    def local(leg: str, sets: list[dict]) -> list[Point]:
        return repeated(ctx, sets, lambda k, r: local_file_point(ctx, leg, k, r, path, host_cpus))

    if "numjobs" in params.legs:
        ctx.run(remote("numjobs", [knobs(numjobs=j, io_queues=j, iodepth=params.numjobs_iodepth)
                                   for j in params.numjobs]), "parallelism: numjobs")
    # local and remote side by side: each size (depth) is one comparison of the two legs
    if "size" in params.legs:
        sets = [knobs(bs=bs, iodepth=params.size_iodepth) for bs in params.bs]
        ctx.run(interleave(local("size_local", sets), remote("size_remote", sets)),
                "parallelism: size_local + size_remote", compare_by=lambda p: p.knobs["bs"])
    if "depth" in params.legs:
        sets = [knobs(iodepth=qd) for qd in params.iodepth]
        ctx.run(interleave(local("depth_local", sets), remote("depth_remote", sets)),
                "parallelism: depth_local + depth_remote", compare_by=lambda p: p.knobs["iodepth"])
