"""`overhead` (thesis ch. 5): what NVMe/TCP costs over local access, split into software and network.

Legs, each with the L-app (QD1), T-app (iodepth sweep) and B-app (bs × bapp_iodepth) points, all
on a file of the same kind (the directory `file_dir`, e.g. /dev/shm for tmpfs):
- `local`: nvmf-perf --local on the file (no network stack);
- `loopback`: NVMe/TCP over 127.0.0.1 to a target serving that file (software overhead);
- `netns`: NVMe/TCP across a veth pair into a network namespace with netem delay/rate (network
  overhead). Skipped, with the reason stored, where a namespace cannot be created; where netem is
  missing the points record `netns_link = "none"` and the report marks their numbers as a plain veth.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..plan import Subsystem
from ..spec import IoDepth, Size
from ..topology import netns
from .common import NQN_PREFIX, Context, local_point, point_knobs, repeated, tcp_point


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")
    iodepth: list[IoDepth] = Field(default=[1, 2, 4, 8, 16, 32, 64, 128, 256], min_length=1)
    bs: list[Size] = Field(default=["4k", "8k", "16k", "32k", "64k", "128k", "256k", "512k", "1m"], min_length=1)
    bapp_iodepth: list[IoDepth] = Field(default=[1, 4, 16, 32, 64], min_length=1)  # swept per block size
    file_dir: str | None = None  # default: the results directory's work/ folder
    legs: list[Literal["local", "loopback", "netns"]] = Field(default=["local", "loopback", "netns"], min_length=1)
    # Default: a plain veth pair, no delay and no rate cap; set these to emulate a link.
    netns_delay_us: int = Field(default=0, ge=0)
    netns_rate: str | None = None


def execute(ctx: Context, params: Params) -> None:
    folder = Path(params.file_dir) if params.file_dir else ctx.store.dir / "work"
    path = str(folder / "overhead.img")
    size = ctx.spec.backend.size
    apps = [{"app": "L-app", "iodepth": 1, "bs": 4096}]
    apps += [{"app": "T-app", "iodepth": qd, "bs": 4096} for qd in params.iodepth]
    apps += [{"app": "B-app", "iodepth": qd, "bs": bs} for bs in params.bs for qd in params.bapp_iodepth]
    knob_sets = [point_knobs(ctx, {"rw": "randread", "numjobs": 1, "backend": "file", "file_dir": str(folder)} | a)
                 for a in apps]
    sub = Subsystem(nqn=f"{NQN_PREFIX}:overhead", backend="file", size=size, path=path,
                    block_size=ctx.spec.backend.block_size)

    if "local" in params.legs:
        ctx.run(repeated(ctx, knob_sets, lambda k, r: local_point(ctx, "local", k, r, path, size)),
                "overhead: local")
    if "loopback" in params.legs:
        ctx.run(repeated(ctx, knob_sets, lambda k, r: tcp_point(ctx, "loopback", k, r, subsystem=sub)),
                "overhead: loopback")
    if "netns" in params.legs:
        _netns_leg(ctx, params, knob_sets, sub)


def _netns_leg(ctx: Context, params: Params, knob_sets: list[dict], sub) -> None:
    link_knobs = {"netns_delay_us": params.netns_delay_us, "netns_rate": params.netns_rate}
    knob_sets = [k | link_knobs for k in knob_sets]
    if ctx.planning:  # only the points: no namespace is built for a plan
        ctx.run(repeated(ctx, knob_sets, lambda k, r: tcp_point(ctx, "netns", k, r, subsystem=sub, netns="nvmflab-PID",
                                                                listen_ip=netns.TARGET_IP)), "overhead: netns")
        return
    reason = netns.unavailable()
    if reason:
        points = repeated(ctx, knob_sets, lambda k, r: tcp_point(ctx, "netns", k, r, subsystem=sub,
                                                                 skip_reason=f"netns leg skipped: {reason}"))
        ctx.run(points, "overhead: netns (skipped)")
        return
    try:
        with netns.EmulatedLink(params.netns_delay_us, params.netns_rate) as link:
            linked = [k | {"netns_link": link.emulation.split(" (")[0]} for k in knob_sets]
            points = repeated(ctx, linked, lambda k, r: tcp_point(
                ctx, "netns", k, r, subsystem=sub, netns=link.netns, listen_ip=netns.TARGET_IP))
            if link.emulation.startswith("none"):
                ctx.console_note(f"overhead: netns link without emulation: {link.emulation}")
            ctx.run(points, "overhead: netns")
            ctx.runner.close()  # the target lives in the namespace: stop it before the namespace goes
    except netns.NetnsError as err:
        points = repeated(ctx, knob_sets, lambda k, r: tcp_point(ctx, "netns", k, r, subsystem=sub,
                                                                 skip_reason=f"netns leg skipped: {err}"))
        ctx.run(points, "overhead: netns (skipped)")
