"""`contention` (the end-host contention report): storage apps beside iperf3 network apps.

The storage host is the network apps' sender (iperf3 client) and the target host their receiver
(iperf3 server), as in the source. Apps: the T-app (sequential read, 128 KiB, QD4) and the L-app
(sequential read, 4 KiB, QD1), one job each on the first host core, served by the first target
core. Legs:
- `isolated`: each storage app alone, and `flows` iperf3 flows alone for every count;
- `same_core`: a storage app with N flows whose clients run on the storage app's host core and
  whose servers run on the target core serving it;
- `different_core`: the same with flow i on host core i+1 and target core i+1 (logical cores,
  wrapping on small machines; the knob `net_shares_storage_core` says when they coincide).
- `many_apps` (when `storage_apps` is not empty): 1..8 storage apps of one kind, each its own load
  generator (roles `main`, `lg1`, ...), with one network app and without it. T-apps run one per
  host core (one-to-one, wrapping on small machines: knob `apps_share_cores`), L-apps all on the
  first host core; the network app (one flow) shares the first host core and the first target core
  with the `main` app, as in the source's "multiple T-apps (L-apps) and a network app".
Each point with flows stores a companion point (same leg, knob `part = "network"`): one row per
flow (role bg, engine iperf3, bw_bytes, mean RTT as lat_mean_ns, the client's CPU share) and one
row per core the experiment uses (engine `cpu:host:<core>` or `cpu:target:<core>`, usr_cpu and
sys_cpu: % of that core busy from /proc/stat over the flows' lifetime). The flows start just before
the storage point's target and last ramp_time + runtime + `flow_slack_s`.
Where iperf3 is missing on either host, points with flows are stored skipped with that reason.
iperf3 traffic goes only to the target host's data address (127.0.0.1 on a local topology).
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import replace
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..plan import Point, generator_roles, point_key
from ..store import now
from ..topology.base import Host, HostError, HostProcess
from .common import Context, point_knobs
from .placing import placed_point

APPS = {"T-app": {"rw": "read", "bs": 128 << 10, "iodepth": 4},
        "L-app": {"rw": "read", "bs": 4096, "iodepth": 1}}
PLACEMENTS = {"same": "same_core", "different": "different_core"}


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")
    apps: list[Literal["T-app", "L-app"]] = Field(default=["T-app", "L-app"], min_length=1)
    flows: list[int] = Field(default=[1, 2, 3, 4], min_length=1)
    placements: list[Literal["same", "different"]] = Field(default=["same", "different"], min_length=1)
    flow_slack_s: float = Field(default=1.5, ge=0)
    # storage apps run together beside one network app (leg many_apps); [] leaves the leg out
    storage_apps: list[Annotated[int, Field(ge=1, le=64)]] = [1, 2, 4, 8]


def execute(ctx: Context, params: Params) -> None:
    missing = None if ctx.planning else iperf3_missing(ctx)
    if missing:
        ctx.console_note(f"contention: network apps skipped: {missing}")
    storage_host = ctx.phys(ctx.spec.topology.host_cores[:1])
    storage_target = ctx.target_phys(ctx.spec.topology.target_cores[:1])

    def app_knobs(app: str | None, flows: int, placement: str | None) -> dict[str, Any]:
        base = APPS[app] if app else APPS["L-app"]
        knobs = point_knobs(ctx, base | {"numjobs": 1, "app": app or "net"})
        return knobs | {"net_flows": flows, "placement": placement or "none", "part": "storage"}

    # Alone and together side by side: per round, the storage apps alone, the flows alone and every
    # placement's storage app with its flows (repeat outermost, so a slow phase lands on all).
    runs = []
    for r in range(ctx.spec.repeats):
        for app in params.apps:
            knobs = app_knobs(app, 0, None)
            runs.append(("isolated", knobs, r, placed_point(ctx, "isolated", knobs, r, storage_host, storage_target),
                         None))
        for n in params.flows:
            runs.append(("isolated", app_knobs(None, n, "none") | {"part": "network"}, r, None,
                         _layout(ctx, n, "same")))
        for placement in params.placements:
            leg = PLACEMENTS[placement]
            for app in params.apps:
                for n in params.flows:
                    layout = _layout(ctx, n, placement)
                    knobs = app_knobs(app, n, placement) | {"net_shares_storage_core": layout["shares"]}
                    point = placed_point(ctx, leg, knobs, r, storage_host, storage_target,
                                         skip_reason=f"network apps skipped: {missing}" if missing else None)
                    runs.append((leg, knobs, r, point, layout))
    _run_with_flows(ctx, runs, params, missing, "contention: alone and together")
    if params.storage_apps:
        _many_apps(ctx, params, missing, app_knobs, storage_target)


def _many_apps(ctx: Context, params: Params, missing: str | None, app_knobs, storage_target) -> None:
    """N storage apps together, without and then with one network app on the first app's cores."""
    def knobs_for(app: str, count: int, flows: int) -> dict[str, Any]:
        cores = _app_cores(ctx, app, count)
        placement = "one_to_one" if app == "T-app" else "same"
        return app_knobs(app, flows, placement) | {"storage_apps": count,
                                                   "apps_share_cores": len(set(cores)) < len(cores)}

    def build(knobs: dict[str, Any], repeat: int, skip: str | None = None) -> Point:
        point = placed_point(ctx, "many_apps", knobs, repeat, ctx.phys(ctx.spec.topology.host_cores[:1]),
                             storage_target, skip_reason=skip)
        cores = _app_cores(ctx, knobs["app"], knobs["storage_apps"])
        point.jobs = [replace(point.jobs[0], role=role, cpus=(core,))
                      for role, core in zip(generator_roles(len(cores)), cores)]
        return point

    runs = []
    for r in range(ctx.spec.repeats):  # without and with the network app, in the same rounds
        for app in params.apps:
            for n in params.storage_apps:
                knobs = knobs_for(app, n, 0)
                runs.append(("many_apps", knobs, r, build(knobs, r), None))
                knobs = knobs_for(app, n, 1)
                point = build(knobs, r, f"network apps skipped: {missing}" if missing else None)
                runs.append(("many_apps", knobs, r, point, _layout(ctx, 1, "same")))
    _run_with_flows(ctx, runs, params, missing, "contention: many storage apps, without and with a network app")


