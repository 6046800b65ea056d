"""`stacks`: every available target stack × host stack pair side by side, so a user sees which side
is the bottleneck ("ours target with SPDK host: 1.10× the IOPS of SPDK target with SPDK host at
QD32").

Each pair measures the L-app (4 KiB random read, QD1), the T-app (4 KiB random read over
`iodepth`) and the B-app (`bapp_bs` random read at `bapp_iodepth`). Repeats are interleaved: round
r measures every pair before round r+1 starts, so a machine that gets busier for a while hurts
every pair alike. A pair whose stacks cannot run here (no nvmet on this kernel, no SPDK build) is
stored as skipped with the reason.

Like with like: SPDK always polls (reactors and host queue pairs), so by default (`modes = "poll"`)
every pair polls on both sides where its stack can: host completion `poll`, target reactors `poll`.
A side that cannot (nvmet has no polling reactor) runs the mode it always has, and each point
records the `completion` and `target_mode` it ran with, so the analysis names them. `modes =
"spec"` runs the spec's knobs instead. Either way a knob set explicitly in the spec wins, and must be
one every pair can honour.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..plan import Point
from ..spec import STACK_NAMES, IoDepth, Size, StackName
from ..stacks import Stack, StackError, get_stack
from .common import Context, point_knobs, tcp_point

LAPP = {"app": "L-app", "rw": "randread", "bs": 4096, "iodepth": 1, "numjobs": 1}


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")
    targets: list[StackName] = Field(default=list(STACK_NAMES), min_length=1)
    hosts: list[StackName] = Field(default=list(STACK_NAMES), min_length=1)
    baseline: str = "spdk/spdk"  # target/host pair the ratios are taken against (falls back to ours/ours)
    iodepth: list[IoDepth] = Field(default=[1, 2, 4, 8, 16, 32, 64, 128], min_length=1)
    bapp_bs: Size = 128 << 10
    bapp_iodepth: IoDepth = 32
    # "poll": both sides poll where the stack can (SPDK always does); "spec": the spec's knobs.
    modes: Literal["poll", "spec"] = "poll"

    @field_validator("baseline")
    @classmethod
    def _pair(cls, value: str) -> str:
        parts = value.split("/")
        if len(parts) != 2 or any(p not in STACK_NAMES for p in parts):
            raise ValueError(f"baseline must be TARGET/HOST with each one of {', '.join(STACK_NAMES)} "
                             f"(got {value!r})")
        return value


def apps(params: Params) -> list[dict]:
    tapp = [{"app": "T-app", "rw": "randread", "bs": 4096, "iodepth": qd, "numjobs": 1} for qd in params.iodepth]
    bapp = [{"app": "B-app", "rw": "randread", "bs": params.bapp_bs, "iodepth": params.bapp_iodepth, "numjobs": 1}]
    return [LAPP] + tapp + bapp


POLLING = {"completion": "poll", "target_mode": "poll"}


def pair_knobs(ctx: Context, target: Stack, host: Stack, app: dict, modes: str = "poll") -> dict:
    """The app's knobs for one pair: polling on both sides (modes "poll"), then what each stack
    always does, fill what the spec left unset."""
    explicit = ctx.spec.knobs.model_fields_set
    wanted = (POLLING if modes == "poll" else {}) | target.fixed_defaults("target") | host.fixed_defaults("host")
    chosen = {k: v for k, v in wanted.items() if k not in explicit}
    return point_knobs(ctx, app | chosen | {"target_stack": target.name, "host_stack": host.name})


def unavailable(ctx: Context, target: Stack, host: Stack) -> str | None:
    """Why this pair cannot run on the topology's hosts, or None. Planning checks nothing remote."""
    if ctx.planning:
        return None
    hosts = ctx.runner.hosts
    return target.unavailable(hosts.target, "target") or host.unavailable(hosts.initiator(None), "host")


def stack_pairs(ctx: Context, study: str, targets: list[str], hosts: list[str]
                ) -> tuple[list[tuple[Stack, Stack]], dict[tuple[str, str], str | None]]:
    """Every known (target, host) stack pair, and why each cannot run here (None when it can);
    the console names each pair that is skipped."""
    stacks: dict[str, Stack] = {}
    for name in dict.fromkeys(targets + hosts):
        try:
            stacks[name] = get_stack(name)
        except StackError:
            continue
    pairs = [(stacks[t], stacks[h]) for t in targets for h in hosts if t in stacks and h in stacks]
    reasons = {(t.name, h.name): unavailable(ctx, t, h) for t, h in pairs}
    for (t, h), reason in reasons.items():
        if reason:
            ctx.console_note(f"{study}: {t} target × {h} host skipped: {reason}")
    return pairs, reasons


def execute(ctx: Context, params: Params) -> None:
    pairs, reasons = stack_pairs(ctx, "stacks", params.targets, params.hosts)
    points: list[Point] = []
    for repeat in range(ctx.spec.repeats):  # interleaved: every pair once per round
        for target, host in pairs:
            reason = reasons[(target.name, host.name)]
            for app in apps(params):
                knobs = pair_knobs(ctx, target, host, app, params.modes)
                points.append(tcp_point(ctx, f"{target.name}/{host.name}", knobs, repeat, skip_reason=reason))
    # each app is one comparison of every pair
    ctx.run(points, "stacks: target × host", compare_by=lambda p: (p.knobs.get("app"), p.knobs.get("iodepth"),
                                                                   p.knobs.get("bs")))
