"""`contention` (the end-host contention report): storage apps beside iperf3 network apps.

The storage host is the network apps' sender (iperf3 client) and the target host their receiver
(iperf3 server), as in the source. Apps: the T-app (sequential read, 128 KiB, QD4) and the L-app
(sequential read, 4 KiB, QD1), one job each on the first host core, served by the first target
core. Legs:
- `isolated`: each storage app alone, and `flows` iperf3 flows alone for every count;
- `same_core`: a storage app with N flows whose clients run on the storage app's host core and
  whose servers run on the target core serving it;
- `different_core`: the same with flow i on host core i+1 and target core i+1 (logical cores,
  wrapping on small machines; on one machine both sides draw from one pool of the cores the
  storage app does not use, see `_layout`);
- `one_per_core` (the source's "one-to-one core mapping", figures 6-8 and 11-12): one network app
  per core, flow i on host core i and target core i, so flow 0 shares the storage app's cores and
  the others have cores of their own. With one flow it is `same_core`, so it starts at two.
  The knob `net_shares_storage_core` says where a placement's flows landed on cores it meant to
  keep apart (the storage app's, each other's, or on one machine the other side's): a small machine
  wraps logical cores. Such points are flagged and kept out of the findings.
- `many_apps` (when `storage_apps` is not empty): 1..8 storage apps of one kind, each its own load
  generator (roles `main`, `lg1`, ...), with one network app and without it. T-apps run one per
  host core (one-to-one, wrapping on small machines: knob `apps_share_cores`), L-apps all on the
  first host core; the network app (one flow) shares the first host core and the first target core
  with the `main` app, as in the source's "multiple T-apps (L-apps) and a network app". Each round
  also measures that network app alone (knob `storage_apps = 0`, `part = "network"`), its baseline
  in the same rounds and layout.
- `lapps_flows` (when `grid_lapps` is not empty): the grid of the source's figures 11-12, N L-apps
  on the first host core beside M network apps one per core (`one_per_core`: flow 0 on the L-apps'
  cores), for every N in `grid_lapps` and M in 0 + `grid_flows`, and the M flows alone in the same
  layout; run in the same rounds as `many_apps`.
Each point with flows stores a companion point (same leg, knob `part = "network"`): one row per
flow (role bg, engine iperf3, bw_bytes, mean RTT as lat_mean_ns, the client's CPU share) and one
row per core the experiment uses (engine `cpu:host:<core>` or `cpu:target:<core>`, usr_cpu and
sys_cpu: % of that core busy from /proc/stat over the flows' lifetime). The flows start just before
the storage point's target and last ramp_time + runtime + `flow_slack_s`. Each flow's throughput is
cut to the storage app's measured window: iperf3 reports every `-i` interval (`flow_interval_s`, by
default a tenth of the runtime within 0.1..1 s), and the row's bw_bytes is the bytes of the
intervals inside [anchor + ramp_time, anchor + ramp_time + runtime], partly covered intervals
weighted by their overlap (`window_rate`). The anchor is the moment the point's `prepare` returns:
the runner then spawns the storage app (it reuses the running target: the same cores and knobs
throughout, so only the study's first point starts one). A network-only point uses the same window
after its own flows start, so alone and beside compare like with like. The interval records are
sender-side; the whole run's receiver-side total stays in raw.
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
from ..sysstat import machine_key
from ..topology.base import Host, HostError, HostProcess
from .common import Context, point_knobs
from .placing import placed_point

APPS = {"T-app": {"rw": "read", "bs": 128 << 10, "iodepth": 4},
        "L-app": {"rw": "read", "bs": 4096, "iodepth": 1}}
GRID = "lapps_flows"
PLACEMENTS = {"same": "same_core", "different": "different_core", "one_per_core": "one_per_core"}


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")
    apps: list[Literal["T-app", "L-app"]] = Field(default=["T-app", "L-app"], min_length=1)
    flows: list[int] = Field(default=[1, 2, 3, 4], min_length=1)
    placements: list[Literal["same", "different", "one_per_core"]] = Field(
        default=["same", "different", "one_per_core"], min_length=1)
    flow_slack_s: float = Field(default=1.5, ge=0)
    flow_interval_s: float = Field(default=0, ge=0, le=60)  # iperf3 -i; 0: runtime / 10 within 0.1..1 s
    # storage apps run together beside one network app (leg many_apps); [] leaves the leg out
    storage_apps: list[Annotated[int, Field(ge=1, le=64)]] = [1, 2, 4, 8]
    # leg lapps_flows (figures 11-12): N L-apps on one core beside M network apps one per core; [] leaves it out
    grid_lapps: list[Annotated[int, Field(ge=1, le=64)]] = [1, 8]
    grid_flows: list[Annotated[int, Field(ge=1, le=16)]] = [1, 2, 3, 4]


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
        for placement in params.placements:  # the flows alone, in each placement's own layout
            for n in _flow_counts(params.flows, placement):
                layout = _layout(ctx, n, placement)
                runs.append(("isolated", app_knobs(None, n, placement) | {"part": "network",
                             "net_shares_storage_core": layout["shares"]}, r, None, layout))
        for placement in params.placements:
            leg = PLACEMENTS[placement]
            for app in params.apps:
                for n in _flow_counts(params.flows, placement):
                    layout = _layout(ctx, n, placement)
                    knobs = app_knobs(app, n, placement) | {"net_shares_storage_core": layout["shares"]}
                    point = placed_point(ctx, leg, knobs, r, storage_host, storage_target,
                                         skip_reason=f"network apps skipped: {missing}" if missing else None)
                    runs.append((leg, knobs, r, point, layout))
    _run_with_flows(ctx, runs, params, missing, "contention: alone and together")
    if params.storage_apps or params.grid_lapps:
        _many_apps(ctx, params, missing, app_knobs, storage_target)


def _flow_counts(flows: list[int], placement: str) -> list[int]:
    """one_per_core with one flow is same_core: it starts at two."""
    return [n for n in flows if placement != "one_per_core" or n > 1]


def _many_apps(ctx: Context, params: Params, missing: str | None, app_knobs, storage_target) -> None:
    """N storage apps together, without and then with one network app on the first app's cores; and
    the grid of N L-apps beside M network apps one per core, in the same rounds."""
    def knobs_for(app: str, count: int, flows: int) -> dict[str, Any]:
        cores = _app_cores(ctx, app, count)
        placement = "one_to_one" if app == "T-app" else "same"
        return app_knobs(app, flows, placement) | {"storage_apps": count,
                                                   "apps_share_cores": len(set(cores)) < len(cores)}

    def build(knobs: dict[str, Any], repeat: int, skip: str | None = None, leg: str = "many_apps") -> Point:
        point = placed_point(ctx, leg, knobs, repeat, ctx.phys(ctx.spec.topology.host_cores[:1]),
                             storage_target, skip_reason=skip)
        cores = _app_cores(ctx, knobs["app"], knobs["storage_apps"])
        point.jobs = [replace(point.jobs[0], role=role, cpus=(core,))
                      for role, core in zip(generator_roles(len(cores)), cores)]
        return point

    skip = f"network apps skipped: {missing}" if missing else None
    runs = []
    for r in range(ctx.spec.repeats):  # without and with the network app, in the same rounds
        if params.storage_apps:  # the network app alone, its baseline, in the same rounds and layout
            layout = _layout(ctx, 1, "same")
            knobs = app_knobs(None, 1, "same") | {"part": "network", "storage_apps": 0,
                                                   "net_shares_storage_core": layout["shares"]}
            runs.append(("many_apps", knobs, r, None, layout))
        for app in params.apps:
            for n in params.storage_apps:
                knobs = knobs_for(app, n, 0)
                runs.append(("many_apps", knobs, r, build(knobs, r), None))
                knobs = knobs_for(app, n, 1)
                runs.append(("many_apps", knobs, r, build(knobs, r, skip), _layout(ctx, 1, "same")))
        for m in params.grid_flows if params.grid_lapps else []:  # M network apps alone, one per core
            layout = _layout(ctx, m, "one_per_core")
            knobs = app_knobs(None, m, "one_per_core") | {"part": "network", "storage_apps": 0,
                                                          "net_shares_storage_core": layout["shares"]}
            runs.append((GRID, knobs, r, None, layout))
        for n in params.grid_lapps:  # N L-apps beside 0..M network apps one per core
            knobs = knobs_for("L-app", n, 0) | {"placement": "one_per_core"}
            runs.append((GRID, knobs, r, build(knobs, r, leg=GRID), None))
            for m in params.grid_flows:
                layout = _layout(ctx, m, "one_per_core")
                knobs = knobs_for("L-app", n, m) | {"placement": "one_per_core",
                                                    "net_shares_storage_core": layout["shares"]}
                runs.append((GRID, knobs, r, build(knobs, r, skip, leg=GRID), layout))
    _run_with_flows(ctx, runs, params, missing,
                    "contention: many storage apps, and L-apps beside network apps one per core")


def _app_cores(ctx: Context, app: str, count: int) -> list[int]:
    """Physical host core of each storage app: T-apps one per core from the first host core on,
    L-apps all on the first host core."""
    first = ctx.spec.topology.host_cores[0]
    return list(ctx.phys([first + i for i in range(count)] if app == "T-app" else [first] * count))


def _layout(ctx: Context, n: int, placement: str) -> dict[str, Any]:
    """Physical cores of each flow's client (storage host side) and server (target side).

    On two machines flow i's cores are logical host core h0 + i and target core t0 + i (one per
    core; + 1 for `different`). On one machine (loopback) both sides draw from one pool, so the
    flows that should have cores of their own take the machine's cores the storage app does not
    use, in order, a client's and a server's each (wrapping when there are too few: flagged)."""
    topo = ctx.spec.topology
    h0, t0 = topo.host_cores[0], topo.target_cores[0]
    storage = (ctx.phys([h0])[0], ctx.target_phys([t0])[0])
    hosts = ctx.runner.hosts
    one_machine = machine_key(hosts.target) == machine_key(hosts.initiator(None))
    first = 1 if placement == "one_per_core" else 0  # one_per_core: flow 0 on the storage app's cores
    if placement == "same":
        clients, servers = [storage[0]] * n, [storage[1]] * n
    elif one_machine:
        pool = [c for c in ctx.cores if c not in storage] or list(storage)
        picks = [pool[k % len(pool)] for k in range(2 * (n - first))]
        clients = [storage[0]] * first + picks[0::2]
        servers = [storage[1]] * first + picks[1::2]
    else:
        shift = 0 if placement == "one_per_core" else 1
        clients = list(ctx.phys([h0 + shift + i for i in range(n)]))
        servers = list(ctx.target_phys([t0 + shift + i for i in range(n)]))
    return {"clients": clients, "servers": servers, "storage_host": storage[0], "storage_target": storage[1],
            "shares": wrapped(placement, clients, servers, storage, one_machine)}


def wrapped(placement: str, clients: list[int], servers: list[int], storage: tuple[int, int],
            one_machine: bool) -> bool:
    """Whether flows landed on cores the placement meant to keep apart: in `different`, every flow
    off the storage app's cores and off each other's; in `one_per_core`, every flow but the first.
    On one machine (loopback) the host's and the target's cores are one pool."""
    if placement == "same":
        return False
    own = range(1 if placement == "one_per_core" else 0, len(clients))
    for i in own:
        others_h = {storage[0]} | {c for j, c in enumerate(clients) if j != i}
        others_t = {storage[1]} | {c for j, c in enumerate(servers) if j != i}
        if one_machine:
            pool = others_h | others_t
            if clients[i] in pool or servers[i] in pool:
                return True
        elif clients[i] in others_h or servers[i] in others_t:
            return True
    return False


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
                      ctx.spec.ramp_time, interval_s(params.flow_interval_s, ctx.spec.runtime))
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
        flows.anchor = time.time()  # the runner spawns the storage app now: its window starts a ramp later
        if wait_inside:
            flows.join()
    return run


def interval_s(given: float, runtime: float) -> float:
    """iperf3's -i period: as given, else a tenth of the runtime within iperf3's 0.1 s and 1 s."""
    return given if given > 0 else min(1.0, max(0.1, round(runtime / 10, 1)))


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

    def __init__(self, ctx: Context, layout: dict[str, Any], duration: float, ramp: float, interval: float = 1.0):
        self.ctx, self.layout = ctx, layout
        # whole seconds: iperf3's -t; the slack past the storage window is cut off by window_rate
        self.duration, self.ramp, self.interval = max(1, math.ceil(duration)), ramp, interval
        self.anchor: float | None = None  # set by the point's prepare: the storage app starts then
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
        self.anchor = None
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
                    "-i", f"{self.interval:g}", "-J", "--logfile", out]
            sender.run(["rm", "-f", out], check=False, timeout=20)
            log = workdir / f"iperf3-client-{i}.log"
            clients.append((out, time.time(), sender.spawn(argv, (core,), log)))
        self._procs += [p for _, _, p in clients]
        problems = []
        for out, _, proc in clients:
            code, _, _ = proc.wait(self.duration + 15)
            if code is None:
                problems.append("an iperf3 client did not finish in time; killed")
        after = {"host": _proc_stat(sender), "target": _proc_stat(receiver)}
        anchor = self.anchor if self.anchor is not None else clients[0][1] + 0.6 if clients else 0.0
        window = (anchor + self.ramp, anchor + self.ramp + self.ctx.spec.runtime)
        for out, spawned, proc in clients:
            try:
                report = json.loads(sender.read_text(out))
            except (HostError, json.JSONDecodeError) as err:
                problems.append(f"iperf3 client wrote no readable report ({err})")
                continue
            if not isinstance(report, dict):
                problems.append("iperf3 client's report is not a JSON object")
                continue
            self.raw.append({"report": report, "spawned": spawned, "window": window})
            if report.get("error"):
                problems.append(f"iperf3: {report['error']}")
                continue
            self.rows.append(_flow_row(report, window_rate(report.get("intervals"), spawned, *window)))
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


def _flow_row(report: dict[str, Any], window: tuple[float, float] | None) -> dict[str, Any]:
    """One flow's row: its throughput over the storage app's window (bytes, seconds) where its
    intervals cover it, else over its whole run (receiver side)."""
    end = report.get("end") if isinstance(report.get("end"), dict) else {}
    received = end.get("sum_received", {}) or end.get("sum", {})
    streams = [s.get("sender", {}) for s in end.get("streams", []) if isinstance(s, dict)]
    rtts = [s["mean_rtt"] for s in streams if isinstance(s.get("mean_rtt"), (int, float))]
    cpu = end.get("cpu_utilization_percent", {})
    if window is not None:
        total, seconds = window
    else:
        total, seconds = _number(received.get("bytes")), _number(received.get("seconds"))
    return {"role": "bg", "engine": "iperf3", "bw_bytes": total / seconds if seconds > 0 else 0.0,
            "total_ios": int(total), "runtime_ms": int(seconds * 1000),
            "lat_mean_ns": float(sum(rtts) / len(rtts) * 1000) if rtts else None,
            "usr_cpu": cpu.get("host_user"), "sys_cpu": cpu.get("host_system")}


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else 0.0


def window_rate(intervals: Any, zero: float, start: float, end: float) -> tuple[float, float] | None:
    """(bytes, seconds) of iperf3 interval records inside [start, end] (absolute times; each
    record's start/end are seconds after `zero`, the client's start), partly covered records
    weighted by their overlap; None when no record overlaps the window (or none is readable)."""
    if not isinstance(intervals, list):
        return None
    total, seconds = 0.0, 0.0
    for record in intervals:
        summed = record.get("sum") if isinstance(record, dict) else None
        if not isinstance(summed, dict) or summed.get("omitted"):
            continue
        fields = [summed.get(k) for k in ("start", "end", "bytes")]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in fields):
            continue  # a record that cannot be read is not counted as zero
        a, b, count = (float(v) for v in fields)
        if b <= a or count < 0:
            continue
        overlap = min(end, zero + b) - max(start, zero + a)
        if overlap > 0:
            total += count * overlap / (b - a)
            seconds += overlap
    return (total, seconds) if seconds > 0 else None


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
