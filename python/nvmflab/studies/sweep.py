"""`nvmflab run SPEC`: any sweep, the cross product of the spec's `[sweep]` lists, on loopback."""

from __future__ import annotations

from .common import Context, config_key, point_knobs, repeated, tcp_point


def execute(ctx: Context) -> None:
    knob_sets = [point_knobs(ctx, knobs) for knobs in ctx.spec.points()]
    points = repeated(ctx, knob_sets, lambda knobs, r: tcp_point(ctx, "sweep", knobs, r))
    ctx.run(points, f"{ctx.study}: sweep", compare_by=config_key)  # a sweep compares nothing: each on its own
