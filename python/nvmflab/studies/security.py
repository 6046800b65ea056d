"""`security`: what encryption and authentication cost (issue 20 item 4).

For every available target stack × host stack pair, each security mode side by side:
- `plain`: neither;
- `dhchap`: DH-HMAC-CHAP on every queue (the knob `dhchap`, DH group `data_dhgroup`);
- `tls`: the TLS 1.3 secure channel with a PSK (the knob `tls`);
- `tls+dhchap`: both, where the pair can do both.

Each mode measures the L-app (4 KiB random read, QD1: mean and p99), the T-app (4 KiB random read
at each of `iodepth`: IOPS), the B-app (`bapp_bs` random read at `bapp_iodepth`: bandwidth), and
the connect app: nvmf-perf `--connects`, where each operation is a whole connect (admin queue and
one I/O queue, TLS handshake and DH-HMAC-CHAP included) and disconnect, so its latency is what a
reconnect storm pays per controller. Connect points run plain, with TLS, with DH-HMAC-CHAP per DH
group of `dhgroups`, and with both. CPU per I/O (per connect for the connect app) on each side's
cores comes from the per-core /proc/stat samples every point records (analysis/cores_used.py).

Rounds are interleaved (repeat loop outermost): round r measures every pair, app and mode before
round r + 1 starts. With `wrong_key = true` each pair also runs one L-app point with DH-HMAC-CHAP
whose host authenticates with a fresh secret the target does not hold (point knob `wrong_key`): it
must be refused, so it is stored failed with the refusal, and the run exits 1 for it. A mode a stack cannot set (the knob map in docs/stacks.md) is stored as skipped
with the stack's reason, as is a connect point whose host is not nvmf-perf (only it has
`--connects`), and every point of a pair that cannot run here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..dhchapkey import DH_GROUPS
from ..plan import Point
from ..spec import STACK_NAMES, IoDepth, Size, StackName
from ..stacks import Stack
from .common import Context, tcp_point
from .stacks import pair_knobs, stack_pairs

DhGroup = Literal["null", "ffdhe2048", "ffdhe3072", "ffdhe4096", "ffdhe6144", "ffdhe8192"]
Mode = Literal["plain", "dhchap", "tls", "tls+dhchap"]
MODES: tuple[str, ...] = ("plain", "dhchap", "tls", "tls+dhchap")
CONNECT_STACK = "ours"  # the host stack whose load generator measures connects (nvmf-perf --connects)


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")
    targets: list[StackName] = Field(default=list(STACK_NAMES), min_length=1)
    hosts: list[StackName] = Field(default=list(STACK_NAMES), min_length=1)
    modes: list[Mode] = Field(default=list(MODES), min_length=1)
    # The modes the data-path apps run in (default: `modes`); the connect app runs every mode of `modes`.
    data_modes: list[Mode] | None = None
    iodepth: list[IoDepth] = Field(default=[32, 128], min_length=1)  # the T-app's queue depths
    bapp_bs: Size = 128 << 10
    bapp_iodepth: IoDepth = 32
    data_dhgroup: DhGroup = "ffdhe2048"  # DH group of the data-path dhchap modes
    dhgroups: list[DhGroup] = Field(default=list(DH_GROUPS), min_length=0)  # connect time per DH group
    connect_iodepth: IoDepth = 32  # the size of the I/O queue each connect creates
    # "spec" (default): the spec's knobs, event-driven where the stack can be, so CPU per I/O is work
    # done rather than a busy loop's time; "poll": both sides poll where they can, as the stacks study.
    polling: Literal["poll", "spec"] = "spec"
    # One DH-HMAC-CHAP L-app point per pair whose host has the wrong secret: checks refusal, measures nothing.
    wrong_key: bool = False


def mode_knobs(mode: str, dhgroup: str) -> dict:
    """The knobs of a security mode (the DH group for its DH-HMAC-CHAP part)."""
    return {"tls": "on" if "tls" in mode else "off", "dhchap": dhgroup if "dhchap" in mode else "off"}


def mode_of(knobs: dict) -> str:
    """A point's security mode, from its knobs (the analysis's label)."""
    tls, dhchap = knobs.get("tls", "off") == "on", knobs.get("dhchap", "off") != "off"
    return {(False, False): "plain", (False, True): "dhchap", (True, False): "tls", (True, True): "tls+dhchap"}[
        (tls, dhchap)]


def apps(params: Params) -> list[dict]:
    """The data-path apps, each measured in every mode."""
    lapp = {"app": "L-app", "rw": "randread", "bs": 4096, "iodepth": 1, "numjobs": 1}
    tapp = [{"app": "T-app", "rw": "randread", "bs": 4096, "iodepth": qd, "numjobs": 1} for qd in params.iodepth]
    bapp = {"app": "B-app", "rw": "randread", "bs": params.bapp_bs, "iodepth": params.bapp_iodepth, "numjobs": 1}
    return [lapp, *tapp, bapp]


def connect_modes(params: Params) -> list[dict]:
    """The connect app's security settings: plain, TLS, DH-HMAC-CHAP per DH group, both (as asked)."""
    out = []
    if "plain" in params.modes:
        out.append(mode_knobs("plain", "off"))
    if "tls" in params.modes:
        out.append(mode_knobs("tls", "off"))
    if "dhchap" in params.modes:
        out += [mode_knobs("dhchap", g) for g in dict.fromkeys(params.dhgroups or [params.data_dhgroup])]
    if "tls+dhchap" in params.modes:
        out.append(mode_knobs("tls+dhchap", params.data_dhgroup))
    return out


