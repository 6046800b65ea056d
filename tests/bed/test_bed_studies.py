"""The transports and security studies through the harness on the two guests (issue 39 item 3):
target on bed1, host on bed2, over the bed's link, for the kernel stack and ours on each side (the
mixed pairs too). Functional runs only: every point must be stored ok (or skipped with its reason,
or, for the wrong-key point, failed with the refusal), the report written with its functional
label; no timing is asserted, since the guests are emulated (the specs' descriptions say so)."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
from pathlib import Path

import bed as bed_module

ROOT = Path(__file__).resolve().parents[2]
NVMFLAB = ROOT / ".venv/bin/nvmflab"
SPECS = Path(__file__).resolve().parent / "specs"
STUDY_LIMIT_S = 3600  # 13-24 small points; one takes 20 s to 2 min on emulated guests
PAIRS = [("kernel", "kernel"), ("ours", "ours"), ("ours", "kernel"), ("kernel", "ours")]


def run_study(bed, study: str, bin_dir: Path | None = None, name: str | None = None,
              params: dict[str, str] | None = None, expect_rc: int = 0) -> Path:
    """Run the spec tests/bed/specs/STUDY.toml (as NAME, its [params] lines KEY = ... replaced by
    `params`); its inventory, bed.toml, is beside the copy."""
    name = name or study
    text = (SPECS / f"{study}.toml").read_text()
    for key, value in (params or {}).items():
        lines = [line for line in text.splitlines() if line.startswith(f"{key} = ")]
        assert len(lines) == 1, f"{study}.toml has no single {key} line"
        text = text.replace(lines[0], f"{key} = {value}")
    spec = bed.work / f"{name}.toml"
    spec.write_text(text)
    results = bed.work / f"results-{name}"
    env = os.environ | ({"NVMFLAB_BIN_DIR": str(bin_dir)} if bin_dir else {})
    done = subprocess.run([str(NVMFLAB), "study", study, "--spec", str(spec), "--results", str(results)],
                          capture_output=True, text=True, timeout=STUDY_LIMIT_S, env=env)
    (bed.work / f"{name}.log").write_text(done.stdout + done.stderr)
    assert done.returncode == expect_rc, (done.stdout + done.stderr)[-3000:]
    return results


def points(results: Path) -> list[dict]:
    with sqlite3.connect(results / "results.sqlite") as db:
        rows = db.execute("SELECT leg, status, error, knobs_json FROM points").fetchall()
    return [{"leg": leg, "status": status, "error": error, **json.loads(knobs)} for leg, status, error, knobs in rows]


def assert_functional_report(results: Path) -> None:
    report = (results / "report/report.html").read_text()
    label = report.split('id="functional"', 1)[-1].split("</p>", 1)[0]
    assert "Functional run (emulation): timings are not performance." in label
    assert "FUNCTIONAL run on emulated guests" in label


def test_transports_tcp_and_rdma_kernel_and_ours_and_mixed(bed):
    rdma_build = bed_module.RDMA_BIN_DIR if (bed_module.RDMA_BIN_DIR / "nvmf-target").is_file() else None
    results = run_study(bed, "transports", rdma_build)
    got = points(results)
    for target, host in PAIRS:
        label = target if target == host else f"{target}/{host}"
        for transport in ("tcp", "rdma"):
            mine = [p for p in got if p["target_stack"] == target and p["host_stack"] == host
                    and p["transport"] == transport]
            assert len(mine) == 3 and all(p["stack"] == label for p in mine), (label, transport, got)
            if "ours" in (target, host) and transport == "rdma" and rdma_build is None:
                assert all(p["status"] == "skipped" and "built without RDMA" in p["error"] for p in mine)
                continue
            assert all(p["status"] == "ok" for p in mine), [(label, p["app"], p["error"]) for p in mine]
            if transport == "rdma":
                assert all("software (rxe)" in p["rdma_device"] for p in mine)
    report = (results / "report/report.html").read_text()
    if rdma_build is not None:  # the report's per-transport table has an RDMA row for every pair
        for target, host in PAIRS:
            label = target if target == host else f"{target}/{host}"
            assert re.search(rf"<td>{label}</td>\s*<td>RDMA</td>", report), label
    assert_functional_report(results)


def check_security(results: Path, target: str, host: str) -> None:
    """Plain, TLS and DH-HMAC-CHAP ok for every data app; the wrong-key point refused by name; the
    connect points measured by our host, skipped with the reason for the kernel's."""
    got = points(results)
    assert got and all(p["target_stack"] == target and p["host_stack"] == host for p in got)
    wrong = [p for p in got if p.get("wrong_key")]
    assert len(wrong) == 1 and wrong[0]["status"] == "failed", wrong
    refused = "DH-HMAC-CHAP authentication failed" if host == "kernel" else "authentication"
    assert refused in wrong[0]["error"], wrong[0]["error"]
    connects = [p for p in got if p["app"] == "connect"]
    if host == "kernel":
        assert connects and all(p["status"] == "skipped" and "nvmf-perf --connects" in p["error"] for p in connects)
    else:
        assert connects and all(p["status"] == "ok" for p in connects), [(p["error"]) for p in connects]
    data = [p for p in got if p["app"] != "connect" and not p.get("wrong_key")]
    assert all(p["status"] == "ok" for p in data), [(p["app"], p["error"]) for p in data if p["status"] != "ok"]
    modes = {(p["tls"], p["dhchap"]) for p in data}
    assert modes == {("off", "off"), ("on", "off"), ("off", "ffdhe2048")}, modes
    assert {p["app"] for p in data} == {"L-app", "T-app", "B-app"}
    assert_functional_report(results)


def test_security_kernel_on_both_sides_plain_tls_dhchap_and_a_wrong_key(bed):
    # exit 1: the wrong-key point failed, as it must
    check_security(run_study(bed, "security", expect_rc=1), "kernel", "kernel")


def test_security_mixed_pairs(bed):
    for target, host in PAIRS[2:]:
        results = run_study(bed, "security", name=f"security-{target}-{host}", expect_rc=1,
                            params={"targets": f'["{target}"]', "hosts": f'["{host}"]'})
        check_security(results, target, host)
