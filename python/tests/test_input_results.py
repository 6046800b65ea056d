"""Issue 25: a stored point is reused only when everything that defines it is unchanged, a results
directory keeps one spec per study and one run at a time, exit codes say what happened, and every
bad file or argument ends in one line naming it (exit 2), never an internal error."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import FAKEBIN, NVMFLAB, REPO, nvmflab

from nvmflab.plan import PerfJob, Point, Subsystem, TargetSetup
from nvmflab.store import FRAME_COLUMNS, ResultsStore

SPEC = """
name = "mix"
repeats = 1
ramp_time = 0
runtime = 0.2
[topology]
target_cores = [0]
host_cores = [1]
[backend]
kind = "ram"
size = "16MiB"
[sweep]
iodepth = [1, 2]
"""


def write(tmp_path: Path, text: str, name: str = "spec.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def one_line_error(done: subprocess.CompletedProcess, *needles: str) -> str:
    """The run ended with exit 2 and one line on stderr holding every needle, no traceback."""
    line = done.stderr.strip()
    assert done.returncode == 2, (done.returncode, done.stdout[-500:], done.stderr)
    assert "\n" not in line and "Traceback" not in line and "internal error" not in line, line
    assert line.startswith("nvmflab: error: "), line
    for needle in needles:
        assert needle in line, (needle, line)
    return line


def stored(results: Path) -> pd.DataFrame:
    with ResultsStore(results) as store:
        return store.points()


# -- 2: reuse only what is the same -----------------------------------------------------------

def test_point_keys_change_with_placement_and_backend_but_not_with_the_results_path(tmp_path):
    (tmp_path / "r" / "work").mkdir(parents=True)
    (tmp_path / "r" / "results.sqlite").write_bytes(b"")

    def point(cores=(0,), cpus=(1,), size=1 << 24, path=str(tmp_path / "r" / "work" / "main.img")) -> Point:
        sub = Subsystem(nqn="nqn.x:main", backend="file", size=size, path=path)
        target = TargetSetup(cores=cores, mode="event", idle_poll_us=0, in_capsule_data_size=8192, so_priority=0,
                             tos=0, busy_poll_us=0, subsystems=(sub,), netns="nvmflab-123")
        job = PerfJob(role="main", knobs={"iodepth": 1}, cpus=cpus, nqn="nqn.x:main")
        return Point(study="s", leg="l", knobs={"iodepth": 1}, repeat=0, jobs=[job], runtime=1, ramp_time=0,
                     target=target)

    base = point().key
    assert point().key == base
    assert point(cores=(2,)).key != base
    assert point(cpus=(3,)).key != base
    assert point(size=1 << 25).key != base
    assert point(path="/srv/other.img").key != base
    # the same file named through another spelling of the results directory keeps its key
    moved = tmp_path / "elsewhere" / "r"
    (moved / "work").mkdir(parents=True)
    (moved / "results.sqlite").write_bytes(b"")
    assert point(path=str(moved / "work" / "main.img")).key == base


@pytest.mark.parametrize("change, differs", [
    (("host_cores = [1]", "host_cores = [0]"), "topology.host_cores was [1], now [0]"),
    (('size = "16MiB"', 'size = "32MiB"'), "backend.size was 16777216, now 33554432"),
])
def test_a_changed_spec_is_refused_then_measured_anew_with_force_mix(tmp_path, fake_env, change, differs):
    env = fake_env | {"FAKE_PERF_SLEEP": "0"}
    results = tmp_path / "r"
    first = write(tmp_path, SPEC, "a.toml")
    assert nvmflab("run", str(first), "--results", str(results), env=env).returncode == 0
    before = stored(results)
    assert len(before) == 2 and set(before["status"]) == {"ok"}
    second = write(tmp_path, SPEC.replace(*change), "b.toml")
    refused = nvmflab("run", str(second), "--results", str(results), env=env)
    one_line_error(refused, str(results), differs, "--results", "--force-mix")
    assert len(stored(results)) == 2  # nothing ran
    mixed = nvmflab("run", str(second), "--results", str(results), "--force-mix", env=env)
    assert mixed.returncode == 0, mixed.stderr
    assert "already stored" not in mixed.stdout  # the old placement's numbers are not reused
    after = stored(results)
    assert len(after) == 4 and set(after["status"]) == {"ok"}
    assert not set(after["point_key"][2:]) & set(before["point_key"])


def test_the_same_spec_resumes_and_more_repeats_are_not_a_different_spec(tmp_path, fake_env):
    env = fake_env | {"FAKE_PERF_SLEEP": "0"}
    results = tmp_path / "r"
    spec = write(tmp_path, SPEC)
    assert nvmflab("run", str(spec), "--results", str(results), env=env).returncode == 0
    again = nvmflab("run", str(spec), "--results", str(results), env=env)
    assert again.returncode == 0 and "2 of 2 point(s) already stored" in again.stdout, again.stdout
    more = write(tmp_path, SPEC.replace("repeats = 1", "repeats = 2"), "more.toml")
    done = nvmflab("run", str(more), "--results", str(results), env=env)
    assert done.returncode == 0, done.stderr
    assert len(stored(results)) == 4


def test_a_changed_stack_version_measures_every_point_again(tmp_path, fake_env):
    bindir = tmp_path / "bin"
    shutil.copytree(FAKEBIN, bindir)
    env = fake_env | {"FAKE_PERF_SLEEP": "0", "NVMFLAB_BIN_DIR": str(bindir)}
    results = tmp_path / "r"
    spec = write(tmp_path, SPEC)
    assert nvmflab("run", str(spec), "--results", str(results), env=env).returncode == 0
    first = stored(results)
    assert all("0.0.0-fake" in json.dumps(json.loads(i)) for i in first["identity_json"])
    perf = bindir / "nvmf-perf"
    perf.write_text(perf.read_text().replace("nvmf-perf 0.0.0-fake", "nvmf-perf 9.9.9-fake"))
    done = nvmflab("run", str(spec), "--results", str(results), env=env)
    assert done.returncode == 0, done.stderr
    assert "already stored" not in done.stdout and "2 ok" in done.stdout
    second = stored(results)
    # replaced, not added beside (the same keys, each once; runs measure in a shuffled order, issue 37)
    assert sorted(second["point_key"]) == sorted(first["point_key"]) and len(set(first["point_key"])) == 2
    assert (second["run_id"] > first["run_id"].max()).all()
    with ResultsStore(results) as store:
        assert store.measurements()["host_stack_version"].str.contains("9.9.9-fake").all()


# -- 3: one run per results directory ---------------------------------------------------------

def test_a_second_run_into_the_same_directory_fails_at_once_and_the_first_keeps_every_point(tmp_path, fake_env):
    results = tmp_path / "r"
    spec = write(tmp_path, SPEC.replace("runtime = 0.2", "runtime = 1").replace("iodepth = [1, 2]",
                                                                                "iodepth = [1, 2, 4]"))
    first = subprocess.Popen(NVMFLAB + ["run", str(spec), "--results", str(results)], env=fake_env, cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lock = results / ResultsStore.LOCKNAME
        deadline = time.monotonic() + 60
        while not (lock.exists() and "pid" in lock.read_text()):
            assert time.monotonic() < deadline and first.poll() is None, "the first run never took the lock"
            time.sleep(0.05)
        # The first run is stopped while the second starts: a second run that waited for the lock
        # would wait forever (the 60 s timeout), however slowly a loaded machine starts it.
        os.kill(first.pid, signal.SIGSTOP)
        try:
            second = nvmflab("run", str(spec), "--results", str(results), env=fake_env, timeout=60)
        finally:
            os.kill(first.pid, signal.SIGCONT)
        one_line_error(second, str(results), "another nvmflab run", f"pid {first.pid}", "--results")
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)
    assert first.returncode == 0, err
    assert "3 ok" in out
    points = stored(results)
    assert len(points) == 3 and points["point_key"].is_unique and set(points["status"]) == {"ok"}
    with ResultsStore(results) as store:
        per_point = store.measurements().groupby("point_id").size()
    assert list(per_point) == [1, 1, 1]  # one row set per planned point
    # the lock is released with the run: the next run goes ahead
    assert nvmflab("run", str(spec), "--results", str(results), env=fake_env).returncode == 0


# -- 4: exit codes and planning refusals ------------------------------------------------------

def test_exit_1_names_the_failed_points_and_2_when_nothing_could_run(tmp_path, fake_env):
    env = fake_env | {"FAKE_PERF_SLEEP": "0", "FAKE_PERF_FAIL_IODEPTH": "1"}
    some = nvmflab("run", str(write(tmp_path, SPEC)), "--results", str(tmp_path / "r1"), env=env)
    assert some.returncode == 1, some.stderr
    assert "1 failed, 1 ok" in some.stdout
    failed_lines = [line for line in some.stdout.splitlines() if line.strip().startswith("failed:")]
    assert len(failed_lines) == 1 and "iodepth=1 " in failed_lines[0] and "exited 1" in failed_lines[0]
    assert some.stdout.strip().splitlines()[-1].endswith("report.html")  # the report is still written
    none = nvmflab("run", str(write(tmp_path, SPEC.replace("[1, 2]", "[1]"), "one.toml")), "--results",
                   str(tmp_path / "r2"), env=env)
    assert none.returncode == 2 and "nothing could run" in none.stdout, none.stdout
    ok = nvmflab("run", str(write(tmp_path, SPEC.replace("[1, 2]", "[2]"), "two.toml")), "--results",
                 str(tmp_path / "r3"), env=env)
    assert ok.returncode == 0 and "failed:" not in ok.stdout and " failed" not in ok.stdout.splitlines()[-2]


@pytest.mark.parametrize("edit, needles", [
    (("host_cores = [1]", "host_cores = [77]"), ["topology.host_cores", "core 77 does not exist"]),
    (('size = "16MiB"', 'size = "99999TiB"'), ["backend.size", "memory available"]),
    (("[sweep]", '[workload]\nbs = "3000"\n[sweep]'), ["workload.bs", "not a multiple of backend.block_size"]),
])
def test_planning_refuses_what_cannot_run_naming_the_field(tmp_path, fake_env, edit, needles):
    spec = write(tmp_path, SPEC.replace(*edit))
    assert SPEC.replace(*edit) != SPEC
    done = nvmflab("run", str(spec), "--results", str(tmp_path / "r"), env=fake_env)
    one_line_error(done, str(spec), *needles)
    assert not (tmp_path / "r" / "results.sqlite").exists() or stored(tmp_path / "r").empty
    assert not list((Path(fake_env["FAKE_PID_DIR"])).iterdir())  # no target was started


@pytest.mark.parametrize("edit, needles", [
    (("target_cores = [0]", "target_cores = [0, 99]"), ["topology.target_cores", "core 99"]),
    (("runtime = 0.2", "runtime = inf"), ["runtime", "finite"]),
    (("runtime = 0.2", "runtime = 0"), ["runtime", "greater than 0"]),
    (("ramp_time = 0", "ramp_time = nan"), ["ramp_time", "finite"]),
    (("ramp_time = 0", "ramp_time = -1"), ["ramp_time"]),
    (("[sweep]", '[workload]\nsize = "1GiB"\n[sweep]'), ["workload.size", "larger than backend.size"]),
    (("[sweep]", '[workload]\nbs = "32MiB"\n[sweep]'), ["workload.bs", "larger than backend.size"]),
    (("iodepth = [1, 2]", 'bs = ["4k", "6000"]'), ["sweep.bs", "6000"]),
    (('size = "16MiB"', 'size = "16MiB"\nblock_size = 4096\n[workload]\nbs = "2k"'),
     ["workload.bs", "backend.block_size (4096)"]),
])
def test_planning_refusals_in_process(tmp_path, fake_env, edit, needles):
    """The same checks without a process each: the session's planning, as `run` calls it."""
    from nvmflab.session import SessionError, run_spec
    from nvmflab.spec import SpecError, load_spec

    spec = write(tmp_path, SPEC.replace(*edit))
    assert SPEC.replace(*edit) != SPEC
    with pytest.raises((SpecError, SessionError)) as raised:
        run_spec(load_spec(spec), spec, "mix", tmp_path / "r", quick=False)
    message = str(raised.value)
    assert "\n" not in message and message.startswith(str(spec)), message
    for needle in needles:
        assert needle in message, (needle, message)
    assert not list((Path(fake_env["FAKE_PID_DIR"])).iterdir())


