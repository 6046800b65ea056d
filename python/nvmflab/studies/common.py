"""Building blocks the studies share: the run context, target setups, tcp and local points."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..cores import available_cores, physical
from ..analysis.stability import main_metric
from ..analysis.stats import ci95_halfwidth, collapse_jobs, diff_interval, usable
from ..plan import PerfJob, Point, Subsystem, TargetSetup, point_key
from ..runner import Outcome, Runner
from ..spec import Spec, validate_knobs
from ..spread import spread_hosts
from ..store import ResultsStore
from ..dhchapkey import random_secret
from ..tlskey import random_key

NQN_PREFIX = "nqn.2024-01.io.nvmflab"


@dataclass
class Context:
    spec: Spec
    study: str
    runner: Runner
    store: ResultsStore
    # Configurations that reached max_repeats still unstable: (description, leg, knobs, n, ±fraction).
    capped: list[tuple[str, str, dict[str, Any], int, float]] = field(default_factory=list)
    _tls_key: str | None = field(default=None, repr=False)
    _dhchap_key: str | None = field(default=None, repr=False)

    def dhchap_key(self) -> str:
        """The DH-HMAC-CHAP secret of this run's `dhchap` points, made once per run."""
        if self._dhchap_key is None:
            self._dhchap_key = random_secret()
        return self._dhchap_key

    def tls_key(self) -> str:
        """The TLS PSK of this run's `tls = "on"` points: the spec's, else one made once per run."""
        if self._tls_key is None:
            self._tls_key = self.spec.stack.tls_key or random_key()
        return self._tls_key

    @property
    def cores(self) -> list[int]:
        """Usable cores of the (default) initiator host; this machine's on a local topology."""
        return self.runner.hosts.initiator(None).cores or available_cores()

    @property
    def target_cores(self) -> list[int]:
        return self.runner.hosts.target.cores or available_cores()

    @property
    def listen_ip(self) -> str:
        """The target host's data address (127.0.0.1 on a local topology)."""
        return self.runner.hosts.target.data_ip

    @property
    def planning(self) -> bool:
        """True while points are only collected (`--plan`, the knob check before a run)."""
        return getattr(self.runner, "planning", False)

    def phys(self, logical: Iterable[int]) -> tuple[int, ...]:
        return tuple(physical(list(logical), self.cores))

    def target_phys(self, logical: Iterable[int]) -> tuple[int, ...]:
        return tuple(physical(list(logical), self.target_cores))

    def run(self, points: list[Point], description: str, compare_by: Callable[[Point], Any] | None = None,
            metric: Callable[[dict[str, Any]], str] | None = None) -> list[Outcome]:
        """Run the points, whose members are compared with each other, as given (build them with
        `repeated`/`interleave`: round r of every member before round r + 1 of any).

        With `repeats = "auto"`, rounds are added per comparison: `compare_by(point)` names the
        comparison a point belongs to (default: all points of the call are one). While a comparison
        is not settled, each round runs every live member of it once more, so its members stay
        side by side. A comparison is settled when every member's decision metric (`metric(knobs)`,
        default `decision_metric`: p99 for an L-app, IOPS otherwise) is within `ci_within_pct`, or
        when the interval of each member's difference to the first member is that narrow (`settled`).
        The planning pass runs (collects) the given points only: it has no measurements to judge."""
        self.skip_refused_jobs(points)
        outcomes = self.runner.run(points, description)
        if not self.spec.auto_repeats or self.planning or not points:
            return outcomes
        metric = metric or decision_metric
        groups: dict[str, list[Point]] = {}
        comparisons: dict[Any, list[str]] = {}
        for point in points:
            key = config_key(point)
            if key not in groups:
                comparisons.setdefault(compare_by(point) if compare_by else None, []).append(key)
            groups.setdefault(key, []).append(point)
        status = {o.point.key: o.status for o in outcomes}
        target = self.spec.ci_within_pct / 100
        while True:
            frame = self.store.measurements()
            pending: list[Point] = []
            for members in comparisons.values():
                live = [k for k in members if _alive(groups[k], status)]
                if not live:
                    continue
                samples = [main_values(frame, [p.key for p in groups[k]], groups[k][0].knobs, metric)
                           for k in live]
                if settled(samples, target):
                    continue
                latest = [max(groups[k], key=lambda p: p.repeat) for k in live]
                n = max(p.repeat for p in latest) + 1
                if n >= self.spec.max_repeats:
                    for point, values in zip(latest, samples):
                        rel = relative_spread(values)
                        if rel > target:  # NaN (all repeats equal) is not called unstable
                            self.capped.append((description, point.leg, point.knobs, n, rel))
                            self.console_note(f"{description}: {point.leg} {knob_text(point.knobs)} still "
                                              f"±{rel:.1%} after {n} repeats (max_repeats): reported as unstable")
                    continue
                pending += [dataclasses.replace(p, repeat=n) for p in latest]
            if not pending:
                return outcomes
            more = self.runner.run(pending, f"{description} (repeat {pending[0].repeat + 1}, "
                                            f"{len(pending)} points of comparisons not yet settled)")
            outcomes += more
            status |= {o.point.key: o.status for o in more}
            for point in pending:
                groups[config_key(point)].append(point)

    def run_fixed(self, points: list[Point], description: str) -> list[Outcome]:
        """Run exactly these points, never adding rounds: for points whose `prepare` starts
        companions bound to one repeat (contention's iperf3 flows, stored under their own key)."""
        self.skip_refused_jobs(points)
        return self.runner.run(points, description)

    def skip_refused_jobs(self, points: list[Point]) -> None:
        """A study's point whose job the host stack cannot run at all (SPDK's perf on a local file),
        or whose knobs a stack cannot honour (SPDK's host always polls, so the `event` points of the
        polling study), is stored skipped with the stack's reason, so the rest of the study still
        runs. A plain sweep (no study) keeps the refusal: its knobs are the user's own choice."""
        from ..spec import Knobs
        from ..stacks import StackError

        from ..topology.rdma import TransportCheck
        from ..topology.tls import TlsCheck

        defaults = Knobs().model_dump()
        transports = TransportCheck(self.runner)
        tls = TlsCheck(self.runner)
        for point in points:
            if point.skip_reason or point.fail_reason:
                continue
            target_stack, host_stack = self.runner.stacks_for(point)
            lacking = sorted({s.backend for s in point.target.subsystems} - set(target_stack.backends)) \
                if point.target is not None else []
            if lacking:
                point.skip_reason = f"the {target_stack.name} target has no {lacking[0]} backend"
                continue
            if self.spec.study:
                try:
                    if point.target is not None:
                        target_stack.check_knobs(point.knobs, "target", defaults)
                    for job in point.jobs:
                        host_stack.check_knobs(job.knobs, "host", defaults)
                except StackError as error:
                    point.skip_reason = str(error)
                    continue
            refusal = transports.refusal(point, target_stack, host_stack) or tls.refusal(point, target_stack, host_stack)
            if refusal:
                point.skip_reason = refusal
                continue
            for job in point.jobs:
                refusal = host_stack.job_refusal(job)
                if refusal:
                    point.skip_reason = f"the {host_stack.name} host cannot run this job: {refusal}"
                    break

    def console_note(self, message: str) -> None:
        if self.runner.progress is not None:
            self.runner.progress.console.print(message, markup=False, highlight=False)

    def measurements(self, leg: str | None = None) -> pd.DataFrame:
        frame = self.store.measurements()
        frame = frame[frame["study"] == self.study]
        return frame[frame["leg"] == leg] if leg is not None else frame


