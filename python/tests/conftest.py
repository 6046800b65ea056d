"""Shared fixtures: the fake binaries (harness behaviour without the Rust stack) and tiny specs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FAKEBIN = Path(__file__).resolve().parent / "fakebin"
# programs found on PATH (iperf3) that a test may put first
FAKEPATH = Path(__file__).resolve().parent / "fakepath"
NVMFLAB = [sys.executable, "-c", "from nvmflab.cli import main; main()"]
# Points are not re-run for noise in tests (a busy test machine would change how often the fakes run);
# the noise is still recorded. test_sysstat.py sets its own limit.
os.environ.setdefault("NVMFLAB_NOISE_LIMIT_PCT", "off")

# Modules whose assertions a second worker's load could decide (start skew across hosts, an A/A
# run's verdict, a bench's probes, interference calibration, flows cut to a storage window): `make
# test` runs them one at a time after the rest, which it spreads over two workers (pytest-xdist).
# Everything else runs beside another module, real binaries and SSH beds included (each bed has
# its own namespaces, subnet and sshd).
SERIAL_FILES = {
    "test_aa_run.py", "test_bench_smoke.py", "test_contention_layout.py", "test_e2e.py", "test_spread.py",
}
# The longest modules go first, so that no worker starts one of them when the other is nearly done
# (pytest-xdist hands out whole modules, in collection order).
LONGEST_FIRST = [
    "test_topology_ssh.py", "test_cli.py", "test_docs_commands.py", "test_e2e_extra.py", "test_runner.py",
]


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in SERIAL_FILES:
            item.add_marker(pytest.mark.serial)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a module's order is kept


TINY_SPEC = """
name = "tiny"
repeats = 2
ramp_time = 0
runtime = 0.2
[workload]
rw = "randread"
[sweep]
iodepth = [1, 4]
completion = ["poll", "event"]
"""


@pytest.fixture
def fake_env(tmp_path, monkeypatch):
    """Environment that points nvmflab at the fake binaries and records what they did."""
    pids = tmp_path / "pids"
    pids.mkdir()
    env = dict(os.environ, NVMFLAB_BIN_DIR=str(FAKEBIN), FAKE_PID_DIR=str(pids),
               FAKE_PERF_LOG=str(tmp_path / "perf.log"), FAKE_COUNTS=str(tmp_path / "counts"))
    for key in ("NVMFLAB_BIN_DIR", "FAKE_PID_DIR", "FAKE_PERF_LOG", "FAKE_COUNTS"):
        monkeypatch.setenv(key, env[key])
    return env


@pytest.fixture
def tiny_spec(tmp_path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY_SPEC)
    return path


def nvmflab(*args: str, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(NVMFLAB + list(args), env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=REPO)


def alive(pid: int) -> bool:
    """True while pid exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def ours_stacks(point):
    """What a fake runner answers for a point's (target, host) stacks: ours on both sides."""
    from nvmflab.stacks import get_stack

    return get_stack("ours"), get_stack("ours")
