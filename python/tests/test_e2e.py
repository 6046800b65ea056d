"""End to end against the real nvmf-target and nvmf-perf: a tiny study, then the database checked."""

import json
import os
from pathlib import Path

import pytest
from conftest import nvmflab

from nvmflab.store import ResultsStore
from nvmflab.tools import find_tool

BINARIES = [find_tool(n) for n in ("nvmf-target", "nvmf-perf")]
pytestmark = pytest.mark.skipif(
    any(b is None or "fakebin" in str(b) for b in BINARIES),
    reason="nvmf-target/nvmf-perf not built (cargo build --release --workspace --bins, or set NVMFLAB_BIN_DIR)")

SPEC = """
name = "e2e"
study = "interference"
repeats = 1
ramp_time = 0.2
runtime = 0.5
[topology]
target_cores = [0, 1]
host_cores = [1, 0, 1]
[backend]
kind = "ram"
size = "16MiB"
[params]
resources = ["initiator"]
fg_apps = ["L-app"]
bg_load_pct = [50, "max"]
bg_iodepth = 8
calibrate_iodepth = [4, 8]
control = false
"""


def test_tiny_interference_study_on_real_binaries(tmp_path):
    spec = tmp_path / "e2e.toml"
    spec.write_text(SPEC)
    env = dict(os.environ, NVMFLAB_BIN_DIR=str(Path(BINARIES[0]).parent))
    done = nvmflab("run", str(spec), "--results", str(tmp_path / "r"), env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip().splitlines()[-1]).is_file()
    frame = ResultsStore(tmp_path / "r").measurements()
    assert set(frame["status"]) <= {"ok", "invalid"}, frame[["leg", "status", "error"]].to_string()
    assert set(frame["leg"]) == {"calibrate_initiator", "initiator"}
    assert (frame["iops"] > 0).all() and (frame["lat_p99_ns"] > 0).all() and (frame["engine"] == "tcp").all()
    # every fg/bg point checked its placement on the target's counters
    with_bg = frame[frame["bg_load_pct"].notna()]
    assert set(with_bg["role"]) == {"fg", "bg"} and with_bg["invariant_ok"].notna().all()
    counters = json.loads(with_bg.iloc[0]["target_counters_json"])
    served = {ns["subnqn"].rsplit(":", 1)[1]: r["index"] for r in counters["reactors"]
              for ns in r["namespaces"] if ns["commands"] > 0}
    assert served == {"fg": 0, "bg": 1}
    hist = json.loads(frame.iloc[0]["histogram_json"])
    assert sum(c for _, c in hist) > 0
    assert (frame["target_usr_s"] + frame["target_sys_s"] >= 0).all()
    capped = with_bg[(with_bg["role"] == "bg") & (with_bg["bg_load_pct"] == 50)]
    assert (capped["rate_iops"] > 0).all()