def test_the_polling_study_refuses_workload_fields_it_would_ignore(tmp_path, fake_env):
    body = 'study = "polling"\nrepeats = 1\n[workload]\nrw = "randwrite"\nbs = "128k"\n'
    done = nvmflab("study", "polling", "--spec", str(write(tmp_path, body)), "--plan", env=fake_env)
    one_line_error(done, "workload.bs", "polling study", "128")
    same = write(tmp_path, 'study = "polling"\n[workload]\nrw = "randread"\nbs = "4k"\n', "same.toml")
    assert nvmflab("study", "polling", "--spec", str(same), "--plan", env=fake_env).returncode == 0


def test_empty_and_binary_specs_are_refused(tmp_path, fake_env):
    empty = write(tmp_path, "# nothing here\n", "empty.toml")
    one_line_error(nvmflab("run", str(empty), "--plan", env=fake_env), str(empty), "empty")
    binary = tmp_path / "binary.toml"
    binary.write_bytes(bytes(range(256)) * 4)
    one_line_error(nvmflab("run", str(binary), "--plan", env=fake_env), str(binary), "not UTF-8")
    one_line_error(nvmflab("run", str(tmp_path), "--plan", env=fake_env), str(tmp_path), "directory")


# -- 1 (a): a stack that cannot do a leg's knob skips those points --------------------------

