"""Logical core indices from specs mapped onto the cores this process may use.

Specs speak of "core 0, core 1, ..." as the studies do; small machines have fewer. Indices wrap
modulo the available cores, and callers record when two roles meant to be apart ended up together.
"""

from __future__ import annotations

import os


def available_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def physical(logical: list[int], available: list[int] | None = None) -> list[int]:
    cores = available if available is not None else available_cores()
    return [cores[i % len(cores)] for i in logical]


def cpulist(cores: list[int]) -> str:
    """'0,2,3' as taskset, nvmf-target --cores and nvmf-perf --cpus_allowed accept."""
    return ",".join(str(c) for c in cores)
