"""The transports and security studies through the harness on the two guests (issue 39 item 3):
target on bed1, host on bed2, over the bed's link. Functional runs only: every point must be
stored ok (or skipped with its reason), the report written; no timing is asserted, since the
guests are emulated (the specs' descriptions say so, and the report carries them)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import bed as bed_module

ROOT = Path(__file__).resolve().parents[2]
NVMFLAB = ROOT / ".venv/bin/nvmflab"
SPECS = Path(__file__).resolve().parent / "specs"
STUDY_LIMIT_S = 2400  # 6-9 small points; one takes 20 s to 2 min on emulated guests


def run_study(bed, study: str, bin_dir: Path | None = None) -> Path:
    spec = bed.work / f"{study}.toml"
    shutil.copy(SPECS / f"{study}.toml", spec)  # its inventory, bed.toml, is beside it
    results = bed.work / f"results-{study}"
    env = os.environ | ({"NVMFLAB_BIN_DIR": str(bin_dir)} if bin_dir else {})
    done = subprocess.run([str(NVMFLAB), "study", study, "--spec", str(spec), "--results", str(results)],
                          capture_output=True, text=True, timeout=STUDY_LIMIT_S, env=env)
    (bed.work / f"{study}.log").write_text(done.stdout + done.stderr)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return results


def points(results: Path) -> list[dict]:
    with sqlite3.connect(results / "results.sqlite") as db:
        rows = db.execute("SELECT leg, status, error, knobs_json FROM points").fetchall()
    return [{"leg": leg, "status": status, "error": error, **json.loads(knobs)} for leg, status, error, knobs in rows]


def assert_functional_report(results: Path) -> None:
    report = (results / "report/report.html").read_text()
    assert "FUNCTIONAL run on emulated guests" in report


def test_transports_tcp_and_rdma_kernel_and_ours(bed):
    rdma_build = bed_module.RDMA_BIN_DIR if (bed_module.RDMA_BIN_DIR / "nvmf-target").is_file() else None
    results = run_study(bed, "transports", rdma_build)
    got = points(results)
    for stack in ("kernel", "ours"):
        for transport in ("tcp", "rdma"):
            mine = [p for p in got if p["target_stack"] == stack and p["host_stack"] == stack
                    and p["transport"] == transport]
            assert len(mine) == 3, (stack, transport, got)  # L-app, T-app and B-app
            if stack == "ours" and transport == "rdma" and rdma_build is None:
                assert all(p["status"] == "skipped" and "built without RDMA" in p["error"] for p in mine)
                continue
            assert all(p["status"] == "ok" for p in mine), [(p["app"], p["error"]) for p in mine]
            if transport == "rdma":
                assert all("software (rxe)" in p["rdma_device"] for p in mine)
    assert_functional_report(results)


def test_security_kernel_on_both_sides_plain_and_tls(bed):
    results = run_study(bed, "security")
    got = points(results)
    assert got and all(p["target_stack"] == "kernel" and p["host_stack"] == "kernel" for p in got)
    connects = [p for p in got if p["app"] == "connect"]
    assert connects and all(p["status"] == "skipped" and "nvmf-perf --connects" in p["error"] for p in connects)
    # The kernel stack has no dhchap knob yet: its DH-HMAC-CHAP points are refused with that reason.
    dhchap = [p for p in got if p["app"] != "connect" and p["dhchap"] != "off"]
    assert dhchap and all(p["status"] == "skipped" and "the kernel target has no such setting" in p["error"]
                          for p in dhchap)
    data = [p for p in got if p["app"] != "connect" and p["dhchap"] == "off"]
    assert all(p["status"] == "ok" for p in data), [(p["app"], p["error"]) for p in data if p["status"] != "ok"]
    assert {(p["tls"], p["app"]) for p in data} == {(t, a) for t in ("off", "on") for a in ("L-app", "T-app", "B-app")}
    assert_functional_report(results)