def test_a_study_skips_the_points_a_stack_cannot_do_and_runs_the_rest(tmp_path, fake_env, monkeypatch):
    from nvmflab import session
    from nvmflab.spec import load_spec
    from nvmflab.stacks import Fixed
    from nvmflab.stacks.ours import OurStack

    class AlwaysPolls(OurStack):  # ours with SPDK's host rule: completions are always polled
        host_knobs = OurStack.host_knobs | {"completion": Fixed("poll", "this host always polls")}

    monkeypatch.setattr(session, "get_stack", lambda name: AlwaysPolls())
    monkeypatch.setenv("FAKE_PERF_SLEEP", "0")
    spec_path = write(tmp_path, 'study = "polling"\nrepeats = 1\nramp_time = 0\nruntime = 0.2\n'
                                '[backend]\nsize = "16MiB"\n[params]\niodepth = [1]\nidle_poll_us = [0]\n'
                                'high_iodepth = 2\nio_queues = []\n')
    spec = load_spec(spec_path, study="polling")
    summary = session.run_spec(spec, spec_path, "polling", tmp_path / "r", quick=False)
    assert summary.code == 0, summary.text
    points = stored(tmp_path / "r")
    knobs = points["knobs_json"].map(json.loads)
    event = points[knobs.map(lambda k: k["completion"] == "event")]
    poll = points[knobs.map(lambda k: k["completion"] == "poll")]
    assert len(event) >= 2 and set(event["status"]) == {"skipped"}
    assert event["error"].str.contains("always polls").all()
    assert len(poll) >= 2 and set(poll["status"]) == {"ok"}
    assert set(points["leg"]) == {"completion", "idle_poll", "matrix"}


