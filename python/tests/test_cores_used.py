"""Issue 22 items 8 and 7: the distinct cores each side used, roles on one core flagged and kept
out of "own cores" findings, and CPU per I/O counted over each side's cores (user + system +
softirq from per-core /proc/stat)."""

import json
import math

import pandas as pd
import pytest
from test_study_extra import _row, _save

from nvmflab.analysis import dimensions, parallelism
from nvmflab.analysis.cores_used import point_cores, used_text, with_cores
from nvmflab.store import ResultsStore


def cores_json(roles: dict, per_core: dict, machine: str = "local") -> str:
    """A point's cpu_cores_json as sysstat.summarize writes it: roles → cores, seconds per core."""
    return json.dumps({machine: {"roles": roles, "wall_s": 1.0, "cores": {
        str(c): {"user_s": u, "system_s": s, "softirq_s": q, "irq_s": 0.0, "idle_s": 0.0, "iowait_s": 0.0,
                 "steal_s": 0.0} for c, (u, s, q) in per_core.items()}}})


def test_each_side_is_counted_over_its_own_cores_with_softirq():
    text = cores_json({"main": [1], "target": [0]}, {0: (0.2, 0.3, 0.1), 1: (0.4, 0.1, 0.05), 2: (9.0, 9.0, 9.0)})
    cores = point_cores(text)
    assert cores["host"] == ["cpu1"] and cores["target"] == ["cpu0"] and cores["distinct"] == 2
    assert not cores["shared"]
    assert cores["seconds"]["host"] == pytest.approx(0.55) and cores["seconds"]["target"] == pytest.approx(0.6)
    rows = pd.DataFrame([{"point_key": "p", "total_ios": 100_000, "cpu_cores_json": text}])
    out = with_cores(rows).iloc[0]
    assert out["host_cpu_us_per_io"] == pytest.approx(5.5)  # 0.55 s / 100k I/Os; cpu2 (not ours) not counted
    assert out["target_cpu_us_per_io"] == pytest.approx(6.0)
    assert out["cpu_us_per_io"] == pytest.approx(11.5)
    assert out["target_softirq_us_per_io"] == pytest.approx(1.0)
    assert used_text(with_cores(rows)) == "host cpu1 · target cpu0"


def test_a_core_both_sides_used_is_flagged_and_not_split():
    text = cores_json({"main": [0], "lg1": [1], "target": [0]}, {0: (0.5, 0.5, 0.0), 1: (0.2, 0.0, 0.0)})
    out = with_cores(pd.DataFrame([{"point_key": "p", "total_ios": 1000, "cpu_cores_json": text}])).iloc[0]
    assert bool(out["roles_share_core"]) and out["distinct_cores"] == 2
    assert math.isnan(out["host_cpu_us_per_io"]) and math.isnan(out["target_cpu_us_per_io"])
    assert out["cpu_us_per_io"] == pytest.approx(1200.0)  # the total still stands
    two_generators = cores_json({"main": [1], "lg1": [1], "target": [0]}, {0: (0, 0, 0), 1: (0, 0, 0)})
    assert point_cores(two_generators)["shared"]  # load generators on one core: shared too
    assert point_cores("not json") is None and point_cores(None) is None


def test_dimensions_scaling_names_the_cores_and_leaves_out_shared_points(tmp_path):
    store = ResultsStore(tmp_path / "r")
    run = store.start_run("dimensions", 'study = "dimensions"', {})
    base = {"rw": "randread", "bs": 4096, "numjobs": 1, "transport": "tcp", "iodepth": 32}
    layouts = {1: ({"main": [1], "target": [0]}, 50_000), 2: ({"main": [1, 2], "target": [0, 3]}, 100_000),
               4: ({"main": [1, 2, 3, 0], "target": [0, 3, 1, 2]}, 400_000)}  # 4 wraps onto the same cores
    for r in range(3):
        for n, (roles, iops) in layouts.items():
            text = cores_json(roles, {c: (0.1, 0.1, 0.01) for c in range(4)})
            _save(store, run, "dimensions", "cores", base | {"cores": n, "host_cpus": n}, r,
                  [_row(iops * (1 + r / 100), cpu_cores_json=text)])
    result = dimensions.analyze(store.measurements(), store.runs())
    text = "\n".join(result.findings)
    assert "At 4 core(s) asked, roles shared a core" in text
    assert "2 cores gave 2.00× the IOPS of 1" in text  # the shared 4-core point is not the scaling end
    assert "Cores used: 1 → host cpu1 · target cpu0; 2 → host cpu1,cpu2 · target cpu0,cpu3." in text
    table = next(t.frame for t in result.tables if t.title.startswith("Scaling with cores"))
    assert list(table["roles shared a core"]) == ["no", "no", "yes"]
    assert table["cores used"].iloc[2] == "host cpu0,cpu1,cpu2,cpu3 · target cpu0,cpu1,cpu2,cpu3"


