"""Progress a person can follow: one line per point off a terminal, an estimate from measured points,
reasons of skipped and failed points on the console."""

import io
import re

import pytest
from conftest import nvmflab

from nvmflab.plan import Point
from nvmflab.progress import Estimator, Tracker, clock

LINE = re.compile(r"^(?P<study>\S+) · (?P<leg>\S+) · point (?P<i>\d+)/(?P<n>\d+) · (?P<status>\w+)(?P<reason>: .*)? · "
                  r"took (?P<took>[\d.]+) s · elapsed (?P<elapsed>[\d:]+) · (?P<estimate>.*)$")


def point_lines(stdout: str) -> list[re.Match]:
    return [m for m in map(LINE.match, stdout.splitlines()) if m]


def test_estimate_scales_nominal_time_by_what_measured_points_took():
    estimator = Estimator()
    assert estimator.remaining(10.0) is None  # nothing measured: no guess
    estimator.add(1.0, 1.5)
    estimator.add(1.0, 2.5)
    assert estimator.remaining(10.0) == pytest.approx(20.0)
    assert clock(3725) == "1:02:05" and clock(65) == "1:05" and clock(None) == "?"


def _point(i: int, runtime: float = 1.0, skip: str | None = None) -> Point:
    return Point(study="s", leg="l", knobs={"i": i}, repeat=0, jobs=[], runtime=runtime, ramp_time=0,
                 skip_reason=skip)


def test_stored_and_skipped_points_do_not_skew_the_estimate():
    out = io.StringIO()
    tracker = Tracker(out, terminal=False)
    points = [_point(i) for i in range(6)] + [_point(9, skip="needs root")]
    stored = {points[0].key, points[1].key}
    leg = tracker.leg("s: l", points, stored)
    leg.skip_stored(2)
    leg.finished(points[2], "ok", None, 3.0)  # 1 s nominal took 3 s: 3 more such points, 9 s
    assert leg.remaining() == pytest.approx(9.0)
    leg.finished(points[6], "skipped", "needs root", 0.0)  # instant, and not part of the estimate
    assert leg.remaining() == pytest.approx(9.0)
    lines = out.getvalue().splitlines()
    assert lines[0] == "s: l · 2 of 7 point(s) already stored, not run again"
    assert LINE.match(lines[1])["estimate"] == "about 0:09 left" and LINE.match(lines[1])["i"] == "3"
    skipped = LINE.match(lines[2])
    assert skipped["status"] == "skipped" and skipped["reason"] == ": needs root"


def test_terminal_keeps_rich_bars_and_prints_reasons():
    out = io.StringIO()
    with Tracker(out, terminal=True) as tracker:
        points = [_point(i) for i in range(2)]
        leg = tracker.leg("s: l", points, set())
        leg.finished(points[0], "failed", "nvmf-perf (main) exited 1: connect failed", 1.0)
        leg.finished(points[1], "ok", None, 1.0)
    text = out.getvalue()
    assert "\x1b[" in text  # drawn by rich for a terminal
    assert "point 1/2 failed: nvmf-perf (main) exited 1: connect failed" in text


def test_the_estimate_covers_every_leg_the_study_planned():
    out = io.StringIO()
    tracker = Tracker(out, terminal=False)
    first, second = [_point(i) for i in range(2)], [_point(i, runtime=4.0) for i in range(10, 12)]
    tracker.plan(first + second + [_point(99, skip="no nvmet")], stored=set())
    leg = tracker.leg("s: first", first, set())
    leg.finished(first[0], "ok", None, 2.0)  # took twice its nominal second
    assert leg.remaining() == pytest.approx(2.0)  # one more 1 s point in this leg
    assert tracker.study_remaining() == pytest.approx(2.0 * (1 + 4 + 4))  # and two 4 s points after it
    assert LINE.match(out.getvalue().splitlines()[0])["estimate"] == "about 0:02 left in this leg, 0:18 in the study"


def test_a_run_off_a_terminal_prints_one_line_per_point_with_reasons(tmp_path, fake_env, tiny_spec):
    env = fake_env | {"FAKE_PERF_FAIL_IODEPTH": "4"}
    done = nvmflab("run", str(tiny_spec), "--results", str(tmp_path / "r"), env=env)
    assert done.returncode == 1, done.stderr  # some points failed
    lines = point_lines(done.stdout)
    assert [(m["study"], m["leg"], int(m["i"]), int(m["n"])) for m in lines] == [("tiny", "sweep", i, 8)
                                                                                  for i in range(1, 9)]
    failed = [m for m in lines if m["status"] == "failed"]
    assert len(failed) == 4 and all("exited 1: nvmf-perf: connect failed" in m["reason"] for m in failed)
    assert lines[-1]["estimate"] == "leg done"
    assert all(re.fullmatch(r"about [\d:]+ left in this leg, [\d:]+ in the study", m["estimate"]) for m in lines[:-1])
    # the estimate falls as points finish (each point is about as long as the others)
    seconds = [sum(int(x) * 60 ** k for k, x in enumerate(reversed(m["estimate"].split()[1].split(":"))))
               for m in lines[:-1]]
    assert seconds[-1] < seconds[0] or seconds[0] <= 1

    # resumed: the stored half is announced once and the retried points count from 5
    again = nvmflab("run", str(tiny_spec), "--results", str(tmp_path / "r"), env=fake_env)
    assert "tiny: sweep · 4 of 8 point(s) already stored, not run again" in again.stdout
    assert [int(m["i"]) for m in point_lines(again.stdout)] == [5, 6, 7, 8]
    assert {m["status"] for m in point_lines(again.stdout)} == {"ok"}


def test_runner_prints_the_reason_of_a_skipped_point(tmp_path):
    from nvmflab.runner import Runner
    from nvmflab.stacks import get_stack
    from nvmflab.store import ResultsStore

    out = io.StringIO()
    with ResultsStore(tmp_path) as store, Tracker(out, terminal=False) as tracker:
        runner = Runner(store, store.start_run("s", "", {}), get_stack("ours"), progress=tracker)
        (outcome,) = runner.run([_point(1, skip="needs root to create network namespaces")], "s: l")
        runner.close()
    assert outcome.status == "skipped"
    (line,) = point_lines(out.getvalue())
    assert line["status"] == "skipped" and line["reason"] == ": needs root to create network namespaces"