def test_readme_spdk_polling_quickstart_plans_its_poll_points(fake_env):
    done = nvmflab("study", "polling", "--quick", "--host-stack", "spdk", "--plan", env=fake_env)
    assert done.returncode == 0, done.stderr
    assert "not run: knob completion = 'event': the spdk host cannot do it" in done.stdout
    assert "spdk_nvme_perf" in done.stdout and "-a 1" in done.stdout  # the 0.5 s ramp warms up 1 s


# -- 6, 7: results commands, exports and reports ----------------------------------------------

def store_with_every_status(results: Path) -> None:
    with ResultsStore(results) as store:
        run = store.start_run("mixed", "", {})
        row = {"role": "main", "iops": 1234.0, "lat_p99_ns": 56000.0}
        for i, (status, error, rows) in enumerate([("ok", None, [row]), ("failed", "nvmf-perf exited 1: boom", []),
                                                   ("invalid", "served 3 of 4 commands", [row]),
                                                   ("skipped", "netns leg skipped: no root", [])]):
            store.save_point(run, f"k{i}", "mixed", "leg", {"rw": "randread", "iodepth": i + 1}, 0, status, error,
                             rows)
        store.finish_run(run)


def test_results_show_list_and_export_handle_every_status(tmp_path, fake_env):
    results = tmp_path / "r"
    store_with_every_status(results)
    shown = nvmflab("results", "show", str(results), env=fake_env)
    assert shown.returncode == 0, shown.stderr
    for text in ("ok", "failed", "invalid", "skipped", "nvmf-perf exited 1: boom", "netns leg skipped", "1,234", "56.0"):
        assert text in shown.stdout, text
    listed = nvmflab("results", "list", str(results), env=fake_env)
    assert listed.returncode == 0 and "mixed" in listed.stdout
    assert [c for c in listed.stdout.splitlines() if "mixed" in c][0].count(" 1 ") >= 4
    done = nvmflab("results", "export", str(results), "--out", str(tmp_path / "m.csv"), env=fake_env)
    assert done.returncode == 0, done.stderr
    frame = pd.read_csv(tmp_path / "m.csv")
    assert sorted(frame["status"]) == ["failed", "invalid", "ok", "skipped"]
    assert frame.set_index("status").loc["failed", "error"] == "nvmf-perf exited 1: boom"
    none = nvmflab("results", "show", str(results), "--study", "other", env=fake_env)  # issue 41: refused
    one_line_error(none, "no study 'other'", "studies stored: mixed")


