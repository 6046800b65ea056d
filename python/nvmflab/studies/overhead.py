"""`overhead` (thesis ch. 5): what NVMe/TCP costs over local access, split into software and network.

Legs, each with the L-app (QD1), T-app (iodepth sweep) and B-app (bs × bapp_iodepth) points, all
on a file of the same kind (the directory `file_dir`, e.g. /dev/shm for tmpfs):
- `local`: nvmf-perf --local on the file (no network stack);
- `loopback`: NVMe/TCP over 127.0.0.1 to a target serving that file (software overhead);
- `netns`: NVMe/TCP across a veth pair into a network namespace with netem delay/rate (network
  overhead). Skipped, with the reason stored, where a namespace cannot be created; where netem is
  missing the points record `netns_link = "none"` and the report marks their numbers as a plain veth.

With `device` set (model parameters, `lat=80us,par=32,bw=1GiB`), the B-app also runs against an
SSD-like device: legs `device_loopback` and `device_netns` (those of `device_legs` whose leg runs)
serve our target's `model` backend with those parameters, in the same rounds as the local and file
legs, so fig. 5.3's convergence is measured where a device, not RAM, can be the bottleneck. The
local leg cannot reach the model (it lives in the target), so the analysis compares NVMe/TCP with
the lower of the measured local path and the device's ceiling (analysis/device_model.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from ..plan import Subsystem
from ..spec import IoDepth, Size, check_model
from ..topology import netns
from .common import NQN_PREFIX, Context, interleave, local_point, point_knobs, repeated, tcp_point


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
    # An SSD-like device for the B-app (our target's model backend): None leaves it out.
    device: Annotated[str, AfterValidator(check_model)] | None = None
    device_legs: list[Literal["loopback", "netns"]] = Field(default=["loopback", "netns"], min_length=1)

    @model_validator(mode="after")
    def _device_has_a_leg(self) -> "Params":
        if self.device is not None and not set(self.device_legs) & set(self.legs):
            raise ValueError(f"device_legs {self.device_legs} names no leg of legs {self.legs}: the device "
                             "comparison would run nothing")
        return self


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

    legs = {
        "local": lambda k, r: local_point(ctx, "local", k, r, path, size),
        "loopback": lambda k, r: tcp_point(ctx, "loopback", k, r, subsystem=sub),
    }
    device = _Device(ctx, params, apps, folder, size)
    # Every leg in the same rounds (repeat outermost), so a slow phase of the machine lands on all.
    if "netns" not in params.legs:
        _run_legs(ctx, params, knob_sets, legs, device.loopback())
        return
    link_knobs = {"netns_delay_us": params.netns_delay_us, "netns_rate": params.netns_rate}
    netns_sets = [k | link_knobs for k in knob_sets]
    if ctx.planning:  # only the points: no namespace is built for a plan
        _run_legs(ctx, params, knob_sets, legs, repeated(ctx, netns_sets, lambda k, r: tcp_point(
            ctx, "netns", k, r, subsystem=sub, netns="nvmflab-PID", listen_ip=netns.TARGET_IP))
            + device.loopback() + device.netns(link_knobs, "nvmflab-PID", netns.TARGET_IP))
        return
    reason = netns.unavailable()
    if reason:
        _run_legs(ctx, params, knob_sets, legs, _skipped(ctx, netns_sets, sub, reason)
                  + device.loopback() + device.netns(link_knobs, skip_reason=reason))
        return
    try:
        with netns.EmulatedLink(params.netns_delay_us, params.netns_rate) as link:
            linked_knobs = link_knobs | {"netns_link": link.emulation.split(" (")[0]}
            linked = [k | linked_knobs for k in knob_sets]
            points = repeated(ctx, linked, lambda k, r: tcp_point(
                ctx, "netns", k, r, subsystem=sub, netns=link.netns, listen_ip=link.target_ip))
            points += device.loopback() + device.netns(linked_knobs, link.netns, link.target_ip)
            if link.emulation.startswith("none"):
                ctx.console_note(f"overhead: netns link without emulation: {link.emulation}")
            try:
                _run_legs(ctx, params, knob_sets, legs, points)
            finally:
                ctx.runner.close()  # the target lives in the namespace: stop it before the namespace goes
    except netns.NetnsError as err:
        _run_legs(ctx, params, knob_sets, legs, _skipped(ctx, netns_sets, sub, str(err))
                  + device.loopback() + device.netns(link_knobs, skip_reason=str(err)))


class _Device:
    """The B-app points against the model device (`device`), per leg of `device_legs` that runs;
    none when `device` is unset."""

    def __init__(self, ctx: Context, params: Params, apps: list[dict], folder: Path, size: int) -> None:
        self.ctx, self.params = ctx, params
        self.sub = Subsystem(nqn=f"{NQN_PREFIX}:overhead-device", backend="model", size=size,
                             block_size=ctx.spec.backend.block_size, model=params.device)
        self.knob_sets = [point_knobs(ctx, {"rw": "randread", "numjobs": 1, "backend": "model",
                                            "backend_model": params.device, "file_dir": str(folder)} | a)
                          for a in apps if a["app"] == "B-app"] if params.device is not None else []

    def _wanted(self, leg: str) -> bool:
        return bool(self.knob_sets) and leg in self.params.device_legs and leg in self.params.legs

    def loopback(self) -> list:
        if not self._wanted("loopback"):
            return []
        return repeated(self.ctx, self.knob_sets, lambda k, r: tcp_point(self.ctx, "device_loopback", k, r,
                                                                         subsystem=self.sub))

    def netns(self, link_knobs: dict, namespace: str | None = None, listen_ip: str | None = None,
              skip_reason: str | None = None) -> list:
        if not self._wanted("netns"):
            return []
        return repeated(self.ctx, [k | link_knobs for k in self.knob_sets], lambda k, r: tcp_point(
            self.ctx, "device_netns", k, r, subsystem=self.sub, netns=namespace, listen_ip=listen_ip,
            skip_reason=f"netns leg skipped: {skip_reason}" if skip_reason else None))


def _run_legs(ctx: Context, params: Params, knob_sets: list[dict], builders: dict, netns_points: list) -> None:
    """The local and loopback legs (as asked) and the netns points, interleaved in one run; each
    app and queue depth (or block size) is one comparison across the legs."""
    lists = [repeated(ctx, knob_sets, build) for leg, build in builders.items() if leg in params.legs]
    ctx.run(interleave(*lists, netns_points), "overhead: " + " + ".join(params.legs),
            compare_by=lambda p: (p.knobs["app"], p.knobs["iodepth"], p.knobs["bs"]))


def _skipped(ctx: Context, knob_sets: list[dict], sub, reason: str) -> list:
    return repeated(ctx, knob_sets, lambda k, r: tcp_point(ctx, "netns", k, r, subsystem=sub,
                                                           skip_reason=f"netns leg skipped: {reason}"))
