"""Where a throughput-vs-load curve stops rising: the saturation point of a resource.

The rule (also in docs/analysis.md):

    The saturation point is the first load L_i whose throughput T_i is not exceeded by more
    than `tolerance` (relative) at ANY higher load:  max(T_j for L_j > L_i) <= T_i * (1 + tolerance).

Looking at every higher load rather than only the next one is what makes the rule robust to
noise: a dip followed by a rise (T = 100, 95, 130) does not end the climb at 100, because 130 is
still more than 5 % above it. A curve that keeps rising to the end of the sweep has no plateau
inside the sweep; the rule then returns the last point, and `plateau_confirmed` says False so the
report can state that the resource was not saturated by the loads tried.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def _valid_order(loads: Sequence[float], throughput: Sequence[float]) -> list[int]:
    """Indices of the usable points (throughput is a finite number) sorted by load."""
    if len(loads) != len(throughput):
        raise ValueError(
            f"loads and throughput differ in length ({len(loads)} vs {len(throughput)}); "
            "pass one throughput value per load"
        )
    usable = [
        i for i, t in enumerate(throughput)
        if t is not None and not math.isnan(float(t)) and not math.isnan(float(loads[i]))
    ]
    if not usable:
        raise ValueError("no usable points: every throughput value is missing (NaN/None)")
    return sorted(usable, key=lambda i: float(loads[i]))


def find_plateau(
    loads: Sequence[float], throughput: Sequence[float], tolerance: float = 0.05
) -> int:
    """Index (into the given sequences) of the saturation point.

    `loads` need not be sorted; points whose throughput is NaN/None (failed runs) are ignored.
    With a single usable point that point is returned. Raises ValueError when the sequences
    differ in length, when no point is usable, or when `tolerance` is negative.
    """
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    order = _valid_order(loads, throughput)
    values = [float(throughput[i]) for i in order]
    # Running maximum from the right: best throughput reached at any higher load.
    later_max = [-math.inf] * len(values)
    for k in range(len(values) - 2, -1, -1):
        later_max[k] = max(values[k + 1], later_max[k + 1])
    for k, value in enumerate(values):
        if later_max[k] <= value * (1 + tolerance):
            return order[k]
    return order[-1]


def plateau_confirmed(
    loads: Sequence[float], throughput: Sequence[float], tolerance: float = 0.05
) -> bool:
    """True when at least one higher load was measured after the saturation point.

    Without such a point the sweep ended while throughput was still rising (or had only one
    point), so the resource may not have been saturated.
    """
    index = find_plateau(loads, throughput, tolerance)
    order = _valid_order(loads, throughput)
    return order.index(index) < len(order) - 1