def _app_cores(ctx: Context, app: str, count: int) -> list[int]:
    """Physical host core of each storage app: T-apps one per core from the first host core on,
    L-apps all on the first host core."""
    first = ctx.spec.topology.host_cores[0]
    return list(ctx.phys([first + i for i in range(count)] if app == "T-app" else [first] * count))


def _layout(ctx: Context, n: int, placement: str) -> dict[str, Any]:
    """Physical cores of each flow's client (storage host side) and server (target side)."""
    topo = ctx.spec.topology
    h0, t0 = topo.host_cores[0], topo.target_cores[0]
    if placement == "same":
        clients, servers = [h0] * n, [t0] * n
    else:
        clients = [h0 + 1 + i for i in range(n)]
        servers = [t0 + 1 + i for i in range(n)]
    clients_p, servers_p = ctx.phys(clients), ctx.target_phys(servers)
    shares = placement != "same" and (ctx.phys([h0])[0] in clients_p or ctx.target_phys([t0])[0] in servers_p)
    return {"clients": clients_p, "servers": servers_p, "shares": bool(shares),
            "storage_host": ctx.phys([h0])[0], "storage_target": ctx.target_phys([t0])[0]}


def iperf3_missing(ctx: Context) -> str | None:
    hosts = ctx.runner.hosts
    for host in {h.name: h for h in (hosts.target, hosts.initiator(None))}.values():
        try:
            if host.which("iperf3") is None:
                return f"iperf3 not found on {host.name} (Debian: apt-get install iperf3)"
        except HostError as err:
            return str(err)
    return None


