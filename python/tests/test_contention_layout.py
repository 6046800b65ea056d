"""Contention as the source laid it out (issue 22 item 6): one network app per core with the
storage app sharing a core with the first; the grid of N L-apps × M network apps (figures 11-12);
iperf3's interval records cut to the storage app's measured window; intervals of the difference on
the network side; points whose flows wrapped onto shared cores flagged and kept out."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import nvmflab

from nvmflab.analysis import contention
from nvmflab.store import ResultsStore
from nvmflab.studies import contention as study
from nvmflab.tools import find_tool

BINARIES = [find_tool(n) for n in ("nvmf-target", "nvmf-perf")]


def _ctx(cores: int, one_machine: bool = True):
    local = SimpleNamespace(name="local", remote=False)
    target = local if one_machine else SimpleNamespace(name="lab-0", remote=True)
    initiator = local if one_machine else SimpleNamespace(name="lab-1", remote=True)
    every = list(range(cores))
    return SimpleNamespace(
        spec=SimpleNamespace(topology=SimpleNamespace(host_cores=[1], target_cores=[0])),
        phys=lambda logical: tuple(every[i % cores] for i in logical),
        target_phys=lambda logical: tuple(every[i % cores] for i in logical), cores=every,
        runner=SimpleNamespace(hosts=SimpleNamespace(target=target, initiator=lambda name: initiator)))


def test_one_network_app_per_core_with_the_first_on_the_storage_apps_cores():
    layout = study._layout(_ctx(8), 3, "one_per_core")
    # one machine: flow 0 on the storage app's cores (host 1, target 0), the others on free cores
    assert (layout["clients"], layout["servers"], layout["shares"]) == ([1, 2, 4], [0, 3, 5], False)
    two = study._layout(_ctx(4, one_machine=False), 3, "one_per_core")
    assert (two["clients"], two["servers"], two["shares"]) == ([1, 2, 3], [0, 1, 2], False)
    # 2 cores (this CI machine): the second flow can only land on the storage app's cores: flagged
    small = study._layout(_ctx(2), 2, "one_per_core")
    assert small["shares"] and small["clients"][0] == 1 and small["servers"][0] == 0
    # "different" on one machine: no flow on the other side's storage core any more
    apart = study._layout(_ctx(8), 2, "different")
    assert (apart["clients"], apart["servers"], apart["shares"]) == ([2, 4], [3, 5], False)
    assert study._layout(_ctx(3), 2, "different")["shares"]
    assert study._layout(_ctx(2), 4, "same")["shares"] is False  # same core is meant to share
    assert study._flow_counts([1, 2, 4], "one_per_core") == [2, 4] and study._flow_counts([1], "same") == [1]


def _intervals(seconds: float, step: float, rate: float) -> list[dict]:
    count = round(seconds / step)
    return [{"sum": {"start": i * step, "end": (i + 1) * step, "bytes": rate * step, "omitted": False}}
            for i in range(count)]


def test_interval_records_are_cut_to_the_storage_window():
    records = _intervals(3, 0.5, 1000.0)
    records[2]["sum"]["bytes"] = 99_000.0  # a burst at 1.0-1.5 s, before the window below
    zero = 100.0  # the client started at t = 100 s
    total, seconds = study.window_rate(records, zero, 101.75, 102.75)
    assert seconds == pytest.approx(1.0) and total == pytest.approx(1000.0)  # 0.25 + 0.5 + 0.25 s at 1000 B/s
    total, seconds = study.window_rate(records, zero, 101.25, 101.75)  # half the burst interval
    assert (total, seconds) == (pytest.approx(49_500.0 + 250.0), pytest.approx(0.5))
    records[0]["sum"]["omitted"] = True
    assert study.window_rate(records, zero, 100.0, 100.5) is None  # only an omitted record there
    for hostile in (None, "x", [1, {"sum": "x"}, {"sum": {"start": "a", "end": 1, "bytes": 5}}], []):
        assert study.window_rate(hostile, zero, 100.0, 101.0) is None
    row = study._flow_row({"end": {"sum_received": {"bytes": 3e9, "seconds": 3.0}}}, (5e8, 0.5))
    assert row["bw_bytes"] == 1e9 and row["runtime_ms"] == 500
    whole = study._flow_row({"end": {"sum_received": {"bytes": 3e9, "seconds": 3.0}}}, None)
    assert whole["bw_bytes"] == 1e9 and whole["runtime_ms"] == 3000
    assert study.interval_s(0, 1) == 0.1 and study.interval_s(0, 30) == 1.0 and study.interval_s(0.5, 1) == 0.5


def _save(store, run, leg, knobs, repeat, rows):
    key = f"{leg}-{json.dumps(knobs, sort_keys=True)}-{repeat}"
    store.save_point(run, key, "contention", leg, knobs, repeat, "ok", None, [{"knobs": knobs, **r} for r in rows])


def _lapp(lat, role="main"):
    return {"role": role, "engine": "tcp", "iops": 1e9 / lat, "bw_bytes": 4096e9 / lat, "lat_mean_ns": lat,
            "lat_p99_ns": 3 * lat, "total_ios": 1000, "runtime_ms": 1000}


def _flows(m, per_flow):
    return [{"role": "bg", "engine": "iperf3", "bw_bytes": per_flow} for _ in range(m)]


def test_the_grid_of_lapps_and_network_apps_decides_each_cell_with_holm(tmp_path):
    store = ResultsStore(tmp_path / "r")
    run = store.start_run("contention", 'study = "contention"', {})
    lapps = {"app": "L-app", "part": "storage", "placement": "one_per_core", "storage_apps": 8}
    for r in range(3):
        jitter = 1 + 0.01 * r
        for m, lat, shares in ((0, 100e3, False), (1, 300e3, False), (2, 500e3, False), (3, 101e3, False),
                               (4, 900e3, True)):
            knobs = lapps | {"net_flows": m, "net_shares_storage_core": shares}
            _save(store, run, "lapps_flows", knobs, r, [_lapp(lat * jitter, role) for role in ("main", "lg1")])
            if m:
                alone = {"app": "net", "part": "network", "placement": "one_per_core", "storage_apps": 0,
                         "net_flows": m, "net_shares_storage_core": shares}
                _save(store, run, "lapps_flows", alone, r, _flows(m, 1e9 * jitter))
                _save(store, run, "lapps_flows", knobs | {"part": "network"}, r, _flows(m, (0.5e9 if m == 2 else 1e9)
                                                                                            * (1 + 0.02 * r)))
    result = contention.analyze(store.measurements(), store.runs())
    text = "\n".join(result.findings)
    assert "8 L-apps beside 1 network app one per core: mean latency 3.00× that without them" in text
    assert "8 L-apps beside 2 network apps one per core: mean latency 5.00× that without them" in text
    assert "8 L-apps beside 3 network apps one per core: mean latency no clear difference" in text
    assert "8 L-apps beside 4 network apps" not in text  # wrapped: flagged, no finding
    assert "wrapped onto cores meant to be apart for 8 L-app(s) with 4 network app(s)" in text
    assert "2 network apps one per core beside 8 L-apps: per-flow throughput kept 50 % of the same flows alone" in text
    assert "No clear difference in per-flow throughput between 1 network app one per core beside 8 L-apps" in text
    assert text.count("95 % interval of the difference") >= 8
    grid = next(t.frame for t in result.tables if t.title.startswith("L-apps beside network apps one per core"))
    assert list(grid["network apps"]) == [0, 1, 2, 3, 4]
    assert list(grid["cores shared"]) == ["no", "no", "no", "no", "yes (flagged)"]
    assert list(grid["mean × no network"])[:3] == [1.0, 3.0, 5.0]
    assert {"contention_lapps_vs_network_apps", "contention_network_apps_beside_lapps"} <= {f.name for f in result.figures}


def test_network_apps_beside_a_storage_app_get_an_interval_against_the_same_layout_alone(tmp_path):
    store = ResultsStore(tmp_path / "r")
    run = store.start_run("contention", 'study = "contention"', {})
    tapp = {"app": "T-app", "part": "storage", "net_flows": 0, "placement": "none"}
    for r in range(3):
        _save(store, run, "isolated", tapp, r, [_lapp(100e3 + r)])
        for placement, leg, beside in (("same", "same_core", 0.5e9), ("one_per_core", "one_per_core", 0.9e9)):
            _save(store, run, "isolated", {"app": "net", "part": "network", "net_flows": 2, "placement": placement,
                                           "net_shares_storage_core": False}, r, _flows(2, 1e9 + 1e7 * r))
            knobs = tapp | {"net_flows": 2, "placement": placement, "net_shares_storage_core": False}
            _save(store, run, leg, knobs, r, [_lapp(200e3 + r)])
            _save(store, run, leg, knobs | {"part": "network"}, r, _flows(2, beside - 1e7 * r))
    result = contention.analyze(store.measurements(), store.runs())
    text = "\n".join(result.findings)
    assert ("2 iperf3 flows on same core beside the T-app: per-flow throughput kept 49 % of the same flows alone "
            "(3.92 Gbit/s vs 8.08 Gbit/s; 95 % interval of the difference −4.34 to −3.98 Gbit/s)") in text
    assert ("2 iperf3 flows on one core per network app (the first on the storage app's) beside the T-app: per-flow "
            "throughput kept 88 % of the same flows alone (7.12 Gbit/s vs 8.08 Gbit/s") in text
    table = next(t.frame for t in result.tables if t.title.startswith("Network apps"))
    assert set(table["placement"]) == {"same core", "one core per network app (the first on the storage app's)"}
    assert (table[table["running"] != "alone"]["Δ per flow vs alone"].str.contains("±")).all()


@pytest.mark.skipif(any(b is None or "fakebin" in str(b) for b in BINARIES) or not shutil.which("iperf3"),
                    reason="needs nvmf-target/nvmf-perf built and iperf3")
def test_a_short_real_run_cuts_each_flow_to_the_storage_window(tmp_path):
    spec = tmp_path / "c.toml"
    spec.write_text('study = "contention"\nrepeats = 1\nramp_time = 0.2\nruntime = 0.5\n'
                    '[topology]\ntarget_cores = [0]\nhost_cores = [1]\n[backend]\nkind = "ram"\nsize = "16MiB"\n'
                    '[params]\napps = ["L-app"]\nflows = [2]\nplacements = ["one_per_core"]\nflow_slack_s = 0.5\n'
                    'storage_apps = []\ngrid_lapps = [2]\ngrid_flows = [2]\n')
    env = dict(os.environ, NVMFLAB_BIN_DIR=str(Path(BINARIES[0]).parent))
    done = nvmflab("run", str(spec), "--results", str(tmp_path / "r"), env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    store = ResultsStore(tmp_path / "r")
    frame = store.measurements()
    assert set(frame["leg"]) == {"isolated", "one_per_core", "lapps_flows"}
    flows = frame[frame["engine"] == "iperf3"]
    assert len(flows) == 2 * 4 and (flows["bw_bytes"] > 0).all()  # 2 flows: alone and beside, in both legs
    assert (flows["runtime_ms"] == 500).all()  # each cut to the storage app's 0.5 s window
    lapps = frame[(frame["leg"] == "lapps_flows") & (frame["engine"] == "tcp")]
    assert set(lapps["role"]) == {"main", "lg1"} and (lapps["iops"] > 0).all()
    raw = [json.loads(p.read_text()) for p in (tmp_path / "r" / "raw").glob("*.json")]
    records = [f for r in raw for f in r.get("iperf3", [])]
    assert records and all(len(f["report"]["intervals"]) >= 5 and f["window"][1] - f["window"][0] == 0.5
                           for f in records)
    knobs = [json.loads(k) for k in frame["knobs_json"]]
    two = [k for k in knobs if k.get("net_flows") == 2]
    # whether the second flow got cores of its own depends on this machine's core count; it is said
    assert {k["net_shares_storage_core"] for k in two} == {(os.cpu_count() or 1) < 4}
