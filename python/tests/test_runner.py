"""Runner behaviour against the fake binaries: storing, resuming, failing points, cleanup."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import NVMFLAB, REPO, alive, nvmflab

from nvmflab.store import ResultsStore


def perf_runs(tmp_path) -> int:
    log = tmp_path / "perf.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_sweep_stores_every_point_and_prints_report_last(tmp_path, fake_env, tiny_spec):
    done = nvmflab("run", str(tiny_spec), "--results", str(tmp_path / "r"), env=fake_env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1].endswith("report.html")
    frame = ResultsStore(tmp_path / "r").measurements()
    assert len(frame) == 8 and set(frame["status"]) == {"ok"}
    assert sorted(set(zip(frame["iodepth"], frame["completion"]))) == [(1, "event"), (1, "poll"), (4, "event"), (4, "poll")]
    # the fake load generator's numbers arrive unchanged: 10 K IOPS per outstanding I/O, halved in
    # event mode (tests/fakebin/nvmf-perf); p99 comes from its histogram, where 99 % of the I/Os
    # are at or below 30 µs (its JSON percentile, 50 µs, is not what the harness stores)
    expected = [10_000.0 * min(qd, 32) / (2 if mode == "event" else 1)
                for qd, mode in zip(frame["iodepth"], frame["completion"])]
    assert frame["iops"].tolist() == pytest.approx(expected)
    assert (frame["lat_p99_ns"] == 30_000).all()
    # target CPU is the idle fake target's delta over one 0.2 s point: known and far below a second
    # (a cumulative count would carry its start-up; a missing one is NaN)
    target_cpu = frame["target_usr_s"] + frame["target_sys_s"]
    assert target_cpu.notna().all() and target_cpu.between(0, 0.5).all(), target_cpu.tolist()
    # pinned: nvmf-perf got the host core from the spec's topology, mapped onto this machine
    assert "--cpus_allowed" in (tmp_path / "perf.log").read_text()
    # the report analyses the sweep: every point's metrics, IOPS and p99 against the swept knob
    html = (tmp_path / "r" / "report" / "report.html").read_text()
    assert "<h3>Every point</h3>" in html and "p99 (µs)" in html and "host CPU (%)" in html
    # the fake's repeats are identical (no spread, no interval): no test could run, and the sentence says
    # so instead of implying Welch found nothing; the largest mean is named but not picked
    assert ("4 points over iodepth, completion: cannot decide the highest throughput among the 4 (the best mean, "
            "40.0 KIOPS at iodepth = 4, completion = poll; no interval: fewer than two repeats, or repeats "
            "without spread)") in html
    assert html.count('src="data:image/png;base64,') == 2
    assert {p.name for p in (tmp_path / "r" / "report" / "figures").iterdir()} == {
        "tiny_iops_vs_iodepth.png", "tiny_p99_vs_iodepth.png"}


def test_rerun_skips_stored_points(tmp_path, fake_env, tiny_spec):
    results = str(tmp_path / "r")
    assert nvmflab("run", str(tiny_spec), "--results", results, env=fake_env).returncode == 0
    assert perf_runs(tmp_path) == 8
    again = nvmflab("run", str(tiny_spec), "--results", results, env=fake_env)
    assert again.returncode == 0 and perf_runs(tmp_path) == 8
    assert len(ResultsStore(results).runs()) == 2 and len(ResultsStore(results).points()) == 8


def test_changing_runtime_or_ramp_time_measures_again(tmp_path, fake_env):
    spec = tmp_path / "one.toml"
    for runtime, ramp_time, runs in ((0.2, 0, 1), (0.2, 0, 1), (0.3, 0, 2), (0.3, 0.1, 3)):
        spec.write_text(f"repeats = 1\nruntime = {runtime}\nramp_time = {ramp_time}\n")
        # another duration is another spec: stored beside the first only when asked (--force-mix)
        assert nvmflab("run", str(spec), "--results", str(tmp_path / "r"), "--force-mix", env=fake_env).returncode == 0
        assert perf_runs(tmp_path) == runs


def test_failing_point_is_recorded_and_the_sweep_goes_on(tmp_path, fake_env, tiny_spec):
    env = fake_env | {"FAKE_PERF_FAIL_IODEPTH": "4"}
    done = nvmflab("run", str(tiny_spec), "--results", str(tmp_path / "r"), env=env)
    assert done.returncode == 1, done.stderr  # some point failed
    points = ResultsStore(tmp_path / "r").points()
    failed = points[points["status"] == "failed"]
    assert len(failed) == 4 and len(points) == 8
    assert failed["error"].str.contains("exited 1: nvmf-perf: connect failed").all()
    # the failed ones are retried by the next run, the good ones are not
    del env["FAKE_PERF_FAIL_IODEPTH"]
    assert nvmflab("run", str(tiny_spec), "--results", str(tmp_path / "r"), env=env).returncode == 0
    assert perf_runs(tmp_path) == 12
    assert set(ResultsStore(tmp_path / "r").points()["status"]) == {"ok"}


@pytest.mark.parametrize("fault, error", [
    ({"FAKE_PERF_MALFORMED_IODEPTH": "4"}, "KeyError: 'clat_ns'"),
    ({"FAKE_STATS_BODY": "<html>not the stats</html>"}, "JSONDecodeError"),
])
def test_malformed_reports_fail_their_points_only(tmp_path, fake_env, tiny_spec, fault, error):
    done = nvmflab("run", str(tiny_spec), "--results", str(tmp_path / "r"), env=fake_env | fault)
    assert done.returncode == (1 if "FAKE_PERF_MALFORMED_IODEPTH" in fault else 2), done.stderr  # some / all failed
    points = ResultsStore(tmp_path / "r").points()
    failed = points[points["status"] == "failed"]
    assert len(points) == 8 and len(failed) == (4 if "FAKE_PERF_MALFORMED_IODEPTH" in fault else 8)
    assert failed["error"].str.startswith(error).all(), failed["error"].tolist()


def default_sigint() -> None:
    # Started as `nohup pytest &`, this process ignores SIGINT and a child would inherit that:
    # the harness under test must see Ctrl-C as a user's shell delivers it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def kill_all(proc: subprocess.Popen, pids_dir) -> None:
    """What the test started, gone even when it failed: the harness and every fake it spawned."""
    if proc.poll() is None:
        proc.kill()
        proc.communicate(timeout=10)
    for path in pids_dir.iterdir():
        try:
            os.kill(int(path.name.split("-")[1]), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_killed_runner_leaves_no_child(tmp_path, fake_env, tiny_spec, sig):
    env = fake_env | {"FAKE_PERF_SLEEP": "60"}
    proc = subprocess.Popen(NVMFLAB + ["run", str(tiny_spec), "--results", str(tmp_path / "r")], env=env,
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)
    pids_dir = tmp_path / "pids"
    try:
        deadline = time.monotonic() + 30
        while not any(p.name.startswith("perf-") for p in pids_dir.iterdir()):
            assert time.monotonic() < deadline, "nvmf-perf never started"
            time.sleep(0.05)
        children = [int(p.name.split("-")[1]) for p in pids_dir.iterdir()]
        assert all(alive(pid) for pid in children)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=30)
        assert proc.returncode != 0
        if sig != signal.SIGKILL:
            assert "Traceback" not in stderr and "re-run the same command to resume" in stderr
        deadline = time.monotonic() + 10
        while (any(alive(pid) for pid in children) or _mentioning(tmp_path)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in children if alive(pid)]
        # the children that are not fakes too: `perf stat` counting the point's cores, where perf exists
        assert not _mentioning(tmp_path), _mentioning(tmp_path)
    finally:
        kill_all(proc, pids_dir)


def _mentioning(folder) -> list[str]:
    """Command lines of live processes that name a path in `folder`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not alive(int(entry.name)):
            continue
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(folder) in argv:
            found.append(argv)
    return found


def test_missing_binaries_stop_before_anything_runs(tmp_path, fake_env, tiny_spec, monkeypatch):
    from nvmflab import tools
    from nvmflab.session import SessionError, run_spec
    from nvmflab.spec import load_spec

    monkeypatch.setenv("NVMFLAB_BIN_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setattr(tools, "REPO_ROOT", tmp_path)
    with pytest.raises(SessionError, match="nvmf-target not found"):
        run_spec(load_spec(tiny_spec), tiny_spec, "tiny", tmp_path / "r", quick=False)
    assert not (tmp_path / "r").exists()