def config_key(point: Point) -> str:
    """The point's key with the repeat left out: every repeat of one configuration shares it."""
    return point_key(point.study, point.leg, point.knobs, 0, point.runtime, point.ramp_time, point.definition())


def knob_text(knobs: dict[str, Any]) -> str:
    shown = ("app", "rw", "bs", "iodepth", "numjobs", "completion", "target_mode", "idle_poll_us", "io_queues",
             "bg_load_pct", "target_cores")
    return " ".join(f"{k}={knobs[k]}" for k in shown if knobs.get(k) is not None)


def decision_metric(knobs: dict[str, Any]) -> str:
    """The metric a study's decision on these knobs uses (`stability.main_metric`)."""
    return main_metric(knobs)


def main_values(frame: pd.DataFrame, keys: Iterable[str], knobs: dict[str, Any],
                metric: Callable[[dict[str, Any]], str] | None = None) -> list[float]:
    """Per repeat, the decision metric of the main role (`main`, else `fg`) from the stored rows:
    IOPS summed over the role's jobs, latency the worst job's."""
    if frame.empty:
        return []
    rows = usable(frame[frame["point_key"].isin(set(keys))])
    if rows.empty:
        return []
    roles = set(rows["role"])
    role = "main" if "main" in roles else "fg" if "fg" in roles else None
    if role is None:
        return []
    rows = collapse_jobs(rows[rows["role"] == role])
    column = (metric or decision_metric)(knobs)
    if column not in rows:
        return []
    values = pd.to_numeric(rows[column], errors="coerce").dropna()
    return [float(v) for v in values]


