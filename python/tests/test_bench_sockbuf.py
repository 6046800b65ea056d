"""bench/shim/sockbuf.c, preloaded into a process: a smaller SO_RCVBUF/SO_SNDBUF request is raised
to the floor the environment gives, a larger one and every other option pass through, and a
missing or bad floor changes nothing (nvmfbench.sockbuf builds it and puts it before a command)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from nvmfbench import sockbuf  # noqa: E402

# Below the kernel's default rmem_max and wmem_max (212992), so the granted size is exactly twice
# what was asked for (the kernel doubles it for its bookkeeping) on any machine.
FLOOR = 65536

# Asks for each buffer at `ask` bytes and prints what the kernel granted; TCP_NODELAY passes through.
PROBE = """
import socket, sys
ask = int(sys.argv[1])
s = socket.socket()
granted = []
for name in (socket.SO_RCVBUF, socket.SO_SNDBUF):
    s.setsockopt(socket.SOL_SOCKET, name, ask)
    granted.append(s.getsockopt(socket.SOL_SOCKET, name))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
print(*granted, s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
"""


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    return sockbuf.build(tmp_path_factory.mktemp("shim"))


def _granted(argv_prefix: list[str], ask: int) -> list[int]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", sockbuf.FLOOR_VARIABLE)}
    done = subprocess.run(["/usr/bin/env", "-i", f"PATH={env.get('PATH', '/usr/bin:/bin')}", *argv_prefix,
                           sys.executable, "-c", PROBE, str(ask)],
                          capture_output=True, text=True, timeout=30, check=True)
    return [int(x) for x in done.stdout.split()]


def test_a_smaller_request_is_raised_to_the_floor_and_others_pass(library):
    raised = sockbuf.prefix(library, FLOOR)
    assert _granted(raised, 4096) == [2 * FLOOR, 2 * FLOOR, 1]
    assert _granted(raised, 2 * FLOOR) == [4 * FLOOR, 4 * FLOOR, 1], "a larger request is kept"
    assert _granted([], 4096) == [8192, 8192, 1], "without the shim the kernel grants what was asked"


def test_without_a_usable_floor_the_shim_changes_nothing(library):
    for floor in ("", "abc", "-5", "0", "99999999999"):
        assert _granted(["env", f"LD_PRELOAD={library}", f"{sockbuf.FLOOR_VARIABLE}={floor}"], 4096) == [8192, 8192, 1]
    assert _granted(["env", f"LD_PRELOAD={library}"], 4096) == [8192, 8192, 1]


def test_the_build_is_reused_and_says_what_is_missing(tmp_path, monkeypatch, library):
    assert sockbuf.build(library.parent) == library, "an existing build is reused"
    which = shutil.which
    monkeypatch.setattr(sockbuf.shutil, "which", lambda name: None)
    with pytest.raises(sockbuf.ShimError, match="no C compiler"):
        sockbuf.build(tmp_path / "fresh")
    broken = tmp_path / "broken.c"
    broken.write_text("this is not C\n")
    monkeypatch.setattr(sockbuf, "SOURCE", broken)
    monkeypatch.setattr(sockbuf.shutil, "which", which)
    with pytest.raises(sockbuf.ShimError, match="failed"):
        sockbuf.build(tmp_path / "fresh")
    assert not (tmp_path / "fresh" / sockbuf.LIBRARY).exists()
