"""Issue 41 item 5: `results show` filters are checked, reading commands work on a read-only results
directory, every failed write names its path (or stdout) and the OS's reason with exit 2, and
`results export` writes into a directory it makes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
from conftest import NVMFLAB, REPO, nvmflab
from synth_results import repeats, write_results

from nvmflab.store import ResultsStore, StoreError


def one_line_error(done: subprocess.CompletedProcess, *needles: str) -> str:
    line = done.stderr.strip()
    assert done.returncode == 2, (done.returncode, (done.stdout or "")[-300:], done.stderr)
    assert "\n" not in line and "Traceback" not in line and "internal error" not in line, line
    assert line.startswith("nvmflab: error: "), line
    for needle in needles:
        assert needle in line, (needle, line)
    return line


@pytest.fixture
def results(tmp_path) -> Path:
    points = [{"knobs": {"iodepth": 1}, "repeats": repeats([100.0, 110.0, 120.0])},
              {"knobs": {"iodepth": 8}, "leg": "deep", "repeats": repeats([300.0, 310.0])}]
    return write_results(tmp_path / "r", points, study="sweep-x")


def test_results_show_refuses_a_study_or_leg_not_stored_naming_those_that_are(results):
    done = nvmflab("results", "show", str(results), "--study", "nope", env=dict(os.environ))
    one_line_error(done, "no study 'nope'", "studies stored: sweep-x")
    done = nvmflab("results", "show", str(results), "--leg", "nope", env=dict(os.environ))
    one_line_error(done, "no leg 'nope'", "legs stored: deep, sweep")
    done = nvmflab("results", "show", str(results), "--study", "sweep-x", "--leg", "nope", env=dict(os.environ))
    one_line_error(done, "no leg 'nope' of study sweep-x", "legs stored: deep, sweep")
    shown = nvmflab("results", "show", str(results), "--study", "sweep-x", "--leg", "deep", env=dict(os.environ))
    assert shown.returncode == 0, shown.stderr
    assert "deep" in shown.stdout and "│ sweep " not in shown.stdout  # the other leg's rows are left out


def test_export_into_a_new_directory_writes_measurements_csv_or_parquet(results, tmp_path):
    for out, fmt, name in ((f"{tmp_path}/new/", None, "measurements.csv"),
                           (f"{tmp_path}/plain", None, "measurements.csv"),
                           (f"{tmp_path}/deep/er/", "parquet", "measurements.parquet")):
        done = nvmflab("results", "export", str(results), "--out", out, *(["--format", fmt] if fmt else []),
                       env=dict(os.environ))
        assert done.returncode == 0, done.stderr
        written = Path(out) / name
        frame = pd.read_csv(written) if name.endswith(".csv") else pd.read_parquet(written)
        assert sorted(frame["iops"]) == [100.0, 110.0, 120.0, 300.0, 310.0]
    one_line_error(nvmflab("results", "export", str(results), "--out", str(tmp_path / "m.txt"), env=dict(os.environ)),
                   "cannot tell the format from the name")
    one_line_error(nvmflab("results", "export", str(results), "--out", " ", env=dict(os.environ)), "--out is empty")


def test_failed_writes_name_the_path_or_stdout_and_the_reason(results, tmp_path):
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    env = dict(os.environ)
    for args in (["report", str(results), "--json"], ["results", "show", str(results)],
                 ["results", "export", str(results), "--out", str(tmp_path / "e")]):
        with open("/dev/full", "w") as full:
            done = subprocess.run(NVMFLAB + args, env=env, stdout=full, stderr=subprocess.PIPE, text=True,
                                  timeout=120, cwd=REPO)
        one_line_error(done, "cannot write to stdout: No space left on device")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    one_line_error(nvmflab("results", "export", str(results), "--out", str(blocker / "x.csv"), env=env),
                   f"{blocker}/x.csv: cannot write (", f"'{blocker}'")
    one_line_error(nvmflab("report", str(results), "--json", "--out", str(blocker / "rep"), env=env),
                   f"{blocker}/rep: cannot write the report (", f"'{blocker}")


def test_a_reader_that_went_away_ends_the_command_quietly_with_141(results):
    """`nvmflab report --json | head -1`: the closed pipe is not an error worth a message (exit 141,
    128 + SIGPIPE, as for a shell tool), unlike a full disk (exit 2, named)."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write
    try:
        done = subprocess.run(NVMFLAB + ["report", str(results), "--json"], env=dict(os.environ), stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120, cwd=REPO)
    finally:
        os.close(write_end)
    assert done.returncode == 141, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and "error" not in done.stderr, done.stderr


