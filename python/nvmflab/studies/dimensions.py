"""`dimensions` (the commodity-networks paper): transport × I/O pattern × I/O size × cores.

Legs:
- `pattern`: every `patterns` entry (rw and randrw at `rwmixread` % reads, 70 by default) × every
  `bs`, at `iodepth` (128), one job on the spec's host cores against one reactor;
- `cores`: 4 KiB random reads at `iodepth` with N host cores (one job each) against N target
  reactors, for N in `cores`; their histograms give the latency CDF per core count;
- `local` (QD1 on a file, no network stack) and `concurrency` (NVMe/TCP on the same kind of file,
  `concurrency_iodepth` swept): concurrency = IOPS(transport, QD) / IOPS(local, QD1).
Each entry of `transports` sets the knob `transport` (legs `pattern_rdma`, ... for rdma). An RDMA
point runs only where both hosts have an RDMA device and the stacks speak RDMA (topology/rdma.py);
elsewhere it is stored skipped with that reason, and the analysis says so. The `transports` study
compares TCP, RDMA and TLS in full.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..spec import RW, IoDepth, Size
from .common import Context, interleave, logical, point_knobs, repeated
from .placing import distinct, file_subsystem, local_file_point, placed_point, work_file


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")
    transports: list[Literal["tcp", "rdma"]] = Field(default=["tcp"], min_length=1)
    patterns: list[RW] = Field(default=["read", "write", "randread", "randwrite", "rw", "randrw"], min_length=1)
    rwmixread: int = Field(default=70, ge=0, le=100)
    bs: list[Size] = Field(default=["512", "4k", "16k", "64k", "128k", "256k", "1m"], min_length=1)
    iodepth: IoDepth = 128
    cores: list[int] = Field(default=[1, 2, 4], min_length=1)
    concurrency_iodepth: list[IoDepth] = Field(default=[1, 2, 4, 8, 16, 32, 64, 128], min_length=1)
    legs: list[Literal["pattern", "cores", "concurrency"]] = Field(
        default=["pattern", "cores", "concurrency"], min_length=1)


def execute(ctx: Context, params: Params) -> None:
    topo = ctx.spec.topology
    host1, target1 = distinct(ctx.phys(topo.host_cores[:1])), distinct(ctx.target_phys(topo.target_cores[:1]))
    for transport in params.transports:
        suffix = "" if transport == "tcp" else f"_{transport}"
        if "pattern" in params.legs:
            sets = [point_knobs(ctx, {"rw": rw, "bs": bs, "iodepth": params.iodepth, "numjobs": 1,
                                      "rwmixread": params.rwmixread}) | {"transport": transport}
                    for rw in params.patterns for bs in params.bs]
            ctx.run(repeated(ctx, sets, lambda k, r: placed_point(ctx, f"pattern{suffix}", k, r, host1, target1)),
                    f"dimensions: pattern × size ({transport})")
        if "cores" in params.legs:
            per_count = []
            for n in params.cores:
                hosts = logical(topo.host_cores, n, topo.target_cores)
                targets = logical(topo.target_cores, n, hosts)
                host_cpus, target_cpus = distinct(ctx.phys(hosts)), distinct(ctx.target_phys(targets))
                knobs = point_knobs(ctx, {"rw": "randread", "bs": 4096, "iodepth": params.iodepth, "numjobs": n,
                                          "io_queues": n}) | {"transport": transport, "cores": n,
                                                              "host_cpus": len(host_cpus),
                                                              "target_cpus": len(target_cpus)}
                per_count.append(repeated(ctx, [knobs], lambda k, r, h=host_cpus, t=target_cpus: placed_point(
                    ctx, f"cores{suffix}", k, r, h, t)))
            # every core count in the same rounds: the counts are one comparison
            ctx.run(interleave(*per_count), f"dimensions: cores ({transport})")
        if "concurrency" in params.legs:
            path = work_file(ctx, "dimensions")
            sub = file_subsystem(ctx, "dimensions", path)
            local_points = []
            if transport == "tcp":  # the local QD1 reference runs in the same rounds as the remote depths
                local = point_knobs(ctx, {"rw": "randread", "bs": 4096, "iodepth": 1, "numjobs": 1,
                                          "backend": "file"})
                local_points = repeated(ctx, [local], lambda k, r: local_file_point(ctx, "local", k, r, path, host1))
            sets = [point_knobs(ctx, {"rw": "randread", "bs": 4096, "iodepth": qd, "numjobs": 1, "backend": "file"})
                    | {"transport": transport} for qd in params.concurrency_iodepth]
            ctx.run(interleave(local_points, repeated(ctx, sets, lambda k, r: placed_point(
                        ctx, f"concurrency{suffix}", k, r, host1, target1, subsystem=sub))),
                    f"dimensions: concurrency ({transport})" + (" and local QD1" if local_points else ""))
