"""The ratios the studies are defined by (STUDIES.md), each in one place.

All functions take plain numbers and return NaN rather than raising when an input is missing
or a denominator is zero, so a report with a missing leg still renders and says what is absent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def _ratio(numerator: float | None, denominator: float | None) -> float:
    if numerator is None or denominator is None:
        return math.nan
    if math.isnan(numerator) or math.isnan(denominator) or denominator == 0:
        return math.nan
    return numerator / denominator


def change_pct(before: float | None, after: float | None) -> float:
    """Relative change from `before` to `after` in percent (negative = decrease)."""
    return (_ratio(after, before) - 1) * 100


def latency_interference(p99_loaded: float | None, p99_isolated: float | None) -> float:
    """p99(with load) / p99(isolated): 1 means no interference, higher is worse."""
    return _ratio(p99_loaded, p99_isolated)


def throughput_sustained(iops_loaded: float | None, iops_isolated: float | None) -> float:
    """IOPS(with load) / IOPS(isolated): 1 means no interference, lower is worse."""
    return _ratio(iops_loaded, iops_isolated)


def peak_ratio(peak_a: float | None, peak_b: float | None) -> float:
    """How many times peak A is of peak B (e.g. local vs remote single-core IOPS)."""
    return _ratio(peak_a, peak_b)


def concurrency(iops_transport_qd: float | None, iops_local_qd1: float | None) -> float:
    """IOPS(transport, QD) / IOPS(local, QD1): the parallelism a transport extracts."""
    return _ratio(iops_transport_qd, iops_local_qd1)


@dataclass(frozen=True)
class OverheadPart:
    """One component of the L-app overhead: absolute (µs) and relative to its baseline (%)."""

    name: str
    baseline: str
    delta_us: float
    pct: float


def overhead_decomposition(
    local_us: float | None, loopback_us: float | None, netns_us: float | None
) -> list[OverheadPart]:
    """Split the remote p99 into software and network overhead (thesis ch. 5).

    software = loopback − local (relative to local), network = netns − loopback (relative to
    loopback), total = netns − local (relative to local). A missing leg gives NaN parts.
    """

    def part(name: str, baseline: str, base: float | None, value: float | None) -> OverheadPart:
        delta = math.nan if base is None or value is None else value - base
        return OverheadPart(name, baseline, delta, change_pct(base, value))

    return [
        part("software", "local", local_us, loopback_us),
        part("network", "loopback", loopback_us, netns_us),
        part("total", "local", local_us, netns_us),
    ]
