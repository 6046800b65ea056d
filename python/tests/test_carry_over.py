"""The polling study's choice carried over to the other studies (`--knobs-from`, `study all`)."""

from conftest import nvmflab

POLLING = """
study = "polling"
repeats = 2
ramp_time = 0
runtime = 0.2
[workload]
rw = "randread"
[params]
iodepth = [1, 4]
idle_poll_us = [0, 20]
high_iodepth = 4
io_queues = []
"""


def test_knobs_from_applies_the_decided_polling_choice_to_a_later_study(tmp_path, fake_env):
    spec = tmp_path / "polling.toml"
    spec.write_text(POLLING)
    results = tmp_path / "r"
    # the fake load generator doubles IOPS under poll and leaves p99 and idle polling without effect;
    # its repeats spread by ±1 % (identical repeats would be no interval, so nothing decided)
    done = nvmflab("study", "polling", "--spec", str(spec), "--results", str(results),
                   env=fake_env | {"FAKE_PERF_JITTER": "0.01"})
    assert done.returncode == 0, done.stderr
    plan = nvmflab("study", "overhead", "--quick", "--knobs-from", str(results), "--plan", env=fake_env)
    assert plan.returncode == 0, plan.stderr
    assert f"overhead: knobs from the polling study in {results}: completion = poll" in plan.stdout
    tcp_lines = [line for line in plan.stdout.splitlines() if "nvmf-perf run -t tcp" in line]
    assert tcp_lines and all("--completion poll" in line for line in tcp_lines)
    # idle polling made no clear difference: nothing about it is carried over
    assert "idle_poll_us" not in plan.stdout.split("knobs from the polling study")[1].splitlines()[0]


def test_knobs_from_a_directory_without_a_polling_study_changes_nothing(tmp_path, fake_env):
    from nvmflab.store import ResultsStore

    with ResultsStore(tmp_path / "none") as store:  # results, but of another study
        store.finish_run(store.start_run("overhead", "", {}))
    plan = nvmflab("study", "overhead", "--quick", "--knobs-from", str(tmp_path / "none"), "--plan", env=fake_env)
    assert plan.returncode == 0, plan.stderr
    assert "knobs from the polling study" in plan.stdout and "completion = poll" not in plan.stdout
    assert all("--completion event" in line for line in plan.stdout.splitlines() if "nvmf-perf run -t tcp" in line)