def _run_with_flows(ctx: Context, runs: list, params: Params, missing: str | None, description: str) -> None:
    """Runs (leg, knobs, repeat, point, layout), in the given order, through the runner: a point with a
    layout gets its flows started in its `prepare` and their measurements stored as a companion
    point; a point without a layout runs alone. A run without a point is a network-only point."""
    done = ctx.store.done_keys()
    pending: list[Flows] = []
    points = []
    for leg, knobs, repeat, point, layout in runs:
        if layout is None:  # a storage app alone: no flows
            points.append(point)
            continue
        net_knobs = knobs | {"part": "network"}
        net_key = point_key(ctx.study, leg, net_knobs, repeat, ctx.spec.runtime, ctx.spec.ramp_time)
        if point is None:  # network only: the point itself is the network measurement
            point = Point(study=ctx.study, leg=leg, knobs=net_knobs, repeat=repeat, jobs=[], runtime=ctx.spec.runtime,
                          ramp_time=ctx.spec.ramp_time,
                          skip_reason=f"network apps skipped: {missing}" if missing else None)
            wait_inside = True
        else:
            wait_inside = False
        if missing or ctx.planning or (point.key in done and net_key in done):
            if missing and not ctx.planning and net_key not in done and net_key != point.key:
                ctx.store.save_point(ctx.runner.run_id, net_key, ctx.study, leg, net_knobs, repeat, "skipped",
                                     f"network apps skipped: {missing}", [])
            points.append(point)
            continue
        flows = Flows(ctx, layout, ctx.spec.ramp_time + ctx.spec.runtime + (0 if wait_inside else params.flow_slack_s),
                      ctx.spec.ramp_time)
        point.prepare = _chain(pending, flows, point.prepare, wait_inside)
        flows.meta = (net_key, leg, net_knobs, repeat)
        points.append(point)
    try:
        # fixed count: a copied point would replay flows bound to its first repeat
        ctx.run_fixed(points, description)
    finally:
        for flows in pending:
            _store_flows(ctx, flows)


def _chain(pending: list, flows: "Flows", prepare, wait_inside: bool):
    def run() -> None:
        for earlier in pending:  # the previous point's flows end before these start
            earlier.join()
        if prepare:
            prepare()
        if flows not in pending:  # a noisy point run again measures its flows again, stored once
            pending.append(flows)
        flows.start()
        if wait_inside:
            flows.join()
    return run


def _store_flows(ctx: Context, flows: "Flows") -> None:
    flows.join()
    if not flows.started:  # its storage point was stored by an earlier run: nothing measured now
        return
    key, leg, knobs, repeat = flows.meta
    status = "failed" if flows.error else "ok"
    ctx.store.save_point(ctx.runner.run_id, key, ctx.study, leg, knobs, repeat, status, flows.error, flows.rows,
                         started_at=flows.started_at, raw={"iperf3": flows.raw, "cpu": flows.cpu})