def test_parallelism_states_cpu_per_io_over_each_sides_cores(tmp_path):
    store = ResultsStore(tmp_path / "r")
    run = store.start_run("parallelism", 'study = "parallelism"', {"spec_effective": {"ramp_time": 0}})
    base = {"rw": "randread", "bs": 4096, "numjobs": 1, "backend": "file", "iodepth": 16}
    local = cores_json({"main": [1]}, {1: (1.0, 2.0, 0.0)})
    remote = cores_json({"main": [1], "target": [0]}, {0: (1.5, 1.0, 0.5), 1: (1.0, 2.5, 0.5)})
    _save(store, run, "parallelism", "size_local", base, 0, [_row(100_000, cpu_cores_json=local)])
    _save(store, run, "parallelism", "size_remote", base, 0, [_row(100_000, cpu_cores_json=remote)])
    text = "\n".join(parallelism.analyze(store.measurements(), store.runs()).findings)
    # total_ios = 1M: local 3 s → 3 µs; remote host 4 s → 4 µs, target 3 s → 3 µs, softirq 0.5 µs each
    assert "local I/O 3.00 µs per I/O on host cpu1" in text
    assert ("remote I/O 4.00 µs on the host's cores and 3.00 µs on the target's (host cpu1 · target cpu0), of "
            "which softirq (kernel receive processing) 0.50 µs and 0.50 µs") in text


def test_contention_keeps_wrapped_different_cores_out_of_its_findings(tmp_path):
    from nvmflab.analysis import contention

    store = ResultsStore(tmp_path / "r")
    run = store.start_run("contention", 'study = "contention"', {})
    tapp = {"app": "T-app", "rw": "read", "bs": 131072, "iodepth": 4, "numjobs": 1, "part": "storage",
            "net_flows": 0, "placement": "none"}
    storage_cores = cores_json({"main": [1], "target": [0]}, {0: (0.1, 0.1, 0.1), 1: (0.1, 0.1, 0.1)})
    for r in range(2):
        _save(store, run, "contention", "isolated", tapp, r, [_row(10_000, 131072, cpu_cores_json=storage_cores)])
        for flows, shares in ((1, False), (2, True)):
            knobs = tapp | {"net_flows": flows, "placement": "different", "net_shares_storage_core": shares}
            _save(store, run, "contention", "different_core", knobs, r,
                  [_row(9_000 - 1000 * flows + r, 131072, cpu_cores_json=storage_cores)])
            _save(store, run, "contention", "different_core", knobs | {"part": "network"}, r,
                  [{"role": "bg", "engine": "iperf3", "bw_bytes": 5e8},
                   {"role": "bg", "engine": "cpu:host:2" if not shares else "cpu:host:1", "usr_cpu": 5.0,
                    "sys_cpu": 5.0}])
    result = contention.analyze(store.measurements(), store.runs())
    text = "\n".join(result.findings)
    assert ("network apps landed on cores their placement meant to keep apart (the storage app's, each other's, "
            "or on one machine the other side's) for T-app with 2 flow(s) on different cores (host cpu1,cpu2)") in text
    # the 1-flow cell is still compared with the app alone (undecided here: the alone repeats have no
    # spread), the wrapped 2-flow cell is in no finding
    assert "Cannot tell whether throughput between a T-app with 1 iperf3 flow on different cores and alone" in text
    assert "t-app with 2 iperf3 flows on different cores" not in text.lower()
    table = next(t.frame for t in result.tables if t.title == "Storage apps beside iperf3 flows")
    assert list(table["storage cores"]) == ["host cpu1 · target cpu0"]
    assert list(table["flow cores"]) == ["host cpu2"]


def test_the_report_names_each_legs_cores_and_counts_shared_points():
    from nvmflab.analysis.cores_used import cores_note

    apart = cores_json({"main": [1], "target": [0]}, {0: (0, 0, 0), 1: (0, 0, 0)})
    wrapped = cores_json({"main": [0], "target": [0]}, {0: (0, 0, 0)})
    rows = pd.DataFrame([{"point_key": "a", "leg": "completion", "cpu_cores_json": apart},
                         {"point_key": "b", "leg": "matrix", "cpu_cores_json": apart},
                         {"point_key": "c", "leg": "wrap", "cpu_cores_json": wrapped},
                         {"point_key": "d", "leg": "local", "cpu_cores_json": None}])
    note = cores_note(rows)
    assert note.startswith("Cores used (the distinct cores each side was pinned to, per leg): "
                           "completion, matrix: host cpu1 · target cpu0; wrap: host cpu0 · target cpu0.")
    assert "1 point(s) (wrap) had roles on one core" in note
    assert cores_note(rows[rows["leg"] == "local"]) is None


def test_interference_gives_no_guideline_where_processes_meant_apart_shared_a_core():
    from test_analysis_fixtures import interference_measurements, runs_frame

    from nvmflab.analysis import interference

    data = interference_measurements()
    wrapped = cores_json({"fg": [0], "bg": [0], "target": [0]}, {0: (0.1, 0.1, 0.1)})
    target = data["leg"] == "target"
    data = data.assign(fg_bg_shared_core=target,
                       cpu_cores_json=[wrapped if t else None for t in target],
                       point_key=data["point_id"])
    result = interference.analyze(data, runs_frame(["interference"]))
    text = "\n".join(result.findings)
    assert ("Guideline (shared target core, L-app): not given: on this machine processes meant for different "
            "cores shared one (host cpu0 · target cpu0)") in text
    guide = result.recommendations.set_index(["resource", "application"])
    limit = "keep background load at or below"
    assert guide.at[("shared target core", "L-app"), limit] == "not given (unintended sharing)"
    assert guide.at[("shared initiator core", "L-app"), limit] != "not given (unintended sharing)"
