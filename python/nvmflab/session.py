"""One invocation of `study` or `run`: open the store, record the run, execute, always clean up.

Before anything runs, the study is planned (its points collected without running them) and every
point's knobs are checked against the target and host stacks, so a knob a stack lacks is refused
up front, naming the knob and the stack. `--plan` prints what each host would run and stops there.
"""

from __future__ import annotations

import json
import shutil
import signal
import sqlite3
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import procs
from .cores import available_cores
from .env import collect
from .order import new_seed
from .plan import Point
from .runner import PlanningRunner, Runner, make_progress
from .spec import Knobs, Spec
from .stacks import Stack, StackError, get_stack
from .store import ResultsStore, StoreError
from .studies import study_module, study_params
from .studies.common import Context
from .tools import ToolMissing
from .topology.base import HostError, Hosts
from .topology.local import LocalHost
from .topology.rdma import TransportCheck


class SessionError(Exception):
    pass


@dataclass
class Summary:
    """What a session ends with: the text to print and the exit code it calls for (0: every point
    ran or was stored; 1: some point failed; 2: nothing could run)."""

    text: str
    code: int = 0
    failed: int = 0  # points of this run stored as failed

    def __str__(self) -> str:
        return self.text


# Spec fields that choose how many times points run, or only describe them: a directory filled by
# one value takes more rounds or another description without mixing different measurements.
SPEC_FIELDS_NOT_COMPARED = ("name", "description", "repeats", "min_repeats", "max_repeats", "ci_within_pct",
                            "quick", "order_seed")


def run_spec(spec: Spec, path: Path, study_name: str, results: Path, quick: bool, plan: bool = False,
             force_mix: bool = False) -> Summary:
    """Run every point of the spec (skipping stored ones); returns a summary and exit code.
    With `plan`, returns every command each host would run instead, running nothing."""
    try:
        target_stack, host_stack = get_stack(spec.stack.target), get_stack(spec.stack.host)
    except StackError as error:
        raise SessionError(str(error)) from None
    spec = with_stack_defaults(spec, target_stack, host_stack)
    if spec.order_seed is None:  # drawn once, so the plan shows the order the run takes; recorded with the run
        spec = spec.model_copy(update={"order_seed": new_seed()})
    if plan and not (Path(results) / ResultsStore.FILENAME).is_file():
        results = Path(tempfile.mkdtemp(prefix="nvmflab-plan-"))  # a plan leaves nothing behind
    hosts = open_hosts(spec, path, Path(results) / "work")
    try:
        return _session(spec, path, study_name, results, quick, plan, force_mix, target_stack, host_stack, hosts)
    except HostError as error:  # a host that cannot be reached while planning: named with the inventory
        raise SessionError(f"{_inventory(spec, path)}: {error}") from None
    finally:
        hosts.close()
        if plan and Path(results).name.startswith("nvmflab-plan-"):
            shutil.rmtree(results, ignore_errors=True)


def _inventory(spec: Spec, path: Path) -> Path:
    if spec.topology.kind == "ssh" and spec.topology.inventory:
        return Path(path).resolve().parent / spec.topology.inventory
    return Path(path)


def _session(spec, path, study_name, results, quick, plan, force_mix, target_stack, host_stack, hosts) -> Summary:
    store = None
    try:
        if spec.topology.kind == "ssh":  # every host logged in at once, not on first use one by one
            from .topology.ssh import login_all

            login_all(hosts)
        check_cores(spec, path, hosts)
        if not plan:
            check_available(target_stack, host_stack, hosts)  # before the results directory is made
        try:
            store = ResultsStore(results)
            if not plan:
                store.lock()  # held until the store closes: one run per results directory
        except StoreError as error:
            raise SessionError(str(error)) from None
        except (OSError, sqlite3.Error) as error:
            raise SessionError(f"{results}: cannot keep results there ({error})") from None
        if not force_mix:
            check_same_spec(store, spec, study_name, results)
        params = study_params(spec.study, spec.params) if spec.study else None
        planner = PlanningRunner(store, target_stack, host_stack, hosts, order_seed=spec.order_seed)
        _study(Context(spec=spec, study=study_name, runner=planner, store=store), params)
        check_points(planner.planned, planner)
        check_capacity(planner.planned, planner, path)
        if plan:
            return Summary(render_plan(planner))
        return _execute(spec, path, study_name, results, quick, params, store, target_stack, host_stack, hosts,
                        [point for _, point in planner.planned])
    finally:
        if store is not None:
            store.close()


