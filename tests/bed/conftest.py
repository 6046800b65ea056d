"""The two-guest bed (bed.py) for the tests beside this file: booted once per session, killed at
its end (SIGTERM too). NVMFLAB_BED_DIR keeps the consoles, inventories and results there.
NVMFLAB_BED_ATTACH=DIR uses the bed `bed.py up DIR` holds instead (booted once, left running).
NVMFLAB_BED_OURS=0 boots it without our binaries (make test-bed-quick: the kernel stack alone).
Without the trixie packages (no network) the tests skip, unless NVMFLAB_BED_REQUIRE=1 or, as for
the other guest checks, NVMFLAB_CONFORMANCE_REQUIRE=1."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bed as bed_module  # noqa: E402


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


signal.signal(signal.SIGTERM, _interrupt)


@pytest.fixture(scope="session")
def bed(tmp_path_factory):
    attach = os.environ.get("NVMFLAB_BED_ATTACH")
    if attach:
        yield bed_module.Bed.attach(Path(attach))
        return
    work = Path(os.environ.get("NVMFLAB_BED_DIR") or tmp_path_factory.mktemp("bed"))
    made = bed_module.Bed(work, ours=os.environ.get("NVMFLAB_BED_OURS") != "0")
    start = time.monotonic()
    try:
        made.up()
    except BaseException as e:  # a timeout or Ctrl-C while booting too: no qemu outlives the session
        made.close()
        required = "1" in (os.environ.get("NVMFLAB_BED_REQUIRE"), os.environ.get("NVMFLAB_CONFORMANCE_REQUIRE"))
        if "could not be downloaded" in str(e) and not required:
            pytest.skip(str(e))
        raise
    print(f"bed: both guests up in {time.monotonic() - start:.0f} s", flush=True)
    yield made
    made.close()
