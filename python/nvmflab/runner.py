"""Executes points: target up, counters and CPU before, load generators, counters and CPU after.

Each point is stored the moment it finishes; points already stored (same key) are skipped, so an
interrupted sweep resumes where it stopped. A failing point is stored with its error and the sweep
goes on. Targets are reused while consecutive points need the same target setup.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from . import counters, netcounters, perfstat, probes, procs, spread, sysstat
from .files import place_file
from .metrics import summarize
from .order import in_round_order
from .plan import PerfJob, Point, TargetSetup
from .progress import Tracker
from .stacks import RunningTarget, Stack, StackError
from .store import ResultsStore, now
from .tools import ToolMissing
from .topology.base import Host, HostError, Hosts, HostProcess
from .topology.local import LocalHost

# Seconds a load generator may take beyond ramp_time + runtime (connect, teardown) before it is killed.
PERF_GRACE_S = 30.0
# After a failed point each remote host must answer `true` within this (twice), or the run ends.
HOST_PROBE_S = 30.0


class HostLost(HostError):
    """A remote host stopped answering during the run (powered off, its network gone): the run
    ends naming it, instead of failing every later point on it; stored points stay (resumable)."""


class PointFailed(Exception):
    pass


@dataclass
class Outcome:
    point: Point
    status: str  # ok | failed | invalid | skipped | stored (done in an earlier run) | planned
    error: str | None = None


class Runner:
    planning = False
    def __init__(self, store: ResultsStore, run_id: int, target_stack: Stack, host_stack: Stack | None = None,
                 hosts: Hosts | None = None, progress: Tracker | None = None, order_seed: int | None = None):
        self.store = store
        self.order_seed = order_seed  # shuffles each round (order.py); None: the order given
        self._link_cache: dict[tuple, dict] = {}  # (machine, host, address, serves only) -> netcounters.link
        self.run_id = run_id
        self.target_stack = target_stack
        self.host_stack = host_stack or target_stack
        self.progress = progress
        self.workdir = store.dir / "work"
        self.workdir.mkdir(exist_ok=True)
        local = LocalHost(workdir=self.workdir)
        self.hosts = hosts or Hosts(local, [local])
        self._target: RunningTarget | None = None
        self._target_stack_name: str | None = None
        self._stacks = {s.name: s for s in (self.target_stack, self.host_stack)}
        self._versions: dict[str, str | None] = {}
        self.noise_limit_pct = sysstat.noise_limit()  # None: noise recorded, never re-run or marked

    def stacks_for(self, point: Point) -> tuple[Stack, Stack]:
        """The point's (target, host) stacks: its knobs name them (`study stacks` mixes pairs)."""
        return (self._stack(point.knobs.get("target_stack"), self.target_stack),
                self._stack(point.knobs.get("host_stack"), self.host_stack))

    def _stack(self, name: str | None, default: Stack) -> Stack:
        if name is None:
            return default
        if name not in self._stacks:
            from .stacks import get_stack

            self._stacks[name] = get_stack(name)
        return self._stacks[name]

    def identity(self, point: Point) -> dict[str, Any]:
        """What defines a point's measurement beyond its key: each side's stack, its version and the
        host it runs on. A stored point is reused only when this is unchanged (`reusable`)."""
        target_stack, host_stack = self.stacks_for(point)
        out: dict[str, Any] = {}
        if point.target is not None:
            host = self._target_host(point.target)
            out["target"] = {"stack": target_stack.name, "version": self._safe_version(target_stack, host),
                             "host": host_identity(host)}
        out["jobs"] = {}
        for job in point.jobs:
            host = self.hosts.initiator(job.host)
            out["jobs"][job.role] = {"stack": host_stack.name, "version": self._safe_version(host_stack, host),
                                     "host": host_identity(host)}
            if job.spread:  # a role on several hosts: each of them defines the measurement
                out["jobs"][job.role]["spread"] = [host_identity(self.hosts.initiator(name)) for name in job.spread]
        return out

    def reusable(self, points: list[Point]) -> set[str]:
        """Keys of the points stored with everything that defines them unchanged (knobs, placement,
        backend and durations are in the key; stacks, versions and hosts in the identity)."""
        stored = self.store.done_identities()
        return {p.key for p in points if p.key in stored
                and (p.target is None and not p.jobs  # a network-only point: its key says it all
                     or stored[p.key] == self._identity_json(p))}

    def _identity_json(self, point: Point) -> dict[str, Any]:
        return json.loads(json.dumps(self.identity(point), sort_keys=True, default=str))

    def _safe_version(self, stack: Stack, host: Host) -> str | None:
        try:
            return self._version(stack, host)
        except Exception:  # a stack missing on the host has no version; the point says why it failed
            self._versions[f"{stack.name}@{host.name}"] = None
            return None

    def run(self, points: list[Point], description: str) -> list[Outcome]:
        points = in_round_order(points, self.order_seed, description)
        done = self.reusable(points)
        leg = self.progress.leg(description, points, done) if self.progress else None
        stored = [p for p in points if p.key in done]
        if leg is not None and stored:
            leg.skip_stored(len(stored))  # reported once, up front: they take no time
        outcomes = []
        for point in points:
            if point.key in done:
                outcomes.append(Outcome(point, "stored"))
                continue
            started = time.monotonic()
            outcome = self.run_point(point)
            outcomes.append(outcome)
            if leg is not None:
                leg.finished(point, outcome.status, outcome.error, time.monotonic() - started)
        return outcomes

    def run_point(self, point: Point) -> Outcome:
        started = now()
        if point.skip_reason or point.fail_reason:
            status, reason = ("skipped", point.skip_reason) if point.skip_reason else ("failed", point.fail_reason)
            self._save(point, status, reason, [], started, None)
            return Outcome(point, status, reason)
        noisy_tries: list[dict[str, Any]] = []
        tries = 1 + (sysstat.NOISE_RETRIES if self.noise_limit_pct is not None else 0)
        for attempt in range(tries):
            raw: dict[str, Any] = {"knobs": point.knobs}
            try:
                measurements, status, detail = self._measure(point, raw)
            except Exception as err:  # whatever breaks one point fails that point; Ctrl-C still ends the sweep
                message = _one_line(err)
                raw["noisy_tries"] = noisy_tries
                self._save(point, "failed", message, [], started, raw)
                self._hosts_answer()
                if self._target is not None and not self._target_alive():
                    self._drop_target()
                return Outcome(point, "failed", message)
            noise = raw.get("noise") or {}
            if not noise.get("noisy") or attempt == tries - 1:
                break
            # Others used the CPUs during it: measure it again (bounded), keeping what was seen.
            noisy_tries.append({k: noise.get(k) for k in ("outside_cpu_s", "steal_s", "noise_pct", "throttle_events")})
        raw["noisy_tries"] = noisy_tries
        for row in measurements:
            row["noise_tries"] = attempt + 1
        self._save(point, status, detail, measurements, started, raw)
        return Outcome(point, status, detail)

    def _target_alive(self) -> bool:
        try:
            return self._target.alive()
        except (HostError, StackError):  # its host did not answer the question: started again
            return False

    def _hosts_answer(self) -> None:
        """After a failed point: HostLost for a remote host that no longer answers (two tries, a
        loaded machine may miss one). A host that answers lets the sweep go on to the next point."""
        for host in self.hosts.all():
            if not host.remote:
                continue
            for attempt in range(2):
                try:
                    host.run(["true"], timeout=HOST_PROBE_S)
                    break
                except HostError as err:
                    if attempt == 1:
                        raise HostLost(f"{host.name} stopped answering during the run ({_one_line(err)}); the "
                                       "points measured before are stored: once it is back, run the same command "
                                       "again to resume") from None

    def close(self) -> None:
        """Stop the target and every load generator; the hosts stay open (the session closes them)."""
        self._drop_target()
        procs.stop_all()

    # -- one point ---------------------------------------------------------------------------

    def _measure(self, point: Point, raw: dict[str, Any]) -> tuple[list[dict[str, Any]], str, str | None]:
        point = self._with_backing_files(point)
        if point.prepare:
            point.prepare()
        target_stack, host_stack = self.stacks_for(point)
        target = self._target_for(point.target, target_stack) if point.target else None
        before = target.stats() if target else None
        cpu_before = target.cpu_seconds() if target else None
        machines = self._machines(point)
        probes_before = probes.take(machines)  # energy and network counters (issue 24)
        sys_before = self._snapshots(machines)
        counting = perfstat.start(machines["local"][1], self.workdir / f"{point.key}-perfstat.csv") \
            if "local" in machines else None  # perf stat software counters on this machine's cores
        try:
            outputs = self._run_perf(point, host_stack, target, raw)
        finally:
            perf_counts = counting.stop() if counting is not None else None
        sys_after = self._snapshots(machines)
        probes_after = probes.take(machines)
        for key, found in self._links(point, machines).items():  # the interface each machine's traffic took
            if key in probes_after:
                netcounters.with_link(probes_after[key].get("net"), found)
        after = target.stats() if target else None
        cpu_after = target.cpu_seconds() if target else None
        noise = self._noise(point, machines, sys_before, sys_after, outputs,
                            None if cpu_before is None or cpu_after is None
                            else (cpu_after[0] - cpu_before[0]) + (cpu_after[1] - cpu_before[1]),
                            {"local": perf_counts} if perf_counts else None)
        raw["noise"] = {k: v for k, v in noise.items() if k != "cpu_cores_json"}
        delta = counters.diff(before, after) if before is not None and after is not None else None
        raw["target_stats_before"], raw["target_stats_after"] = before, after
        versions = {"target_stack_version": self._version(target_stack, self.hosts.target) if target else None}

        invariant_ok, invariant_detail = None, None
        if point.invariant and delta is not None:
            invariant_ok, invariant_detail = point.invariant({r: o["json"] for r, o in outputs.items()}, delta)
        rows = []
        for job in point.jobs:
            output = outputs[job.role]
            row = summarize(output["json"]) | {
                "role": job.role, "knobs": point.knobs | job.knobs,
                "perf_usr_s": output["usr_s"], "perf_sys_s": output["sys_s"],
                "invariant_ok": invariant_ok, "invariant_detail": invariant_detail,
                "host_stack_version": self._version(host_stack, self.hosts.initiator(job.host)),
            } | versions
            if cpu_before is not None and cpu_after is not None:
                row |= {"target_usr_s": cpu_after[0] - cpu_before[0], "target_sys_s": cpu_after[1] - cpu_before[1]}
            if delta is not None:
                row["target_counters_json"] = json.dumps(delta, sort_keys=True)
            row |= noise
            if (point.knobs | job.knobs).get("tls") == "on":  # which layer made the records (issue 37)
                row["host_tls_records"] = _records_read(output) or host_stack.host_tls_records(
                    "\n".join(_text(part["log"]) for part in output.get("parts", []) if "log" in part))
            rows.append(row)
        point_probes = probes.columns(probes_before, probes_after, sum(r.get("total_ios") or 0 for r in rows))
        for row in rows:
            row |= point_probes
        if invariant_ok is False:
            return rows, "invalid", invariant_detail
        lost = outage_text(outputs)
        if lost:  # the load generator rode through a lost connection: not a steady-state measurement
            return rows, "failed", lost
        return rows, "ok", None

    def _run_perf(self, point: Point, host_stack: Stack, target: RunningTarget | None,
                  raw: dict[str, Any]) -> dict[str, Any]:
        """Every load generator of the point; a role spread over several hosts (PerfJob.spread)
        runs one part per host, all released at one moment, and its parts' reports are merged."""
        running: list[tuple[PerfJob, Host, Any, str, Path, HostProcess]] = []
        sessions = []
        parts = {job.role: self.parts(job) for job in point.jobs}
        spread_count = max((len(p) for p in parts.values() if len(p) > 1), default=0)
        at = None
        try:
            # Every session first (copying a binary, `nvme connect`), so the agreed moment of a
            # spread role is set when only the spawns are left to do.
            ready = []
            for job in point.jobs:
                for part in parts[job.role]:
                    host = self.hosts.initiator(part.host)
                    session = host_stack.open_host(part, target, host, self.workdir)
                    sessions.append(session)
                    suffix = f"{job.role}@{host.name}" if len(parts[job.role]) > 1 else job.role
                    output = self._output_path(host, f"{point.key}-{suffix}.json")
                    argv = session.perf_argv(point.runtime, point.ramp_time, output)
                    if len(parts[job.role]) > 1:
                        raw.setdefault("argv", {}).setdefault(job.role, {})[host.name] = argv
                    else:
                        raw.setdefault("argv", {})[job.role] = argv
                    log = self.workdir / f"{point.key}-{suffix}.log"
                    log.unlink(missing_ok=True)
                    ready.append((part, host, session, output, log, argv, len(parts[job.role]) > 1))
            at = spread.start_moment(spread_count) if spread_count else None
            for part, host, session, output, log, argv, spread_part in ready:
                argv = spread.barrier_argv(argv, at) if spread_part else argv
                running.append((part, host, session, output, log, host.spawn(argv, part.cpus, log)))
            results: dict[str, Any] = {}
            for job, host, session, output, log, proc in running:
                timeout = point.ramp_time + point.runtime + PERF_GRACE_S + (spread.lead_s(spread_count) if at else 0)
                code, usr_s, sys_s = proc.wait(timeout)
                argv = raw["argv"][job.role]
                name = argv_name(argv[host.name] if isinstance(argv, dict) else argv)
                where = f"{job.role} on {host.name}" if isinstance(argv, dict) else job.role
                if code is None:
                    raise PointFailed(f"{name} ({where}) still running {timeout:.0f} s after start; killed")
                if code != 0:
                    raise PointFailed(f"{name} ({where}) exited {code}: {_last_line(log)}")
                try:
                    parsed = session.parse_output(host.read_text(output))
                except (HostError, StackError) as err:
                    raise PointFailed(f"{name} ({where}) wrote no readable report: {err}") from None
                results.setdefault(job.role, []).append({"host": host.name, "json": parsed, "usr_s": usr_s,
                                                         "sys_s": sys_s, "log": log})
            return {role: self._merged(role, found, at, raw) for role, found in results.items()}
        finally:
            for *_, proc in running:
                proc.stop()
            for session in sessions:
                session.close()

    def parts(self, job: PerfJob) -> list[PerfJob]:
        """The job as it runs on each of its hosts: itself, or one copy per host of its spread,
        on the same positions among that host's usable cores."""
        if not job.spread:
            return [job]
        first = self.hosts.initiator(job.host).cores
        return [replace(job, host=name, cpus=spread.part_cpus(job.cpus, first, self.hosts.initiator(name).cores))
                for name in job.spread]

    @staticmethod
    def _merged(role: str, found: list[dict[str, Any]], at: float | None, raw: dict[str, Any]) -> dict[str, Any]:
        """A role's output: its only process's, or its parts' merged (spread.merge_reports) with
        their CPU seconds added; each part's report and the start skew go to the raw record."""
        if len(found) == 1:
            only = found[0]
            raw.setdefault("perf", {})[role] = only["json"]
            return {"json": only["json"], "usr_s": only["usr_s"], "sys_s": only["sys_s"], "parts": [only]}
        merged = spread.merge_reports([part["json"] for part in found])
        raw.setdefault("perf", {})[role] = merged
        released = {part["host"]: spread.released_ns(part["json"], _text(part["log"])) for part in found}
        raw.setdefault("spread", {})[role] = {"hosts": [part["host"] for part in found],
                                              "parts": {part["host"]: part["json"] for part in found},
                                              "start": spread.start_record(at, released)}

        def total(name: str) -> float | None:
            values = [part[name] for part in found]
            return None if any(v is None for v in values) else sum(values)

        return {"json": merged, "usr_s": total("usr_s"), "sys_s": total("sys_s"), "parts": found}

    # -- noise (sysstat.py) -------------------------------------------------------------------

    def _machines(self, point: Point) -> dict[str, tuple[Host, list[int] | None]]:
        """Each machine the point runs on, with the cores its processes are pinned to (None = any)."""
        out: dict[str, tuple[Host, list[int] | None]] = {}

        def add(host: Host, cores) -> None:
            key = sysstat.machine_key(host)
            if key not in out:
                out[key] = (host, sorted(set(cores)) if cores else None)
                return
            first, have = out[key]
            out[key] = (first, None if have is None or not cores else sorted(set(have) | set(cores)))

        for job in point.jobs:
            for part in self.parts(job):
                add(self.hosts.initiator(part.host), part.cpus)
        if point.target:
            add(self._target_host(point.target), point.target.cores)
        return out

    def _links(self, point: Point, machines: dict[str, tuple[Host, list[int] | None]]) -> dict[str, dict | None]:
        """Per machine, the interface the point's traffic to its target takes (netcounters.link):
        lo on loopback, the leg's veth on a netns leg, the data NIC on SSH hosts; looked up once."""
        if point.target is None:
            return {key: netcounters.NO_NETWORK for key in machines}
        target_host = self._target_host(point.target)
        loaders = {sysstat.machine_key(self.hosts.initiator(part.host))
                   for job in point.jobs for part in self.parts(job)}
        out = {}
        for key, (host, _) in machines.items():
            serves_only = key not in loaders
            asked = (key, target_host.name if serves_only else host.name, point.target.listen_ip, serves_only)
            if asked not in self._link_cache:
                found = netcounters.link(target_host if serves_only else host, point.target.listen_ip, serves_only,
                                         bool(point.target.netns))
                if found is None:
                    out[key] = None
                    continue  # not kept: asked again at the next point
                self._link_cache[asked] = found
            out[key] = self._link_cache[asked]
        return out

    def _snapshots(self, machines: dict[str, tuple[Host, list[int] | None]]) -> dict[str, sysstat.Snapshot]:
        """A snapshot per machine; a machine that cannot be read is left out (its noise is unknown)."""
        out = {}
        for key, (host, cores) in machines.items():
            try:
                out[key] = sysstat.snapshot(host, cores)
            except (HostError, OSError, ValueError):
                continue
        return out

    def _noise(self, point: Point, machines, before: dict[str, sysstat.Snapshot], after: dict[str, sysstat.Snapshot],
               outputs: dict[str, Any], target_cpu_s: float | None,
               perf: dict[str, dict] | None = None) -> dict[str, Any]:
        experiment = {key: 0.0 for key in machines}
        for job in point.jobs:
            for part in outputs[job.role]["parts"]:
                key = sysstat.machine_key(self.hosts.initiator(part["host"]))
                experiment[key] += (part["usr_s"] or 0.0) + (part["sys_s"] or 0.0)
        if point.target and target_cpu_s is not None:
            experiment[sysstat.machine_key(self._target_host(point.target))] += max(0.0, target_cpu_s)
        try:
            windows = {key: sysstat.window(before[key], after[key], machines[key][1], experiment[key])
                       for key in machines if key in before and key in after}
            roles: dict[str, dict[str, list[int]]] = {}
            for job in point.jobs:
                for part in self.parts(job):
                    key = sysstat.machine_key(self.hosts.initiator(part.host))
                    roles.setdefault(key, {})[job.role] = sorted(part.cpus)
            if point.target:
                roles.setdefault(sysstat.machine_key(self._target_host(point.target)), {})["target"] = \
                    sorted(point.target.cores)
            return sysstat.summarize(windows, self.noise_limit_pct, roles, perf) if windows else {}
        except (KeyError, ValueError, ZeroDivisionError):  # unreadable noise must not cost the measurement
            return {}

    def _output_path(self, host: Host, name: str) -> str:
        if host.remote:
            return f"{host.workdir()}/{name}"
        path = self.workdir / name
        path.unlink(missing_ok=True)
        return str(path)

    def _version(self, stack: Stack, host: Host) -> str | None:
        key = f"{stack.name}@{host.name}"
        if key not in self._versions:
            self._versions[key] = stack.version(host)
        return self._versions[key]

    def _target_for(self, setup: TargetSetup, stack: Stack) -> RunningTarget:
        if self._target is not None and (self._target.setup != setup or self._target_stack_name != stack.name
                                         or not self._target.alive()):
            self._drop_target()
        if self._target is None:
            self._target = stack.start_target(setup, self._target_host(setup), self.workdir)
            self._target_stack_name = stack.name
        return self._target

    def _with_backing_files(self, point: Point) -> Point:
        """The point with each backing file made on the host that opens it: a file namespace's on
        the target host, a local job's on its initiator (paths as they are there)."""
        work = self.store.dir / "work"
        target = point.target
        if target is not None and any(s.backend == "file" and s.path for s in target.subsystems):
            host = self._target_host(target)
            target = replace(target, subsystems=tuple(
                replace(s, path=place_file(host, s.path, s.size, work)) if s.backend == "file" and s.path else s
                for s in target.subsystems))
        jobs = [replace(job, local_path=place_file(self.hosts.initiator(job.host), job.local_path,
                                                   job.local_file_size, work))
                if job.local_path and job.local_file_size else job for job in point.jobs]
        return replace(point, target=target, jobs=jobs)

    def _target_host(self, setup: TargetSetup) -> Host:
        if setup.netns:  # a leg that built its own namespace on this machine
            return LocalHost(name=f"netns {setup.netns}", data_ip=setup.listen_ip, netns=setup.netns,
                             workdir=self.workdir)
        return self.hosts.target

    def _drop_target(self) -> None:
        if self._target is not None:
            target, self._target = self._target, None
            target.stop()

    def _save(self, point: Point, status: str, error: str | None, measurements: list[dict[str, Any]],
              started: str, raw: dict[str, Any] | None) -> None:
        self.store.save_point(self.run_id, point.key, point.study, point.leg, point.knobs, point.repeat, status,
                              error, measurements, fg_bg_shared_core=point.fg_bg_shared_core,
                              started_at=started, raw=raw, identity=self._identity_json(point))


