"""`interference` (thesis ch. 6): a foreground app sharing one core with a rate-capped background.

For each resource:
1. `calibrate_<resource>`: the background alone, iodepth swept; its peak (the highest mean IOPS
   over the depths tried, thesis §6.2's "saturation point") gives the resource's saturation IOPS
   (or `params.saturation_iops` gives it directly). When no calibration
   point succeeds, the capped points are stored failed with that reason and the study goes on.
2. `<resource>`: the foreground (L-app QD1 or T-app QD`tapp_iodepth`) alone (isolated, no
   bg_load_pct), then with the background capped at each bg_load_pct of the saturation point and
   uncapped ("max").
Host completion modes: `params.completion` lists the modes every leg runs under (knob
`completion`, on fg and bg alike); each mode calibrates its own saturation point, so "60 %" means
60 % of what the background reaches under that mode. Left out or `[]`, the study runs under the
spec's `[knobs] completion` alone (the polling study's choice when carried over). The shipped spec lists
both, so the report can test the thesis's hypothesis (§6.3) that its flat 38× initiator
interference came from the load generator polling. The configurations of a leg are interleaved
over both modes, so drift lands in the interval, not in the poll − event difference.
Layouts (logical cores; on small machines they wrap modulo the available cores and the point
records `fg_bg_shared_core` when fg and bg share a core they were meant not to):
- initiator: fg and bg on host core H0; fg's subsystem on reactor 0 (core T0), bg's on reactor 1 (T1).
- target: fg on H0, bg's two jobs on H1 and H2; every queue on reactor 0 (T0), while the target
  also runs a spare reactor 1 (T1) that no queue is meant for, so a misplaced queue shows there.
- `control_<resource>`: fg on H0, bg with the resource leg's job count on H1.., reactors 0 and 1:
  only the network is shared; bg uncapped.
Sanity invariants from the target's counters mark a point `invalid` when violated. Each role's
served commands must equal exactly the I/O its load generator sent when that reports it
(`total_ios` + `nvmflab.jobs[i].ramp_ios` + `verified_ios`, CONTRACTS.md §3, as nvmf-perf does);
otherwise (fio, spdk_nvme_perf) a loose bound allows for the ramp, and the detail says which.
Repeats are interleaved over every configuration of a leg (round r of all before round r + 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, field_validator

from ..counters import namespace_commands
from ..plan import PerfJob, Point
from ..spec import IoDepth
from .common import Context, backend_subsystem, logical, point_knobs, repeated, target_setup
from .saturation import peak_iops

APPS = {"L-app": 1}  # T-app's iodepth comes from params


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")
    resources: list[Literal["initiator", "target"]] = Field(default=["initiator", "target"], min_length=1)
    fg_apps: list[Literal["L-app", "T-app"]] = Field(default=["L-app", "T-app"], min_length=1)
    bg_load_pct: list[int | str] = Field(default=[10, 20, 30, 40, 50, 60, 70, 80, 90, "max"], min_length=1)
    tapp_iodepth: IoDepth = 128
    bg_iodepth: IoDepth = 128
    calibrate_iodepth: list[IoDepth] = Field(default=[16, 32, 64, 128, 256], min_length=1)
    saturation_iops: dict[Literal["initiator", "target"], PositiveFloat] = {}
    control: bool = True
    # Host completion modes every leg runs under; None or []: the spec's [knobs] completion alone
    # (the polling study's choice when carried over).
    completion: list[Literal["event", "poll"]] | None = None
    # Guideline thresholds, read by the analysis: L-app p99 below latency_limit × isolated, T-app
    # throughput sustained at least sustained_limit.
    latency_limit: float = Field(default=2.0, gt=1)
    sustained_limit: float = Field(default=0.9, gt=0, lt=1)

    @field_validator("completion")
    @classmethod
    def _modes(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError(f"{value!r} names a mode twice; allowed: \"event\", \"poll\", each once")
        return value

    @field_validator("bg_load_pct")
    @classmethod
    def _loads(cls, value: list[int | str]) -> list[int | str]:
        for v in value:
            if v != "max" and not (isinstance(v, int) and 0 < v <= 100):
                raise ValueError(f"{v!r} is not allowed; allowed: integers 1..100 and \"max\"")
        return value


@dataclass(frozen=True)
class Layout:
    """Logical cores of one experiment: fg/bg host cores, target cores, fg/bg reactor indices."""

    fg_host: tuple[int, ...]
    bg_host: tuple[int, ...]
    target: tuple[int, ...]
    fg_reactor: int
    bg_reactor: int
    shared: str  # what fg and bg are meant to share: "host", "reactor" or "network"


def layout(ctx: Context, resource: str) -> Layout:
    topo = ctx.spec.topology
    hosts = logical(topo.host_cores, 3, topo.target_cores)
    targets = logical(topo.target_cores, 2, hosts)
    if resource == "initiator":
        return Layout((hosts[0],), (hosts[0],), tuple(targets), 0, 1, "host")
    if resource == "target":  # reactor 1 is the spare: no queue belongs there
        return Layout((hosts[0],), (hosts[1], hosts[2]), tuple(targets), 0, 0, "reactor")
    bg_jobs = 2 if resource == "control_target" else 1  # the job count of the leg it controls
    return Layout((hosts[0],), tuple(hosts[1:1 + bg_jobs]), tuple(targets), 0, 1, "network")


def unintended_sharing(ctx: Context, lay: Layout) -> bool:
    """True when fg and bg ended up on a common physical core that the experiment did not intend."""
    fg_host, bg_host = set(ctx.phys(lay.fg_host)), set(ctx.phys(lay.bg_host))
    fg_reactor, bg_reactor = {ctx.phys(lay.target)[lay.fg_reactor]}, {ctx.phys(lay.target)[lay.bg_reactor]}
    clashes = [fg_host & bg_reactor, bg_host & fg_reactor]
    if lay.shared != "host":
        clashes.append(fg_host & bg_host)
    if lay.shared != "reactor":
        clashes.append(fg_reactor & bg_reactor)
    return any(clashes)


def modes(ctx: Context, params: Params) -> list[str]:
    """The completion modes to run: [params] completion, else the spec's (carried-over) one.

    Of several modes, those the host stack cannot honour are left out (with a note); a single
    mode is kept, so the knob check before the run refuses it by name.
    """
    if not params.completion:
        return [ctx.spec.knobs.completion]
    if len(params.completion) == 1:
        return list(params.completion)
    from ..spec import Knobs
    from ..stacks import StackError, get_stack

    kept = []
    for mode in params.completion:
        try:
            get_stack(ctx.spec.stack.host).check_knobs({"completion": mode}, "host", Knobs().model_dump())
        except (StackError, KeyError, ValueError) as err:
            ctx.console_note(f"interference: completion = {mode} left out: {err}")
            continue
        kept.append(mode)
    return kept or [ctx.spec.knobs.completion]


def execute(ctx: Context, params: Params) -> None:
    completions = modes(ctx, params)
    for resource in params.resources:
        items = []
        for mode in completions:
            saturation, uncalibrated = _saturation(ctx, params, resource, mode, len(completions) > 1)
            fg_sets = [_fg_knobs(ctx, params, app, resource, mode) for app in params.fg_apps]
            items += [(k, lambda k, r, res=resource: build(ctx, params, res, k, r, None, 0)) for k in fg_sets]
            for pct in params.bg_load_pct:
                if pct == "max":
                    rate, why = 0, None
                elif uncalibrated:  # a capped load needs the saturation point: fail now, retry next run
                    rate, why = 0, uncalibrated
                else:
                    rate, why = _rate(saturation, pct, len(layout(ctx, resource).bg_host)), None
                items += [(k | {"bg_load_pct": pct}, lambda k, r, res=resource, q=rate, why=why:
                           build(ctx, params, res, k, r, True, q, fail_reason=why)) for k in fg_sets]
        ctx.run(interleaved(ctx, items), f"interference: {resource}")
    if params.control:
        # fg isolated, then fg with the uncapped bg (saturation load) on cores of its own, at each
        # resource leg's own background job count.
        for resource in params.resources:
            leg = f"control_{resource}"
            items = []
            for mode in completions:
                fg_sets = [_fg_knobs(ctx, params, app, leg, mode) for app in params.fg_apps]
                items += [(k, lambda k, r, leg=leg: build(ctx, params, leg, k, r, None, 0)) for k in fg_sets]
                items += [(k | {"bg_load_pct": "max"}, lambda k, r, leg=leg: build(ctx, params, leg, k, r, True, 0))
                          for k in fg_sets]
            ctx.run(interleaved(ctx, items), f"interference: {leg}")


def interleaved(ctx: Context, items: list[tuple[dict[str, Any], Any]]) -> list[Point]:
    """Round r of every configuration before round r + 1 (drift lands in the interval)."""
    return [build_one(knobs, r) for r in range(ctx.spec.repeats) for knobs, build_one in items]


def _fg_knobs(ctx: Context, params: Params, app: str, resource: str, completion: str) -> dict[str, Any]:
    iodepth = APPS.get(app, params.tapp_iodepth)
    return point_knobs(ctx, {"rw": "randread", "bs": 4096, "numjobs": 1, "iodepth": iodepth, "rate_iops": 0,
                             "completion": completion, "app": app, "resource": resource})


def _rate(saturation: float, pct: int, bg_jobs: int) -> int:
    """Per-job rate cap (nvmf-perf's rate_iops is per job, like fio's)."""
    return max(1, round(saturation * pct / 100 / bg_jobs))


def _saturation(ctx: Context, params: Params, resource: str, completion: str,
                several: bool = False) -> tuple[float, str | None]:
    """The resource's saturation IOPS under `completion`, or NaN and why the calibration gave none."""
    if resource in params.saturation_iops:
        return params.saturation_iops[resource], None
    leg = f"calibrate_{resource}"
    sets = [point_knobs(ctx, {"rw": "randread", "bs": 4096, "numjobs": 1, "iodepth": qd, "rate_iops": 0,
                              "completion": completion, "resource": resource}) for qd in params.calibrate_iodepth]
    ctx.run(repeated(ctx, sets, lambda k, r: build(ctx, params, resource, k, r, False, 0, leg=leg)),
            f"interference: {leg}" + (f" (completion {completion})" if several else ""))
    frame = ctx.measurements(leg)
    if "completion" in frame:
        frame = frame[frame["completion"] == completion]
    iops = peak_iops(frame[frame["role"] == "bg"])
    if not math.isnan(iops):
        return iops, None
    errors = frame["error"].dropna()
    return iops, (f"no saturation point to cap the background at: no {leg} point succeeded"
                  + (f" (e.g. {errors.iloc[0]})" if len(errors) else ""))


