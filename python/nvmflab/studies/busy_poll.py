"""`busy-poll` (the ADQ brief): socket busy polling and queue-to-core placement, on vs off, as the
number of target cores grows.

For each N in `target_cores` (reactors), the T-app (4 KiB random read at `iodepth`, QD32) runs
`conns_per_core` connections (queue pairs) per target core, so 3N connections in all:
- `off`: busy_poll_us = 0; one subsystem whose queues the target spreads round robin over its N
  reactors, one load generator with 3N jobs floating over the host cores;
- `on`: busy_poll_us = `busy_poll_us` on target and host sockets, and placement: one subsystem per
  reactor (pinned with `reactor = i`) driven by its own load generator of `conns_per_core` jobs
  pinned to its own host core, so every connection's host thread, socket and reactor stay together
  (what ADQ's queue groups and symmetric steering give); their roles are `main`, `lg1`, ...;
- `busy_only` / `placement_only` (`factors = true`, the default): each of the two changes alone, so
  placement and busy polling are told apart.
A stack that cannot busy-poll (the kernel's nvmet target) gets its `on` points stored skipped with
the stack's own reason. Knobs: `config`, `target_cpus`, `conns` (connections), `link` (the data
path) and `napi_id` (SO_INCOMING_NAPI_ID of a probe connection on it; 0: busy polling is inert). With
our target the analysis reads the NVMe/TCP connections' own NAPI ids from each point's /stats
difference instead (`ports[].napi_ids`); the probe's id stands for targets that report none.

By default (`link = "netns"`) the target runs in a network namespace behind a veth pair whose ends
have GRO asked for and TSO off, so their receive path runs in NAPI and sockets have a NAPI id (on
loopback they never do); each point sets net.core.busy_poll and busy_read to its busy_poll_us (0
when off) and both are restored after the study.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..plan import PerfJob, Point, generator_roles
from ..spec import IoDepth
from ..topology import napi, netns
from ..topology.local import LocalHost
from .common import Context, backend_subsystem, logical, point_knobs, target_setup
from .placing import distinct, perf_knobs, placed_point, stack_refusal


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")
    target_cores: list[int] = Field(default=[1, 2, 3], min_length=1)
    conns_per_core: int = Field(default=3, ge=1, le=64)
    iodepth: IoDepth = 32
    busy_poll_us: int = Field(default=50, gt=0)
    factors: bool = True  # also busy polling alone and placement alone, so the two are told apart
    # "netns": the target behind a veth pair with NAPI (local topology, root); "topology": its own path
    link: Literal["netns", "topology"] = "netns"


def configs(params: Params) -> list[tuple[str, int, bool]]:
    """(name, busy_poll_us, placed) of each configuration measured."""
    out = [("off", 0, False), ("on", params.busy_poll_us, True)]
    if params.factors:
        out += [("busy_only", params.busy_poll_us, False), ("placement_only", 0, True)]
    return out


DESCRIPTION = "busy-poll: configurations × target cores"


def execute(ctx: Context, params: Params) -> None:
    """On a local topology with `link = "netns"` (the default) the target runs in a namespace
    behind a veth pair with NAPI, so busy polling has a device queue to poll; each point sets
    net.core.busy_poll/busy_read to its busy_poll_us (0 when off), and they are restored after.
    Elsewhere, or where no namespace can be made, the topology's own data path is used."""
    if params.link == "topology" or ctx.spec.topology.kind != "local":
        return _run(ctx, _points(ctx, params, {"link": "topology"}))
    if ctx.planning:  # only the points: no namespace is built for a plan
        return _run(ctx, [_on_link(p, "nvmflab-PID", netns.TARGET_IP, None)
                          for p in _points(ctx, params, {"link": NAPI_LINK})])
    reason = netns.unavailable()
    if reason:
        ctx.console_note(f"busy-poll: no veth with NAPI ({reason}): measured on the topology's data path")
        return _run(ctx, _points(ctx, params, {"link": f"topology (netns: {reason})"}))
    sysctls = napi.BusyPollSysctls()
    try:
        with netns.EmulatedLink(0, None, napi=True) as link:
            inside = LocalHost(name="busy-poll target", data_ip=link.target_ip, netns=link.netns)
            path = napi.probe(inside, LocalHost(), link.target_ip)
            if not link.napi:
                ctx.console_note(f"busy-poll: the veth has no NAPI ({link.napi_error}); its NAPI id says so")
            knobs = {"link": NAPI_LINK if link.napi else "netns veth", "napi_id": path.napi_id}
            try:
                _run(ctx, [_on_link(p, link.netns, link.target_ip, sysctls) for p in _points(ctx, params, knobs)])
            finally:
                ctx.runner.close()  # the target lives in the namespace: stop it before the namespace goes
    except netns.NetnsError as err:
        ctx.console_note(f"busy-poll: no veth with NAPI ({err}): measured on the topology's data path")
        _run(ctx, _points(ctx, params, {"link": "topology (netns failed)"}))
    finally:
        sysctls.restore()


