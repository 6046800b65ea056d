"""End to end against the real nvmf-target and nvmf-perf: a tiny study, then the database and the
report checked."""

import json
import os
import platform
import re
from pathlib import Path

import pytest
from conftest import nvmflab

from nvmflab.env import cpu_model
from nvmflab.store import ResultsStore
from nvmflab.tools import find_tool

BINARIES = [find_tool(n) for n in ("nvmf-target", "nvmf-perf")]
pytestmark = pytest.mark.skipif(
    any(b is None or "fakebin" in str(b) for b in BINARIES),
    reason="nvmf-target/nvmf-perf not built (cargo build --release --workspace --bins, or set NVMFLAB_BIN_DIR)")

SPEC = """
name = "e2e"
study = "interference"
repeats = 1
ramp_time = 0.2
runtime = 0.5
[topology]
target_cores = [0, 1]
host_cores = [1, 0, 1]
[backend]
kind = "ram"
size = "16MiB"
[params]
resources = ["initiator"]
fg_apps = ["L-app"]
bg_load_pct = [50, "max"]
bg_iodepth = 8
calibrate_iodepth = [4, 8]
control = true
"""


def test_tiny_interference_study_on_real_binaries(tmp_path):
    spec = tmp_path / "e2e.toml"
    spec.write_text(SPEC)
    env = dict(os.environ, NVMFLAB_BIN_DIR=str(Path(BINARIES[0]).parent))
    done = nvmflab("run", str(spec), "--results", str(tmp_path / "r"), env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    report = Path(done.stdout.strip().splitlines()[-1])
    store = ResultsStore(tmp_path / "r")
    runs, points, frame = store.runs(), store.points(), store.measurements()
    # the run: its spec as written, the environment, finished
    assert len(runs) == 1 and runs.at[0, "spec_toml"] == SPEC and isinstance(runs.at[0, "finished_at"], str)
    env = json.loads(runs.at[0, "env_json"])
    assert env["cpu_model"] == cpu_model() and env["kernel"] == platform.release()
    assert env["tools"]["nvmf-target"]["version"] and env["tools"]["nvmf-perf"]["version"]
    # the points: 2 calibration, initiator isolated + 2 loads, control isolated + max
    assert sorted(points["leg"]) == ["calibrate_initiator"] * 2 + ["control_initiator"] * 2 + ["initiator"] * 3
    assert set(frame["status"]) <= {"ok", "invalid"}, frame[["leg", "status", "error"]].to_string()
    assert set(frame["leg"]) == {"calibrate_initiator", "initiator", "control_initiator"}
    control = frame[frame["leg"] == "control_initiator"]
    assert sorted((role, str(load)) for role, load in zip(control["role"], control["bg_load_pct"])) == [
        ("bg", "inf"), ("fg", "inf"), ("fg", "nan")]
    assert (frame["iops"] > 0).all() and (frame["lat_p99_ns"] > 0).all() and (frame["engine"] == "tcp").all()
    # every fg/bg point checked its placement on the target's counters
    with_bg = frame[frame["bg_load_pct"].notna()]
    assert set(with_bg["role"]) == {"fg", "bg"} and with_bg["invariant_ok"].notna().all()
    # nvmf-perf reports its ramp I/O (nvmflab.jobs[i].ramp_ios), so the served commands are checked
    # exactly, for fg and bg: served = measured + ramp, and every point passes
    assert frame["invariant_ok"].all(), frame[["leg", "invariant_detail"]].to_string()
    for detail in frame["invariant_detail"]:
        equations = re.findall(r"(fg|bg): reactor \d served (\d+) commands = (\d+) measured \+ (\d+) ramp \(exact\)",
                               detail)
        assert equations and "loose" not in detail, detail
        for _, served, measured, ramp in equations:
            assert int(served) == int(measured) + int(ramp) and int(ramp) > 0, detail
    fg_detail = with_bg[with_bg["role"] == "fg"]["invariant_detail"].iloc[0]
    assert re.match(r"fg: reactor 0 served \d+ commands = \d+ measured \+ \d+ ramp \(exact\); bg: reactor 1 ",
                    fg_detail), fg_detail
    counters = json.loads(with_bg.iloc[0]["target_counters_json"])
    served = {ns["subnqn"].rsplit(":", 1)[1]: r["index"] for r in counters["reactors"]
              for ns in r["namespaces"] if ns["commands"] > 0}
    assert served == {"fg": 0, "bg": 1}
    hist = json.loads(frame.iloc[0]["histogram_json"])
    assert sum(c for _, c in hist) > 0
    # target CPU per point is the target process's usr + sys over that point: known everywhere, at
    # most its two cores' time over a 0.7 s point (with start-up slack), and the run's points, which
    # served thousands of commands, cost it some
    target_cpu = (frame["target_usr_s"] + frame["target_sys_s"]).groupby(frame["point_id"]).first()
    assert target_cpu.notna().all() and target_cpu.between(0, 2 * 3.0).all(), target_cpu.to_dict()
    assert target_cpu.sum() > 0, target_cpu.to_dict()
    capped = with_bg[(with_bg["role"] == "bg") & (with_bg["bg_load_pct"] == 50)]
    assert (capped["rate_iops"] > 0).all()
    # the report: figures embedded and written, findings with numbers, environment, spec
    html = report.read_text()
    figures = sorted(p.stem for p in (report.parent / "figures").glob("*.png"))
    assert {"interference_latency_vs_load", "interference_throughput_vs_load"} <= set(figures)
    assert html.count('src="data:image/png;base64,') == len(figures)
    assert re.search(r"Shared initiator core, L-app \(isolated p99 [\d.]+ µs\): latency interference "
                     r"(stayed near|went from) [\d.]+×", html)
    assert re.search(r"Control \(shared network only, background as in the initiator leg\), L-app: with a "
                     r"background of 1 job\(s\), [\d.]+ KIOPS uncapped, latency interference [\d.]+×, "
                     r"throughput sustained \d+ %", html)
    assert cpu_model() in html and platform.release() in html and env["tools"]["nvmf-perf"]["version"] in html
    assert "calibrate_iodepth = [4, 8]" in html and "control = true" in html
    # one completion mode: the report says the thesis's polling hypothesis was not tested
    assert "Polling hypothesis (untested)" in html


def test_interference_under_both_completion_modes_tests_the_polling_hypothesis(tmp_path):
    """Both host completion modes, two repeats each (interleaved): each mode calibrates its own
    saturation point, every point passes the exact count invariant, and the report judges the
    thesis's polling hypothesis from the interval of poll − event."""
    spec = tmp_path / "modes.toml"
    spec.write_text(SPEC.replace("repeats = 1", "repeats = 2")
                    .replace('bg_load_pct = [50, "max"]', 'bg_load_pct = ["max"]')
                    .replace("calibrate_iodepth = [4, 8]", "calibrate_iodepth = [8]")
                    .replace("control = true", 'control = false\ncompletion = ["event", "poll"]'))
    env = dict(os.environ, NVMFLAB_BIN_DIR=str(Path(BINARIES[0]).parent))
    done = nvmflab("run", str(spec), "--results", str(tmp_path / "r"), env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    frame = ResultsStore(tmp_path / "r").measurements()
    assert frame["invariant_ok"].all(), frame[["leg", "invariant_detail"]].to_string()
    assert all("(exact)" in d for d in frame["invariant_detail"])
    for mode in ("event", "poll"):
        mine = frame[frame["completion"] == mode]
        assert sorted(set(mine["leg"])) == ["calibrate_initiator", "initiator"]
        assert len(mine[(mine["leg"] == "initiator") & (mine["role"] == "fg")]) == 4  # iso + max, 2 repeats
    html = Path(done.stdout.strip().splitlines()[-1]).read_text()
    assert "Initiator interference: completion poll vs event" in html
    assert re.search(r"Polling hypothesis \((supported|contradicted|mixed|no clear difference)\): The thesis&#39;s "
                     r"hypothesis \(§6.3\)", html)
    assert re.search(r"latency interference ranged [\d.]+–[\d.]+× with completion event, [\d.]+–[\d.]+× with "
                     r"completion poll", html)
