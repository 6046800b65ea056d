"""Exit statuses of the nvmflab CLI (issue 41 item 2, docs/CONTRACTS.md "Exit statuses"): no bad
input to any command yields 0 or 1 (which say something about the measurements) or a traceback;
it yields 2 with one line naming what was wrong. An internal error is 70, never 1 or 2."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from synth_results import repeats, write_results

from nvmflab import cli, exits
from nvmflab.gate import GateError, parse_thresholds
from nvmflab.names import STUDY_NAMES

NVMFLAB = str(Path(sys.executable).parent / "nvmflab")


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Two usable results directories and a scratch folder for damaged ones."""
    base = tmp_path_factory.mktemp("exit")
    points = [{"knobs": {"iodepth": 1}, "repeats": repeats([100e3, 101e3, 99e3], 50, [1.0, 1.01, 0.99])}]
    return write_results(base / "a", points), write_results(base / "b", points), base


def invoke(argv: list[str]) -> tuple[int, str, str]:
    """`nvmflab ARGV` through cli.main in this process: (status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with mock.patch.object(sys, "argv", ["nvmflab", *argv]), mock.patch.dict(os.environ), \
            redirect_stdout(out), redirect_stderr(err):
        os.environ.pop("NVMFLAB_DEBUG", None)
        try:
            cli.main()
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return code, out.getvalue(), err.getvalue()


def commands(a: Path, b: Path) -> list[list[str]]:
    """Every command with arguments it would accept."""
    return [["study", "polling"], ["run", str(a / "spec.toml")], ["soak"], ["report", str(a)],
            ["results", "list", str(a)], ["results", "show", str(a)],
            ["results", "export", str(a), "--out", str(a / "x.csv")], ["env"], ["compare", str(a), str(b)]]


WORD = st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True)
JUNK = st.text(min_size=1, max_size=12).filter(lambda s: "\x00" not in s)


def not_a_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return True
    return False


def not_a_threshold(text: str) -> bool:
    try:
        parse_thresholds([text])
    except GateError:
        return True
    return False


@st.composite
def bad_input(draw, a: Path, b: Path, scratch: Path) -> list[str]:
    """One command with one thing wrong in it."""
    fault = draw(st.sampled_from(["option", "extra", "missing", "no results", "damaged", "number", "study",
                                  "spec", "threshold", "format", "gate point"]))
    word = draw(WORD)
    if fault == "option":
        return [*draw(st.sampled_from(commands(a, b))), f"--zz-{word}"]
    if fault == "extra":
        return [*draw(st.sampled_from([c for c in commands(a, b) if c[0] not in ("run", "study")])), word]
    if fault == "missing":
        return draw(st.sampled_from([["report"], ["results", "list"], ["results", "show"], ["run"], ["study"],
                                     ["compare", str(a)], ["results", "export", str(a)]]))
    if fault == "no results":
        missing = str(scratch / f"nowhere-{word}")
        return draw(st.sampled_from([["report", missing], ["results", "list", missing], ["results", "show", missing],
                                     ["results", "export", missing, "--out", str(scratch / "x.csv")],
                                     ["compare", missing, str(b)], ["compare", str(a), missing]]))
    if fault == "damaged":
        damaged = scratch / f"damaged-{word}"
        damaged.mkdir(exist_ok=True)
        # Garbage for a file, after an SQLite header, or over every page of a real one but the first.
        head = draw(st.sampled_from([b"", b"SQLite format 3\x00", (a / "results.sqlite").read_bytes()[:4096]]))
        tail = draw(st.binary(min_size=16, max_size=64))
        size = (a / "results.sqlite").stat().st_size - len(head) if len(head) == 4096 else len(tail)
        (damaged / "results.sqlite").write_bytes(head + (tail * (size // len(tail) + 1))[:size])
        return draw(st.sampled_from([["report", str(damaged), "--json"], ["results", "list", str(damaged)],
                                     ["results", "show", str(damaged)], ["compare", str(damaged), str(b)],
                                     ["compare", str(a), str(damaged), "--json"]]))
    if fault == "number":
        junk = draw(JUNK.filter(not_a_number))
        return draw(st.sampled_from([["soak", "--minutes", junk], ["soak", "--hosts", junk],
                                     ["compare", str(a), str(b), "--fail-if-slower", "5", "--gate-min-points", junk]]))
    if fault == "study":
        assume(word not in STUDY_NAMES and word != "all")
        return ["study", word]
    if fault == "spec":
        return ["run", str(scratch / f"no-{word}.toml")]
    if fault == "threshold":
        junk = draw(JUNK.filter(not_a_threshold))
        return ["compare", str(a), str(b), "--json", "--fail-if-slower", junk]
    if fault == "format":
        assume(word not in ("csv", "parquet"))
        return ["results", "export", str(a), "--out", str(scratch / "x.csv"), "--format", word]
    # gate point: a knob no point has, or a value no point has
    return ["compare", str(a), str(b), "--json", "--fail-if-slower", "5", "--gate-point",
            draw(st.sampled_from([f"zz{word}=1", f"iodepth=x{word}"]))]


def test_bad_input_to_any_command_exits_2_with_one_line(stores):
    a, b, scratch = stores

    @settings(max_examples=60, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(bad_input(a, b, scratch))
    def check(argv):
        code, _, err = invoke(argv)
        assert code == exits.BAD_INPUT, (argv, code, err)
        assert "Traceback" not in err and "internal error" not in err, (argv, err)
        lines = err.strip().splitlines()
        assert lines and lines[-1].startswith("nvmflab: error: "), (argv, err)

    check()


@pytest.mark.parametrize("damage", ["not sqlite", "sqlite header only", "pages after the first"])
@pytest.mark.parametrize("command", [["report", "{d}", "--json"], ["results", "list", "{d}"],
                                     ["results", "show", "{d}"], ["compare", "{d}", "{b}"],
                                     ["compare", "{b}", "{d}", "--json"]],
                         ids=["report", "results list", "results show", "compare before", "compare after"])
def test_every_reader_of_a_damaged_database_exits_2(stores, damage, command):
    a, b, scratch = stores
    raw = (a / "results.sqlite").read_bytes()
    head = {"not sqlite": b"", "sqlite header only": b"SQLite format 3\x00",
            "pages after the first": raw[:4096]}[damage]
    d = scratch / f"damaged {damage}"
    d.mkdir(exist_ok=True)
    (d / "results.sqlite").write_bytes(head + b"\xa5" * (len(raw) - len(head)))
    code, _, err = invoke([part.format(d=d, b=b) for part in command])
    assert code == exits.BAD_INPUT, err
    assert "internal error" not in err and "Traceback" not in err and str(d) in err, err
    assert "cannot write" not in err, f"a read error called a write error: {err}"


def test_an_internal_error_exits_70_not_1(stores, monkeypatch):
    """A bug (an exception no command expects) is told apart from a measured failure (1) and from
    bad input (2)."""
    from nvmflab import compare

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(compare, "run", broken)
    code, _, err = invoke(["compare", str(stores[0]), str(stores[1])])
    assert code == exits.INTERNAL == 70
    assert "internal error: RuntimeError: a bug" in err and "Traceback" not in err


def test_the_installed_command_follows_the_table(stores):
    """The console script itself (not only cli.main): bad input 2 with one line, no traceback."""
    damaged = stores[2] / "damaged-installed"
    damaged.mkdir()
    (damaged / "results.sqlite").write_bytes(b"SQLite format 3\x00" + b"\xa5" * 4000)
    done = subprocess.run([NVMFLAB, "compare", str(stores[0]), str(damaged)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
