"""Issue 22 item 8 in the tables of polling, overhead, saturation and stacks: each table whose rows
are groups of points names the distinct cores those points actually used, and says where roles
shared a core."""

from __future__ import annotations

import pandas as pd
from test_analysis_fixtures import overhead_measurements, polling_measurements, runs_frame
from test_cores_used import cores_json

from nvmflab.analysis import overhead, polling, stacks
from nvmflab.analysis.cores_used import cores_text

APART = cores_json({"main": [1], "target": [0]}, {0: (0.1, 0.1, 0.0), 1: (0.1, 0.1, 0.0)})
SHARED = cores_json({"main": [0], "target": [0]}, {0: (0.1, 0.1, 0.0)})


def _with(frame: pd.DataFrame, text: str) -> pd.DataFrame:
    out = frame.assign(cpu_cores_json=text)
    if "point_key" not in out:
        out = out.assign(point_key=[f"p{i}" for i in range(len(out))])
    return out


def table(result, part):
    return next(t.frame for t in result.tables if part in t.title)


def test_cores_text_names_the_cores_and_flags_shared_ones():
    assert cores_text(_with(pd.DataFrame({"leg": ["a"]}), APART)) == "host cpu1 · target cpu0"
    assert cores_text(_with(pd.DataFrame({"leg": ["a"]}), SHARED)) == "host cpu0 · target cpu0 (roles shared a core)"
    assert cores_text(pd.DataFrame({"leg": ["a"]})) == "—"  # no per-core window recorded


def test_polling_tables_name_the_cores_used():
    data = _with(polling_measurements(), APART)
    result = polling.analyze(data, runs_frame(["polling"]))
    assert set(table(result, "completion mode")["cores used"]) == {"host cpu1 · target cpu0"}
    assert set(table(result, "idle polling period")["cores used"]) == {"host cpu1 · target cpu0"}
    wrapped = polling.analyze(_with(polling_measurements(), SHARED), runs_frame(["polling"]))
    assert set(table(wrapped, "completion mode")["cores used"]) == {"host cpu0 · target cpu0 (roles shared a core)"}


def test_overhead_names_each_legs_cores():
    data = _with(overhead_measurements(), APART)
    result = overhead.analyze(data, runs_frame(["overhead"]))
    cores = table(result, "Cores used per leg").set_index("leg")["cores used"]
    assert len(cores) == 3 and set(cores) == {"host cpu1 · target cpu0"}


def test_stacks_pairs_name_their_cores():
    rows = []
    for leg, text in (("ours/ours", APART), ("kernel/ours", SHARED)):
        for repeat in range(2):
            for app, bs, qd in (("L-app", 4096, 1), ("T-app", 4096, 32)):
                knobs = f'{{"app": "{app}", "bs": {bs}, "iodepth": {qd}}}'
                rows.append({"run_id": "run1", "study": "stacks", "leg": leg, "role": "main", "status": "ok",
                             "point_id": f"{leg}-{app}-{repeat}", "point_key": f"{leg}-{app}-{repeat}",
                             "repeat": repeat, "engine": "tcp", "bs": bs, "iodepth": qd, "knobs_json": knobs,
                             "iops": 1e5 + repeat, "bw_bytes": 4096e5, "lat_mean_ns": 1e4 + repeat,
                             "lat_p99_ns": 3e4, "cpu_cores_json": text})
    result = stacks.analyze(pd.DataFrame(rows), runs_frame(["stacks"]))
    pairs = table(result, "Pairs side by side").set_index("target × host")["cores used"]
    assert sorted(pairs) == ["host cpu0 · target cpu0 (roles shared a core)", "host cpu1 · target cpu0"]
