"""perf stat software counters per core around a point (issue 22 item 7): parsing, a real count
where perf is installed, and the counts in a point's per-core window through the runner."""

import json
import shutil
import time

import pytest
from conftest import nvmflab

from nvmflab import perfstat
from nvmflab.analysis.cores_used import with_cores
from nvmflab.store import ResultsStore

CSV = """# started on Fri Nov 27 01:40:00 2026

CPU0,1020.17,msec,task-clock,1020171298,100.00,1.993,CPUs utilized
CPU1,998.5,msec,task-clock,998500000,100.00,0.99,CPUs utilized
CPU0,952,,context-switches,1020168523,100.00,933.177,/sec
CPU1,<not counted>,,context-switches,0,0.00,,
CPU0,7,,cpu-migrations:u,1020167362,100.00,6.862,/sec
CPUx,5,,page-faults,1,100.00,,
garbage
"""


def test_parse_keeps_counted_events_per_core():
    counts = perfstat.parse(CSV)
    assert counts == {"0": {"task-clock": 1020.17, "context-switches": 952.0, "cpu-migrations": 7.0},
                      "1": {"task-clock": 998.5}}
    assert perfstat.parse("") == {}


@pytest.mark.skipif(shutil.which("perf") is None, reason="perf is not installed here")
def test_counts_a_core_of_this_machine(tmp_path):
    counting = perfstat.start([0], tmp_path / "c.csv")
    assert counting is not None
    time.sleep(0.3)
    counts = counting.stop()
    if counts is None:  # perf present but not allowed to count (perf_event_paranoid): says nothing
        pytest.skip("perf may not count system-wide here")
    assert set(counts) == {"0"} and counts["0"]["task-clock"] > 0
    assert perfstat.start([], tmp_path / "d.csv") is None


@pytest.mark.skipif(shutil.which("perf") is None, reason="perf is not installed here")
def test_the_runner_puts_the_counts_in_the_points_core_window(tmp_path, tiny_spec, fake_env):
    done = nvmflab("run", str(tiny_spec), "--results", str(tmp_path / "r"), env=fake_env, timeout=180)
    assert done.returncode == 0, done.stderr + done.stdout
    rows = ResultsStore(tmp_path / "r").measurements()
    detail = json.loads(rows["cpu_cores_json"].dropna().iloc[0])
    counted = detail["local"].get("perf_stat")
    if not counted:
        pytest.skip("perf may not count system-wide here")
    assert set(counted) <= {str(c) for c in detail["local"]["involved"]}
    assert all(v["task-clock"] >= 0 for v in counted.values())
    out = with_cores(rows)
    assert out["host_cswitch_per_io"].notna().any() or out["cpu_migrations"].notna().any()
