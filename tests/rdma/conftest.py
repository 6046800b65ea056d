"""The one guest boot every test under tests/rdma reads (test_rdma_guest.py, test_reconnect.py):
session-scoped, so that a second test file adds its checks to the same boot, not a boot of its own."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "guest"))
import check  # noqa: E402
import trixie  # noqa: E402

WITH_SPDK = os.environ.get("NVMFLAB_RDMA_SPDK") == "1"


@pytest.fixture(scope="session")
def guest(tmp_path_factory):
    """(run, {step: result line}, why SPDK did not run or None)."""
    checks, no_spdk = "control ours perf reconnect", "SPDK over RDMA runs in make test-rdma (NVMFLAB_RDMA_SPDK=1), not here"
    if WITH_SPDK:
        try:
            check.spdk_files()
            checks, no_spdk = checks + " spdk", None
        except check.SpdkUnavailable as e:
            no_spdk = str(e)
    try:
        # make test builds them in an earlier step (rdma-bins) and names them here
        bindir = Path(os.environ["NVMFLAB_RDMA_BIN"]) if os.environ.get("NVMFLAB_RDMA_BIN") else check.build()
        run, results = check.run(bindir, checks, tmp_path_factory.mktemp("rdma"), timeout_s=600 if no_spdk is None else 420)
    except trixie.GuestUnavailable as e:
        if os.environ.get("NVMFLAB_CONFORMANCE_REQUIRE") == "1":
            raise
        pytest.skip(str(e))
    assert run.finished, f"{run.why}\n{run.console[-3000:]}"
    return run, {line.split(":")[0].removeprefix("PASS ").removeprefix("FAIL "): line for line in results}, no_spdk
