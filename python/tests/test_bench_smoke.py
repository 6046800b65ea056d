"""`bench/run.py --quick` end to end with our stack only (about 30 s): every matrix cell, the TLS
rows with their cipher-bound limits, both ping-pong floors, the event-mode run and the memory
points come out, in JSON and Markdown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from nvmfbench.stacks import BenchError, bench_binary  # noqa: E402


def _missing() -> str | None:
    try:
        for name in ("nvmf-target", "nvmf-perf", "nvmf-bench"):
            if "fakebin" in str(bench_binary(name)):
                return f"{name} is the fake"
    except BenchError as err:
        return str(err)
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=f"bench binaries not built: {_missing()}")


def test_quick_bench_with_our_stack_writes_every_table(tmp_path):
    out = tmp_path / "results.json"
    done = subprocess.run([sys.executable, str(REPO / "bench" / "run.py"), "--quick", "--stacks", "ours",
                           "--suites", "matrix,memory", "--memory-counts", "1,8", "--out", str(out)],
                          capture_output=True, text=True, timeout=180, cwd=REPO, env=dict(os.environ))
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(out.read_text())
    cells = {(c["target"], c["host"], c["work"]): c for c in results["matrix"]}
    for work in results["config"]["works"]:
        assert cells[("ours", "ours", work)]["iops"] > 0, work
    assert cells[("ours-event", "ours-event", "4k randread QD1")]["lat_mean_ns"] > 0
    # TLS rows (on by default): ours with TLS 1.3 on both sides, and its ratio to plain in the same run.
    tls_works = ("4k randread QD1", "4k randread QD32", "4k randwrite QD32", "128k randread QD32",
                 "128k randwrite QD32")
    for work in tls_works:
        assert cells[("ours-tls", "ours-tls", work)]["iops"] > 0, work
    tls_ratios = [r for r in results["ratios"] if r["comparison"] == "ours x ours TLS / ours x ours plain"]
    assert [r["work"] for r in tls_ratios] == list(tls_works) and all(r["iops_ratio"] > 0 for r in tls_ratios)
    # Each TLS row against the limit AES-GCM puts on it, from the rate measured in the same run.
    assert results["cipher"]["rates_bps"]["4096"]["decrypt"] > 0 and not results["cipher"]["errors"]
    bounds = {b["work"]: b for b in results["tls_bound"] if b["pair"] == "ours x ours"}
    assert list(bounds) == list(tls_works)
    assert all(0 < b["limit_iops"] < b["plain_iops"] and b["value"] > 0 for b in bounds.values())
    assert "| ours x ours | 4k randwrite QD32 |" in out.with_suffix(".md").read_text()
    # 128 KiB rows: both directions, polling and event mode, each side's CPU per GiB recorded.
    for work in ("128k randread QD32", "128k randwrite QD32"):
        assert cells[("ours-event", "ours-event", work)]["bw_bytes"] > 0, work
        for pair in ("ours", "ours-event"):
            row = next(r for r in results["cpu_per_gib"] if (r["target"], r["work"]) == (pair, work))
            assert row["host_usr_s_per_gib"] + row["host_sys_s_per_gib"] > 0, (pair, work)
            assert row["target_usr_s_per_gib"] + row["target_sys_s_per_gib"] > 0, (pair, work)
    assert results["machine"]["cpu"] and results["machine"]["vendor"] != "unknown"
    assert "CPU seconds per GiB moved at 128 KiB" in out.with_suffix(".md").read_text()
    assert all(results["floor"][mode]["mean_ns"] > 0 for mode in ("busy", "blocking"))
    assert not [r for r in results["runs"] + results["floor_runs"] if r.get("error")]
    # Every run is bracketed by two speed probes, taken with the busy-polling target paused.
    assert all(len(r["probe_ns"]) == 2 and min(r["probe_ns"]) > 0 for r in results["runs"] + results["floor_runs"])
    probes = [p for r in results["runs"] + results["floor_runs"] for p in r["probe_ns"]]
    assert results["noise"]["fastest_probe_ns"] == round(min(probes))  # reported in whole ns
    mem = {p["queues"]: p for p in results["memory"]["points"] if p["stack"] == "ours"}
    assert mem[8]["rss_bytes"] > mem[1]["rss_bytes"] > 0  # every queue costs something
    assert results["memory"]["bytes_per_queue"]["ours"] > 0
    goals = {g["goal"]: g["status"] for g in results["goals"]}
    assert goals["4k randread QD32 IOPS: ours x ours / SPDK x SPDK >= 1.3"].startswith("not measured")
    assert goals["4k QD1 mean latency (ours x ours, polling) / busy ping-pong mean <= 1.1"] != "not measured"
    assert results["spdk"] == "left out by --stacks"
    assert "| 4k randread QD1 |" in out.with_suffix(".md").read_text()
    assert "bench/README.md" not in done.stderr, "--quick leaves the README alone"