def test_corrupt_and_foreign_databases_are_named_not_internal_errors(tmp_path, fake_env):
    corrupt, foreign = tmp_path / "corrupt", tmp_path / "foreign"
    corrupt.mkdir()
    (corrupt / "results.sqlite").write_bytes(b"this is not a database" * 100)
    foreign.mkdir()
    with sqlite3.connect(foreign / "results.sqlite") as db:
        db.execute("CREATE TABLE songs (title TEXT)")
    spec = write(tmp_path, SPEC)
    for results in (corrupt, foreign):
        path = str(results / "results.sqlite")
        before = (results / "results.sqlite").read_bytes()
        commands = [["results", "show", str(results)], ["run", str(spec), "--results", str(results)]]
        if results is corrupt:  # every reader once; the foreign database through two of them
            commands += [["results", "list", str(results)], ["report", str(results)],
                         ["results", "export", str(results), "--out", str(tmp_path / "x.csv")],
                         ["study", "overhead", "--quick", "--plan", "--knobs-from", str(results)]]
        for args in commands:
            one_line_error(nvmflab(*args, env=fake_env), path)
        assert (results / "results.sqlite").read_bytes() == before  # never written into


def test_a_missing_knobs_from_directory_is_refused(tmp_path, fake_env):
    missing = tmp_path / "no-such-results"
    done = nvmflab("study", "overhead", "--quick", "--plan", "--knobs-from", str(missing), env=fake_env)
    one_line_error(done, str(missing), "no results.sqlite")


def test_export_writes_the_format_its_name_says_and_never_overwrites_a_foreign_file(tmp_path, fake_env):
    results = tmp_path / "r"
    store_with_every_status(results)
    xlsx = tmp_path / "m.xlsx"
    one_line_error(nvmflab("results", "export", str(results), "--out", str(xlsx), env=fake_env), str(xlsx),
                   ".csv or .parquet")
    assert not xlsx.exists()
    one_line_error(nvmflab("results", "export", str(results), "--out", str(tmp_path / "m.csv"), "--format",
                           "parquet", env=fake_env), "--format parquet")
    parquet = tmp_path / "m.parquet"
    assert nvmflab("results", "export", str(results), "--out", str(parquet), env=fake_env).returncode == 0
    assert list(pd.read_parquet(parquet).columns) == FRAME_COLUMNS
    mine = tmp_path / "notes.csv"
    mine.write_text("my,own,notes\n1,2,3\n")
    one_line_error(nvmflab("results", "export", str(results), "--out", str(mine), env=fake_env), str(mine),
                   "--force")
    assert mine.read_text() == "my,own,notes\n1,2,3\n"
    assert nvmflab("results", "export", str(results), "--out", str(mine), "--force", env=fake_env).returncode == 0
    assert len(pd.read_csv(mine)) == 4
    # an export nvmflab wrote is replaced without --force (re-exporting is the normal case)
    assert nvmflab("results", "export", str(results), "--out", str(mine), env=fake_env).returncode == 0
    assert nvmflab("results", "export", str(results), "--out", str(parquet), env=fake_env).returncode == 0


