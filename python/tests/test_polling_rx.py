"""The polling study's `matrix_rx` leg (issue 22 item 9): the matrix's cells for each receive
steering mode over one veth pair, every mode of a cell in the same round, decided against `off`
with Holm; skipped with the reason where no veth can be made."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO, nvmflab
from tiny_specs import head

from nvmflab.analysis import polling
from nvmflab.cores import available_cores
from nvmflab.runner import PlanningRunner
from nvmflab.spec import load_spec
from nvmflab.stacks import get_stack
from nvmflab.store import ResultsStore
from nvmflab.studies import study_module, study_params
from nvmflab.studies.common import Context
from nvmflab.topology import netns
from nvmflab.topology.base import Hosts
from nvmflab.topology.local import LocalHost
from nvmflab.topology.rx_steering import SOCK_FLOW
from nvmflab.tools import find_tool

BINARIES = [find_tool(n) for n in ("nvmf-target", "nvmf-perf")]
PARAMS = """[params]
iodepth = [1]
idle_poll_us = [0]
high_iodepth = 1
io_queues = []
rx_steering = {modes}
"""


def spec_text(repeats: int, modes: str) -> str:
    return 'study = "polling"\n' + head(repeats) + PARAMS.format(modes=modes)


def test_every_mode_of_a_cell_runs_in_the_same_round_on_the_veth(tmp_path):
    spec_file = tmp_path / "p.toml"
    spec_file.write_text(spec_text(2, '["off", "rfs"]'))
    spec = load_spec(spec_file)
    local = LocalHost(workdir=tmp_path)
    planner = PlanningRunner(ResultsStore(tmp_path / "r"), get_stack("ours"), get_stack("ours"), Hosts(local, [local]))
    study_module("polling").execute(Context(spec=spec, study="polling", runner=planner, store=planner.store),
                                    study_params("polling", spec.params))
    points = [p for description, p in planner.planned if p.leg == "matrix_rx"]
    assert len(points) == 2 * 4 * 2  # repeats × cells × modes
    assert [p.repeat for p in points] == sorted(p.repeat for p in points)  # repeat outermost
    for r in range(2):
        cells = {(p.knobs["completion"], p.knobs["target_mode"], p.knobs["rx_steering"]) for p in points if p.repeat == r}
        assert len(cells) == 8
    assert all(p.target.netns and p.knobs["link"] == "netns veth" for p in points)
    # rps gets a core neither side uses where there is one (3 cores or more), else the target's: flagged
    assert {p.knobs["rps_on_role_core"] for p in points} == {len(available_cores()) < 3}
    assert study_params("polling", {}).rx_steering == []  # a spec that does not ask leaves the leg out
    full = load_spec(REPO / "studies" / "polling.toml")
    assert study_params("polling", full.params).rx_steering == ["off", "rps", "rfs"]


def _row(cell, mode, repeat, p99):
    knobs = {"completion": cell[0], "target_mode": cell[1], "iodepth": 1, "rx_steering": mode,
             "rps_cores": "cpu2", "rps_on_role_core": False}
    key = f"{cell}-{mode}-{repeat}"
    return {"run_id": "run1", "study": "polling", "leg": "matrix_rx", "role": "main", "status": "ok",
            "point_id": key, "point_key": key, "repeat": repeat, "engine": "tcp", "iodepth": 1,
            "completion": cell[0], "target_mode": cell[1], "knobs_json": json.dumps(knobs),
            "iops": 1e9 / p99, "lat_p99_ns": p99, "lat_mean_ns": p99 / 3, "bw_bytes": 4096e9 / p99}


def test_steering_is_decided_against_none_per_cell_with_holm():
    rows = []
    for repeat in range(3):
        for cell in (("event", "event"), ("poll", "poll")):
            rows.append(_row(cell, "off", repeat, 40e3 * (1 + 0.01 * repeat)))
            rows.append(_row(cell, "rfs", repeat, (20e3 if cell[0] == "event" else 40.2e3) * (1 + 0.01 * repeat)))
    result = polling.analyze(pd.DataFrame(rows), pd.DataFrame([{"run_id": "run1", "study": "polling",
                                                                 "spec_toml": "", "env_json": "{}"}]))
    text = "\n".join(result.findings)
    assert ("Receive steering rfs against none (completion = event, target_mode = event): p99 at QD1 lower "
            "(20.2 µs vs 40.4 µs) (95 % interval of the difference −21.0 to −19.4 µs)") in text
    assert ("Receive steering rfs against none (completion = poll, target_mode = poll): p99 at QD1 no clear "
            "difference (") in text
    assert "would have been seen with 80 % power" in text
    table = next(t.frame for t in result.tables if t.title.startswith("Where receive processing runs"))
    assert list(table.columns) == ["cell", "off", "rfs"] and len(table) == 2


@pytest.mark.skipif(any(b is None or "fakebin" in str(b) for b in BINARIES) or netns.unavailable() is not None,
                    reason="needs nvmf-target/nvmf-perf built and root for a namespace")
def test_a_short_real_run_over_the_veth_restores_the_host(tmp_path):
    before = Path(SOCK_FLOW).read_text().strip()
    spec = tmp_path / "p.toml"
    spec.write_text(spec_text(1, '["rfs"]'))  # the mode that changes a host-wide value
    env = dict(os.environ, NVMFLAB_BIN_DIR=str(Path(BINARIES[0]).parent))
    done = nvmflab("run", str(spec), "--results", str(tmp_path / "r"), env=env, timeout=150)
    assert done.returncode == 0, done.stderr
    frame = ResultsStore(tmp_path / "r").measurements()
    rx = frame[(frame["leg"] == "matrix_rx") & (frame["role"] == "main")]
    assert len(rx) == 4 and (rx["status"] == "ok").all() and (rx["iops"] > 0).all(), rx[["status", "error"]]
    assert Path(SOCK_FLOW).read_text().strip() == before  # rfs's host-wide flow table put back
