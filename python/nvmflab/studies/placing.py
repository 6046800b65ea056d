"""Helpers the contention, dimensions, busy-poll and parallelism studies share: points on chosen
cores, the knobs a load generator takes, and a stack's refusal as a skip reason."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from ..plan import Point, Subsystem
from ..spec import Knobs, Workload
from ..stacks import StackError
from .common import NQN_PREFIX, Context, local_point, tcp_point

SPEC_FIELDS = frozenset(Workload.model_fields) | frozenset(Knobs.model_fields)


def perf_knobs(knobs: dict[str, Any]) -> dict[str, Any]:
    """Only the workload and knob fields: what a load generator's command line is built from."""
    return {k: v for k, v in knobs.items() if k in SPEC_FIELDS}


def stack_refusal(ctx: Context, knobs: dict[str, Any]) -> str | None:
    """Why the run's target or host stack cannot honour these knobs (their own sentence), or None."""
    defaults = Knobs().model_dump()
    target, host = ctx.runner.target_stack, ctx.runner.host_stack
    try:
        target.check_knobs(knobs, "target", defaults)
        host.check_knobs(perf_knobs(knobs), "host", defaults)
    except StackError as error:
        return f"{target.name} target / {host.name} host: {error}"
    return None


def placed_point(ctx: Context, leg: str, knobs: dict[str, Any], repeat: int, host_cpus: tuple[int, ...],
                 target_cpus: tuple[int, ...], subsystem: Subsystem | None = None,
                 skip_reason: str | None = None) -> Point:
    """A tcp point whose load generator runs on `host_cpus` and whose target has one reactor per
    entry of `target_cpus` (physical cores)."""
    point = tcp_point(ctx, leg, knobs, repeat, subsystem=subsystem, skip_reason=skip_reason)
    point.target = replace(point.target, cores=tuple(target_cpus))
    point.jobs = [replace(job, knobs=perf_knobs(job.knobs), cpus=tuple(host_cpus)) for job in point.jobs]
    return point


def file_subsystem(ctx: Context, name: str, path: str) -> Subsystem:
    return Subsystem(nqn=f"{NQN_PREFIX}:{name}", backend="file", size=ctx.spec.backend.size, path=path,
                     block_size=ctx.spec.backend.block_size)


def local_file_point(ctx: Context, leg: str, knobs: dict[str, Any], repeat: int, path: str,
                     host_cpus: tuple[int, ...] | None = None) -> Point:
    """nvmf-perf --local (or the host stack's own local engine) on a file of the backend's size."""
    point = local_point(ctx, leg, knobs, repeat, path, ctx.spec.backend.size)
    point.jobs = [replace(job, knobs=perf_knobs(job.knobs), cpus=tuple(host_cpus or job.cpus))
                  for job in point.jobs]
    return point


def work_file(ctx: Context, name: str) -> str:
    return str(Path(ctx.store.dir) / "work" / f"{name}.img")


def distinct(cores: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(dict.fromkeys(cores))
