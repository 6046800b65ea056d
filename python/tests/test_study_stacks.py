"""`study stacks`: pairs planned interleaved, unavailable pairs skipped with the reason, and the
analysis's ratios to the baseline pair computed from the means its tests compare."""

from conftest import nvmflab

from nvmflab.analysis import stacks
from nvmflab.store import ResultsStore

SPEC = """
study = "stacks"
repeats = 2
ramp_time = 0
runtime = 1
[params]
targets = ["ours", "kernel"]
hosts = ["ours"]
baseline = "kernel/ours"
iodepth = [1, 4]
bapp_bs = "128k"
bapp_iodepth = 4
"""


def test_available_pairs_run_interleaved_and_the_others_are_skipped_with_the_reason(tmp_path, fake_env, monkeypatch):
    from nvmflab.stacks.kernel import KernelStack

    spec = tmp_path / "stacks.toml"
    spec.write_text(SPEC)
    plan = nvmflab("study", "stacks", "--spec", str(spec), "--plan", env=fake_env)
    assert plan.returncode == 0, plan.stderr
    headers = [line for line in plan.stdout.splitlines() if line.startswith("#")]
    # 2 rounds x 2 pairs x (L-app + 2 T-app + B-app), round 0 of every pair before round 1
    assert len(headers) == 16
    assert [("repeat 0" in h) for h in headers] == [True] * 8 + [False] * 8
    assert sum("kernel/ours" in h for h in headers[:8]) == 4

    results = tmp_path / "r"
    done = nvmflab("study", "stacks", "--spec", str(spec), "--results", str(results), env=fake_env)
    assert done.returncode == 0, done.stderr
    frame = ResultsStore(results).measurements()
    ours = frame[frame["leg"] == "ours/ours"]
    kernel = frame[frame["leg"] == "kernel/ours"]
    assert len(ours) == 8 and set(ours["status"]) == {"ok"}
    assert set(kernel["target_stack"]) == {"kernel"} and set(ours["host_stack"]) == {"ours"}
    if KernelStack().unavailable(__import__("nvmflab.topology.local", fromlist=["LocalHost"]).LocalHost(),
                                 "target"):
        assert set(kernel["status"]) == {"skipped"} and kernel["error"].str.contains("nvmet").all()
        html = (results / "report" / "report.html").read_text()
        assert "kernel target × ours host: skipped" in html
        # the baseline pair did not run: ratios fall back to ours/ours, and the report says so
        assert "has no usable measurements here, so the ratios are taken against ours target × ours host" in html


def _store(tmp_path, values):
    """A stacks run with given IOPS per (pair, iodepth) and repeat, the baseline ours/ours."""
    store = ResultsStore(tmp_path / "r")
    run = store.start_run("stacks", 'study = "stacks"\n[params]\nbaseline = "spdk/spdk"\n', {})
    for (leg, app, qd, bs), per_repeat in values.items():
        target, host = leg.split("/")
        for repeat, iops in enumerate(per_repeat):
            knobs = {"app": app, "rw": "randread", "bs": bs, "iodepth": qd, "numjobs": 1,
                     "target_stack": target, "host_stack": host}
            store.save_point(run, f"{leg}-{app}-{qd}-{repeat}", "stacks", leg, knobs, repeat, "ok", None,
                             [{"role": "main", "iops": iops, "bw_bytes": iops * bs, "lat_mean_ns": 1e9 / iops,
                               "lat_p99_ns": 2e9 / iops, "knobs": knobs}])
    return store