def relative_spread(values: list[float]) -> float:
    """Half-width of the 95 % t interval of the values as a fraction of their mean; NaN with fewer
    than two values (nothing to judge)."""
    if len(values) < 2:
        return math.nan
    mean = sum(values) / len(values)
    half = ci95_halfwidth(values)
    return math.nan if mean == 0 or math.isnan(half) else half / abs(mean)


def settled(samples: list[list[float]], within: float) -> bool:
    """True when a comparison needs no more rounds: a member with fewer than two values gives
    nothing to judge (True); else every member's interval is within `within` of its mean (repeats
    that are all equal give no interval and are not judged: a deterministic fake, a zero reading),
    or the Welch interval of every member's difference to the first is within `within` of the
    larger of the two means. The rule looks at the intervals' widths only, never at whether they
    exclude zero, so stopping early cannot favour a difference (no optional-stopping bias)."""
    if any(len(v) < 2 for v in samples):
        return True
    spreads = [relative_spread(v) for v in samples]
    if all(math.isnan(r) or r <= within for r in spreads):
        return True
    if len(samples) < 2:
        return False
    first = samples[0]
    for other in samples[1:]:
        mean_a, mean_b = sum(first) / len(first), sum(other) / len(other)
        _, half = diff_interval(mean_a, _std(first), len(first), mean_b, _std(other), len(other))
        scale = max(abs(mean_a), abs(mean_b))
        if math.isnan(half) or scale == 0 or half > within * scale:
            return False
    return True


