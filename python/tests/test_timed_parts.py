"""scripts/timed-parts.sh, which runs `make test`'s parts: steps in order, "a+b" side by side, the
first failing step ends the run with its status, and the breakdown names every part."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "timed-parts.sh"

# `left` and `right` each wait (bounded: WAIT tenths of a second) for the other to have started: they
# finish only when both run at the same time. make itself exits 2 when a recipe fails.
MAKEFILE = """\
WAIT ?= 100
first:
\t@echo first ran >> log
left:
\t@touch left.started; for i in $$(seq $(WAIT)); do [ -e right.started ] && exit 0; sleep 0.1; done; exit 7
right:
\t@touch right.started; for i in $$(seq $(WAIT)); do [ -e left.started ] && exit 0; sleep 0.1; done; exit 7
broken:
\t@echo broken says hello; exit 3
after:
\t@echo after ran >> log
"""


def _run(tmp_path: Path, *steps: str, wait: int = 100) -> subprocess.CompletedProcess:
    (tmp_path / "Makefile").write_text(MAKEFILE)
    return subprocess.run(["bash", str(SCRIPT), *steps], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin", "NVMFLAB_TIMINGS": str(tmp_path / "t.tsv"),
                                           "WAIT": str(wait)})


def test_side_by_side_parts_run_together_and_are_named_in_the_breakdown(tmp_path):
    done = _run(tmp_path, "first", "left+right", "after")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "log").read_text().splitlines() == ["first ran", "after ran"]
    rows = [line.split("\t") for line in (tmp_path / "t.tsv").read_text().splitlines()]
    assert [r[0] for r in rows] == ["first", "left", "right", "after"]
    assert rows[1][2] == rows[2][2] == "ok (beside: left+right)"
    assert "time per part" in done.stdout


def test_a_chain_runs_its_parts_in_turn_beside_the_other_side(tmp_path):
    done = _run(tmp_path, "left+first,right,after")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "log").read_text().splitlines() == ["first ran", "after ran"]
    rows = [line.split("\t") for line in (tmp_path / "t.tsv").read_text().splitlines()]
    assert [r[0] for r in rows] == ["left", "first", "right", "after"]
    assert {r[2] for r in rows} == {"ok (beside: left+first,right,after)"}


def test_a_failing_chain_stops_and_its_later_parts_are_named_not_run(tmp_path):
    done = _run(tmp_path, "broken,after+first")
    assert done.returncode == 2
    states = {r.split("\t")[0]: r.split("\t")[2] for r in (tmp_path / "t.tsv").read_text().splitlines()}
    assert states == {"broken": "FAILED (exit 2)", "after": "not run (its chain stopped)",
                      "first": "ok (beside: broken,after+first)"}
    assert (tmp_path / "log").read_text().splitlines() == ["first ran"]


def test_a_failing_part_stops_the_run_with_its_status_and_the_rest_is_not_run(tmp_path):
    done = _run(tmp_path, "first", "broken+first", "after")
    assert done.returncode == 2
    assert "[broken] broken says hello" in done.stdout  # side-by-side output is prefixed
    assert "[broken] make: *** [Makefile" in done.stdout and "Error 3" in done.stdout
    assert (tmp_path / "log").read_text().splitlines() == ["first ran", "first ran"]
    states = {r.split("\t")[0]: r.split("\t")[2] for r in (tmp_path / "t.tsv").read_text().splitlines()}
    assert states["broken"] == "FAILED (exit 2)" and "after" not in states


def test_parts_run_alone_do_not_overlap(tmp_path):
    # Run one after the other, each side of `left`/`right` waits for a partner that never comes.
    done = _run(tmp_path, "left", "right", wait=10)
    assert done.returncode == 2 and "Error 7" in done.stderr
    rows = [line.split("\t") for line in (tmp_path / "t.tsv").read_text().splitlines()]
    assert rows == [["left", rows[0][1], "FAILED (exit 2)", rows[0][3]]]


def test_each_part_reports_its_own_cpu_seconds(tmp_path):
    # `spin` computes (a fixed count of shell arithmetic: CPU time however loaded the machine is),
    # `nap` sleeps about as long: only the first has CPU seconds of its own.
    makefile = MAKEFILE + ("spin:\n\t@i=0; while [ $$i -lt 400000 ]; do i=$$((i+1)); done\n"
                           "nap:\n\t@sleep 1\n")
    (tmp_path / "Makefile").write_text(makefile)
    done = subprocess.run(["bash", str(SCRIPT), "spin", "nap"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "NVMFLAB_TIMINGS": str(tmp_path / "t.tsv")})
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {r.split("\t")[0]: r.split("\t") for r in (tmp_path / "t.tsv").read_text().splitlines()}
    assert float(rows["spin"][3]) >= 0.1 and float(rows["nap"][3]) < 0.1, rows
    assert "cpu-s" in done.stdout
