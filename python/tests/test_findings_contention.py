"""contention's many-apps findings (issue 37): the network app's baseline is the flow alone measured
in the same rounds, and the per-count comparisons are one Holm family."""

from test_side_by_side import planned
from test_study_extra import _row, _save

from nvmflab.analysis import contention
from nvmflab.store import ResultsStore

TAPP = {"app": "T-app", "rw": "read", "bs": 131072, "iodepth": 4, "numjobs": 1, "part": "storage",
        "placement": "one_to_one"}
ROLES = ["main", "lg1", "lg2", "lg3"]
# the shared-core app's IOPS per repeat, alone and beside the network app, per count: +2.6 % at two
# apps (Welch p ≈ 0.03 alone), nothing at one and four
SHARED = {1: ([1000, 1010, 1020], [1000, 1020, 1010]), 2: ([1000, 1010, 1020], [1026, 1036, 1046]),
          4: ([1000, 1010, 1020], [1010, 1000, 1020])}


def _store(tmp_path, same_rounds=True):
    store = ResultsStore(tmp_path / "r")
    run = store.start_run("contention", 'study = "contention"', {})
    for r in range(3):
        # the one flow alone: 4 Gbit/s in the isolated leg's block, 2 Gbit/s in the many-apps rounds
        _save(store, run, "contention", "isolated", {"app": "net", "part": "network", "net_flows": 1}, r,
              [{"role": "bg", "engine": "iperf3", "bw_bytes": 5e8 * (1 + 0.01 * r)}])
        if same_rounds:
            _save(store, run, "contention", "many_apps", {"app": "net", "part": "network", "net_flows": 1,
                                                          "placement": "same", "storage_apps": 0}, r,
                  [{"role": "bg", "engine": "iperf3", "bw_bytes": 2.5e8 * (1 + 0.01 * r)}])
        for count, (alone, beside) in SHARED.items():
            for flows, values in ((0, alone), (1, beside)):
                _save(store, run, "contention", "many_apps", TAPP | {"storage_apps": count, "net_flows": flows}, r,
                      [_row(values[r] if role == "main" else 1000, 131072, role=role) for role in ROLES[:count]])
        _save(store, run, "contention", "many_apps", TAPP | {"storage_apps": 4, "net_flows": 1, "part": "network"},
              r, [{"role": "bg", "engine": "iperf3", "bw_bytes": 1.875e8 * (1 + 0.01 * r)}])
    return store


def _text(store):
    return "\n".join(contention.analyze(store.measurements(), store.runs()).findings)


def test_the_network_baseline_is_the_flow_alone_in_the_same_rounds(tmp_path):
    text = _text(_store(tmp_path))
    assert ("The network app sharing a core with T-apps (4 in all) kept 75 % of its throughput alone (1.51 vs 2.02 "
            "Gbit/s; the flow alone measured in the same rounds;") in text, text
    # an older store without that baseline falls back to the isolated leg, and says so
    older = _text(_store(tmp_path / "older", same_rounds=False))
    assert "kept 38 % of its throughput alone" in older and "not in these rounds" in older, older


def test_every_round_measures_the_network_app_alone_in_the_many_apps_leg(tmp_path):
    points = [p for _, p in planned("contention", tmp_path)]
    alone = [p for p in points if p.leg == "many_apps" and p.knobs.get("storage_apps") == 0]
    assert sorted(p.repeat for p in alone) == [0, 1, 2]
    assert all(p.knobs["part"] == "network" and p.knobs["net_flows"] == 1 for p in alone)


def test_the_per_count_throughput_comparisons_are_one_holm_family(tmp_path):
    text = _text(_store(tmp_path))
    two = next(f for f in text.splitlines() if "with 2 T-apps" in f or f.startswith("With 2 T-apps"))
    assert "Holm over the 3 counts" in two, two
    # +2.6 % at two apps is clear alone, not after Holm over the three counts
    assert two.startswith("No clear difference in throughput with 2 T-apps") and "kept 103 %" not in two, two
    assert "not after Holm over 3 comparisons" in two, two
