"""The fake nvmf-perf's FAKE_PERF_JITTER (issue 22 follow-up): tests that ask for a spread must get
one for every point, whatever the number of runs in a round. A −j, 0, +j cycle gave every point of a
round of three or six runs the same factor in each repeat, so its repeats had no spread."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

FAKE_PERF = Path(__file__).resolve().parent / "fakebin" / "nvmf-perf"
JITTER = 0.05


def _iops(tmp_path: Path, runs: int) -> list[float]:
    pids = tmp_path / "pids"
    pids.mkdir()
    env = dict(os.environ, FAKE_PERF_JITTER=str(JITTER), FAKE_PID_DIR=str(pids), FAKE_PERF_SLEEP="0")
    out = []
    for run in range(runs):
        output = tmp_path / f"run{run}.json"
        subprocess.run([sys.executable, str(FAKE_PERF), "--iodepth", "1", "--numjobs", "1", "--runtime", "1",
                        "--ramp_time", "0", "--output", str(output)], env=env, check=True, timeout=30)
        out.append(json.loads(output.read_text())["jobs"][0]["read"]["iops"])
    return out


def test_every_point_of_a_round_gets_a_spread_whatever_the_round_length(tmp_path):
    iops = _iops(tmp_path, 14)
    base = 10000.0  # QD1, no --completion
    assert all(abs(v / base - 1) <= JITTER + 1e-9 for v in iops), iops  # within 1 ± j
    for per_round in range(1, 8):  # a point at position i of a round runs at i, i + L, i + 2L
        for i in range(per_round):
            repeats = iops[i::per_round][:2]
            assert repeats[0] != repeats[1], (per_round, i, repeats)
