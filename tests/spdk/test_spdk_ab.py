"""bench/ab.py with SPDK's target as a side (issue 40 item 3): our target and SPDK's, each as the
bench starts it, measured in the same rounds under nvmf-perf."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _ab():
    spec = importlib.util.spec_from_file_location("bench_ab", REPO / "bench" / "ab.py")
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    return ab


def test_ab_measures_our_target_against_spdks_in_the_same_rounds(spdk_root, our_bins, tmp_path, capsys):
    ab = _ab()
    bins = Path(os.environ.get("NVMFLAB_BIN_DIR") or REPO / "target/release")
    out = tmp_path / "ab.json"
    dpdk_before = _dpdk_dirs()
    code = ab.main(["--a", "spdk-spec", "--b", str(bins / "nvmf-target"), "--perf", str(bins / "nvmf-perf"),
                    "--no-probe", "--rounds", "2", "--seconds", "1", "--ramp", "0",
                    "--works", "4k-randread-qd1-poll", "--out", str(out)])
    assert code == 0, capsys.readouterr().err[-2000:]
    runs = json.loads(out.read_text())["runs"]
    assert [r["side"] for r in runs] == ["A", "B", "B", "A"]  # interleaved, the order reversed
    assert all(r.get("iops", 0) > 1000 for r in runs), runs
    # SPDK's reactor polls its core: its CPU is read from its process, not left at zero.
    assert all(r["target_usr_s_per_gib"] + r["target_sys_s_per_gib"] > 0 for r in runs)
    assert "4k-randread-qd1-poll" in capsys.readouterr().out
    # Each SPDK target's stop() removed the DPDK runtime directory it made.
    assert _dpdk_dirs() <= dpdk_before


def _dpdk_dirs() -> set[Path]:
    return set(Path("/var/run/dpdk").glob("spdk_pid*"))


def test_bench_runs_spdk_nvme_perf_over_tls_without_its_socket_buffer_stall(spdk_root, our_bins, tmp_path):
    """spdk_nvme_perf -S ssl sends through SPDK 24.01's 4 KiB buffer unless the bench's shim raises
    it: 128 KiB writes on our TLS target then ran at 4-33 IOPS (each waiting on a delayed ACK,
    41 ms or more), and at thousands with it. 300 IOPS (3 ms per write, 32 in flight: 100 ms
    each) is far below any healthy run and far above the stall."""
    import sys

    from nvmflab.stacks import spdk_sockbuf

    sys.path.insert(0, str(REPO / "bench"))
    from nvmfbench.stacks import MATRIX_WORKS, Bench

    work = next(w for w in MATRIX_WORKS if w.name == "128k randwrite QD32")
    bench = Bench(tmp_path, None)
    with bench.target("ours-tls", [0], "poll") as target:
        run = bench.measure("spdk-tls", target, work, "poll", [1], 2, 0)
    assert "error" not in run, run
    assert run["host_sockbuf"] == spdk_sockbuf.FLOOR_BYTES
    assert run["iops"] > 300, run
