"""nvmflab/stacks/spdk_sockbuf.c, preloaded into a process: a smaller SO_RCVBUF/SO_SNDBUF request is
raised to the floor the environment gives, a larger one and every other option pass through, and a
missing or bad floor changes nothing. spdk_sockbuf builds it on a host; the SPDK stack preloads it
into spdk_nvme_perf over TLS and sizes its TLS target's ssl socket (SPDK 24.01 fixes them at 4 and 64 KiB)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nvmflab.plan import PerfJob, Subsystem, TargetSetup
from nvmflab.stacks import StackError, get_stack, spdk_sockbuf
from nvmflab.stacks.spdk import SSL_SOCKET_BUFFERS, target_rpcs
from nvmflab.topology.base import HostError
from nvmflab.topology.local import LocalHost

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
def library(tmp_path_factory) -> str:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    return spdk_sockbuf.build(LocalHost(workdir=tmp_path_factory.mktemp("shim")))


def _granted(argv_prefix: list[str], ask: int) -> list[int]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", spdk_sockbuf.FLOOR_VARIABLE)}
    done = subprocess.run(["/usr/bin/env", "-i", f"PATH={env.get('PATH', '/usr/bin:/bin')}", *argv_prefix,
                           sys.executable, "-c", PROBE, str(ask)],
                          capture_output=True, text=True, timeout=30, check=True)
    return [int(x) for x in done.stdout.split()]


def test_a_smaller_request_is_raised_to_the_floor_and_others_pass(library):
    raised = spdk_sockbuf.prefix(library, FLOOR)
    assert _granted(raised, 4096) == [2 * FLOOR, 2 * FLOOR, 1]
    assert _granted(raised, 2 * FLOOR) == [4 * FLOOR, 4 * FLOOR, 1], "a larger request is kept"
    assert _granted([], 4096) == [8192, 8192, 1], "without the shim the kernel grants what was asked"


def test_without_a_usable_floor_the_shim_changes_nothing(library):
    for floor in ("", "abc", "-5", "0", "99999999999"):
        assert _granted(["env", f"LD_PRELOAD={library}", f"{spdk_sockbuf.FLOOR_VARIABLE}={floor}"], 4096) == [8192, 8192, 1]
    assert _granted(["env", f"LD_PRELOAD={library}"], 4096) == [8192, 8192, 1]


def test_the_build_is_reused_and_a_failed_one_says_why_and_leaves_nothing(tmp_path, monkeypatch, library):
    host = LocalHost(workdir=Path(library).parent)
    before = Path(library).stat().st_mtime_ns
    assert spdk_sockbuf.build(host) == library and Path(library).stat().st_mtime_ns == before, "reused"
    broken = tmp_path / "spdk_sockbuf.c"
    broken.write_text("this is not C\n")
    monkeypatch.setattr(spdk_sockbuf, "SOURCE", broken)
    fresh = LocalHost(workdir=tmp_path / "fresh")
    with pytest.raises(StackError, match="a C compiler: apt-get install gcc"):
        spdk_sockbuf.build(fresh)
    assert not (tmp_path / "fresh" / spdk_sockbuf.LIBRARY).exists()


class NoCompilerHost(LocalHost):
    def run(self, argv, timeout=60.0, check=True, input=None):
        raise HostError(f"{self.name}: `{argv[0]}` exited 127: cc: not found")


def test_without_a_compiler_the_error_names_the_host_and_the_package(tmp_path):
    with pytest.raises(StackError, match=r"compiled on local .*apt-get install gcc.*cc: not found"):
        spdk_sockbuf.build(NoCompilerHost(workdir=tmp_path))


def _setup(tls: str) -> TargetSetup:
    return TargetSetup(cores=(0,), mode="poll", idle_poll_us=0, in_capsule_data_size=8192, so_priority=0, tos=0,
                       busy_poll_us=0, subsystems=(Subsystem("nqn.2024-01.io.nvmflab:t", "null", 1 << 30),), tls=tls,
                       tls_key="NVMeTLSkey-1:01:qivkDoZCwHs3NyQ2JvdGvvyAUvFPISBIMcGlMTMfdI7vmDN2:" if tls == "on" else None)


def test_spdk_tls_target_sizes_its_ssl_socket_before_the_framework_starts():
    calls = target_rpcs(_setup("on"), 4420)
    assert SSL_SOCKET_BUFFERS == ["sock_impl_set_options", "-i", "ssl", "--recv-buf-size", "2097152",
                                  "--send-buf-size", "2097152"]
    assert calls.index(SSL_SOCKET_BUFFERS) < calls.index(["framework_start_init"])
    assert "ssl" not in sum(target_rpcs(_setup("off"), 4420), []), "the plain target keeps SPDK's defaults"


class FakeTarget:
    address, port = "127.0.0.1", 4420

    def __init__(self, setup: TargetSetup):
        self.setup = setup


def _fake_spdk(tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "spdk"
    (root / "build" / "bin").mkdir(parents=True)
    (root / "scripts").mkdir()
    (root / "scripts" / "rpc.py").write_text("")
    tgt = root / "build" / "bin" / "nvmf_tgt"
    tgt.write_text("#!/bin/sh\n")
    tgt.chmod(0o755)
    monkeypatch.setenv("NVMFLAB_SPDK_DIR", str(root))


def test_spdk_nvme_perf_over_tls_runs_with_the_shim_and_plain_without(tmp_path, monkeypatch, library):
    _fake_spdk(tmp_path, monkeypatch)
    stack, host = get_stack("spdk"), LocalHost(workdir=tmp_path / "work")
    knobs = {"rw": "randread", "bs": 4096, "iodepth": 32}
    tls_job = PerfJob(role="main", knobs=knobs | {"tls": "on"}, cpus=(1,), nqn="nqn.2024-01.io.nvmflab:t")
    argv = stack.open_host(tls_job, FakeTarget(_setup("on")), host, tmp_path).perf_argv(2, 0, str(tmp_path / "out"))
    shim = f"{tmp_path}/work/{spdk_sockbuf.LIBRARY}"
    run = argv[argv.index("env"):]
    assert run[:3] == ["env", f"LD_PRELOAD={shim}", "NVMFLAB_SOCKBUF_MIN=2097152"] and run[3].endswith("spdk_nvme_perf")
    assert Path(shim).exists() and "-S" in run
    plain_job = PerfJob(role="main", knobs=knobs, cpus=(1,), nqn="nqn.2024-01.io.nvmflab:t")
    plain = stack.open_host(plain_job, FakeTarget(_setup("off")), host, tmp_path).perf_argv(2, 0, str(tmp_path / "out"))
    assert "env" not in plain and not any("LD_PRELOAD" in a for a in plain)
    [planned] = stack.plan_host(tls_job, "127.0.0.1", 4420, host)
    assert f"] env LD_PRELOAD=WORKDIR/{spdk_sockbuf.LIBRARY} NVMFLAB_SOCKBUF_MIN=2097152 " in planned
