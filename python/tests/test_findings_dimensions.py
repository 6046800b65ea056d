"""Issue 37 for the dimensions study: the highest bandwidth picked only when clear (Holm), "matched
local QD1 from QDn on" decided by Fieller intervals, and the host cores' idle time read from their
per-core counts rather than 100 minus the load generator's own CPU."""

import json

from test_study_extra import _row, _save

from nvmflab.analysis import dimensions
from nvmflab.store import ResultsStore

BASE = {"rw": "randread", "bs": 4096, "numjobs": 1, "transport": "tcp"}
JITTER = (0.99, 1.0, 1.01)


def _analyze(tmp_path, patterns=None, remote=None, local=50_000, **row):
    store = ResultsStore(tmp_path / "r")
    run = store.start_run("dimensions", 'study = "dimensions"', {})
    for r, j in enumerate(JITTER):
        for (rw, bs), iops in (patterns or {}).items():
            _save(store, run, "dimensions", "pattern", BASE | {"rw": rw, "bs": bs, "iodepth": 128}, r,
                  [_row(iops * j, bs, **row)])
        if remote:
            _save(store, run, "dimensions", "local", BASE | {"iodepth": 1}, r, [_row(local * j)])
            for qd, iops in remote.items():
                _save(store, run, "dimensions", "concurrency", BASE | {"iodepth": qd}, r, [_row(iops * j)])
    return dimensions.analyze(store.measurements(), store.runs())


def test_a_clearly_highest_bandwidth_is_stated_against_the_runner_up(tmp_path):
    text = "\n".join(_analyze(tmp_path, {("randread", 131072): 10_000, ("randwrite", 131072): 5_000,
                                         ("randread", 4096): 100_000}).findings)
    assert ("Highest bandwidth: randread at 128k with 1311 MB/s, clearly above every other of the 3 patterns and sizes "
            "(Holm over the 2 comparisons with it; against the runner-up, randwrite at 128k (655 MB/s): other − best; "
            "95 % interval of the difference") in text


def test_near_equal_bandwidths_pick_no_highest(tmp_path):
    text = "\n".join(_analyze(tmp_path, {("randread", 131072): 10_000, ("read", 131072): 10_010}).findings)
    assert "so no highest is picked among the 2 patterns and sizes." in text
    assert text.count("No clear difference in bandwidth between read at 128k (the highest mean, 1312 MB/s)") == 1
    assert "Highest bandwidth:" not in text


def test_matched_local_qd1_only_from_where_every_interval_lies_above_one(tmp_path):
    # QD16's mean is 1 % above local QD1 but its interval includes 1: the match holds from QD32 on
    result = _analyze(tmp_path, remote={1: 10_000, 8: 40_000, 16: 50_500, 32: 100_000})
    text = "\n".join(result.findings)
    assert ("NVMe/TCP matched local QD1 throughput (50.0 KIOPS) from QD32 on: there and at every deeper queue depth "
            "the 95 % interval of IOPS(TCP, QD) / IOPS(local, QD1) lies at or above 1 (QD32: 2.00, ") in text
    finding = next(f for f in result.findings if f.startswith("NVMe/TCP matched"))
    assert finding.decided
    table = next(t.frame for t in result.tables if t.title.startswith("Concurrency"))
    assert table["95 % interval (Fieller)"].iloc[2].startswith("0.9")


def test_clearly_below_local_at_every_depth_is_said_so(tmp_path):
    text = "\n".join(_analyze(tmp_path, remote={1: 10_000, 8: 40_000}).findings)
    assert ("NVMe/TCP stayed below local QD1 throughput (50.0 KIOPS) at every queue depth: every 95 % interval of "
            "IOPS(TCP, QD) / IOPS(local, QD1) lies below 1 (the highest, QD8: 0.80, ") in text


def test_host_idle_is_the_host_cores_own_idle_time(tmp_path):
    # the load generator used 10 + 30 % of its core; the core itself was idle 25 % of the window
    # (softirq and others took the rest), so 100 − 40 = 60 % would have been wrong
    cores = json.dumps({"local": {"roles": {"main": [1], "target": [0]}, "wall_s": 4.0, "cores": {
        "0": {"user_s": 1.0, "system_s": 1.0, "softirq_s": 1.0, "idle_s": 1.0, "iowait_s": 0.0},
        "1": {"user_s": 0.4, "system_s": 1.2, "softirq_s": 1.4, "idle_s": 0.8, "iowait_s": 0.2}}}})
    result = _analyze(tmp_path, {("randread", 4096): 100_000}, cpu_cores_json=cores)
    table = next(t.frame for t in result.tables if t.title.startswith("Pattern"))
    assert "host idle %" not in table.columns
    assert list(table["host cores idle %"]) == [25.0]
    assert list(table["load generator usr %"]) == [10.0] and list(table["load generator sys %"]) == [30.0]
