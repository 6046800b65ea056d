"""One tiny run of every study on the real nvmf-target and nvmf-perf (iperf3 where installed),
then the database and the report. (Interference has its own, in test_e2e.py.)"""

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import nvmflab

from nvmflab.store import ResultsStore
from nvmflab.tools import find_tool
from tiny_specs import LEGS, SPECS

BINARIES = [find_tool(n) for n in ("nvmf-target", "nvmf-perf")]
pytestmark = pytest.mark.skipif(
    any(b is None or "fakebin" in str(b) for b in BINARIES),
    reason="nvmf-target/nvmf-perf not built (cargo build --release --workspace --bins, or set NVMFLAB_BIN_DIR)")


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
            # alone and beside the L-app; in many_apps' rounds alone (storage_apps = 0: the baseline
            # measured in the same rounds) and beside two L-apps together
            assert len(flows) == 4 and (flows["bw_bytes"] > 0).all()
            many = flows[flows["leg"] == "many_apps"]
            assert sorted(json.loads(knobs).get("storage_apps") for knobs in many["knobs_json"]) == [0, 2]
            assert sorted(set(flows["leg"])) == ["isolated", "many_apps", "same_core"]
            assert frame["engine"].fillna("").str.startswith("cpu:").any()
        else:
            assert frame["error"].fillna("").str.contains("iperf3 not found").any()
    html = Path(done.stdout.strip().splitlines()[-1]).read_text()
    assert f'id="{study}"' in html or study in html
    if study == "contention" and shutil.which("iperf3"):  # the many-apps network app against its own rounds' baseline
        assert "the flow alone measured in the same rounds" in html
        assert "isolated leg's block" not in html
