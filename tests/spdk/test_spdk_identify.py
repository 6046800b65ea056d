"""`spdk_nvme_identify` (SPDK's own host) against our target on 127.0.0.1: every Get Features it
sends (Arbitration, Power Management, Temperature Threshold, Number of Queues, Error Recovery)
must be answered, so it prints no `get_feature(...) failed` line.

Skipped, with the reason, when the SPDK build (scripts/build-spdk.sh; NVMFLAB_SPDK_DIR or
~/.cache/nvmflab/spdk-24.01) is absent. The target is stopped in a finally."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NQN = "nqn.2024-01.io.nvmflab:spdk-identify"
DEFAULT_SPDK = Path.home() / ".cache/nvmflab/spdk-24.01"


def identify_binary() -> Path:
    root = Path(os.environ.get("NVMFLAB_SPDK_DIR", DEFAULT_SPDK))
    binary = root / "build/bin/spdk_nvme_identify"
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        pytest.skip(f"no SPDK build: {binary} is missing (scripts/build-spdk.sh builds it)")
    return binary


def target_binary() -> Path:
    bin_dir = os.environ.get("NVMFLAB_BIN_DIR")
    path = Path(bin_dir) / "nvmf-target" if bin_dir else REPO / "target/release/nvmf-target"
    if not path.exists():
        subprocess.run(["cargo", "build", "--release", "-p", "nvmf-target", "--bins"], cwd=REPO, check=True,
                       timeout=1800)
    return path


def start_target(binary: Path) -> tuple[subprocess.Popen, str]:
    # Its own session and default signal dispositions: SIGINT reaches it whatever the caller ignores.
    proc = subprocess.Popen([str(binary), "--listen", "127.0.0.1:0", "--nqn", NQN, "--ns", "null:64MiB"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            restore_signals=True)
    deadline = time.monotonic() + 20
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("ready ") or time.monotonic() > deadline:
        stop(proc)
        raise AssertionError(f"nvmf-target printed no ready line: {line!r} {proc.stderr.read() if proc.stderr else ''}")
    listen = dict(kv.split("=", 1) for kv in line.split()[1:])["listen"].split(",")[0]
    return proc, listen.rsplit(":", 1)[1]


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_spdk_nvme_identify_gets_every_feature() -> None:
    identify = identify_binary()
    proc, port = start_target(target_binary())
    try:
        trid = f"trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{NQN}"
        done = subprocess.run([str(identify), "-r", trid], capture_output=True, text=True, timeout=120)
    finally:
        stop(proc)
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"spdk_nvme_identify exited {done.returncode}:\n{out[-4000:]}"
    failed = [line for line in out.splitlines() if "get_feature(" in line and "failed" in line]
    assert not failed, "\n".join(failed)
    # The answers are there, not just the absence of errors.
    for heading in ("Arbitration", "Power Management", "Health Information", "Number of Queues"):
        assert heading in out, f"{heading!r} missing from:\n{out[-4000:]}"
    assert "Temperature Threshold:       343 Kelvin" in out, out[-4000:]
