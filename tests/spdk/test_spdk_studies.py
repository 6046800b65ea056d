"""The newer studies with SPDK as target and host (stack = "spdk"), each in its tiny variant: every
point either measured or stored skipped with SPDK's own reason (no busy_poll_us setting; its perf
cannot drive a local file), and the analysis says which comparison is missing and why."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nvmflab.stacks.spdk import spdk_dir
from nvmflab.store import ResultsStore
from nvmflab.topology.local import LocalHost

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python" / "tests"))
from tiny_specs import LEGS, SPECS  # noqa: E402  (the loopback tiny specs, reused)

SKIPPED_WITH = {  # legs SPDK cannot run, and the words its reason must contain
    "busy-poll": {"on": "busy_poll_us", "busy_only": "busy_poll_us"},  # factors = true: busy polling alone too
    "dimensions": {"local": "cannot drive a file"},
    "parallelism": {"size_local": "cannot drive a file", "depth_local": "cannot drive a file"},
    "contention": {},
}


@pytest.mark.parametrize("study", list(SKIPPED_WITH))
def test_newer_study_with_spdk_target_and_host(tmp_path, study):
    if spdk_dir(LocalHost()) is None:
        pytest.skip("no SPDK build (make spdk)")
    # spdk_nvme_perf takes whole seconds
    text = SPECS[study].replace("runtime = 0.3", "runtime = 1").replace("\nrepeats", '\nstack = "spdk"\nrepeats', 1)
    spec = tmp_path / "spec.toml"
    spec.write_text(text)
    # noise re-runs are tested elsewhere; here they would only lengthen the run on a busy machine
    env = dict(os.environ, NVMFLAB_BIN_DIR=str(REPO / "target" / "release"), NVMFLAB_NOISE_LIMIT_PCT="off")
    done = subprocess.run([str(REPO / ".venv/bin/nvmflab"), "run", str(spec), "--results", str(tmp_path / "r")],
                          env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    frame = ResultsStore(tmp_path / "r").measurements()
    assert set(frame["leg"]) == LEGS[study]
    assert set(frame["target_stack"]) == {"spdk"} and set(frame["host_stack"]) == {"spdk"}
    skipped = SKIPPED_WITH[study]
    for leg, rows in frame.groupby("leg"):
        storage = rows[(rows["engine"] == "spdk") | (rows["status"] == "skipped")]
        if leg in skipped:
            assert (rows["status"] == "skipped").all() and rows["error"].str.contains(skipped[leg]).all(), leg
        else:
            assert len(storage) and (storage["status"] == "ok").all(), rows[["leg", "status", "error"]].to_string()
            assert (storage["iops"] > 0).all()
