"""Issue 22 item 2: the members of a comparison (legs included) run in the same rounds, repeat
outermost, and `repeats = "auto"` adds a round for every member of a comparison that is not settled,
judged on the metric its decision uses (p99 for an L-app) or on the interval of the contrast."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import REPO, ours_stacks

from nvmflab.runner import Outcome, PlanningRunner
from nvmflab.spec import Spec, load_spec
from nvmflab.stacks import get_stack
from nvmflab.store import ResultsStore
from nvmflab.studies import study_module, study_params
from nvmflab.studies.common import Context, interleave, point_knobs, repeated, settled, tcp_point
from nvmflab.topology.base import Hosts
from nvmflab.topology.local import LocalHost

# Legs that each study compares with each other, so they must share rounds (one runner call).
SIDE_BY_SIDE = {
    "overhead": [{"local", "loopback", "netns"}],
    "parallelism": [{"size_local", "size_remote"}, {"depth_local", "depth_remote"}],
    "contention": [{"isolated", "same_core"}, {"many_apps", "lapps_flows"}],
    "dimensions": [{"local", "concurrency"}],
}


def planned(study: str, tmp_path, repeats: int = 3) -> list[tuple[str, object]]:
    """The points the quick variant of `study` runs, in order, as the planning pass collects them."""
    spec = load_spec(REPO / "studies" / f"{study}.toml", quick=True)
    spec = spec.model_copy(update={"repeats": repeats})
    if study == "contention":  # the quick variant leaves many_apps out (make run's time); check it anyway
        spec = spec.model_copy(update={"params": spec.params | {"storage_apps": [2]}})
    local = LocalHost(workdir=tmp_path)
    planner = PlanningRunner(ResultsStore(tmp_path / study), get_stack("ours"), get_stack("ours"),
                             Hosts(local, [local]))
    study_module(study).execute(Context(spec=spec, study=study, runner=planner, store=planner.store),
                                study_params(study, spec.params))
    return planner.planned


@pytest.mark.parametrize("study", sorted(SIDE_BY_SIDE))
def test_compared_legs_share_rounds_with_the_repeat_outermost(study, tmp_path):
    calls: dict[str, list] = {}
    for description, point in planned(study, tmp_path):
        calls.setdefault(description, []).append(point)
    for legs in SIDE_BY_SIDE[study]:
        together = [points for points in calls.values() if legs <= {p.leg for p in points}]
        assert together, f"{study}: legs {sorted(legs)} are not run in one call: {sorted(calls)}"
        points = together[0]
        repeats = [p.repeat for p in points]
        assert repeats == sorted(repeats), f"{study}: a later round ran before an earlier one ended"
        for r in range(3):  # every leg in every round
            assert legs <= {p.leg for p in points if p.repeat == r}, f"{study}: round {r} misses a leg"


def test_interleave_keeps_leg_order_within_a_round():
    a = [SimpleNamespace(leg="a", repeat=r) for r in range(2)]
    b = [SimpleNamespace(leg="b", repeat=r) for r in range(2)]
    assert [(p.leg, p.repeat) for p in interleave(a, b)] == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]


def test_settled_by_each_member_or_by_the_contrast_interval():
    tight = [100.0, 101.0, 99.0]
    loose = [50.0, 150.0, 100.0]
    assert settled([tight, [200.0, 201.0, 199.0]], 0.05)
    assert not settled([tight, loose], 0.05)  # a member is wide and so is the difference
    # members wide on their own (±9 %) but their difference is measured within 5 % of the larger mean
    a, b = [10.0, 11.0, 12.0, 10.5], [100.0, 110.0, 104.0, 106.0]
    assert not settled([a], 0.05) and not settled([b], 0.05)
    assert settled([a, b], 0.1)
    assert not settled([a, b], 0.02)
    assert settled([[5.0, 5.0, 5.0], [6.0, 6.0, 6.0]], 0.05)  # all equal: no interval, nothing to judge
    assert not settled([[5.0, 5.0, 5.0], loose], 0.05)  # ... but a wide member still is
    assert settled([[1.0], [2.0, 3.0]], 0.05)  # fewer than two repeats: nothing to judge


def _fake_runner(store, run_id, rounds, values):
    """A runner storing the value `values(knobs, repeat)` as IOPS and as p99 of every point."""
    local = LocalHost()

    def run(points, description):
        rounds.append([(p.leg, p.knobs["iodepth"], p.repeat) for p in points])
        out = []
        for p in points:
            iops, p99 = values(p.leg, p.knobs, p.repeat)
            store.save_point(run_id, p.key, p.study, p.leg, p.knobs, p.repeat, "ok", None,
                             [{"role": "main", "iops": iops, "lat_p99_ns": p99, "lat_mean_ns": 1e4}])
            out.append(Outcome(p, "ok"))
        return out

    return SimpleNamespace(planning=False, progress=None, hosts=Hosts(local, [local]), stacks_for=ours_stacks,
                           run=run)


def _two_legs(ctx, app):
    sets = [point_knobs(ctx, {"iodepth": qd}) | {"app": app} for qd in (1, 8)]
    return interleave(repeated(ctx, sets, lambda k, r: tcp_point(ctx, "a", k, r)),
                      repeated(ctx, sets, lambda k, r: tcp_point(ctx, "b", k, r)))


def test_auto_adds_rounds_to_every_member_of_an_unsettled_comparison_only(tmp_path):
    """Leg b at QD8 is noisy in IOPS: its comparison (QD8, legs a and b) gets rounds, both legs in
    each, to max_repeats; the QD1 comparison stops at min_repeats."""
    spec = Spec.model_validate({"name": "auto", "runtime": 0.2, "ramp_time": 0, "max_repeats": 5})
    store = ResultsStore(tmp_path)
    run_id = store.start_run("auto", "", {})
    rounds: list = []

    def values(leg, knobs, repeat):
        noisy = leg == "b" and knobs["iodepth"] == 8
        return (1000.0 + (500.0 if noisy and repeat % 2 else 0.0) + repeat, 5e4 + repeat)

    ctx = Context(spec, "auto", _fake_runner(store, run_id, rounds, values), store)
    ctx.run(_two_legs(ctx, "T-app"), "unit", compare_by=lambda p: p.knobs["iodepth"])
    assert rounds[0] == [(leg, qd, r) for r in range(3) for leg in "ab" for qd in (1, 8)]
    assert rounds[1:] == [[("a", 8, 3), ("b", 8, 3)], [("a", 8, 4), ("b", 8, 4)]]
    assert [(leg, k["iodepth"], n) for _, leg, k, n, _ in ctx.capped] == [("b", 8, 5)]


def test_auto_judges_an_l_app_on_its_p99(tmp_path):
    """Stable IOPS do not stop an L-app whose p99 is noisy: the decision is taken on p99."""
    spec = Spec.model_validate({"name": "auto", "runtime": 0.2, "ramp_time": 0, "max_repeats": 4})
    store = ResultsStore(tmp_path)
    run_id = store.start_run("auto", "", {})
    rounds: list = []

    def values(leg, knobs, repeat):
        return 1000.0 + repeat, (5e4 if repeat % 2 else 9e4) + repeat

    ctx = Context(spec, "auto", _fake_runner(store, run_id, rounds, values), store)
    ctx.run(_two_legs(ctx, "L-app"), "unit")
    assert len(rounds) == 2 and len(rounds[1]) == 4  # one added round, all four members
    ctx2_rounds: list = []
    store2 = ResultsStore(tmp_path / "t")
    ctx2 = Context(spec, "auto", _fake_runner(store2, store2.start_run("auto", "", {}), ctx2_rounds, values), store2)
    ctx2.run(_two_legs(ctx2, "T-app"), "unit")
    assert len(ctx2_rounds) == 1  # the same rows judged on IOPS: stable at min_repeats


def test_on_the_fake_stack_the_legs_run_round_by_round(tmp_path, fake_env):
    """Execution order as stored (point ids are given in the order the points ran): overhead's
    local and loopback legs with two repeats run round 0 of both legs before round 1 of either."""
    from conftest import nvmflab
    from tiny_specs import SPECS

    spec = tmp_path / "overhead.toml"
    spec.write_text(SPECS["overhead"].replace("repeats = 1", "repeats = 2"))
    done = nvmflab("study", "overhead", "--spec", str(spec), "--results", str(tmp_path / "r"), env=fake_env,
                   timeout=180)
    assert done.returncode == 0, done.stderr + done.stdout
    ran = [(leg, repeat) for leg, repeat in ResultsStore(tmp_path / "r").points()[["leg", "repeat"]].itertuples(
        index=False)]
    assert [r for _, r in ran] == sorted(r for _, r in ran)  # repeat outermost
    for r in (0, 1):
        assert {leg for leg, rr in ran if rr == r} == {"local", "loopback"}
    assert len(ran) == 12  # three apps × two legs × two repeats
