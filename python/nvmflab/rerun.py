"""More repeats of stored points, for `nvmflab compare --until-decided` (issue 41 item 1).

A results directory can take more repeats of a point only when what defined its measurement is
still here: the study's effective spec is stored with its runs, this is the machine that ran it
(host name, kernel, CPU, nvmflab's git revision), both stacks are available, and the stored spec
still plans the point with the same key and identity (stack versions, hosts), as `nvmflab run`
checks before it reuses a stored point. Otherwise `RerunError` names why.

A new repeat is the stored point with the next repeat number, planned by the study's own code
(runner.PlanningRunner) and measured by runner.Runner into a run of its own, exactly as the
repeats `nvmflab run` adds with `repeats = "auto"`.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import signal
import socket
from pathlib import Path
from typing import Callable

from . import gate as gating
from . import procs
from .env import cpu_model, git_rev
from .plan import Point
from .runner import PlanningRunner, Runner
from .session import SessionError, _interrupt, _study, check_available, open_hosts, with_stack_defaults
from .spec import Spec
from .stacks import StackError, get_stack
from .store import ResultsStore, StoreError
from .studies import study_params
from .studies.common import Context
from .topology.base import HostError

# What a stored run records of its machine that must be the same here for a repeat to belong with it.
MACHINE = {"hostname": socket.gethostname, "kernel": platform.release, "cpu_model": cpu_model,
           "git_rev": git_rev}


class RerunError(Exception):
    """A results directory that cannot take more repeats here: one line naming why."""


@dataclasses.dataclass
class _Study:
    spec: Spec
    run_id: int
    runner: Runner
    planner: PlanningRunner
    templates: dict[str, Point]  # stored point key -> the point as the stored spec plans it


class Rerunner:
    """One results directory, opened for writing and locked, that takes more repeats of its points."""

    def __init__(self, path: Path, label: str, studies: set[str]):
        self.path, self.label = Path(path), label
        self._studies: dict[str, _Study] = {}
        self._hosts = []
        try:
            self.store = ResultsStore(self.path)
            self.store.lock()
        except (StoreError, OSError) as error:
            raise RerunError(f"{label}: {self.path}: cannot add repeats here ({error})") from None
        try:
            self._stored = self.store.points()
            for study in sorted(studies):
                self._studies[study] = self._open(study)
        except BaseException:
            self.close()
            raise

    def _refuse(self, why: str) -> RerunError:
        return RerunError(f"{self.label}: {self.path}: cannot be re-run here: {why}")

    def _open(self, study: str) -> _Study:
        runs = self.store.runs()
        env = _latest_env(runs[runs["study"] == study])
        if env is None or "spec_effective" not in env:
            raise self._refuse(f"no spec of study {study!r} is stored with its runs")
        for key, now in MACHINE.items():
            was, here = env.get(key), now()
            if was != here:
                raise self._refuse(f"it was measured with {key} {was!r}, this machine has {here!r}")
        try:
            spec = Spec.model_validate(env["spec_effective"])
            target_stack, host_stack = get_stack(spec.stack.target), get_stack(spec.stack.host)
        except (ValueError, StackError) as error:
            raise self._refuse(f"its stored spec of {study!r} is not usable ({' '.join(str(error).split())})") from None
        spec = with_stack_defaults(spec, target_stack, host_stack)
        spec_path = Path(env.get("spec_path") or self.path / "spec.toml")
        try:
            hosts = open_hosts(spec, spec_path, self.path / "work")
            self._hosts.append(hosts)
            check_available(target_stack, host_stack, hosts)
        except SessionError as error:
            raise self._refuse(str(error)) from None
        planner = PlanningRunner(self.store, target_stack, host_stack, hosts, order_seed=spec.order_seed)
        try:
            params = study_params(spec.study, spec.params) if spec.study else None
            _study(Context(spec=spec, study=study, runner=planner, store=self.store), params)
        except (StackError, HostError, SessionError, ValueError) as error:
            raise self._refuse(f"its stored spec of {study!r} cannot be planned here "
                               f"({' '.join(str(error).split())})") from None
        templates = {point.key: point for _, point in planner.planned}
        run_id = self.store.start_run(study, f"# nvmflab compare --until-decided: more repeats of {study}\n",
                                      env | {"until_decided": True})
        runner = Runner(self.store, run_id, target_stack, host_stack, hosts, None, order_seed=spec.order_seed)
        return _Study(spec, run_id, runner, planner, templates)

    def next_repeats(self, study: str, point_keys: list[str]) -> Point:
        """The next repeat of the configuration stored under `point_keys` (its repeats so far)."""
        entry = self._studies[study]
        known = [k for k in point_keys if k in entry.templates]
        if not known:
            raise self._refuse("its stored spec no longer plans these points (nvmflab changed how it builds "
                               f"them): {', '.join(point_keys[:2])}")
        template = entry.templates[known[0]]
        stored, here = self.store.done_identities().get(template.key), entry.planner._identity_json(template)
        if stored != here:  # as runner.Runner.reusable: another stack version or host measured it
            raise self._refuse(f"{study}/{template.leg} was measured under another stack version or host "
                               f"(stored: {_short(stored)}; here: {_short(here)})")
        if template.prepare is not None:
            raise self._refuse(f"{study}/{template.leg} points need their study's setup around them; re-run "
                               "the study with more repeats instead")
        taken = set(self._stored["point_key"])
        repeat = 1 + max(int(r) for r in self._stored[self._stored["point_key"].isin(point_keys)]["repeat"])
        point = dataclasses.replace(template, repeat=repeat)
        while point.key in taken:  # a failed or newer repeat holds that number already
            point = dataclasses.replace(template, repeat=point.repeat + 1)
        return point

    def run(self, study: str, points: list[Point], description: str) -> list[str]:
        """Measure and store the points; the statuses of the ones that did not run cleanly."""
        entry = self._studies[study]
        try:
            outcomes = entry.runner.run(points, description)
        finally:
            entry.runner.close()  # no target of this side idles beside the other side's points
        self._stored = self.store.points()
        return [f"{o.point.leg} repeat {o.point.repeat}: {o.status}" + (f" ({o.error})" if o.error else "")
                for o in outcomes if o.status not in ("ok", "stored")]

    def close(self) -> None:
        for entry in self._studies.values():
            entry.runner.close()
            self.store.finish_run(entry.run_id)
        self._studies.clear()
        for hosts in self._hosts:
            hosts.close()
        self._hosts.clear()
        procs.stop_all()
        self.store.close()


def _latest_env(runs) -> dict | None:
    """The env of the latest run that stored a spec (runs of --until-decided store theirs too)."""
    for text in reversed(list(runs.sort_values("run_id")["env_json"].dropna())):
        try:
            env = json.loads(text)
        except (TypeError, ValueError):
            continue
        if isinstance(env, dict) and "spec_effective" in env:
            return env
    return None


def _short(identity) -> str:
    return json.dumps(identity, sort_keys=True)[:200]


# -- the rounds ----------------------------------------------------------------------------------

def until_decided(before: Path, after: Path, study: str | None, gate: dict[str, float], conditions: list,
                  min_points: int, max_rounds: int, rerun_before: bool, note: Callable[[str], None]):
    """compare.compare, then rounds of one more repeat of every gated point the gate calls
    inconclusive, on AFTER (and on BEFORE with `rerun_before`, the two sides alternating which goes
    first), each round judged again, until no gated metric is inconclusive or `max_rounds` rounds ran.
    Every look is paid for: the gate's bounds are Bonferroni over the family × (max_rounds + 1)."""
    from .compare import compare, load_side

    looks = max_rounds + 1
    sides = {"before": before, "after": after}

    def judge():
        loaded = {name: load_side(path, study) for name, path in sides.items()}
        return loaded, compare(loaded["before"], loaded["after"], gate, conditions, min_points, looks)

    loaded, c = judge()
    plan = _undecided if rerun_before else _undecided_by_after
    record = {"max_extra_rounds": max_rounds, "looks": looks, "rerun": ["before", "after"] if rerun_before
              else ["after"], "rounds": [], "stopped": ""}
    c.until_decided = record
    todo = plan(c, loaded)
    if not todo:
        record["stopped"] = _nothing_to_rerun(c)
        if c.gate_result.status == "inconclusive":
            c.gate_result.reason += f"; no extra round run: {record['stopped']}"
        return c
    studies = {key[0] for key in todo}
    rerunners: dict[str, Rerunner] = {}
    previous = signal.signal(signal.SIGTERM, _interrupt)  # a CI job's timeout: targets stopped, repeats kept
    try:
        rerunners["after"] = Rerunner(after, "AFTER", studies)
        if rerun_before:
            rerunners["before"] = Rerunner(before, "BEFORE", studies)
        for round_ in range(1, max_rounds + 1):
            order = sorted(rerunners, reverse=round_ % 2 == 0)  # after first every other round
            batches: dict[tuple[str, str], list[Point]] = {}  # every point planned before any runs
            for name in order:
                for (point_study, *_), keys in todo.items():
                    batches.setdefault((name, point_study), []).append(
                        rerunners[name].next_repeats(point_study, keys[name]))
            trouble = []
            for (name, point_study), points in batches.items():
                trouble += [f"{name}: {t}" for t in rerunners[name].run(
                    point_study, points, f"compare --until-decided round {round_}")]
            loaded, c = judge()
            c.until_decided = record
            g = c.gate_result
            counts = ", ".join(f"{len(g.of(v))} {v}" for v in (gating.WITHIN, gating.SLOWER, gating.INCONCLUSIVE))
            line = (f"round {round_}/{max_rounds}: one more repeat of {len(todo)} point(s) on "
                    f"{' and '.join(order)}: {counts}")
            record["rounds"].append({"round": round_, "points": len(todo), "sides": order, "gate": g.status,
                                     "not_clean": trouble})
            note(line + (f" ({'; '.join(trouble)})" if trouble else ""))
            todo = plan(c, loaded)
            if not todo:
                break
    finally:
        for rerunner in rerunners.values():
            rerunner.close()
        signal.signal(signal.SIGTERM, previous)
    g = c.gate_result
    if g.status == "inconclusive" and todo:
        record["stopped"] = f"the cap: --max-extra-rounds {max_rounds}"
        g.reason += (f"; still inconclusive after {max_rounds} extra round(s), the cap "
                     f"(--max-extra-rounds {max_rounds})")
    elif g.status == "inconclusive":
        record["stopped"] = _nothing_to_rerun(c)
        g.reason += f" after {len(record['rounds'])} extra round(s); {record['stopped']}"
    else:
        record["stopped"] = f"after {len(record['rounds'])} extra round(s): gate {g.status}"
    return c


