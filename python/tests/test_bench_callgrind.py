"""bench/callgrind.py without valgrind: the Ir total read from a callgrind output file, the I/Os
from nvmf-perf's JSON, the short/long subtraction, the gate's exit statuses, and the named errors
(exit 2, no traceback) for bad input."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = Path(__file__).parent / "data/callgrind-host.out"  # a real file's header and totals
CORE = str(min(os.sched_getaffinity(0)))


@pytest.fixture(scope="module")
def cg():
    spec = importlib.util.spec_from_file_location("bench_callgrind", ROOT / "bench/callgrind.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_ir_total_comes_from_the_totals_line(cg):
    assert cg.callgrind_ir(SAMPLE.read_text()) == 73397876
    # totals wins over summary; Ir found by its column in events:
    text = "events: Dr Ir\nsummary: 5 6\n\ntotals: 7 8\n"
    assert cg.callgrind_ir(text) == 8
    assert cg.callgrind_ir("events: Ir\nsummary: 42\n") == 42


@pytest.mark.parametrize("text", ["events: Ir\n", "summary: 5\ntotals: 5\n", "events: Dr\ntotals: 5\n",
                                  "events: Ir\ntotals: lots\n"])
def test_ir_total_missing_is_a_named_error(cg, text):
    with pytest.raises(cg.CallgrindError, match="callgrind output"):
        cg.callgrind_ir(text)


def test_ios_are_reads_and_writes_of_every_job(cg):
    job = lambda r, w: {"read": {"total_ios": r}, "write": {"total_ios": w}}  # noqa: E731
    assert cg.perf_ios({"jobs": [job(10, 0), job(3, 4)]}) == 17
    with pytest.raises(cg.CallgrindError, match="total_ios"):
        cg.perf_ios({"jobs": [{"read": {}}]})


def test_per_io_subtracts_what_both_runs_pay_once(cg):
    # 5 M of start-up in both; 700 Ir per I/O in the target, 300 in the host.
    short = {"ios": 1000, "target": 5_000_000 + 700 * 1000, "host": 2_000_000 + 300 * 1000}
    long = {"ios": 3100, "target": 5_000_000 + 700 * 3100, "host": 2_000_000 + 300 * 3100}
    assert cg.per_io(short, long) == {"target": 700, "host": 300}
    with pytest.raises(cg.CallgrindError, match="stalled"):
        cg.per_io(short, long | {"ios": 1400})


def test_compare_fails_only_above_the_ratio(cg):
    base = {"4k-randread-qd1": {"target": 1000.0, "host": 500.0}}
    rows, status = cg.compare(base, {"4k-randread-qd1": {"target": 1020.0, "host": 400.0}}, 1.02)
    assert status == 0 and [r["ratio"] for r in rows] == [1.02, 0.8]
    rows, status = cg.compare(base, {"4k-randread-qd1": {"target": 1000.0, "host": 511.0}}, 1.02)
    assert status == 1 and [r["over"] for r in rows] == [False, True]
    assert "(> 1.02)" in cg.table(rows, 1.02)


def _canned(cg, monkeypatch, tmp_path, new_target: float):
    """run() with the builds and the callgrind runs replaced: base 1000 Ir/I/O in the target,
    new `new_target`; the host 500 in both."""
    monkeypatch.setattr(cg, "valgrind_version", lambda: "valgrind-test")
    monkeypatch.setattr(cg, "choose_sched", lambda core: cg.Sched(core, "batch"))
    monkeypatch.setattr(cg, "built_revision", lambda sha, cache: tmp_path)
    monkeypatch.setattr(cg, "built_tree", lambda copy_to: copy_to)

    def measure(version, works, seconds, tmp, sched):
        ir = 1000.0 if version.label == "base" else new_target
        return {w.key: {"target": ir, "host": 500.0} for w in works}, []
    monkeypatch.setattr(cg, "measure", measure)


@pytest.mark.parametrize("new_target, status", [(1010.0, 0), (1100.0, 1)])
def test_exit_status_and_json_follow_the_gate(cg, monkeypatch, tmp_path, capsys, new_target, status):
    _canned(cg, monkeypatch, tmp_path, new_target)
    out = tmp_path / "cg.json"
    assert cg.main(["--works", "4k-randread-qd1,128k-randwrite-qd32", "--out", str(out), "--core", CORE]) == status
    doc = json.loads(out.read_text())
    assert doc["versions"]["base"]["sha"] and len(doc["rows"]) == 4
    assert [r["over"] for r in doc["rows"] if r["side"] == "target"] == [status == 1] * 2
    assert "| nvmf-target | 4k-randread-qd1 | 1,000 |" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--works", "4k-randrw-qd1"], "workload '4k-randrw-qd1'"),
    (["--base", "no-such-revision-xyz"], "revision unknown: 'no-such-revision-xyz'"),
])
def test_bad_input_is_a_named_error(cg, monkeypatch, capsys, argv, message):
    monkeypatch.setattr(cg, "valgrind_version", lambda: "valgrind-test")
    monkeypatch.setattr(cg, "choose_sched", lambda core: cg.Sched(core, "batch"))
    assert cg.main([*argv, "--core", CORE]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_tls_work_gives_both_sides_one_key(cg):
    work = cg.parse_work("128k-randwrite-qd32-tls")
    assert (work.bs, work.rw, work.iodepth, work.tls) == (128 << 10, "randwrite", 32, True)
    target, host = cg.tls_args(work)
    assert target[:2] == ["--tls", "required"] and target[3] == f"{cg.TLS_HOSTNQN}={host[1]}"
    assert host[2:] == ["-q", cg.TLS_HOSTNQN]
    assert cg.tls_args(cg.parse_work("128k-randwrite-qd32")) == ([], [])
    with pytest.raises(cg.CallgrindError, match="workload '4k-randread-qd1-ssl'"):
        cg.parse_work("4k-randread-qd1-ssl")


def test_missing_valgrind_is_a_named_error(cg, monkeypatch, capsys):
    monkeypatch.setattr(cg, "VALGRIND", "/nonexistent/valgrind")
    assert cg.main(["--core", CORE]) == 2
    assert "valgrind not found at /nonexistent/valgrind" in capsys.readouterr().err


def test_failed_build_is_a_named_error(cg, monkeypatch, tmp_path):
    monkeypatch.setattr(cg.shutil, "which", lambda name: "/bin/false")
    with pytest.raises(cg.CallgrindError, match="build failed in"):
        cg.cargo_build(tmp_path, tmp_path / "build.log")