def build(ctx: Context, params: Params, resource: str, fg_knobs: dict[str, Any], repeat: int,
          with_bg: bool | None, bg_rate: int, leg: str | None = None, fail_reason: str | None = None) -> Point:
    """A point of `resource`'s layout: fg only (with_bg None), fg + bg (True), or bg only (False)."""
    lay = layout(ctx, resource)
    fg_sub = backend_subsystem(ctx, "fg", reactor=lay.fg_reactor)
    bg_sub = backend_subsystem(ctx, "bg", reactor=lay.bg_reactor)
    jobs = []
    if with_bg is not False:
        jobs.append(PerfJob("fg", _perf_knobs(fg_knobs), ctx.phys(lay.fg_host), nqn=fg_sub.nqn,
                            hostnqn=ctx.spec.stack.hostnqn))
    if with_bg is not None:
        bg_knobs = _perf_knobs(fg_knobs) | {"iodepth": params.bg_iodepth if with_bg else fg_knobs["iodepth"],
                                            "numjobs": len(lay.bg_host), "io_queues": len(lay.bg_host),
                                            "rate_iops": bg_rate}
        jobs.append(PerfJob("bg", bg_knobs, ctx.phys(lay.bg_host), nqn=bg_sub.nqn, hostnqn=ctx.spec.stack.hostnqn))
    return Point(study=ctx.study, leg=leg or resource, knobs=fg_knobs, repeat=repeat, jobs=jobs,
                 runtime=ctx.spec.runtime, ramp_time=ctx.spec.ramp_time,
                 target=target_setup(ctx, fg_knobs, [fg_sub, bg_sub], list(lay.target)),
                 invariant=_invariant(lay, fg_sub.nqn, bg_sub.nqn, ctx.spec.runtime, ctx.spec.ramp_time,
                                     fg_knobs["iodepth"]),
                 fg_bg_shared_core=unintended_sharing(ctx, lay), fail_reason=fail_reason)