def _nothing_to_rerun(c) -> str:
    g = c.gate_result
    if g.status != "inconclusive":
        return f"no extra round needed: gate {g.status}"
    if g.of(gating.INCONCLUSIVE):
        return ("more repeats of AFTER alone cannot decide what is left: BEFORE's repeats keep its interval "
                "wider than the distance to the threshold (see each metric's reason); measure BEFORE with "
                "more repeats, or give --rerun-before where this machine is still as BEFORE measured it")
    return "nothing to re-run: gated points were not measured on both sides"


def _undecided_by_after(c, loaded) -> dict[tuple, dict[str, list[str]]]:
    """_undecided, less the points whose every inconclusive metric BEFORE's repeats alone keep
    undecidable (gate.before_bounds_it): more repeats of AFTER could not decide them."""
    g = c.gate_result
    metrics = {(m.study, m.leg, m.role, m.point, m.kind): m for m in c.metrics}
    hopeless = set()
    for v in g.of(gating.INCONCLUSIVE) if g is not None else []:
        m = metrics[(v.study, v.leg, v.role, v.point, v.kind)]
        floor = (gating.before_bounds_it(m.before, m.after, v.slowdown_pct, v.threshold_pct, v.confidence)
                 if v.slowdown_pct is not None else None)
        if floor is not None:
            v.reason += (f"; BEFORE's {len(m.before)} repeats alone keep it ±{floor:.1f} % wide however many "
                         "AFTER adds: BEFORE needs more repeats")
            hopeless.add((v.study, v.leg, v.role, v.point, v.kind))
    return _undecided(c, loaded, skip=hopeless)


