"""Scaling: our target's 4 KiB randread IOPS with 1..N reactors (nvmf-target --cores), the host
on the other cores with one polling nvmf-perf job per host core, enough depth to keep every
reactor busy. N is the number of cores the bench gives the target: half of the available ones
(1 on a 2-core machine, where this is one point; a many-core machine gives the curve). Each run
is bracketed by speed probes, as the matrix's are, so one from a slow phase of the machine is
marked noisy and left out of the median."""

from __future__ import annotations

from typing import Any

from . import speed
from .stacks import Bench, Work

QUEUE_DEPTH_PER_REACTOR = 128


def split_cores(available: list[int]) -> tuple[list[int], list[int]]:
    """(target cores, host cores): the first half for the target, the rest for the host."""
    if len(available) < 2:
        return list(available), list(available)
    half = len(available) // 2
    return available[:half], available[half:]


def work_for(reactors: int, host_cores: list[int]) -> Work:
    """One job per host core; their depths add up to QUEUE_DEPTH_PER_REACTOR per reactor."""
    jobs = max(1, len(host_cores))
    depth = max(1, -(-QUEUE_DEPTH_PER_REACTOR * reactors // jobs))
    return Work(f"4k randread, {reactors} reactor(s)", "randread", 4096, min(depth, 1024), jobs)


def measure(bench: Bench, reactors: int, target_pool: list[int], host_cores: list[int], seconds: int,
            ramp: int, gate: speed.Gate | None = None) -> dict[str, Any]:
    work = work_for(reactors, host_cores)
    with bench.target("ours", target_pool[:reactors], "poll") as target:
        with speed.Bracket(bench, target_pool[0], host_cores[0], target, gate) as probes:
            run = bench.measure("ours", target, work, "poll", host_cores, seconds, ramp)
    return run | probes.fields | {"reactors": reactors, "numjobs": work.numjobs, "iodepth": work.iodepth}