def test_a_read_only_store_opens_without_writing_and_an_old_one_is_upgraded(results, tmp_path):
    before = {p.name: p.stat().st_mtime_ns for p in results.iterdir()}
    with ResultsStore(results, read_only=True) as store:
        assert len(store.measurements()) == 5
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            store.start_run("x", "", {})
    assert {p.name: p.stat().st_mtime_ns for p in results.iterdir()} == before
    old = tmp_path / "old"
    old.mkdir()
    shutil.copy(results / "results.sqlite", old / "results.sqlite")
    with sqlite3.connect(old / "results.sqlite") as db:
        db.execute("ALTER TABLE measurements DROP COLUMN cpu_cores_json")  # as a store before that column
    with ResultsStore(old, read_only=True) as store:  # writable: the column is added, then it reads
        assert "cpu_cores_json" in store.measurements().columns
    (tmp_path / "junk" / "results.sqlite").parent.mkdir()
    (tmp_path / "junk" / "results.sqlite").write_text("not sqlite")
    with pytest.raises(StoreError, match="not a results database"):
        ResultsStore(tmp_path / "junk", read_only=True)


def _read_only_mount(path: Path) -> list[str] | None:
    """argv prefix that runs a command with `path` mounted read-only (for root, whom permissions do not
    stop), or None where this machine cannot make one; a non-root user gets the permission bits."""
    if os.geteuid() != 0:
        for item in [path, *path.rglob("*")]:
            item.chmod(item.stat().st_mode & ~0o222)
        return []
    script = 'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" && exec "$@"'
    argv = ["unshare", "-m", "sh", "-c", script, str(path)]
    if shutil.which("unshare") is None:
        return None
    probe = subprocess.run(argv + ["touch", str(path / "probe")], capture_output=True, text=True, timeout=20)
    if probe.returncode == 0 or "Read-only file system" not in probe.stderr:
        (path / "probe").unlink(missing_ok=True)
        return None
    return argv


def test_report_json_and_results_commands_work_on_a_read_only_results_directory(results, tmp_path):
    prefix = _read_only_mount(results)
    if prefix is None:
        pytest.skip("cannot make a read-only mount here (unshare -m as root)")
    env = dict(os.environ)

    def run(*args):
        return subprocess.run(prefix + NVMFLAB + list(args), env=env, capture_output=True, text=True, timeout=120,
                              cwd=REPO)

    try:
        done = run("report", str(results), "--json")
        assert done.returncode == 0, done.stderr
        assert '"format": "nvmflab-findings/1"' in done.stdout and "sweep-x" in done.stdout
        assert "the report is not kept (give --out DIR to keep it)" in done.stderr
        assert "cannot write the report (" in done.stderr
        for args in (("results", "show", str(results), "--leg", "deep"),
                     ("results", "export", str(results), "--out", str(tmp_path / "x.csv")),
                     ("report", str(results), "--out", str(tmp_path / "rep"))):
            done = run(*args)
            assert done.returncode == 0 and "error" not in done.stderr, (args, done.stderr)
        assert (tmp_path / "rep" / "findings.json").is_file() and (tmp_path / "x.csv").is_file()
        one_line_error(run("report", str(results)), f"{results}/report: cannot write the report (")
        assert not (results / "report").exists()
    finally:
        for item in [results, *results.rglob("*")]:
            item.chmod(item.stat().st_mode | 0o200)
