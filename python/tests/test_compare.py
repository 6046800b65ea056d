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
from nvmflab import gate
from nvmflab.analysis import decide
from nvmflab.gate import GateError

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
    assert not cmp.compare(b, a, cmp.parse_gate(["80"])).gate_failures  # −30 %/+40 % are within 80 %
    only_p99 = cmp.compare(b, a, cmp.parse_gate(["p99=20", "iops=50"]))
    assert {m.kind for m in only_p99.gate_failures} == {"p99"}
    # The reverse direction is faster everywhere it is clear: nothing trips.
    reverse = cmp.compare(a, b, cmp.parse_gate(["0"]))
    assert not reverse.gate_failures and by(reverse, 8, "iops").verdict == "faster"


def test_parse_gate_refuses_bad_values():
    assert cmp.parse_gate(["5"]) == {"iops": 5, "bw": 5, "mean": 5, "p99": 5}
    assert cmp.parse_gate(["iops=5", "p99=10"]) == {"iops": 5, "p99": 10}
    assert cmp.parse_gate(["bandwidth=3,lat_p99=4"]) == {"bw": 3, "p99": 4}
    for bad, why in (("x", "not a number"), ("iops=-1", "≥ 0"), ("tail=5", "unknown kind"), ("nan", "finite"),
                     ("", "empty"), (" ", "empty"), ("iops=5,", "empty"), ("iops=", "not a number")):
        with pytest.raises(GateError, match=why):
            cmp.parse_gate([bad])
    for twice in (["iops=5", "iops=50"], ["5", "iops=5"], ["iops=5", "5"], ["iops=5,bandwidth=3,bw=4"]):
        with pytest.raises(GateError, match="given already"):
            cmp.parse_gate(twice)


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
    assert 'id="gate-verdicts"' in html and 'class="slower-beyond-threshold"' in html and "(exit 1)" in html
    assert (out / "figures").is_dir() and len(list((out / "figures").glob("*.png"))) == 4
    # iodepth 32 is only in before and 16 not usable after: the gate cannot pass them (exit 3) ...
    ok = run_cli(pair[0], pair[1], "--out", tmp_path / "cmp2", "--fail-if-slower", "iops=90,mean=90,p99=90,bw=90",
                 "--json")
    assert ok.returncode == 3, ok.stderr
    doc = json.loads(ok.stdout)["gate"]
    assert doc["failed"] is False and doc["status"] == "inconclusive"
    assert {p["knobs"]["iodepth"] for p in doc["missing"]} == {16, 32}
    # ... and passes the points measured on both sides.
    ok = run_cli(pair[0], pair[1], "--out", tmp_path / "cmp2", "--fail-if-slower", "iops=90,mean=90,p99=90,bw=90",
                 "--gate-point", "iodepth=1,host_stack=ours", "--gate-point", "iodepth=8", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["gate"]["status"] == "passed"
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


# -- the gate fails closed (issue 41 item 1) --------------------------------------------------------

def noisy(rng, iops, cv, n, lat_us=50.0):
    """n repeats around `iops` (latency inversely), each metric with its own spread of cv."""
    out = []
    for _ in range(n):
        i, lat = iops * (1 + cv * rng.standard_normal()), lat_us * 1e3 * (1 + cv * rng.standard_normal())
        out.append({"iops": float(i), "lat_mean_ns": float(lat), "lat_p99_ns": float(2 * lat)})
    return out


def sides(tmp_path, before: dict, after: dict, seed=1):
    """Two results directories; before/after: iodepth → (IOPS, latency µs, cv, repeats)."""
    rng = np.random.default_rng(seed)
    made = []
    for name, points in (("before", before), ("after", after)):
        made.append(write_results(tmp_path / name, [
            {"knobs": {"iodepth": d}, "repeats": noisy(rng, iops, cv, n, lat)}
            for d, (iops, lat, cv, n) in points.items()]))
    return made


def gate_of(b, a, *thresholds, points=None, min_points=1):
    c = cmp.compare(cmp.load_side(b), cmp.load_side(a), cmp.parse_gate(list(thresholds)),
                    gate.parse_points(points), min_points)
    return c, c.gate_result


def test_aa_at_ten_repeats_passes(tmp_path):
    same = {1: (50e3, 20, 0.02, 10), 32: (200e3, 160, 0.02, 10)}
    c, g = gate_of(*sides(tmp_path, same, same), "10")
    assert g.family == 8 and g.status == "passed" and g.exit_status == 0, cmp.text_summary(c)
    assert {v.verdict for v in g.verdicts} == {gate.WITHIN}
    assert all(v.worst_pct <= 10 and v.confidence == pytest.approx(1 - 0.05 / 8) for v in g.verdicts)
    assert "gate passed (exit 0" in cmp.text_summary(c)


def test_a_2_4x_slowdown_fails(tmp_path):
    b, a = sides(tmp_path, {32: (206e3, 150, 0.03, 3)}, {32: (206e3 / 2.4, 150 * 2.4, 0.03, 3)})
    c, g = gate_of(b, a, "10")
    assert g.status == "failed" and g.exit_status == 1
    assert {v.kind for v in g.of(gate.SLOWER)} == {"iops", "bw", "mean", "p99"}
    iops = next(v for v in g.verdicts if v.kind == "iops")
    assert iops.slowdown_pct == pytest.approx(100 * (1 - 1 / 2.4), abs=5) and iops.best_pct > 10
    assert {m.kind for m in c.gate_failures} == {"iops", "bw", "mean", "p99"}
    assert "REGRESSION (exit 1" in cmp.text_summary(c)


def test_a_noisy_pair_of_three_is_inconclusive_with_advice(tmp_path):
    b = write_results(tmp_path / "b", [{"knobs": {"iodepth": 1}, "repeats": repeats([100e3, 85e3, 115e3])}])
    a = write_results(tmp_path / "a", [{"knobs": {"iodepth": 1}, "repeats": repeats([110e3, 95e3, 80e3])}])
    c, g = gate_of(b, a, "iops=10")
    (v,) = g.verdicts
    assert v.verdict == gate.INCONCLUSIVE and g.exit_status == 3 and g.status == "inconclusive"
    assert v.best_pct <= 10 < v.worst_pct
    assert f"exclude only a slowdown above {v.worst_pct:.1f} %" in v.reason
    # The advice's repeats do decide it at the observed spread, and one fewer does not.
    m = next(m for m in c.metrics if m.kind == "iops")
    sb, sa = np.var(m.before, ddof=1), np.var(m.after, ddof=1)
    limit, slow = 10 * np.mean(m.before) / 100, v.slowdown_pct * np.mean(m.before) / 100
    n = v.repeats_needed
    assert n > 3 and f"about {n} repeats a side" in v.reason

    def reach(k):  # docs/compare.md's formula
        return gate.student_t.ppf(v.confidence, (sb + sa) ** 2 * (k - 1) / (sb ** 2 + sa ** 2)) * np.sqrt((sb + sa) / k)

    assert reach(n) < abs(limit - slow) <= reach(n - 1)
    assert "gate passed" not in cmp.text_summary(c) and "GATE INCONCLUSIVE (exit 3" in cmp.text_summary(c)


def test_the_59_percent_slowdown_on_a_loaded_machine_is_never_passed(tmp_path):
    """Issue 41: 16 points × 4 metrics, 3 noisy repeats a side, QD32 polling lost 59 % of its IOPS;
    Holm over 64 called everything 'no clear difference' and the gate said it passed."""
    before = {d: (100e3, 50, 0.10, 3) for d in range(1, 30, 2)} | {32: (206e3, 50, 0.10, 3)}
    after = before | {32: (85e3, 50 * 206 / 85, 0.10, 3)}
    b, a = sides(tmp_path, before, after, seed=3)
    c, g = gate_of(b, a, "10")
    assert g.family == 64 and g.exit_status != 0 and g.status != "passed"
    assert "gate passed" not in cmp.text_summary(c)
    assert by(c, 32, "iops").verdict != "slower"  # the plain verdicts still cannot tell, as in the issue
    # A small family on the point that matters decides it.
    c, g = gate_of(b, a, "iops=10", points=["iodepth=32"])
    assert g.family == 1 and g.exit_status == 1, cmp.text_summary(c)


def test_too_few_decided_points_or_nothing_matched_is_unusable(tmp_path):
    b, a = sides(tmp_path, {1: (100e3, 50, 0.02, 1), 2: (100e3, 50, 0.02, 3)},
                 {1: (100e3, 50, 0.02, 1), 2: (100e3, 50, 0.02, 3), 4: (100e3, 50, 0.02, 3)})
    _, g = gate_of(b, a, "iops=50", min_points=2)  # iodepth 1 has one repeat a side
    assert g.exit_status == 2 and "only 1 of 2 gated point(s) could be decided" in g.reason
    _, g = gate_of(b, a, "iops=50")  # one decided point is enough by default; the other stays open
    assert g.exit_status == 3 and g.decided_points == 1
    with pytest.raises(GateError, match="matches no point"):
        gate_of(b, a, "iops=50", points=["iodepth=3"])
    with pytest.raises(GateError, match="no point has queue"):
        gate_of(b, a, "iops=50", points=["queue=3"])
    _, g = gate_of(b, a, "iops=50", points=["iodepth=4"])  # only in after: nothing to compare
    assert g.exit_status == 2 and "nothing to gate" in g.reason


def run_main(monkeypatch, capsys, *args):
    """`nvmflab compare ARGS` in this process: (exit status, stdout, stderr)."""
    from nvmflab import cli

    monkeypatch.setattr(sys, "argv", ["nvmflab", "compare", *map(str, args)])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    captured = capsys.readouterr()
    return exit_.value.code, captured.out, captured.err


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    base = tmp_path_factory.mktemp("gate")
    return sides(base, {1: (100e3, 50, 0.02, 3)}, {1: (100e3, 50, 0.02, 3)})


@pytest.mark.parametrize("args, why", [
    (["--fail-if-slower", ""], "empty threshold"),
    (["--fail-if-slower", " "], "empty threshold"),
    (["--fail-if-slower", "-5"], "≥ 0"),
    (["--fail-if-slower", "five"], "not a number"),
    (["--fail-if-slower", "iops=5", "--fail-if-slower", "iops=50"], "given already"),
    (["--fail-if-slower", "5", "--fail-if-slower", "iops=5"], "given already"),
    (["--gate-point", "iodepth=1"], "give --fail-if-slower too"),
    (["--fail-if-slower", "5", "--gate-point", "iodepth"], "KNOB=VALUE"),
    (["--fail-if-slower", "5", "--gate-min-points", "0"], "at least 1"),
])
def test_cli_refuses_bad_gate_options_with_exit_2(small, tmp_path, monkeypatch, capsys, args, why):
    code, out, err = run_main(monkeypatch, capsys, *small, "--out", tmp_path, *args)
    assert code == 2 and why in err and err.count("\n") == 1, err
    assert "internal error" not in err and not out


def test_cli_nothing_matched_exits_2(tmp_path, monkeypatch, capsys):
    b, a = sides(tmp_path, {1: (100e3, 50, 0.02, 3)}, {2: (100e3, 50, 0.02, 3)})
    code, out, err = run_main(monkeypatch, capsys, b, a, "--fail-if-slower", "5", "--out", tmp_path / "o")
    assert code == 2 and "the gate cannot decide: nothing to gate" in err
    assert "gate passed" not in out and "GATE CANNOT DECIDE (exit 2" in out


@pytest.mark.parametrize("damage", ["schema page", "data pages"])
def test_cli_names_a_damaged_side_as_a_read_error(tmp_path, monkeypatch, capsys, damage):
    b, a = sides(tmp_path, {1: (100e3, 50, 0.02, 3), 2: (90e3, 50, 0.02, 3)}, {1: (100e3, 50, 0.02, 3)})
    db = a / "results.sqlite"
    data = bytearray(db.read_bytes())
    start, end = (100, 4096) if damage == "schema page" else (2 * 4096, len(data))
    data[start:end] = b"\xa5" * (end - start)
    db.write_bytes(data)
    code, out, err = run_main(monkeypatch, capsys, b, a, "--fail-if-slower", "5", "--out", tmp_path / "o")
    assert code == 2 and f"{db}: cannot read the results" in err, err
    assert "internal error" not in err and "cannot write" not in err and "SELECT" not in err


def test_cli_warns_when_both_sides_are_one_directory(small, tmp_path, monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, small[0], small[0], "--out", tmp_path)
    assert code == 0 and "warning: BEFORE and AFTER are the same directory" in err
    assert json.loads((tmp_path / "compare.json").read_text())["warnings"]


def test_cli_text_gives_each_verdict_its_reason(small, tmp_path, monkeypatch, capsys):
    code, out, _ = run_main(monkeypatch, capsys, *small, "--out", tmp_path, "--fail-if-slower", "iops=1")
    doc = json.loads((tmp_path / "compare.json").read_text())
    for m in doc["metrics"]:
        assert m["reason"] and f"{m['verdict']}" in out and m["reason"] in out
    for v in doc["gate"]["verdicts"]:
        assert v["reason"] in out
    assert code == doc["gate"]["exit_status"] == 3  # 1 % cannot be shown with 3 repeats at 2 % spread


def test_cli_reads_a_read_only_after_and_says_what_it_did_not_write(small, tmp_path):
    """A read-only AFTER (a read-only bind mount in a mount namespace of its own): nothing needs
    writing for stdout, so compare works and warns that compare.html was not written."""
    import shutil

    if not shutil.which("unshare") or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.skip("needs unshare -m (a mount namespace) for a read-only mount")
    after = tmp_path / "after"
    shutil.copytree(small[1], after)
    script = (f'mount --bind "{after}" "{after}" && mount -o remount,bind,ro "{after}" "{after}" && '
              f'exec "{NVMFLAB}" compare "{small[0]}" "{after}" --json --fail-if-slower iops=50')
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["gate"]["status"] == "passed"
    assert "not written" in done.stderr and "Read-only file system" in done.stderr
    assert not (after / "compare").exists()