def _perf_knobs(knobs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in knobs.items() if k not in ("app", "resource", "bg_load_pct")}


def _invariant(lay: Layout, fg_nqn: str, bg_nqn: str, runtime: float, ramp_time: float, fg_iodepth: int):
    """fg's commands were served only by fg's reactor, bg's only by bg's; and each reactor served
    exactly the commands its role's load generator sent (measured + ramp + verify) when the load
    generator reports them, else fg's within a loose bound that allows for the ramp."""

    def check(perf: dict[str, dict], delta: dict[str, Any]) -> tuple[bool, str]:
        problems, notes = [], []
        for role, nqn, reactor in (("fg", fg_nqn, lay.fg_reactor), ("bg", bg_nqn, lay.bg_reactor)):
            if role not in perf:
                continue
            served = namespace_commands(delta, nqn)
            elsewhere = {r: n for r, n in served.items() if r != reactor}
            if elsewhere:
                problems.append(f"{role} commands served by reactors {elsewhere}, intended only reactor {reactor}")
            completed = measured_ios(perf[role])
            sent = sent_ios(perf[role])
            on_reactor = served.get(reactor, 0)
            if sent is not None:  # exact: every command the role sent was served once, on its reactor
                expected = sent["measured"] + sent["ramp"] + sent["verified"]
                equation = (f"{sent['measured']} measured + {sent['ramp']} ramp"
                            + (f" + {sent['verified']} verify" if sent["verified"] else ""))
                if on_reactor != expected:
                    problems.append(f"{role}: reactor {reactor} served {on_reactor} commands, expected exactly "
                                    f"{expected} = {equation} (exact: the load generator reports its ramp I/O)")
                else:
                    notes.append(f"{role}: reactor {reactor} served {on_reactor} commands = {equation} "
                                 "(exact)")
                continue
            notes.append(f"{role}: {on_reactor} commands on reactor {reactor}, {completed} completed after ramp")
            if role == "fg":
                # Without the ramp count the ramp may run faster than the measured phase (the
                # background is still starting): allow it at up to 3x, plus one queue.
                ceiling = completed * (runtime + 3 * ramp_time) / runtime + fg_iodepth
                if on_reactor < completed or on_reactor > ceiling:
                    problems.append(f"fg: reactor {reactor} served {on_reactor} commands, expected "
                                    f"{completed}..{int(ceiling)} (completions + ramp, loose: the load "
                                    "generator did not report its ramp I/O)")
                else:
                    notes[-1] += f" (within {completed}..{int(ceiling)}, loose: no ramp count reported)"
        return (not problems, "; ".join(problems or notes))

    return check


def measured_ios(report: dict[str, Any]) -> int:
    """I/Os completed in the measured phase (fio's jobs[i].read/write.total_ios)."""
    return int(sum((j.get(d) or {}).get("total_ios", 0) for j in report.get("jobs", []) for d in ("read", "write")))


def ramp_ios(report: dict[str, Any]) -> int | None:
    """I/Os a load generator sent during its ramp (`nvmflab.jobs[i].ramp_ios`: completed during the
    ramp or, in flight at its end, after it; never in total_ios), None if unreported."""
    jobs = (report.get("nvmflab") or {}).get("jobs") or []
    counts = [j.get("ramp_ios") for j in jobs if isinstance(j, dict)]
    if not counts or any(c is None for c in counts):
        return None
    return int(sum(counts))


def sent_ios(report: dict[str, Any]) -> dict[str, int] | None:
    """Every I/O command a load generator sent, by phase, when it reports its ramp; else None."""
    ramp = ramp_ios(report)
    if ramp is None:
        return None
    jobs = (report.get("nvmflab") or {}).get("jobs") or []
    verified = int(sum(j.get("verified_ios") or 0 for j in jobs if isinstance(j, dict)))
    return {"measured": measured_ios(report), "ramp": ramp, "verified": verified}
