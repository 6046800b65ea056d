"""`transports` (the commodity-networks paper, Table 3 and Figs. 3, 4, 6-10): NVMe/TCP against NVMe over
RDMA, and NVMe/TCP with TLS, for every stack that has them.

Each stack runs as its own target and host (ours/ours, kernel/kernel, spdk/spdk), and each mixed
pair of `pairs` ("TARGET/HOST", e.g. "ours/kernel": our target, the kernel host; knob `stack` is
that label) beside them, in each configuration of `configs`:
- `tcp`: NVMe/TCP; `tls`: NVMe/TCP over TLS 1.3 (knob `tls = "on"`; ours only, the other stacks'
  points are stored skipped with their reason); `rdma`: NVMe over RDMA (knob `transport = "rdma"`).
  An RDMA point runs only where both hosts have an RDMA device with a port up and the stack side
  has RDMA (topology/rdma.py); elsewhere, this machine included, it is stored skipped with the
  reason and the study is TCP against TCP+TLS.

Apps, as in the paper: the L-app (4 KiB random read at QD1: mean, p99 and the latency CDF), the
T-app (4 KiB random read over `iodepth`), the B-app (random read over the sizes `bs` at
`bapp_iodepth`) and the `cores` leg (4 KiB random read at `cores_iodepth`, N host jobs against N
target reactors, for N in `cores`: the cores each configuration needs to saturate). Every point
stores the per-core CPU of both sides (CPU per I/O on host and target cores).

The link: every app runs on the topology's data path (loopback on a local one). With `rates`, the
target also runs in a network namespace behind a veth pair shaped by `tc` (netem `rate`), once per
rate × `mtus` entry, with the apps of `link_apps`; RDMA points there are skipped (no RDMA device
on the veth). Rounds are interleaved with the repeat outermost within each link: round r measures
every stack, configuration and app once before round r + 1, so every comparison at one link is side
by side; the links themselves run one after the other.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..plan import Point
from ..spec import STACK_NAMES, IoDepth, Size, StackName
from ..stacks import Stack, get_stack
from ..topology import netns, rdma
from .common import Context, logical
from .placing import distinct, placed_point
from .stacks import pair_knobs, unavailable

CONFIGS = {"tcp": {"transport": "tcp", "tls": "off"}, "tls": {"transport": "tcp", "tls": "on"},
           "rdma": {"transport": "rdma", "tls": "off"}}
PATH = "data path"  # the `link` knob of points on the topology's own data path (loopback when local)
NO_RDMA_ON_VETH = "no RDMA device on the namespace's veth (Soft-RoCE on a veth is set up only by tests/rdma)"


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")
    stacks: list[StackName] = Field(default=list(STACK_NAMES), min_length=1)
    pairs: list[str] = Field(default=[], max_length=8)  # mixed "TARGET/HOST" pairs, run beside `stacks`
    configs: list[Literal["tcp", "tls", "rdma"]] = Field(default=["tcp", "tls", "rdma"], min_length=1)
    iodepth: list[IoDepth] = Field(default=[1, 2, 4, 8, 16, 32, 64, 128], min_length=1)
    bs: list[Size] = Field(default=["4k", "16k", "64k", "128k", "256k", "1m"], min_length=1)
    bapp_iodepth: IoDepth = 32
    cores: list[int] = Field(default=[1, 2])  # [] leaves the cores leg out
    cores_iodepth: IoDepth = 32
    # `tc` rates of the netns veth, e.g. "10gbit"; none: no link axis (the topology's path only)
    rates: list[str] = Field(default=[], max_length=8)
    mtus: list[int] = Field(default=[1500], min_length=1, max_length=4)
    link_apps: list[Literal["L-app", "T-app", "B-app"]] = Field(default=["L-app", "B-app"], min_length=1)


    @field_validator("pairs")
    @classmethod
    def _pairs(cls, value: list[str]) -> list[str]:
        for pair in value:
            parts = pair.split("/")
            if len(parts) != 2 or any(p not in STACK_NAMES for p in parts):
                raise ValueError(f"each of pairs must be TARGET/HOST with each one of {', '.join(STACK_NAMES)} "
                                 f"(got {pair!r})")
        return value


def pairs(params: Params) -> list[tuple[str, Stack, Stack]]:
    """(label, target, host): each stack as its own target and host, then the mixed pairs."""
    own = [(name, get_stack(name)) for name in params.stacks]
    mixed = [(pair, *pair.split("/")) for pair in params.pairs]
    return [(name, stack, stack) for name, stack in own] + \
        [(pair, get_stack(target), get_stack(host)) for pair, target, host in mixed]


def apps(params: Params, only: list[str] | None = None) -> list[dict[str, Any]]:
    """The workload of every app point (L-app, T-app per QD, B-app per size), `only` these apps."""
    out = [{"app": "L-app", "rw": "randread", "bs": 4096, "iodepth": 1, "numjobs": 1}]
    out += [{"app": "T-app", "rw": "randread", "bs": 4096, "iodepth": qd, "numjobs": 1} for qd in params.iodepth]
    out += [{"app": "B-app", "rw": "randread", "bs": bs, "iodepth": params.bapp_iodepth, "numjobs": 1}
            for bs in params.bs]
    return [a for a in out if only is None or a["app"] in only]


def links(params: Params) -> list[dict[str, Any]]:
    """The link knobs of each link measured: the topology's path, then every rate × MTU."""
    out = [{"link": PATH, "rate": None, "mtu": None}]
    out += [{"link": f"netns {rate} mtu {mtu}", "rate": rate, "mtu": mtu} for rate in params.rates
            for mtu in params.mtus]
    return out


