"""The order of legs and points within a round (issue 37 item 4): shuffled by a seed the run records,
rounds kept in sequence, points sharing a target kept together, the same seed the same order, and a
resumed or repeated run into the same results still reuses its stored points."""

from __future__ import annotations

import json
import sqlite3

from conftest import nvmflab
from tiny_specs import head

from nvmflab.order import in_round_order
from nvmflab.plan import PerfJob, Point, TargetSetup
from nvmflab.session import run_spec
from nvmflab.study_spec import load_study_spec

LEGS = ("a", "b", "c", "d", "e", "f")


def _points(repeats: int = 3) -> list[Point]:
    """Round-major points of six legs; legs a-c share one target, d has its own, e and f none."""
    shared, own = (TargetSetup(cores=(0,), mode=mode, idle_poll_us=0, in_capsule_data_size=0, so_priority=0, tos=0,
                               busy_poll_us=0, subsystems=()) for mode in ("event", "poll"))
    target = {"a": shared, "b": shared, "c": shared, "d": own, "e": None, "f": None}
    return [Point(study="s", leg=leg, knobs={"x": 1}, repeat=r, jobs=[PerfJob(role="main", knobs={}, cpus=(1,))],
                  runtime=1, ramp_time=0, target=target[leg])
            for r in range(repeats) for leg in LEGS]


def _legs(points: list[Point], repeat: int) -> list[str]:
    return [p.leg for p in points if p.repeat == repeat]


def test_no_seed_keeps_the_order_given():
    points = _points()
    assert in_round_order(points, None, "d") == points


def test_a_seed_shuffles_within_rounds_and_the_same_seed_repeats_it():
    points = _points()
    first = in_round_order(points, 7, "desc")
    assert first == in_round_order(points, 7, "desc")  # reproducible from the recorded seed
    assert sorted(map(id, first)) == sorted(map(id, points))  # every point once
    assert [p.repeat for p in first] == [p.repeat for p in points]  # round r before round r + 1
    orders = {tuple(_legs(in_round_order(points, seed, "desc"), 0)) for seed in range(40)}
    assert len(orders) > 10  # seeds give different orders
    firsts = {_legs(in_round_order(points, seed, "desc"), 0)[0] for seed in range(40)}
    assert firsts == set(LEGS)  # every leg is sometimes first: none always meets the round's start
    # within one run the rounds are drawn apart: not every round in the same order
    assert len({tuple(_legs(first, r)) for r in range(3)}) > 1 or \
        len({tuple(_legs(in_round_order(points, 8, "desc"), r)) for r in range(3)}) > 1


def test_points_sharing_a_target_stay_together():
    for seed in range(30):
        for r in range(3):
            legs = _legs(in_round_order(_points(), seed, "d"), r)
            at = sorted(legs.index(leg) for leg in "abc")
            assert at == list(range(at[0], at[0] + 3)), legs  # one target start per round, as before
            at = sorted(legs.index(leg) for leg in "ef")
            assert at[1] == at[0] + 1, legs


# -- through the CLI ---------------------------------------------------------------------------------

SPEC = ('study = "overhead"\n' + head(repeats=2)
        + '[params]\niodepth = [1, 2]\nbs = ["4k"]\nbapp_iodepth = [1]\nlegs = ["local", "loopback"]\n')


def _plan(tmp_path, env, *extra: str) -> list[str]:
    spec = tmp_path / "overhead.toml"
    spec.write_text(SPEC)
    done = nvmflab("run", str(spec), "--plan", *extra, env=env)
    assert done.returncode == 0, done.stderr
    seed = extra[extra.index("--order-seed") + 1]
    assert done.stdout.strip().splitlines()[-1].endswith(f"--order-seed {seed} runs them so)")  # says how to rerun
    return [line for line in done.stdout.splitlines() if line.startswith("# ")]


def test_the_plan_follows_the_seed_given_on_the_command_line(tmp_path, fake_env):
    one, again = _plan(tmp_path, fake_env, "--order-seed", "1"), _plan(tmp_path, fake_env, "--order-seed", "1")
    assert one == again and len(one) >= 8  # two rounds of both legs' apps and depths
    others = [_plan(tmp_path, fake_env, "--order-seed", str(seed)) for seed in range(2, 8)]
    assert any(o != one for o in others) and all(sorted(o) == sorted(one) for o in others)
    bad = nvmflab("run", str(tmp_path / "overhead.toml"), "--plan", "--order-seed", "-3", env=fake_env)
    assert bad.returncode == 2 and "--order-seed" in bad.stderr and "Traceback" not in bad.stderr


SWEEP = 'name = "order"\n' + head(repeats=2) + "[sweep]\niodepth = [1, 2, 4]\n"


def _run(tmp_path, results: str, seed: int | None = None, plan: bool = False):
    """The sweep run in this process (no report: the order is the question), as `run --order-seed`."""
    path = tmp_path / "sweep.toml"
    path.write_text(SWEEP)
    spec = load_study_spec(path, quick=False, study=None)
    if seed is not None:
        spec = spec.model_copy(update={"order_seed": seed})
    summary = run_spec(spec, path, "order", tmp_path / results, quick=False, plan=plan)
    if plan:
        return [(line.split(" · ")[1], int(line.split(" · ")[2].split()[1]), line.split(" · ")[3])
                for line in summary.text.splitlines() if line.startswith("# ")]
    assert summary.code == 0, summary.text
    with sqlite3.connect(tmp_path / results / "results.sqlite") as db:
        envs = [json.loads(e) for (e,) in db.execute("SELECT env_json FROM runs ORDER BY run_id")]
        order = [(leg, rep, ", ".join(f"{k}={v}" for k, v in sorted(json.loads(knobs).items())))
                 for leg, rep, knobs in db.execute("SELECT leg, repeat, knobs_json FROM points ORDER BY point_id")]
    return summary.text, envs, order


def test_a_run_records_its_seed_and_the_recorded_seed_repeats_its_order(tmp_path, fake_env):
    _, envs, order = _run(tmp_path, "drawn")
    seed = envs[0]["order_seed"]
    assert isinstance(seed, int) and envs[0]["spec_effective"]["order_seed"] == seed
    assert len(order) == 6 and [rep for _, rep, _ in order] == [0, 0, 0, 1, 1, 1]  # rounds in sequence
    assert _run(tmp_path, "plan", seed, plan=True) == order  # the recorded seed gives the order again
    others = [_run(tmp_path, "plan", s, plan=True) for s in range(seed + 1, seed + 6)]
    assert any(o != order for o in others)
    # the same results directory with another seed: nothing measured again, nothing refused
    text, envs, order_after = _run(tmp_path, "drawn", seed + 1)
    assert "nothing new" in text and order_after == order and envs[-1]["order_seed"] == seed + 1
