"""What keeps SPDK from a host, named before a point runs (the two-guest bed meets each, docs/
topologies.md): over RDMA too few free hugepages (with --no-huge its buffers get no RDMA memory
registration), in planning's transport check and in `nvmflab env --topology`, and a target whose
RAM backend outgrows them before it starts; a build whose libraries the host lacks (a Debian 12
build on trixie); and an app that ends at its start is named by its first error, the cause. Fake
hosts and a fake SPDK build: nothing runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nvmflab import env
from nvmflab.plan import PerfJob, Point, Subsystem, TargetSetup
from nvmflab.spec import validate_knobs
from nvmflab.stacks import get_stack
from nvmflab.stacks.base import StackError
from nvmflab.stacks.spdk import BASE_MEM_MB, rdma_hugepages_refusal, start_error
from nvmflab.topology import rdma
from nvmflab.topology.local import LocalHost

NQN = "nqn.2024-01.io.nvmflab:hugepages"
NO_HUGEPAGES = "HugePages_Total:       0\nHugePages_Free:        0\nHugepagesize:       2048 kB\n"
HUGEPAGES_1G = "HugePages_Total:     512\nHugePages_Free:      512\nHugepagesize:       2048 kB\n"


class Server(LocalHost):
    """This machine under a server's name, with the server's /proc/meminfo."""

    def __init__(self, meminfo: str, tmp: Path):
        super().__init__(workdir=tmp, name="server1")
        self.meminfo = meminfo

    def read_text(self, path: str) -> str:
        return self.meminfo if path == "/proc/meminfo" else super().read_text(path)


@pytest.fixture
def spdk_build(tmp_path, monkeypatch):
    """A fake SPDK build linked against librdmacm (what links_rdma greps for)."""
    root = tmp_path / "spdk"
    (root / "build/bin").mkdir(parents=True)
    (root / "scripts").mkdir()
    (root / "scripts/rpc.py").write_text("")
    for program in ("nvmf_tgt", "spdk_nvme_perf"):
        (root / "build/bin" / program).write_bytes(b"\x7fELF ... librdmacm.so.1 ...")
        (root / "build/bin" / program).chmod(0o755)
    monkeypatch.setenv("NVMFLAB_SPDK_DIR", str(root))
    return root


def test_without_hugepages_each_side_is_refused_by_name(tmp_path, spdk_build):
    spdk, host = get_stack("spdk"), Server(NO_HUGEPAGES, tmp_path)
    for side in ("target", "host"):
        why = spdk.rdma_unavailable(host, side)
        assert why.startswith("server1: SPDK over RDMA needs hugepages"), why
        assert f"0 MiB of hugepages are free there and SPDK takes {BASE_MEM_MB} MiB" in why
        assert "sysctl vm.nr_hugepages=512" in why
    assert spdk.rdma_unavailable(Server(HUGEPAGES_1G, tmp_path), "target") is None
    assert spdk.unavailable(host, "target") is None  # over TCP it runs with --no-huge


def test_planning_stores_the_reason_and_env_topology_shows_it(tmp_path, spdk_build, monkeypatch):
    up = [rdma.Device("rxe0", [rdma.Port(1, "Ethernet", "ACTIVE")])]
    monkeypatch.setattr(rdma, "probe", lambda host, root="": (up, []))
    host = Server(NO_HUGEPAGES, tmp_path)

    class Runner:
        class hosts:
            target = host

            @staticmethod
            def initiator(name):
                return host

    knobs = validate_knobs({"transport": "rdma"})
    point = Point(study="s", leg="l", knobs=knobs, repeat=0, jobs=[PerfJob("main", knobs, (1,), nqn=NQN)],
                  runtime=1, ramp_time=0, target=target_setup(transport="rdma"))
    spdk = get_stack("spdk")
    assert "server1: SPDK over RDMA needs hugepages" in rdma.TransportCheck(Runner).refusal(point, spdk, spdk)
    rows = dict(env.capability_rows({"stacks": {}, "rdma": env.rdma_report(host)}))
    assert rows["rdma spdk target"].startswith("no: server1: SPDK over RDMA needs hugepages")
    assert rows["rdma spdk host"].startswith("no: server1: SPDK over RDMA needs hugepages")


def test_a_ram_backend_beyond_the_free_hugepages_is_refused_before_the_target_starts(tmp_path, spdk_build):
    host = Server(HUGEPAGES_1G, tmp_path)
    big = target_setup(transport="rdma", subsystems=(Subsystem(NQN, "ram", 256 << 20),))
    with pytest.raises(StackError, match=f"1024 MiB of hugepages are free there and SPDK takes {BASE_MEM_MB + 256} MiB"):
        get_stack("spdk").start_target(big, host, tmp_path)
    assert rdma_hugepages_refusal(host, BASE_MEM_MB) is None


def target_setup(**fields) -> TargetSetup:
    base = dict(cores=(0,), mode="poll", idle_poll_us=0, in_capsule_data_size=8192, so_priority=0, tos=0,
                busy_poll_us=0, subsystems=(Subsystem(NQN, "null", 64 << 20),))
    return TargetSetup(**(base | fields))


def test_a_build_for_another_distribution_is_refused_naming_the_missing_library(tmp_path, spdk_build, monkeypatch):
    tools = tmp_path / "tools"  # ldd as on trixie, which renamed Debian 12's libaio.so.1 libaio.so.1t64
    tools.mkdir()
    (tools / "ldd").write_text('#!/bin/sh\nprintf "\\tlibaio.so.1 => not found\\n\\tlibc.so.6 => /lib/libc.so.6 (0x1)\\n"\n')
    (tools / "ldd").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    spdk, host = get_stack("spdk"), Server(HUGEPAGES_1G, tmp_path)
    for why in (spdk.unavailable(host, "target"), spdk.rdma_unavailable(host, "host")):
        assert why.startswith("server1: ") and "does not run there: libaio.so.1 not found" in why, why
    (tools / "ldd").write_text("#!/bin/sh\necho '\\tlibc.so.6 => /lib/libc.so.6 (0x1)'\n")
    assert spdk.unavailable(host, "target") is None


def test_an_app_that_ends_at_its_start_is_named_by_its_first_error():
    log = ("Failed to initialize OpenSSL\n"
           "00EA:error:80000002:system library:BIO_new_file:No such file or directory:calling fopen(/usr/lib/ssl/openssl.cnf, rb)\n"
           "[2026-12-06 18:46:34.323458] app.c: 393:app_setup_env: *ERROR*: Unable to initialize SPDK env\n"
           "[2026-12-06 18:46:34.328003] app.c: 605:unclaim_cpu_cores: *ERROR*: Failed to unlink lock fd for core 0\n")
    assert start_error(log) == "Failed to initialize OpenSSL"
    assert start_error("starting\nall good\n") == "all good"