def _std(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _alive(members: list[Point], status: dict[str, str]) -> bool:
    """A configuration whose latest repeat ran (a failing or skipped one gets no more rounds)."""
    latest = max(members, key=lambda p: p.repeat)
    return status.get(latest.key) in ("ok", "stored") and not latest.skip_reason and not latest.fail_reason


def stability(frame: pd.DataFrame, points: list[Point]) -> float:
    """relative_spread of the decision metric over the points' repeats."""
    return relative_spread(main_values(frame, [p.key for p in points], points[0].knobs))


def interleave(*legs: list[Point]) -> list[Point]:
    """The points of several legs (each built by `repeated`) as one list, repeat outermost: round r
    of every leg runs before round r + 1 of any, so a slow phase of the machine lands on every leg."""
    return sorted((p for leg in legs for p in leg), key=lambda p: p.repeat)  # stable: leg order kept


def logical(given: list[int], count: int, taken: Iterable[int]) -> list[int]:
    """The first `count` logical cores from `given`, extended with indices not used elsewhere."""
    cores = list(given[:count])
    candidate = max(list(given) + list(taken)) + 1
    while len(cores) < count:
        cores.append(candidate)
        candidate += 1
    return cores


def backend_subsystem(ctx: Context, name: str, reactor: int | None = None, path: str | None = None) -> Subsystem:
    backend = ctx.spec.backend
    file_path = path or backend.path or str(ctx.store.dir / "work" / f"{name}.img")
    return Subsystem(nqn=f"{NQN_PREFIX}:{name}", backend=backend.kind, size=backend.size,
                     path=file_path if backend.kind == "file" else None, block_size=backend.block_size,
                     reactor=reactor, model=backend.model if backend.kind == "model" else None)


def target_setup(ctx: Context, knobs: dict[str, Any], subsystems: list[Subsystem], target_logical: list[int],
                 netns: str | None = None, listen_ip: str | None = None) -> TargetSetup:
    return TargetSetup(cores=ctx.target_phys(target_logical), mode=knobs["target_mode"],
                       idle_poll_us=knobs["idle_poll_us"], in_capsule_data_size=knobs["in_capsule_data_size"],
                       so_priority=knobs["so_priority"], tos=knobs["tos"], busy_poll_us=knobs["busy_poll_us"],
                       subsystems=tuple(subsystems), netns=netns, listen_ip=listen_ip or ctx.listen_ip,
                       allowed_hosts=(ctx.spec.stack.hostnqn,) if ctx.spec.stack.hostnqn else (),
                       tls=knobs["tls"], tls_key=ctx.tls_key() if knobs["tls"] == "on" else None,
                       transport=knobs["transport"], tcp_congestion=knobs["tcp_congestion"],
                       dhchap=knobs["dhchap"], dhchap_key=ctx.dhchap_key() if knobs["dhchap"] != "off" else None)


def point_knobs(ctx: Context, overrides: dict[str, Any]) -> dict[str, Any]:
    """Spec base knobs with overrides, validated, plus the backend the point ran against."""
    spec_fields = {k: v for k, v in overrides.items() if k not in EXTRA_KNOBS}
    knobs = validate_knobs(ctx.spec.base_knobs() | spec_fields)
    knobs |= {"backend": ctx.spec.backend.kind, "backend_size": ctx.spec.backend.size,
              **({"backend_model": ctx.spec.backend.model or ""} if ctx.spec.backend.kind == "model" else {}),
              "target_stack": ctx.spec.stack.target, "host_stack": ctx.spec.stack.host}
    return knobs | {k: v for k, v in overrides.items() if k in EXTRA_KNOBS}


# Point coordinates that are not spec fields but tell points apart in the results.
EXTRA_KNOBS = ("backend", "backend_model", "app", "resource", "bg_load_pct", "file_dir", "host_cores", "target_cores",
               "target_stack", "host_stack")


def tcp_point(ctx: Context, leg: str, knobs: dict[str, Any], repeat: int, netns: str | None = None,
              listen_ip: str | None = None, subsystem: Subsystem | None = None,
              prepare: Callable[[], None] | None = None, skip_reason: str | None = None) -> Point:
    """One load generator on the host cores against one subsystem served by the target cores."""
    topo = ctx.spec.topology
    sub = subsystem or backend_subsystem(ctx, "main")
    job = PerfJob(role="main", knobs=_job_knobs(knobs), cpus=ctx.phys(topo.host_cores), nqn=sub.nqn,
                  hostnqn=ctx.spec.stack.hostnqn,
                  spread=spread_hosts(topo, ctx.study, [h.name for h in ctx.runner.hosts.initiators]))
    return Point(study=ctx.study, leg=leg, knobs=knobs, repeat=repeat, jobs=[job], runtime=ctx.spec.runtime,
                 ramp_time=ctx.spec.ramp_time,
                 target=target_setup(ctx, knobs, [sub], topo.target_cores, netns, listen_ip),
                 prepare=prepare, skip_reason=skip_reason)


def local_point(ctx: Context, leg: str, knobs: dict[str, Any], repeat: int, path: str, size: int) -> Point:
    """nvmf-perf --local on a file: the same workload with no network stack in between."""
    job = PerfJob(role="main", knobs=_job_knobs(knobs), cpus=ctx.phys(ctx.spec.topology.host_cores),
                  local_path=path, local_file_size=size)
    return Point(study=ctx.study, leg=leg, knobs=knobs, repeat=repeat, jobs=[job], runtime=ctx.spec.runtime,
                 ramp_time=ctx.spec.ramp_time)


def _job_knobs(knobs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in knobs.items() if k not in EXTRA_KNOBS}


def repeated(ctx: Context, knob_sets: Iterable[dict[str, Any]],
             build: Callable[[dict[str, Any], int], Point]) -> list[Point]:
    """Every knob set, each repeated `spec.repeats` times; knob sets seen twice run once.

    Repeats are interleaved: round r runs every knob set once before round r + 1 starts, so a
    drift over time (thermal, background noise) spreads over every configuration and lands in the
    interval of their difference instead of in the difference itself.
    """
    unique, seen = [], set()
    for knobs in knob_sets:
        marker = repr(sorted(knobs.items()))
        if marker not in seen:
            seen.add(marker)
            unique.append(knobs)
    return [build(knobs, r) for r in range(ctx.spec.repeats) for knobs in unique]


# Studies that run with the configuration the polling study chose, as the thesis ran chapters 5-6
# with table 4.2's configuration: `--knobs-from RESULTS`, and `study all` after its polling study.
CARRY_OVER = ("overhead", "saturation", "interference")


def carry_over(spec: Spec, results: Path) -> tuple[Spec, dict[str, Any], dict[str, str]]:
    """`spec` with the knobs the polling study in `results` chose (decided ones only).

    Returns the new spec, the knobs applied, and the knobs left out with why (a stack that cannot
    honour the value keeps its own). A results directory without a polling study changes nothing.
    """
    from ..analysis.polling import recommended_knobs
    from ..spec import Knobs
    from ..stacks import StackError, get_stack

    path = Path(results)
    if not (path / ResultsStore.FILENAME).is_file():
        return spec, {}, {"*": f"{path}: no results database"}
    chosen = recommended_knobs(ResultsStore(path).measurements())
    defaults = Knobs().model_dump()
    applied, refused = {}, {}
    for knob, value in chosen.items():
        try:
            for name, side in ((spec.stack.target, "target"), (spec.stack.host, "host")):
                get_stack(name).check_knobs({knob: value}, side, defaults)
        except StackError as err:
            refused[knob] = str(err)
            continue
        applied[knob] = value
    if not applied:
        return spec, applied, refused
    knobs = Knobs.model_validate(spec.knobs.model_dump() | applied)
    knobs = spec.knobs.model_copy(update={k: getattr(knobs, k) for k in applied})
    return spec.model_copy(update={"knobs": knobs}), applied, refused