def test_report_never_overwrites_a_page_it_did_not_write(tmp_path, fake_env):
    results = tmp_path / "r"
    store_with_every_status(results)
    out = tmp_path / "site"
    out.mkdir()
    page = out / "report.html"
    page.write_text("<html>my own page</html>")
    one_line_error(nvmflab("report", str(results), "--out", str(out), env=fake_env), str(page), "--force")
    assert page.read_text() == "<html>my own page</html>"
    done = nvmflab("report", str(results), "--out", str(out), "--force", env=fake_env)
    assert done.returncode == 0, done.stderr
    assert "nvmflab report" in page.read_text()
    assert nvmflab("report", str(results), "--out", str(out), env=fake_env).returncode == 0  # its own page


def test_an_unreachable_host_under_plan_is_named_with_the_inventory(tmp_path, fake_env):
    inventory = write(tmp_path, '[hosts.a]\nssh = "nvmflab@127.0.0.1"\nport = 1\ndata_ip = "127.0.0.1"\n'
                                '[hosts.b]\nssh = "nvmflab@127.0.0.1"\nport = 1\ndata_ip = "127.0.0.1"\n', "lab.toml")
    spec = write(tmp_path, 'name = "x"\n[topology]\nkind = "ssh"\ninventory = "lab.toml"\ntarget = "a"\n'
                           'initiators = ["b"]\n')
    if shutil.which("ssh") is None:
        pytest.skip("no ssh client here")
    done = nvmflab("run", str(spec), "--plan", env=fake_env, timeout=90)
    one_line_error(done, str(inventory), "cannot log in")


# -- 5 (harness side): the stored reason is the program's error, not its last line ---------------

@pytest.mark.parametrize("output, reason", [
    ("memory allocation of 68719476736 bytes failed\n", "memory allocation of 68719476736 bytes failed"),
    ("error: invalid value 'x' for '--cores <LIST>'\n\nFor more information, try '--help'.\n",
     "error: invalid value 'x' for '--cores <LIST>'"),
    ("thread 'main' panicked at src/main.rs:3:5:\nboom\nnote: run with `RUST_BACKTRACE=1` environment variable to "
     "display a backtrace\n", "thread 'main' panicked at src/main.rs:3:5:"),
    ("starting\nlistening\n", "listening"),
    ("", "(no output)"),
])
def test_error_line_picks_the_error_not_the_trailing_hint(output, reason):
    from nvmflab.stacks.base import error_line

    assert error_line(output) == reason


def test_a_target_that_fails_to_start_is_stored_with_its_error(tmp_path, fake_env):
    bindir = tmp_path / "bin"
    shutil.copytree(FAKEBIN, bindir)
    target = bindir / "nvmf-target"
    target.write_text("#!/bin/sh\n[ \"$1\" = --version ] && { echo nvmf-target 0-fake; exit 0; }\n"
                      "echo 'error: --ns ram:64GiB: 64 GiB is more than the 2 GiB of memory' >&2\n"
                      "echo \"For more information, try '--help'.\" >&2\nexit 2\n")
    target.chmod(0o755)
    env = fake_env | {"NVMFLAB_BIN_DIR": str(bindir), "FAKE_PERF_SLEEP": "0"}
    done = nvmflab("run", str(write(tmp_path, SPEC.replace("[1, 2]", "[1]"))), "--results", str(tmp_path / "r"),
                   env=env)
    assert done.returncode == 2, done.stderr  # its only point failed: nothing could run
    points = stored(tmp_path / "r")
    assert list(points["status"]) == ["failed"]
    assert "error: --ns ram:64GiB: 64 GiB is more than the 2 GiB of memory" in points["error"][0]
    assert "For more information" not in points["error"][0]