def _undecided(c, loaded, skip=frozenset()) -> dict[tuple, dict[str, list[str]]]:
    """The gated points to measure again: (study, leg, role, knobs) -> each side's stored point
    keys, for the points with an inconclusive metric while no metric is slower beyond threshold (a
    regression shown stays one, whatever the rest)."""
    from .compare import match_key

    g = c.gate_result
    if g is None or g.of(gating.SLOWER):
        return {}
    wanted = {(v.study, v.leg, v.role, v.point) for v in g.of(gating.INCONCLUSIVE)
              if (v.study, v.leg, v.role, v.point, v.kind) not in skip}
    out: dict[tuple, dict[str, list[str]]] = {}
    for m in c.metrics:
        if (m.study, m.leg, m.role, m.point) not in wanted:
            continue
        key = match_key(m.knobs)
        keys = {}
        for name, side in loaded.items():
            rows = side.rows
            mine = rows[(rows["study"] == m.study) & (rows["leg"] == m.leg) & (rows["role"] == m.role)
                         & (rows["knobs_json"].map(match_key) == key)]
            keys[name] = sorted(set(mine["point_key"]))
        point = tuple(sorted(set(keys["before"]) | set(keys["after"])))  # one point, whatever its roles
        out.setdefault((m.study, point), keys)
    return out
