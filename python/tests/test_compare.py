"""nvmflab compare (issue 24 item 1): matching, verdicts with Welch + Holm, the gate, unmatched
points, environment side by side, HTML/JSON/text output and the CLI's exit codes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from synth_results import repeats, write_results

from nvmflab import compare as cmp
from nvmflab.analysis import decide

NVMFLAB = str(Path(sys.executable).parent / "nvmflab")
BASE = [100e3, 102e3, 98e3]
STEADY = [1.0, 1.02, 0.98]


def run_cli(*args, timeout=300):
    return subprocess.run([NVMFLAB, "compare", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "MPLBACKEND": "Agg"})


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """before: iodepth 1, 8, 32; after: iodepth 1 the same, 8 clearly slower (−30 % IOPS, +40 %
    latency), 32 absent, iodepth 64 new, and one point with another host stack."""
    before = write_results(tmp_path_factory.mktemp("before"), [
        {"knobs": {"iodepth": 1}, "repeats": repeats(BASE, 50, STEADY)},
        {"knobs": {"iodepth": 8}, "repeats": repeats(BASE, 80, STEADY)},
        {"knobs": {"iodepth": 32}, "repeats": repeats(BASE, 90, STEADY)},
        {"knobs": {"iodepth": 16}, "repeats": repeats(BASE, 85, STEADY)},
    ])
    after = write_results(tmp_path_factory.mktemp("after"), [
        {"knobs": {"iodepth": 1}, "repeats": repeats([101e3, 99e3, 100.5e3], 50, [1.01, 0.99, 1.0])},
        {"knobs": {"iodepth": 8}, "repeats": repeats([70e3, 71e3, 69e3], 112, STEADY)},
        {"knobs": {"iodepth": 64}, "repeats": repeats(BASE, 95, STEADY)},
        {"knobs": {"iodepth": 1, "host_stack": "kernel"}, "repeats": repeats(BASE, 60, STEADY)},
        {"knobs": {"iodepth": 16}, "repeats": [None, None]},
    ], env={"kernel": "6.12.0"}, stack_version="nvmf-target 0.2.0")
    return before, after


def by(c, iodepth, kind):
    return next(m for m in c.metrics if m.knobs["iodepth"] == iodepth and m.kind == kind)


def test_verdicts_follow_the_decision_functions(pair):
    c = cmp.compare(cmp.load_side(pair[0]), cmp.load_side(pair[1]))
    assert {m.knobs["iodepth"] for m in c.metrics} == {1, 8}
    for kind in ("iops", "bw", "mean", "p99"):
        assert by(c, 8, kind).verdict == "slower", kind
        assert by(c, 1, kind).verdict == "no clear difference", kind
    # Latency up is slower; IOPS down is slower: the signs of the differences say which.
    assert by(c, 8, "iops").difference < 0 < by(c, 8, "mean").difference
    assert by(c, 8, "iops").change_pct == pytest.approx(-30.0, abs=0.5)
    # The numbers are decide.welch's, Holm over the whole family.
    m = by(c, 8, "iops")
    diff, half, p, _ = decide.welch(np.asarray(m.before), np.asarray(m.after))
    diff, half, p = (float(np.ravel(v)[0]) for v in (diff, half, p))
    assert m.difference == pytest.approx(diff) and m.p == pytest.approx(p)
    assert m.low == pytest.approx(diff - half)
    assert all(x.holm_family == len(c.metrics) for x in c.metrics)
    kept = decide.holm(np.array([x.p for x in c.metrics]))
    assert [x.holm_kept for x in c.metrics] == list(kept)


def test_unmatched_and_unusable_points_are_listed(pair):
    c = cmp.compare(cmp.load_side(pair[0]), cmp.load_side(pair[1]))
    only_b = {(p["knobs"]["iodepth"], p["knobs"]["host_stack"]) for p in c.only_before}
    only_a = {(p["knobs"]["iodepth"], p["knobs"]["host_stack"]) for p in c.only_after}
    assert only_b == {(32, "ours")}
    assert only_a == {(64, "ours"), (1, "kernel")}  # another stack is another point
    assert [(p["knobs"]["iodepth"], p["unusable_on"]) for p in c.not_usable] == [(16, "after")]
    assert c.not_usable[0]["error"] == "perf exited 1"
    text = cmp.text_summary(c)
    assert "only in before" in text and "only in after" in text and "not usable" in text


def test_environment_side_by_side_marks_what_changed(pair):
    c = cmp.compare(cmp.load_side(pair[0]), cmp.load_side(pair[1]))
    env = {e["what"]: e for e in c.environment}
    assert env["kernel"]["before"] == "6.1.0" and env["kernel"]["after"] == "6.12.0" and env["kernel"]["changed"]
    assert env["target stack"]["changed"] and not env["cpu_model"]["changed"]
    assert not env["host stack"]["changed"]


def test_gate_trips_only_on_clear_slowdowns_larger_than_pct(pair):
    b, a = cmp.load_side(pair[0]), cmp.load_side(pair[1])
    assert cmp.compare(b, a, cmp.parse_gate(["5"])).gate_failures
    assert not cmp.compare(b, a, cmp.parse_gate(["50"])).gate_failures  # −30 %/+40 % are within 50 %
    only_p99 = cmp.compare(b, a, cmp.parse_gate(["p99=35", "iops=50"]))
    assert {m.kind for m in only_p99.gate_failures} == {"p99"}
    # The reverse direction is faster everywhere it is clear: nothing trips.
    reverse = cmp.compare(a, b, cmp.parse_gate(["0"]))
    assert not reverse.gate_failures and by(reverse, 8, "iops").verdict == "faster"


def test_parse_gate_refuses_bad_values():
    assert cmp.parse_gate(["5", "p99=10"]) == {"iops": 5, "bw": 5, "mean": 5, "p99": 10}
    assert cmp.parse_gate(["bandwidth=3,lat_p99=4"]) == {"bw": 3, "p99": 4}
    for bad in ("x", "iops=-1", "tail=5", "nan"):
        with pytest.raises(cmp.CompareError):
            cmp.parse_gate([bad])


def test_single_repeats_cannot_decide_and_never_trip_the_gate(tmp_path):
    b = write_results(tmp_path / "b", [{"knobs": {"iodepth": 1}, "repeats": repeats([100e3])}])
    a = write_results(tmp_path / "a", [{"knobs": {"iodepth": 1}, "repeats": repeats([10e3], 500)}])
    c = cmp.compare(cmp.load_side(b), cmp.load_side(a), cmp.parse_gate(["1"]))
    assert {m.verdict for m in c.metrics} == {"cannot decide"}
    assert not c.gate_failures


def test_holm_keeps_a_lone_borderline_difference_from_being_called(tmp_path):
    # One point differs by p ≈ 0.04 on its own; among many comparisons Holm does not keep it.
    near = [{"knobs": {"iodepth": d}, "repeats": repeats([100e3 + i * 1e3 for i in (0, 1, -1)], 50, STEADY)}
            for d in (1, 2, 4, 8)]
    shifted = [dict(p) for p in near]
    shifted[0] = {"knobs": {"iodepth": 1}, "repeats": repeats([102.5e3, 103.5e3, 101.5e3], 50, STEADY)}
    c = cmp.compare(cmp.load_side(write_results(tmp_path / "b", near)),
                    cmp.load_side(write_results(tmp_path / "a", shifted)))
    m = by(c, 1, "iops")
    assert m.p < 0.05 and m.low > 0  # clear on its own
    assert m.verdict == "no clear difference" and "Holm" in m.reason


def test_study_selection_and_bad_input(pair, tmp_path):
    with pytest.raises(cmp.CompareError, match="no study"):
        cmp.load_side(pair[0], "polling")
    with pytest.raises(cmp.CompareError, match="not a results directory"):
        cmp.load_side(tmp_path)
    assert cmp.load_side(pair[0], "sweep-x").rows["study"].eq("sweep-x").all()


def test_cli_writes_html_json_and_exits_on_the_gate(pair, tmp_path):
    out = tmp_path / "cmp"
    proc = run_cli(pair[0], pair[1], "--out", out, "--fail-if-slower", "10")
    assert proc.returncode == 1, proc.stderr
    assert "REGRESSION" in proc.stdout and "slower" in proc.stdout
    doc = json.loads((out / "compare.json").read_text())
    assert doc["gate"]["failed"] and doc["counts"]["slower"] == 4
    assert {p["knobs"]["iodepth"] for p in doc["unmatched"]["only_before"]} == {32}
    html = (out / "compare.html").read_text()
    assert html.count("<img") == 4 and 'class="slower"' in html and "6.12.0" in html
    assert (out / "figures").is_dir() and len(list((out / "figures").glob("*.png"))) == 4
    ok = run_cli(pair[0], pair[1], "--out", tmp_path / "cmp2", "--fail-if-slower", "iops=60,mean=60,p99=60,bw=60",
                 "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["gate"]["failed"] is False
    bad = run_cli(tmp_path / "nowhere", pair[1])
    assert bad.returncode == 2 and "not a results directory" in bad.stderr
    bad_gate = run_cli(pair[0], pair[1], "--fail-if-slower", "tail=3", "--out", tmp_path / "cmp3")
    assert bad_gate.returncode == 2 and "unknown kind" in bad_gate.stderr


def test_two_runs_of_one_spec_through_the_runner_match_every_point(fake_env, tmp_path):
    """The real runner's points (fake binaries): two runs of one sweep match point for point."""
    from conftest import nvmflab

    spec = tmp_path / "gate.toml"
    spec.write_text('name = "gate"\nrepeats = 2\nramp_time = 0\nruntime = 0.2\n[workload]\nrw = "randread"\n'
                    '[sweep]\niodepth = [1, 4]\n')
    for side in ("before", "after"):
        done = nvmflab("run", str(spec), "--results", str(tmp_path / side), env=fake_env, timeout=240)
        assert done.returncode == 0, done.stderr
    c = cmp.compare(cmp.load_side(tmp_path / "before"), cmp.load_side(tmp_path / "after"), cmp.parse_gate(["0"]))
    assert not c.only_before and not c.only_after and not c.not_usable
    assert {m.knobs["iodepth"] for m in c.metrics} == {1, 4}
    assert {m.kind for m in c.metrics} == set(cmp.METRICS)
    assert all(len(m.before) == len(m.after) == 2 for m in c.metrics)
    # With a 0 % limit the gate trips on exactly the metrics called slower.
    assert [id(m) for m in c.gate_failures] == [id(m) for m in c.metrics if m.verdict == "slower"]