def point_settings(params: Params) -> list[dict]:
    """Every (app, security) setting of one pair in one round, data-path apps first."""
    data_modes = params.modes if params.data_modes is None else params.data_modes
    data = [app | mode_knobs(m, params.data_dhgroup) for app in apps(params) for m in data_modes]
    connect = {"app": "connect", "rw": "randread", "bs": 4096, "iodepth": params.connect_iodepth, "numjobs": 1}
    wrong = [apps(params)[0] | mode_knobs("dhchap", params.data_dhgroup) | {"wrong_key": True}] if params.wrong_key \
        else []
    return data + wrong + [connect | k for k in connect_modes(params)]


def execute(ctx: Context, params: Params) -> None:
    pairs, reasons = stack_pairs(ctx, "security", params.targets, params.hosts)
    points: list[Point] = []
    for repeat in range(ctx.spec.repeats):  # interleaved: every pair, app and mode once per round
        for target, host in pairs:
            for setting in point_settings(params):
                points.append(_point(ctx, params, target, host, setting, repeat, reasons[(target.name, host.name)]))
    # Each pair's app (queue depth, block size) is one comparison of its modes.
    ctx.run(points, "security: plain vs DH-HMAC-CHAP vs TLS",
            compare_by=lambda p: (p.leg, p.knobs.get("app"), p.knobs.get("iodepth"), p.knobs.get("bs")))


def _point(ctx: Context, params: Params, target: Stack, host: Stack, setting: dict, repeat: int,
           reason: str | None) -> Point:
    connects = setting["app"] == "connect"
    wrong_key = setting.get("wrong_key", False)
    knobs = pair_knobs(ctx, target, host, {k: v for k, v in setting.items() if k != "wrong_key"}, params.polling)
    if wrong_key:
        knobs["wrong_key"] = True  # the host's secret is not the target's: not a spec knob, added after validation
    if connects:
        knobs["connects"] = True  # nvmf-perf --connects: not a spec knob, so added after validation
        if host.name != CONNECT_STACK and not reason:
            reason = f"connect time is measured by nvmf-perf --connects; the {host.name} host has no such mode"
    return tcp_point(ctx, f"{target.name}/{host.name}", knobs, repeat, skip_reason=reason)
