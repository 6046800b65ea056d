"""The real A/A run (issue 22 item 1): two configurations that differ only in a knob that cannot
matter on loopback (`so_priority`, the socket priority, which picks a qdisc band no loopback
packet waits in) run through the real study and decision path (`nvmflab run`, interleaved repeats
at the quick count, the sweep's two-value comparison with Holm over four metrics). The report must
find no clear difference.

The decision holds its family-wise error at 5 %, so one run declares a difference that is not there
about 1 time in 20 by design. A second run is made only when the first finds one: a systematic bias
(an order effect, a knob that does matter) shows in both, chance in both about 1 time in 400."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import nvmflab
from tiny_specs import head

from nvmflab.analysis import sweep
from nvmflab.store import ResultsStore
from nvmflab.tools import find_tool

BINARIES = [find_tool(n) for n in ("nvmf-target", "nvmf-perf")]
real_binaries = pytest.mark.skipif(
    any(b is None or "fakebin" in str(b) for b in BINARIES),
    reason="nvmf-target/nvmf-perf not built (cargo build --release --workspace --bins, or set NVMFLAB_BIN_DIR)")

SPEC = 'name = "aa"\n' + head(repeats=3) + "[sweep]\nso_priority = [0, 6]\n"


def _run(tmp_path: Path, attempt: int) -> tuple[list[str], ResultsStore]:
    spec = tmp_path / "aa.toml"
    spec.write_text(SPEC)
    results = tmp_path / f"r{attempt}"
    env = dict(os.environ, NVMFLAB_BIN_DIR=str(Path(BINARIES[0]).parent))
    done = nvmflab("run", str(spec), "--results", str(results), env=env, timeout=90)
    assert done.returncode == 0, done.stderr
    store = ResultsStore(results)
    return sweep.analyze(store.measurements(), store.runs(), "aa").findings, store


def _stored(tmp_path: Path, iops_by_value: dict[int, list[float]]) -> list[str]:
    store = ResultsStore(tmp_path / "synthetic")
    run = store.start_run("aa", SPEC, {})
    for value, series in iops_by_value.items():
        for repeat, iops in enumerate(series):
            knobs = {"so_priority": value, "rw": "randread", "bs": 4096, "iodepth": 1}
            store.save_point(run, f"p{value}-{repeat}", "aa", "sweep", knobs, repeat, "ok", None,
                             [{"knobs": knobs, "role": "main", "engine": "tcp", "iops": iops, "bw_bytes": iops * 4096,
                               "lat_mean_ns": 1e9 / iops, "lat_p99_ns": 3e9 / iops}])
    return sweep.analyze(store.measurements(), store.runs(), "aa").findings


def test_a_two_valued_sweep_of_a_knob_outside_the_result_columns_is_compared(tmp_path):
    clear = _stored(tmp_path / "a", {0: [10e3, 10.2e3, 9.9e3], 6: [20e3, 20.3e3, 19.8e3]})
    assert clear[0].startswith("so_priority = 6 against so_priority = 0: a clear difference in IOPS, bandwidth, "
                               "mean latency, p99 latency"), clear
    same = _stored(tmp_path / "b", {0: [10e3, 10.4e3, 9.7e3], 6: [10.1e3, 9.8e3, 10.3e3]})
    assert "no clear difference in any main metric" in same[0], same
    assert not any("highest throughput" in f for f in same)  # no winner picked from two means


@real_binaries
def test_so_priority_on_loopback_shows_no_clear_difference(tmp_path):
    for attempt in range(2):
        findings, store = _run(tmp_path, attempt)
        frame = store.measurements()
        # both configurations ran, three times each, and the knob reached their points
        assert sorted(frame.groupby("so_priority")["point_id"].nunique().items()) == [(0, 3), (6, 3)]
        assert (frame["status"] == "ok").all(), frame[["status", "error"]].to_string()
        verdict = [f for f in findings if f.startswith("so_priority = 6 against so_priority = 0:")]
        assert len(verdict) == 1, findings
        if "no clear difference in any main metric" in verdict[0]:
            assert verdict[0].count("95 % interval of the difference") == 4, verdict[0]
            return
    pytest.fail(f"two A/A runs in a row declared a difference: {verdict[0]}")