def test_ratios_are_of_means_against_the_baseline_pair(tmp_path):
    values = {
        ("spdk/spdk", "L-app", 1, 4096): [50_000, 50_000, 50_000],
        ("spdk/spdk", "T-app", 32, 4096): [99_000, 100_000, 101_000],
        ("spdk/spdk", "B-app", 32, 131072): [10_000, 10_000, 10_000],
        ("ours/spdk", "L-app", 1, 4096): [40_000, 40_000, 40_000],
        ("ours/spdk", "T-app", 32, 4096): [110_000, 109_000, 111_000],
        ("ours/spdk", "B-app", 32, 131072): [15_000, 15_000, 15_000],
        ("ours/ours", "L-app", 1, 4096): [50_000, 50_000, 50_000],
        # one wild repeat: the mean ratio follows it, and the interval says there is no clear difference
        ("ours/ours", "T-app", 32, 4096): [100_000, 104_000, 900_000],
        ("ours/ours", "B-app", 32, 131072): [10_000, 10_000, 10_000],
    }
    store = _store(tmp_path, values)
    result = stacks.analyze(store.measurements(), store.runs())
    assert any(f.startswith("ours target × spdk host: 1.10× the IOPS of spdk target × spdk host at QD32 "
                            "(110.0 KIOPS vs 100.0 KIOPS; ratio of means 1.10× (Fieller's 95 % interval 1.08× to "
                            "1.12×); 95 % interval of the difference +7.7 to +12.3 KIOPS)")
               for f in result.findings), result.findings
    assert any(f.startswith("ours target × ours host: No clear difference in IOPS from spdk target × spdk "
                            "host at QD32") for f in result.findings), result.findings
    side = next(t.frame for t in result.tables if t.title == "Pairs side by side").set_index("target × host")
    assert side.at["ours target × spdk host", "QD32 IOPS ÷ baseline"] == 1.1
    assert side.at["ours target × ours host", "QD32 IOPS ÷ baseline"] == 3.68  # the mean, as the test uses
    assert side.at["ours target × spdk host", "B-app ÷ baseline"] == 1.5
    assert side.at["ours target × spdk host", "L-app latency ÷ baseline"] == 1.25
    matrix = next(t.frame for t in result.tables if t.title.startswith("IOPS at QD32"))
    assert matrix.set_index("target \\ host")["spdk host"].to_dict() == {"ours": 1.1, "spdk": 1.0}
    assert any(f.startswith("With the spdk host, the ours target gives 1.10× the QD32 IOPS of the spdk target")
               for f in result.findings), result.findings
    assert any(f.startswith("With the ours target, no clear difference between the ours and spdk hosts")
               for f in result.findings), result.findings
    # identical repeats are no interval, not certainty: the stacks study cannot decide on them
    values[("spdk/spdk", "T-app", 32, 4096)] = [100_000, 100_000, 100_000]
    values[("ours/spdk", "T-app", 32, 4096)] = [110_000, 110_000, 110_000]
    flat = stacks.analyze(*(lambda s: (s.measurements(), s.runs()))(_store(tmp_path / "flat", values))).findings
    assert any(f.startswith("With the spdk host, cannot decide whether the ours or the spdk target limits")
               and "repeats without spread" in f for f in flat), flat


def test_pairs_poll_on_both_sides_by_default_and_the_spec_modes_on_request(tmp_path, fake_env):
    spec = tmp_path / "stacks.toml"
    spec.write_text(SPEC.replace("iodepth = [1, 4]", "iodepth = [4]").replace("repeats = 2", "repeats = 1"))
    plan = nvmflab("study", "stacks", "--spec", str(spec), "--plan", env=fake_env)
    assert plan.returncode == 0, plan.stderr
    perf = [line for line in plan.stdout.splitlines() if "nvmf-perf run" in line]
    assert perf and all("--completion poll" in line for line in perf)
    assert 'mode = "poll"' in plan.stdout and 'mode = "event"' not in plan.stdout  # ours target polls
    spec.write_text(spec.read_text() + 'modes = "spec"\n')
    plan = nvmflab("study", "stacks", "--spec", str(spec), "--plan", env=fake_env)
    perf = [line for line in plan.stdout.splitlines() if "nvmf-perf run" in line]
    assert perf and all("--completion event" in line for line in perf)


def test_which_side_limits_names_the_modes_and_flags_unlike_ones(tmp_path):
    values = {
        ("ours/spdk", "T-app", 32, 4096): [150_000, 151_000, 149_000],
        ("kernel/spdk", "T-app", 32, 4096): [100_000, 101_000, 99_000],
        ("spdk/spdk", "T-app", 32, 4096): [120_000, 121_000, 119_000],
    }
    modes = {"ours": "poll", "kernel": "event", "spdk": "poll"}
    store = ResultsStore(tmp_path / "r")
    run = store.start_run("stacks", 'study = "stacks"\n[params]\nbaseline = "spdk/spdk"\n', {})
    for (leg, app, qd, bs), per_repeat in values.items():
        target, host = leg.split("/")
        for repeat, iops in enumerate(per_repeat):
            knobs = {"app": app, "rw": "randread", "bs": bs, "iodepth": qd, "numjobs": 1, "target_stack": target,
                     "host_stack": host, "completion": "poll", "target_mode": modes[target]}
            store.save_point(run, f"{leg}-{repeat}", "stacks", leg, knobs, repeat, "ok", None,
                             [{"role": "main", "iops": iops, "bw_bytes": iops * bs, "lat_mean_ns": 1e9 / iops,
                               "lat_p99_ns": 2e9 / iops, "knobs": knobs}])
    result = stacks.analyze(store.measurements(), store.runs())
    side = next(t.frame for t in result.tables if t.title == "Pairs side by side").set_index("target × host")
    assert side.at["kernel target × spdk host", "modes"] == "target reactor event, host completion poll"
    limit = next(f for f in result.findings if f.startswith("With the spdk host, the ours target gives"))
    assert "of the kernel target" in limit
    assert ("Modes: the spdk host completion poll; the ours target reactor poll, the kernel target reactor event: "
            "different reactor modes, so this compares the modes as much as the targets.") in limit
    against = next(f for f in result.findings if f.startswith("kernel target × spdk host:"))
    assert "different modes" in against
    assert not any("different modes" in f for f in result.findings if f.startswith("ours target × spdk host:"))
