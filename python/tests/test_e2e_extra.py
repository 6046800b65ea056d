"""One tiny run of every study on the real nvmf-target and nvmf-perf (iperf3 where installed),
then the database and the report. (Interference has its own, in test_e2e.py.)"""

import os
import shutil
from pathlib import Path

import pytest
from conftest import nvmflab

from nvmflab.store import ResultsStore
from nvmflab.tools import find_tool

BINARIES = [find_tool(n) for n in ("nvmf-target", "nvmf-perf")]
pytestmark = pytest.mark.skipif(
    any(b is None or "fakebin" in str(b) for b in BINARIES),
    reason="nvmf-target/nvmf-perf not built (cargo build --release --workspace --bins, or set NVMFLAB_BIN_DIR)")

HEAD = """
repeats = 1
ramp_time = 0
runtime = 0.3
[topology]
target_cores = [0]
host_cores = [1]
[backend]
kind = "ram"
size = "16MiB"
"""
SPECS = {
    "contention": 'study = "contention"\n' + HEAD
                  + '[params]\napps = ["L-app"]\nflows = [1]\nplacements = ["same"]\nflow_slack_s = 0.5\n'
                    'storage_apps = [2]\n',
    "dimensions": 'study = "dimensions"\n' + HEAD
                  + '[params]\npatterns = ["randread"]\nbs = ["4k"]\niodepth = 4\ncores = [1]\n'
                    'concurrency_iodepth = [4]\n',
    # two target cores: placement runs two load generators (roles main and lg1)
    "busy-poll": 'study = "busy-poll"\n' + HEAD + '[params]\ntarget_cores = [2]\nconns_per_core = 1\niodepth = 4\n',
    "polling": 'study = "polling"\n' + HEAD
               + '[params]\niodepth = [1]\nidle_poll_us = [0]\nhigh_iodepth = 2\nio_queues = []\n',
    "overhead": 'study = "overhead"\n' + HEAD
                + '[params]\niodepth = [1]\nbs = ["4k"]\nbapp_iodepth = [1]\nlegs = ["local", "loopback"]\n',
    "saturation": 'study = "saturation"\n' + HEAD
                  + '[params]\nnumjobs = [1]\niodepth = [1, 2]\ntarget_core_counts = []\n',
    "stacks": 'study = "stacks"\n' + HEAD.replace("runtime = 0.3", "runtime = 1")
              + '[params]\ntargets = ["ours"]\nhosts = ["ours"]\nbaseline = "ours/ours"\niodepth = [1]\n'
                'bapp_iodepth = 1\n',
    "parallelism": 'study = "parallelism"\n' + HEAD.replace('"ram"', '"file"')
                   + '[params]\nnumjobs = [1]\nnumjobs_iodepth = 2\nbs = ["4k"]\nsize_iodepth = 2\niodepth = [1]\n',
}
LEGS = {
    "polling": {"completion", "idle_poll", "matrix"},
    "overhead": {"local", "loopback"},
    "saturation": None,  # depends on the machine's cores: checked below
    "stacks": {"ours/ours"},
    "contention": {"isolated", "same_core", "many_apps"},
    "dimensions": {"pattern", "cores", "local", "concurrency"},
    "busy-poll": {"off", "on"},
    "parallelism": {"numjobs", "size_local", "size_remote", "depth_local", "depth_remote"},
}


@pytest.mark.parametrize("study", list(SPECS))
def test_tiny_study_on_real_binaries(tmp_path, study):
    spec = tmp_path / f"{study}.toml"
    spec.write_text(SPECS[study])
    env = dict(os.environ, NVMFLAB_BIN_DIR=str(Path(BINARIES[0]).parent))
    done = nvmflab("run", str(spec), "--results", str(tmp_path / "r"), env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    frame = ResultsStore(tmp_path / "r").measurements()
    if study == "saturation":  # 2 cores: a combined leg beside the skipped isolated ones; more: both isolated
        assert {"initiator", "target"} <= set(frame["leg"]) <= {"initiator", "target", "combined"}
    else:
        assert set(frame["leg"]) == LEGS[study]
    storage = frame[(frame["role"] == "main") & frame["engine"].isin(["tcp", "local"])]
    assert len(storage) and (storage["status"] == "ok").all(), frame[["leg", "status", "error"]].to_string()
    assert (storage["iops"] > 0).all()
    if study in ("contention", "busy-poll"):  # the second load generator of a point measured too
        second = frame[(frame["role"] == "lg1") & (frame["status"] == "ok")]
        assert len(second) and (second["iops"] > 0).all(), frame[["leg", "role", "status", "error"]].to_string()
    if study == "contention":
        flows = frame[frame["engine"] == "iperf3"]
        if shutil.which("iperf3"):
            # alone, beside the L-app, beside two L-apps together
            assert len(flows) == 3 and (flows["bw_bytes"] > 0).all()
            assert frame["engine"].fillna("").str.startswith("cpu:").any()
        else:
            assert frame["error"].fillna("").str.contains("iperf3 not found").any()
    html = Path(done.stdout.strip().splitlines()[-1]).read_text()
    assert f'id="{study}"' in html or study in html