def test_documented_compare_options_exist():
    """Every option the docs give to `nvmflab compare` is one the command takes."""
    import re

    repo = Path(__file__).resolve().parents[2]
    help_text = run_cli("--help").stdout
    used = set()
    for doc in ("docs/compare.md", "docs/ci-gate.md", "README.md"):
        for line in (repo / doc).read_text().splitlines():
            if "nvmflab compare" in line:
                used |= set(re.findall(r"(--[a-z][a-z-]+)", line.split("nvmflab compare", 1)[1]))
    assert {"--fail-if-slower", "--study"} <= used
    assert all(option in help_text for option in used), used


def test_nics_and_data_interfaces_are_shown_side_by_side(tmp_path):
    net = json.dumps({"local": {"data_interface": "eth0", "interfaces": {"eth0": {"speed_mbps": 25000}}}})
    points = [{"knobs": {"iodepth": 1}, "repeats": [dict(r, net_json=net) for r in repeats(BASE)]}]
    b = write_results(tmp_path / "b", points, env={"nics": {"eth0": {"driver": "ixgbe", "speed_mbps": 10000}}})
    a = write_results(tmp_path / "a", points, env={"nics": {"eth0": {"driver": "ice", "speed_mbps": 25000}}})
    env = {e["what"]: e for e in cmp.compare(cmp.load_side(b), cmp.load_side(a)).environment}
    assert env["nic eth0"]["before"] == "ixgbe, 10000 Mb/s" and env["nic eth0"]["after"] == "ice, 25000 Mb/s"
    assert env["nic eth0"]["changed"]
    assert env["data interface"]["before"] == "local: eth0 (25000 Mb/s)" and not env["data interface"]["changed"]


def test_this_machines_environment_records_its_network_devices(tmp_path):
    from nvmflab import env

    dev = tmp_path / "net" / "eth9"
    (dev / "device").mkdir(parents=True)
    (dev / "speed").write_text("40000\n")
    (tmp_path / "net" / "veth0").mkdir()  # virtual: no device
    assert env.nics(str(tmp_path / "net")) == {"eth9": {"driver": None, "speed_mbps": 40000}}
    assert "nics" in env.collect()
