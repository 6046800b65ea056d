"""CLI: one-line errors, results list/show/export, env, studies end to end on the fakes."""

import os
import re

import pandas as pd
import pytest
from conftest import FAKEPATH, nvmflab

from nvmflab.store import ResultsStore


def test_bad_spec_is_one_line_and_nonzero(tmp_path, fake_env):
    spec = tmp_path / "bad.toml"
    spec.write_text("[knobs]\ncompletion = \"sometimes\"\n")
    done = nvmflab("run", str(spec), env=fake_env)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    line = done.stderr.strip()
    assert "\n" not in line and f"{spec}:2: knobs.completion:" in line and "'poll' or 'event'" in line


def test_unknown_study_and_missing_results_are_refused(tmp_path, fake_env):
    done = nvmflab("study", "nonsense", env=fake_env)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    done = nvmflab("results", "list", str(tmp_path), env=fake_env)
    assert done.returncode == 2 and "no results.sqlite" in done.stderr


def test_results_list_show_and_export(tmp_path, fake_env, tiny_spec):
    results = tmp_path / "r"
    assert nvmflab("run", str(tiny_spec), "--results", str(results), env=fake_env).returncode == 0
    listed = nvmflab("results", "list", str(results), env=fake_env)
    assert listed.returncode == 0 and "tiny" in listed.stdout
    shown = nvmflab("results", "show", str(results), env=fake_env)
    assert shown.returncode == 0 and "randread" in shown.stdout
    for name in ("m.csv", "m.parquet"):
        done = nvmflab("results", "export", str(results), "--out", str(tmp_path / name), env=fake_env)
        assert done.returncode == 0, done.stderr
    csv = pd.read_csv(tmp_path / "m.csv")
    parquet = pd.read_parquet(tmp_path / "m.parquet")
    assert len(csv) == len(parquet) == 8
    assert list(parquet["iops"]) == list(ResultsStore(results).measurements()["iops"])


def test_export_into_a_directory_and_unwritable_places_are_clear_errors(tmp_path, fake_env, tiny_spec):
    results = tmp_path / "r"
    assert nvmflab("run", str(tiny_spec), "--results", str(results), env=fake_env).returncode == 0
    (tmp_path / "out").mkdir()
    done = nvmflab("results", "export", str(results), "--out", str(tmp_path / "out"), env=fake_env)
    assert done.returncode == 0, done.stderr
    assert len(pd.read_csv(tmp_path / "out" / "measurements.csv")) == 8
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for args in (["results", "export", str(results), "--out", str(blocker / "m.csv")],
                 ["report", str(results), "--out", str(blocker / "report")],
                 ["run", str(tiny_spec), "--results", str(blocker / "r")]):
        done = nvmflab(*args, env=fake_env)
        assert done.returncode == 2 and "internal error" not in done.stderr, done.stderr
        assert done.stderr.startswith(f"nvmflab: error: {blocker}/") and f"'{blocker}" in done.stderr


def test_an_interrupted_run_lists_and_reports_as_not_finished(tmp_path, fake_env):
    with ResultsStore(tmp_path / "r") as store:
        store.finish_run(store.start_run("tiny", "", {}))
        store.start_run("tiny", "", {})  # interrupted: finished_at stays NULL
    listed = nvmflab("results", "list", str(tmp_path / "r"), env=fake_env)
    assert listed.returncode == 0, listed.stderr
    assert "(interrupted)" in listed.stdout
    reported = nvmflab("report", str(tmp_path / "r"), env=fake_env)
    assert reported.returncode == 0, reported.stderr
    html = (tmp_path / "r" / "report" / "report.html").read_text()
    assert "finished not finished (interrupted or running)" in html and "finished nan" not in html


def test_env_lists_cores_and_tools(fake_env):
    done = nvmflab("env", env=fake_env)
    assert done.returncode == 0
    for item in ("cpu model", "cores", "kernel", "nvmf-target", "nvmf-perf", "fio", "iperf3"):
        assert item in done.stdout


