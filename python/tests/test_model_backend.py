"""The model backend through the harness (issue 22 item 9): the spec names it and its parameters,
our target serves it, its latency and parallelism show in the measurements, and target stacks
without it skip its points with the reason."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import nvmflab
from pydantic import ValidationError

from nvmflab.plan import Subsystem, TargetSetup
from nvmflab.spec import Backend
from nvmflab.stacks import get_stack
from nvmflab.stacks.ours import render_config
from nvmflab.store import ResultsStore
from nvmflab.tools import find_tool

BINARIES = [find_tool(n) for n in ("nvmf-target", "nvmf-perf")]


def test_spec_takes_model_parameters_and_names_bad_ones():
    assert Backend(kind="model", model="lat=100us, par=4,bw=1GiB").model == "lat=100us, par=4,bw=1GiB"
    assert Backend(kind="model").model is None  # nvmf-target's defaults
    for bad, words in [({"kind": "ram", "model": "lat=1us"}, "belongs to kind"),
                       ({"kind": "model", "model": "speed=3"}, "unknown model parameter"),
                       ({"kind": "model", "model": "lat=fast"}, "'lat=fast'")]:
        with pytest.raises(ValidationError, match=words):
            Backend(**bad)


def test_our_config_carries_the_parameters_and_other_targets_lack_the_backend():
    sub = Subsystem("nqn.2024-01.io.nvmflab:m", "model", 16 << 20, model="lat=5us,par=2")
    setup = TargetSetup(cores=(0,), mode="event", idle_poll_us=0, in_capsule_data_size=8192, so_priority=0, tos=0,
                        busy_poll_us=0, subsystems=(sub,))
    text = render_config(setup, 4420, 9100)
    assert 'backend = "model"' in text and 'model = "lat=5us,par=2"' in text and 'size = "16m"' in text
    assert "model" in get_stack("ours").backends
    assert "model" not in get_stack("kernel").backends and "model" not in get_stack("spdk").backends


SPEC = """
repeats = 1
ramp_time = 0
runtime = 1
[topology]
target_cores = [0]
host_cores = [1]
[backend]
kind = "model"
size = "16MiB"
model = "lat=400us,par=2,bw=none"
[workload]
rw = "randread"
[sweep]
iodepth = [1, 8]
"""


@pytest.mark.skipif(any(b is None or "fakebin" in str(b) for b in BINARIES), reason="nvmf-target/nvmf-perf not built")
def test_measurements_follow_the_model(tmp_path):
    spec = tmp_path / "model.toml"
    spec.write_text(SPEC)
    env = dict(os.environ, NVMFLAB_BIN_DIR=str(Path(BINARIES[0]).parent))
    done = nvmflab("run", str(spec), "--results", str(tmp_path / "r"), env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    frame = ResultsStore(tmp_path / "r").measurements().set_index("iodepth")
    assert set(frame["backend"]) == {"model"}
    # The parameters key the points (results with other parameters are other points).
    assert {json.loads(k)["backend_model"] for k in frame["knobs_json"]} == {"lat=400us,par=2,bw=none"}
    # A lone read waits its 400 us; two units serve at most 2 / 400 us = 5000 reads per second, and
    # eight in flight keep both busy.
    assert frame.at[1, "lat_p50_ns"] >= 400_000
    assert frame.at[8, "iops"] <= 5000 * 1.02
    assert frame.at[8, "iops"] >= 1.5 * frame.at[1, "iops"]