NAPI_LINK = "netns veth with NAPI"


def _run(ctx: Context, points: list[Point]) -> None:
    # each target core count is one comparison of the configurations
    ctx.run(points, DESCRIPTION, compare_by=lambda p: p.knobs.get("target_cpus"))


def _on_link(point: Point, namespace: str, address: str, sysctls: "napi.BusyPollSysctls | None") -> Point:
    """The point with its target in the namespace at `address`, setting the busy-poll sysctls to its
    own value."""
    point.target = replace(point.target, netns=namespace, listen_ip=address)
    busy = int(point.knobs.get("busy_poll_us") or 0)
    point.prepare = (lambda: sysctls.set(busy)) if sysctls is not None else None
    return point


def _points(ctx: Context, params: Params, link_knobs: dict) -> list[Point]:
    """Every configuration × target core count, interleaved (repeat outermost)."""
    points: list[Point] = []
    for repeat in range(ctx.spec.repeats):  # interleaved: every configuration once per round
        for n in params.target_cores:
            targets, hosts = cores_for(ctx, n)
            target_cpus, host_cpus = distinct(ctx.target_phys(targets)), distinct(ctx.phys(hosts))
            for name, busy, placed in configs(params):
                conns = n * params.conns_per_core
                knobs = point_knobs(ctx, {"rw": "randread", "bs": 4096, "iodepth": params.iodepth,
                                          "numjobs": conns, "io_queues": conns, "busy_poll_us": busy})
                knobs |= {"config": name, "target_cpus": n, "conns": conns, "placement": placed,
                          "host_cpus": len(host_cpus), "shares_host_cores": bool(set(target_cpus) & set(host_cpus))}
                knobs |= link_knobs
                reason = stack_refusal(ctx, knobs) if busy else None
                if len(target_cpus) < n and reason is None:
                    reason = f"{n} target cores asked, this machine has {len(target_cpus)} to give"
                if placed:
                    points.append(_placed(ctx, knobs, repeat, n, targets, hosts, params, reason))
                else:
                    points.append(placed_point(ctx, name, knobs, repeat, host_cpus, target_cpus, skip_reason=reason))
    return points


def cores_for(ctx: Context, n: int) -> tuple[list[int], list[int]]:
    """Logical target and host cores for N reactors: apart from each other where the machine has
    room, else the target takes the first N cores (sharing some with the host; knob
    `shares_host_cores` says so)."""
    topo = ctx.spec.topology
    targets = logical(topo.target_cores, n, topo.host_cores)
    hosts = logical(topo.host_cores, n, targets)
    if len(distinct(ctx.target_phys(targets))) < n:
        targets = list(range(n))
    if len(distinct(ctx.phys(hosts))) < min(n, len(ctx.cores)):
        hosts = list(range(len(ctx.cores)))[-n:]
    return targets, hosts


def _placed(ctx: Context, knobs: dict, repeat: int, n: int, targets: list[int], hosts: list[int], params: Params,
            reason: str | None) -> Point:
    """One subsystem per reactor, each driven by its own load generator on its own host core."""
    subs = [backend_subsystem(ctx, f"bp{i}", reactor=i) for i in range(n)]
    job_knobs = perf_knobs(knobs) | {"numjobs": params.conns_per_core, "io_queues": params.conns_per_core}
    jobs = [PerfJob(role, job_knobs, ctx.phys([hosts[i % len(hosts)]]), nqn=sub.nqn, hostnqn=ctx.spec.stack.hostnqn)
            for i, (role, sub) in enumerate(zip(generator_roles(n), subs))]
    setup = target_setup(ctx, knobs, subs, targets)
    setup = replace(setup, cores=distinct(ctx.target_phys(targets)))
    return Point(study=ctx.study, leg=knobs["config"], knobs=knobs, repeat=repeat, jobs=jobs, runtime=ctx.spec.runtime,
                 ramp_time=ctx.spec.ramp_time, target=setup, skip_reason=reason)
