"""One invocation of `study` or `run`: open the store, record the run, execute, always clean up.

Before anything runs, the study is planned (its points collected without running them) and every
point's knobs are checked against the target and host stacks, so a knob a stack lacks is refused
up front, naming the knob and the stack. `--plan` prints what each host would run and stops there.
"""

from __future__ import annotations

import shutil
import signal
import sqlite3
import tempfile
from collections import Counter
from pathlib import Path

from . import procs
from .env import collect
from .plan import Point
from .runner import PlanningRunner, Runner, make_progress
from .spec import Knobs, Spec
from .stacks import Stack, StackError, get_stack
from .store import ResultsStore
from .studies import study_module, study_params
from .studies.common import Context
from .tools import ToolMissing
from .topology.base import HostError, Hosts
from .topology.local import LocalHost


class SessionError(Exception):
    pass


def run_spec(spec: Spec, path: Path, study_name: str, results: Path, quick: bool, plan: bool = False) -> str:
    """Run every point of the spec (skipping stored ones); returns a one-line summary.
    With `plan`, returns every command each host would run instead, running nothing."""
    try:
        target_stack, host_stack = get_stack(spec.stack.target), get_stack(spec.stack.host)
    except StackError as error:
        raise SessionError(str(error)) from None
    spec = with_stack_defaults(spec, target_stack, host_stack)
    if plan and not (Path(results) / ResultsStore.FILENAME).is_file():
        results = Path(tempfile.mkdtemp(prefix="nvmflab-plan-"))  # a plan leaves nothing behind
    hosts = open_hosts(spec, path, Path(results) / "work")
    store = None
    try:
        if not plan:
            check_available(target_stack, host_stack, hosts)  # before the results directory is made
        try:
            store = ResultsStore(results)
        except (OSError, sqlite3.Error) as error:
            raise SessionError(f"{results}: cannot keep results there ({error})") from None
        params = study_params(spec.study, spec.params) if spec.study else None
        planner = PlanningRunner(store, target_stack, host_stack, hosts)
        _study(Context(spec=spec, study=study_name, runner=planner, store=store), params)
        check_points(planner.planned, planner)
        if plan:
            return render_plan(planner)
        return _execute(spec, path, study_name, results, quick, params, store, target_stack, host_stack, hosts,
                        [point for _, point in planner.planned])
    finally:
        hosts.close()
        if store is not None:
            store.close()
        if plan and Path(results).name.startswith("nvmflab-plan-"):
            shutil.rmtree(results, ignore_errors=True)


def _execute(spec, path, study_name, results, quick, params, store, target_stack, host_stack, hosts,
             planned: list[Point]) -> str:
    env = collect() | {"spec_effective": spec.model_dump(mode="json"), "quick": quick, "spec_path": str(path),
                       "stacks": {"target": target_stack.name, "host": host_stack.name}}
    run_id = store.start_run(study_name, Path(path).read_text(), env)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with make_progress() as progress:
            progress.plan(planned, store.done_keys())
            runner = Runner(store, run_id, target_stack, host_stack, hosts, progress)
            try:
                _study(Context(spec=spec, study=study_name, runner=runner, store=store), params)
            finally:
                runner.close()
        store.finish_run(run_id)
    finally:
        signal.signal(signal.SIGTERM, previous)
        procs.stop_all()
    statuses = Counter(store.points().query("run_id == @run_id")["status"])
    counts = ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())) or "nothing new (all points stored)"
    return f"{study_name}: {counts} in {results}"


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

    def jobs(point: Point, target_stack: Stack, host_stack: Stack) -> None:
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
            host = hosts.initiator(job.host)
            address = point.target.listen_ip if point.target else ""
            steps = host_stack.plan_host(job, address, 4420, host, runtime=point.runtime, ramp_time=point.ramp_time)
            lines += [f"  {line}" for line in steps]
    return "\n".join(lines) if lines else "(no points)"


def _interrupt(signum, frame) -> None:
    # SIGTERM takes the same path as Ctrl-C: children stopped, finished points kept.
    raise KeyboardInterrupt