def _execute(spec, path, study_name, results, quick, params, store, target_stack, host_stack, hosts,
             planned: list[Point]) -> str:
    env = collect(hosts) | {"spec_effective": spec.model_dump(mode="json"), "quick": quick, "spec_path": str(path),
                       "stacks": {"target": target_stack.name, "host": host_stack.name},
                       "order_seed": spec.order_seed}
    run_id = store.start_run(study_name, Path(path).read_bytes().decode("utf-8", "replace"), env)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with make_progress() as progress:
            runner = Runner(store, run_id, target_stack, host_stack, hosts, progress, order_seed=spec.order_seed)
            reused = runner.reusable(planned)
            # Stored points measured again (another stack version or host) are not done for studies
            # that ask the store directly (contention starts its network apps for them too).
            store.stale = {p.key for p in planned if p.key not in reused} & set(store.done_identities())
            progress.plan(planned, reused)
            try:
                _study(Context(spec=spec, study=study_name, runner=runner, store=store), params)
            finally:
                runner.close()
        store.finish_run(run_id)
    finally:
        signal.signal(signal.SIGTERM, previous)
        procs.stop_all()
    return summarize_run(store.points().query("run_id == @run_id"), study_name, results, len(reused))


def summarize_run(points, study_name: str, results: Path, reused: int) -> Summary:
    """The run's counts by status; the failed points named, each with its error; the exit code."""
    statuses = Counter(points["status"])
    counts = ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())) or "nothing new (all points stored)"
    lines = [f"{study_name}: {counts} in {results}"]
    failed = points[points["status"] == "failed"]
    for row in failed.head(20).itertuples():
        knobs = json.loads(row.knobs_json)
        shown = " ".join(f"{k}={knobs[k]}" for k in ("rw", "bs", "iodepth", "numjobs", "completion", "target_mode",
                                                       "idle_poll_us") if k in knobs)
        lines.append(f"  failed: {row.leg} repeat {row.repeat} {shown}: {row.error}")
    if len(failed) > 20:
        lines.append(f"  ... and {len(failed) - 20} more failed point(s): `nvmflab results show {results}`")
    ran = statuses.get("ok", 0) + statuses.get("invalid", 0)
    if statuses and ran == 0 and reused == 0:
        lines.append(f"{study_name}: nothing could run (every point failed or was skipped)")
        return Summary("\n".join(lines), 2, len(failed))
    return Summary("\n".join(lines), 1 if len(failed) else 0, len(failed))


def _study(ctx: Context, params) -> None:
    if ctx.spec.study:
        study_module(ctx.spec.study).execute(ctx, params)
    else:
        from .studies import sweep

        sweep.execute(ctx)


def with_stack_defaults(spec: Spec, target_stack: Stack, host_stack: Stack) -> Spec:
    """Knobs the spec leaves unset take the value a stack always has (SPDK always polls), so a
    default spec runs on every stack while an explicit contrary value is refused."""
    fixed = target_stack.fixed_defaults("target") | host_stack.fixed_defaults("host")
    unset = {k: v for k, v in fixed.items() if k not in spec.knobs.model_fields_set and k not in spec.sweep}
    if not unset:
        return spec
    return spec.model_copy(update={"knobs": spec.knobs.model_copy(update=unset)})


def open_hosts(spec: Spec, path: Path, workdir: Path) -> Hosts:
    if spec.topology.kind == "local":
        local = LocalHost(workdir=workdir)
        return Hosts(local, [local])
    from .topology import ssh

    try:
        return ssh.open_hosts(spec.topology, Path(path).resolve().parent)
    except HostError as error:
        raise SessionError(str(error)) from None


