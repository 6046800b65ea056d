"""`polling` (thesis ch. 4): host completion polling, target idle polling, and their interaction.

Legs:
- `completion`: T-app (4 KiB randread, 1 job) at every iodepth, completion event vs poll; the
  QD1 points are the L-app p99, and ctx vs QD comes from the same points.
- `idle_poll`: target idle_poll_us swept at QD1 (p99) and at high_iodepth (IOPS), with the
  completion mode the `completion` leg chose (the thesis swept idle polling with poll queues already
  on); the spec's completion when that leg gave no clear winner.
- `matrix`: completion × target_mode at QD1 and high_iodepth (table 3.3 shape).
- `io_queues` (the thesis artifact's queue count sweep): io_queues 1..N at QD1 and high_iodepth with
  the chosen completion mode. nvmf-perf and spdk_nvme_perf open one queue pair per job, so a point with
  q queues runs q jobs (numjobs = io_queues), each at the point's iodepth; the kernel host gets the same
  q fio jobs and `nvme connect --nr-io-queues=q`, so every stack compares the same load. The leg
  measures queue count together with job count (as the artifact did); the cores are the spec's.
- `matrix_rx` (`rx_steering`, [] leaves it out; `polling_rx.py`): the matrix's cells for each mode
  of receive steering (off, rps, rfs) over one netns veth pair: where receive processing runs.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..spec import IoDepth
from ..units import format_size

from . import polling_rx
from .common import Context, point_knobs, repeated, tcp_point

TAPP = {"rw": "randread", "bs": 4096, "numjobs": 1}


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")
    iodepth: list[IoDepth] = Field(default=[1, 2, 4, 8, 16, 32, 64, 128, 256], min_length=1)
    idle_poll_us: list[Annotated[int, Field(ge=0)]] = Field(default=[0, 10, 20, 40, 80, 160], min_length=1)
    high_iodepth: IoDepth = 128
    # I/O queue counts of the `io_queues` leg (one job per queue); [] leaves the leg out.
    io_queues: list[Annotated[int, Field(ge=1, le=256)]] = Field(default=[1, 2, 4, 8])
    # Receive steering modes of the `matrix_rx` leg over a netns veth; [] (the default here, the
    # full spec asks for all three) leaves the leg out.
    rx_steering: list[Literal["off", "rps", "rfs"]] = []
    rps_cores: list[Annotated[int, Field(ge=0)]] = []  # logical; [] = a core neither side uses


def unused_fields(spec) -> list[tuple[tuple[str, ...], str]]:
    """[workload] fields the study would not apply: it runs the T-app (4 KiB randread, 1 job) and
    takes its iodepths from [params]; a spec asking otherwise is refused, not silently ignored."""
    out = []
    workload = spec.workload
    for name in sorted(workload.model_fields_set):
        value = getattr(workload, name)
        if name in TAPP and value != TAPP[name]:
            shown = format_size(value) if name == "bs" else repr(value)
            out.append((("workload", name), f"the polling study runs the T-app (4k randread, 1 job) and does not "
                                            f"use {name} = {shown}; remove it (`nvmflab run` sweeps any workload)"))
        elif name == "iodepth":
            out.append((("workload", name), "the polling study takes its iodepths from [params] iodepth and "
                                            "high_iodepth; remove it"))
    return out


def execute(ctx: Context, params: Params) -> None:
    low = min(params.iodepth + [1])

    def metric(knobs: dict) -> str:
        """What the leg decides on: p99 at the lowest queue depth (the L-app), IOPS above it."""
        return "lat_p99_ns" if knobs["iodepth"] <= low else "iops"

    def run_leg(leg: str, knob_sets: list[dict]) -> None:
        # Each queue depth is one comparison (event vs poll, the idle periods, the matrix cells).
        sets = [point_knobs(ctx, TAPP | k) for k in knob_sets]
        ctx.run(repeated(ctx, sets, lambda knobs, r: tcp_point(ctx, leg, knobs, r)), f"polling: {leg}",
                compare_by=lambda p: p.knobs["iodepth"], metric=metric)

    run_leg("completion", [{"completion": c, "iodepth": qd}
                           for c in ("event", "poll") for qd in params.iodepth])
    completion = chosen_completion(ctx)
    run_leg("idle_poll", [{"target_mode": "event", "idle_poll_us": us, "iodepth": qd} | completion
                          for us in params.idle_poll_us for qd in (1, params.high_iodepth)])
    run_leg("matrix", [{"completion": c, "target_mode": m, "iodepth": qd}
                       for c in ("event", "poll") for m in ("event", "poll") for qd in (1, params.high_iodepth)])
    if params.rx_steering:
        polling_rx.run_leg(ctx, TAPP, list(dict.fromkeys(params.rx_steering)), params.rps_cores,
                           sorted({1, params.high_iodepth}),
                           compare_by=lambda p: (p.knobs["iodepth"], p.knobs["completion"], p.knobs["target_mode"]),
                           metric=metric)
    if params.io_queues:
        run_leg("io_queues", [{"io_queues": q, "numjobs": q, "iodepth": qd} | completion
                              for q in params.io_queues for qd in (1, params.high_iodepth)])


def chosen_completion(ctx: Context) -> dict:
    """{"completion": mode} when the completion leg's measurements chose one, else {}."""
    from ..analysis.polling import recommended_knobs

    if ctx.planning:
        return {}
    frame = ctx.measurements("completion")
    chosen = recommended_knobs(frame) if not frame.empty else {}
    return {"completion": chosen["completion"]} if "completion" in chosen else {}
