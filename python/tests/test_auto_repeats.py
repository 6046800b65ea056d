"""`repeats = "auto"`: a stable configuration stops at min_repeats, a noisy one runs to max_repeats and
the report names it; the planning pass never loops; intervals come from scipy."""

import math
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import REPO, nvmflab, ours_stacks

from nvmflab.analysis.stats import bootstrap_ci95, ci95_halfwidth, diff_interval, t95
from nvmflab.runner import Outcome
from nvmflab.spec import Spec, SpecError, load_spec
from nvmflab.store import ResultsStore
from nvmflab.studies.common import Context, point_knobs, repeated, tcp_point
from nvmflab.topology.base import Hosts
from nvmflab.topology.local import LocalHost

AUTO_SPEC = """
name = "auto"
min_repeats = 3
max_repeats = 5
ramp_time = 0
runtime = 0.2
[workload]
rw = "randread"
[sweep]
iodepth = [1, 4]
completion = ["poll"]
"""


def test_t_quantiles_come_from_scipy():
    assert t95(1) == pytest.approx(12.706, abs=1e-3) and t95(2) == pytest.approx(4.303, abs=1e-3)
    assert t95(100) == pytest.approx(1.984, abs=1e-3)  # the old table jumped to 1.960 past 30
    assert math.isnan(t95(0))
    assert ci95_halfwidth([1.0, 2.0, 3.0]) == pytest.approx(4.303 / math.sqrt(3), rel=1e-3)
    _, half = diff_interval(10, 1, 3, 12, 1, 3)  # Welch dof 4 exactly
    assert half == pytest.approx(2.776 * math.sqrt(2 / 3), rel=1e-3)
    low, high = bootstrap_ci95([10, 11, 12, 13, 50])
    assert low <= 12 <= high
    assert bootstrap_ci95([5, 5, 5]) == (5, 5) and math.isnan(bootstrap_ci95([5])[0])


def test_spec_repeats_auto_is_the_default_and_quick_variants_fix_the_count():
    spec = Spec.model_validate({})
    assert spec.auto_repeats and spec.repeats == 3 and spec.max_repeats == 10
    fixed = Spec.model_validate({"repeats": 4})
    assert not fixed.auto_repeats and fixed.repeats == 4
    with pytest.raises(ValueError, match="max_repeats"):
        Spec.model_validate({"min_repeats": 6, "max_repeats": 4})
    for path in sorted((REPO / "studies").glob("*.toml")):
        raw = tomllib.loads(path.read_text())
        assert isinstance(raw["quick"].get("repeats"), int), f"{path.name}: [quick] must fix repeats"
        assert load_spec(path).auto_repeats, f"{path.name}: a full run repeats until stable"
        assert not load_spec(path, quick=True).auto_repeats


def test_auto_repeats_stop_when_stable_and_cap_the_noisy(tmp_path, fake_env):
    spec = tmp_path / "auto.toml"
    spec.write_text(AUTO_SPEC)
    env = fake_env | {"FAKE_PERF_NOISY_IODEPTH": "4"}
    done = nvmflab("run", str(spec), "--results", str(tmp_path / "r"), env=env, timeout=180)
    assert done.returncode == 0, done.stderr + done.stdout
    rows = ResultsStore(tmp_path / "r").measurements()
    repeats = rows.groupby("iodepth")["repeat"].apply(lambda s: sorted(set(s)))
    assert repeats[1] == [0, 1, 2]  # deterministic: stable at min_repeats
    assert repeats[4] == [0, 1, 2, 3, 4]  # ±30 % noise: runs to max_repeats
    assert set(rows["status"]) == {"ok"}
    assert "after 5 repeats (max_repeats)" in done.stdout + done.stderr
    html = (tmp_path / "r" / "report" / "report.html").read_text()
    assert "Not stable: 1 configuration(s) reached max_repeats (5)" in html
    assert "iodepth=4" in html.split("Not stable")[1].split("</")[0]


def _context(tmp_path, spec: Spec, runner) -> Context:
    return Context(spec, "auto", runner, ResultsStore(tmp_path))


def test_the_planning_pass_does_not_loop(tmp_path):
    spec = Spec.model_validate({"name": "auto", "runtime": 0.2, "ramp_time": 0})
    calls = []
    local = LocalHost()
    runner = SimpleNamespace(planning=True, progress=None, hosts=Hosts(local, [local]), stacks_for=ours_stacks,
                             run=lambda points, description: calls.append(points) or
                             [Outcome(p, "planned") for p in points])
    ctx = _context(tmp_path, spec, runner)
    sets = [point_knobs(ctx, {"iodepth": qd}) for qd in (1, 4)]
    outcomes = ctx.run(repeated(ctx, sets, lambda k, r: tcp_point(ctx, "sweep", k, r)), "plan")
    assert len(calls) == 1 and len(outcomes) == 6
    assert sorted({p.repeat for p in calls[0]}) == [0, 1, 2]


def test_added_rounds_are_interleaved_and_failures_get_none(tmp_path):
    """A runner that stores fixed IOPS per configuration: qd4 alternates 1000/2000 (never stable),
    qd8 fails. The call is one comparison: each round holds every live member (qd1 and qd4, not
    the failing qd8); compared per queue depth, qd1 stops at min_repeats."""
    spec = Spec.model_validate({"name": "auto", "runtime": 0.2, "ramp_time": 0, "max_repeats": 5})
    store = ResultsStore(tmp_path)
    run_id = store.start_run("auto", "", {})
    local = LocalHost()
    rounds = []

    def run(points, description):
        rounds.append([(p.knobs["iodepth"], p.repeat) for p in points])
        out = []
        for p in points:
            qd = p.knobs["iodepth"]
            if qd == 8:
                store.save_point(run_id, p.key, p.study, p.leg, p.knobs, p.repeat, "failed", "boom", [])
                out.append(Outcome(p, "failed", "boom"))
                continue
            iops = 500.0 if qd == 1 else (1000.0 if p.repeat % 2 else 2000.0)
            store.save_point(run_id, p.key, p.study, p.leg, p.knobs, p.repeat, "ok", None,
                             [{"role": "main", "iops": iops, "lat_mean_ns": 1e4}])
            out.append(Outcome(p, "ok"))
        return out

    runner = SimpleNamespace(planning=False, progress=None, hosts=Hosts(local, [local]), stacks_for=ours_stacks,
                             run=run)
    ctx = Context(spec, "auto", runner, store)
    sets = [point_knobs(ctx, {"iodepth": qd}) for qd in (1, 4, 8)]
    outcomes = ctx.run(repeated(ctx, sets, lambda k, r: tcp_point(ctx, "sweep", k, r)), "unit")
    assert rounds[0] == [(qd, r) for r in range(3) for qd in (1, 4, 8)]
    assert rounds[1:] == [[(1, 3), (4, 3)], [(1, 4), (4, 4)]]
    assert len(outcomes) == 13
    assert [(leg, knobs["iodepth"], n) for _, leg, knobs, n, _ in ctx.capped] == [("sweep", 4, 5)]
    rounds.clear()
    ctx = Context(spec, "auto", runner, ResultsStore(tmp_path / "apart"))
    store = ctx.store
    run_id = store.start_run("auto", "", {})
    ctx.run(repeated(ctx, sets, lambda k, r: tcp_point(ctx, "sweep", k, r)), "unit",
            compare_by=lambda p: p.knobs["iodepth"])
    assert rounds[1:] == [[(4, 3)], [(4, 4)]]