class PlanningRunner(Runner):
    """Collects the points a study would run instead of running them (`--plan`, the knob check)."""

    planning = True

    def __init__(self, store: ResultsStore, target_stack: Stack, host_stack: Stack, hosts: Hosts,
                 order_seed: int | None = None):
        super().__init__(store, 0, target_stack, host_stack, hosts, order_seed=order_seed)
        self.planned: list[tuple[str, Point]] = []

    def run(self, points: list[Point], description: str) -> list[Outcome]:
        points = in_round_order(points, self.order_seed, description)
        self.planned += [(description, p) for p in points]
        return [Outcome(p, "planned") for p in points]

    def close(self) -> None:
        pass


def host_identity(host: Host) -> dict[str, Any]:
    """A host as far as a measurement depends on it: its name, data address and SSH entry."""
    entry = getattr(host, "entry", None)
    return {"name": "netns" if getattr(host, "netns", None) else host.name,  # namespaces are named per run
            "data_ip": host.data_ip,
            "ssh": None if entry is None else {"ssh": entry.ssh, "user": entry.user, "port": entry.port}}


def outage_text(outputs: dict[str, Any]) -> str | None:
    """'connection lost ...' when a load generator reported outages (nvmf-perf's nvmflab.outages:
    it reconnected and retried), else None."""
    seen = []
    for role, output in outputs.items():
        for outage in ((output.get("json") or {}).get("nvmflab") or {}).get("outages") or []:
            seen.append(f"{role}: {outage.get('duration_ms')} ms ({outage.get('cause')})")
    if not seen:
        return None
    return f"connection lost and re-established during the run ({'; '.join(seen)}); a re-run measures it again"


def _records_read(output: dict[str, Any]) -> str | None:
    """The TLS record layer a host session read for itself (the kernel's, from tls_stat over its
    connect), as its parsed report carries it; None where none did."""
    read = {str(found) for part in output.get("parts", []) if isinstance(part.get("json"), dict)
            for found in [part["json"].get("nvmflab", {}).get("tls_records")] if found}
    return " / ".join(sorted(read)) or None


def _text(path: Path) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def _one_line(err: Exception) -> str:
    """The error as one line; unexpected kinds (KeyError from a malformed report…) carry their type."""
    text = " ".join(str(err).split())
    if isinstance(err, (PointFailed, StackError, ToolMissing, HostError)):
        return text
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def argv_name(argv: list[str]) -> str:
    return Path(argv[0]).name if argv else "load generator"


def _last_line(path: Path) -> str:
    """The line of a load generator's log that says why it failed (stacks.base.error_line)."""
    from .stacks.base import error_line

    return error_line(Path(path).read_text(errors="replace") if Path(path).exists() else "")


def make_progress() -> Tracker:
    """Bars on a terminal, one line per point elsewhere (progress.py)."""
    return Tracker()
