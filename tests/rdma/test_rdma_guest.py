"""NVMe over RDMA on Soft-RoCE in the trixie guest (check.py, guest-check.sh): the kernel host
against nvmet-rdma as the control, then against our target built with the `rdma` feature (with a
namespace added and removed while connected: asynchronous events over RDMA), and our host
(nvmf-perf -t rdma) against both. One guest boot serves every test here.

With NVMFLAB_RDMA_SPDK=1 (`make test-rdma`) the same boot also runs SPDK over RDMA
(spdk-check.sh): SPDK's target with the kernel host and nvmf-perf, and SPDK's hosts against all
three targets. Without it (`make test`, where it would cost minutes more) or without an SPDK
build that has RDMA, the SPDK tests skip and say why. The boot is conftest.py's `guest` fixture,
which test_reconnect.py shares."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "guest"))
import check  # noqa: E402
import trixie  # noqa: E402

SIZES = ("4k", "128k", "1m")


def steps(tag: str) -> list[str]:
    return [f"{tag} discover", f"{tag} identify"] + [f"{tag} write+verify {s}" for s in SIZES] + [f"{tag} disconnect"]


def perf_steps(tag: str) -> list[str]:
    return [f"{tag} discover", f"{tag} identify"] + [f"{tag} write+verify {s}" for s in SIZES]


def ours_stats(run) -> dict:
    """Our target's /stats as the guest read it."""
    return check.stats_json(run.out / "stats-ours.txt")


def passed(results: dict[str, str], step: str) -> bool:
    return results.get(step, f"MISSING {step}").startswith("PASS")


def test_every_step_passed(guest):
    _, results, no_spdk = guest
    assert len(results) >= (30 if no_spdk else 30 + SPDK_STEPS), sorted(results)
    bad = [line for line in results.values() if not line.startswith("PASS")]
    assert not bad, bad


def test_soft_roce_comes_up(guest):
    run, results, _ = guest
    assert passed(results, "setup"), results.get("setup")
    assert "rxe0" in (run.out / "rdma-link.txt").read_text()


def test_kernel_host_against_nvmet_rdma_control(guest):
    _, results, _ = guest
    bad = [results.get(s, f"MISSING {s}") for s in steps("nvmet") if not passed(results, s)]
    assert not bad, bad


def test_kernel_host_against_our_target(guest):
    run, results, _ = guest
    ours = ["ours start"] + steps("ours") + ["ours namespace added", "ours namespace removed", "ours stats", "ours stop"]
    bad = [results.get(s, f"MISSING {s}") for s in ours if not passed(results, s)]
    assert not bad, bad
    assert any(k.startswith("ours connect") and v.startswith("PASS") for k, v in results.items())


def test_kernel_host_sees_namespace_changes_over_rdma(guest):
    """Namespace Attribute Changed over RDMA: the AER our target completed made the kernel host
    read log page 04h and rescan, so the namespace added through nvmf-target-ctl got a block
    device and the removed one lost it."""
    run, results, _ = guest
    bad = [results.get(s, f"MISSING {s}") for s in ("ours namespace added", "ours namespace removed") if not passed(results, s)]
    assert not bad, bad
    assert "rescanning namespaces" in (run.out / "dmesg.txt").read_text()
    events = (run.out / "ns-events-ours.txt").read_text()
    assert re.search(r"^added /dev/nvme\d+n2 after [\d.]+ s$", events, re.M), events
    assert re.search(r"^removed /dev/nvme\d+n2 after [\d.]+ s$", events, re.M), events


def test_our_target_served_admin_and_io_queues_over_rdma(guest):
    run, _, _ = guest
    log = (run.out / "target.log").read_text()
    assert "NVMe/RDMA listening" in log
    assert "RDMA queue connected" in log and "qid=1" in log, log[-2000:]
    assert "panicked" not in log
    discover = (run.out / "discover-ours.txt").read_text()
    assert "trtype:  rdma" in discover and "rdma_cms:    rdma-cm" in discover, discover
    # fio's read phase is the verification: every block written is read back and checked.
    fio = (run.out / "fio-ours.txt").read_text()
    assert "err= 0" in fio and "READ: bw=" in fio and "WRITE: bw=" in fio and "io=8192KiB" in fio, fio


def test_rdma_queues_are_placed_on_both_event_mode_reactors(guest):
    """Our target ran with --cores 0,1 --mode event: /stats lists two reactors, on cores 0 and 1,
    in event mode, and the RDMA queues were placed round robin on both (each served commands and
    slept and woke on its completion channels); together the queues carry the 14 MiB that the
    kernel host's fio and nvmf-perf each wrote."""
    run, results, _ = guest
    assert passed(results, "ours stats"), results.get("ours stats")
    reactors = ours_stats(run)["reactors"]
    assert [(r["index"], r["core"], r["mode"]) for r in reactors] == [(0, 0, "event"), (1, 1, "event")], reactors
    for r in reactors:
        queues = [q for q in r["queues"] if q["transport"] == "rdma"]
        assert queues and sum(q["commands"] for q in queues) > 0, f"reactor {r['index']} served no RDMA queue: {r}"
        assert r["busy_ns"] > 0 and r["idle_ns"] > 0 and r["wakeups"] > 0, r
        assert r["commands"] == sum(q["commands"] for q in r["queues"]), r
    queues = [q for r in reactors for q in r["queues"]]
    assert {q["qid"] for q in queues} >= {0, 1}, queues
    assert sum(q["bytes_written"] for q in queues) >= 14 << 20, queues
    ns = [n for r in reactors for n in r["namespaces"] if n["nsid"] == 1]
    assert sum(n["writes"] for n in ns) > 0 and sum(n["reads"] for n in ns) > 0, ns


