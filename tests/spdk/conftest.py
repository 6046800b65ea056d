"""Fixtures of the SPDK tests: the SPDK build (made from ../shared/peers on first use) and our
release binaries."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from nvmflab.stacks.spdk import spdk_dir
from nvmflab.topology.local import LocalHost

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def spdk_root() -> str:
    root = spdk_dir(LocalHost())
    if root is None:
        done = subprocess.run(["bash", str(REPO / "scripts/build-spdk.sh")], capture_output=True, text=True,
                              timeout=1800)
        assert done.returncode == 0, f"build-spdk.sh failed: {done.stdout[-2000:]}{done.stderr[-2000:]}"
        root = spdk_dir(LocalHost())
        if root is None:
            pytest.skip(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "SPDK not built")
    return root


@pytest.fixture(scope="module")
def our_bins() -> None:
    needed = [REPO / "target/release" / name for name in ("nvmf-target", "nvmf-perf")]
    if not all(p.exists() for p in needed) and not os.environ.get("NVMFLAB_BIN_DIR"):
        subprocess.run(["cargo", "build", "--release", "--workspace", "--bins"], cwd=REPO, check=True, timeout=1800)