# The legs `make run` (study all --quick) must run, as (study, leg).
QUICK_LEGS = {("polling", "completion"), ("polling", "idle_poll"), ("polling", "matrix"), ("overhead", "local"),
              ("overhead", "loopback"), ("overhead", "netns"), ("saturation", "initiator"), ("saturation", "target"),
              ("interference", "calibrate_initiator"), ("interference", "initiator"),
              ("interference", "target"), ("contention", "isolated"), ("contention", "same_core"),
              ("contention", "lapps_flows")}


def test_quick_studies_plan_every_leg_three_times(tmp_path, fake_env):
    """`make run`'s command planned, in seconds: every leg of every quick study, three interleaved
    repeats (issue 22 item 12), nothing stored. Running it all is test_quick_studies_run_every_leg
    (`make test-long`: a minute and a half of CPU on the fakes)."""
    no_spdk = tmp_path / "no-spdk"
    no_spdk.mkdir()
    env = fake_env | {"NVMFLAB_SPDK_DIR": str(no_spdk), "PATH": f"{FAKEPATH}{os.pathsep}{os.environ['PATH']}"}
    results = tmp_path / "r"
    done = nvmflab("study", "all", "--quick", "--plan", "--results", str(results), env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    planned = re.findall(r"^# ([\w-]+): [^\n]*? · (\w+) · repeat (\d+) ·", done.stdout, re.M)
    assert QUICK_LEGS <= {(study, leg) for study, leg, _ in planned}
    assert {int(r) for _, _, r in planned} == {0, 1, 2}
    assert not (results / "results.sqlite").exists()


@pytest.mark.long
def test_quick_studies_run_every_leg(tmp_path, fake_env):
    # No SPDK build: a real spdk_nvme_perf cannot talk to the fake target, and its failed points
    # would (rightly) make the run exit 1. The stacks study skips SPDK's pairs with the reason.
    no_spdk = tmp_path / "no-spdk"
    no_spdk.mkdir()
    # The contention study's flows come from a fake iperf3 too: real ones would run for seconds
    # beside each point (they are tested with real iperf3 in test_contention_layout.py).
    env = fake_env | {"FAKE_PERF_SLEEP": "0", "NVMFLAB_SPDK_DIR": str(no_spdk),
                      "PATH": f"{FAKEPATH}{os.pathsep}{os.environ['PATH']}"}
    results = tmp_path / "r"
    # three repeats per quick comparison: about a minute and a half on a busy 2-core machine
    done = nvmflab("study", "all", "--quick", "--results", str(results), env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1].endswith("report.html")
    frame = ResultsStore(results).measurements()
    legs = {(s, leg) for s, leg in zip(frame["study"], frame["leg"])}
    assert QUICK_LEGS <= legs
    flows = frame[(frame["study"] == "contention") & (frame["engine"] == "iperf3")]
    assert len(flows) > 0 and (flows["bw_bytes"] > 0).all()
    inter = frame[(frame["study"] == "interference") & frame["bg_load_pct"].notna()]
    assert set(inter["role"]) == {"fg", "bg"} and inter["invariant_ok"].all()
    capped = inter[(inter["role"] == "bg") & (inter["bg_load_pct"] == 50)]
    assert (capped["rate_iops"] > 0).all()
    assert set(frame[frame["study"] == "overhead"]["engine"].dropna()) == {"local", "tcp"}
    # three interleaved repeats of every quick comparison (issue 22 item 12)
    assert set(frame["repeat"]) == {0, 1, 2}
    html = (results / "report" / "report.html").read_text()
    assert 'data-figure="interference_throughput_vs_load"' in html
    assert html.index('<section id="summary">') < html.index('<section id="polling">')


def test_help_keeps_the_spec_table_names(fake_env):
    # The console reads "[quick]" as markup and would drop it from the help text.
    done = nvmflab("study", "--help", env=fake_env | {"COLUMNS": "200"})
    assert done.returncode == 0
    assert "the spec's [quick] overrides" in done.stdout and "the spec's [stack]" in done.stdout