def test_rdma_buffers_count_against_buffer_memory(guest):
    """Our target ran with --buffer-memory 4MiB: the 1 MiB writes at queue depth 8 (fio's and
    nvmf-perf's, which verified) had to wait for buffer memory, and the buffers held at once
    stayed within the cap, beyond it only by forced takes (in-capsule and admin data, a few KiB)."""
    run, results, _ = guest
    assert passed(results, "ours stats"), results.get("ours stats")
    buffers = ours_stats(run)["buffer_memory"]
    assert buffers["limit"] == 4 << 20, buffers
    assert buffers["refusals"] > 0, f"no command waited for buffer memory: {buffers}"
    assert 2 << 20 <= buffers["peak"] <= buffers["limit"] + (256 << 10), buffers
    assert passed(results, "ours write+verify 1m") and passed(results, "perf-ours write+verify 1m")


def test_our_host_against_nvmet_rdma(guest):
    run, results, _ = guest
    bad = [results.get(s, f"MISSING {s}") for s in perf_steps("perf-nvmet") if not passed(results, s)]
    assert not bad, bad
    # The kernel's discovery controller named its port rdma, and our write+verify read every block back.
    assert "trtype:  rdma" in (run.out / "discover-perf-nvmet.txt").read_text()
    report = (run.out / "perf-perf-nvmet-1m.txt").read_text()
    assert "all blocks correct" in report, report


def test_our_host_against_our_target(guest):
    run, results, _ = guest
    bad = [results.get(s, f"MISSING {s}") for s in perf_steps("perf-ours") if not passed(results, s)]
    assert not bad, bad
    # Every I/O of the region was read back: 2 MiB at 4k, 4 MiB at 128k, 8 MiB at 1m.
    for bs, ios in (("4k", 512), ("128k", 32), ("1m", 8)):
        report = (run.out / f"perf-perf-ours-{bs}.txt").read_text()
        assert re.search(rf"verify +: {ios} I/Os read back, all blocks correct", report), report


# spdk start/stop; the kernel host's 7 steps (with connect); nvmf-perf's 5; SPDK's hosts' 5 per
# target (3 targets); spdk_nvme_perf's 1 per target.
SPDK_STEPS = 2 + 7 + 5 + 3 * 5 + 3


def spdk_results(guest) -> tuple[trixie.GuestRun, dict[str, str]]:
    run, results, no_spdk = guest
    if no_spdk:
        pytest.skip(no_spdk)
    return run, results


def test_kernel_host_against_spdk_target(guest):
    run, results = spdk_results(guest)
    bad = [results.get(s, f"MISSING {s}") for s in ["spdk start"] + steps("spdk") + ["spdk stop"] if not passed(results, s)]
    assert not bad, bad
    assert "NVMe/RDMA Target Listening" in (run.out / "spdk-target.log").read_text()
    assert "trtype:  rdma" in (run.out / "discover-spdk.txt").read_text()


def test_our_host_against_spdk_target(guest):
    run, results = spdk_results(guest)
    bad = [results.get(s, f"MISSING {s}") for s in perf_steps("perf-spdk") if not passed(results, s)]
    assert not bad, bad
    assert "all blocks correct" in (run.out / "perf-perf-spdk-1m.txt").read_text()


@pytest.mark.parametrize("target", ["nvmet", "ours", "spdk"])
def test_spdk_host_against_each_target(guest, target):
    run, results = spdk_results(guest)
    bad = [results.get(s, f"MISSING {s}") for s in perf_steps(f"spdkhost-{target}") if not passed(results, s)]
    assert not bad, bad
    # bdevperf -w verify: one job per size, each write read back and compared.
    report = (run.out / f"bdevperf-spdkhost-{target}.txt").read_text()
    for size in (4096, 131072, 1048576):
        assert re.search(rf"workload: verify, depth: \d+, IO size: {size}\)", report), report[-3000:]
    assert re.search(r"Transport Type: +1 \(RDMA\)", (run.out / f"discover-spdkhost-{target}.txt").read_text())


def test_spdk_nvme_perf_over_rdma_against_each_target(guest):
    run, results = spdk_results(guest)
    bad = [results.get(f"spdk-perf-{port}", f"MISSING spdk-perf-{port}") for port in (4420, 4421, 4422)
           if not passed(results, f"spdk-perf-{port}")]
    assert not bad, bad
    assert "RDMA (addr:10.77.0.1" in (run.out / "spdk-perf.txt").read_text()
