from nvmflab import counters
from nvmflab.metrics import histogram_percentile, summarize
from nvmflab.studies.interference import Layout, _invariant


def test_percentiles_follow_the_histogram():
    hist = [[100, 50], [200, 49], [900, 1]]
    assert histogram_percentile(hist, 50) == 100
    assert histogram_percentile(hist, 99) == 200
    assert histogram_percentile(hist, 99.9) == 900


def test_summary_sums_jobs_and_directions():
    side = lambda iops, ios: {"iops": iops, "bw_bytes": iops * 10, "total_ios": ios,  # noqa: E731
                              "clat_ns": {"mean": 100.0, "max": 500, "percentile": {}}}
    perf = {"jobs": [{"read": side(10.0, 100), "write": side(5.0, 50), "usr_cpu": 1.0, "sys_cpu": 2.0, "ctx": 3},
                     {"read": side(10.0, 100), "write": {"total_ios": 0}, "usr_cpu": 1.0, "sys_cpu": 2.0, "ctx": 3}],
            "nvmflab": {"histogram": {"read": [[100, 200]], "write": [[300, 50]]}}}
    row = summarize(perf)
    assert (row["iops"], row["read_iops"], row["write_iops"], row["total_ios"]) == (25.0, 20.0, 5.0, 250)
    assert (row["usr_cpu"], row["ctx"], row["lat_p99_ns"]) == (2.0, 6, 300)


def test_counter_diff_matches_entries_by_identity():
    ns = lambda n: {"subnqn": "a", "nsid": 1, "commands": n}  # noqa: E731
    before = {"version": 1, "reactors": [{"index": 0, "commands": 10, "mode": "poll", "namespaces": [ns(4)]}]}
    after = {"version": 1, "reactors": [{"index": 0, "commands": 25, "mode": "poll", "namespaces": [ns(9)]},
                                        {"index": 1, "commands": 3, "mode": "poll", "namespaces": []}]}
    delta = counters.diff(before, after)
    assert delta["reactors"][0]["commands"] == 15 and delta["reactors"][0]["namespaces"][0]["commands"] == 5
    assert delta["reactors"][1]["commands"] == 3 and delta["reactors"][0]["mode"] == "poll"
    assert counters.namespace_commands(delta, "a") == {0: 5}


def test_invariant_flags_commands_served_by_the_wrong_reactor():
    lay = Layout((0,), (0,), (0, 1), 0, 1, "host")
    check = _invariant(lay, "fg", "bg", runtime=1.0, ramp_time=0.0, fg_iodepth=1)
    perf = {"fg": {"jobs": [{"read": {"total_ios": 100}, "write": {"total_ios": 0}}]}}
    good = {"reactors": [{"index": 0, "namespaces": [{"subnqn": "fg", "commands": 100}]}]}
    bad = {"reactors": [{"index": 0, "namespaces": [{"subnqn": "fg", "commands": 60}]},
                        {"index": 1, "namespaces": [{"subnqn": "fg", "commands": 40}]}]}
    assert check(perf, good)[0] is True
    ok, detail = check(perf, bad)
    assert ok is False and "reactors {1: 40}" in detail