def check_points(planned: list[tuple[str, Point]], runner: Runner) -> None:
    """Every knob of every point against both of its stacks, then every job and timing; the first
    refusal ends the run before it starts."""
    defaults = Knobs().model_dump()
    points = [point for _, point in planned if not point.skip_reason]

    def knobs(point: Point, target_stack: Stack, host_stack: Stack) -> None:
        if point.target is not None:
            target_stack.check_knobs(point.knobs, "target", defaults)
        for job in point.jobs:
            host_stack.check_knobs(job.knobs, "host", defaults)

    transports = TransportCheck(runner)

    def jobs(point: Point, target_stack: Stack, host_stack: Stack) -> None:
        refusal = transports.refusal(point, target_stack, host_stack)
        if refusal:
            raise StackError(refusal)
        if point.jobs:
            host_stack.check_timing(point.runtime, point.ramp_time)
        for job in point.jobs:
            refusal = host_stack.job_refusal(job)
            if refusal:
                raise StackError(f"the {host_stack.name} host cannot run this job: {refusal}")

    for check in (knobs, jobs):
        for point in points:
            try:
                check(point, *runner.stacks_for(point))
            except StackError as error:
                raise SessionError(f"{point.leg}: {error}; nothing was run") from None


def check_same_spec(store: ResultsStore, spec: Spec, study_name: str, results: Path) -> None:
    """A results directory keeps one spec per study: a run of another spec (other cores, backend,
    stacks, workload, durations, ...) into it is refused, saying what differs."""
    before = store.study_spec(study_name)
    if before is None:
        return
    now = spec.model_dump(mode="json")
    old, new = _flat(before), _flat(now)
    differs = [key for key in sorted(set(old) | set(new))
               if key.split(".")[0] not in SPEC_FIELDS_NOT_COMPARED and old.get(key, _MISSING) != new.get(key, _MISSING)]
    if not differs:
        return
    shown = "; ".join(f"{key} was {_text(old.get(key, _MISSING))}, now {_text(new.get(key, _MISSING))}"
                      for key in differs[:3])
    more = f" (and {len(differs) - 3} more)" if len(differs) > 3 else ""
    raise SessionError(f"{results} holds {study_name} results of another spec: {shown}{more}; give another "
                       "--results, or --force-mix to store these points beside them")


_MISSING = object()


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out |= _flat(item, f"{prefix}.{key}" if prefix else str(key))
        return out
    return {prefix: value}


def _text(value: Any) -> str:
    return "(not set)" if value is _MISSING else json.dumps(value)


# The built-in study specs: written to run on any machine, their core indices wrap on small ones
# (the sharing is recorded: fg_bg_shared_core, apps_share_cores).
BUILT_IN_SPECS = Path(__file__).resolve().parents[2] / "studies"


def check_cores(spec: Spec, path: Path, hosts: Hosts) -> None:
    """Core indices a user's spec gives that the host does not have are refused, not wrapped onto
    other cores (the built-in study specs, made for any machine, keep wrapping)."""
    if Path(path).resolve().parent == BUILT_IN_SPECS:
        return
    topology = spec.topology
    for field, host in (("target_cores", hosts.target), ("host_cores", hosts.initiator(None))):
        if field not in topology.model_fields_set:
            continue  # the defaults wrap on machines with fewer cores, as the studies' own indices do
        try:
            usable = host.cores or available_cores()
        except HostError as error:
            raise SessionError(str(error)) from None
        for index in getattr(topology, field):
            if index >= len(usable):
                raise SessionError(f"{path}: topology.{field}: core {index} does not exist on {host.name}, which "
                                   f"has {len(usable)} usable core(s) (indices 0 to {len(usable) - 1})")