DESCRIPTION = "transports: stacks × TCP/TLS/RDMA"


def execute(ctx: Context, params: Params) -> None:
    device = rdma_device(ctx) if "rdma" in params.configs else None
    for link in links(params):
        if link["rate"] is None:
            link = link | {"link": f"{PATH} {ctx.listen_ip}"}
            _run(ctx, _device(_points(ctx, params, link, None), device), link)
            continue
        if ctx.planning:
            _run(ctx, _on_veth(_points(ctx, params, link, params.link_apps), "nvmflab-PID", netns.TARGET_IP), link)
            continue
        reason = netns.unavailable() if ctx.spec.topology.kind == "local" else "the topology is not local"
        if reason:
            ctx.console_note(f"transports: no shaped veth for {link['link']} ({reason}): those points are skipped")
            _run(ctx, _skipped(_points(ctx, params, link, params.link_apps), f"no shaped veth: {reason}"), link)
            continue
        try:
            with netns.EmulatedLink(0, link["rate"], mtu=link["mtu"]) as veth:
                knobs = {"emulation": veth.emulation}
                points = [_with(p, knobs) for p in _points(ctx, params, link, params.link_apps)]
                try:
                    _run(ctx, _on_veth(points, veth.netns, veth.target_ip), link)
                finally:
                    ctx.runner.close()  # the target lives in the namespace: stop it before the namespace goes
        except netns.NetnsError as err:
            ctx.console_note(f"transports: {link['link']}: {err}")
            _run(ctx, _skipped(_points(ctx, params, link, params.link_apps), f"netns failed: {err}"), link)


def rdma_device(ctx: Context) -> str:
    """The target host's RDMA devices with a port up, each with its kind (software rxe/siw or a
    NIC), as every RDMA point records it (knob `rdma_device`): Soft-RoCE figures describe a
    software device, and the report says so."""
    if ctx.planning:
        return "(probed at run time)"
    return rdma.summary(rdma.usable(rdma.probe(ctx.runner.hosts.target)[0]))


def _run(ctx: Context, points: list[Point], link: dict[str, Any]) -> None:
    # one comparison per stack, app and size or depth: its configurations side by side
    ctx.run(points, f"{DESCRIPTION} ({link['link']})",
            compare_by=lambda p: (p.knobs.get("stack"), p.knobs.get("app"), p.knobs.get("iodepth"),
                                  p.knobs.get("bs"), p.knobs.get("cores")))


def _points(ctx: Context, params: Params, link: dict[str, Any], only: list[str] | None) -> list[Point]:
    """Every stack × configuration × app (and the cores leg on the topology's path), repeat outermost."""
    topo = ctx.spec.topology
    host1, target1 = distinct(ctx.phys(topo.host_cores[:1])), distinct(ctx.target_phys(topo.target_cores[:1]))
    chosen = pairs(params)
    missing = {label: unavailable(ctx, target, host) for label, target, host in chosen}
    points: list[Point] = []
    for repeat in range(ctx.spec.repeats):  # interleaved: every configuration once per round
        for label, target, host in chosen:
            for config in params.configs:
                skip = missing[label] or (NO_RDMA_ON_VETH if config == "rdma" and link["rate"] is not None
                                          else None)
                for app in apps(params, only):
                    knobs = _knobs(ctx, target, host, label, config, app, link)
                    points.append(placed_point(ctx, f"{label}/{config}", knobs, repeat, host1, target1,
                                               skip_reason=skip))
                if link["rate"] is not None:
                    continue
                for n in params.cores:
                    hosts = logical(topo.host_cores, n, topo.target_cores)
                    targets = logical(topo.target_cores, n, hosts)
                    host_cpus, target_cpus = distinct(ctx.phys(hosts)), distinct(ctx.target_phys(targets))
                    app = {"app": "cores", "rw": "randread", "bs": 4096, "iodepth": params.cores_iodepth,
                           "numjobs": n, "io_queues": n}
                    knobs = _knobs(ctx, target, host, label, config, app, link) | {
                        "cores": n, "host_cpus": len(host_cpus), "target_cpus": len(target_cpus)}
                    points.append(placed_point(ctx, f"{label}/{config}", knobs, repeat, host_cpus, target_cpus,
                                               skip_reason=skip))
    return points


def _knobs(ctx: Context, target: Stack, host: Stack, label: str, config: str, app: dict[str, Any],
           link: dict[str, Any]) -> dict[str, Any]:
    """The app's knobs for one pair (`label`: a stack as its own target and host, or TARGET/HOST):
    the spec's knobs, what each side always does (SPDK polls), the configuration's transport and TLS."""
    knobs = pair_knobs(ctx, target, host, app | CONFIGS[config], modes="spec")
    return knobs | {"stack": label, "config": config, "link": link["link"], "rate": link["rate"],
                    "mtu": link["mtu"]}


def _device(points: list[Point], device: str | None) -> list[Point]:
    for point in points:
        if point.knobs.get("config") == "rdma":
            point.knobs = point.knobs | {"rdma_device": device}
    return points


def _with(point: Point, knobs: dict[str, Any]) -> Point:
    point.knobs = point.knobs | knobs
    return point


def _on_veth(points: list[Point], namespace: str, address: str) -> list[Point]:
    for point in points:
        point.target = replace(point.target, netns=namespace, listen_ip=address)
    return points


def _skipped(points: list[Point], reason: str) -> list[Point]:
    for point in points:
        point.skip_reason = point.skip_reason or reason
    return points