class Flows:
    """N iperf3 client→server pairs pinned to their cores, and /proc/stat per core around them."""

    def __init__(self, ctx: Context, layout: dict[str, Any], duration: float, omit: float):
        self.ctx, self.layout = ctx, layout
        self.duration, self.omit = max(1, math.ceil(duration)), int(omit) if omit >= 1 else 0
        self.rows: list[dict[str, Any]] = []
        self.raw: list[Any] = []
        self.cpu: dict[str, Any] = {}
        self.error: str | None = None
        self.started_at = now()
        self.meta: tuple = ()
        self._thread: threading.Thread | None = None
        self._procs: list[HostProcess] = []
        self.started = False

    def start(self) -> None:
        self.join()  # a re-run (noisy point) starts over: only the last measurement is kept
        self.rows, self.raw, self.cpu, self.error, self._procs = [], [], {}, None, []
        self.started, self.started_at = True, now()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        time.sleep(0.6)  # servers listening and clients connected before the storage app starts

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        try:
            self._measure()
        except Exception as err:  # the storage point goes on; the flows' point records why
            self.error = f"{type(err).__name__}: {err}"
        finally:
            for proc in self._procs:
                proc.stop()

    def _measure(self) -> None:
        hosts = self.ctx.runner.hosts
        sender, receiver = hosts.initiator(None), hosts.target
        workdir = self.ctx.store.dir / "work"
        ip = hosts.target.data_ip  # 127.0.0.1 on a local topology
        outputs = []
        servers = []
        for i, core in enumerate(self.layout["servers"]):
            port = receiver.free_port()
            log = workdir / f"iperf3-server-{i}.log"
            argv = [receiver.binary("iperf3"), "-s", "-1", "-B", ip, "-p", str(port)]
            servers.append(receiver.spawn(argv, (core,), log))
            outputs.append(port)
        self._procs += servers
        time.sleep(0.3)
        before = {"host": _proc_stat(sender), "target": _proc_stat(receiver)}
        clients = []
        for i, (core, port) in enumerate(zip(self.layout["clients"], outputs)):
            out = f"{sender.workdir()}/iperf3-{self.meta[0]}-{i}.json"  # iperf3 appends to a logfile
            argv = [sender.binary("iperf3"), "-c", ip, "-p", str(port), "-t", str(self.duration),
                    "-O", str(self.omit), "-J", "--logfile", out]
            sender.run(["rm", "-f", out], check=False, timeout=20)
            log = workdir / f"iperf3-client-{i}.log"
            clients.append((out, sender.spawn(argv, (core,), log)))
        self._procs += [p for _, p in clients]
        problems = []
        for out, proc in clients:
            code, _, _ = proc.wait(self.duration + self.omit + 15)
            if code is None:
                problems.append("an iperf3 client did not finish in time; killed")
        after = {"host": _proc_stat(sender), "target": _proc_stat(receiver)}
        for out, proc in clients:
            try:
                report = json.loads(sender.read_text(out))
            except (HostError, json.JSONDecodeError) as err:
                problems.append(f"iperf3 client wrote no readable report ({err})")
                continue
            self.raw.append(report)
            if report.get("error"):
                problems.append(f"iperf3: {report['error']}")
                continue
            self.rows.append(_flow_row(report))
        cores = {"host": sorted(set(self.layout["clients"]) | {self.layout["storage_host"]}),
                 "target": sorted(set(self.layout["servers"]) | {self.layout["storage_target"]})}
        for side, wanted in cores.items():
            for core in wanted:
                usage = _busy(before[side], after[side], core)
                if usage is not None:
                    self.cpu[f"{side}:{core}"] = usage
                    self.rows.append({"role": "bg", "engine": f"cpu:{side}:{core}", "usr_cpu": usage[0],
                                      "sys_cpu": usage[1]})
        if problems:
            self.error = "; ".join(problems)


def _flow_row(report: dict[str, Any]) -> dict[str, Any]:
    end = report.get("end", {})
    received = end.get("sum_received", {}) or end.get("sum", {})
    streams = [s.get("sender", {}) for s in end.get("streams", [])]
    rtts = [s["mean_rtt"] for s in streams if s.get("mean_rtt")]
    cpu = end.get("cpu_utilization_percent", {})
    seconds = float(received.get("seconds") or 0)
    return {"role": "bg", "engine": "iperf3", "bw_bytes": float(received.get("bits_per_second", 0)) / 8,
            "total_ios": int(received.get("bytes", 0)), "runtime_ms": int(seconds * 1000),
            "lat_mean_ns": float(sum(rtts) / len(rtts) * 1000) if rtts else None,
            "usr_cpu": cpu.get("host_user"), "sys_cpu": cpu.get("host_system")}


def _proc_stat(host: Host) -> dict[int, list[int]]:
    try:
        text = host.read_text("/proc/stat")
    except HostError:
        return {}
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0].startswith("cpu") and parts[0] != "cpu":
            out[int(parts[0][3:])] = [int(v) for v in parts[1:9]]
    return out


def _busy(before: dict[int, list[int]], after: dict[int, list[int]], core: int) -> tuple[float, float] | None:
    """(user %, system % incl. irq and softirq) of one core between two /proc/stat readings."""
    if core not in before or core not in after:
        return None
    delta = [a - b for a, b in zip(after[core], before[core])]
    total = sum(delta)
    if total <= 0:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, _steal = delta
    return (100.0 * (user + nice) / total, 100.0 * (system + irq + softirq) / total)