def check_capacity(planned: list[tuple[str, Point]], runner: Runner, path: Path) -> None:
    """RAM namespaces against the memory the target host has, backing files against its free disk."""
    ram: dict[str, tuple[Any, int]] = {}
    files: dict[str, tuple[Any, dict[str, int]]] = {}
    for _, point in planned:
        if point.skip_reason or point.fail_reason or point.target is None:
            continue
        host = runner._target_host(point.target)
        need = sum(s.size for s in point.target.subsystems if s.backend == "ram")
        if need > ram.get(host.name, (host, 0))[1]:
            ram[host.name] = (host, need)
        for sub in point.target.subsystems:
            if sub.backend == "file" and sub.path:
                files.setdefault(host.name, (host, {}))[1][sub.path] = sub.size
    for name, (host, need) in ram.items():
        available = _meminfo(host, "MemAvailable")
        if available is not None and need > available:
            raise SessionError(f"{path}: backend.size: {_gib(need)} of RAM namespace is more than the "
                               f"{_gib(available)} of memory available on {name}; use a smaller size or the "
                               "file backend")
    for name, (host, wanted) in files.items():
        need, free = 0, None
        for file_path, size in wanted.items():
            have, avail = _file_and_free(host, file_path)
            if avail is None:
                continue
            free = avail if free is None else min(free, avail)
            need += max(0, size - have)
        if free is not None and need > free:
            raise SessionError(f"{path}: backend.size: the backing file(s) need {_gib(need)} more on {name}, "
                               f"which has {_gib(free)} free there; use a smaller size or another backend.path")


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.0f} MiB"


def _meminfo(host, field: str) -> int | None:
    try:
        text = host.run(["cat", "/proc/meminfo"], timeout=20, check=False).stdout
    except (HostError, OSError):
        return None
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return None


# $1 a file path: its size (0 when missing) and the free bytes of the first directory above it that exists.
_FILE_AND_FREE = r"""p="$1"; have=0; [ -f "$p" ] && have=$(stat -c %s "$p"); d=$(dirname "$p")
while [ ! -d "$d" ]; do d=$(dirname "$d"); done
echo "$have $(df -Pk "$d" | tail -1 | awk '{print $4}')"
"""


def _file_and_free(host, file_path: str) -> tuple[int, int | None]:
    try:
        done = host.run(["sh", "-c", _FILE_AND_FREE, "sh", file_path], timeout=20, check=False)
        have, free_kib = done.stdout.split()
        return int(have), int(free_kib) * 1024
    except (HostError, OSError, ValueError):
        return 0, None


def check_available(target_stack: Stack, host_stack: Stack, hosts: Hosts) -> None:
    try:
        missing = [target_stack.unavailable(hosts.target, "target")]
        missing += [host_stack.unavailable(h, "host") for h in hosts.initiators]
    except (HostError, ToolMissing) as error:
        raise SessionError(str(error)) from None
    for reason in missing:
        if reason:
            raise SessionError(reason)


def render_plan(planner: PlanningRunner) -> str:
    """Every command each host would run, point by point, with nothing run. Ports are shown as
    4420; a run picks free ones."""
    lines, last_setup, hosts = [], None, planner.hosts
    for description, point in planner.planned:
        target_stack, host_stack = planner.stacks_for(point)
        lines.append(f"# {description} · {point.leg} · repeat {point.repeat} · "
                     + ", ".join(f"{k}={v}" for k, v in sorted(point.knobs.items())))
        if point.skip_reason or point.fail_reason:
            lines.append(f"  (not run: {point.skip_reason or point.fail_reason})")
            continue
        if point.target is not None and (point.target, target_stack.name) != last_setup:
            target_host = hosts.target if not point.target.netns else LocalHost(name=f"netns {point.target.netns}")
            lines += [f"  {line}" for line in target_stack.plan_target(point.target, target_host)]
            last_setup = (point.target, target_stack.name)
        for job in point.jobs:
            parts = planner.parts(job)  # a spread role: one load generator per host (spread.py)
            if len(parts) > 1:
                lines.append(f"  ({job.role} on {len(parts)} hosts at once, each released at one agreed moment)")
            for part in parts:
                host = hosts.initiator(part.host)
                address = point.target.listen_ip if point.target else ""
                steps = host_stack.plan_host(part, address, 4420, host, runtime=point.runtime,
                                             ramp_time=point.ramp_time)
                lines += [f"  {line}" for line in steps]
    if lines and planner.order_seed is not None:  # a run draws its own seed unless given this one
        lines.append(f"(points in each round in the order of seed {planner.order_seed}: "
                     f"--order-seed {planner.order_seed} runs them so)")
    return "\n".join(lines) if lines else "(no points)"


def _interrupt(signum, frame) -> None:
    # SIGTERM takes the same path as Ctrl-C: children stopped, finished points kept.
    raise KeyboardInterrupt
