"""The polling study's `matrix_rx` leg (issue 22 item 9, the thesis's Table 3.3 second axis: where
network receive processing runs): the matrix's cells (completion × target_mode at QD1 and
high_iodepth) for each receive steering mode (`topology/rx_steering.py`: off, rps, rfs), all over
one netns veth pair so that only the steering differs between modes. Every mode of a cell runs in
the same round (repeat outermost); each point sets its mode in `prepare`, and the queues and the
host-wide flow table are restored after the leg.

Knobs: `rx_steering`, `rps_cores` (the cores rps hands packets to, physical), `rps_on_role_core`
(rps's core is the host's or the target's own: on a small machine there is no other), `link`.
Needs a local topology and root (a namespace); elsewhere the leg's points are stored skipped with
the reason."""

from __future__ import annotations

from typing import Any

from ..plan import Point
from ..topology import netns
from ..topology.rx_steering import RxSteering, SteeringError
from .common import Context, point_knobs, tcp_point

LEG = "matrix_rx"
LINK = "netns veth"


def rps_cores(ctx: Context, asked: list[int]) -> tuple[list[int], bool]:
    """Physical cores for rps: the asked logical ones, else the first core neither the host's nor
    the target's; on a machine with none to spare, the target's first core. Also whether that core
    is one of the roles' own."""
    topo = ctx.spec.topology
    taken = set(ctx.phys(topo.host_cores)) | set(ctx.target_phys(topo.target_cores))
    if asked:
        cores = list(dict.fromkeys(ctx.phys(asked)))
    else:
        spare = [c for c in ctx.cores if c not in taken]
        cores = spare[:1] or list(ctx.target_phys(topo.target_cores[:1]))
    return cores, bool(set(cores) & taken)


def run_leg(ctx: Context, tapp: dict[str, Any], modes: list[str], asked_cores: list[int], iodepths: list[int],
            compare_by, metric) -> None:
    cores, on_role = rps_cores(ctx, asked_cores)
    cells = [{"completion": c, "target_mode": m, "iodepth": qd}
             for c in ("event", "poll") for m in ("event", "poll") for qd in iodepths]
    extra = {"rps_cores": ",".join(f"cpu{c}" for c in cores), "rps_on_role_core": on_role, "link": LINK}

    def points(namespace: str | None, address: str | None, steering: RxSteering | None,
               skip: str | None = None) -> list[Point]:
        out = []
        for repeat in range(ctx.spec.repeats):  # every mode of every cell once per round
            for cell in cells:
                for mode in modes:
                    knobs = point_knobs(ctx, tapp | cell) | extra | {"rx_steering": mode}
                    prepare = (lambda m=mode: steering.set(m, cores)) if steering is not None else None
                    out.append(tcp_point(ctx, LEG, knobs, repeat, netns=namespace, listen_ip=address,
                                         prepare=prepare, skip_reason=skip))
        return out

    def run(chosen: list[Point]) -> None:
        ctx.run(chosen, f"polling: {LEG}", compare_by=compare_by, metric=metric)

    if ctx.planning:
        return run(points("nvmflab-PID", netns.TARGET_IP, None))
    reason = ("needs a local topology (a veth pair on this machine)" if ctx.spec.topology.kind != "local"
              else netns.unavailable())
    if reason:
        return run(points(None, None, None, f"receive steering not measured: {reason}"))
    steering = None
    try:
        with netns.EmulatedLink(0, None) as link:
            steering = RxSteering(link.host_if, link.target_if, link.netns, list(ctx.cores))
            try:
                run(points(link.netns, link.target_ip, steering))
            finally:
                ctx.runner.close()  # the target lives in the namespace: stop it before the namespace goes
                steering.restore()
    except (netns.NetnsError, SteeringError) as err:
        if steering is None:
            ctx.console_note(f"polling: {LEG} not measured ({err})")
            run(points(None, None, None, f"receive steering not measured: {err}"))
        else:
            raise
