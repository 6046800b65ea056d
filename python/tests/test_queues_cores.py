"""Issue 10 item 7: the polling study's `io_queues` leg and the saturation study's `target_cores` leg —
what they run, their analysis on fixtures, and one tiny point of each on the real binaries."""

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import REPO, nvmflab, ours_stacks

from nvmflab.analysis import polling as polling_analysis
from nvmflab.analysis import saturation as saturation_analysis
from nvmflab.runner import Outcome
from nvmflab.spec import load_spec
from nvmflab.store import ResultsStore
from nvmflab.studies import common, polling, saturation, study_params
from nvmflab.studies.common import Context
from nvmflab.tools import find_tool
from nvmflab.topology.base import Hosts
from nvmflab.topology.local import LocalHost


def _legs(monkeypatch, tmp_path, study, cores, params=None):
    """The points the quick variant (with these [params] on top) builds, per leg."""
    monkeypatch.setattr(common, "available_cores", lambda: cores)
    spec = load_spec(REPO / "studies" / f"{study}.toml", quick=True)
    legs = {}
    local = LocalHost()

    def run(points, _description):
        for p in points:  # a call may hold several legs side by side
            legs.setdefault(p.leg, []).append(p)
        return [Outcome(p, "planned") for p in points]

    runner = SimpleNamespace(planning=True, progress=None, hosts=Hosts(local, [local]), stacks_for=ours_stacks,
                             run=run)
    module = polling if study == "polling" else saturation
    module.execute(Context(spec, study, runner, SimpleNamespace(dir=tmp_path, measurements=None)),
                   study_params(study, spec.params | (params or {})))
    return legs


def test_io_queues_leg_runs_one_job_per_queue_at_qd1_and_high(monkeypatch, tmp_path):
    points = _legs(monkeypatch, tmp_path, "polling", [0, 1], {"io_queues": [1, 2]})["io_queues"]
    shapes = {(p.knobs["io_queues"], p.knobs["numjobs"], p.knobs["iodepth"]) for p in points}
    assert shapes == {(1, 1, 1), (1, 1, 32), (2, 2, 1), (2, 2, 32)}


def test_target_cores_leg_is_skipped_with_the_reason_on_two_cores(monkeypatch, tmp_path):
    points = _legs(monkeypatch, tmp_path, "saturation", [0, 1])["target_cores"]
    assert points and all(p.skip_reason for p in points)
    assert "too few cores to sweep the target's core count" in points[0].skip_reason


def test_target_cores_leg_keeps_the_host_fixed_and_apart(monkeypatch, tmp_path):
    points = _legs(monkeypatch, tmp_path, "saturation", list(range(8)))["target_cores"]
    assert not any(p.skip_reason for p in points)
    by_count = {len(p.target.cores): p for p in points}
    assert set(by_count) == {1, 2}
    hosts = {p.jobs[0].cpus for p in points}
    assert len(hosts) == 1  # the same host cores for every count
    host = set(hosts.pop())
    for count, p in by_count.items():
        assert not host & set(p.target.cores)
        assert p.knobs["numjobs"] == 2 * count and p.knobs["iodepth"] == 64


def _store(tmp_path, study, leg, rows):
    store = ResultsStore(tmp_path / study)
    run_id = store.start_run(study, "", {})
    for i, (knobs, iops) in enumerate(rows):
        key = f"{leg}-{i}"
        store.save_point(run_id, key, study, leg, knobs, i, "ok", None,
                         [{"role": "main", "iops": iops, "lat_p99_ns": 5e4, "lat_mean_ns": 2e4}])
    return store.measurements(), store.runs()


def test_io_queues_analysis_states_the_interval_and_noise(tmp_path):
    rows = []
    for q, qd, values in ((1, 1, [100e3, 101e3, 99e3]), (4, 1, [100.5e3, 99.5e3, 101e3]),
                          (1, 32, [200e3, 202e3, 198e3]), (4, 32, [300e3, 303e3, 297e3])):
        knobs = {"rw": "randread", "bs": 4096, "iodepth": qd, "numjobs": q, "io_queues": q, "completion": "event"}
        rows += [(knobs, v) for v in values]
    measurements, runs = _store(tmp_path, "polling", "io_queues", rows)
    result = polling_analysis.analyze(measurements, runs)
    text = " ".join(result.findings)
    assert "No clear difference in IOPS at QD1 between 4 I/O queues vs 1 (100.0 KIOPS → 100.3 KIOPS; " in text
    assert "would have been seen with 80 % power at these 3 repeats" in text
    assert ("At QD32, 4 I/O queues vs 1 raised IOPS by 50.0 % (200.0 KIOPS → 300.0 KIOPS; Holm over 2 queue depths; "
            "95 % interval of the difference +93.87 to +106.13 KIOPS)") in text
    assert any(t.title.startswith("I/O queue count") for t in result.tables)


def test_target_cores_analysis_finds_the_fewest_cores_for_the_peak(tmp_path):
    rows = []
    for cores, values in (("0", [100e3, 101e3, 99e3]), ("0-1", [190e3, 192e3, 188e3]),
                          ("0-3", [191e3, 189e3, 193e3])):
        count = 4 if cores == "0-3" else len(cores.split("-"))
        knobs = {"rw": "randread", "bs": 4096, "iodepth": 64, "numjobs": 2 * count, "resource": "target_cores",
                 "host_cores": "4-7", "target_cores": cores}
        rows += [(knobs, v) for v in values]
    measurements, runs = _store(tmp_path, "saturation", "target_cores", rows)
    result = saturation_analysis.analyze(measurements, runs)
    text = " ".join(result.findings)
    assert "2 target core(s) reach the highest throughput measured (190.0 KIOPS ± " in text
    assert "4 cores gave no clear difference (191.0 KIOPS" in text
    assert any(t.title.startswith("Target saturation by number") for t in result.tables)


BINARIES = [find_tool(n) for n in ("nvmf-target", "nvmf-perf")]


@pytest.mark.skipif(any(b is None or "fakebin" in str(b) for b in BINARIES), reason="real binaries not built")
def test_tiny_io_queues_point_on_real_binaries(tmp_path):
    spec = tmp_path / "polling.toml"
    spec.write_text('study = "polling"\nrepeats = 1\nramp_time = 0\nruntime = 0.3\n[topology]\ntarget_cores = [0]\n'
                    'host_cores = [1]\n[backend]\nkind = "ram"\nsize = "16MiB"\n'
                    '[params]\niodepth = [1]\nidle_poll_us = [0]\nhigh_iodepth = 4\nio_queues = [2]\n')
    env = dict(os.environ, NVMFLAB_BIN_DIR=str(Path(BINARIES[0]).parent))
    done = nvmflab("run", str(spec), "--results", str(tmp_path / "r"), env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    frame = ResultsStore(tmp_path / "r").measurements()
    queues = frame[(frame["leg"] == "io_queues") & (frame["role"] == "main")]
    assert len(queues) and (queues["status"] == "ok").all(), queues[["status", "error"]].to_string()
    assert (queues["io_queues"] == 2).all() and (queues["iops"] > 0).all()
