"""The order a round's points run in: shuffled with the run's seed, so no leg always runs first.

Studies hand the runner their points round by round (repeat outermost: `studies.common.repeated`,
`interleave`). In a fixed order the same leg would always follow a target start, always be the
first point after a resumed run and always meet the same phase of a drift within the round, so an
order effect would read as that leg's difference. Within each round (a stretch of consecutive
points with the same repeat) the groups of points that share one running target are shuffled, and
the points within each group too; a group stays together so a round starts each target once, as
before. The shuffle is drawn from (seed, description, round), so the same seed gives the same
order again, a resumed run included (its stored points are skipped where they fall).
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Hashable
from itertools import groupby

from .plan import Point

def new_seed() -> int:
    """A seed for a run that names none (recorded with the run, so it can be given again)."""
    return secrets.randbelow(2**32)


def in_round_order(points: list[Point], seed: int | None, description: str) -> list[Point]:
    """The points with each round shuffled by `seed` (None: as given)."""
    if seed is None:
        return list(points)
    out: list[Point] = []
    for block, (repeat, members) in enumerate(groupby(points, key=lambda p: p.repeat)):
        rng = random.Random(f"{seed}:{description}:{repeat}:{block}")
        groups: dict[Hashable, list[Point]] = {}
        for point in members:
            groups.setdefault(_target_of(point), []).append(point)
        shuffled = list(groups.values())
        rng.shuffle(shuffled)
        for group in shuffled:
            rng.shuffle(group)
            out += group
    return out


def _target_of(point: Point) -> Hashable:
    """What a point's running target depends on (None: no target, a local job)."""
    if point.target is None:
        return None
    key = (point.target, point.knobs.get("target_stack"))
    try:
        hash(key)
    except TypeError:  # an unhashable field: its text tells setups apart just as well
        return (repr(point.target), point.knobs.get("target_stack"))
    return key
